/*
 * gguf.h — GGUF v2/v3 reader over a read-only mapping.
 *
 * cb_gguf_parse() validates the whole file before anything else looks at it:
 * magic, version, counts (bounded by what the file could hold), every string
 * length, every key type and array length, tensor names, dims, types, offsets
 * and sizes inside the data section, and alignment.  After it returns CB_OK
 * every pointer in the struct points inside the buffer and every size is
 * checked, so callers index without further bounds checks.
 */
#ifndef CB_GGUF_H
#define CB_GGUF_H

#include <stddef.h>
#include <stdint.h>

enum {
    GGUF_T_U8 = 0, GGUF_T_I8 = 1, GGUF_T_U16 = 2, GGUF_T_I16 = 3, GGUF_T_U32 = 4,
    GGUF_T_I32 = 5, GGUF_T_F32 = 6, GGUF_T_BOOL = 7, GGUF_T_STR = 8, GGUF_T_ARR = 9,
    GGUF_T_U64 = 10, GGUF_T_I64 = 11, GGUF_T_F64 = 12
};

/* A string inside the mapping (not NUL-terminated). */
typedef struct { const char *ptr; uint64_t len; } cb_gguf_str;

typedef struct {
    cb_gguf_str key;
    uint32_t    type;       /* GGUF_T_* */
    /* scalars */
    union { uint64_t u; int64_t i; double f; } num;  /* ints/bools in i (and u), floats in f */
    cb_gguf_str str;        /* GGUF_T_STR */
    /* arrays */
    uint32_t    arr_type;   /* element type (never GGUF_T_ARR: nested arrays are rejected) */
    uint64_t    arr_len;
    const uint8_t *arr_data;/* first element; numeric elements are packed little-endian */
    cb_gguf_str *arr_str;   /* arr_len entries when arr_type == GGUF_T_STR (heap, owned) */
} cb_gguf_kv;

#define CB_GGUF_MAX_DIMS 4

typedef struct {
    cb_gguf_str name;
    uint32_t    n_dims;
    int64_t     ne[CB_GGUF_MAX_DIMS]; /* ne[0] = innermost (row length); unused dims = 1 */
    uint32_t    type;                 /* GGML type id (cb_type) */
    uint64_t    offset;               /* relative to data section */
    uint64_t    nbytes;               /* checked: cb_type_size(type, nelements) */
    const void *data;                 /* inside the mapping */
} cb_gguf_tensor;

typedef struct {
    const uint8_t *base;     /* whole file */
    size_t         size;
    void          *map;      /* mmap'd region (NULL when parsed from a caller buffer) */
    size_t         map_size;
    uint32_t       version;
    uint64_t       n_kv;
    cb_gguf_kv    *kv;       /* heap, n_kv entries */
    uint64_t       n_tensors;
    cb_gguf_tensor *tensors; /* heap, n_tensors entries */
    uint64_t       alignment;/* general.alignment or 32 */
    uint64_t       data_offset; /* start of tensor data, aligned */
} cb_gguf;

/* Parse an in-memory buffer (not copied: it must outlive g).  Returns CB_OK or
 * CB_ERR_FORMAT / CB_ERR_UNSUPPORTED / CB_ERR_NOMEM with a message in err. */
int  cb_gguf_parse(cb_gguf *g, const void *data, size_t size, char *err, size_t err_len);
/* mmap `path` read-only and parse it. */
int  cb_gguf_open(cb_gguf *g, const char *path, char *err, size_t err_len);
/* Free what parse/open allocated and unmap; safe on a zeroed or closed struct. */
void cb_gguf_close(cb_gguf *g);
/* Drop the resident pages wholly inside [p, p + n) of the read-only file
 * mapping (a hint: later reads fault them back in from the file). */
void cb_gguf_drop_pages(const cb_gguf *g, const void *p, size_t n);

/* Lookups: index / pointer, or -1 / NULL when absent. */
int64_t               cb_gguf_find_key(const cb_gguf *g, const char *key);
const cb_gguf_tensor *cb_gguf_find_tensor(const cb_gguf *g, const char *name);

/* Typed getters.  Integers of any width/sign (and bool) convert to int64 when
 * representable; floats accept f32/f64.  Return CB_OK, CB_ERR_NOT_FOUND when
 * absent, CB_ERR_FORMAT (with message) when present but of the wrong type. */
int cb_gguf_get_int(const cb_gguf *g, const char *key, int64_t *out, char *err, size_t err_len);
int cb_gguf_get_float(const cb_gguf *g, const char *key, double *out, char *err, size_t err_len);
int cb_gguf_get_str(const cb_gguf *g, const char *key, cb_gguf_str *out, char *err, size_t err_len);
/* Numeric array element j of kv (any int/float type) as int64 / double. */
int cb_gguf_arr_int(const cb_gguf_kv *kv, uint64_t j, int64_t *out);
int cb_gguf_arr_float(const cb_gguf_kv *kv, uint64_t j, double *out);

#endif
