/*
 * stopstr.c — stop-string matcher over a token byte stream (see stopstr.h).
 *
 * Why a tail buffer: a stop string that completes in the current token can
 * start at most max_len - 1 bytes before it, so the last max_len - 1 output
 * bytes plus the new token are the whole window a new match can live in.
 * Matches lying entirely in the old output were already reported by an
 * earlier feed, so only matches that end inside the new bytes are searched.
 *
 * Cost per feed: for each stop string, the start positions whose match would
 * end inside the new bytes, each compared with an early exit, i.e.
 * O(n_stop * (len + n) * len) in the worst case and ~O(n_stop * (len + n))
 * on text; strings are <= 256 bytes and there are at most 8.
 */
#include "stopstr.h"
#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int cb_stopstr_init(cb_stopstr *s, int n, const char *const *strs, const size_t *lens,
                    char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!s) { set_err(err, err_len, "stop strings: NULL matcher"); return CB_ERR_ARG; }
    memset(s, 0, sizeof *s);
    s->hit = -1;
    if (n < 0 || n > CB_MAX_STOP) {
        set_err(err, err_len, "stop strings: %d given, at most %d allowed", n, CB_MAX_STOP);
        return CB_ERR_ARG;
    }
    if (n > 0 && !strs) { set_err(err, err_len, "stop strings: NULL array for %d strings", n); return CB_ERR_ARG; }
    for (int i = 0; i < n; i++) {
        if (!strs[i]) { set_err(err, err_len, "stop string %d is NULL", i); goto fail; }
        size_t len = lens ? lens[i] : strlen(strs[i]);
        if (len == 0) { set_err(err, err_len, "stop string %d is empty", i); goto fail; }
        if (len > CB_STOPSTR_MAX_LEN) {
            set_err(err, err_len, "stop string %d is %zu bytes, longer than %d", i, len, CB_STOPSTR_MAX_LEN);
            goto fail;
        }
        memcpy(s->str[i], strs[i], len);
        s->len[i] = len;
        if (len > s->max_len) s->max_len = len;
    }
    s->n = n;
    return CB_OK;
fail:
    memset(s, 0, sizeof *s);
    s->hit = -1;
    return CB_ERR_ARG;
}

void cb_stopstr_reset(cb_stopstr *s) {
    if (!s) return;
    s->tail_len = 0;
    s->out_len = 0;
    s->hit = -1;
}

void cb_stopstr_free(cb_stopstr *s) {
    if (!s) return;
    memset(s, 0, sizeof *s);
    s->hit = -1;
}

int64_t cb_stopstr_out_len(const cb_stopstr *s) { return s ? s->out_len : 0; }

/* Byte j of the window tail[0..T) ++ bytes[0..n). */
static inline uint8_t win_at(const cb_stopstr *s, const uint8_t *bytes, size_t j) {
    return j < s->tail_len ? s->tail[j] : bytes[j - s->tail_len];
}

int64_t cb_stopstr_feed(cb_stopstr *s, const uint8_t *bytes, size_t n) {
    if (!s) return -1;
    if (s->hit >= 0) return s->hit;
    if (!bytes || n == 0) return -1;

    const size_t T = s->tail_len;
    const size_t W = T + n;                 /* window length */
    size_t best = (size_t)-1;               /* earliest start in the window */
    for (int i = 0; i < s->n; i++) {
        const size_t len = s->len[i];
        if (len > W) continue;
        /* the match must end after the old tail: start + len > T */
        size_t lo = T >= len ? T - len + 1 : 0;
        size_t hi = W - len;                /* last start that fits */
        if (best != (size_t)-1) {           /* only an earlier start can win */
            if (best == 0) break;
            if (hi > best - 1) hi = best - 1;
        }
        if (lo > hi) continue;
        for (size_t st = lo; st <= hi; st++) {
            size_t k = 0;
            while (k < len && win_at(s, bytes, st + k) == s->str[i][k]) k++;
            if (k == len) { best = st; break; }
        }
    }

    /* The window starts at output offset out_len - T. */
    const int64_t win_base = s->out_len - (int64_t)T;
    s->out_len += (int64_t)n;

    if (best != (size_t)-1) {
        s->hit = win_base + (int64_t)best;
        return s->hit;
    }

    /* Keep the last max_len - 1 bytes of the output. */
    size_t keep = s->max_len > 0 ? s->max_len - 1 : 0;
    if (keep > W) keep = W;
    if (n >= keep) {
        memcpy(s->tail, bytes + (n - keep), keep);
    } else {
        size_t from_tail = keep - n;        /* < T since keep <= W */
        memmove(s->tail, s->tail + (T - from_tail), from_tail);
        memcpy(s->tail + from_tail, bytes, n);
    }
    s->tail_len = keep;
    return -1;
}

size_t cb_stopstr_partial(const cb_stopstr *s) {
    if (!s || s->hit >= 0) return 0;
    size_t best = 0;
    for (int i = 0; i < s->n; i++) {
        size_t maxk = s->len[i] - 1;        /* proper prefixes only */
        if (maxk > s->tail_len) maxk = s->tail_len;
        for (size_t k = maxk; k > best; k--) {
            if (memcmp(s->tail + (s->tail_len - k), s->str[i], k) == 0) { best = k; break; }
        }
    }
    return best;
}
