#ifndef POLLCAST_CJWT_SHIM_H
#define POLLCAST_CJWT_SHIM_H

#include <jwt.h>

#endif
