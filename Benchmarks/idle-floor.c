// The floor of an idle per-user relay: the CPU a process must spend, with nothing to deliver, to keep A accounts'
// long polls going (each held HOLD seconds, then answered empty and asked again on its kept-alive connection) and
// to write a heartbeat to each of their K subscribers every HEARTBEAT seconds, the peers being asleep on the other
// core. `accounts.sh` measures the relay's idle CPU this way (2,000 accounts × 2 subscribers, polls held 25 s,
// heartbeats every 15 s, first polls spread over 15 s: `CONNECT_SPREAD`, a 60-s window).
// Build: cc -O2 -o idle-floor Benchmarks/idle-floor.c
// Run:   taskset -c 0 ./idle-floor [A=2000] [K=2] [HOLD=25] [HEARTBEAT=15] [SPREAD=15] [WINDOW=60] [PEER_CPU=1]
// One epoll loop, as the relay's: it wakes for each answer (reads it, writes the next request) and on a wheel that
// turns 120 times a heartbeat interval (the relay's `HeartbeatWheel`: at most every 0.125 s at 15 s), writing the
// heartbeats then due, one `send` a subscriber. Nothing else: no parsing beyond the answer's length, no allocation,
// no timers per account. A child pinned to PEER_CPU plays the legacy API (holds each poll, answers it) and the
// subscribers (reads and drops what they get); its CPU is not counted. Prints the loop's CPU over the window as a
// share of one core, with the wake-ups, answers and heartbeats it counted.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static double cpu_s(void) {
  struct rusage r;
  getrusage(RUSAGE_SELF, &r);
  return r.ru_utime.tv_sec + r.ru_stime.tv_sec + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

static int listen_any(int *port) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(0x7f000001)};
  socklen_t len = sizeof a;
  if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 4096) || getsockname(s, (struct sockaddr *)&a, &len)) {
    perror("listen");
    exit(1);
  }
  *port = ntohs(a.sin_port);
  return s;
}

static int tcp_to(int port) {
  int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001)};
  if (connect(s, (struct sockaddr *)&a, sizeof a)) {
    perror("connect");
    exit(1);
  }
  return s;
}

static void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof set, &set);
}

static char buf[1 << 16];

// The legacy API and the subscribers: holds each poll `hold` seconds from its arrival (a FIFO, since every hold is
// the same), then answers it empty; reads and drops what the subscribers get.
static void peer(int up_listener, int sub_listener, int accounts, double hold) {
  const char answer[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 36\r\n\r\n"
                        "{\"messages\":[],\"cursor\":\"101:1200\"}\n";
  int ep = epoll_create1(0), one = 1;
  struct epoll_event ev = {.events = EPOLLIN};
  ev.data.u64 = 1ull << 32;
  epoll_ctl(ep, EPOLL_CTL_ADD, up_listener, &ev);
  ev.data.u64 = 2ull << 32;
  epoll_ctl(ep, EPOLL_CTL_ADD, sub_listener, &ev);
  int *held = calloc(accounts, sizeof *held);
  double *due = calloc(accounts, sizeof *due);
  int head = 0, count = 0;
  struct epoll_event events[256];
  for (;;) {
    int timeout = -1;
    if (count > 0) {
      double wait = due[head] - now_s();
      timeout = wait <= 0 ? 0 : (int)(wait * 1000) + 1;
    }
    int n = epoll_wait(ep, events, 256, timeout);
    for (int i = 0; i < n; i++) {
      uint64_t kind = events[i].data.u64 >> 32;
      int fd = (int)(uint32_t)events[i].data.u64;
      if (kind == 1 || kind == 2) {
        int s = accept(kind == 1 ? up_listener : sub_listener, NULL, NULL);
        if (s < 0) continue;
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct epoll_event add = {.events = EPOLLIN};
        add.data.u64 = ((uint64_t)(kind + 2) << 32) | (uint32_t)s;
        epoll_ctl(ep, EPOLL_CTL_ADD, s, &add);
      } else if (kind == 3) {  // a poll: one small request, held
        if (read(fd, buf, sizeof buf) <= 0) _exit(0);
        int tail = (head + count) % accounts;
        held[tail] = fd;
        due[tail] = now_s() + hold;
        count++;
      } else if (read(fd, buf, sizeof buf) <= 0) {  // a subscriber's bytes, dropped
        _exit(0);
      }
    }
    double t = now_s();
    while (count > 0 && due[head] <= t) {
      if (write(held[head], answer, sizeof answer - 1) != (ssize_t)(sizeof answer - 1)) _exit(0);
      head = (head + 1) % accounts;
      count--;
    }
  }
}

struct account {
  int upstream, got, head, body;
  double heartbeat_due;
  char in[512];  // the answer read so far (an empty answer is ~110 bytes)
  int subscribers[];
};

int main(int argc, char **argv) {
  int accounts = argc > 1 ? atoi(argv[1]) : 2000, k = argc > 2 ? atoi(argv[2]) : 2;
  double hold = argc > 3 ? atof(argv[3]) : 25, heartbeat = argc > 4 ? atof(argv[4]) : 15;
  double spread = argc > 5 ? atof(argv[5]) : 15, window = argc > 6 ? atof(argv[6]) : 60;
  int peer_cpu = argc > 7 ? atoi(argv[7]) : 1;
  if (accounts <= 0 || k < 0 || k > 64 || hold <= 0 || heartbeat <= 0 || spread < 0 || window <= 0) {
    fprintf(stderr, "usage: %s [A] [K<=64] [HOLD] [HEARTBEAT] [SPREAD] [WINDOW] [PEER_CPU]\n", argv[0]);
    return 64;
  }
  int up_port, sub_port;
  int up_listener = listen_any(&up_port), sub_listener = listen_any(&sub_port);
  pid_t child = fork();
  if (child == 0) {
    pin(peer_cpu);
    peer(up_listener, sub_listener, accounts, hold);
    _exit(0);
  }
  close(up_listener);
  close(sub_listener);
  size_t size = sizeof(struct account) + k * sizeof(int);
  char *all = calloc(accounts, size);
  int ep = epoll_create1(0);
  for (int i = 0; i < accounts; i++) {
    struct account *a = (struct account *)(all + i * size);
    a->upstream = tcp_to(up_port);
    for (int j = 0; j < k; j++) a->subscribers[j] = tcp_to(sub_port);
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = i};
    epoll_ctl(ep, EPOLL_CTL_ADD, a->upstream, &ev);
  }
  const char request[] = "GET /api/messages/poll?token=abcdef&cursor=101:1200,202:77&timeout=25 HTTP/1.1\r\n"
                         "Host: 127.0.0.1\r\nAuthorization: Bearer k\r\n\r\n";
  const char beat[] = "d\r\n: heartbeat\n\n\r\n";  // the relay's heartbeat comment in its chunk
  double turn = heartbeat / 120 < 0.01 ? 0.01 : heartbeat / 120;
  double t0 = now_s() + 0.5, next_turn = t0 + turn, start = t0 + spread, end = start + window;
  // Account i starts (its first poll and its subscribers' heartbeat phase) at t0 + i × spread / A.
  int started = 0, beat_next = 0;
  long wakeups = 0, answers = 0, beats = 0;
  double cpu0 = 0;
  int measuring = 0;
  struct epoll_event events[256];
  for (;;) {
    double t = now_s();
    if (!measuring && t >= start) {
      measuring = 1;
      cpu0 = cpu_s();
      wakeups = answers = beats = 0;
    }
    if (t >= end) break;
    while (started < accounts && t >= t0 + started * spread / accounts) {
      struct account *a = (struct account *)(all + started * size);
      a->heartbeat_due = t0 + started * spread / accounts + heartbeat;
      a->head = -1;
      if (write(a->upstream, request, sizeof request - 1) != (ssize_t)(sizeof request - 1)) return 1;
      started++;
    }
    if (t >= next_turn) {  // a wheel turn: every heartbeat due by now, accounts in the order they started
      for (int seen = 0; seen < started; seen++) {
        struct account *a = (struct account *)(all + beat_next * size);
        if (a->heartbeat_due > t) break;
        for (int j = 0; j < k; j++, beats++)
          if (send(a->subscribers[j], beat, sizeof beat - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof beat - 1)) return 1;
        a->heartbeat_due += heartbeat;
        beat_next = (beat_next + 1) % started;
      }
      while (next_turn <= t) next_turn += turn;
    }
    double next = next_turn;
    if (started < accounts && t0 + started * spread / accounts < next) next = t0 + started * spread / accounts;
    int timeout = next <= t ? 0 : (int)((next - t) * 1000) + 1;
    int n = epoll_wait(ep, events, 256, timeout);
    wakeups++;
    for (int e = 0; e < n; e++) {
      struct account *a = (struct account *)(all + events[e].data.u32 * size);
      int r = read(a->upstream, a->in + a->got, sizeof a->in - a->got - 1);
      if (r <= 0) {
        fprintf(stderr, "the API closed a connection\n");
        return 1;
      }
      a->got += r;
      a->in[a->got] = 0;
      if (a->head < 0) {
        char *end_of_head = memmem(a->in, a->got, "\r\n\r\n", 4);
        if (!end_of_head) continue;
        a->head = end_of_head - a->in + 4;
        char *cl = strcasestr(a->in, "content-length:");
        a->body = cl ? atoi(cl + 15) : 0;
      }
      if (a->got < a->head + a->body) continue;
      answers++;
      a->got = 0;
      a->head = -1;
      if (write(a->upstream, request, sizeof request - 1) != (ssize_t)(sizeof request - 1)) return 1;
    }
  }
  double used = cpu_s() - cpu0;
  printf("idle-floor: %.3f%% of one core over %.0f s (%d accounts x %d subscribers, polls held %.0f s, heartbeats "
         "every %.0f s, spread over %.0f s): %.1f wake-ups/s, %.1f answers/s, %.1f heartbeats/s\n",
         used / window * 100, window, accounts, k, hold, heartbeat, spread, wakeups / window, answers / window,
         beats / window);
  kill(child, SIGTERM);
  waitpid(child, NULL, 0);
  return 0;
}
