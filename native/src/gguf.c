/*
 * gguf.c — GGUF v2/v3 reader (see gguf.h).
 *
 * Layout (little-endian, v2 and v3 identical; v1 used 32-bit counts):
 *
 *   "GGUF" u32 version u64 n_tensors u64 n_kv
 *   n_kv      x { str key, u32 type, value }
 *   n_tensors x { str name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset }
 *   padding to `alignment`, then the data section (offsets are relative to it)
 *
 *   str   = u64 len, len bytes (no NUL)
 *   array = u32 element type, u64 count, count elements
 *
 * Everything read from the buffer goes through the cursor below, which checks
 * the bytes exist before touching them, so a hostile file can only produce an
 * error message.  Counts are bounded by what the remaining bytes could hold
 * before anything is allocated, so a header claiming 2^60 entries fails fast
 * instead of asking malloc for exabytes.
 */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "colibri.h"
#include "kernels.h"
#include "util.h"

/* Fixed header: magic, version, n_tensors, n_kv. */
#define GGUF_HEADER_BYTES 24u
/* Smallest possible key/value: key length (8) + a 1-byte key + type (4) + a
 * 1-byte value (u8/i8/bool).  Empty keys are rejected, so this is a bound. */
#define GGUF_MIN_KV_BYTES 14u
/* Smallest possible tensor info: name length (8) + a 1-byte name + n_dims (4)
 * + one dim (8) + type (4) + offset (8). */
#define GGUF_MIN_TENSOR_BYTES 33u
/* Sanity limits on names (the GGUF spec says keys <= 65535 bytes; ggml's
 * GGML_MAX_NAME is 64, we allow some slack for other writers). */
#define GGUF_MAX_KEY_LEN    65535u
#define GGUF_MAX_TNAME_LEN  256u
/* Element count limit per tensor: far above any real model, far below the
 * point where size arithmetic (count * bytes-per-block) could overflow. */
#define GGUF_MAX_NELEM      ((uint64_t)1 << 48)
#define GGUF_DEFAULT_ALIGN  32u

/* ------------------------------------------------------------ messages */

/* A name from the file, made safe to print: at most 80 bytes, non-printable
 * bytes replaced by '?', so messages stay ASCII (Python decodes them) and short. */
typedef struct { char s[96]; /* NUL-terminated, <= 83 chars + NUL */ } safe_name;

static safe_name show(const char *p, uint64_t len)
{
    safe_name n;
    size_t k = 0;
    uint64_t lim = len > 80 ? 80 : len;
    for (uint64_t i = 0; i < lim; i++) {
        unsigned char c = (unsigned char)p[i];
        n.s[k++] = (c >= 0x20 && c < 0x7f && c != '\'') ? (char)c : '?';
    }
    if (len > lim) { memcpy(n.s + k, "...", 3); k += 3; }
    n.s[k] = 0;
    return n;
}

/* ------------------------------------------------------------ type tables */

static const char *kv_type_name(uint32_t t)
{
    static const char *const names[] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string",
        "array", "u64", "i64", "f64"
    };
    return t <= GGUF_T_F64 ? names[t] : "unknown";
}

/* Byte size of a fixed-size value type; 0 for string/array/unknown. */
static unsigned kv_scalar_size(uint32_t t)
{
    switch (t) {
    case GGUF_T_U8: case GGUF_T_I8: case GGUF_T_BOOL: return 1;
    case GGUF_T_U16: case GGUF_T_I16: return 2;
    case GGUF_T_U32: case GGUF_T_I32: case GGUF_T_F32: return 4;
    case GGUF_T_U64: case GGUF_T_I64: case GGUF_T_F64: return 8;
    default: return 0;
    }
}

/* Every GGML type id we recognise, with its block geometry.  kernels.c
 * (cb_type_block / cb_type_block_bytes / cb_type_supported) is the authority
 * for what the engine computes with; this table only lets a well-formed file
 * that uses some other real GGML type (K-quants, IQ types, ...) be told apart
 * from garbage: it gets CB_ERR_UNSUPPORTED naming the type rather than a
 * format error.  Values as in gguf-py's GGML_QUANT_SIZES. */
typedef struct {
    uint32_t    id;     /* GGML type id as stored in the tensor info */
    const char *name;   /* ggml's name, for messages */
    uint32_t    block;  /* elements per block */
    uint32_t    bytes;  /* bytes per block */
} ggml_type_info;
static const ggml_type_info ggml_types[] = {
    {0, "F32", 1, 4},        {1, "F16", 1, 2},          {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},     {6, "Q5_0", 32, 22},       {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},     {9, "Q8_1", 32, 40},       {10, "Q2_K", 256, 84},
    {11, "Q3_K", 256, 110},  {12, "Q4_K", 256, 144},    {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},  {15, "Q8_K", 256, 292},    {16, "IQ2_XXS", 256, 66},
    {17, "IQ2_XS", 256, 74}, {18, "IQ3_XXS", 256, 98},  {19, "IQ1_S", 256, 50},
    {20, "IQ4_NL", 32, 18},  {21, "IQ3_S", 256, 110},   {22, "IQ2_S", 256, 82},
    {23, "IQ4_XS", 256, 136},{24, "I8", 1, 1},          {25, "I16", 1, 2},
    {26, "I32", 1, 4},       {27, "I64", 1, 8},         {28, "F64", 1, 8},
    {29, "IQ1_M", 256, 56},  {30, "BF16", 1, 2},        {34, "TQ1_0", 256, 54},
    {35, "TQ2_0", 256, 66},  {39, "MXFP4", 32, 17},     {40, "NVFP4", 64, 36},
    {41, "Q1_0", 128, 18},
};

static const ggml_type_info *ggml_type_lookup(uint32_t id)
{
    for (size_t i = 0; i < sizeof ggml_types / sizeof ggml_types[0]; i++)
        if (ggml_types[i].id == id) return &ggml_types[i];
    return NULL;
}

/* ------------------------------------------------------------ cursor */

/* Bounds-checked reader over the whole buffer.  Every read checks that the
 * bytes exist first and reports the field, offset and file size otherwise. */
typedef struct {
    const uint8_t *base;  /* start of the buffer */
    size_t         size;  /* bytes in the buffer */
    size_t         pos;   /* next byte to read, <= size */
    char          *err;   /* caller's message buffer (may be NULL) */
    size_t         err_len;
} cursor;

static size_t cur_left(const cursor *c) { return c->size - c->pos; }

static int need(cursor *c, uint64_t n, const char *what)
{
    if (n > cur_left(c)) {
        set_err(c->err, c->err_len,
                "truncated: %s needs %llu bytes at offset %zu but the file ends at %zu",
                what, (unsigned long long)n, c->pos, c->size);
        return CB_ERR_FORMAT;
    }
    return CB_OK;
}

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | (uint16_t)p[1] << 8); }
static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

static int rd_u32(cursor *c, uint32_t *v, const char *what)
{
    int rc = need(c, 4, what);
    if (rc) return rc;
    *v = le32(c->base + c->pos);
    c->pos += 4;
    return CB_OK;
}

static int rd_u64(cursor *c, uint64_t *v, const char *what)
{
    int rc = need(c, 8, what);
    if (rc) return rc;
    *v = le64(c->base + c->pos);
    c->pos += 8;
    return CB_OK;
}

/* String: u64 length + bytes, the length checked against the end of the buffer. */
static int rd_str(cursor *c, cb_gguf_str *s, const char *what)
{
    size_t at = c->pos;
    uint64_t len;
    int rc = rd_u64(c, &len, what);
    if (rc) return rc;
    if (len > cur_left(c)) {
        set_err(c->err, c->err_len,
                "truncated: %s length %llu at offset %zu runs past end of file (size %zu)",
                what, (unsigned long long)len, at, c->size);
        return CB_ERR_FORMAT;
    }
    s->ptr = (const char *)(c->base + c->pos);
    s->len = len;
    c->pos += (size_t)len;
    return CB_OK;
}

/* ------------------------------------------------------------ values */

/* Decode one fixed-size scalar at p into kv->num (ints sign- or zero-extended
 * to 64 bits, floats widened to double). */
static void decode_scalar(uint32_t t, const uint8_t *p, cb_gguf_kv *kv)
{
    switch (t) {
    case GGUF_T_U8:   kv->num.u = p[0]; break;
    case GGUF_T_BOOL: kv->num.u = p[0]; break;
    case GGUF_T_I8:   kv->num.i = (int8_t)p[0]; break;
    case GGUF_T_U16:  kv->num.u = le16(p); break;
    case GGUF_T_I16:  kv->num.i = (int16_t)le16(p); break;
    case GGUF_T_U32:  kv->num.u = le32(p); break;
    case GGUF_T_I32:  kv->num.i = (int32_t)le32(p); break;
    case GGUF_T_U64:  kv->num.u = le64(p); break;
    case GGUF_T_I64:  kv->num.i = (int64_t)le64(p); break;
    case GGUF_T_F32: { uint32_t b = le32(p); float f; memcpy(&f, &b, 4); kv->num.f = f; break; }
    case GGUF_T_F64: { uint64_t b = le64(p); double d; memcpy(&d, &b, 8); kv->num.f = d; break; }
    default: break;
    }
}

/* Value of key kv (type already read). */
static int parse_value(cursor *c, cb_gguf_kv *kv)
{
    char *err = c->err; size_t el = c->err_len;
    safe_name kn = show(kv->key.ptr, kv->key.len);
    int rc;

    if (kv->type > GGUF_T_F64) {
        set_err(err, el, "key '%s' has unknown value type %u at offset %zu",
                kn.s, kv->type, c->pos - 4);
        return CB_ERR_FORMAT;
    }
    if (kv->type == GGUF_T_STR) return rd_str(c, &kv->str, "string value");
    if (kv->type != GGUF_T_ARR) {
        unsigned sz = kv_scalar_size(kv->type);
        if ((rc = need(c, sz, "scalar value"))) return rc;
        const uint8_t *p = c->base + c->pos;
        if (kv->type == GGUF_T_BOOL && p[0] > 1) {
            set_err(err, el, "key '%s' has bool value %u (must be 0 or 1)", kn.s, p[0]);
            return CB_ERR_FORMAT;
        }
        decode_scalar(kv->type, p, kv);
        c->pos += sz;
        return CB_OK;
    }

    /* array */
    if ((rc = rd_u32(c, &kv->arr_type, "array element type"))) return rc;
    if (kv->arr_type == GGUF_T_ARR) {
        set_err(err, el, "key '%s' is a nested array (arrays of arrays are not allowed)", kn.s);
        return CB_ERR_FORMAT;
    }
    if (kv->arr_type > GGUF_T_F64) {
        set_err(err, el, "key '%s' is an array of unknown element type %u", kn.s, kv->arr_type);
        return CB_ERR_FORMAT;
    }
    size_t len_at = c->pos;
    if ((rc = rd_u64(c, &kv->arr_len, "array length"))) return rc;
    kv->arr_data = c->base + c->pos;

    if (kv->arr_type == GGUF_T_STR) {
        /* Each element takes at least its 8-byte length: bound the count by
         * the remaining bytes before allocating the element table. */
        if (kv->arr_len > cur_left(c) / 8) {
            set_err(err, el,
                    "truncated: key '%s' claims %llu strings at offset %zu but only %zu bytes remain (file size %zu)",
                    kn.s, (unsigned long long)kv->arr_len, len_at, cur_left(c), c->size);
            return CB_ERR_FORMAT;
        }
        if (kv->arr_len > 0) {
            kv->arr_str = calloc((size_t)kv->arr_len, sizeof *kv->arr_str);
            if (!kv->arr_str) {
                set_err(err, el, "out of memory for %llu strings of key '%s'",
                        (unsigned long long)kv->arr_len, kn.s);
                return CB_ERR_NOMEM;
            }
        }
        for (uint64_t j = 0; j < kv->arr_len; j++)
            if ((rc = rd_str(c, &kv->arr_str[j], "array string"))) return rc;
        return CB_OK;
    }

    unsigned esz = kv_scalar_size(kv->arr_type);
    /* Overflow-safe: compare the count against remaining / element size. */
    if (kv->arr_len > cur_left(c) / esz) {
        set_err(err, el,
                "truncated: key '%s' array of %llu %s elements at offset %zu runs past end of file (size %zu)",
                kn.s, (unsigned long long)kv->arr_len, kv_type_name(kv->arr_type), len_at, c->size);
        return CB_ERR_FORMAT;
    }
    if (kv->arr_type == GGUF_T_BOOL) {
        for (uint64_t j = 0; j < kv->arr_len; j++)
            if (kv->arr_data[j] > 1) {
                set_err(err, el, "key '%s' element %llu has bool value %u (must be 0 or 1)",
                        kn.s, (unsigned long long)j, kv->arr_data[j]);
                return CB_ERR_FORMAT;
            }
    }
    c->pos += (size_t)(kv->arr_len * esz);
    return CB_OK;
}

/* ------------------------------------------------------------ duplicates */

/* Sorting key/name strings to find duplicates in O(n log n): a file may hold
 * up to size/14 keys, so a quadratic scan would let a crafted file stall us. */
static int str_cmp(const cb_gguf_str *a, const cb_gguf_str *b)
{
    uint64_t n = a->len < b->len ? a->len : b->len;
    int r = n ? memcmp(a->ptr, b->ptr, (size_t)n) : 0;
    if (r) return r;
    return a->len < b->len ? -1 : a->len > b->len;
}
static int cmp_str_ptr(const void *a, const void *b)
{
    return str_cmp(*(const cb_gguf_str *const *)a, *(const cb_gguf_str *const *)b);
}

/* Sorts the n string pointers in place and reports a duplicate: returns 1
 * and sets *dup to one of the two equal strings, or 0 if all are distinct. */
static int find_dup(const cb_gguf_str **ptrs, uint64_t n, const cb_gguf_str **dup)
{
    if (n < 2) return 0;
    qsort(ptrs, (size_t)n, sizeof *ptrs, cmp_str_ptr);
    for (uint64_t i = 1; i < n; i++)
        if (str_cmp(ptrs[i - 1], ptrs[i]) == 0) { *dup = ptrs[i]; return 1; }
    return 0;
}

/* A tensor's byte range in the data section, for the overlap check. */
typedef struct {
    uint64_t off;  /* first byte (relative to data_offset) */
    uint64_t end;  /* one past the last byte */
    uint64_t idx;  /* index into g->tensors */
} span;
static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* ------------------------------------------------------------ parse */

void cb_gguf_drop_pages(const cb_gguf *g, const void *p, size_t n) {
    const uintptr_t lo = (uintptr_t)g->map, hi = lo + g->map_size;
    uintptr_t a = (uintptr_t)p, b = a + n;
    if (!g->map || a < lo || b > hi || b < a) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    a = (a + page - 1) / page * page;
    b = b / page * page;
    if (b > a) madvise((void *)a, (size_t)(b - a), MADV_DONTNEED);
}

void cb_gguf_close(cb_gguf *g)
{
    if (!g) return;
    if (g->kv) {
        for (uint64_t i = 0; i < g->n_kv; i++) free(g->kv[i].arr_str);
        free(g->kv);
    }
    free(g->tensors);
    if (g->map) munmap(g->map, g->map_size);
    memset(g, 0, sizeof *g);
}

/* One tensor info; *unsupported_idx gets the index of the first tensor whose
 * type is well-formed but not computable by the engine (if still < 0). */
static int parse_tensor_info(cursor *c, cb_gguf_tensor *t, uint64_t index, int64_t *unsupported_idx)
{
    char *err = c->err; size_t el = c->err_len;
    int rc;
    size_t at = c->pos;
    if ((rc = rd_str(c, &t->name, "tensor name"))) return rc;
    safe_name tn = show(t->name.ptr, t->name.len);
    if (t->name.len == 0 || t->name.len > GGUF_MAX_TNAME_LEN) {
        set_err(err, el, "tensor %llu at offset %zu has a name of %llu bytes (must be 1..%u)",
                (unsigned long long)index, at, (unsigned long long)t->name.len, GGUF_MAX_TNAME_LEN);
        return CB_ERR_FORMAT;
    }
    if (memchr(t->name.ptr, 0, (size_t)t->name.len)) {
        set_err(err, el, "tensor '%s' name contains a NUL byte", tn.s);
        return CB_ERR_FORMAT;
    }
    if ((rc = rd_u32(c, &t->n_dims, "tensor n_dims"))) return rc;
    if (t->n_dims < 1 || t->n_dims > CB_GGUF_MAX_DIMS) {
        set_err(err, el, "tensor '%s' has %u dims (must be 1..%d)", tn.s, t->n_dims, CB_GGUF_MAX_DIMS);
        return CB_ERR_FORMAT;
    }
    uint64_t nelem = 1;
    for (int d = 0; d < CB_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        if ((rc = rd_u64(c, &ne, "tensor dim"))) return rc;
        if (ne == 0 || ne > (uint64_t)INT64_MAX) {
            set_err(err, el, "tensor '%s' has ne[%u] = %llu (must be 1..2^63-1)",
                    tn.s, d, (unsigned long long)ne);
            return CB_ERR_FORMAT;
        }
        /* nelem * ne < 2^48, checked by division so it cannot overflow. */
        if (ne >= GGUF_MAX_NELEM / nelem) {
            set_err(err, el, "tensor '%s' has too many elements (dims product >= 2^48)", tn.s);
            return CB_ERR_FORMAT;
        }
        nelem *= ne;
        t->ne[d] = (int64_t)ne;
    }
    if ((rc = rd_u32(c, &t->type, "tensor type"))) return rc;
    if ((rc = rd_u64(c, &t->offset, "tensor offset"))) return rc;

    /* Block geometry: the kernels' table first (what the engine computes
     * with), then the list of other real GGML types.  A type known only to
     * the list, or known to kernels.c but not computable, is remembered as
     * unsupported and reported after the rest of the file has validated. */
    int kb = cb_type_block((int)t->type);
    size_t kbytes = kb > 0 ? cb_type_block_bytes((int)t->type) : 0;
    const ggml_type_info *info = ggml_type_lookup(t->type);
    uint64_t block, bbytes;
    if (kb > 0 && kbytes > 0) {
        block = (uint64_t)kb;
        bbytes = (uint64_t)kbytes;
        if (!cb_type_supported((int)t->type) && *unsupported_idx < 0) *unsupported_idx = (int64_t)index;
    } else if (info) {
        block = info->block;
        bbytes = info->bytes;
        if (*unsupported_idx < 0) *unsupported_idx = (int64_t)index;
    } else {
        set_err(err, el, "tensor '%s' has unknown type %u", tn.s, t->type);
        return CB_ERR_FORMAT;
    }
    if ((uint64_t)t->ne[0] % block != 0) {
        set_err(err, el, "tensor '%s' has ne[0] = %lld, not a multiple of the %s block size %llu",
                tn.s, (long long)t->ne[0], info ? info->name : "type's", (unsigned long long)block);
        return CB_ERR_FORMAT;
    }
    t->nbytes = nelem / block * bbytes;  /* < 2^48 * 292: no overflow */
    return CB_OK;
}

/* Magic, version and the two counts, each count bounded by what the rest of
 * the file could hold (so nothing is allocated for a lie). */
static int parse_header(cursor *c, cb_gguf *g, uint64_t *n_tensors_out, uint64_t *n_kv_out)
{
    char *err = c->err;
    size_t err_len = c->err_len, size = c->size;
    int rc;
    if (size < 4) {
        set_err(err, err_len, "truncated: file is %zu bytes, too small to hold the GGUF magic", size);
        return CB_ERR_FORMAT;
    }
    uint32_t magic = le32(c->base);
    if (memcmp(c->base, "GGUF", 4) != 0) {
        set_err(err, err_len, "bad magic 0x%08x (expected 'GGUF'): not a GGUF file", magic);
        return CB_ERR_FORMAT;
    }
    c->pos = 4;
    if ((rc = rd_u32(c, &g->version, "header version"))) return rc;
    if (g->version == 1) {
        set_err(err, err_len, "GGUF version 1 is not supported (only versions 2 and 3)");
        return CB_ERR_UNSUPPORTED;
    }
    if (g->version != 2 && g->version != 3) {
        set_err(err, err_len, "unknown GGUF version %u%s (only versions 2 and 3)", g->version,
                (g->version & 0xffff) == 0 ? ", perhaps a big-endian file," : "");
        return CB_ERR_FORMAT;
    }
    uint64_t n_tensors, n_kv;
    if ((rc = rd_u64(c, &n_tensors, "header n_tensors"))) return rc;
    if ((rc = rd_u64(c, &n_kv, "header n_kv"))) return rc;

    /* Counts bounded by what the rest of the file could hold. */
    uint64_t left = cur_left(c);
    if (n_kv > left / GGUF_MIN_KV_BYTES) {
        set_err(err, err_len,
                "n_kv = %llu is too large: the remaining %llu bytes hold at most %llu key/value pairs (truncated or corrupt file)",
                (unsigned long long)n_kv, (unsigned long long)left,
                (unsigned long long)(left / GGUF_MIN_KV_BYTES));
        return CB_ERR_FORMAT;
    }
    if (n_tensors > left / GGUF_MIN_TENSOR_BYTES
        || n_kv * GGUF_MIN_KV_BYTES + n_tensors * GGUF_MIN_TENSOR_BYTES > left) {
        set_err(err, err_len,
                "n_tensors = %llu is too large: the remaining %llu bytes cannot hold that many tensor infos after %llu key/value pairs (truncated or corrupt file)",
                (unsigned long long)n_tensors, (unsigned long long)left, (unsigned long long)n_kv);
        return CB_ERR_FORMAT;
    }

    *n_tensors_out = n_tensors;
    *n_kv_out = n_kv;
    return CB_OK;
}

/* The key/value pairs (unique keys) and general.alignment. */
static int parse_kvs(cursor *c, cb_gguf *g, uint64_t n_kv)
{
    char *err = c->err;
    size_t err_len = c->err_len;
    int rc;
    if (n_kv) {
        g->kv = calloc((size_t)n_kv, sizeof *g->kv);
        if (!g->kv) { set_err(err, err_len, "out of memory for %llu keys", (unsigned long long)n_kv); return CB_ERR_NOMEM; }
        g->n_kv = n_kv;  /* set now so that close() frees every arr_str */
    }
    for (uint64_t i = 0; i < n_kv; i++) {
        cb_gguf_kv *kv = &g->kv[i];
        size_t at = c->pos;
        if ((rc = rd_str(c, &kv->key, "key"))) return rc;
        if (kv->key.len == 0 || kv->key.len > GGUF_MAX_KEY_LEN) {
            set_err(err, err_len, "key %llu at offset %zu has length %llu (must be 1..%u)",
                    (unsigned long long)i, at, (unsigned long long)kv->key.len, GGUF_MAX_KEY_LEN);
            return CB_ERR_FORMAT;
        }
        if (memchr(kv->key.ptr, 0, (size_t)kv->key.len)) {
            set_err(err, err_len, "key '%s' contains a NUL byte", show(kv->key.ptr, kv->key.len).s);
            return CB_ERR_FORMAT;
        }
        if ((rc = rd_u32(c, &kv->type, "value type"))) return rc;
        if ((rc = parse_value(c, kv))) return rc;
    }

    if (n_kv > 1) {
        const cb_gguf_str **ptrs = malloc((size_t)n_kv * sizeof *ptrs);
        if (!ptrs) { set_err(err, err_len, "out of memory"); return CB_ERR_NOMEM; }
        for (uint64_t i = 0; i < n_kv; i++) ptrs[i] = &g->kv[i].key;
        const cb_gguf_str *dup = NULL;
        int d = find_dup(ptrs, n_kv, &dup);
        if (d) set_err(err, err_len, "duplicate key '%s'", show(dup->ptr, dup->len).s);
        free(ptrs);
        if (d) { return CB_ERR_FORMAT; }
    }

    /* general.alignment: a u32 power of two, default 32. */
    g->alignment = GGUF_DEFAULT_ALIGN;
    int64_t ai = cb_gguf_find_key(g, "general.alignment");
    if (ai >= 0) {
        const cb_gguf_kv *kv = &g->kv[ai];
        if (kv->type != GGUF_T_U32) {
            set_err(err, err_len, "general.alignment has type %s (must be u32)", kv_type_name(kv->type));
            return CB_ERR_FORMAT;
        }
        uint64_t a = kv->num.u;
        if (a == 0 || (a & (a - 1)) != 0) {
            set_err(err, err_len, "general.alignment = %llu is not a power of two", (unsigned long long)a);
            return CB_ERR_FORMAT;
        }
        g->alignment = a;
    }

    return CB_OK;
}

/* The tensor infos (unique names); the first tensor of a type the engine
 * cannot compute is noted in *unsupported_idx, refused only after the whole
 * file is known to be well-formed. */
static int parse_tensor_infos(cursor *c, cb_gguf *g, uint64_t n_tensors, int64_t *unsupported_idx)
{
    char *err = c->err;
    size_t err_len = c->err_len;
    int rc;
    if (n_tensors) {
        g->tensors = calloc((size_t)n_tensors, sizeof *g->tensors);
        if (!g->tensors) { set_err(err, err_len, "out of memory for %llu tensors", (unsigned long long)n_tensors); return CB_ERR_NOMEM; }
        g->n_tensors = n_tensors;
    }
    for (uint64_t i = 0; i < n_tensors; i++)
        if ((rc = parse_tensor_info(c, &g->tensors[i], i, unsupported_idx))) return rc;

    if (n_tensors > 1) {
        const cb_gguf_str **ptrs = malloc((size_t)n_tensors * sizeof *ptrs);
        if (!ptrs) { set_err(err, err_len, "out of memory"); return CB_ERR_NOMEM; }
        for (uint64_t i = 0; i < n_tensors; i++) ptrs[i] = &g->tensors[i].name;
        const cb_gguf_str *dup = NULL;
        int d = find_dup(ptrs, n_tensors, &dup);
        if (d) set_err(err, err_len, "duplicate tensor name '%s'", show(dup->ptr, dup->len).s);
        free(ptrs);
        if (d) { return CB_ERR_FORMAT; }
    }

    return CB_OK;
}

/* The data section after the header's padding: every tensor aligned, inside
 * the file, and no two overlapping. */
static int place_tensor_data(cursor *c, cb_gguf *g, uint64_t n_tensors)
{
    char *err = c->err;
    size_t err_len = c->err_len, size = c->size;
    uint64_t hdr_end = c->pos;
    uint64_t pad = (g->alignment - hdr_end % g->alignment) % g->alignment;
    if (pad > UINT64_MAX - hdr_end) {  /* unreachable with size_t sizes, kept for clarity */
        set_err(err, err_len, "data offset overflows"); return CB_ERR_FORMAT;
    }
    g->data_offset = hdr_end + pad;
    if (n_tensors && g->data_offset > size) {
        set_err(err, err_len,
                "truncated: tensor data section starts at offset %llu, past end of file (size %zu)",
                (unsigned long long)g->data_offset, size);
        return CB_ERR_FORMAT;
    }
    uint64_t avail = n_tensors ? size - g->data_offset : 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        cb_gguf_tensor *t = &g->tensors[i];
        safe_name tn = show(t->name.ptr, t->name.len);
        if (t->offset % g->alignment != 0) {
            set_err(err, err_len, "tensor '%s' offset %llu is not aligned to %llu",
                    tn.s, (unsigned long long)t->offset, (unsigned long long)g->alignment);
            return CB_ERR_FORMAT;
        }
        if (t->offset > avail || t->nbytes > avail - t->offset) {
            set_err(err, err_len,
                    "tensor '%s' data [%llu, %llu%s) lies outside the file (data section is %llu bytes at offset %llu, file size %zu)",
                    tn.s, (unsigned long long)t->offset,
                    (unsigned long long)(t->offset + t->nbytes),  /* wraps only for the message */
                    t->nbytes > UINT64_MAX - t->offset ? " (overflows)" : "",
                    (unsigned long long)avail, (unsigned long long)g->data_offset, size);
            return CB_ERR_FORMAT;
        }
        t->data = c->base + g->data_offset + t->offset;
    }

    if (n_tensors > 1) {
        span *sp = malloc((size_t)n_tensors * sizeof *sp);
        if (!sp) { set_err(err, err_len, "out of memory"); return CB_ERR_NOMEM; }
        for (uint64_t i = 0; i < n_tensors; i++)
            sp[i] = (span){ g->tensors[i].offset, g->tensors[i].offset + g->tensors[i].nbytes, i };
        qsort(sp, (size_t)n_tensors, sizeof *sp, cmp_span);
        int bad = 0;
        for (uint64_t i = 1; i < n_tensors && !bad; i++)
            if (sp[i].off < sp[i - 1].end) {
                const cb_gguf_tensor *a = &g->tensors[sp[i - 1].idx], *b = &g->tensors[sp[i].idx];
                safe_name an = show(a->name.ptr, a->name.len), bn = show(b->name.ptr, b->name.len);
                set_err(err, err_len, "tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap",
                        an.s, (unsigned long long)sp[i - 1].off, (unsigned long long)sp[i - 1].end,
                        bn.s, (unsigned long long)sp[i].off, (unsigned long long)sp[i].end);
                bad = 1;
            }
        free(sp);
        if (bad) { return CB_ERR_FORMAT; }
    }

    return CB_OK;
}

int cb_gguf_parse(cb_gguf *g, const void *data, size_t size, char *err, size_t err_len)
{
    if (err && err_len) err[0] = 0;
    if (!g) { set_err(err, err_len, "cb_gguf_parse: NULL struct"); return CB_ERR_ARG; }
    memset(g, 0, sizeof *g);
    if (!data && size) { set_err(err, err_len, "cb_gguf_parse: NULL buffer"); return CB_ERR_ARG; }

    cursor c = { .base = data, .size = size, .pos = 0, .err = err, .err_len = err_len };
    g->base = data;
    g->size = size;
    uint64_t n_tensors = 0, n_kv = 0;
    int64_t unsupported_idx = -1;
    int rc;
    if ((rc = parse_header(&c, g, &n_tensors, &n_kv))) goto fail;
    if ((rc = parse_kvs(&c, g, n_kv))) goto fail;
    if ((rc = parse_tensor_infos(&c, g, n_tensors, &unsupported_idx))) goto fail;
    if ((rc = place_tensor_data(&c, g, n_tensors))) goto fail;

    /* Well-formed; refuse types the engine cannot compute with only now, so
     * that a malformed file always reports its format error first. */
    if (unsupported_idx >= 0) {
        const cb_gguf_tensor *t = &g->tensors[unsupported_idx];
        const ggml_type_info *info = ggml_type_lookup(t->type);
        set_err(err, err_len, "tensor '%s' has unsupported tensor type %s (%u)",
                show(t->name.ptr, t->name.len).s, info ? info->name : "?", t->type);
        rc = CB_ERR_UNSUPPORTED; goto fail;
    }
    return CB_OK;

fail:
    cb_gguf_close(g);
    return rc;
}

int cb_gguf_open(cb_gguf *g, const char *path, char *err, size_t err_len)
{
    if (err && err_len) err[0] = 0;
    if (!g || !path) { set_err(err, err_len, "cb_gguf_open: NULL argument"); return CB_ERR_ARG; }
    memset(g, 0, sizeof *g);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        set_err(err, err_len, "cannot open '%s': %s", path, strerror(errno));
        return CB_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        set_err(err, err_len, "cannot stat '%s': %s", path, strerror(errno));
        close(fd);
        return CB_ERR_IO;
    }
    if (!S_ISREG(st.st_mode)) {
        set_err(err, err_len, "'%s' is not a regular file%s", path, S_ISDIR(st.st_mode) ? " (it is a directory)" : "");
        close(fd);
        return CB_ERR_IO;
    }
    if (st.st_size < (off_t)GGUF_HEADER_BYTES) {
        set_err(err, err_len, "truncated: '%s' is %lld bytes, smaller than the %u-byte GGUF header",
                path, (long long)st.st_size, GGUF_HEADER_BYTES);
        close(fd);
        return CB_ERR_FORMAT;
    }
    if ((unsigned long long)st.st_size > (unsigned long long)SIZE_MAX) {
        set_err(err, err_len, "'%s' is too large to map (%lld bytes)", path, (long long)st.st_size);
        close(fd);
        return CB_ERR_IO;
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int saved = errno;
    close(fd);  /* the mapping keeps the file alive */
    if (map == MAP_FAILED) {
        set_err(err, err_len, "cannot mmap '%s' (%zu bytes): %s", path, size, strerror(saved));
        return CB_ERR_IO;
    }
    int rc = cb_gguf_parse(g, map, size, err, err_len);
    if (rc != CB_OK) {  /* parse already cleared g */
        munmap(map, size);
        return rc;
    }
    g->map = map;
    g->map_size = size;
    return CB_OK;
}

/* ------------------------------------------------------------ lookups */

static int name_eq(const cb_gguf_str *s, const char *name, size_t n)
{
    return s->len == n && memcmp(s->ptr, name, n) == 0;
}

int64_t cb_gguf_find_key(const cb_gguf *g, const char *key)
{
    if (!g || !key) return -1;
    size_t n = strlen(key);
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (name_eq(&g->kv[i].key, key, n)) return (int64_t)i;
    return -1;
}

const cb_gguf_tensor *cb_gguf_find_tensor(const cb_gguf *g, const char *name)
{
    if (!g || !name) return NULL;
    size_t n = strlen(name);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (name_eq(&g->tensors[i].name, name, n)) return &g->tensors[i];
    return NULL;
}

static int is_int_type(uint32_t t)
{
    return t <= GGUF_T_I32 || t == GGUF_T_BOOL || t == GGUF_T_U64 || t == GGUF_T_I64;
}
static int is_unsigned_type(uint32_t t)
{
    return t == GGUF_T_U8 || t == GGUF_T_U16 || t == GGUF_T_U32 || t == GGUF_T_U64 || t == GGUF_T_BOOL;
}

int cb_gguf_get_int(const cb_gguf *g, const char *key, int64_t *out, char *err, size_t err_len)
{
    int64_t i = cb_gguf_find_key(g, key);
    if (i < 0) return CB_ERR_NOT_FOUND;
    const cb_gguf_kv *kv = &g->kv[i];
    if (!is_int_type(kv->type)) {
        set_err(err, err_len, "key '%s' has type %s, expected an integer", key, kv_type_name(kv->type));
        return CB_ERR_FORMAT;
    }
    if (kv->type == GGUF_T_U64 && kv->num.u > (uint64_t)INT64_MAX) {
        set_err(err, err_len, "key '%s' = %llu does not fit in int64", key, (unsigned long long)kv->num.u);
        return CB_ERR_FORMAT;
    }
    if (out) *out = is_unsigned_type(kv->type) ? (int64_t)kv->num.u : kv->num.i;
    return CB_OK;
}

int cb_gguf_get_float(const cb_gguf *g, const char *key, double *out, char *err, size_t err_len)
{
    int64_t i = cb_gguf_find_key(g, key);
    if (i < 0) return CB_ERR_NOT_FOUND;
    const cb_gguf_kv *kv = &g->kv[i];
    if (kv->type != GGUF_T_F32 && kv->type != GGUF_T_F64) {
        set_err(err, err_len, "key '%s' has type %s, expected f32 or f64", key, kv_type_name(kv->type));
        return CB_ERR_FORMAT;
    }
    if (out) *out = kv->num.f;
    return CB_OK;
}

int cb_gguf_get_str(const cb_gguf *g, const char *key, cb_gguf_str *out, char *err, size_t err_len)
{
    int64_t i = cb_gguf_find_key(g, key);
    if (i < 0) return CB_ERR_NOT_FOUND;
    const cb_gguf_kv *kv = &g->kv[i];
    if (kv->type != GGUF_T_STR) {
        set_err(err, err_len, "key '%s' has type %s, expected string", key, kv_type_name(kv->type));
        return CB_ERR_FORMAT;
    }
    if (out) *out = kv->str;
    return CB_OK;
}

/* Element j of a numeric array decoded into a scratch kv (reuses decode_scalar). */
static int arr_elem(const cb_gguf_kv *kv, uint64_t j, cb_gguf_kv *tmp)
{
    if (!kv || kv->type != GGUF_T_ARR || j >= kv->arr_len) return CB_ERR_ARG;
    unsigned esz = kv_scalar_size(kv->arr_type);
    if (esz == 0) return CB_ERR_FORMAT;  /* string array */
    memset(tmp, 0, sizeof *tmp);
    decode_scalar(kv->arr_type, kv->arr_data + j * esz, tmp);
    return CB_OK;
}

int cb_gguf_arr_int(const cb_gguf_kv *kv, uint64_t j, int64_t *out)
{
    cb_gguf_kv e;
    int rc = arr_elem(kv, j, &e);
    if (rc) return rc;
    int64_t v;
    if (kv->arr_type == GGUF_T_F32 || kv->arr_type == GGUF_T_F64) {
        /* Floats convert only when they hold an exact int64 value. */
        double f = e.num.f;
        if (!(f >= -9223372036854775808.0 && f < 9223372036854775808.0) || f != (double)(int64_t)f)
            return CB_ERR_FORMAT;
        v = (int64_t)f;
    } else if (is_unsigned_type(kv->arr_type)) {
        if (e.num.u > (uint64_t)INT64_MAX) return CB_ERR_FORMAT;
        v = (int64_t)e.num.u;
    } else {
        v = e.num.i;
    }
    if (out) *out = v;
    return CB_OK;
}

int cb_gguf_arr_float(const cb_gguf_kv *kv, uint64_t j, double *out)
{
    cb_gguf_kv e;
    int rc = arr_elem(kv, j, &e);
    if (rc) return rc;
    double v;
    if (kv->arr_type == GGUF_T_F32 || kv->arr_type == GGUF_T_F64) v = e.num.f;
    else if (is_unsigned_type(kv->arr_type)) v = (double)e.num.u;
    else v = (double)e.num.i;
    if (out) *out = v;
    return CB_OK;
}
