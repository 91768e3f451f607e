/*
 * kernels_scalar.c — portable C kernels: always available, always tested, and
 * the readable statement of what every SIMD level computes.
 *
 * Batch invariance: every (r, o) result comes from one call of one dot
 * function with the same arguments, whatever the batch or thread split, so
 * the compiler's choices (including FMA contraction on targets where the
 * build contracts) are the same for every tiling.
 */
#include "kernels.h"
#include "colibri.h"

#include <math.h>
#include <string.h>

static inline uint16_t rd16(const void *p) { uint16_t v; memcpy(&v, p, 2); return v; }

/* Activations -> blocks of int8 with d = max|x| / 127 (a zero block stays all
 * zeros with d = 0), s = d * sum(q). */
static void quantize_q8_scalar(const float *x, cb_block_q8 *q, int64_t n) {
    for (int64_t b = 0; b < n / CB_QK; b++) {
        const float *xb = x + b * CB_QK;
        float id;
        const float d = cb_q8_scale(xb, CB_QK, &id);
        int sum = 0;
        for (int i = 0; i < CB_QK; i++) {
            const int v = cb_round_q8(xb[i] * id);
            q[b].qs[i] = (int8_t)v;
            sum += v;
        }
        q[b].d = d;
        q[b].s = d * (float)sum;
    }
}

/* ---- one (row, activation row) dot per type ----
 * Canonical order for quantized types: acc += isum_b * (dw_b * dx_b), then
 * (Q4_1) acc += m_b * s_b, block by block. */

static float dot_q4_0(const uint8_t *w, const cb_block_q8 *x, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const cb_block_q4_0 *blk = (const cb_block_q4_0 *)(w + (size_t)b * sizeof(cb_block_q4_0));
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            isum += ((blk->qs[j] & 0x0F) - 8) * x[b].qs[j];
            isum += ((blk->qs[j] >> 4) - 8) * x[b].qs[j + 16];
        }
        acc += (float)isum * (cb_f16_to_f32(rd16(&blk->d)) * x[b].d);
    }
    return acc;
}

static float dot_q4_1(const uint8_t *w, const cb_block_q8 *x, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const cb_block_q4_1 *blk = (const cb_block_q4_1 *)(w + (size_t)b * sizeof(cb_block_q4_1));
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            isum += (blk->qs[j] & 0x0F) * x[b].qs[j];
            isum += (blk->qs[j] >> 4) * x[b].qs[j + 16];
        }
        acc += (float)isum * (cb_f16_to_f32(rd16(&blk->d)) * x[b].d);
        acc += cb_f16_to_f32(rd16(&blk->m)) * x[b].s;
    }
    return acc;
}

/* Q5_0 (one = 0) and Q5_1 (one = 1): 5-bit quants, the 5th bit from qh. */
static float dot_q5(const int one, const uint8_t *w, const cb_block_q8 *x, int64_t nb) {
    const size_t bsz = one ? sizeof(cb_block_q5_1) : sizeof(cb_block_q5_0);
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * bsz;
        uint32_t qh;
        memcpy(&qh, blk + 2 + 2 * one, 4);
        const uint8_t *qs = blk + 6 + 2 * one;
        const int off = one ? 0 : 16;
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            isum += (((qs[j] & 0x0F) | (int)((qh >> j) & 1) << 4) - off) * x[b].qs[j];
            isum += (((qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4) - off) * x[b].qs[j + 16];
        }
        acc += (float)isum * (cb_f16_to_f32(rd16(blk)) * x[b].d);
        if (one) acc += cb_f16_to_f32(rd16(blk + 2)) * x[b].s;
    }
    return acc;
}

static float dot_q8_0(const uint8_t *w, const cb_block_q8 *x, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const cb_block_q8_0 *blk = (const cb_block_q8_0 *)(w + (size_t)b * sizeof(cb_block_q8_0));
        int isum = 0;
        for (int j = 0; j < CB_QK; j++) isum += blk->qs[j] * x[b].qs[j];
        acc += (float)isum * (cb_f16_to_f32(rd16(&blk->d)) * x[b].d);
    }
    return acc;
}

/* Float weights: 8 interleaved partial sums, combined in a fixed tree. */
#define FLOAT_DOT(NAME, LOADW)                                                  \
static float NAME(const uint8_t *w, const float *x, int64_t n) {                \
    float a[8] = {0};                                                           \
    int64_t i = 0;                                                              \
    for (; i + 8 <= n; i += 8)                                                  \
        for (int j = 0; j < 8; j++) a[j] += LOADW(w, i + j) * x[i + j];         \
    for (int j = 0; i + j < n; j++) a[j] += LOADW(w, i + j) * x[i + j];         \
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));   \
}

static inline float ld_f32(const uint8_t *w, int64_t i) { float v; memcpy(&v, w + 4 * i, 4); return v; }
static inline float ld_f16(const uint8_t *w, int64_t i) { return cb_f16_to_f32(rd16(w + 2 * i)); }
static inline float ld_bf16(const uint8_t *w, int64_t i) { return cb_bf16_to_f32(rd16(w + 2 * i)); }

FLOAT_DOT(dot_f32w, ld_f32)
FLOAT_DOT(dot_f16w, ld_f16)
FLOAT_DOT(dot_bf16w, ld_bf16)

static void matmul_rows_scalar(const cb_weight *w, const cb_block_q8 *xq, const float *xf,
                               int n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t n_in = w->n_in, nb = n_in / CB_QK;
    /* Weight row outer, activation rows inner: the row stays in L1. */
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *wr = (const uint8_t *)w->data + (size_t)o * w->row_bytes;
        for (int r = 0; r < n_rows; r++) {
            float v;
            switch (w->type) {
            case CB_TYPE_Q4_0: v = dot_q4_0(wr, xq + r * nb, nb); break;
            case CB_TYPE_Q4_1: v = dot_q4_1(wr, xq + r * nb, nb); break;
            case CB_TYPE_Q5_0: v = dot_q5(0, wr, xq + r * nb, nb); break;
            case CB_TYPE_Q5_1: v = dot_q5(1, wr, xq + r * nb, nb); break;
            case CB_TYPE_Q8_0: v = dot_q8_0(wr, xq + r * nb, nb); break;
            case CB_TYPE_F32:  v = dot_f32w(wr, xf + r * n_in, n_in); break;
            case CB_TYPE_F16:  v = dot_f16w(wr, xf + r * n_in, n_in); break;
            case CB_TYPE_BF16: v = dot_bf16w(wr, xf + r * n_in, n_in); break;
            default: v = 0.0f; break;
            }
            y[r * ldy + o] = v;
        }
    }
}

static float dot_f32_scalar(const float *a, const float *b, int64_t n) {
    return dot_f32w((const uint8_t *)a, b, n);
}

static void axpy_f32_scalar(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void attn_scalar(const float *q, int g, int hd, const void *K, const void *V, size_t stride, int kv_f16,
                        int n_pos, float scale, float *scores, float *out) {
    cb_attn_generic(dot_f32_scalar, axpy_f32_scalar, cb_f16_row_to_f32, q, g, hd, K, V, stride, kv_f16, n_pos,
                    scale, scores, out);
}

static const cb_kernels table = {
    CB_SIMD_SCALAR, quantize_q8_scalar, matmul_rows_scalar, attn_scalar, cb_f32_row_to_f16,
    cb_rmsnorm_generic, cb_swiglu_generic, cb_geglu_generic, cb_rope_generic, cb_argmax_generic
};

const cb_kernels *cb_kernels_scalar_table(void);
const cb_kernels *cb_kernels_scalar_table(void) { return &table; }
