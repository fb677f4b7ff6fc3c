#ifndef POLLCAST_CHIREDIS_SHIM_H
#define POLLCAST_CHIREDIS_SHIM_H

// System headers before libevent's (see CLibevent/shim.h: its event-config.h defines _GNU_SOURCE).
#include <sys/types.h>
#include <sys/time.h>
#include <sys/select.h>
#include <sys/socket.h>

#include <event2/event.h>
#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include <hiredis/adapters/libevent.h>

/* hiredis's libevent adapter is a set of static functions in its header: one entry point Swift can call. */
static inline int pollcast_redis_attach(redisAsyncContext *context, struct event_base *base) {
  return redisLibeventAttach(context, base);
}

/* The connection's owner, kept in the context (hiredis hands the context back as const in its callbacks). */
static inline void *pollcast_redis_data(const redisAsyncContext *context) { return context->data; }
static inline void pollcast_redis_set_data(redisAsyncContext *context, void *data) { context->data = data; }
static inline int pollcast_redis_error(const redisAsyncContext *context) { return context->err; }
static inline const char *pollcast_redis_error_text(const redisAsyncContext *context) { return context->errstr; }

#endif
