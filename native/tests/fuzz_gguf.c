/*
 * fuzz_gguf.c — fuzz target for the GGUF reader.
 *
 * As a libFuzzer target (no -DCB_FUZZ_MAIN):
 *   clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined \
 *         -Iinclude -Isrc tests/fuzz_gguf.c src/(every .c) -lm -lpthread -o fuzz_gguf
 *   ./fuzz_gguf -max_total_time=60 tests/gguf_corpus
 *
 * With -DCB_FUZZ_MAIN (what `make fuzz` / `make asan` build) it is a
 * self-contained deterministic mutation loop over built-in seed images (plus
 * any *.gguf under tests/gguf_corpus/ when run from native/):
 *   fuzz_gguf            run for about 5 seconds
 *   fuzz_gguf N          run exactly N iterations
 * and prints "fuzz_gguf: N passed, M failed".  A "failure" is a parse that
 * returned an unexpected status, an error without a message, or CB_OK with a
 * pointer outside the buffer; memory errors are the sanitizers' to catch.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"
#include "gguf.h"

#ifdef CB_GGUF_STANDALONE_TEST
/* Stand-in for kernels.c's type table (as in test_gguf.c) for building the
 * reader alone. */
int cb_type_block(int t) { return t == 0 || t == 1 || t == 30 ? 1 : t == 2 || t == 3 || t == 8 ? 32 : 0; }
size_t cb_type_block_bytes(int t)
{
    switch (t) { case 0: return 4; case 1: case 30: return 2; case 2: return 18; case 3: return 20; case 8: return 34; default: return 0; }
}
int cb_type_supported(int t) { return cb_type_block(t) != 0; }
#endif

/* 0 if the result of one parse is acceptable, else a short reason. */
static const char *check_result(int rc, const cb_gguf *g, const uint8_t *p, size_t n, const char *err)
{
    if (rc != CB_OK) {
        if (rc != CB_ERR_FORMAT && rc != CB_ERR_UNSUPPORTED && rc != CB_ERR_NOMEM) return "unexpected status";
        if (!err[0]) return "error without a message";
        if (g->kv || g->tensors || g->n_kv || g->n_tensors) return "struct not cleared after an error";
        return NULL;
    }
    const uint8_t *end = p + n;
#define INSIDE(ptr, len) ((const uint8_t *)(ptr) >= p && (uint64_t)(len) <= (uint64_t)(end - (const uint8_t *)(ptr)))
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const cb_gguf_kv *kv = &g->kv[i];
        if (!INSIDE(kv->key.ptr, kv->key.len)) return "key outside the buffer";
        if (kv->type == GGUF_T_STR && !INSIDE(kv->str.ptr, kv->str.len)) return "string outside the buffer";
        if (kv->type == GGUF_T_ARR && kv->arr_type == GGUF_T_STR)
            for (uint64_t j = 0; j < kv->arr_len; j++)
                if (!INSIDE(kv->arr_str[j].ptr, kv->arr_str[j].len)) return "array string outside the buffer";
        if (kv->type == GGUF_T_ARR && kv->arr_type != GGUF_T_STR && kv->arr_len) {
            double f;
            if (cb_gguf_arr_float(kv, kv->arr_len - 1, &f) != CB_OK) return "numeric array unreadable";
        }
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const cb_gguf_tensor *t = &g->tensors[i];
        if (!INSIDE(t->name.ptr, t->name.len)) return "tensor name outside the buffer";
        if (!INSIDE(t->data, t->nbytes)) return "tensor data outside the buffer";
        char name[300];  /* names are <= 256 bytes without NULs: lookup must find this one */
        if (t->name.len >= sizeof name) return "tensor name too long";
        memcpy(name, t->name.ptr, (size_t)t->name.len);
        name[t->name.len] = 0;
        if (cb_gguf_find_tensor(g, name) != t) return "lookup returned the wrong tensor";
    }
#undef INSIDE
    return NULL;
}

/* Outcome counts of the last runs, by status (ok, format, unsupported, other),
 * so the mutation loop can show that it reaches both sides of the checks. */
static long n_by_status[4];

/* One input: parse a private exact-size copy (so any over-read is caught). */
static const char *run_one(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return NULL;
    if (size) memcpy(copy, data, size);
    cb_gguf g;
    char err[256] = "";
    int rc = cb_gguf_parse(&g, copy, size, err, sizeof err);
    const char *why = check_result(rc, &g, copy, size, err);
    n_by_status[rc == CB_OK ? 0 : rc == CB_ERR_FORMAT ? 1 : rc == CB_ERR_UNSUPPORTED ? 2 : 3]++;
    cb_gguf_close(&g);
    cb_gguf_close(&g);
    free(copy);
    return why;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *why = run_one(data, size);
    if (why) {  /* let libFuzzer record the input */
        fprintf(stderr, "fuzz_gguf: %s\n", why);
        __builtin_trap();
    }
    return 0;
}

#ifdef CB_FUZZ_MAIN
#include <dirent.h>
#include <time.h>

/* ------------------------------------------------------------ seeds */

typedef struct { uint8_t *p; size_t n, cap; } wbuf;

static void put(wbuf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) { fprintf(stderr, "fuzz_gguf: out of memory\n"); exit(2); }
        b->p = p; b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_le(wbuf *b, uint64_t v, int bytes)
{
    uint8_t x[8];
    for (int i = 0; i < bytes; i++) x[i] = (uint8_t)(v >> (8 * i));
    put(b, x, (size_t)bytes);
}
static void put_str(wbuf *b, const char *s) { put_le(b, strlen(s), 8); put(b, s, strlen(s)); }
static void kv_head(wbuf *b, const char *k, uint32_t t) { put_str(b, k); put_le(b, t, 4); }
static void tinfo(wbuf *b, const char *name, uint32_t nd, const uint64_t *ne, uint32_t type, uint64_t off)
{
    put_str(b, name); put_le(b, nd, 4);
    for (uint32_t d = 0; d < nd; d++) put_le(b, ne[d], 8);
    put_le(b, type, 4); put_le(b, off, 8);
}

/* Seed 0: every value kind and every supported tensor type.
 * Seed 1: a small llama-like file with alignment 64 and a tokenizer. */
static void build_seed(wbuf *b, int which)
{
    b->n = 0;
    if (which == 0) {
        static const struct { const char *name; uint32_t nd; uint64_t ne[2]; uint32_t type; uint64_t bytes; } T[] = {
            {"f32", 2, {4, 2}, 0, 32}, {"f16", 1, {8, 1}, 1, 16}, {"q4_0", 1, {32, 1}, 2, 18},
            {"q4_1", 1, {32, 1}, 3, 20}, {"q8_0", 2, {32, 2}, 8, 68}, {"bf16", 1, {4, 1}, 30, 8},
        };
        const int nt = 6;
        put(b, "GGUF", 4); put_le(b, 3, 4); put_le(b, nt, 8); put_le(b, 15, 8);
        kv_head(b, "general.architecture", 8); put_str(b, "llama");
        for (uint32_t t = 0; t <= 12; t++) {
            if (t == 8 || t == 9) continue;
            char key[16];
            snprintf(key, sizeof key, "k.t%u", t);
            static const int sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
            kv_head(b, key, t); put_le(b, t == 7 ? 1 : 0x41 + t, sz[t]);
        }
        kv_head(b, "k.arr_i32", 9); put_le(b, 5, 4); put_le(b, 3, 8);
        put_le(b, 1, 4); put_le(b, 2, 4); put_le(b, 3, 4);
        kv_head(b, "k.arr_str", 9); put_le(b, 8, 4); put_le(b, 3, 8);
        put_str(b, "a"); put_str(b, ""); put_str(b, "ccc");
        kv_head(b, "k.arr_bool", 9); put_le(b, 7, 4); put_le(b, 2, 8); put_le(b, 1, 1); put_le(b, 0, 1);
        uint64_t off = 0, offs[6];
        for (int i = 0; i < nt; i++) { offs[i] = off; off = (off + T[i].bytes + 31) / 32 * 32; }
        for (int i = nt - 1; i >= 0; i--) tinfo(b, T[i].name, T[i].nd, T[i].ne, T[i].type, offs[i]);
        while (b->n % 32) put_le(b, 0, 1);
        size_t d0 = b->n;
        for (int i = 0; i < nt; i++) {
            while (b->n < d0 + offs[i]) put_le(b, 0, 1);
            for (uint64_t k = 0; k < T[i].bytes; k++) put_le(b, (uint8_t)(i * 17 + k), 1);
        }
    } else {
        put(b, "GGUF", 4); put_le(b, 2, 4); put_le(b, 3, 8); put_le(b, 6, 8);
        kv_head(b, "general.architecture", 8); put_str(b, "llama");
        kv_head(b, "general.alignment", 4); put_le(b, 64, 4);
        kv_head(b, "llama.embedding_length", 4); put_le(b, 32, 4);
        kv_head(b, "llama.block_count", 4); put_le(b, 1, 4);
        kv_head(b, "llama.attention.layer_norm_rms_epsilon", 6); put_le(b, 0x3727c5ac, 4);
        kv_head(b, "tokenizer.ggml.tokens", 9); put_le(b, 8, 4); put_le(b, 4, 8);
        put_str(b, "<s>"); put_str(b, "</s>"); put_str(b, "a"); put_str(b, "b");
        uint64_t ne_e[2] = {32, 4}, ne_n[1] = {32}, ne_q[2] = {32, 32};
        tinfo(b, "token_embd.weight", 2, ne_e, 8, 0);            /* 4 * 34 = 136 */
        tinfo(b, "output_norm.weight", 1, ne_n, 0, 192);         /* 128 */
        tinfo(b, "blk.0.attn_q.weight", 2, ne_q, 2, 320);        /* 32 * 18 = 576 */
        while (b->n % 64) put_le(b, 0, 1);
        size_t d0 = b->n;
        while (b->n < d0 + 320 + 576) put_le(b, (uint8_t)(b->n * 13), 1);
    }
}

/* ------------------------------------------------------------ mutator */

static uint64_t rng_next(uint64_t *s)
{
    /* splitmix64: deterministic, good enough for choosing mutations */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Apply 1..8 mutations to m[0..*n) (capacity cap). */
static void mutate(uint8_t *m, size_t *n, size_t cap, uint64_t *rs)
{
    static const uint8_t interesting8[] = {0x00, 0xff, 0x7f, 0x80, 0x01, 0x02, 0x08, 0x09, 0x0c, 0x0d, 0x1e, 0x20, 0x40};
    static const uint64_t interesting64[] = {
        0, 1, 2, 0x7f, 0xff, 0xffff, 0x10000, 0xffffffffull, 0x100000000ull,
        0x7fffffffffffffffull, 0x8000000000000000ull, 0xffffffffffffffffull,
        0xfffffffffffffff0ull, (uint64_t)1 << 60, (uint64_t)1 << 48, 256, 32, 64, 4096
    };
    int k = 1 + (int)(rng_next(rs) % 8);
    for (int j = 0; j < k && *n > 0; j++) {
        uint64_t r = rng_next(rs);
        size_t at = (size_t)(rng_next(rs) % *n);
        switch (r % 8) {
        case 0: m[at] ^= (uint8_t)(1u << ((r >> 8) % 8)); break;                     /* bit flip */
        case 1: m[at] = interesting8[(r >> 8) % sizeof interesting8]; break;         /* byte set */
        case 2: m[at] = (uint8_t)(r >> 8); break;                                    /* random byte */
        case 3: case 4: {                                                             /* length/count field */
            uint64_t v = interesting64[(r >> 8) % (sizeof interesting64 / sizeof interesting64[0])];
            if ((r >> 40) % 4 == 0) v = v + 1 - ((r >> 44) % 3);                     /* off by one either way */
            int w = (r >> 32) % 2 ? 8 : 4;
            at &= ~(size_t)3;                                                         /* fields are mostly 4-aligned */
            for (int i = 0; i < w && at + (size_t)i < *n; i++) m[at + (size_t)i] = (uint8_t)(v >> (8 * i));
            break;
        }
        case 5: *n = at; break;                                                       /* truncate */
        case 6: {                                                                     /* duplicate a chunk */
            size_t len = 1 + (size_t)((r >> 8) % 32);
            size_t src = (size_t)(rng_next(rs) % *n);
            if (src + len > *n) len = *n - src;
            if (*n + len <= cap) {
                memmove(m + at + len, m + at, *n - at);
                memmove(m + at, m + (src >= at ? src + len : src), len);
                *n += len;
            }
            break;
        }
        default: {                                                                    /* delete a chunk */
            size_t len = 1 + (size_t)((r >> 8) % 16);
            if (at + len > *n) len = *n - at;
            memmove(m + at, m + at + len, *n - at - len);
            *n -= len;
            break;
        }
        }
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define MAX_SEEDS 32
int main(int argc, char **argv)
{
    long iters = argc > 1 ? strtol(argv[1], NULL, 10) : -1;  /* -1: time-bounded */
    double budget_s = 5.0;

    wbuf seeds[MAX_SEEDS];
    memset(seeds, 0, sizeof seeds);
    int n_seeds = 0;
    for (; n_seeds < 2; n_seeds++) build_seed(&seeds[n_seeds], n_seeds);
    /* Extra seeds from the corpus directory, if run from native/. */
    DIR *dir = opendir("tests/gguf_corpus");
    if (dir) {
        struct dirent *de;
        while ((de = readdir(dir)) && n_seeds < MAX_SEEDS) {
            size_t L = strlen(de->d_name);
            if (L < 5 || strcmp(de->d_name + L - 5, ".gguf") != 0) continue;
            char path[512];
            snprintf(path, sizeof path, "tests/gguf_corpus/%s", de->d_name);
            FILE *f = fopen(path, "rb");
            if (!f) continue;
            uint8_t buf[4096];
            size_t got;
            wbuf *s = &seeds[n_seeds];
            while ((got = fread(buf, 1, sizeof buf, f)) > 0 && s->n < (1u << 20)) put(s, buf, got);
            fclose(f);
            if (s->n) n_seeds++;
        }
        closedir(dir);
    }

    long passed = 0, failed = 0;
    /* Each seed must itself be accepted (otherwise the mutator explores
     * nothing useful) and must pass the checks. */
    for (int s = 0; s < n_seeds; s++) {
        uint8_t *copy = malloc(seeds[s].n);
        memcpy(copy, seeds[s].p, seeds[s].n);
        cb_gguf g;
        char err[256] = "";
        int rc = cb_gguf_parse(&g, copy, seeds[s].n, err, sizeof err);
        const char *why = check_result(rc, &g, copy, seeds[s].n, err);
        cb_gguf_close(&g);
        free(copy);
        if (rc == CB_OK && !why) passed++;
        else { failed++; fprintf(stderr, "fuzz_gguf: seed %d rejected: %s %s\n", s, why ? why : "", err); }
    }

    size_t cap = 0;
    for (int s = 0; s < n_seeds; s++) if (seeds[s].n > cap) cap = seeds[s].n;
    cap = cap * 2 + 64;
    uint8_t *m = malloc(cap);
    uint64_t rs = 0xC011B41ull;
    double t0 = now_s();
    for (long it = 0; iters < 0 ? 1 : it < iters; it++) {
        if (iters < 0 && (it & 255) == 0 && now_s() - t0 > budget_s) break;
        const wbuf *seed = &seeds[rng_next(&rs) % (uint64_t)n_seeds];
        size_t n = seed->n;
        memcpy(m, seed->p, n);
        mutate(m, &n, cap, &rs);
        const char *why = run_one(m, n);
        if (why) {
            failed++;
            if (failed <= 10) fprintf(stderr, "fuzz_gguf: iteration %ld: %s\n", it, why);
        } else {
            passed++;
        }
    }
    free(m);
    for (int s = 0; s < n_seeds; s++) free(seeds[s].p);
    printf("fuzz_gguf: %d seeds; outcomes: %ld accepted, %ld format errors, %ld unsupported, %ld other\n",
           n_seeds, n_by_status[0], n_by_status[1], n_by_status[2], n_by_status[3]);
    printf("fuzz_gguf: %ld passed, %ld failed\n", passed, failed);
    return failed ? 1 : 0;
}
#endif
