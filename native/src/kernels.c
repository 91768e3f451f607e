/*
 * kernels.c — tensor type table, f16/bf16 conversions, SIMD detection and
 * dispatch, and the threaded matmul driver (cb_matmul) shared by every SIMD
 * level.  The per-level kernels live in kernels_scalar.c, kernels_avx2.c and
 * kernels_avx512.c; this file only splits work and never does arithmetic that
 * could change a result (so batch invariance is the kernels' property alone).
 */
#include "colibri.h"
#include "kernels.h"
#include "kquants.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* Per-level tables, defined in kernels_<level>.c.  The SIMD files return NULL
 * when built for a CPU family that lacks the level. */
const cb_kernels *cb_kernels_scalar_table(void);
const cb_kernels *cb_kernels_avx2_table(void);
const cb_kernels *cb_kernels_avx512_table(void);

/* ------------------------------------------------------------ conversions */

/* IEEE half -> float, the branch-free formulation ggml uses (exact for every
 * input including subnormals, infinities and NaN payloads). */
static inline float bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

float cb_f16_to_f32(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const uint32_t exp_offset = 0xE0u << 23;
    const float exp_scale = 0x1.0p-112f;
    const float normalized = bits_to_f32((two_w >> 4) + exp_offset) * exp_scale;
    const uint32_t magic_mask = 126u << 23;
    const float magic_bias = 0.5f;
    const float denormalized = bits_to_f32((two_w >> 17) | magic_mask) - magic_bias;
    const uint32_t denormalized_cutoff = 1u << 27;
    const uint32_t result = sign |
        (two_w < denormalized_cutoff ? f32_to_bits(denormalized) : f32_to_bits(normalized));
    return bits_to_f32(result);
}

/* float -> IEEE half, round to nearest even (ggml's reference conversion). */
uint16_t cb_f32_to_f16(float f) {
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    float base = (fabsf(f) * scale_to_inf) * scale_to_zero;
    const uint32_t w = f32_to_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = bits_to_f32((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = f32_to_bits(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

float cb_bf16_to_f32(uint16_t h) { return bits_to_f32((uint32_t)h << 16); }

/* ------------------------------------------------------------- type table */

int cb_type_block(int type) {
    switch (type) {
    case CB_TYPE_F32: case CB_TYPE_F16: case CB_TYPE_BF16: return 1;
    case CB_TYPE_Q4_0: case CB_TYPE_Q4_1: case CB_TYPE_Q5_0: case CB_TYPE_Q5_1: case CB_TYPE_Q8_0: return CB_QK;
    case CB_TYPE_Q2_K: case CB_TYPE_Q3_K: case CB_TYPE_Q4_K: case CB_TYPE_Q5_K: case CB_TYPE_Q6_K: return CB_QK_K;
    default: return 0;
    }
}

size_t cb_type_block_bytes(int type) {
    switch (type) {
    case CB_TYPE_F32:  return 4;
    case CB_TYPE_F16:  return 2;
    case CB_TYPE_BF16: return 2;
    case CB_TYPE_Q4_0: return sizeof(cb_block_q4_0);
    case CB_TYPE_Q4_1: return sizeof(cb_block_q4_1);
    case CB_TYPE_Q5_0: return sizeof(cb_block_q5_0);
    case CB_TYPE_Q5_1: return sizeof(cb_block_q5_1);
    case CB_TYPE_Q8_0: return sizeof(cb_block_q8_0);
    default: return cb_kq_block_bytes(type);
    }
}

int cb_type_supported(int type) { return cb_type_block(type) != 0; }

size_t cb_type_size(int type, int64_t n) {
    const int blk = cb_type_block(type);
    if (blk == 0 || n < 0 || n % blk != 0) return 0;
    const uint64_t nb = (uint64_t)(n / blk);
    const size_t bb = cb_type_block_bytes(type);
    if (nb > SIZE_MAX / bb) return 0;  /* would overflow size_t */
    return (size_t)nb * bb;
}

const char *cb_type_name(int type) {
    switch (type) {
    case CB_TYPE_F32:  return "f32";
    case CB_TYPE_F16:  return "f16";
    case CB_TYPE_BF16: return "bf16";
    case CB_TYPE_Q4_0: return "q4_0";
    case CB_TYPE_Q4_1: return "q4_1";
    case CB_TYPE_Q5_0: return "q5_0";
    case CB_TYPE_Q5_1: return "q5_1";
    case CB_TYPE_Q8_0: return "q8_0";
    default: return cb_kq_type_name(type) ? cb_kq_type_name(type) : "unknown";
    }
}

int cb_type_act(int type) {
    if (type == CB_TYPE_Q4_K || type == CB_TYPE_Q5_K || type == CB_TYPE_Q6_K) return CB_ACT_Q8K;
    if (type == CB_TYPE_Q4_0 || type == CB_TYPE_Q4_1 || type == CB_TYPE_Q5_0 || type == CB_TYPE_Q5_1 ||
        type == CB_TYPE_Q8_0 || cb_kq_is_kquant(type))
        return CB_ACT_Q8;
    return 0;
}

int cb_type_wants_q8(int type) { return cb_type_act(type) != 0; }

int cb_act_formats(const cb_weight *const *w, int n_w) {
    int fmt = 0;
    for (int i = 0; i < n_w; i++) fmt |= cb_type_act(w[i]->type);
    return fmt;
}

/* -------------------------------------------------------------- SIMD */

#if defined(__x86_64__) || defined(__i386__)
/* XCR0 via xgetbv written as raw asm so this file needs no -mxsave. */
static uint64_t read_xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

int cb_simd_detect(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return CB_SIMD_SCALAR;
    const int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return CB_SIMD_SCALAR;
    /* The OS must save the YMM (bits 1,2) and, for AVX-512, the opmask and
     * ZMM state (bits 5,6,7); a CPU flag alone is not enough. */
    const uint64_t xcr0 = read_xcr0();
    const int os_avx = (xcr0 & 0x6) == 0x6;
    const int os_avx512 = (xcr0 & 0xE6) == 0xE6;
    if (!os_avx) return CB_SIMD_SCALAR;
    if (__get_cpuid_max(0, NULL) < 7) return CB_SIMD_SCALAR;
    __cpuid_count(7, 0, a, b, c, d);
    const int avx2 = (b >> 5) & 1;
    const int avx512f = (b >> 16) & 1, avx512bw = (b >> 30) & 1, avx512vl = (b >> 31) & 1;
    const int vnni = (c >> 11) & 1;
    if (!(avx2 && fma && f16c)) return CB_SIMD_SCALAR;
    if (os_avx512 && avx512f && avx512bw && avx512vl && vnni) return CB_SIMD_AVX512;
    return CB_SIMD_AVX2;
#else
    return CB_SIMD_SCALAR;
#endif
}

/* ------------------------------------------- CPU traits and prefetch */

/* Prefetch mode (CB_PREFETCH_*); CB_PREFETCH_AUTO - 1: not read from the
 * environment yet.  CPU vendor: -1 unknown, 0 not AMD, 1 AMD.  The kernels
 * ask these per matmul, so both are cached after the first call. */
static _Atomic int pf_mode = CB_PREFETCH_AUTO - 1;
static _Atomic int pf_amd = -1;

static int cpu_is_amd(void) {
    int v = atomic_load_explicit(&pf_amd, memory_order_relaxed);
    if (v >= 0) return v;
    v = 0;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    /* CPUID leaf 0: the vendor string in EBX, EDX, ECX ("Auth" "enti" "cAMD") */
    if (__get_cpuid(0, &a, &b, &c, &d))
        v = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;
#endif
    atomic_store_explicit(&pf_amd, v, memory_order_relaxed);
    return v;
}

int cb_cpu_zmm_split(void) {
    static _Atomic int split = -1;
    int v = atomic_load_explicit(&split, memory_order_relaxed);
    if (v >= 0) return v;
    v = 0;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    /* family = base family (EAX bits 8-11) + extended family (bits 20-27) when the base is 15 */
    if (cpu_is_amd() && cb_simd_detect() == CB_SIMD_AVX512 && __get_cpuid(1, &a, &b, &c, &d)) {
        const unsigned fam = ((a >> 8) & 0xF) == 0xF ? 0xF + ((a >> 20) & 0xFF) : (a >> 8) & 0xF;
        v = fam == 0x19;  /* Zen 4 (Zen 3, the same family, has no AVX-512) */
    }
#endif
    atomic_store_explicit(&split, v, memory_order_relaxed);
    return v;
}

static _Atomic int ymm_mode = -1;  /* cb_ymm_decode_set's mode */

int cb_ymm_decode(void) {
    const int m = atomic_load_explicit(&ymm_mode, memory_order_relaxed);
    return m < 0 ? cb_cpu_zmm_split() : m;
}

int cb_ymm_decode_set(int mode) {
    atomic_store(&ymm_mode, mode == 0 || mode == 1 ? mode : -1);
    return cb_ymm_decode();
}

int cb_prefetch_mode(void) {
    int m = atomic_load(&pf_mode);
    if (m < CB_PREFETCH_AUTO) {
        const char *env = getenv("COLIBRI_LAB_PREFETCH");
        int want = !env || !*env ? CB_PREFETCH_AUTO : strcmp(env, "0") == 0 ? CB_PREFETCH_OFF
                 : strcmp(env, "1") == 0 ? CB_PREFETCH_ON : CB_PREFETCH_AUTO;
        int expect = m;
        m = atomic_compare_exchange_strong(&pf_mode, &expect, want) ? want : expect;
    }
    return m;
}

int cb_prefetch_set(int mode) {
    if (mode != CB_PREFETCH_OFF && mode != CB_PREFETCH_ON) mode = CB_PREFETCH_AUTO;
    atomic_store(&pf_mode, mode);
    return mode;
}

/* On AMD (Zen 4 measured) the L2 streamer follows a panel stream by itself
 * and software prefetches hold the core's miss buffers, so where a kernel
 * computes well ahead of the memory (one or two rows of the types with
 * little work per byte) it streams faster without them (bench_kquants from
 * DRAM, AVX-512: one row of Q6_K, Q4_0, Q4_1, Q5_0, Q8_0 30-33 GB/s without,
 * 22-23 with; two rows 28-29 vs 21-23).  From 3-4 rows on the kernels compute
 * longer per panel than the streamer runs ahead (4 rows of Q6_K 15.6 without,
 * 27.0 with; 8 rows 9.3 vs 16.7), and Q4_K (17.9-22.6 vs 21.1-22.7 at one
 * row) and Q5_K (two streams per super-block the streamer does not follow:
 * 15.8 vs 27.5) keep it at every size (Zen 4's one-row Q4_K kernel at the
 * AVX-512 level excepted: kquants_avx512.c, ky_rows_q4). */
int cb_prefetch_panels(int type, int n_rows) {
    const int m = cb_prefetch_mode();
    if (m != CB_PREFETCH_AUTO) return m == CB_PREFETCH_ON;
    return !cpu_is_amd() || n_rows > 2 || type == CB_TYPE_Q4_K || type == CB_TYPE_Q5_K;
}

const char *cb_simd_name(int simd) {
    switch (simd) {
    case CB_SIMD_SCALAR: return "scalar";
    case CB_SIMD_AVX2:   return "avx2";
    case CB_SIMD_AVX512: return "avx512";
    case CB_SIMD_AUTO:   return "auto";
    default: return "unknown";
    }
}

const cb_kernels *cb_kernels_get(int simd) {
    if (simd == CB_SIMD_AUTO) simd = cb_simd_detect();
    switch (simd) {
    case CB_SIMD_SCALAR: return cb_kernels_scalar_table();
    case CB_SIMD_AVX2:   return cb_simd_detect() >= CB_SIMD_AVX2 ? cb_kernels_avx2_table() : NULL;
    case CB_SIMD_AVX512: return cb_simd_detect() >= CB_SIMD_AVX512 ? cb_kernels_avx512_table() : NULL;
    default: return NULL;
    }
}

/* ---------------------------------------------------------------- matmul */

/* Activations for quantized weights: per format n_rows * blocks, each
 * region padded to 64 bytes. */
static size_t round64(size_t b) { return (b + 63) & ~(size_t)63; }

size_t cb_act_q8k_offset(int64_t n_in, int n_rows, int fmt) {
    if (!(fmt & CB_ACT_Q8) || n_in <= 0 || n_rows <= 0) return 0;
    return round64((size_t)n_rows * (size_t)((n_in + CB_QK - 1) / CB_QK) * sizeof(cb_block_q8));
}

size_t cb_act_bytes(int64_t n_in, int n_rows, int fmt) {
    if (n_in <= 0 || n_rows <= 0) return 64;
    size_t b = cb_act_q8k_offset(n_in, n_rows, fmt);
    if (fmt & CB_ACT_Q8K) b += round64((size_t)n_rows * (size_t)((n_in + CB_QK_K - 1) / CB_QK_K) * sizeof(cb_block_q8k));
    return b ? b : 64;
}

size_t cb_matmul_scratch(int64_t n_in, int n_rows) { return cb_act_bytes(n_in, n_rows, CB_ACT_Q8 | CB_ACT_Q8K); }

/* Decode-sized activations are quantized redundantly by every thread into a
 * stack buffer, so a matmul is ONE pool run instead of two (a run costs about
 * a microsecond of synchronisation and decode issues hundreds per token).
 * Quantization is deterministic, so every thread gets identical bytes. */
#define CB_LOCAL_Q8_BYTES (16 * 1024)

/* Output rows are handed out in chunks from an atomic counter (dynamic
 * scheduling copes with a co-tenant stealing a core).  Chunk starts are
 * multiples of CB_CHUNK_ALIGN so threads never share a cache line of y. */
#define CB_CHUNK_ALIGN 16
_Static_assert(CB_CHUNK_ALIGN % CB_PANEL == 0, "a work item must start on a panel");

typedef struct {
    const cb_kernels *k;      /* SIMD level */
    const cb_weight *const *w;/* n_w weights, each n_out x n_in (same n_in) */
    float *const     *y;      /* n_w outputs, y[i] is [n_rows][w[i]->n_out] */
    int               n_w;    /* weights in this run, <= CB_MATMUL_MULTI_MAX */
    const float      *x;      /* activations [n_rows][n_in] */
    int64_t           n_in;   /* shared row length */
    int               n_rows; /* activation rows */
    float            *am_max; /* argmax: per-thread partials [nth][n_rows] (NULL: no argmax) */
    int64_t          *am_idx; /* ... and their indices */
    const void       *xq;     /* shared quantized activations (NULL: none or local) */
    void             *qbuf;   /* where mm_quantize_task writes them (the scratch) */
    int               quant;  /* the activation formats the weights read (CB_ACT_*; 0: floats only) */
    int               local_q;/* 1: each thread quantizes into its own stack buffer */
    int64_t           chunk[CB_MATMUL_MULTI_MAX];   /* output rows per work item of weight i */
    int64_t           first[CB_MATMUL_MULTI_MAX + 1];/* work items before weight i (prefix sums) */
    atomic_llong      next;   /* next work item to hand out, over all weights */
} mm_ctx;

/* K-quant weights go to kquants*.c; everything else to the level's table.
 * xq: the activation buffer in the formats fmt (layout in kernels.h). */
static inline void mm_rows(const cb_kernels *k, const cb_weight *w, const void *xq, int fmt, const float *xf,
                           int n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const cb_block_q8 *q8 = xq;
    const cb_block_q8k *q8k =
        xq && (fmt & CB_ACT_Q8K) ? (const cb_block_q8k *)((const char *)xq + cb_act_q8k_offset(w->n_in, n_rows, fmt))
                                 : NULL;
    if (cb_kq_is_kquant(w->type)) cb_kq_matmul_rows(k->simd, w, q8, q8k, n_rows, y, ldy, o0, o1);
    else k->matmul_rows(w, q8, xf, n_rows, y, ldy, o0, o1);
}

void cb_quantize_rows(const cb_kernels *k, const float *x, void *q, int64_t n_in, int n_rows, int r0, int r1,
                      int fmt) {
    if (fmt & CB_ACT_Q8) {
        const int64_t nb = n_in / CB_QK;
        cb_block_q8 *q8 = q;
        for (int r = r0; r < r1; r++) k->quantize_q8(x + (int64_t)r * n_in, q8 + (int64_t)r * nb, n_in);
    }
    if (fmt & CB_ACT_Q8K) {
        const int64_t nsb = n_in / CB_QK_K;
        cb_block_q8k *q8k = (cb_block_q8k *)((char *)q + cb_act_q8k_offset(n_in, n_rows, fmt));
        for (int r = r0; r < r1; r++) cb_kq_quantize_q8k(k->simd, x + (int64_t)r * n_in, q8k + (int64_t)r * nsb, n_in);
    }
}

static void mm_quantize_task(void *arg, int ith, int nth) {
    mm_ctx *c = arg;
    const int per = (c->n_rows + nth - 1) / nth;
    const int r0 = ith * per;
    const int r1 = r0 + per < c->n_rows ? r0 + per : c->n_rows;
    if (r0 < r1) cb_quantize_rows(c->k, c->x, c->qbuf, c->n_in, c->n_rows, r0, r1, c->quant);
}

static void mm_compute_task(void *arg, int ith, int nth) {
    mm_ctx *c = arg;
    const void *xq = c->xq;
    _Alignas(64) char local[CB_LOCAL_Q8_BYTES];
    if (c->local_q) {
        cb_quantize_rows(c->k, c->x, local, c->n_in, c->n_rows, 0, c->n_rows, c->quant);
        xq = local;
    }
    const int64_t total = c->first[c->n_w];
    float *am_max = c->am_max ? c->am_max + (size_t)ith * c->n_rows : NULL;
    int64_t *am_idx = c->am_max ? c->am_idx + (size_t)ith * c->n_rows : NULL;
    for (int r = 0; am_max && r < c->n_rows; r++) { am_max[r] = -INFINITY; am_idx[r] = -1; }
    int wi = 0;
    for (;;) {
        const int64_t i = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
        if (i >= total) break;
        while (i >= c->first[wi + 1]) wi++;  /* items are handed out in increasing order */
        const cb_weight *w = c->w[wi];
        const int64_t o0 = (i - c->first[wi]) * c->chunk[wi];
        const int64_t o1 = o0 + c->chunk[wi] < w->n_out ? o0 + c->chunk[wi] : w->n_out;
        mm_rows(c->k, w, xq, c->quant, c->x, c->n_rows, c->y[wi], w->n_out, o0, o1);
        for (int r = 0; am_max && r < c->n_rows; r++)  /* while the item's outputs are in cache */
            c->k->argmax(c->y[wi] + (size_t)r * w->n_out + o0, o1 - o0, o0, &am_max[r], &am_idx[r]);
    }
}

/* Rows per work item for one weight: ~4 chunks per thread so a slow thread
 * is covered by the others, but one per thread below CB_DECODE_ROWS
 * activation rows: decode-sized matmuls stream their weights, and every
 * item boundary costs a prefetch ramp (measured in interleaved runs, 2
 * threads: 1 per thread vs 2 is one stream -4%, 8 streams -2% per step; 4
 * vs 2 was +10% / +1..10%; 16 and 32 streams with 1 instead of 4 per
 * thread: step -3..15% and -1..10%; a late thread's item is still taken by
 * the other from the shared counter).  Never below CB_CHUNK_ALIGN rows
 * (cache lines) nor a work item so small that the atomic dominates (~32
 * rows of a 576-wide matrix). */
#define CB_DECODE_ROWS 64
static int64_t mm_chunk(int64_t n_out, int n_rows, int nth) {
    if (nth <= 1) return n_out;
    const int64_t min_chunk = n_rows >= CB_DECODE_ROWS ? CB_CHUNK_ALIGN : 32;
    const int per_thread = n_rows < CB_DECODE_ROWS ? 1 : 4;
    int64_t chunk = (n_out + per_thread * nth - 1) / (per_thread * nth);
    if (chunk < min_chunk) chunk = min_chunk;
    return (chunk + CB_CHUNK_ALIGN - 1) / CB_CHUNK_ALIGN * CB_CHUNK_ALIGN;
}

static void matmul_run(cb_pool *pool, const cb_kernels *k, const cb_weight *const *w, int n_w,
                       const float *x, const void *xq, int n_rows, float *const *y, void *scratch,
                       float *am_max, int64_t *am_idx) {
    if (n_rows <= 0 || n_w <= 0) return;
    if (n_w > CB_MATMUL_MULTI_MAX) {  /* more than one run's worth: split */
        cb_matmul_multi(pool, k, w, CB_MATMUL_MULTI_MAX, x, xq, n_rows, y, scratch);
        cb_matmul_multi(pool, k, w + CB_MATMUL_MULTI_MAX, n_w - CB_MATMUL_MULTI_MAX, x, xq, n_rows,
                        y + CB_MATMUL_MULTI_MAX, scratch);
        return;
    }
    const int nth = pool ? cb_pool_size(pool) : 1;
    mm_ctx c;
    c.k = k; c.w = w; c.y = y; c.n_w = n_w; c.x = x; c.n_in = w[0]->n_in; c.n_rows = n_rows;
    c.xq = NULL; c.qbuf = scratch; c.local_q = 0; c.quant = 0;
    c.am_max = am_max; c.am_idx = am_idx;
    c.first[0] = 0;
    c.quant = cb_act_formats(w, n_w);
    for (int i = 0; i < n_w; i++) {
        c.chunk[i] = mm_chunk(w[i]->n_out, n_rows, nth);
        c.first[i + 1] = c.first[i] + (w[i]->n_out > 0 ? (w[i]->n_out + c.chunk[i] - 1) / c.chunk[i] : 0);
    }
    if (c.first[n_w] == 0) {  /* no outputs: no maximum either */
        for (int i = 0; am_max && i < nth * n_rows; i++) { am_max[i] = -INFINITY; am_idx[i] = -1; }
        return;
    }
    const size_t qbytes = cb_act_bytes(c.n_in, n_rows, c.quant);
    int quantize = 0;  /* 1: quantize x into scratch before the run */
    if (c.quant && xq) {
        c.xq = xq;
    } else if (c.quant) {
        if (nth > 1 && qbytes <= CB_LOCAL_Q8_BYTES) c.local_q = 1;
        else { c.xq = scratch; quantize = 1; }
    }
    atomic_init(&c.next, 0);

    if (nth == 1) {  /* one item per weight, on this thread */
        if (quantize) cb_quantize_rows(k, x, scratch, c.n_in, n_rows, 0, n_rows, c.quant);
        mm_compute_task(&c, 0, 1);
        return;
    }
    if (quantize) cb_pool_run(pool, mm_quantize_task, &c);
    cb_pool_run(pool, mm_compute_task, &c);
}

void cb_matmul_multi(cb_pool *pool, const cb_kernels *k, const cb_weight *const *w, int n_w,
                     const float *x, const void *xq, int n_rows, float *const *y, void *scratch) {
    matmul_run(pool, k, w, n_w, x, xq, n_rows, y, scratch, NULL, NULL);
}

void cb_matmul_argmax(cb_pool *pool, const cb_kernels *k, const cb_weight *w, const float *x, int n_rows,
                      float *y, void *scratch, float *part_max, int64_t *part_idx, float *max, int64_t *idx) {
    if (n_rows <= 0) return;
    matmul_run(pool, k, &w, 1, x, NULL, n_rows, &y, scratch, part_max, part_idx);
    const int nth = pool ? cb_pool_size(pool) : 1;
    for (int r = 0; r < n_rows; r++) {  /* the largest partial; on a tie the smaller index */
        float m = -INFINITY;
        int64_t at = -1;
        for (int t = 0; t < nth; t++) {
            const float pm = part_max[(size_t)t * n_rows + r];
            const int64_t pi = part_idx[(size_t)t * n_rows + r];
            if (pi >= 0 && (at < 0 || pm > m || (pm == m && pi < at))) { m = pm; at = pi; }
        }
        max[r] = m;
        idx[r] = at;
    }
}

void cb_matmul(cb_pool *pool, const cb_kernels *k, const cb_weight *w,
               const float *x, int n_rows, float *y, void *scratch) {
    cb_matmul_multi(pool, k, &w, 1, x, NULL, n_rows, &y, scratch);
}

/* ------------------------------------------------------- row dequantize */

void cb_weight_row_f32(const cb_weight *w, int64_t row, float *out) {
    const uint8_t *p = (const uint8_t *)w->data + (size_t)row * w->row_bytes;
    const int64_t n = w->n_in;
    switch (w->type) {
    case CB_TYPE_F32:
        memcpy(out, p, (size_t)n * sizeof(float));
        break;
    case CB_TYPE_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h; memcpy(&h, p + 2 * i, 2);
            out[i] = cb_f16_to_f32(h);
        }
        break;
    case CB_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h; memcpy(&h, p + 2 * i, 2);
            out[i] = cb_bf16_to_f32(h);
        }
        break;
    case CB_TYPE_Q4_0:
        for (int64_t b = 0; b < n / CB_QK; b++) {
            const cb_block_q4_0 *blk = (const cb_block_q4_0 *)(p + (size_t)b * sizeof(cb_block_q4_0));
            const float d = cb_f16_to_f32(blk->d);
            for (int j = 0; j < 16; j++) {
                out[b * CB_QK + j]      = d * (float)((blk->qs[j] & 0x0F) - 8);
                out[b * CB_QK + j + 16] = d * (float)((blk->qs[j] >> 4) - 8);
            }
        }
        break;
    case CB_TYPE_Q4_1:
        for (int64_t b = 0; b < n / CB_QK; b++) {
            const cb_block_q4_1 *blk = (const cb_block_q4_1 *)(p + (size_t)b * sizeof(cb_block_q4_1));
            const float d = cb_f16_to_f32(blk->d), m = cb_f16_to_f32(blk->m);
            for (int j = 0; j < 16; j++) {
                out[b * CB_QK + j]      = d * (float)(blk->qs[j] & 0x0F) + m;
                out[b * CB_QK + j + 16] = d * (float)(blk->qs[j] >> 4) + m;
            }
        }
        break;
    case CB_TYPE_Q5_0:
    case CB_TYPE_Q5_1: {
        const int one = w->type == CB_TYPE_Q5_1;
        const size_t bsz = cb_type_block_bytes(w->type);
        for (int64_t b = 0; b < n / CB_QK; b++) {
            const uint8_t *blk = p + (size_t)b * bsz;
            uint16_t dh, mh = 0;
            uint32_t qh;
            memcpy(&dh, blk, 2);
            if (one) memcpy(&mh, blk + 2, 2);
            memcpy(&qh, blk + 2 + 2 * one, 4);
            const uint8_t *qs = blk + 6 + 2 * one;
            const float d = cb_f16_to_f32(dh), m = cb_f16_to_f32(mh);
            for (int j = 0; j < 16; j++) {
                const int lo = (qs[j] & 0x0F) | (int)((qh >> j) & 1) << 4;
                const int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
                out[b * CB_QK + j]      = one ? d * (float)lo + m : d * (float)(lo - 16);
                out[b * CB_QK + j + 16] = one ? d * (float)hi + m : d * (float)(hi - 16);
            }
        }
        break;
    }
    case CB_TYPE_Q8_0:
        for (int64_t b = 0; b < n / CB_QK; b++) {
            const cb_block_q8_0 *blk = (const cb_block_q8_0 *)(p + (size_t)b * sizeof(cb_block_q8_0));
            const float d = cb_f16_to_f32(blk->d);
            for (int j = 0; j < CB_QK; j++) out[b * CB_QK + j] = d * (float)blk->qs[j];
        }
        break;
    default:
        if (cb_kq_is_kquant(w->type)) { cb_kq_row_f32(w->type, p, n, out); break; }
        memset(out, 0, (size_t)n * sizeof(float));
        break;
    }
}

/* -------------------------------------------------------------- attention */

void cb_f16_row_to_f32(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = cb_f16_to_f32(x[i]);
}

void cb_f32_row_to_f16(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = cb_f32_to_f16(x[i]);
}

/* Row p of a KV block as floats: in place for f32, converted into buf for f16. */
static inline const float *kv_row(cb_f16_row_fn from_f16, const void *base, size_t stride, int kv_f16,
                                  int p, int hd, float *buf) {
    if (!kv_f16) return (const float *)base + (size_t)p * stride;
    from_f16((const uint16_t *)base + (size_t)p * stride, buf, hd);
    return buf;
}

void cb_attn_generic(cb_dot_fn dot, cb_axpy_fn axpy, cb_f16_row_fn from_f16, const float *q, int g, int hd,
                     const void *K, const void *V, size_t stride, int kv_f16, int n_pos, float scale,
                     float *scores, float *out) {
    float buf[CB_MAX_HEAD_DIM];
    if (hd > CB_MAX_HEAD_DIM) return;
    for (int j = 0; j < g; j++) {
        const float *qj = q + (size_t)j * hd;
        float *oj = out + (size_t)j * hd, *sj = scores + (size_t)j * n_pos;
        float mx = -INFINITY;
        for (int p = 0; p < n_pos; p++) {
            sj[p] = dot(qj, kv_row(from_f16, K, stride, kv_f16, p, hd, buf), hd) * scale;
            if (sj[p] > mx) mx = sj[p];
        }
        float sum = 0.0f;
        for (int p = 0; p < n_pos; p++) { sj[p] = expf(sj[p] - mx); sum += sj[p]; }
        const float inv = 1.0f / sum;
        memset(oj, 0, (size_t)hd * sizeof(float));
        for (int p = 0; p < n_pos; p++) axpy(oj, sj[p] * inv, kv_row(from_f16, V, stride, kv_f16, p, hd, buf), hd);
    }
}

void cb_rmsnorm_generic(const float *x, const float *w, float *o, int n, float eps) {
    /* sum of squares in double, fixed order: deterministic and accurate */
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) o[i] = x[i] * scale * w[i];
}

void cb_swiglu_generic(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void cb_geglu_generic(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        g[i] = x / (1.0f + expf(-CB_GELU_2K * x * (1.0f + CB_GELU_A * x * x))) * u[i];
    }
}

void cb_argmax_generic(const float *x, int64_t n, int64_t base, float *max, int64_t *idx) {
    float m = *max;
    int64_t at = -1;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > m) { m = x[i]; at = i; }
    if (at >= 0) { *max = m; *idx = base + at; }
}

void cb_rope_generic(float *v, const float *cs, int n_heads, int head_dim, int n_rot, int neox) {
    const int half = n_rot / 2;
    for (int h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            const float c = cs[2 * i], s = cs[2 * i + 1];
            const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            const float x0 = x[a], x1 = x[b];
            x[a] = x0 * c - x1 * s;
            x[b] = x0 * s + x1 * c;
        }
    }
}

/* ------------------------------------------------------------ panel layout */

int cb_pack_wanted(int simd, int type) {
    if (simd == CB_SIMD_AVX512) return cb_pack_block_bytes(type) != 0;
    if (simd == CB_SIMD_AVX2) return type != CB_TYPE_Q8_0 && cb_pack_block_bytes(type) != 0;
    return 0;
}

void cb_q8_offsets(const cb_block_q8 *xq, int64_t n, int32_t k, int32_t *out) {
    for (int64_t i = 0; i < n; i++) {
        int32_t sum = 0;
        for (int j = 0; j < CB_QK; j++) sum += xq[i].qs[j];
        out[i] = k * sum;
    }
}

size_t cb_pack_bytes(int type, int64_t n_in, int64_t n_out) {
    const size_t pb = cb_pack_block_bytes(type);
    const int blk = cb_type_block(type);
    if (!pb || !blk || n_in <= 0 || n_out <= 0 || n_in % blk || n_in / CB_QK > CB_PACK_MAX_BLOCKS) return 0;
    const size_t panels = (size_t)((n_out + CB_PANEL - 1) / CB_PANEL);
    return panels * (size_t)(n_in / blk) * pb;
}

/* Output j's block (file layout, blk) into its lanes of one panel block pk. */
static void pack_legacy_block(int type, const uint8_t *blk, int j, uint8_t *pk) {
    memcpy(pk + 2 * j, blk, 2);  /* d */
    switch (type) {
    case CB_TYPE_Q8_0:
        for (int g = 0; g < 8; g++)
            for (int i = 0; i < 4; i++) pk[32 + 64 * g + 4 * j + i] = (uint8_t)(blk[2 + 4 * g + i] ^ 0x80u);
        break;
    case CB_TYPE_Q5_0: {
        uint32_t qh, regrouped = 0;
        memcpy(&qh, blk + 2, 4);
        for (int c = 0; c < 4; c++) {
            const uint32_t lo = (qh >> (4 * c)) & 0xF, hi = (qh >> (16 + 4 * c)) & 0xF;
            regrouped |= (lo | hi << 4) << (8 * c);
        }
        memcpy(pk + 32 + 4 * j, &regrouped, 4);
        for (int c = 0; c < 4; c++) memcpy(pk + 96 + 64 * c + 4 * j, blk + 6 + 4 * c, 4);
        break;
    }
    default: {  /* Q4_0, Q4_1 */
        const size_t qoff = type == CB_TYPE_Q4_1 ? 4 : 2;  /* qs after d (and m) */
        uint8_t *q = pk + (type == CB_TYPE_Q4_1 ? 64 : 32);
        if (type == CB_TYPE_Q4_1) memcpy(pk + 32 + 2 * j, blk + 2, 2);  /* m */
        for (int c = 0; c < 4; c++) memcpy(q + 64 * c + 4 * j, blk + qoff + 4 * c, 4);
        break;
    }
    }
}

void cb_pack_weight(const cb_weight *w, void *dst) {
    const size_t pb = cb_pack_block_bytes(w->type);
    if (!pb) return;
    const int64_t nb = w->n_in / cb_type_block(w->type);
    const int64_t panels = (w->n_out + CB_PANEL - 1) / CB_PANEL;
    const size_t bsz = cb_type_block_bytes(w->type);
    uint8_t *out = dst;
    memset(out, 0, cb_pack_bytes(w->type, w->n_in, w->n_out));  /* padding lanes */
    for (int64_t p = 0; p < panels; p++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *pk = out + ((size_t)p * (size_t)nb + (size_t)b) * pb;
            for (int j = 0; j < CB_PANEL; j++) {
                const int64_t o = p * CB_PANEL + j;
                if (o >= w->n_out) break;
                const uint8_t *blk = (const uint8_t *)w->data + (size_t)o * w->row_bytes + (size_t)b * bsz;
                if (cb_kq_is_kquant(w->type)) cb_kq_pack_block(w->type, blk, j, pk);
                else pack_legacy_block(w->type, blk, j, pk);
            }
        }
}

void *cb_big_alloc(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    const size_t align = bytes >= huge ? huge : 64;
    if (bytes > SIZE_MAX - align) return NULL;
    const size_t size = bytes ? (bytes + align - 1) & ~(align - 1) : 64;
    void *p = aligned_alloc(align, size);
    if (!p) return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (align == huge) madvise(p, size, MADV_HUGEPAGE);  /* advice only: 4 KiB pages still work */
#endif
    memset(p, 0, size);
    return p;
}

void *cb_pack_alloc(cb_weight *w) {
    w->packed = NULL;
    const size_t bytes = cb_pack_bytes(w->type, w->n_in, w->n_out);
    void *p = bytes ? cb_big_alloc(bytes) : NULL;
    if (!p) return NULL;
    cb_pack_weight(w, p);
    w->packed = p;
    return p;
}

/* ------------------------------------------------------------- test hook */

int cb_kernel_matmul(int type, const void *w, int n_out, int n_in,
                     const float *x, int n_rows, float *y, int simd, int n_threads) {
    if (!cb_type_supported(type)) return CB_ERR_UNSUPPORTED;
    if (!w || !x || !y || n_out <= 0 || n_in <= 0 || n_rows <= 0 || n_threads <= 0 || n_threads > 256)
        return CB_ERR_ARG;
    if (n_in % cb_type_block(type) != 0) return CB_ERR_ARG;
    if (simd == CB_SIMD_AUTO) simd = cb_simd_detect();
    if (simd < CB_SIMD_SCALAR || simd > CB_SIMD_AVX512) return CB_ERR_ARG;
    const cb_kernels *k = cb_kernels_get(simd);
    if (!k) return CB_ERR_UNSUPPORTED;
    cb_weight wt;
    wt.type = type; wt.n_in = n_in; wt.n_out = n_out; wt.data = w;
    wt.row_bytes = cb_type_size(type, n_in);
    wt.packed = NULL;
    /* As the engine does at model load: AVX-512 reads the panel layout, AVX2
     * that of the K-quants (cb_pack_wanted). */
    void *packed = NULL;
    if (cb_pack_wanted(simd, type) && cb_pack_bytes(type, n_in, n_out)) {
        packed = cb_pack_alloc(&wt);
        if (!packed) return CB_ERR_NOMEM;
    }
    const size_t sbytes = cb_matmul_scratch(n_in, n_rows);
    void *scratch = aligned_alloc(64, sbytes);
    if (!scratch) { free(packed); return CB_ERR_NOMEM; }
    cb_pool *pool = NULL;
    if (n_threads > 1) {
        pool = cb_pool_new(n_threads);
        if (!pool) { free(scratch); free(packed); return CB_ERR_NOMEM; }
    }
    cb_matmul(pool, k, &wt, x, n_rows, y, scratch);
    cb_pool_free(pool);
    free(scratch);
    free(packed);
    return CB_OK;
}
