// The physical floor of the shared feed's fan-out: an epoll server that frames each published event once and writes
// it to each subscriber's socket with one `send`, and does nothing else. It speaks just enough HTTP/1.1 for
// `pollcast-bench`: a GET opens a chunked `text/event-stream` reply, a POST publishes its body as one event and is
// answered 200 on a kept-alive connection. `fanout-floor.sh` runs the bench's fan-out scenarios against it and
// against the relay, alternating, and prints the relay's CPU per delivery as a multiple of this floor's.
//
// What it does per delivery is what the relay does per delivery when its subscribers keep up: one non-blocking
// `send` of an already framed event (what the kernel does not take is queued and sent on EPOLLOUT, in order). What
// it leaves out is the relay's own work: the poll of the legacy API, ids, the replay ring, the envelope, resume,
// heartbeats, the bounded queues, metrics. The frame is as long as the relay's for the same message (the same SSE
// fields and a JSON envelope of the same size), so the kernel's share is the same.
//
// Build: cc -O2 -o fanout-floor Benchmarks/fanout-floor.c
// Run:   taskset -c 0 ./fanout-floor        (prints "listening on 127.0.0.1:PORT"; SIGTERM ends it)
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

enum { READING, SUBSCRIBER };

typedef struct {
  int fd, state, watching_out;
  char *in;  // the request being read (and a POST's body)
  size_t in_len, in_cap;
  char *out;  // what a subscriber's socket did not take yet, in order
  size_t out_len, out_cap;
} conn;

static int ep;
static conn **conns;  // by fd
static int max_fd;
static int *subscribers;  // fds, in subscribe order
static int nsub, subcap;
static unsigned long long next_id = 1;
static const char stream_head[] =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nX-Accel-Buffering: no\r\n"
    "Transfer-Encoding: chunked\r\n\r\n";
static const char published[] = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";

static void append(char **buf, size_t *len, size_t *cap, const char *bytes, size_t n) {
  if (*len + n > *cap) {
    size_t next = *cap ? *cap : 4096;
    while (next < *len + n) next *= 2;
    char *grown = realloc(*buf, next);
    if (!grown) { perror("realloc"); exit(1); }
    *buf = grown;
    *cap = next;
  }
  memcpy(*buf + *len, bytes, n);
  *len += n;
}

static void watch(conn *c, int out) {
  if (c->watching_out == out) return;
  struct epoll_event e = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.fd = c->fd};
  epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &e);
  c->watching_out = out;
}

static void drop(conn *c) {
  if (c->state == SUBSCRIBER) {
    for (int i = 0; i < nsub; i++)
      if (subscribers[i] == c->fd) { subscribers[i] = subscribers[--nsub]; break; }
  }
  epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  conns[c->fd] = NULL;
  free(c->in);
  free(c->out);
  free(c);
}

// Sends what is queued; false when the connection failed (and was dropped).
static int flush(conn *c) {
  while (c->out_len > 0) {
    ssize_t n = send(c->fd, c->out, c->out_len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno == EAGAIN) break;
    if (n <= 0) { drop(c); return 0; }
    memmove(c->out, c->out + n, c->out_len - n);
    c->out_len -= n;
  }
  watch(c, c->out_len > 0);
  return 1;
}

// One send of the framed event to every subscriber; what a socket does not take waits in its queue.
static void fan_out(const char *frame, size_t len) {
  for (int i = 0; i < nsub; i++) {
    conn *c = conns[subscribers[i]];
    if (c->out_len == 0) {
      ssize_t n = send(c->fd, frame, len, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n == (ssize_t)len) continue;
      if (n < 0 && errno != EAGAIN) { drop(c); i--; continue; }
      if (n < 0) n = 0;
      append(&c->out, &c->out_len, &c->out_cap, frame + n, len - n);
      watch(c, 1);
    } else {
      append(&c->out, &c->out_len, &c->out_cap, frame, len);
    }
  }
}

// Frames `body` once, as the relay frames a message of the reference API (`id`, and a `data` line holding the
// same envelope around the same message), inside one chunk.
static void publish(const char *body, size_t len) {
  static char event[70000], frame[70100];
  unsigned long long id = 1796526429852109ULL + next_id, upstream = next_id++;
  int n = snprintf(event, sizeof event,
      "id: %llu\ndata: {\"stream\":\"101\",\"upstream_id\":\"%llu\",\"backlog\":false,\"message\":{\"id\":%llu,"
      "\"chat_id\":\"c1\",\"from\":\"alice\",\"text\":\"%.*s\",\"sent_at\":\"2026-12-06T03:07:11.347Z\"}}\n\n",
      id, upstream, upstream, (int)(len > 65000 ? 65000 : len), body);
  int m = snprintf(frame, sizeof frame, "%x\r\n%.*s\r\n", n, n, event);
  fan_out(frame, m);
}

// Handles every complete request in `c->in`; false when the connection was dropped.
static int requests(conn *c) {
  for (;;) {
    char *end = memmem(c->in, c->in_len, "\r\n\r\n", 4);
    if (!end) return 1;
    size_t head = end + 4 - c->in;
    if (c->in_len >= 4 && memcmp(c->in, "GET ", 4) == 0) {
      c->state = SUBSCRIBER;
      c->in_len = 0;
      if (nsub == subcap) {
        subcap = subcap ? subcap * 2 : 1024;
        subscribers = realloc(subscribers, subcap * sizeof *subscribers);
      }
      subscribers[nsub++] = c->fd;
      append(&c->out, &c->out_len, &c->out_cap, stream_head, sizeof stream_head - 1);
      return flush(c);
    }
    size_t body = 0;
    char *length = memmem(c->in, head, "\r\nContent-Length:", 17);
    if (!length) length = memmem(c->in, head, "\r\ncontent-length:", 17);
    if (length) body = strtoul(length + 17, NULL, 10);
    if (c->in_len < head + body) return 1;
    publish(c->in + head, body);
    memmove(c->in, c->in + head + body, c->in_len - head - body);
    c->in_len -= head + body;
    append(&c->out, &c->out_len, &c->out_cap, published, sizeof published - 1);
    if (!flush(c)) return 0;
  }
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  struct rlimit limit;
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  max_fd = (int)(limit.rlim_cur > 1 << 20 ? 1 << 20 : limit.rlim_cur);
  conns = calloc(max_fd, sizeof *conns);
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in any = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(0x7f000001)};
  socklen_t alen = sizeof any;
  if (bind(listener, (struct sockaddr *)&any, sizeof any) || listen(listener, 4096) ||
      getsockname(listener, (struct sockaddr *)&any, &alen)) { perror("listen"); return 1; }
  printf("listening on 127.0.0.1:%d\n", ntohs(any.sin_port));
  fflush(stdout);
  ep = epoll_create1(0);
  struct epoll_event e = {.events = EPOLLIN, .data.fd = listener};
  epoll_ctl(ep, EPOLL_CTL_ADD, listener, &e);
  static struct epoll_event ready[256];
  static char buf[65536];
  for (;;) {
    int n = epoll_wait(ep, ready, 256, -1);
    for (int i = 0; i < n; i++) {
      int fd = ready[i].data.fd;
      if (fd == listener) {
        int s;
        while ((s = accept4(listener, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
          if (s >= max_fd) { close(s); continue; }
          setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          conn *c = calloc(1, sizeof *c);
          c->fd = s;
          conns[s] = c;
          struct epoll_event ce = {.events = EPOLLIN, .data.fd = s};
          epoll_ctl(ep, EPOLL_CTL_ADD, s, &ce);
        }
        continue;
      }
      conn *c = conns[fd];
      if (!c) continue;  // dropped earlier in this batch
      if (ready[i].events & EPOLLOUT && !flush(c)) continue;
      if (!(ready[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) continue;
      ssize_t got = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (got < 0 && errno == EAGAIN) continue;
      if (got <= 0) { drop(c); continue; }
      if (c->state == SUBSCRIBER) continue;  // a stream's client sends nothing more that matters
      append(&c->in, &c->in_len, &c->in_cap, buf, got);
      if (c->in_len > 1 << 20) { drop(c); continue; }
      requests(c);
    }
  }
}
