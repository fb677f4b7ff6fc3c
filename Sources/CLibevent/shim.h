#ifndef POLLCAST_CLIBEVENT_SHIM_H
#define POLLCAST_CLIBEVENT_SHIM_H

// System headers first: libevent's event-config.h defines _GNU_SOURCE, and including it before these makes
// Glibc's and this module's fd_set definitions conflict in a clean build.
#include <sys/types.h>
#include <sys/time.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <signal.h>
#include <pthread.h>
#include <sys/prctl.h>

#include <event2/event.h>
#include <event2/thread.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <event2/util.h>

// Names the calling thread for the kernel (its comm: 15 bytes at most): prctl is variadic, which Swift cannot call.
static inline int pollcast_name_this_thread(const char *name) {
  return prctl(PR_SET_NAME, (unsigned long)name, 0UL, 0UL, 0UL);
}

// libevent's EV_* flags are macros of type int; give Swift typed constants.
static const short pollcast_EV_TIMEOUT = EV_TIMEOUT;
static const short pollcast_EV_READ = EV_READ;
static const short pollcast_EV_WRITE = EV_WRITE;
static const short pollcast_EV_SIGNAL = EV_SIGNAL;
static const short pollcast_EV_PERSIST = EV_PERSIST;

/// Adds a signal event (evsignal_new is a macro).
static inline struct event *pollcast_evsignal_new(struct event_base *base, int signum,
                                                  event_callback_fn cb, void *arg) {
  return event_new(base, signum, EV_SIGNAL | EV_PERSIST, cb, arg);
}

/// Iterates evkeyvalq (a TAILQ, macros only in C).
static inline struct evkeyval *pollcast_evkeyvalq_first(struct evkeyvalq *q) { return q->tqh_first; }
static inline struct evkeyval *pollcast_evkeyval_next(struct evkeyval *kv) { return kv->next.tqe_next; }

/// Asks the CPU to start loading the two cache lines at `p` (a hint: no fault, no effect on results). The fan-out
/// visits a thousand subscribers' objects once per event, each cold by then; loading the next ones while the
/// current one is sent overlaps the misses instead of taking them one after another.
static inline void pollcast_prefetch(const void *p) {
  __builtin_prefetch(p, 1, 3);
  __builtin_prefetch((const char *)p + 64, 1, 3);
}

#endif
