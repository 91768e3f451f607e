/*
 * test_gguf.c — GGUF reader: valid images parse back exactly; every kind of
 * malformed image fails with the right status and a message naming the
 * problem; truncation at every length and thousands of random mutations never
 * crash (run under `make asan` to make "never crash" mean "no memory error").
 *
 * Images are built in memory by the tiny writer below, so each test states
 * exactly which bytes are wrong.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "colibri.h"
#include "gguf.h"
#include "kernels.h"
#include "testutil.h"

#ifdef CB_GGUF_STANDALONE_TEST
/* Stand-in for kernels.c while it is being written: block geometry as in
 * ggml, and the set of types the engine computes with. */
int cb_type_block(int t)
{
    switch (t) {
    case 0: case 1: case 30: return 1;
    case 2: case 3: case 8: return 32;
    default: return 0;
    }
}
size_t cb_type_block_bytes(int t)
{
    switch (t) {
    case 0: return 4; case 1: return 2; case 30: return 2;
    case 2: return 18; case 3: return 20; case 8: return 34;
    default: return 0;
    }
}
int cb_type_supported(int t) { return cb_type_block(t) != 0; }
#endif

/* ------------------------------------------------------------ writer */

/* Growable byte buffer the writer appends to. */
typedef struct { uint8_t *p; size_t n, cap; } wbuf;

static void put(wbuf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) { fprintf(stderr, "test_gguf: out of memory\n"); exit(2); }
        b->p = p; b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u8(wbuf *b, uint8_t v) { put(b, &v, 1); }
static void put_u16(wbuf *b, uint16_t v) { uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)}; put(b, x, 2); }
static void put_u32(wbuf *b, uint32_t v)
{
    uint8_t x[4];
    for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
    put(b, x, 4);
}
static void put_u64(wbuf *b, uint64_t v)
{
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    put(b, x, 8);
}
static void put_f32(wbuf *b, float f) { uint32_t u; memcpy(&u, &f, 4); put_u32(b, u); }
static void put_f64(wbuf *b, double f) { uint64_t u; memcpy(&u, &f, 8); put_u64(b, u); }
static void put_str(wbuf *b, const char *s) { put_u64(b, strlen(s)); put(b, s, strlen(s)); }
static void put_hdr(wbuf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    put(b, "GGUF", 4); put_u32(b, version); put_u64(b, n_tensors); put_u64(b, n_kv);
}
static void kv_head(wbuf *b, const char *key, uint32_t type) { put_str(b, key); put_u32(b, type); }
static void kv_u32(wbuf *b, const char *key, uint32_t v) { kv_head(b, key, GGUF_T_U32); put_u32(b, v); }
static void kv_strv(wbuf *b, const char *key, const char *v) { kv_head(b, key, GGUF_T_STR); put_str(b, v); }
static void tinfo(wbuf *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off)
{
    put_str(b, name); put_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) put_u64(b, ne[d]);
    put_u32(b, type); put_u64(b, off);
}
static void pad_to(wbuf *b, size_t align) { while (b->n % align) put_u8(b, 0); }
/* n bytes of a pattern that depends on seed, so tensors are told apart. */
static void put_pattern(wbuf *b, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) put_u8(b, (uint8_t)(seed * 31u + i * 7u + 1u));
}
static void wfree(wbuf *b) { free(b->p); memset(b, 0, sizeof *b); }

/* Parse a private exact-size copy, so that ASan flags any read past the end. */
static int parse_copy(const uint8_t *p, size_t n, cb_gguf *g, char *err, size_t el)
{
    uint8_t *copy = malloc(n ? n : 1);
    if (n) memcpy(copy, p, n);
    int rc = cb_gguf_parse(g, copy, n, err, el);
    /* The struct points into the copy: callers that keep g must not use this. */
    cb_gguf_close(g);
    free(copy);
    return rc;
}

/* Expect parse to fail with `want` and a message containing `needle`. */
#define EXPECT_FAIL(buf, want, needle) do { \
    cb_gguf g_; char e_[512] = {0}; \
    int rc_ = parse_copy((buf)->p, (buf)->n, &g_, e_, sizeof e_); \
    CHECK_MSG(rc_ == (want), "rc %d (%s), want %d; message: %s", rc_, st_name(rc_), (want), e_); \
    CHECK_MSG(strstr(e_, (needle)) != NULL, "message '%s' lacks '%s'", e_, (needle)); \
} while (0)

static const char *st_name(int rc)
{
    switch (rc) {
    case CB_OK: return "ok"; case CB_ERR_FORMAT: return "format";
    case CB_ERR_UNSUPPORTED: return "unsupported"; case CB_ERR_NOMEM: return "nomem";
    case CB_ERR_IO: return "io"; case CB_ERR_ARG: return "arg";
    default: return "other";
    }
}

/* ------------------------------------------------------------ the valid image */

/* Tensors of the reference image: every supported type, 1..4 dims, listed in
 * an order different from their data order. */
typedef struct { const char *name; uint32_t n_dims; uint64_t ne[4]; uint32_t type; uint64_t nbytes; } tspec;
static const tspec REF_T[] = {
    {"blk.0.attn_q.weight", 2, {8, 2, 1, 1}, CB_TYPE_F32, 64},
    {"f16", 1, {4, 1, 1, 1}, CB_TYPE_F16, 8},
    {"q4_0", 2, {64, 2, 1, 1}, CB_TYPE_Q4_0, 4 * 18},
    {"q4_1", 1, {32, 1, 1, 1}, CB_TYPE_Q4_1, 20},
    {"q8_0.4d", 4, {32, 1, 1, 2}, CB_TYPE_Q8_0, 2 * 34},
    {"bf16", 2, {3, 5, 1, 1}, CB_TYPE_BF16, 30},
};
#define REF_NT (sizeof REF_T / sizeof REF_T[0])
/* Data order: the tensor stored at slot k is REF_T[REF_ORDER[k]]. */
static const int REF_ORDER[REF_NT] = {3, 0, 5, 1, 4, 2};
#define REF_NKV 25

static const char *const REF_STRS[] = {"hello", "", "w\xc3\xb6rld", "<|im_end|>"};

/* Build the reference image with alignment `align` (32 = default: the key is
 * then omitted).  offsets[i] receives tensor i's data offset.  The file ends
 * exactly at the end of the last tensor, so every truncation is an error. */
static void build_ref(wbuf *b, uint32_t align, uint32_t version, uint64_t offsets[REF_NT])
{
    uint64_t off = 0;
    for (size_t k = 0; k < REF_NT; k++) {
        int i = REF_ORDER[k];
        offsets[i] = off;
        off += REF_T[i].nbytes;
        off = (off + align - 1) / align * align;
    }
    put_hdr(b, version, REF_NT, REF_NKV - (align == 32 ? 1 : 0));
    kv_strv(b, "general.architecture", "llama");
    kv_head(b, "v.u8", GGUF_T_U8); put_u8(b, 200);
    kv_head(b, "v.i8", GGUF_T_I8); put_u8(b, (uint8_t)-5);
    kv_head(b, "v.u16", GGUF_T_U16); put_u16(b, 60000);
    kv_head(b, "v.i16", GGUF_T_I16); put_u16(b, (uint16_t)-30000);
    kv_u32(b, "v.u32", 4000000000u);
    kv_head(b, "v.i32", GGUF_T_I32); put_u32(b, (uint32_t)-2000000000);
    kv_head(b, "v.f32", GGUF_T_F32); put_f32(b, 0.15625f);
    kv_head(b, "v.bool", GGUF_T_BOOL); put_u8(b, 1);
    kv_strv(b, "v.str", "a string");
    kv_strv(b, "v.empty_str", "");
    kv_head(b, "v.u64", GGUF_T_U64); put_u64(b, UINT64_MAX);
    kv_head(b, "v.i64", GGUF_T_I64); put_u64(b, (uint64_t)INT64_MIN);
    kv_head(b, "v.f64", GGUF_T_F64); put_f64(b, -1.0e300);
    kv_head(b, "a.strs", GGUF_T_ARR); put_u32(b, GGUF_T_STR); put_u64(b, 4);
    for (int j = 0; j < 4; j++) put_str(b, REF_STRS[j]);
    kv_head(b, "a.u8", GGUF_T_ARR); put_u32(b, GGUF_T_U8); put_u64(b, 3);
    put_u8(b, 0); put_u8(b, 128); put_u8(b, 255);
    kv_head(b, "a.i16", GGUF_T_ARR); put_u32(b, GGUF_T_I16); put_u64(b, 2);
    put_u16(b, (uint16_t)-7); put_u16(b, 7);
    kv_head(b, "a.i32", GGUF_T_ARR); put_u32(b, GGUF_T_I32); put_u64(b, 3);
    put_u32(b, (uint32_t)-1); put_u32(b, 3); put_u32(b, 2147483647u);
    kv_head(b, "a.u64", GGUF_T_ARR); put_u32(b, GGUF_T_U64); put_u64(b, 2);
    put_u64(b, 42); put_u64(b, UINT64_MAX);
    kv_head(b, "a.f32", GGUF_T_ARR); put_u32(b, GGUF_T_F32); put_u64(b, 3);
    put_f32(b, 1.5f); put_f32(b, -2.0f); put_f32(b, 3.25f);
    kv_head(b, "a.f64", GGUF_T_ARR); put_u32(b, GGUF_T_F64); put_u64(b, 1);
    put_f64(b, 0.1);
    kv_head(b, "a.bool", GGUF_T_ARR); put_u32(b, GGUF_T_BOOL); put_u64(b, 3);
    put_u8(b, 1); put_u8(b, 0); put_u8(b, 1);
    kv_head(b, "a.empty", GGUF_T_ARR); put_u32(b, GGUF_T_I64); put_u64(b, 0);
    kv_head(b, "a.empty_strs", GGUF_T_ARR); put_u32(b, GGUF_T_STR); put_u64(b, 0);
    if (align != 32) kv_u32(b, "general.alignment", align);
    for (size_t i = 0; i < REF_NT; i++)
        tinfo(b, REF_T[i].name, REF_T[i].n_dims, REF_T[i].ne, REF_T[i].type, offsets[i]);
    pad_to(b, align);
    size_t data0 = b->n;
    for (size_t k = 0; k < REF_NT; k++) {
        int i = REF_ORDER[k];
        while (b->n < data0 + offsets[i]) put_u8(b, 0xAA);  /* inter-tensor padding */
        put_pattern(b, REF_T[i].nbytes, (unsigned)i);
    }
}

static int str_is(cb_gguf_str s, const char *want)
{
    return s.len == strlen(want) && memcmp(s.ptr, want, s.len) == 0;
}

static void check_ref(const cb_gguf *g, const uint8_t *base, size_t size, uint32_t align,
                      uint32_t version, const uint64_t offsets[REF_NT])
{
    char err[256];
    CHECK(g->version == version);
    CHECK(g->base == base && g->size == size);
    CHECK(g->alignment == align);
    CHECK(g->data_offset % align == 0);
    CHECK(g->n_kv == (uint64_t)(REF_NKV - (align == 32 ? 1 : 0)));
    CHECK(g->n_tensors == REF_NT);

    int64_t v; double f; cb_gguf_str s;
    CHECK(cb_gguf_get_str(g, "general.architecture", &s, err, sizeof err) == CB_OK && str_is(s, "llama"));
    CHECK(cb_gguf_get_int(g, "v.u8", &v, err, sizeof err) == CB_OK && v == 200);
    CHECK(cb_gguf_get_int(g, "v.i8", &v, err, sizeof err) == CB_OK && v == -5);
    CHECK(cb_gguf_get_int(g, "v.u16", &v, err, sizeof err) == CB_OK && v == 60000);
    CHECK(cb_gguf_get_int(g, "v.i16", &v, err, sizeof err) == CB_OK && v == -30000);
    CHECK(cb_gguf_get_int(g, "v.u32", &v, err, sizeof err) == CB_OK && v == 4000000000LL);
    CHECK(cb_gguf_get_int(g, "v.i32", &v, err, sizeof err) == CB_OK && v == -2000000000LL);
    CHECK(cb_gguf_get_int(g, "v.bool", &v, err, sizeof err) == CB_OK && v == 1);
    CHECK(cb_gguf_get_int(g, "v.i64", &v, err, sizeof err) == CB_OK && v == INT64_MIN);
    /* u64 above INT64_MAX is not representable: a format error, not a wrap. */
    err[0] = 0;
    CHECK(cb_gguf_get_int(g, "v.u64", &v, err, sizeof err) == CB_ERR_FORMAT && strstr(err, "v.u64"));
    int64_t ki = cb_gguf_find_key(g, "v.u64");
    CHECK(ki >= 0 && g->kv[ki].type == GGUF_T_U64 && g->kv[ki].num.u == UINT64_MAX);
    CHECK(cb_gguf_get_float(g, "v.f32", &f, err, sizeof err) == CB_OK && f == 0.15625);
    CHECK(cb_gguf_get_float(g, "v.f64", &f, err, sizeof err) == CB_OK && f == -1.0e300);
    CHECK(cb_gguf_get_str(g, "v.str", &s, err, sizeof err) == CB_OK && str_is(s, "a string"));
    CHECK(cb_gguf_get_str(g, "v.empty_str", &s, err, sizeof err) == CB_OK && s.len == 0);
    /* wrong types and absent keys */
    err[0] = 0;
    CHECK(cb_gguf_get_int(g, "v.f32", &v, err, sizeof err) == CB_ERR_FORMAT && strstr(err, "v.f32"));
    err[0] = 0;
    CHECK(cb_gguf_get_float(g, "v.u32", &f, err, sizeof err) == CB_ERR_FORMAT && strstr(err, "v.u32"));
    CHECK(cb_gguf_get_str(g, "v.u8", &s, err, sizeof err) == CB_ERR_FORMAT);
    CHECK(cb_gguf_get_int(g, "a.i32", &v, err, sizeof err) == CB_ERR_FORMAT);
    CHECK(cb_gguf_get_int(g, "no.such.key", &v, err, sizeof err) == CB_ERR_NOT_FOUND);
    CHECK(cb_gguf_get_str(g, "v.st", &s, err, sizeof err) == CB_ERR_NOT_FOUND);  /* prefix is not a match */
    CHECK(cb_gguf_find_key(g, "v.str") >= 0 && cb_gguf_find_key(g, "v.strx") < 0);

    /* arrays */
    const cb_gguf_kv *kv;
    ki = cb_gguf_find_key(g, "a.strs");
    CHECK(ki >= 0);
    if (ki >= 0) {
        kv = &g->kv[ki];
        CHECK(kv->type == GGUF_T_ARR && kv->arr_type == GGUF_T_STR && kv->arr_len == 4 && kv->arr_str);
        for (uint64_t j = 0; kv->arr_str && j < 4; j++) CHECK(str_is(kv->arr_str[j], REF_STRS[j]));
        CHECK(cb_gguf_arr_int(kv, 0, &v) == CB_ERR_FORMAT);  /* not numeric */
    }
    ki = cb_gguf_find_key(g, "a.u8");
    CHECK(ki >= 0); if (ki >= 0) {
        kv = &g->kv[ki];
        CHECK(kv->arr_len == 3 && kv->arr_type == GGUF_T_U8);
        CHECK(cb_gguf_arr_int(kv, 1, &v) == CB_OK && v == 128);
        CHECK(cb_gguf_arr_int(kv, 2, &v) == CB_OK && v == 255);
        CHECK(cb_gguf_arr_float(kv, 2, &f) == CB_OK && f == 255.0);
        CHECK(cb_gguf_arr_int(kv, 3, &v) == CB_ERR_ARG);  /* out of range */
    }
    ki = cb_gguf_find_key(g, "a.i16");
    CHECK(ki >= 0); if (ki >= 0) {
        kv = &g->kv[ki];
        CHECK(cb_gguf_arr_int(kv, 0, &v) == CB_OK && v == -7);
        CHECK(cb_gguf_arr_int(kv, 1, &v) == CB_OK && v == 7);
    }
    ki = cb_gguf_find_key(g, "a.i32");
    CHECK(ki >= 0); if (ki >= 0) {
        kv = &g->kv[ki];
        CHECK(cb_gguf_arr_int(kv, 0, &v) == CB_OK && v == -1);
        CHECK(cb_gguf_arr_int(kv, 2, &v) == CB_OK && v == 2147483647);
        CHECK(cb_gguf_arr_float(kv, 0, &f) == CB_OK && f == -1.0);
    }
    ki = cb_gguf_find_key(g, "a.u64");
    CHECK(ki >= 0); if (ki >= 0) {
        kv = &g->kv[ki];
        CHECK(cb_gguf_arr_int(kv, 0, &v) == CB_OK && v == 42);
        CHECK(cb_gguf_arr_int(kv, 1, &v) == CB_ERR_FORMAT);  /* > INT64_MAX */
        CHECK(cb_gguf_arr_float(kv, 1, &f) == CB_OK && f == 18446744073709551615.0);
    }
    ki = cb_gguf_find_key(g, "a.f32");
    CHECK(ki >= 0); if (ki >= 0) {
        kv = &g->kv[ki];
        CHECK(cb_gguf_arr_float(kv, 0, &f) == CB_OK && f == 1.5);
        CHECK(cb_gguf_arr_float(kv, 2, &f) == CB_OK && f == 3.25);
        CHECK(cb_gguf_arr_int(kv, 1, &v) == CB_OK && v == -2);      /* integral float */
        CHECK(cb_gguf_arr_int(kv, 0, &v) == CB_ERR_FORMAT);         /* 1.5 is not */
    }
    ki = cb_gguf_find_key(g, "a.f64");
    CHECK(ki >= 0); if (ki >= 0) CHECK(cb_gguf_arr_float(&g->kv[ki], 0, &f) == CB_OK && f == 0.1);
    ki = cb_gguf_find_key(g, "a.bool");
    CHECK(ki >= 0); if (ki >= 0) {
        CHECK(cb_gguf_arr_int(&g->kv[ki], 0, &v) == CB_OK && v == 1);
        CHECK(cb_gguf_arr_int(&g->kv[ki], 1, &v) == CB_OK && v == 0);
    }
    ki = cb_gguf_find_key(g, "a.empty");
    CHECK(ki >= 0); if (ki >= 0) {
        CHECK(g->kv[ki].arr_len == 0 && g->kv[ki].arr_type == GGUF_T_I64);
        CHECK(cb_gguf_arr_int(&g->kv[ki], 0, &v) == CB_ERR_ARG);
    }
    ki = cb_gguf_find_key(g, "a.empty_strs");
    CHECK(ki >= 0); if (ki >= 0) CHECK(g->kv[ki].arr_len == 0 && g->kv[ki].arr_type == GGUF_T_STR);
    ki = cb_gguf_find_key(g, "v.u8");
    if (ki >= 0) CHECK(cb_gguf_arr_int(&g->kv[ki], 0, &v) == CB_ERR_ARG);  /* not an array */

    /* tensors */
    for (size_t i = 0; i < REF_NT; i++) {
        const cb_gguf_tensor *t = cb_gguf_find_tensor(g, REF_T[i].name);
        CHECK_MSG(t != NULL, "tensor %s not found", REF_T[i].name);
        if (!t) continue;
        CHECK(t == &g->tensors[i]);  /* file order is kept */
        CHECK(t->n_dims == REF_T[i].n_dims && t->type == REF_T[i].type);
        for (int d = 0; d < 4; d++) CHECK(t->ne[d] == (int64_t)REF_T[i].ne[d]);
        CHECK_MSG(t->nbytes == REF_T[i].nbytes, "%s nbytes %llu", REF_T[i].name, (unsigned long long)t->nbytes);
        CHECK(t->offset == offsets[i]);
        CHECK((const uint8_t *)t->data == base + g->data_offset + offsets[i]);
        /* the data pointer lands on this tensor's own pattern */
        int ok = 1;
        for (uint64_t k = 0; k < t->nbytes; k++)
            if (((const uint8_t *)t->data)[k] != (uint8_t)(i * 31u + k * 7u + 1u)) ok = 0;
        CHECK_MSG(ok, "tensor %s data mismatch", REF_T[i].name);
    }
    CHECK(cb_gguf_find_tensor(g, "blk.0.attn_q") == NULL);
    CHECK(cb_gguf_find_tensor(g, "nope") == NULL);
}

static void test_valid(void)
{
    uint32_t aligns[] = {32, 64, 1, 8, 256};
    for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
        for (uint32_t ver = 2; ver <= 3; ver++) {
            wbuf b = {0};
            uint64_t offs[REF_NT];
            build_ref(&b, aligns[a], ver, offs);
            cb_gguf g;
            char err[256] = "";
            int rc = cb_gguf_parse(&g, b.p, b.n, err, sizeof err);
            CHECK_MSG(rc == CB_OK, "align %u v%u: %s", aligns[a], ver, err);
            if (rc == CB_OK) check_ref(&g, b.p, b.n, aligns[a], ver, offs);
            cb_gguf_close(&g);
            cb_gguf_close(&g);  /* twice is fine */
            CHECK(g.kv == NULL && g.tensors == NULL && g.n_kv == 0);
            wfree(&b);
        }
    }
    /* header only: no keys, no tensors */
    wbuf b = {0};
    put_hdr(&b, 3, 0, 0);
    cb_gguf g;
    char err[128];
    CHECK(cb_gguf_parse(&g, b.p, b.n, err, sizeof err) == CB_OK && g.n_kv == 0 && g.n_tensors == 0);
    CHECK(cb_gguf_find_key(&g, "x") == -1 && cb_gguf_find_tensor(&g, "x") == NULL);
    cb_gguf_close(&g);
    wfree(&b);
    /* close on a zeroed struct */
    cb_gguf z;
    memset(&z, 0, sizeof z);
    cb_gguf_close(&z);
    cb_gguf_close(NULL);
}

/* Every prefix of a valid image is malformed and must fail cleanly. */
static void test_truncation(void)
{
    wbuf b = {0};
    uint64_t offs[REF_NT];
    build_ref(&b, 64, 3, offs);
    int all_format = 1, all_msg = 1;
    for (size_t n = 0; n < b.n; n++) {
        cb_gguf g;
        char err[512] = "";
        int rc = parse_copy(b.p, n, &g, err, sizeof err);
        if (rc != CB_ERR_FORMAT) { all_format = 0; fprintf(stderr, "len %zu: rc %d %s\n", n, rc, err); }
        if (!err[0]) all_msg = 0;
    }
    CHECK(all_format);
    CHECK(all_msg);
    /* the full image still parses (the loop above must stop one short) */
    cb_gguf g;
    char err[256];
    CHECK(parse_copy(b.p, b.n, &g, err, sizeof err) == CB_OK);
    /* a prefix cut inside the key section names truncation */
    err[0] = 0;
    CHECK(parse_copy(b.p, 40, &g, err, sizeof err) == CB_ERR_FORMAT && strstr(err, "truncated"));
    /* a prefix cut inside the data section names the tensor and the file */
    err[0] = 0;
    CHECK(parse_copy(b.p, b.n - 1, &g, err, sizeof err) == CB_ERR_FORMAT && strstr(err, "outside the file"));
    wfree(&b);
}

static void test_header(void)
{
    wbuf b = {0};
    put(&b, "GGML", 4); put_u32(&b, 3); put_u64(&b, 0); put_u64(&b, 0);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "bad magic 0x4c4d4747");
    wfree(&b);

    put_hdr(&b, 1, 0, 0);
    EXPECT_FAIL(&b, CB_ERR_UNSUPPORTED, "version 1");
    wfree(&b);
    put_hdr(&b, 4, 0, 0);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "version 4");
    wfree(&b);
    put_hdr(&b, 0x03000000u, 0, 0);  /* big-endian v3 */
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "big-endian");
    wfree(&b);

    /* huge counts fail on the count, without allocating (ASan would abort on
     * a multi-exabyte calloc) */
    put_hdr(&b, 3, 0, (uint64_t)1 << 60);
    kv_u32(&b, "a", 1);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "n_kv = 1152921504606846976 is too large");
    wfree(&b);
    put_hdr(&b, 3, (uint64_t)1 << 60, 0);
    put_pattern(&b, 100, 1);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "n_tensors = 1152921504606846976 is too large");
    wfree(&b);
    put_hdr(&b, 3, UINT64_MAX, UINT64_MAX);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "too large");
    wfree(&b);
    /* each count alone would fit, both together cannot */
    put_hdr(&b, 3, 3, 4);
    put_pattern(&b, 14 * 4 + 33 * 2, 1);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "n_tensors = 3 is too large");
    wfree(&b);
    /* plausible count, but the keys are not there */
    put_hdr(&b, 3, 0, 3);
    kv_u32(&b, "a", 1);
    put_pattern(&b, 30, 2);
    {
        cb_gguf g; char e[256] = "";
        CHECK(parse_copy(b.p, b.n, &g, e, sizeof e) == CB_ERR_FORMAT && e[0]);
    }
    wfree(&b);
}

static void test_strings(void)
{
    wbuf b = {0};
    /* key length past end */
    put_hdr(&b, 3, 0, 1);
    put_u64(&b, 1000); put(&b, "abcdefghijkl", 12);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "truncated: key length 1000 at offset 24 runs past end of file (size 44)");
    wfree(&b);
    /* 2^64-1 key length */
    put_hdr(&b, 3, 0, 1);
    put_u64(&b, UINT64_MAX); put_pattern(&b, 40, 3);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "length 18446744073709551615");
    wfree(&b);
    /* 2^64-1 string value */
    put_hdr(&b, 3, 0, 1);
    kv_head(&b, "k", GGUF_T_STR); put_u64(&b, UINT64_MAX); put_pattern(&b, 40, 3);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "string value length 18446744073709551615");
    wfree(&b);
    /* string value one byte short */
    put_hdr(&b, 3, 0, 1);
    kv_head(&b, "k", GGUF_T_STR); put_u64(&b, 5); put(&b, "abcd", 4);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "past end");
    wfree(&b);
    /* 2^64-1 length inside a string array */
    put_hdr(&b, 3, 0, 1);
    kv_head(&b, "k", GGUF_T_ARR); put_u32(&b, GGUF_T_STR); put_u64(&b, 2);
    put_str(&b, "ok"); put_u64(&b, UINT64_MAX); put_pattern(&b, 40, 3);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "array string length 18446744073709551615");
    wfree(&b);
    /* string array with a count no file could hold: fails before allocating */
    put_hdr(&b, 3, 0, 1);
    kv_head(&b, "k", GGUF_T_ARR); put_u32(&b, GGUF_T_STR); put_u64(&b, (uint64_t)1 << 61);
    put_pattern(&b, 64, 3);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "2305843009213693952 strings");
    wfree(&b);
    /* empty key, NUL in key, oversized key */
    put_hdr(&b, 3, 0, 1);
    put_u64(&b, 0); put_u32(&b, GGUF_T_U8); put_u8(&b, 1); put_pattern(&b, 8, 1);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "length 0");
    wfree(&b);
    put_hdr(&b, 3, 0, 1);
    put_u64(&b, 3); put(&b, "a\0b", 3); put_u32(&b, GGUF_T_U8); put_u8(&b, 1);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "NUL");
    wfree(&b);
    put_hdr(&b, 3, 0, 1);
    put_u64(&b, 70000); put_pattern(&b, 70000, 4); put_u32(&b, GGUF_T_U8); put_u8(&b, 1);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "length 70000");
    wfree(&b);
}

static void test_values(void)
{
    wbuf b = {0};
    put_hdr(&b, 3, 0, 1);
    kv_head(&b, "weird", 13); put_u32(&b, 0);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "key 'weird' has unknown value type 13");
    wfree(&b);
    put_hdr(&b, 3, 0, 1);
    kv_head(&b, "weird", 0x80000000u); put_u32(&b, 0);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "unknown value type");
    wfree(&b);
    /* nested array */
    put_hdr(&b, 3, 0, 1);
    kv_head(&b, "nest", GGUF_T_ARR); put_u32(&b, GGUF_T_ARR); put_u64(&b, 1);
    put_u32(&b, GGUF_T_U8); put_u64(&b, 1); put_u8(&b, 1);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "nested array");
    wfree(&b);
    /* unknown array element type */
    put_hdr(&b, 3, 0, 1);
    kv_head(&b, "arr", GGUF_T_ARR); put_u32(&b, 77); put_u64(&b, 1); put_u8(&b, 1);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "unknown element type 77");
    wfree(&b);
    /* bad bools */
    put_hdr(&b, 3, 0, 1);
    kv_head(&b, "flag", GGUF_T_BOOL); put_u8(&b, 2);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "key 'flag' has bool value 2");
    wfree(&b);
    put_hdr(&b, 3, 0, 1);
    kv_head(&b, "flags", GGUF_T_ARR); put_u32(&b, GGUF_T_BOOL); put_u64(&b, 3);
    put_u8(&b, 0); put_u8(&b, 1); put_u8(&b, 0xff);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "element 2 has bool value 255");
    wfree(&b);
    /* numeric array longer than the file: len * size overflows u64 if multiplied */
    put_hdr(&b, 3, 0, 1);
    kv_head(&b, "big", GGUF_T_ARR); put_u32(&b, GGUF_T_U64); put_u64(&b, ((uint64_t)1 << 61) + 1);
    put_pattern(&b, 64, 2);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "runs past end");
    wfree(&b);
    put_hdr(&b, 3, 0, 1);
    kv_head(&b, "short", GGUF_T_ARR); put_u32(&b, GGUF_T_I32); put_u64(&b, 3);
    put_u32(&b, 1); put_u32(&b, 2); put_u16(&b, 3);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "'short' array of 3 i32 elements");
    wfree(&b);
    /* duplicate key, not adjacent */
    put_hdr(&b, 3, 0, 3);
    kv_u32(&b, "llama.block_count", 1); kv_strv(&b, "x", "y"); kv_u32(&b, "llama.block_count", 2);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "duplicate key 'llama.block_count'");
    wfree(&b);
    /* alignment: not a power of two, zero, wrong type */
    put_hdr(&b, 3, 0, 1);
    kv_u32(&b, "general.alignment", 3);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "general.alignment = 3 is not a power of two");
    wfree(&b);
    put_hdr(&b, 3, 0, 1);
    kv_u32(&b, "general.alignment", 0);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "general.alignment = 0");
    wfree(&b);
    put_hdr(&b, 3, 0, 1);
    kv_head(&b, "general.alignment", GGUF_T_U64); put_u64(&b, 32);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "general.alignment has type u64");
    wfree(&b);
}

/* One-tensor image: header, optional alignment key, the tensor info as given,
 * padding, then `data_bytes` of data. */
static void one_tensor(wbuf *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                       uint32_t type, uint64_t off, size_t data_bytes)
{
    put_hdr(b, 3, 1, 1);
    kv_strv(b, "general.architecture", "llama");
    tinfo(b, name, n_dims, ne, type, off);
    pad_to(b, 32);
    put_pattern(b, data_bytes, 5);
}

static void test_tensors(void)
{
    wbuf b = {0};
    uint64_t ne[5] = {32, 2, 1, 1, 1};

    one_tensor(&b, "t", 2, ne, CB_TYPE_F32, 0, 256);
    { cb_gguf g; char e[128]; CHECK(parse_copy(b.p, b.n, &g, e, sizeof e) == CB_OK); }  /* control */
    wfree(&b);
    one_tensor(&b, "t", 0, ne, CB_TYPE_F32, 0, 256);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "tensor 't' has 0 dims");
    wfree(&b);
    one_tensor(&b, "t", 5, ne, CB_TYPE_F32, 0, 256);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "tensor 't' has 5 dims");
    wfree(&b);
    uint64_t ne0[2] = {32, 0};
    one_tensor(&b, "t", 2, ne0, CB_TYPE_F32, 0, 256);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "ne[1] = 0");
    wfree(&b);
    uint64_t neneg[1] = {(uint64_t)-32};
    one_tensor(&b, "t", 1, neneg, CB_TYPE_F32, 0, 256);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "ne[0] = 18446744073709551584");
    wfree(&b);
    uint64_t nebig[4] = {1u << 16, 1u << 16, 1u << 16, 2};  /* 2^49 elements */
    one_tensor(&b, "t", 4, nebig, CB_TYPE_F32, 0, 256);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "too many elements");
    wfree(&b);
    uint64_t neovf[2] = {(uint64_t)1 << 32, (uint64_t)1 << 32};  /* product wraps to 0 in u64 */
    one_tensor(&b, "t", 2, neovf, CB_TYPE_F32, 0, 256);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "too many elements");
    wfree(&b);
    one_tensor(&b, "blk.0.ffn_up.weight", 2, ne, 99, 0, 256);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "tensor 'blk.0.ffn_up.weight' has unknown type 99");
    wfree(&b);
    one_tensor(&b, "t", 2, ne, 4, 0, 256);  /* 4 = removed Q4_2 */
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "unknown type 4");
    wfree(&b);
    /* known GGML type the engine does not compute with */
    uint64_t nek[2] = {256, 2};
    one_tensor(&b, "blk.0.attn_k.weight", 2, nek, 23, 0, 2 * 136);
    EXPECT_FAIL(&b, CB_ERR_UNSUPPORTED, "tensor 'blk.0.attn_k.weight' has unsupported tensor type IQ4_XS (23)");
    wfree(&b);
    /* ... but a malformed one is still a format error */
    one_tensor(&b, "t", 2, ne, 12, 0, 2 * 144);  /* ne[0] = 32 is not a multiple of 256 */
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "not a multiple");
    wfree(&b);
    one_tensor(&b, "t", 2, nek, 12, 0, 2 * 144 - 1);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "outside the file");
    wfree(&b);
    uint64_t ne33[1] = {33};
    one_tensor(&b, "q", 1, ne33, CB_TYPE_Q8_0, 0, 256);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "tensor 'q' has ne[0] = 33, not a multiple of the Q8_0 block size 32");
    wfree(&b);
    one_tensor(&b, "t", 2, ne, CB_TYPE_F32, 16, 256);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "tensor 't' offset 16 is not aligned to 32");
    wfree(&b);
    one_tensor(&b, "blk.0.attn_q.weight", 2, ne, CB_TYPE_F32, 32, 256);  /* 32 + 256 > 256 */
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "tensor 'blk.0.attn_q.weight' data [32, 288) lies outside the file");
    wfree(&b);
    one_tensor(&b, "t", 2, ne, CB_TYPE_F32, 0, 255);  /* one byte short */
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "outside the file");
    wfree(&b);
    one_tensor(&b, "t", 2, ne, CB_TYPE_F32, UINT64_MAX - 31, 256);  /* offset + size wraps */
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "outside the file");
    wfree(&b);
    /* tensor name: empty, too long, 2^64-1 */
    one_tensor(&b, "", 2, ne, CB_TYPE_F32, 0, 256);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "name of 0 bytes");
    wfree(&b);
    char longname[300];
    memset(longname, 'n', 257); longname[257] = 0;
    one_tensor(&b, longname, 2, ne, CB_TYPE_F32, 0, 256);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "name of 257 bytes");
    wfree(&b);
    put_hdr(&b, 3, 1, 0);
    put_u64(&b, UINT64_MAX); put_pattern(&b, 64, 1);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "tensor name length 18446744073709551615");
    wfree(&b);
    /* header ends exactly where tensor data would start: data section missing */
    put_hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 2, ne, CB_TYPE_F32, 0);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "truncated");
    wfree(&b);

    /* duplicate tensor names */
    put_hdr(&b, 3, 2, 0);
    uint64_t ne8[1] = {8};
    tinfo(&b, "w", 1, ne8, CB_TYPE_F32, 0);
    tinfo(&b, "w", 1, ne8, CB_TYPE_F32, 32);
    pad_to(&b, 32); put_pattern(&b, 64, 1);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "duplicate tensor name 'w'");
    wfree(&b);
    /* overlapping tensors (listed out of offset order) */
    put_hdr(&b, 3, 3, 0);
    uint64_t ne16[1] = {16};
    tinfo(&b, "c", 1, ne8, CB_TYPE_F32, 128);
    tinfo(&b, "a", 1, ne16, CB_TYPE_F32, 0);   /* [0, 64) */
    tinfo(&b, "b", 1, ne16, CB_TYPE_F32, 32);  /* [32, 96) overlaps a */
    pad_to(&b, 32); put_pattern(&b, 160, 1);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "tensors 'a' [0, 64) and 'b' [32, 96) overlap");
    wfree(&b);
    /* same offset twice */
    put_hdr(&b, 3, 2, 0);
    tinfo(&b, "a", 1, ne8, CB_TYPE_F32, 0);
    tinfo(&b, "b", 1, ne8, CB_TYPE_F32, 0);
    pad_to(&b, 32); put_pattern(&b, 32, 1);
    EXPECT_FAIL(&b, CB_ERR_FORMAT, "overlap");
    wfree(&b);
    /* adjacent tensors touching exactly are fine */
    put_hdr(&b, 3, 2, 0);
    tinfo(&b, "b", 1, ne8, CB_TYPE_F32, 32);
    tinfo(&b, "a", 1, ne8, CB_TYPE_F32, 0);
    pad_to(&b, 32); put_pattern(&b, 64, 1);
    {
        cb_gguf g; char e[256] = "";
        int rc = cb_gguf_parse(&g, b.p, b.n, e, sizeof e);
        CHECK_MSG(rc == CB_OK, "%s", e);
        if (rc == CB_OK) {
            const cb_gguf_tensor *a = cb_gguf_find_tensor(&g, "a"), *bt = cb_gguf_find_tensor(&g, "b");
            CHECK(a && bt && (const uint8_t *)bt->data - (const uint8_t *)a->data == 32);
        }
        cb_gguf_close(&g);
    }
    wfree(&b);
    /* a large alignment is honoured for the data section */
    put_hdr(&b, 3, 1, 1);
    kv_u32(&b, "general.alignment", 4096);
    tinfo(&b, "a", 1, ne8, CB_TYPE_F32, 0);
    pad_to(&b, 4096); put_pattern(&b, 32, 1);
    {
        cb_gguf g; char e[256] = "";
        int rc = cb_gguf_parse(&g, b.p, b.n, e, sizeof e);
        CHECK_MSG(rc == CB_OK, "%s", e);
        if (rc == CB_OK) CHECK(g.data_offset == 4096 && g.tensors[0].data == b.p + 4096);
        cb_gguf_close(&g);
    }
    wfree(&b);
}

static void test_open(void)
{
    char dir[] = "/tmp/test_gguf_XXXXXX";
    if (!mkdtemp(dir)) { CHECK(!"mkdtemp"); return; }
    char path[256];
    snprintf(path, sizeof path, "%s/ok.gguf", dir);
    wbuf b = {0};
    uint64_t offs[REF_NT];
    build_ref(&b, 32, 3, offs);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(b.p, 1, b.n, f) == b.n);
    if (f) fclose(f);

    cb_gguf g;
    char err[512] = "";
    int rc = cb_gguf_open(&g, path, err, sizeof err);
    CHECK_MSG(rc == CB_OK, "%s", err);
    if (rc == CB_OK) {
        CHECK(g.map != NULL && g.map_size == b.n && g.base == g.map);
        check_ref(&g, g.base, g.size, 32, 3, offs);
    }
    cb_gguf_close(&g);
    CHECK(g.map == NULL);
    cb_gguf_close(&g);

    /* a bad file through open: parse's message comes back, nothing leaks */
    f = fopen(path, "wb");
    CHECK(f && fwrite(b.p, 1, b.n - 3, f) == b.n - 3);
    if (f) fclose(f);
    err[0] = 0;
    CHECK(cb_gguf_open(&g, path, err, sizeof err) == CB_ERR_FORMAT && strstr(err, "outside the file"));
    CHECK(g.map == NULL && g.kv == NULL);
    cb_gguf_close(&g);

    /* smaller than the header */
    f = fopen(path, "wb");
    CHECK(f && fwrite("GGUF\3\0\0\0", 1, 8, f) == 8);
    if (f) fclose(f);
    err[0] = 0;
    CHECK(cb_gguf_open(&g, path, err, sizeof err) == CB_ERR_FORMAT && strstr(err, "truncated"));
    /* empty file */
    f = fopen(path, "wb");
    if (f) fclose(f);
    err[0] = 0;
    CHECK(cb_gguf_open(&g, path, err, sizeof err) == CB_ERR_FORMAT && strstr(err, "0 bytes"));
    /* a directory, a missing file */
    err[0] = 0;
    CHECK(cb_gguf_open(&g, dir, err, sizeof err) == CB_ERR_IO && strstr(err, "directory"));
    char missing[300];
    snprintf(missing, sizeof missing, "%s/missing.gguf", dir);
    err[0] = 0;
    CHECK(cb_gguf_open(&g, missing, err, sizeof err) == CB_ERR_IO && strstr(err, "missing.gguf"));
    cb_gguf_close(&g);
    /* NULL err buffer is allowed */
    CHECK(cb_gguf_open(&g, missing, NULL, 0) == CB_ERR_IO);

    unlink(path);
    rmdir(dir);
    wfree(&b);
}

/* ------------------------------------------------------------ mutations */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    return *s = x;
}

/* After CB_OK every pointer must lie inside the buffer. */
static int invariants_hold(const cb_gguf *g, const uint8_t *p, size_t n)
{
    const uint8_t *end = p + n;
#define INSIDE(ptr, len) ((const uint8_t *)(ptr) >= p && (uint64_t)(len) <= (uint64_t)(end - (const uint8_t *)(ptr)))
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const cb_gguf_kv *kv = &g->kv[i];
        if (!INSIDE(kv->key.ptr, kv->key.len) || kv->key.len == 0) return 0;
        if (kv->type == GGUF_T_STR && !INSIDE(kv->str.ptr, kv->str.len)) return 0;
        if (kv->type == GGUF_T_ARR) {
            if (kv->arr_type == GGUF_T_ARR || kv->arr_type > GGUF_T_F64) return 0;
            if (kv->arr_type == GGUF_T_STR) {
                for (uint64_t j = 0; j < kv->arr_len; j++)
                    if (!INSIDE(kv->arr_str[j].ptr, kv->arr_str[j].len)) return 0;
            } else {
                int64_t v; double f;
                /* touching the last element must be safe */
                if (kv->arr_len && cb_gguf_arr_float(kv, kv->arr_len - 1, &f) != CB_OK) return 0;
                if (kv->arr_len) (void)cb_gguf_arr_int(kv, kv->arr_len - 1, &v);
            }
        }
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const cb_gguf_tensor *t = &g->tensors[i];
        if (!INSIDE(t->name.ptr, t->name.len) || !INSIDE(t->data, t->nbytes)) return 0;
        if (t->n_dims < 1 || t->n_dims > 4 || t->nbytes == 0) return 0;
        for (int d = 0; d < 4; d++) if (t->ne[d] < 1) return 0;
    }
#undef INSIDE
    return 1;
}

static void test_mutations(void)
{
    wbuf b = {0};
    uint64_t offs[REF_NT];
    build_ref(&b, 32, 3, offs);
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    int crashes_avoided = 0, ok_count = 0, bad_rc = 0, bad_inv = 0, no_msg = 0;
    uint8_t *m = malloc(b.n);
    for (int it = 0; it < 4000; it++) {
        memcpy(m, b.p, b.n);
        size_t n = b.n;
        int k = 1 + (int)(rng_next(&seed) % 4);
        for (int j = 0; j < k; j++) {
            uint64_t r = rng_next(&seed);
            size_t at = (size_t)(rng_next(&seed) % n);
            switch (r % 5) {
            case 0: m[at] ^= (uint8_t)(1u << (r >> 8) % 8); break;
            case 1: { static const uint8_t vals[] = {0, 0xff, 0x7f, 0x80, 1, 2, 9, 13};
                      m[at] = vals[(r >> 8) % 8]; break; }
            case 2: if (at + 8 <= n) { uint64_t v = (r >> 8) % 2 ? UINT64_MAX : (r >> 16);
                      memcpy(m + at, &v, 8); } break;
            case 3: n = at + 1; break;  /* truncate */
            default: m[at] = (uint8_t)(r >> 8); break;
            }
        }
        uint8_t *copy = malloc(n);
        memcpy(copy, m, n);
        cb_gguf g;
        char err[256] = "";
        int rc = cb_gguf_parse(&g, copy, n, err, sizeof err);
        if (rc == CB_OK) {
            ok_count++;
            if (!invariants_hold(&g, copy, n)) bad_inv++;
        } else if (rc != CB_ERR_FORMAT && rc != CB_ERR_UNSUPPORTED) {
            bad_rc++;
            fprintf(stderr, "mutation %d: rc %d: %s\n", it, rc, err);
        } else if (!err[0]) {
            no_msg++;
        }
        cb_gguf_close(&g);
        free(copy);
        crashes_avoided++;
    }
    free(m);
    CHECK(crashes_avoided == 4000);
    CHECK_MSG(bad_rc == 0, "%d mutations gave an unexpected status", bad_rc);
    CHECK_MSG(bad_inv == 0, "%d accepted mutations broke the invariants", bad_inv);
    CHECK_MSG(no_msg == 0, "%d errors without a message", no_msg);
    /* Sanity of the mutator itself: some mutations (e.g. inside tensor data)
     * must still parse, and most must not. */
    CHECK_MSG(ok_count > 0 && ok_count < 4000, "ok_count %d", ok_count);
    wfree(&b);
}

int main(void)
{
    test_valid();
    test_truncation();
    test_header();
    test_strings();
    test_values();
    test_tensors();
    test_open();
    test_mutations();
    return cb_test_report("test_gguf");
}
