/* Minimal test harness: CHECK records a failure and continues; the test
 * binary's main returns cb_test_report(), which prints the plain closing line
 * "N passed, N failed" and exits non-zero on any failure. */
#ifndef CB_TESTUTIL_H
#define CB_TESTUTIL_H
#include <stdio.h>

static int cb_test_passed, cb_test_failed;

#define CHECK(cond) do { \
    if (cond) cb_test_passed++; \
    else { cb_test_failed++; fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } \
} while (0)

#define CHECK_MSG(cond, ...) do { \
    if (cond) cb_test_passed++; \
    else { cb_test_failed++; fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
           fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } \
} while (0)

static inline int cb_test_report(const char *name) {
    printf("%s: %d passed, %d failed\n", name, cb_test_passed, cb_test_failed);
    return cb_test_failed ? 1 : 0;
}
#endif
