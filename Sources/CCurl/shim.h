#ifndef POLLCAST_CCURL_SHIM_H
#define POLLCAST_CCURL_SHIM_H

#include <sys/types.h>
#include <sys/time.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <curl/curl.h>

// curl_easy_setopt, curl_multi_setopt and curl_easy_getinfo are variadic: Swift cannot call them, so each
// argument type gets a typed wrapper.

static inline CURLcode pollcast_easy_setopt_long(CURL *handle, CURLoption option, long value) {
  return curl_easy_setopt(handle, option, value);
}
static inline CURLcode pollcast_easy_setopt_string(CURL *handle, CURLoption option, const char *value) {
  return curl_easy_setopt(handle, option, value);
}
static inline CURLcode pollcast_easy_setopt_pointer(CURL *handle, CURLoption option, void *value) {
  return curl_easy_setopt(handle, option, value);
}
static inline CURLcode pollcast_easy_setopt_slist(CURL *handle, CURLoption option, struct curl_slist *value) {
  return curl_easy_setopt(handle, option, value);
}
static inline CURLcode pollcast_easy_setopt_write(CURL *handle, curl_write_callback value) {
  return curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, value);
}
static inline CURLcode pollcast_easy_getinfo_long(CURL *handle, CURLINFO info, long *value) {
  return curl_easy_getinfo(handle, info, value);
}
static inline CURLcode pollcast_easy_getinfo_pointer(CURL *handle, CURLINFO info, void **value) {
  return curl_easy_getinfo(handle, info, value);
}
static inline CURLcode pollcast_easy_getinfo_string(CURL *handle, CURLINFO info, char **value) {
  return curl_easy_getinfo(handle, info, value);
}
static inline CURLcode pollcast_easy_getinfo_double(CURL *handle, CURLINFO info, double *value) {
  return curl_easy_getinfo(handle, info, value);
}

typedef int (*pollcast_socket_callback)(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp);
typedef int (*pollcast_timer_callback)(CURLM *multi, long timeout_ms, void *userp);

static inline CURLMcode pollcast_multi_setopt_socket(CURLM *multi, pollcast_socket_callback cb, void *userp) {
  CURLMcode code = curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, cb);
  if (code != CURLM_OK) return code;
  return curl_multi_setopt(multi, CURLMOPT_SOCKETDATA, userp);
}
static inline CURLMcode pollcast_multi_setopt_timer(CURLM *multi, pollcast_timer_callback cb, void *userp) {
  CURLMcode code = curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, cb);
  if (code != CURLM_OK) return code;
  return curl_multi_setopt(multi, CURLMOPT_TIMERDATA, userp);
}
static inline CURLMcode pollcast_multi_setopt_long(CURLM *multi, CURLMoption option, long value) {
  return curl_multi_setopt(multi, option, value);
}

// CURLMsg's data is a union; expose the result code.
static inline CURLcode pollcast_msg_result(CURLMsg *msg) { return msg->data.result; }

static const int pollcast_CURL_POLL_IN = CURL_POLL_IN;
static const int pollcast_CURL_POLL_OUT = CURL_POLL_OUT;
static const int pollcast_CURL_POLL_INOUT = CURL_POLL_INOUT;
static const int pollcast_CURL_POLL_REMOVE = CURL_POLL_REMOVE;
static const int pollcast_CURL_CSELECT_IN = CURL_CSELECT_IN;
static const int pollcast_CURL_CSELECT_OUT = CURL_CSELECT_OUT;
static const int pollcast_CURL_CSELECT_ERR = CURL_CSELECT_ERR;
static const curl_socket_t pollcast_CURL_SOCKET_TIMEOUT = CURL_SOCKET_TIMEOUT;

#endif
