/*
 * fuzz_grammar.c — fuzz target for the GBNF compiler and matcher.
 *
 * As a libFuzzer target (no -DCB_FUZZ_MAIN):
 *   clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined \
 *         -Iinclude -Isrc tests/fuzz_grammar.c src/grammar*.c -lm -o fuzz_grammar
 *   ./fuzz_grammar -max_total_time=60
 *
 * With -DCB_FUZZ_MAIN (what `make fuzz` / `make asan` build) it is a
 * self-contained deterministic mutation loop over built-in seed grammars:
 *   fuzz_grammar            run for about 5 seconds
 *   fuzz_grammar N          run exactly N iterations
 * and prints "fuzz_grammar: N passed, M failed".
 *
 * One input = grammar text.  It is compiled against a small fixed
 * vocabulary; if it compiles, a few seeded random token walks run through
 * the matcher checking its contracts: fill_mask's count equals the bits it
 * set, every allowed token is accepted, a refused token leaves the mask
 * unchanged, EOG is allowed iff accepting, rollback restores the mask,
 * forced bytes are accepted one by one; budgeted masks (random budgets
 * around the shortest completion) are subsets of the unbudgeted mask, equal
 * it for a huge budget, are never empty (the vocabulary has every single
 * byte), and a sampled token in / out of the budgeted mask leaves a
 * completion within / beyond the budget (or, for a budget below the current
 * shortest completion, shortens it / does not).  A "failure" is a broken contract,
 * an unexpected status or an error without a "line L, column C" message;
 * memory errors are the sanitizers' to catch.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"
#include "grammar.h"

#define FZ_NTOK 300
static uint8_t  fz_bytes[4096];
static uint32_t fz_off[FZ_NTOK + 1];
static uint8_t  fz_type[FZ_NTOK], fz_eog[FZ_NTOK];
static int      fz_n;

static void fz_add(const char *s, size_t n, int type, int eog) {
    memcpy(fz_bytes + fz_off[fz_n], s, n);
    fz_off[fz_n + 1] = fz_off[fz_n] + (uint32_t)n;
    fz_type[fz_n] = (uint8_t)type;
    fz_eog[fz_n] = (uint8_t)eog;
    fz_n++;
}

static void fz_vocab(void) {
    if (fz_n) return;
    for (int b = 0; b < 256; b++) { char c = (char)b; fz_add(&c, 1, 6, 0); }
    const char *multi[] = {"ab", "{\"", "\"}", "\": ", "()", "true", "  ", "\xc3\xa9", "\xe6\x97", "\xe6\x97\xa5",
                           "\xa5", "12", "a\"", "[\"", "\\n", "null", "aaa"};
    for (size_t i = 0; i < sizeof multi / sizeof *multi; i++) fz_add(multi[i], strlen(multi[i]), 1, 0);
    fz_add("<s>", 3, 3, 0);
    fz_add("</s>", 4, 3, 1);
}

static uint64_t fz_rng;
static uint32_t fz_rand(void) {
    fz_rng ^= fz_rng << 13; fz_rng ^= fz_rng >> 7; fz_rng ^= fz_rng << 17;
    return (uint32_t)(fz_rng >> 11);
}

static int popcount_mask(const uint32_t *m, int words) {
    int c = 0;
    for (int i = 0; i < words; i++) c += __builtin_popcount(m[i]);
    return c;
}

/* Outcome counts: ok / format error / other error, walks and steps. */
static long fz_stats[5];

static const char *run_one(const uint8_t *data, size_t size) {
    fz_vocab();
    char *text = malloc(size ? size : 1);  /* exact-size copy: over-reads are caught */
    if (!text) return NULL;
    if (size) memcpy(text, data, size);
    else text[0] = 0;  /* never read (len 0); keeps -Wmaybe-uninitialized quiet */
    cb_vocab_view v = {fz_n, fz_bytes, fz_off, fz_type, fz_eog};
    cb_grammar *g = NULL;
    char err[200] = "";
    int rc = cb_grammar_compile_vocab(&v, text, size, &g, err, sizeof err);
    free(text);
    const char *why = NULL;
    if (rc != CB_OK) {
        fz_stats[rc == CB_ERR_FORMAT ? 1 : 2]++;
        if (g) return "grammar returned with an error";
        if (rc == CB_ERR_FORMAT && strncmp(err, "line ", 5) != 0) return "format error without a line";
        if (rc != CB_ERR_FORMAT && rc != CB_ERR_NOMEM) return "unexpected status";
        return NULL;
    }
    fz_stats[0]++;
    enum { W = (FZ_NTOK + 31) / 32 };
    /* zeroed: the matcher writes only its vocabulary's words (fz_n < FZ_NTOK),
     * and the checks below read all W */
    uint32_t mask[W] = {0}, again[W] = {0}, bm[W] = {0};
    uint64_t seed = 1469598103934665603ull;
    for (size_t i = 0; i < size; i++) seed = (seed ^ data[i]) * 1099511628211ull;
    fz_rng = seed | 1;
    for (int walk = 0; walk < 3 && !why; walk++) {
        cb_matcher *m = NULL;
        rc = cb_matcher_new(g, &m);
        if (rc != CB_OK) {
            if (rc != CB_ERR_UNSUPPORTED && rc != CB_ERR_NOMEM) why = "matcher_new: unexpected status";
            break;
        }
        fz_stats[3]++;
        for (int step = 0; step < 24 && !why; step++) {
            int c = cb_matcher_fill_mask(m, mask);
            if (c < 0) { if (c != CB_ERR_UNSUPPORTED && c != CB_ERR_NOMEM) why = "fill_mask: unexpected status"; break; }
            fz_stats[4]++;
            if (c != popcount_mask(mask, W)) { why = "count differs from the mask"; break; }
            if (((mask[(fz_n - 1) >> 5] >> ((fz_n - 1) & 31)) & 1) != (uint32_t)cb_matcher_is_accepting(m)) { why = "EOG bit differs from accepting"; break; }
            if ((mask[(fz_n - 2) >> 5] >> ((fz_n - 2) & 31)) & 1) { why = "control token allowed"; break; }
            if (c == 0) break;
            /* budgets */
            int mc = cb_matcher_min_completion(m);
            if (mc < 0 || (mc == 0) != cb_matcher_is_accepting(m)) { why = "min_completion inconsistent with accepting"; break; }
            int budget = mc + (int)(fz_rand() % 5) - 2;
            if (budget < 0) budget = 0;
            int cb = cb_matcher_fill_mask_budget(m, bm, budget);
            if (cb < 0) { if (cb != CB_ERR_UNSUPPORTED && cb != CB_ERR_NOMEM) why = "fill_mask_budget: unexpected status"; break; }
            if (cb != popcount_mask(bm, W)) { why = "budgeted count differs from the mask"; break; }
            for (int i = 0; i < W; i++) if (bm[i] & ~mask[i]) { why = "budgeted mask not a subset"; break; }
            if (why) break;
            if (cb == 0 && mc < (1 << 30) - 1) { why = "budgeted mask empty"; break; }
            {
                int t = (int)(fz_rand() % (uint32_t)fz_n);
                if (((mask[t >> 5] >> (t & 31)) & 1) && !fz_eog[t]) {
                    int in = (bm[t >> 5] >> (t & 31)) & 1;
                    rc = cb_matcher_accept(m, t);
                    if (rc == CB_OK) {
                        int after = cb_matcher_min_completion(m);
                        if (cb_matcher_rollback(m, 1) != CB_OK) { why = "rollback failed"; break; }
                        int eff = mc >= (1 << 30) - 1 ? (1 << 30) : budget >= mc ? budget : mc - 1;  /* below: tokens that shorten it */
                        if (in != (after <= eff)) { why = "budgeted bit disagrees with the completion after the token"; break; }
                    } else if (rc != CB_ERR_UNSUPPORTED && rc != CB_ERR_NOMEM) { why = "allowed token refused"; break; }
                }
            }
            int cu = cb_matcher_fill_mask_budget(m, again, 1 << 30);  /* >= 2^30 - 1: no budget */
            if (cu >= 0 && (cu != c || memcmp(again, mask, sizeof mask))) { why = "huge budget differs from no budget"; break; }
            /* a refused token changes nothing */
            int bad = (int)(fz_rand() % (uint32_t)fz_n);
            if (!((mask[bad >> 5] >> (bad & 31)) & 1)) {
                if (cb_matcher_accept(m, bad) != CB_ERR_ARG) { why = "disallowed token accepted"; break; }
                if (cb_matcher_fill_mask(m, again) != c || memcmp(again, mask, sizeof mask)) { why = "refusal changed the state"; break; }
            }
            /* forced bytes, if any, are each accepted (then undone) */
            uint8_t fb[8];
            int nf = cb_matcher_forced_bytes(m, fb, sizeof fb);
            if (nf < 0 || nf > 8) { why = "forced_bytes out of range"; break; }
            if (nf > 0) {
                if (cb_matcher_accept_bytes(m, fb, (size_t)nf) != CB_OK) { why = "forced bytes refused"; break; }
                if (cb_matcher_rollback(m, 1) != CB_OK) { why = "rollback after forced bytes failed"; break; }
            }
            int k = (int)(fz_rand() % (uint32_t)c), pick = -1;
            for (int t = 0; t < fz_n; t++) if (((mask[t >> 5] >> (t & 31)) & 1) && k-- == 0) { pick = t; break; }
            rc = cb_matcher_accept(m, pick);
            if (rc == CB_ERR_UNSUPPORTED || rc == CB_ERR_NOMEM) break;
            if (rc != CB_OK) { why = "allowed token refused"; break; }
            if (fz_rand() % 4 == 0) {
                if (cb_matcher_rollback(m, 1) != CB_OK) { why = "rollback failed"; break; }
                int c2 = cb_matcher_fill_mask(m, again);
                if (c2 >= 0 && (c2 != c || memcmp(again, mask, sizeof mask))) { why = "rollback did not restore the mask"; break; }
                if (cb_matcher_accept(m, pick) != CB_OK) { why = "re-accept after rollback failed"; break; }
            }
            if (fz_eog[pick]) break;
        }
        cb_matcher_free(m);
    }
    cb_grammar_free(g);
    return why;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *why = run_one(data, size);
    if (why) {
        fprintf(stderr, "fuzz_grammar: %s\n", why);
        __builtin_trap();
    }
    return 0;
}

#ifdef CB_FUZZ_MAIN
#include <time.h>

static const char *seeds[] = {
    "root ::= \"abc\" | [a-z]+ \"!\"",
    "root ::= object\nobject ::= \"{\" ws (pair (\",\" ws pair)*)? \"}\"\npair ::= str \":\" ws value\n"
    "value ::= str | num | object | \"true\" | \"null\"\nstr ::= \"\\\"\" [^\"\\\\]* \"\\\"\" ws\n"
    "num ::= \"-\"? [0-9]+ ws\nws ::= [ \\t\\n]{0,3}",
    "root ::= p\np ::= \"(\" p \")\" p | \"\"",
    "root ::= [\xe4\xb8\x80-\xe9\xbe\xa5]{1,3} . [^a-c\\x00-\\x1f]*",
    "root ::= (\"a\"? \"b\"?){2,4} \"x\"{0,5} # comment\n",
    "root ::= \"\\x41\\u00e9\\U0001F600\\t\\n\\\\\\\"\" ( [\\[\\]\\-] | \"\xc3\xa9\" )*",
    "root ::= a b\na ::= \"a\" | \"\"\nb ::=\n  \"b\"\n  | c\nc ::= [0-9]{2,}",
    "root ::= \"a\"+ | \"ab\"* \"c\"?",
};

/* Mutations over grammar text: byte flips, inserts of grammar-ish tokens,
 * deletions, duplication of a span, splicing two seeds. */
static const char *tokens[] = {"(", ")", "[", "]", "\"", "|", "*", "+", "?", "{2,3}", "{0,}", "{", "}", "::=", "\n",
                               "root", "a", "\\", "\\x", "\\u00", "^", "-", ".", "#", " ", "x ::= ", "{1000}", "é", "\xe6"};

static size_t mutate(uint8_t *buf, size_t n, size_t cap) {
    int nm = 1 + (int)(fz_rand() % 4);
    for (int i = 0; i < nm; i++) {
        uint32_t op = fz_rand() % 5;
        size_t at = n ? fz_rand() % (n + 1) : 0;
        if (op == 0 && n) buf[fz_rand() % n] ^= (uint8_t)(1u << (fz_rand() % 8));
        else if (op == 1) {
            const char *t = tokens[fz_rand() % (sizeof tokens / sizeof *tokens)];
            size_t tl = strlen(t);
            if (n + tl <= cap) { memmove(buf + at + tl, buf + at, n - at); memcpy(buf + at, t, tl); n += tl; }
        } else if (op == 2 && n) {
            size_t len = 1 + fz_rand() % 8;
            if (at + len > n) len = n - at;
            memmove(buf + at, buf + at + len, n - at - len);
            n -= len;
        } else if (op == 3 && n) {
            size_t s = fz_rand() % n, len = 1 + fz_rand() % 16;
            if (s + len > n) len = n - s;
            if (n + len <= cap) { memmove(buf + at + len, buf + at, n - at); memmove(buf + at, buf + (s < at ? s : s + len), len); n += len; }
        } else if (op == 4) {
            const char *t = seeds[fz_rand() % (sizeof seeds / sizeof *seeds)];
            size_t tl = strlen(t), from = fz_rand() % (tl + 1), len = tl - from;
            if (n + len <= cap) { memmove(buf + at + len, buf + at, n - at); memcpy(buf + at, t + from, len); n += len; }
        }
    }
    return n;
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : -1;
    double budget = 5.0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long passed = 0, failed = 0;
    enum { CAP = 4096 };
    uint8_t *buf = malloc(CAP);
    uint64_t mrng = 0x9E3779B97F4A7C15ull;
    if (!buf) return 2;
    for (long it = 0; iters < 0 || it < iters; it++) {
        if (iters < 0) {
            clock_gettime(CLOCK_MONOTONIC, &t1);
            if ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9 > budget) break;
        }
        const char *s = seeds[it % (long)(sizeof seeds / sizeof *seeds)];
        size_t n = strlen(s);
        memcpy(buf, s, n);
        if (it >= (long)(sizeof seeds / sizeof *seeds)) {
            /* the mutation stream has its own generator so that run_one's
             * (seeded by the input) does not make it repeat */
            uint64_t save = fz_rng;
            fz_rng = mrng;
            n = mutate(buf, n, CAP);
            mrng = fz_rng;
            fz_rng = save;
        }
        const char *why = run_one(buf, n);
        if (why) {
            failed++;
            fprintf(stderr, "fuzz_grammar: iteration %ld: %s\n  input: %.*s\n", it, why, (int)n, (const char *)buf);
        } else passed++;
    }
    free(buf);
    fprintf(stderr, "fuzz_grammar: compiled %ld, format errors %ld, other errors %ld, walks %ld, steps %ld\n",
            fz_stats[0], fz_stats[1], fz_stats[2], fz_stats[3], fz_stats[4]);
    printf("fuzz_grammar: %ld passed, %ld failed\n", passed, failed);
    return failed ? 1 : 0;
}
#endif
