/*
 * kquants.h — llama.cpp's K-quant weight types Q2_K ... Q6_K ("k-quants":
 * super-blocks of 256 weights with sub-block scales), so that Q4_K_M /
 * Q5_K_M / Q6_K / Q3_K_M / Q2_K GGUF files load.
 *
 * Q4_K, Q5_K and Q6_K dot products run against cb_block_q8k activations
 * (kernels.h: llama.cpp's Q8_K shape, one float scale dx per 256 values,
 * int16 sums of 16 and 32 values), so everything inside a super-block is
 * exact integer arithmetic and there is ONE float step per (activation row,
 * output, super-block):
 *     Q4_K / Q5_K:  isum = sum_j sc_j * sum_l q_jl * x_jl      (j: 8 sub-blocks of 32)
 *                   msum = sum_j m_j * bs32_j
 *                   acc += (d * (float)isum - dmin * (float)msum) * dx
 *     Q6_K:         isum = sum_i sc_i * sum_l (q_il - 32) * x_il   (i: 16 sub-blocks of 16)
 *                   acc += (d * (float)isum) * dx
 * each product and difference rounded on its own (no fused multiply-add
 * anywhere: cb_kq_step_min / cb_kq_step below, and the same operations in
 * the same order in the SIMD kernels), super-blocks in order.  The integer
 * parts are exact however a level computes them, so every level (scalar,
 * AVX2, AVX-512) gives the same bits, and since nothing depends on the tile,
 * the work split or the thread, a row's outputs are bit-identical alone or
 * in any batch.  (This relies on no FMA contraction of the scalar steps:
 * -std=c11 implies -ffp-contract=off with GCC; clang's default "on" only
 * contracts within one expression, and the steps are separate statements.)
 *
 * int32 bounds (|x| <= 127, so |bs32| <= 4064, |bs16| <= 2032):
 *     Q4_K  |isum| <= 8 * 63 * 32*15*127 = 30.7e6; the AVX-512 kernel sums
 *           16 * isum (odd sub-blocks read as the high nibble in place, the
 *           even ones' scales times 16): <= 491.6e6 < 2^31;
 *     Q5_K  |isum| <= 8 * 63 * 32*31*127 = 63.5e6;
 *     Q6_K  |isum| <= 16 * 128 * 16*32*127 = 133.2e6, and the kernels that
 *           read unsigned q (0..63) and add -32 * sum_i sc_i * bs16_i after:
 *           partial sums <= 16*128*16*63*127 + 32*16*128*2032 = 395e6;
 *     msum  <= 8 * 63 * 4064 = 2.05e6.
 * isum above 2^24 rounds in the int -> float conversion (to nearest even,
 * as cvtdq2ps does): relative 6e-8, the same at every level.
 *
 * Q2_K and Q3_K keep reading cb_block_q8 (32 values per float scale) with
 * one float step per 32-value activation block (cb_kq_acc).
 *
 * Hook into kernels.c (the only places that know about these types):
 * type table entries via cb_kq_block_bytes / cb_kq_type_name, activation
 * formats through cb_type_act (kernels.c) and cb_kq_quantize_q8k, matmul
 * through cb_kq_matmul_rows, row dequantization through cb_kq_row_f32.
 */
#ifndef CB_KQUANTS_H
#define CB_KQUANTS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

enum { CB_TYPE_Q2_K = 10, CB_TYPE_Q3_K = 11, CB_TYPE_Q4_K = 12, CB_TYPE_Q5_K = 13, CB_TYPE_Q6_K = 14 };

#define CB_QK_K 256  /* weights per K-quant super-block */

/* GGUF block layouts (packed, little-endian, as ggml writes them). */
typedef struct {
    uint8_t  scales[16];   /* per 16 weights: low nibble scale, high nibble min */
    uint8_t  qs[64];       /* 2-bit quants: per 128-half, byte l bits 2k..2k+1 = element 32k + l */
    uint16_t d;            /* f16 super-block scale for the scales */
    uint16_t dmin;         /* f16 super-block scale for the mins */
} cb_block_q2_K;           /* w = d*sc*q - dmin*m, q in 0..3, 84 bytes */

typedef struct {
    uint8_t  hmask[32];    /* 3rd bit: bit (4h + k) of hmask[l] for element 128h + 32k + l; clear means -4 */
    uint8_t  qs[64];       /* low 2 bits, laid out as Q2_K */
    uint8_t  scales[12];   /* 16 signed 6-bit scales (value - 32), packed (see cb_kq3_scales) */
    uint16_t d;            /* f16 super-block scale */
} cb_block_q3_K;           /* w = d*sc*(q - (hbit ? 0 : 4)), 110 bytes */

typedef struct {
    uint16_t d;            /* f16 super-block scale for the 6-bit sub-block scales */
    uint16_t dmin;         /* f16 super-block scale for the 6-bit sub-block mins */
    uint8_t  scales[12];   /* 8 (scale, min) pairs of 6 bits, packed (see cb_kq_scale_min) */
    uint8_t  qs[128];      /* 4-bit quants: 32-byte group g holds sub-block 2g (low nibbles), 2g+1 (high) */
} cb_block_q4_K;           /* w = d*sc_j*q - dmin*m_j, 144 bytes */

typedef struct {
    uint16_t d, dmin;      /* as Q4_K */
    uint8_t  scales[12];   /* as Q4_K */
    uint8_t  qh[32];       /* 5th bit: bit j of qh[l] belongs to element l of sub-block j */
    uint8_t  qs[128];      /* low 4 bits, laid out as Q4_K */
} cb_block_q5_K;           /* w = d*sc_j*q - dmin*m_j, q in 0..31, 176 bytes */

typedef struct {
    uint8_t  ql[128];      /* low 4 bits: per 128-half, bytes 0..31 low/high nibbles = blocks 0/2, 32..63 = blocks 1/3 */
    uint8_t  qh[64];       /* high 2 bits: per 128-half, byte l bits 2k..2k+1 belong to block k element l */
    int8_t   scales[16];   /* signed 8-bit scale per 16 weights */
    uint16_t d;            /* f16 super-block scale */
} cb_block_q6_K;           /* w = d*sc*(q - 32), q in 0..63, 210 bytes */

/* Panel layout (see kernels.h; AVX-512 only) of one 256-weight super-block
 * of 16 outputs j, every byte (Q6_K: every bit) of the file blocks kept, only moved:
 *   Q4_K (2304 bytes): d[16] f16 | dmin[16] f16 | scales: byte k (0..11) of
 *     output j at 64 + 16k + j | qs: group g (0..3), chunk c (0..7) =
 *     file qs[32g + 4c .. 32g + 4c + 3] of output j at 256 + 512g + 64c + 4j
 *     (low nibbles: sub-block 2g, high: 2g + 1, elements 4c..4c+3).
 *   Q5_K (2816): as Q4_K, plus qh: chunk c (0..7) = file qh[4c..4c+3] at
 *     256 + 64c + 4j; qs moves to 768 + 512g + 64c + 4j.
 *   Q6_K (3360): d[16] f16 | scales: sub-block i (0..15, 16 weights) of
 *     output j at 32 + 16i + j | the 6-bit quants q (0..63, ggml's
 *     element order) regrouped bit by bit: group g (0..15) = chunks
 *     4 (g & 1) + v (v = 0..3, 4 weights each) of 32-weight block g / 2, three
 *     64-byte vectors A, B, C at 288 + 192g + 64v' (v' = 0..2): byte
 *     4j + t of vector v' holds element t of chunk v' of output j in bits
 *     0..5 and bits 2v', 2v' + 1 of element t of chunk 3 in bits 6..7.  So
 *     chunks 0..2 are one vpand each (& 63) and chunk 3 is
 *     (A >> 6 & 3) | (B >> 4 & 12) | (C >> 2 & 48): 9 vector operations
 *     per 4 chunks instead of 17 for the file's nibble and 2-bit planes.
 *     A permutation of the file's 1536 quant bits (the panel keeps the
 *     file's size), not of its bytes.
 * So 4 consecutive weights of one output are one 32-bit lane and 16 outputs
 * one vector: vpdpbusd against 4 broadcast activation bytes leaves each
 * output's integer sum in its lane (no horizontal sums), and the scale
 * arithmetic runs on 16 outputs at once. */
void cb_kq_pack_block(int type, const uint8_t *blk, int j, uint8_t *pk);

/* 1 if type is one of the K-quants above. */
int         cb_kq_is_kquant(int type);
/* Bytes per 256-weight block (0 if not a K-quant). */
size_t      cb_kq_block_bytes(int type);
/* "q4_K", ... or NULL. */
const char *cb_kq_type_name(int type);

/* Scale and min of sub-block j (0..7) of a Q4_K / Q5_K block (ggml's get_scale_min_k4). */
static inline void cb_kq_scale_min(const uint8_t *q, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* The 16 scales of a Q3_K block, value - 32 applied (ggml's unpacking). */
static inline void cb_kq3_scales(const uint8_t *packed, int sc[16]) {
    uint32_t a[3];
    for (int i = 0; i < 3; i++)
        a[i] = (uint32_t)packed[4 * i] | (uint32_t)packed[4 * i + 1] << 8 |
               (uint32_t)packed[4 * i + 2] << 16 | (uint32_t)packed[4 * i + 3] << 24;
    const uint32_t k1 = 0x03030303u, k2 = 0x0f0f0f0fu;
    uint32_t u[4];
    u[0] = (a[0] & k2) | (((a[2] >> 0) & k1) << 4);
    u[1] = (a[1] & k2) | (((a[2] >> 2) & k1) << 4);
    u[2] = ((a[0] >> 4) & k2) | (((a[2] >> 4) & k1) << 4);
    u[3] = ((a[1] >> 4) & k2) | (((a[2] >> 6) & k1) << 4);
    for (int i = 0; i < 16; i++) sc[i] = (int)((u[i / 4] >> (8 * (i % 4))) & 0xFF) - 32;
}

/* The float step of one Q4_K / Q5_K super-block (top of this file). */
static inline float cb_kq_step_min(float acc, int32_t isum, int32_t msum, float d, float dmin, float dx) {
    const float a = d * (float)isum;
    const float b = dmin * (float)msum;
    const float t = a - b;
    const float u = t * dx;
    return acc + u;
}

/* The float step of one Q6_K super-block. */
static inline float cb_kq_step(float acc, int32_t isum, float d, float dx) {
    const float a = d * (float)isum;
    const float u = a * dx;
    return acc + u;
}

/* The float steps of one 32-value activation block (Q2_K, Q3_K), shared by
 * every SIMD level so all levels round identically. */
static inline float cb_kq_acc(float acc, int isum_sc, float d, const cb_block_q8 *x) {
    const float dd = d * x->d;
    acc += (float)isum_sc * dd;
    return acc;
}

/* Quantize n (multiple of 256) floats into n / 256 cb_block_q8k at SIMD
 * level simd (every level gives the same bytes; scalar when the level is
 * not compiled in). */
void cb_kq_quantize_q8k(int simd, const float *x, cb_block_q8k *q, int64_t n);
void cb_kq_quantize_q8k_scalar(const float *x, cb_block_q8k *q, int64_t n);
int  cb_kq_quantize_q8k_avx2(const float *x, cb_block_q8k *q, int64_t n);
int  cb_kq_quantize_q8k_avx512(const float *x, cb_block_q8k *q, int64_t n);

/* Dequantize n (multiple of 256) weights of one row. */
void cb_kq_row_f32(int type, const void *row, int64_t n, float *out);

/* cb_kernels.matmul_rows for K-quant weights at SIMD level `simd`
 * (falls back to scalar when the level is not compiled in, and for Q4_K /
 * Q5_K / Q6_K matrices without the panel layout).  xq: the activations as
 * cb_block_q8 (Q2_K, Q3_K), xk: as cb_block_q8k (Q4_K, Q5_K, Q6_K); the
 * other may be NULL. */
void cb_kq_matmul_rows(int simd, const cb_weight *w, const cb_block_q8 *xq, const cb_block_q8k *xk, int n_rows,
                       float *y, int64_t ldy, int64_t o0, int64_t o1);

/* Per-level implementations (kquants_<level>.c); the SIMD ones return 0 when
 * they do not handle the call (then the caller uses scalar). */
void cb_kq_matmul_rows_scalar(const cb_weight *w, const cb_block_q8 *xq, const cb_block_q8k *xk, int n_rows,
                              float *y, int64_t ldy, int64_t o0, int64_t o1);
int  cb_kq_matmul_rows_avx2(const cb_weight *w, const cb_block_q8 *xq, const cb_block_q8k *xk, int n_rows,
                            float *y, int64_t ldy, int64_t o0, int64_t o1);
int  cb_kq_matmul_rows_avx512(const cb_weight *w, const cb_block_q8 *xq, const cb_block_q8k *xk, int n_rows,
                              float *y, int64_t ldy, int64_t o0, int64_t o1);

#endif
