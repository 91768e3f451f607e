/*
 * util.h — the two helpers every module uses: writing an error message into
 * the caller's buffer, and the monotonic clock the profile is measured with.
 */
#ifndef CB_UTIL_H
#define CB_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <time.h>

/* printf into err[err_len] (NUL-terminated, truncated); no-op without a buffer. */
__attribute__((format(printf, 3, 4)))
static inline void set_err(char *err, size_t err_len, const char *fmt, ...) {
    if (!err || !err_len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

/* Milliseconds on CLOCK_MONOTONIC (what every *_ms of the profile is measured with). */
static inline double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

#endif
