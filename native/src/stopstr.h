/*
 * stopstr.h — stop strings matched on the byte stream of a request's output.
 *
 * The engine feeds the bytes of every generated token in order.  A stop
 * string may span several tokens, or sit in the middle of one token; feed()
 * reports the byte offset (in the whole output) where the earliest completed
 * stop string starts, so the caller can truncate the output there.  partial()
 * says how many bytes at the end of the output could still grow into a stop
 * string: a streaming layer holds those back until they are resolved.
 *
 * Everything lives in fixed arrays inside the struct: init copies the
 * strings, nothing is ever allocated, and free() only clears the struct.
 */
#ifndef CB_STOPSTR_H
#define CB_STOPSTR_H

#include <stddef.h>
#include <stdint.h>
#include "colibri.h"

#define CB_STOPSTR_MAX_LEN 256  /* longest accepted stop string, in bytes */

typedef struct {
    int      n;                                    /* stop strings held [0..CB_MAX_STOP] */
    size_t   len[CB_MAX_STOP];                     /* byte length of each, [1..CB_STOPSTR_MAX_LEN] */
    uint8_t  str[CB_MAX_STOP][CB_STOPSTR_MAX_LEN]; /* the strings' bytes (not NUL-terminated) */
    size_t   max_len;                              /* longest len[], 0 when n == 0 */
    uint8_t  tail[CB_STOPSTR_MAX_LEN];             /* last tail_len bytes of the output */
    size_t   tail_len;                             /* min(out_len, max_len - 1): enough to hold
                                                    * every proper prefix of a stop string */
    int64_t  out_len;                              /* bytes fed so far (whole output) */
    int64_t  hit;                                  /* offset of the stop found, or -1 */
} cb_stopstr;

/* Copy n stop strings (lens[i] bytes each; lens == NULL means NUL-terminated).
 * Rejects n outside [0, CB_MAX_STOP], NULL strings, empty strings and strings
 * longer than CB_STOPSTR_MAX_LEN with CB_ERR_ARG and a message in err. */
int  cb_stopstr_init(cb_stopstr *s, int n, const char *const *strs, const size_t *lens,
                     char *err, size_t err_len);
/* Forget the output seen so far (same stop strings), for a new request. */
void cb_stopstr_reset(cb_stopstr *s);
/* Clear the struct (nothing to free; kept for a symmetric lifecycle). */
void cb_stopstr_free(cb_stopstr *s);

/* Feed the n bytes of one new token.  Returns the byte offset in the whole
 * output where the earliest-starting stop string begins if one is complete
 * now, else -1.  Once a stop was found the matcher is finished: later feeds
 * return the same offset and change nothing.  n == 0 (or bytes == NULL)
 * feeds nothing. */
int64_t cb_stopstr_feed(cb_stopstr *s, const uint8_t *bytes, size_t n);

/* Bytes at the end of the output so far that are a proper prefix of some
 * stop string (the longest such suffix), i.e. might still become a stop.
 * 0 after a stop was found (the caller truncates at the hit instead). */
size_t cb_stopstr_partial(const cb_stopstr *s);

/* Total bytes fed so far. */
int64_t cb_stopstr_out_len(const cb_stopstr *s);

#endif
