// The floor of one per-user message at a given rate: the CPU a process must spend when it wakes for each message,
// sends a keep-alive HTTP/1.1 request, reads the answer, and writes one framed event to each of K subscribers'
// sockets, the readers being asleep on the other core. `accounts.sh` measures the relay's CPU per delivery this way
// (100 messages/s, 2 subscribers per account); `../shared/tools/pollfloor.c` measures a cycle back to back, with
// caches warm and no wake-up, and no delivery.
// Build: cc -O2 -o message-floor Benchmarks/message-floor.c
// Run:   taskset -c 0 ./message-floor [N=3000] [RATE=100] [K=2] [PEER_CPU=1]
// A child pinned to PEER_CPU plays the legacy API and the subscribers: it holds each poll and answers it RATE times
// a second (~100 bytes, keep-alive), and reads what the subscribers receive. The parent blocks in `read` on the
// upstream socket as the relay blocks in `epoll_wait`, so each message wakes it as a message wakes the relay.
// Prints the parent's CPU (user + system) per message and per delivery; the child is not counted.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double cpu_us(int who) {
  struct rusage r;
  getrusage(who, &r);
  return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1e6 + r.ru_utime.tv_usec + r.ru_stime.tv_usec;
}

static int tcp_to(int port) {
  int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001)};
  if (connect(s, (struct sockaddr *)&a, sizeof a)) { perror("connect"); exit(1); }
  return s;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 3000, k = argc > 3 ? atoi(argv[3]) : 2;
  double rate = argc > 2 ? atof(argv[2]) : 100;
  int peer_cpu = argc > 4 ? atoi(argv[4]) : 1;
  if (n <= 0 || k <= 0 || k > 64 || rate <= 0) {
    fprintf(stderr, "usage: %s [N] [RATE] [K<=64] [PEER_CPU]\n", argv[0]);
    return 64;
  }
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in any = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(0x7f000001)};
  socklen_t len = sizeof any;
  if (bind(listener, (struct sockaddr *)&any, sizeof any) || listen(listener, 80) ||
      getsockname(listener, (struct sockaddr *)&any, &len)) { perror("listen"); return 1; }
  static char buf[1 << 16];
  pid_t peer = fork();
  if (peer == 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(peer_cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
    int upstream = accept(listener, NULL, NULL), one = 1, fds[64];
    setsockopt(upstream, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (int i = 0; i < k; i++) fds[i] = accept(listener, NULL, NULL);
    const char body[] = "{\"101\":[{\"id\":1200,\"text\":\"message 1200 for the floor\",\"sent_at\":\"2026-12-04T16:00:00Z\"}]}";
    char answer[512];
    int alen = snprintf(answer, sizeof answer,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                        sizeof body - 1, body);
    struct timespec gap = {.tv_sec = (time_t)(1 / rate), .tv_nsec = (long)((1 / rate - (time_t)(1 / rate)) * 1e9)};
    for (;;) {
      if (read(upstream, buf, sizeof buf) <= 0) _exit(0);  // the poll (one small request)
      nanosleep(&gap, NULL);                                // held until the next message
      if (write(upstream, answer, alen) != alen) _exit(0);
      for (int i = 0; i < k; i++)
        if (read(fds[i], buf, sizeof buf) <= 0) _exit(0);
    }
  }
  int s = tcp_to(ntohs(any.sin_port));
  int subscribers[64];
  for (int i = 0; i < k; i++) subscribers[i] = tcp_to(ntohs(any.sin_port));
  char req[512];
  int reqlen = snprintf(req, sizeof req,
                        "GET /api/messages/poll?token=abcdef&cursor=101:1200,202:77&timeout=25 HTTP/1.1\r\n"
                        "Host: 127.0.0.1\r\nAuthorization: Bearer k\r\n\r\n");
  const char event[] = "id: 101:1200\nevent: message\ndata: {\"stream\":\"101\",\"id\":1200,\"text\":\"message 1200 "
                       "for the floor\",\"sent_at\":\"2026-12-04T16:00:00Z\"}\n\n";
  double t0 = cpu_us(RUSAGE_SELF);
  for (int i = 0; i < n; i++) {
    if (write(s, req, reqlen) != reqlen) { perror("write"); return 1; }
    int got = 0, head = -1, body = 0;
    for (;;) {
      int r = read(s, buf + got, sizeof buf - got - 1);
      if (r <= 0) { fprintf(stderr, "connection closed after %d answers\n", i); return 1; }
      got += r;
      buf[got] = 0;
      if (head < 0) {
        char *end = memmem(buf, got, "\r\n\r\n", 4);
        if (end) {
          head = end - buf + 4;
          char *cl = strcasestr(buf, "content-length:");
          body = cl ? atoi(cl + 15) : 0;
        }
      }
      if (head >= 0 && got >= head + body) break;
    }
    for (int j = 0; j < k; j++)
      if (send(subscribers[j], event, sizeof event - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof event - 1)) {
        perror("send");
        return 1;
      }
  }
  double used = cpu_us(RUSAGE_SELF) - t0;
  printf("message-floor: %.2f us of CPU per message, %.2f us per delivery (n=%d, %.0f/s, %d subscribers)\n",
         used / n, used / n / k, n, rate, k);
  kill(peer, SIGTERM);
  waitpid(peer, NULL, 0);
  return 0;
}
