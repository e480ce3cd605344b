/* Tiny assertion helpers shared by the C API test programs. */
#ifndef CHECK_H
#define CHECK_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rina/api.h>

/* Fails the program, naming the line, the expression and the last error. */
#define CHECK(cond)                                                          \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: check failed: %s (errno %d %s; %s)\n",   \
                    __FILE__, __LINE__, #cond, errno, strerror(errno),       \
                    rina_api_last_error());                                  \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

/* The call must fail with -1 and errno @e. */
#define CHECK_FAILS(call, e)                                                 \
    do {                                                                     \
        errno = 0;                                                           \
        int r_ = (int)(call);                                                \
        if (r_ != -1 || errno != (e)) {                                      \
            fprintf(stderr,                                                  \
                    "%s:%d: %s returned %d errno %d (%s), wanted -1 errno "  \
                    "%d (%s); %s\n",                                         \
                    __FILE__, __LINE__, #call, r_, errno, strerror(errno),   \
                    (e), strerror(e), rina_api_last_error());                \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

#endif
