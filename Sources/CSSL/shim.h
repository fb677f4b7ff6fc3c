#ifndef POLLCAST_CSSL_SHIM_H
#define POLLCAST_CSSL_SHIM_H

// OpenSSL's PEM reader, only to tell what a configured JWT key is (RSA, which EC curve) before any token is
// checked: libjwt would otherwise take whatever key fits the token's own algorithm.
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/err.h>
// HMAC-SHA256: the stable key of an account without a session step (a keyed hash of its credential).
#include <openssl/hmac.h>
#include <openssl/rand.h>

#endif
