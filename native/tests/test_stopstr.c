/*
 * test_stopstr.c — stop-string matcher (native/src/stopstr.c).
 *
 * Besides hand-made cases, a randomized test compares every feed against a
 * naive reference that keeps the whole output and searches it from scratch
 * (earliest start over all stop strings; longest suffix that is a proper
 * prefix), over random splittings of random text from a tiny alphabet so
 * that near-misses and overlaps are frequent.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "stopstr.h"
#include "testutil.h"

static int64_t feed_str(cb_stopstr *s, const char *t) {
    return cb_stopstr_feed(s, (const uint8_t *)t, strlen(t));
}

static int init_strs(cb_stopstr *s, int n, const char *const *strs) {
    char err[128];
    return cb_stopstr_init(s, n, strs, NULL, err, sizeof err);
}

static void test_basic(void) {
    cb_stopstr s;
    const char *one[] = {"</end>"};
    CHECK(init_strs(&s, 1, one) == CB_OK);
    /* spanning three tokens: "Hello </" "en" "d> tail" */
    CHECK(feed_str(&s, "Hello <") == -1);
    CHECK(cb_stopstr_partial(&s) == 1);          /* "<" */
    CHECK(feed_str(&s, "/") == -1);
    CHECK(cb_stopstr_partial(&s) == 2);          /* "</" */
    CHECK(feed_str(&s, "en") == -1);
    CHECK(cb_stopstr_partial(&s) == 4);          /* "</en" */
    CHECK(feed_str(&s, "d> tail") == 6);         /* starts after "Hello " */
    CHECK(cb_stopstr_partial(&s) == 0);
    /* finished: later feeds repeat the offset */
    CHECK(feed_str(&s, "more </end>") == 6);
    CHECK(cb_stopstr_out_len(&s) == 17);        /* the feed after the stop is not counted */

    /* inside one token, with text on both sides */
    cb_stopstr_reset(&s);
    CHECK(feed_str(&s, "abc") == -1);
    CHECK(feed_str(&s, "xy</end>zz") == 5);

    /* a partial that turns out not to be a stop resets partial() */
    cb_stopstr_reset(&s);
    CHECK(feed_str(&s, "a </e") == -1);
    CHECK(cb_stopstr_partial(&s) == 3);
    CHECK(feed_str(&s, "x") == -1);
    CHECK(cb_stopstr_partial(&s) == 0);
    /* no false positives on near misses */
    CHECK(feed_str(&s, "</en</end</ende> <end> /end>") == -1);
    CHECK(cb_stopstr_partial(&s) == 0);
    CHECK(feed_str(&s, "<") == -1);
    CHECK(cb_stopstr_partial(&s) == 1);
    /* the whole stop string at the end of a long token */
    CHECK(feed_str(&s, "/end>") == 5 + 1 + 28);
    cb_stopstr_free(&s);

    /* self-overlapping stop string: "aab" in "aaab" starts at 1 */
    const char *ov[] = {"aab"};
    CHECK(init_strs(&s, 1, ov) == CB_OK);
    CHECK(feed_str(&s, "a") == -1);
    CHECK(feed_str(&s, "a") == -1);
    CHECK(cb_stopstr_partial(&s) == 2);
    CHECK(feed_str(&s, "a") == -1);
    CHECK(cb_stopstr_partial(&s) == 2);          /* "aa" again, not 3 */
    CHECK(feed_str(&s, "b") == 1);
}

static void test_multiple(void) {
    cb_stopstr s;
    const char *two[] = {"STOP", "\n\n", "OP!"};
    CHECK(init_strs(&s, 3, two) == CB_OK);
    /* both complete in the same token: the earliest start wins */
    CHECK(feed_str(&s, "xx\n\nSTOP") == 2);
    cb_stopstr_reset(&s);
    CHECK(feed_str(&s, "xxST") == -1);
    CHECK(cb_stopstr_partial(&s) == 2);
    /* "STOP!" contains STOP (start 2) and OP! (start 4): STOP wins */
    CHECK(feed_str(&s, "OP!") == 2);
    /* the longest partial over all strings */
    cb_stopstr_reset(&s);
    CHECK(feed_str(&s, "ab\nSTO") == -1);
    CHECK(cb_stopstr_partial(&s) == 3);
    CHECK(feed_str(&s, "x\n") == -1);
    CHECK(cb_stopstr_partial(&s) == 1);
    cb_stopstr_free(&s);

    /* a longer string that started earlier but is not yet complete does not
     * block a shorter one completing now (streaming: stop as soon as any
     * stop string is complete) */
    const char *nest[] = {"abcdef", "cd"};
    CHECK(init_strs(&s, 2, nest) == CB_OK);
    CHECK(feed_str(&s, "ab") == -1);
    CHECK(feed_str(&s, "cd") == 2);
    cb_stopstr_reset(&s);
    /* when both complete in the same feed, the one starting earlier wins */
    CHECK(feed_str(&s, "xabcdef") == 1);

    /* binary bytes, embedded NUL, explicit lengths */
    const char bin[3] = {'\0', (char)0xff, 'q'};
    const char *bins[] = {bin};
    const size_t lens[] = {3};
    char err[64];
    CHECK(cb_stopstr_init(&s, 1, bins, lens, err, sizeof err) == CB_OK);
    const uint8_t t1[2] = {'z', 0};
    const uint8_t t2[2] = {0xff, 'q'};
    CHECK(cb_stopstr_feed(&s, t1, 2) == -1);
    CHECK(cb_stopstr_partial(&s) == 1);
    CHECK(cb_stopstr_feed(&s, t2, 2) == 1);

    /* no stop strings: never fires */
    CHECK(init_strs(&s, 0, NULL) == CB_OK);
    CHECK(feed_str(&s, "anything") == -1);
    CHECK(cb_stopstr_partial(&s) == 0);
    CHECK(cb_stopstr_out_len(&s) == 8);
    /* an empty feed changes nothing */
    CHECK(cb_stopstr_feed(&s, NULL, 0) == -1);
    CHECK(cb_stopstr_out_len(&s) == 8);
}

static void test_init_errors(void) {
    cb_stopstr s;
    char err[128];
    const char *empty[] = {"ok", ""};
    err[0] = 0;
    CHECK(cb_stopstr_init(&s, 2, empty, NULL, err, sizeof err) == CB_ERR_ARG);
    CHECK(strstr(err, "empty") != NULL);
    CHECK(s.n == 0);
    static char longs[300];
    memset(longs, 'x', 299);
    const char *lp[] = {longs};
    CHECK(cb_stopstr_init(&s, 1, lp, NULL, err, sizeof err) == CB_ERR_ARG);
    CHECK(strstr(err, "longer") != NULL);
    const size_t l256[] = {256};
    CHECK(cb_stopstr_init(&s, 1, lp, l256, err, sizeof err) == CB_OK);   /* exactly the limit */
    const char *many[CB_MAX_STOP + 1];
    for (int i = 0; i <= CB_MAX_STOP; i++) many[i] = "x";
    CHECK(cb_stopstr_init(&s, CB_MAX_STOP + 1, many, NULL, err, sizeof err) == CB_ERR_ARG);
    CHECK(cb_stopstr_init(&s, -1, many, NULL, err, sizeof err) == CB_ERR_ARG);
    CHECK(cb_stopstr_init(&s, CB_MAX_STOP, many, NULL, err, sizeof err) == CB_OK);
    const char *nul[] = {NULL};
    CHECK(cb_stopstr_init(&s, 1, nul, NULL, err, sizeof err) == CB_ERR_ARG);
    CHECK(cb_stopstr_init(&s, 1, NULL, NULL, err, sizeof err) == CB_ERR_ARG);
    CHECK(cb_stopstr_init(NULL, 0, NULL, NULL, err, sizeof err) == CB_ERR_ARG);
    CHECK(cb_stopstr_init(&s, 1, empty, NULL, NULL, 0) == CB_OK);        /* err optional */

    /* the 256-byte string matches across many small feeds */
    CHECK(cb_stopstr_init(&s, 1, lp, l256, err, sizeof err) == CB_OK);
    CHECK(feed_str(&s, "yyy") == -1);
    int64_t got = -1;
    for (int i = 0; i < 256 && got < 0; i++) {
        got = feed_str(&s, "x");
        if (i < 255) CHECK(got == -1 && cb_stopstr_partial(&s) == (size_t)(i + 1));
    }
    CHECK(got == 3);
}

/* ------------------------------------------------ randomized vs reference */

static uint64_t rs = 88172645463325252ULL;
static uint32_t rnd(uint32_t n) {
    rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
    return (uint32_t)(rs % n);
}

/* Naive: earliest start of any stop string fully inside out[0..len). */
static int64_t ref_find(const char *out, size_t len, char strs[][8], const size_t *sl, int n) {
    for (size_t st = 0; st < len; st++)
        for (int i = 0; i < n; i++)
            if (st + sl[i] <= len && memcmp(out + st, strs[i], sl[i]) == 0) return (int64_t)st;
    return -1;
}

static size_t ref_partial(const char *out, size_t len, char strs[][8], const size_t *sl, int n) {
    size_t best = 0;
    for (int i = 0; i < n; i++)
        for (size_t k = 1; k < sl[i] && k <= len; k++)
            if (memcmp(out + len - k, strs[i], k) == 0 && k > best) best = k;
    return best;
}

static void test_random(void) {
    char out[512];
    char strs[CB_MAX_STOP][8];
    const char *ptrs[CB_MAX_STOP];
    size_t sl[CB_MAX_STOP];
    int mism = 0, hits = 0;
    for (int trial = 0; trial < 3000; trial++) {
        int n = 1 + (int)rnd(4);
        for (int i = 0; i < n; i++) {
            sl[i] = 1 + rnd(6);
            for (size_t k = 0; k < sl[i]; k++) strs[i][k] = (char)('a' + rnd(3));
            ptrs[i] = strs[i];
        }
        cb_stopstr s;
        char err[64];
        if (cb_stopstr_init(&s, n, ptrs, sl, err, sizeof err) != CB_OK) { mism++; continue; }
        size_t len = 0;
        int64_t got = -1;
        while (len < 200 && got < 0) {
            char tok[12];
            size_t tl = rnd(10);      /* tokens of 0..9 bytes */
            for (size_t k = 0; k < tl; k++) tok[k] = (char)('a' + rnd(4));
            got = cb_stopstr_feed(&s, (const uint8_t *)tok, tl);
            memcpy(out + len, tok, tl);
            len += tl;
            int64_t want = ref_find(out, len, strs, sl, n);
            if (got != want) {
                if (mism++ < 5) fprintf(stderr, "trial %d: got %lld want %lld\n", trial, (long long)got, (long long)want);
                break;
            }
            if (got < 0 && cb_stopstr_partial(&s) != ref_partial(out, len, strs, sl, n)) {
                if (mism++ < 5) fprintf(stderr, "trial %d: partial %zu want %zu\n", trial,
                                        cb_stopstr_partial(&s), ref_partial(out, len, strs, sl, n));
                break;
            }
        }
        hits += got >= 0;
    }
    CHECK_MSG(mism == 0, "%d mismatches against the reference", mism);
    CHECK(hits > 1000);   /* the random cases do reach stops */
}

int main(void) {
    test_basic();
    test_multiple();
    test_init_errors();
    test_random();
    return cb_test_report("test_stopstr");
}
