/*
 * test_bpe.c — byte-level BPE tokenizer (native/src/bpe.c) on vocabularies
 * built in memory.
 *
 * - Pre-tokenizers: for a test string, a vocabulary holding every substring
 *   of it with a merge for every split of each substring makes every
 *   pre-token merge into exactly one token and never merges across one, so
 *   the output *is* the pre-token split, compared with the split written by
 *   hand from the regexes ("a|  | b").
 * - Merges: hand-made vocabularies for rank order, leftmost ties, skipped
 *   merges; and random vocabularies against a naive O(n^2) BPE.
 * - Fuzz: random bytes (invalid UTF-8 included) never crash, ids' bytes
 *   concatenate back to the input, cap truncation returns the same count.
 * Byte tokens are given in the GGUF byte-level form (bytes_to_unicode).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "testutil.h"

/* ---------------------------------------------------------- vocab builder */

#define MAXTOK 8192
#define MAXLEN 64

typedef struct {
    int      n;                    /* tokens so far */
    uint8_t  raw[MAXTOK][MAXLEN];  /* token i's raw bytes */
    size_t   raw_len[MAXTOK];
    char     text[MAXTOK][2 * MAXLEN]; /* byte-level form (as a GGUF stores it) */
    size_t   text_len[MAXTOK];
    int      n_merges;
    char     merge[MAXTOK][4 * MAXLEN + 1]; /* "left right" in byte-level form */
    size_t   merge_len[MAXTOK];
} vocab;

static vocab V;  /* large: static */

/* GPT-2 bytes_to_unicode as UTF-8; returns its length. */
static size_t byte_char(uint8_t c, char *out) {
    int n = 0;
    uint32_t cp = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        if (b == c) { cp = printable ? (uint32_t)b : 256u + (uint32_t)n; break; }
        if (!printable) n++;
    }
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

static size_t to_text(const uint8_t *raw, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) o += byte_char(raw[i], out + o);
    return o;
}

static int find_tok(const uint8_t *raw, size_t n) {
    for (int i = 0; i < V.n; i++)
        if (V.raw_len[i] == n && memcmp(V.raw[i], raw, n) == 0) return i;
    return -1;
}

static int add_tok(const uint8_t *raw, size_t n) {
    int i = find_tok(raw, n);
    if (i >= 0 || V.n >= MAXTOK || n > MAXLEN) return i;
    i = V.n++;
    memcpy(V.raw[i], raw, n);
    V.raw_len[i] = n;
    V.text_len[i] = to_text(raw, n, V.text[i]);
    return i;
}

/* Vocabulary of the 256 single bytes (id = byte), minus `skip` (-1: none). */
static void vocab_bytes(int skip) {
    V.n = 0;
    V.n_merges = 0;
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        if (b == skip) { c = 'a'; }  /* keep id = byte: a duplicate text instead */
        int i = V.n++;
        V.raw[i][0] = c;
        V.raw_len[i] = 1;
        V.text_len[i] = to_text(&c, 1, V.text[i]);
    }
}

/* Merge (left, right) as the next rank; adds the merged token. */
static void add_merge(const char *l, size_t ln, const char *r, size_t rn) {
    uint8_t cat[MAXLEN];
    if (ln + rn > MAXLEN || V.n_merges >= MAXTOK) return;
    memcpy(cat, l, ln);
    memcpy(cat + ln, r, rn);
    add_tok(cat, ln + rn);
    char *m = V.merge[V.n_merges];
    size_t o = to_text((const uint8_t *)l, ln, m);
    m[o++] = ' ';
    o += to_text((const uint8_t *)r, rn, m + o);
    V.merge_len[V.n_merges++] = o;
}

static void add_merge_s(const char *l, const char *r) { add_merge(l, strlen(l), r, strlen(r)); }

static cb_bpe *build(const char *pre) {
    static const char *tp[MAXTOK], *mp[MAXTOK];
    for (int i = 0; i < V.n; i++) tp[i] = V.text[i];
    for (int k = 0; k < V.n_merges; k++) mp[k] = V.merge[k];
    cb_bpe *b = NULL;
    char err[200] = "";
    int rc = cb_bpe_build_arrays(tp, V.text_len, V.n, mp, V.merge_len, V.n_merges, pre, &b, err, sizeof err);
    CHECK_MSG(rc == CB_OK, "build(%s): %d %s", pre, rc, err);
    return b;
}

/* Tokenize and render the tokens' raw bytes joined by '|'. */
static const char *pieces(const cb_bpe *b, const char *s, size_t n) {
    static char out[4096];
    int32_t ids[1024];
    int k = cb_bpe_tokenize_alloc(b, (const uint8_t *)s, n, ids, 1024);
    if (k < 0) { snprintf(out, sizeof out, "<error %d>", k); return out; }
    size_t o = 0;
    for (int i = 0; i < k && i < 1024; i++) {
        if (i) out[o++] = '|';
        memcpy(out + o, V.raw[ids[i]], V.raw_len[ids[i]]);
        o += V.raw_len[ids[i]];
    }
    out[o] = 0;
    return out;
}

/* ------------------------------------------------------- pre-tokenizers */

/* The pre-token split of s under `pre`: a vocabulary where every substring of
 * s is a token, merged from any split of it. */
static const char *split(const char *pre, const char *s) {
    size_t n = strlen(s);
    vocab_bytes(-1);
    for (size_t len = 2; len <= n; len++)
        for (size_t a = 0; a + len <= n; a++)
            for (size_t k = 1; k < len; k++) add_merge(s + a, k, s + a + k, len - k);
    cb_bpe *b = build(pre);
    static char out[4096];
    snprintf(out, sizeof out, "%s", b ? pieces(b, s, n) : "<no bpe>");
    cb_bpe_free(b);
    return out;
}

#define CHECK_SPLIT(pre, s, want) do { \
    const char *got_ = split(pre, s); \
    CHECK_MSG(strcmp(got_, want) == 0, "%s: '%s' -> '%s', want '%s'", pre, s, got_, want); \
} while (0)

static void test_gpt2_split(void) {
    /* \s+(?!\S) gives the last space to the next word */
    CHECK_SPLIT("gpt-2", "a   b", "a|  | b");
    CHECK_SPLIT("gpt-2", "a b", "a| b");
    CHECK_SPLIT("gpt-2", "a  ", "a|  ");           /* trailing run: (?!\S) holds at the end */
    CHECK_SPLIT("gpt-2", "a \t\tb", "a| \t|\t|b");   /* only a space joins a word */
    CHECK_SPLIT("gpt-2", "  \n x", "  \n| x");
    /* contractions: case-sensitive in GPT-2 */
    CHECK_SPLIT("gpt-2", "it's we've I'll", "it|'s| we|'ve| I|'ll");
    CHECK_SPLIT("gpt-2", "IT'S", "IT|'|S");
    CHECK_SPLIT("gpt-2", "''s", "''|s");             /* punctuation run first */
    /* letters, numbers, other */
    CHECK_SPLIT("gpt-2", "abc123 45x", "abc|123| 45|x");
    CHECK_SPLIT("gpt-2", "hi!! ?", "hi|!!| ?");
    /* UTF-8: é and 中 are letters, U+00A0 is whitespace, U+00BD a number */
    CHECK_SPLIT("gpt-2", "h\xc3\xa9llo \xe4\xb8\xad", "h\xc3\xa9llo| \xe4\xb8\xad");
    CHECK_SPLIT("gpt-2", "a\xc2\xa0\xc2\xa0" "b", "a|\xc2\xa0|\xc2\xa0|b");  /* only ' ' prefixes a word */
    CHECK_SPLIT("llama-bpe", "a\xc2\xa0\xc2\xa0" "b", "a|\xc2\xa0|\xc2\xa0" "b");  /* any non-letter may */
    CHECK_SPLIT("gpt-2", "x\xc2\xbd", "x|\xc2\xbd");
    /* invalid UTF-8: each bad byte is an "other" character */
    CHECK_SPLIT("gpt-2", "a\xc3", "a|\xc3");
    CHECK_SPLIT("gpt-2", "\xff\xfe a", "\xff\xfe| a");
    CHECK_SPLIT("gpt-2", "\xed\xa0\x80z", "\xed\xa0\x80|z");   /* a surrogate is invalid */
}

static void test_digit_split(void) {
    /* smollm: every digit alone, then the GPT-2 regex on each stretch between */
    CHECK_SPLIT("smollm", "abc123", "abc|1|2|3");
    CHECK_SPLIT("smollm", " 42", " |4|2");
    CHECK_SPLIT("smollm", "x  7", "x|  |7");       /* the lookahead stops at the digit */
    CHECK_SPLIT("smollm", "\xd9\xa3\xd9\xa4", "\xd9\xa3|\xd9\xa4");  /* Arabic-Indic digits */
    CHECK_SPLIT("smollm", "v1.2", "v|1|.|2");
}

static void test_llama3_split(void) {
    CHECK_SPLIT("llama-bpe", "IT'S", "IT|'S");      /* (?i:...) */
    CHECK_SPLIT("llama-bpe", "x'\xc5\xbft", "x|'\xc5\xbf|t");  /* U+017F folds to s */
    CHECK_SPLIT("llama-bpe", "(hello", "(hello");   /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    CHECK_SPLIT("llama-bpe", "12345", "123|45");
    CHECK_SPLIT("qwen2", "12345", "1|2|3|4|5");
    CHECK_SPLIT("llama-bpe", "a \r\n \nb", "a| \r\n \n|b");
    CHECK_SPLIT("llama-bpe", "x ...\n\ny", "x| ...\n\n|y");
    CHECK_SPLIT("llama-bpe", "a   b", "a|  | b");
}

/* ---------------------------------------------------------------- merges */

static void test_merge_order(void) {
    cb_bpe *b;
    /* lower rank first: bc before ab */
    vocab_bytes(-1);
    add_merge_s("b", "c");
    add_merge_s("a", "b");
    b = build("gpt-2");
    CHECK(strcmp(pieces(b, "abc", 3), "a|bc") == 0);
    cb_bpe_free(b);
    /* the other way round */
    vocab_bytes(-1);
    add_merge_s("a", "b");
    add_merge_s("b", "c");
    add_merge_s("ab", "c");
    b = build("gpt-2");
    CHECK(strcmp(pieces(b, "abc", 3), "abc") == 0);
    CHECK(strcmp(pieces(b, "xbc", 3), "x|bc") == 0);
    cb_bpe_free(b);
    /* ties: leftmost first */
    vocab_bytes(-1);
    add_merge_s("a", "a");
    b = build("gpt-2");
    CHECK(strcmp(pieces(b, "aaa", 3), "aa|a") == 0);
    CHECK(strcmp(pieces(b, "aaaa", 4), "aa|aa") == 0);
    cb_bpe_free(b);
    /* a later-rank pair to the left does not win */
    vocab_bytes(-1);
    add_merge_s("a", "b");
    add_merge_s("x", "a");
    b = build("gpt-2");
    CHECK(strcmp(pieces(b, "xab", 3), "x|ab") == 0);
    CHECK(strcmp(pieces(b, "xac", 3), "xa|c") == 0);
    cb_bpe_free(b);
    /* a repeated pair keeps its last rank (HF tokenizers' merge map; checked
     * in Python: merges [ab, bc, ab] give "a|bc", [bc, ab, bc] "ab|c") */
    vocab_bytes(-1);
    add_merge_s("a", "b");
    add_merge_s("b", "c");
    add_merge_s("a", "b");
    b = build("gpt-2");
    CHECK(strcmp(pieces(b, "abc", 3), "a|bc") == 0);
    cb_bpe_free(b);
    vocab_bytes(-1);
    add_merge_s("b", "c");
    add_merge_s("a", "b");
    add_merge_s("b", "c");
    b = build("gpt-2");
    CHECK(strcmp(pieces(b, "abc", 3), "ab|c") == 0);
    cb_bpe_free(b);
    /* merges never cross pre-tokens */
    vocab_bytes(-1);
    add_merge_s("a", " ");
    add_merge_s(" ", "b");
    b = build("gpt-2");
    CHECK(strcmp(pieces(b, "a b", 3), "a| b") == 0);
    cb_bpe_free(b);
}

static void test_build_errors(void) {
    static const char *tp[256];
    size_t tl[256];
    char txt[256][3];
    for (int c = 0; c < 256; c++) { tl[c] = byte_char((uint8_t)c, txt[c]); tp[c] = txt[c]; }
    cb_bpe *b = (cb_bpe *)1;
    char err[200] = "";
    CHECK(cb_bpe_build_arrays(tp, tl, 256, NULL, NULL, 0, "default", &b, err, sizeof err) == CB_ERR_UNSUPPORTED);
    CHECK(b == NULL && strstr(err, "default") != NULL);
    CHECK(cb_bpe_build_arrays(tp, tl, 256, NULL, NULL, 0, "nonsense", &b, err, sizeof err) == CB_ERR_UNSUPPORTED);
    const char *bad_merge[] = { "abc" };  /* no space */
    size_t bml = 3;
    CHECK(cb_bpe_build_arrays(tp, tl, 256, bad_merge, &bml, 1, "gpt-2", &b, err, sizeof err) == CB_ERR_FORMAT);
    /* a merge whose parts or result are not tokens is skipped, not an error */
    const char *odd_merge[] = { "a b" };
    size_t oml = 3;
    CHECK(cb_bpe_build_arrays(tp, tl, 256, odd_merge, &oml, 1, "gpt-2", &b, err, sizeof err) == CB_OK);
    if (b) {
        int32_t ids[4];
        CHECK(cb_bpe_tokenize_alloc(b, (const uint8_t *)"ab", 2, ids, 4) == 2);
        cb_bpe_free(b);
    }
    /* an ASCII letter without a token: not byte-level */
    tp['q'] = "Q";
    tl['q'] = 1;
    CHECK(cb_bpe_build_arrays(tp, tl, 256, NULL, NULL, 0, "gpt-2", &b, err, sizeof err) == CB_ERR_UNSUPPORTED);
    /* bad arguments */
    CHECK(cb_bpe_build_arrays(NULL, tl, 256, NULL, NULL, 0, "gpt-2", &b, err, sizeof err) == CB_ERR_ARG);
    cb_bpe_free(NULL);
}

static void test_missing_byte(void) {
    vocab_bytes(0x04);  /* as SmolLM2: no token for 0x04 */
    cb_bpe *b = build("gpt-2");
    if (!b) return;
    int32_t ids[8];
    CHECK(cb_bpe_byte_token(b, 0x04) < 0);
    CHECK(cb_bpe_byte_token(b, 'a') == 'a');
    CHECK(cb_bpe_tokenize_alloc(b, (const uint8_t *)"x\x04y", 3, ids, 8) == CB_ERR_UNSUPPORTED);
    CHECK(cb_bpe_tokenize_alloc(b, (const uint8_t *)"xy", 2, ids, 8) == 2);
    cb_bpe_free(b);
}

static void test_args(void) {
    vocab_bytes(-1);
    add_merge_s("a", "b");
    cb_bpe *b = build("gpt-2");
    if (!b) return;
    int32_t ids[8];
    uint8_t scratch[256];
    CHECK(cb_bpe_tokenize(b, NULL, 0, ids, 8, NULL, 0) == 0);   /* empty input needs nothing */
    CHECK(cb_bpe_tokenize(b, (const uint8_t *)"ab", 2, ids, -1, scratch, sizeof scratch) == CB_ERR_ARG);
    CHECK(cb_bpe_tokenize(b, (const uint8_t *)"ab", 2, ids, 8, scratch, cb_bpe_scratch_size(2) - 1) == CB_ERR_ARG);
    CHECK(cb_bpe_tokenize(NULL, (const uint8_t *)"ab", 2, ids, 8, scratch, sizeof scratch) == CB_ERR_ARG);
    CHECK(cb_bpe_scratch_size((size_t)1 << 40) == SIZE_MAX);
    /* unaligned scratch is fine */
    CHECK(cb_bpe_tokenize(b, (const uint8_t *)"ab ab", 5, ids, 8, scratch + 1, sizeof scratch - 1) == 3);  /* ab, " ", ab */
    /* cap 0: count only */
    CHECK(cb_bpe_tokenize(b, (const uint8_t *)"ab ab", 5, NULL, 0, scratch, sizeof scratch) == 3);
    cb_bpe_free(b);
}

/* ------------------------------------------------------ randomized tests */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* Naive BPE of raw bytes with V's merges: repeatedly merge the lowest-rank
 * adjacent pair (leftmost on ties).  Returns the token count. */
static int naive_bpe(const uint8_t *s, int n, int *out) {
    int m = 0;
    for (int i = 0; i < n; i++) out[m++] = s[i];
    for (;;) {
        int best = -1, best_rank = 1 << 30, best_tok = -1;
        for (int i = 0; i + 1 < m; i++) {
            for (int k = 0; k < V.n_merges && k < best_rank; k++) {
                /* merge k = (left, right) found by raw bytes */
                uint8_t cat[2 * MAXLEN];
                size_t ln = V.raw_len[out[i]], rn = V.raw_len[out[i + 1]];
                memcpy(cat, V.raw[out[i]], ln);
                memcpy(cat + ln, V.raw[out[i + 1]], rn);
                char txt[4 * MAXLEN + 2];
                size_t o = to_text(V.raw[out[i]], ln, txt);
                txt[o++] = ' ';
                o += to_text(V.raw[out[i + 1]], rn, txt + o);
                if (V.merge_len[k] == o && memcmp(V.merge[k], txt, o) == 0) {
                    best = i; best_rank = k; best_tok = find_tok(cat, ln + rn);
                    break;
                }
            }
        }
        if (best < 0) return m;
        out[best] = best_tok;
        memmove(out + best + 1, out + best + 2, (size_t)(m - best - 2) * sizeof *out);
        m--;
    }
}

static int has_merge(int a, int c) {
    char txt[4 * MAXLEN + 2];
    size_t o = to_text(V.raw[a], V.raw_len[a], txt);
    txt[o++] = ' ';
    o += to_text(V.raw[c], V.raw_len[c], txt + o);
    for (int k = 0; k < V.n_merges; k++)
        if (V.merge_len[k] == o && memcmp(V.merge[k], txt, o) == 0) return 1;
    return 0;
}

/* Random merges over the letters "abc"; random words against the naive BPE
 * (one word = one pre-token: letters only, no spaces). */
static void test_random_merges(void) {
    for (int round = 0; round < 20; round++) {
        vocab_bytes(-1);
        for (int k = 0; k < 40; k++) {
            int a = (int)(rnd() % (unsigned)V.n), c = (int)(rnd() % (unsigned)V.n);
            /* parts drawn from tokens made of a, b, c only */
            if (V.raw_len[a] + V.raw_len[c] > 8) continue;
            int ok = 1;
            for (size_t i = 0; i < V.raw_len[a]; i++) ok &= V.raw[a][i] >= 'a' && V.raw[a][i] <= 'c';
            for (size_t i = 0; i < V.raw_len[c]; i++) ok &= V.raw[c][i] >= 'a' && V.raw[c][i] <= 'c';
            if (!ok) { k--; if (rnd() % 64 == 0) break; continue; }
            if (has_merge(a, c)) continue;  /* repeated pairs: tested in test_merge_order */
            add_merge((const char *)V.raw[a], V.raw_len[a], (const char *)V.raw[c], V.raw_len[c]);
        }
        cb_bpe *b = build("gpt-2");
        if (!b) return;
        for (int t = 0; t < 30; t++) {
            uint8_t w[24];
            int n = 1 + (int)(rnd() % 24);
            for (int i = 0; i < n; i++) w[i] = (uint8_t)('a' + rnd() % 3);
            int want[24], got[24];
            int nw = naive_bpe(w, n, want);
            int ng = cb_bpe_tokenize_alloc(b, w, (size_t)n, got, 24);
            int same = ng == nw;
            for (int i = 0; same && i < nw; i++) same = got[i] == want[i];
            CHECK_MSG(same, "round %d word '%.*s': %d tokens vs naive %d", round, n, (const char *)w, ng, nw);
        }
        cb_bpe_free(b);
    }
}

/* Random bytes under every pre-tokenizer: round trip, count stable under cap. */
static void test_fuzz(void) {
    static const char *pres[] = { "gpt-2", "smollm", "llama-bpe", "qwen2" };
    static const char *alpha[] = { " ", "a", "b", "'", "s", "1", "\n", "\r", "\t", "\xc3\xa9", "\xe4\xb8\xad",
                                   "\xc2\xa0", "!", "\xf0\x9f\x98\x80", "\xff", "\xc3", "L", "\xc5\xbf" };
    for (int p = 0; p < 4; p++) {
        /* merges among common pieces, so that merging really happens */
        vocab_bytes(-1);
        add_merge_s(" ", "a"); add_merge_s("a", "b"); add_merge_s(" a", "b"); add_merge_s("'", "s");
        add_merge_s(" ", " "); add_merge_s("\r", "\n"); add_merge_s("\xc3", "\xa9"); add_merge_s("1", "1");
        add_merge_s("\xe4", "\xb8"); add_merge_s("\xe4\xb8", "\xad"); add_merge_s("  ", " "); add_merge_s("!", "!");
        cb_bpe *b = build(pres[p]);
        if (!b) return;
        int bad = 0;
        for (int t = 0; t < 400 && !bad; t++) {
            uint8_t s[256];
            size_t n = 0, want = rnd() % 200;
            while (n < want) {
                if (rnd() % 4 == 0) s[n++] = (uint8_t)rnd();  /* raw random byte */
                else {
                    const char *a = alpha[rnd() % (sizeof alpha / sizeof alpha[0])];
                    size_t l = strlen(a);
                    if (n + l > sizeof s) break;
                    memcpy(s + n, a, l);
                    n += l;
                }
            }
            int32_t ids[256];
            int k = cb_bpe_tokenize_alloc(b, s, n, ids, 256);
            if (k < 0 || k > (int)n) { bad = 1; CHECK_MSG(0, "%s: rc %d for %zu bytes", pres[p], k, n); break; }
            uint8_t back[512];
            size_t o = 0;
            for (int i = 0; i < k; i++) { memcpy(back + o, V.raw[ids[i]], V.raw_len[ids[i]]); o += V.raw_len[ids[i]]; }
            if (o != n || memcmp(back, s, n) != 0) { bad = 1; CHECK_MSG(0, "%s: round trip failed (%zu bytes)", pres[p], n); }
            /* a smaller cap: same count, same prefix */
            int32_t few[4];
            int k2 = cb_bpe_tokenize_alloc(b, s, n, few, 4);
            if (k2 != k || memcmp(few, ids, (size_t)(k < 4 ? k : 4) * sizeof *ids) != 0) {
                bad = 1;
                CHECK_MSG(0, "%s: cap 4 gave %d, full %d", pres[p], k2, k);
            }
        }
        CHECK_MSG(!bad, "fuzz %s", pres[p]);
        cb_bpe_free(b);
    }
}

/* n_stable: the first n_stable ids of s are the first ids of s + any tail. */
static void test_stable(void) {
    static const char *pres[] = { "gpt-2", "smollm", "llama-bpe", "qwen2" };
    static const char *alpha[] = { " ", " ", "a", "b", "'", "s", "1", "2", "\n", "\n", "\r", "\t", "\xc3\xa9", "\xc3",
                                   "\xa9", "\xe4", "\xb8", "\xad", "!", "S", "\xc2\xa0" };
    const int na = (int)(sizeof alpha / sizeof alpha[0]);
    for (int p = 0; p < 4; p++) {
        vocab_bytes(-1);
        /* merges that make a changed split show in the ids: "\n " before
         * "  " ("\n  " + "\n"), "b\xc3" before "\xc3\xa9" ("b\xc3" + "\xa9") */
        add_merge_s("\n", " "); add_merge_s("b", "\xc3");
        add_merge_s(" ", "a"); add_merge_s("a", "b"); add_merge_s(" a", "b"); add_merge_s("'", "s");
        add_merge_s(" ", " "); add_merge_s("\n", "\n"); add_merge_s("\xc3", "\xa9"); add_merge_s("1", "2");
        add_merge_s("\xe4", "\xb8"); add_merge_s("\xe4\xb8", "\xad"); add_merge_s("  ", "\n");
        cb_bpe *b = build(pres[p]);
        if (!b) return;
        int bad = 0, checked = 0;
        static uint8_t scratch[1 << 16];
        for (int t = 0; t < 3000 && !bad; t++) {
            uint8_t s[128];
            size_t n = 0, cut = 0;
            int parts = 1 + (int)(rnd() % 10), tail = 1 + (int)(rnd() % 6);
            for (int i = 0; i < parts + tail; i++) {
                if (i == parts) cut = n;
                const char *a = alpha[rnd() % (unsigned)na];
                memcpy(s + n, a, strlen(a));
                n += strlen(a);
            }
            int32_t ids1[128], ids2[128];
            int st = -1;
            int k1 = cb_bpe_tokenize_ex(b, s, cut, ids1, 128, scratch, sizeof scratch, &st);
            int k2 = cb_bpe_tokenize(b, s, n, ids2, 128, scratch, sizeof scratch);
            if (k1 < 0 || k2 < 0 || st < 0 || st > k1 || st > k2 || memcmp(ids1, ids2, (size_t)st * sizeof *ids1) != 0) {
                bad = 1;
                CHECK_MSG(0, "%s: n_stable %d of '%.*s' changes with tail '%.*s'", pres[p], st, (int)cut,
                          (const char *)s, (int)(n - cut), (const char *)s + cut);
            }
            checked += st > 0;
        }
        CHECK_MSG(!bad && checked > 1000, "stable %s (%d nonzero)", pres[p], checked);
        cb_bpe_free(b);
    }
    /* the last pre-token is not stable; everything before it is */
    vocab_bytes(-1);
    add_merge_s(" ", "w"); add_merge_s("o", "r"); add_merge_s("i", "\xc3");
    cb_bpe *b = build("gpt-2");
    if (!b) return;
    uint8_t scratch[1024];
    int32_t ids[16];
    int st = -1;
    CHECK(cb_bpe_tokenize_ex(b, (const uint8_t *)"hi wor", 6, ids, 16, scratch, sizeof scratch, &st) == 4);
    CHECK(st == 2);  /* h, i */
    CHECK(cb_bpe_tokenize_ex(b, (const uint8_t *)"hi \xc3", 4, ids, 16, scratch, sizeof scratch, &st) == 4);
    CHECK(st == 2);  /* " \xc3" may become " é": not stable */
    CHECK(cb_bpe_tokenize_ex(b, (const uint8_t *)"hi!\xc3", 4, ids, 16, scratch, sizeof scratch, &st) == 4);
    CHECK(st == 2);  /* "!" + "é..." */
    CHECK(cb_bpe_tokenize_ex(b, (const uint8_t *)"hi\xc3", 3, ids, 16, scratch, sizeof scratch, &st) == 3);
    CHECK(st == 0);  /* "hi\xc3\xa9" is one word: h, i\xc3, \xa9 */
    cb_bpe_free(b);
    /* llama3: "\n" then trailing "  " are both unstable ("x\n  \n" is x, "\n  \n") */
    vocab_bytes(-1);
    add_merge_s("\n", " ");
    b = build("llama-bpe");
    if (!b) return;
    CHECK(cb_bpe_tokenize_ex(b, (const uint8_t *)"x\n  ", 4, ids, 16, scratch, sizeof scratch, &st) == 4);
    CHECK(st == 1);
    CHECK(cb_bpe_tokenize_ex(b, (const uint8_t *)"x\n  \n", 5, ids, 16, scratch, sizeof scratch, &st) == 4);
    CHECK(ids[1] != '\n');  /* "\n " merged: the split really changed */
    cb_bpe_free(b);
}

/* Long pre-tokens (one 5000-byte word, 5000 spaces) stay linear enough and exact. */
static void test_long(void) {
    vocab_bytes(-1);
    add_merge_s("a", "a"); add_merge_s("aa", "aa"); add_merge_s(" ", " ");
    cb_bpe *b = build("gpt-2");
    if (!b) return;
    static uint8_t s[5000];
    static int32_t ids[5000];
    memset(s, 'a', sizeof s);
    CHECK(cb_bpe_tokenize_alloc(b, s, sizeof s, ids, 5000) == 1250);
    memset(s, ' ', sizeof s);
    CHECK(cb_bpe_tokenize_alloc(b, s, sizeof s, ids, 5000) == 2500);
    cb_bpe_free(b);
}

int main(void) {
    test_gpt2_split();
    test_digit_split();
    test_llama3_split();
    test_merge_order();
    test_build_errors();
    test_missing_byte();
    test_args();
    test_random_merges();
    test_fuzz();
    test_stable();
    test_long();
    return cb_test_report("test_bpe");
}
