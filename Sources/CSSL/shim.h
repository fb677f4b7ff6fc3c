#ifndef POLLCAST_CSSL_SHIM_H
#define POLLCAST_CSSL_SHIM_H

// OpenSSL's PEM reader, only to tell what a configured JWT key is (RSA, which EC curve) before any token is
// checked: libjwt would otherwise take whatever key fits the token's own algorithm.
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/err.h>

#endif
