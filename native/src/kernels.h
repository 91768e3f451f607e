/*
 * kernels.h — tensor types, the thread pool, and the SIMD kernels behind a
 * per-level function table chosen at run time.
 *
 * Batch invariance (DESIGN invariant 1) is a property of these kernels: the
 * value written to y[r][o] depends only on row r of x and row o of w, never
 * on how many rows are in the batch, which thread computed it, or how the
 * work was tiled.  Every kernel reduces in one fixed order per (r, o): a tile
 * that shares weight loads across rows must do per row exactly what the
 * single-row path does.  Threads split output columns (o), never a reduction.
 */
#ifndef CB_KERNELS_H
#define CB_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* GGML tensor type ids (as stored in GGUF). */
enum {
    CB_TYPE_F32 = 0, CB_TYPE_F16 = 1, CB_TYPE_Q4_0 = 2, CB_TYPE_Q4_1 = 3,
    CB_TYPE_Q5_0 = 6, CB_TYPE_Q5_1 = 7, CB_TYPE_Q8_0 = 8, CB_TYPE_BF16 = 30
};

#define CB_QK 32  /* elements per block for Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 and activations */

/* GGUF block layouts (packed, little-endian, as written by ggml). */
typedef struct { uint16_t d; uint8_t qs[16]; } cb_block_q4_0;              /* w = d * (q - 8), q in low nibble for i<16, high for i>=16 */
typedef struct { uint16_t d, m; uint8_t qs[16]; } cb_block_q4_1;           /* w = d * q + m */
typedef struct { uint16_t d; int8_t qs[32]; } cb_block_q8_0;               /* w = d * q */
/* Q5_0 / Q5_1: the 4 low bits as Q4_0 / Q4_1, the 5th bit of element j in bit j of qh. */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } cb_block_q5_0;    /* w = d * (q - 16), q in 0..31 */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } cb_block_q5_1; /* w = d * q + m */

/* An unaligned, aliasing 32-bit load (the SIMD kernels read 4 activation
 * bytes or an int16 pair in place), so that set1(*p) compiles to a broadcast
 * from memory or folds into an instruction's {1toN} operand instead of a
 * scalar load plus a GPR broadcast on a vector port. */
typedef int32_t cb_i32u __attribute__((may_alias, aligned(1)));

/* CB_BCAST_DOT(attr, name, vec, insn, lanes, intrin, set1) defines
 * vec name(vec acc, vec w, const cb_i32u *x): acc += INSN(w, the 32 bits at x
 * broadcast to every lane), the broadcast folded into the instruction's
 * memory operand ({1toLANES}).  Compilers emit a separate vpbroadcastd for
 * intrin(acc, w, set1(*x)), and at 8 rows the AVX-512 kernels are bound by
 * issued uops (measured: 8-row matmul ~7% faster folded). */
#if defined(__GNUC__) || defined(__clang__)
#define CB_BCAST_DOT(attr, name, vec, insn, lanes, intrin, set1)                              \
    attr static inline __attribute__((always_inline)) vec name(vec acc, vec w, const cb_i32u *x) { \
        __asm__(insn " %2%{1to" #lanes "%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*x));          \
        return acc;                                                                           \
    }
#else
#define CB_BCAST_DOT(attr, name, vec, insn, lanes, intrin, set1)                              \
    attr static inline vec name(vec acc, vec w, const cb_i32u *x) { return intrin(acc, w, set1(*x)); }
#endif

/* Activations quantized to int8, one block per 32 inputs (our own layout,
 * never stored in files). */
typedef struct {
    float  d;        /* scale: x ~= d * qs */
    float  s;        /* d * sum(qs), used by the offset terms of types with a min (Q4_1, Q5_1, K-quants) */
    int8_t qs[CB_QK];
} cb_block_q8;

/* Activations for the K-quant matmuls Q4_K, Q5_K and Q6_K (llama.cpp's Q8_K
 * shape): one float scale per 256 values, so those kernels take ONE float
 * step per (activation row, output, 256 weights) and do everything inside a
 * super-block in exact integers (see kquants.h).  Quantized as cb_block_q8
 * is (d = max|x| / 127, round to nearest even), over 256 values. */
typedef struct {
    int8_t  qs[256];    /* first, and the block 5 cache lines: in a 64-byte aligned
                         * buffer every block's quants start a line (AMX tile rows
                         * that straddle two lines load 6x slower) */
    float   d;          /* scale: x ~= d * qs */
    int16_t bs16[16];   /* sum of qs[16i .. 16i + 16) (|.| <= 2032): Q6_K's -32 offsets */
    int16_t bs32[8];    /* sum of qs[32j .. 32j + 32) (|.| <= 4064): Q4_K / Q5_K mins */
    int8_t  pad[12];
} cb_block_q8k;         /* 320 bytes */
_Static_assert(sizeof(cb_block_q8k) == 320, "cb_block_q8k: 5 cache lines");

/* Activation formats a matmul's weight type reads (cb_type_act). */
enum { CB_ACT_Q8 = 1, CB_ACT_Q8K = 2 };

/* Scalar conversions (bit-exact with ggml's). */
float    cb_f16_to_f32(uint16_t h);
uint16_t cb_f32_to_f16(float f);
float    cb_bf16_to_f32(uint16_t h);

/* Block size in elements and bytes per block for a type (0 if unknown). */
int    cb_type_block(int type);
size_t cb_type_block_bytes(int type);
/* 1 if the engine can compute with this type. */
int    cb_type_supported(int type);

/* ------------------------------------------------------------ thread pool */

typedef struct cb_pool cb_pool;
/* Work item: called once per thread with ith in [0, nth). */
typedef void (*cb_pool_fn)(void *ctx, int ith, int nth);

/* n_threads counts the calling thread, which runs ith = 0.  Workers spin
 * briefly between runs (decode issues hundreds of runs per token) and then
 * sleep on a condition variable. */
cb_pool *cb_pool_new(int n_threads);
void     cb_pool_free(cb_pool *pool);          /* NULL is fine */
int      cb_pool_size(const cb_pool *pool);
/* Run fn on every thread and return when all have finished. */
void     cb_pool_run(cb_pool *pool, cb_pool_fn fn, void *ctx);
/* Total time the caller has waited for workers after finishing its own share
 * (thread synchronisation cost), in ms, over the pool's life. */
double   cb_pool_wait_ms(const cb_pool *pool);

/* ------------------------------------------------------------ big buffers */

/* A zeroed buffer, 64-byte aligned; from 2 MiB on it is 2 MiB-aligned and
 * asks Linux for transparent huge pages.  Decode streams every weight once
 * per token and attention walks each slot's KV: with 4 KiB pages every
 * 4 KiB costs a TLB miss and stops the hardware prefetcher (measured on
 * SmolLM2-135M, 2 threads: one stream 3.25 -> 2.63 ms per token).  Release
 * with free(); NULL when out of memory. */
void *cb_big_alloc(size_t bytes);

/* ---------------------------------------------------------------- matmul */

/* A weight matrix: n_out rows of n_in elements of `type`, row-major. */
typedef struct {
    int         type;
    int64_t     n_in;       /* row length (GGUF ne[0]) */
    int64_t     n_out;      /* rows (GGUF ne[1]) */
    const void *data;
    size_t      row_bytes;  /* cb_type_size(type, n_in) */
    const void *packed;     /* the same matrix in the panel layout below, or NULL */
} cb_weight;

/* Panel layout of quantized matrices, built once at model load for the
 * AVX-512 and AVX2 kernels (the scalar kernels read `data`).
 *
 * Why: in the file layout the 32 weights of one block of one output row are
 * contiguous, so an int8 dot product ends with 32 partial sums of ONE output
 * spread over a vector, and every block needs a horizontal fold plus three
 * float ops per 64 multiply-adds: at a few activation rows (batched decode,
 * draft verification) the kernel is bound by those float ops, not by memory.
 * In the panel layout one 32-bit lane holds 4 consecutive weights of one
 * output, and 16 lanes hold 16 outputs, so a block of 16 outputs is 8
 * vpdpbusd that leave one finished integer sum per output in each lane: the
 * float work per block drops from 8 vectors to 1 and is shared by 16 outputs.
 *
 * Outputs are grouped in panels of CB_PANEL rows (the last one padded), and a
 * panel stores its blocks in order (32 weights for the legacy types, a
 * 256-weight super-block for the K-quants: see kquants.h), each as
 * cb_pack_block_bytes(type) bytes:
 *   d[16]   f16 scales of the 16 outputs (32 bytes),
 *   m[16]   f16 mins (Q4_1 only, 32 bytes),
 *   qh[16]  Q5_0 only: each output's 32 fifth bits, regrouped so that byte c
 *           of the 32-bit word holds the bits of elements 4c..4c+3 (bits
 *           0..3) and 16+4c..16+4c+3 (bits 4..7): the elements of chunk c
 *           below (64 bytes),
 *   qs      Q4_0 / Q4_1 / Q5_0: 4 chunks x 16 outputs x 4 bytes, chunk c
 *           holding bytes 4c..4c+3 of each output's qs (low nibbles =
 *           elements 4c..4c+3, high nibbles = elements 16+4c..16+4c+3);
 *           Q8_0: 8 groups x 16 outputs x 4 bytes, group g holding elements
 *           4g..4g+3 as unsigned bytes q + 128.
 * Panel p of a matrix starts at p * (n_in / block) * cb_pack_block_bytes(type).
 * Every byte of the file's blocks is kept, only moved: the packed matrix has
 * the file's size (plus the padding of the last panel). */
#define CB_PANEL 16
/* The scalar activation quantizers' two steps, shared by cb_block_q8 (32
 * values) and cb_block_q8k (256): every SIMD level must round as these do.
 *
 * Round to nearest, ties to even, for |v| < 2^22: adding and subtracting
 * 1.5 * 2^23 leaves the rounded integer (default rounding mode), which is what
 * the SIMD paths' cvtps2dq does.  The clamp also maps NaN to a finite value. */
static inline int cb_round_q8(float v) {
    if (!(v > -127.0f)) v = -127.0f;
    if (!(v < 127.0f)) v = 127.0f;
    const float t = v + 12582912.0f;  /* IEEE semantics: not folded without -ffast-math */
    return (int)(t - 12582912.0f);
}

/* Scale d = max|x| / 127 of n values, and *id = 1 / d (0 for an all-zero
 * block, which then quantizes to zeros with d = 0). */
static inline float cb_q8_scale(const float *x, int n, float *id) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        if (a > amax) amax = a;
    }
    const float d = amax / 127.0f;
    *id = d != 0.0f ? 1.0f / d : 0.0f;
    return d;
}

/* Rows longer than this many 32-blocks (131072 inputs) keep the file layout
 * only (the AVX-512 kernels size per-call stack buffers by it). */
#define CB_PACK_MAX_BLOCKS 4096

/* Bytes per (panel, block) for a type, 0 if the type has no panel layout
 * (inline: a compile-time constant inside the kernels). */
static inline size_t cb_pack_block_bytes(int type) {
    switch (type) {
    case CB_TYPE_Q4_0: return 32 + 256;
    case CB_TYPE_Q4_1: return 64 + 256;
    case CB_TYPE_Q5_0: return 32 + 64 + 256;
    case CB_TYPE_Q8_0: return 32 + 512;
    case 12 /* Q4_K */: return 16 * 144;
    case 13 /* Q5_K */: return 16 * 176;
    case 14 /* Q6_K */: return 16 * 210;
    default: return 0;
    }
}
/* 1 if the kernels of SIMD level `simd` read matrices of `type` in the
 * panel layout: every packable type at AVX-512, all but Q8_0 at AVX2 (there
 * as two halves of 8 outputs per panel), none at scalar. */
int cb_pack_wanted(int simd, int type);
/* out[i] = k * (sum of the 32 activation bytes of xq[i]) for n blocks: the
 * exact starts of the panel kernels' integer sums for weights stored
 * unsigned (Q4_0: k = -8, Q5_0: -16, Q8_0 as q + 128: -128). */
void cb_q8_offsets(const cb_block_q8 *xq, int64_t n, int32_t k, int32_t *out);
/* Bytes of the panel layout of a type's n_out x n_in matrix (0: none,
 * including rows past CB_PACK_MAX_BLOCKS). */
size_t cb_pack_bytes(int type, int64_t n_in, int64_t n_out);
/* Write w (file layout, w->data) in the panel layout into dst
 * (cb_pack_bytes() bytes).  Pure byte shuffles: values are unchanged. */
void   cb_pack_weight(const cb_weight *w, void *dst);
/* Allocate and fill w's panel layout and point w->packed at it.  Returns the
 * buffer (the caller frees it), or NULL with w->packed NULL when the type has
 * no panel layout or memory ran out.  (A model packs all its matrices into
 * one block instead: model.c.) */
void  *cb_pack_alloc(cb_weight *w);
/* 1 if the panel kernels prefetch the panels of `type` ahead in a matmul
 * of n_rows activation rows (the policy of cb_prefetch_mode, colibri.h);
 * asked once per matmul call. */
int    cb_prefetch_panels(int type, int n_rows);
/* 1 if the CPU runs AVX-512 on a 256-bit datapath, each 512-bit operation
 * as two halves (AMD Zen 4); cached after the first call. */
int    cb_cpu_zmm_split(void);

/* Function table of one SIMD level. */
typedef struct {
    int simd;  /* cb_simd */
    /* Quantize n (multiple of 32) floats into n/32 blocks. */
    void  (*quantize_q8)(const float *x, cb_block_q8 *q, int64_t n);
    /* y[o] = dot(w row o, x) for o in [o0, o1), for n_rows rows of activations.
     * xq: n_rows * (n_in/32) blocks (quantized types) ; xf: n_rows * n_in floats
     * (float types).  y row stride ldy. */
    void  (*matmul_rows)(const cb_weight *w, const cb_block_q8 *xq, const float *xf,
                         int n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1);
    /* Attention of g query heads that share one KV head (a GQA group) over
     * cached positions [0, n_pos):
     *   out[j] = sum_p softmax_p(scale * dot(q[j], K[p])) * V[p]
     * q, out: g rows of hd floats; K, V: n_pos rows `stride` elements
     * apart, f16 (kv_f16) or f32; scores: scratch of g * n_pos floats.
     * Head j's result depends only on q[j], K, V and n_pos (one fixed
     * order), never on g or on the thread. */
    void  (*attn)(const float *q, int g, int hd, const void *K, const void *V, size_t stride, int kv_f16,
                  int n_pos, float scale, float *scores, float *out);
    /* y[i] = f16(x[i]) (round to nearest even), for the KV cache. */
    void  (*to_f16)(const float *x, uint16_t *y, int64_t n);
    /* o = x * (1 / sqrt(mean(x^2) + eps)) * w over n floats, the sum of
     * squares in double; o may be x. */
    void  (*rmsnorm)(const float *x, const float *w, float *o, int n, float eps);
    /* g = silu(g) * u = g / (1 + e^-g) * u over n floats (the SwiGLU gate). */
    void  (*swiglu)(float *g, const float *u, int64_t n);
    /* g = gelu(g) * u over n floats, GELU in its tanh form (gemma's GEGLU
     * gate), computed as the equal sigmoid x / (1 + e^(-2 z)) with
     * z = sqrt(2/pi) (x + 0.044715 x^3): 0.5 (1 + tanh z) without the
     * cancellation of 1 + tanh z at negative x, and one exp per element. */
    void  (*geglu)(float *g, const float *u, int64_t n);
    /* RoPE in place on n_heads rows of head_dim floats: the first n_rot
     * dimensions of each rotate in pairs (i, i + n_rot/2) when neox, else
     * (2i, 2i + 1), pair i by cs[2i] = cos, cs[2i + 1] = sin:
     *   a' = a * cos - b * sin,  b' = a * sin + b * cos
     * each product rounded, then the sum (no fused multiply-add), so every
     * level gives the same bits. */
    void  (*rope)(float *v, const float *cs, int n_heads, int head_dim, int n_rot, int neox);
    /* If some x[i] (i < n) is > *max, set *max to the largest and *idx to
     * base + the first i holding it; NaN never wins.  Scanning ranges in any
     * order and keeping the smaller idx on equal maxima gives the first index
     * of the maximum of the whole row (a greedy token). */
    void  (*argmax)(const float *x, int64_t n, int64_t base, float *max, int64_t *idx);
} cb_kernels;

/* GELU-tanh's constants as every level's geglu uses them: 2 sqrt(2/pi) and
 * the cubic's coefficient. */
#define CB_GELU_2K 1.5957691216057307f
#define CB_GELU_A  0.044715f

/* The scalar rmsnorm, swiglu, geglu and rope (rmsnorm and rope also AVX2's). */
void cb_rmsnorm_generic(const float *x, const float *w, float *o, int n, float eps);
void cb_swiglu_generic(float *g, const float *u, int64_t n);
void cb_geglu_generic(float *g, const float *u, int64_t n);
void cb_rope_generic(float *v, const float *cs, int n_heads, int head_dim, int n_rot, int neox);
void cb_argmax_generic(const float *x, int64_t n, int64_t base, float *max, int64_t *idx);

/* attn built from a level's dot product, y += a * x and f16 row conversion
 * (scalar and AVX2).  f16 rows are converted to floats one at a time into a
 * stack buffer: hd <= CB_MAX_HEAD_DIM (the model loader checks). */
#define CB_MAX_HEAD_DIM 512
typedef float (*cb_dot_fn)(const float *a, const float *b, int64_t n);
typedef void  (*cb_axpy_fn)(float *y, float a, const float *x, int64_t n);
typedef void  (*cb_f16_row_fn)(const uint16_t *x, float *y, int64_t n);
void cb_attn_generic(cb_dot_fn dot, cb_axpy_fn axpy, cb_f16_row_fn from_f16, const float *q, int g, int hd,
                     const void *K, const void *V, size_t stride, int kv_f16, int n_pos, float scale,
                     float *scores, float *out);
/* Scalar f16 rows (ggml's conversions). */
void cb_f16_row_to_f32(const uint16_t *x, float *y, int64_t n);
void cb_f32_row_to_f16(const float *x, uint16_t *y, int64_t n);

/* Table for a level, or NULL if the CPU (or this build) lacks it. */
const cb_kernels *cb_kernels_get(int simd);

/* Bytes of scratch cb_matmul needs for n_rows rows of n_in inputs (room
 * for both activation formats). */
size_t cb_matmul_scratch(int64_t n_in, int n_rows);

/* Quantized activations of n_rows rows of n_in inputs in the formats `fmt`
 * (CB_ACT_* bits) live in one buffer: the cb_block_q8 blocks (if fmt has
 * CB_ACT_Q8) at offset 0, n_rows x n_in/32 of them, then the cb_block_q8k
 * blocks (if CB_ACT_Q8K) at cb_act_q8k_offset, n_rows x n_in/256.  Whoever
 * quantizes (cb_quantize_rows) and the matmul that reads agree on fmt by
 * both taking it from cb_act_formats of the same weights. */
size_t cb_act_q8k_offset(int64_t n_in, int n_rows, int fmt);
/* Bytes of that buffer (<= cb_matmul_scratch(n_in, n_rows)). */
size_t cb_act_bytes(int64_t n_in, int n_rows, int fmt);
/* The format a weight type reads: 0 (floats), CB_ACT_Q8 or CB_ACT_Q8K. */
int cb_type_act(int type);
/* The union of cb_type_act over n_w weights. */
int cb_act_formats(const cb_weight *const *w, int n_w);

/* y[n_rows][w->n_out] = x[n_rows][w->n_in] * w^T, threads over output rows.
 * scratch: cb_matmul_scratch() bytes, 64-byte aligned.  Allocates nothing. */
void cb_matmul(cb_pool *pool, const cb_kernels *k, const cb_weight *w,
               const float *x, int n_rows, float *y, void *scratch);

/* Up to this many weights share one cb_matmul_multi pool run (more are split). */
#define CB_MATMUL_MULTI_MAX 8

/* y[i][n_rows][w[i]->n_out] = x[n_rows][n_in] * w[i]^T for i < n_w, as ONE
 * pool run with one activation quantization per format shared by every
 * weight (e.g. Q, K and V; or FFN gate and up).  Every w[i] must have the
 * same n_in.  Each y[i] is bit-identical to cb_matmul(w[i]) (same kernels,
 * same per-(row, output) order); only the synchronisation is saved: decode
 * issues a pool run per matmul, and at 2 threads each costs a few
 * microseconds.  xq: x already quantized in the formats
 * cb_act_formats(w, n_w) (cb_quantize_rows, e.g. by the task that produced
 * x, split by rows over the threads), or NULL to quantize here; float
 * weights always read x.
 * scratch: cb_matmul_scratch(n_in, n_rows) bytes.  Allocates nothing. */
void cb_matmul_multi(cb_pool *pool, const cb_kernels *k, const cb_weight *const *w, int n_w,
                     const float *x, const void *xq, int n_rows, float *const *y, void *scratch);

/* cb_matmul of one weight that also finds, for each row r, the first index
 * of its largest output (NaN never wins): idx[r] (-1 when every output is
 * -inf or NaN) and max[r].  Each thread scans the outputs it has just
 * written, while they are in its cache, instead of a second pass over
 * n_rows x n_out floats (the LM head: a greedy token per row).
 * part_max, part_idx: n_rows scratch entries per pool thread (one thread
 * without a pool). */
void cb_matmul_argmax(cb_pool *pool, const cb_kernels *k, const cb_weight *w, const float *x, int n_rows,
                      float *y, void *scratch, float *part_max, int64_t *part_idx, float *max, int64_t *idx);

/* Rows [r0, r1) of x ([n_rows][n_in], n_in a multiple of 32; of 256 when
 * fmt has CB_ACT_Q8K) quantized into the buffer q in the formats fmt (the
 * layout above; k->quantize_q8 and cb_kq_quantize_q8k): the xq of
 * cb_matmul_multi. */
void cb_quantize_rows(const cb_kernels *k, const float *x, void *q, int64_t n_in, int n_rows, int r0, int r1,
                      int fmt);

/* 1: matmuls with weights of this type read quantized activations (the xq
 * of cb_matmul_multi, format cb_type_act); 0: they read floats. */
int cb_type_wants_q8(int type);

/* Dequantize row `row` of w into out[n_in] (embedding lookup; reference path). */
void cb_weight_row_f32(const cb_weight *w, int64_t row, float *out);

#endif
