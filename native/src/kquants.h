/*
 * kquants.h — llama.cpp's K-quant weight types Q4_K, Q5_K and Q6_K
 * ("k-quants": super-blocks of 256 weights with sub-block scales), so that
 * Q4_K_M / Q5_K_M / Q6_K GGUF files load.
 *
 * Dot products run against the engine's own int8 activations (cb_block_q8:
 * 32 values, float scale d, s = d * sum(qs)) rather than llama.cpp's Q8_K
 * (256 values, one scale).  Every K-quant sub-block of 32 weights (Q4_K,
 * Q5_K) or pair of 16-weight sub-blocks (Q6_K) lines up with exactly one
 * activation block, so per activation block b the integer sum is exact and
 * the float part is
 *     Q4_K / Q5_K:  acc += (float)(isum_b * sc_b) * (d * dx_b)
 *                   acc -= (dmin * (float)m_b) * s_b
 *     Q6_K:         acc += (float)(sc_lo * isum_lo + sc_hi * isum_hi) * (d * dx_b)
 * with isum_b = sum q_i * qx_i over the block (Q6_K: q_i - 32 per 16-half).
 * The integer terms stay below 2^24 (Q5_K: 32*31*127*63 < 8e6; Q6_K:
 * 2*16*32*127*128 < 1.7e7), so the int -> float conversion is exact.
 * Finer activation scales (32 instead of 256 values) make this at least as
 * accurate as ggml's Q8_K path.
 *
 * Accumulation order per (activation row, output row) is the block order
 * above, identical at every SIMD level: the SIMD paths only compute the
 * exact integer sums faster, then do the same scalar float steps, so all
 * levels give bit-identical results (and batch invariance follows as for
 * the other kernels: nothing depends on the tiling).  This relies on no FMA
 * contraction of the scalar float steps (-std=c11 implies -ffp-contract=off
 * with GCC; clang's default "on" only contracts within one expression, and
 * the steps are written as separate statements).
 *
 * Hook into kernels.c (the only places that know about these types):
 * type table entries via cb_kq_block_bytes / cb_kq_type_name, activation
 * quantization for cb_kq_is_kquant types, matmul through
 * cb_kq_matmul_rows, row dequantization through cb_kq_row_f32.
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
 * of 16 outputs j, every byte of the file blocks kept, only moved:
 *   Q4_K (2304 bytes): d[16] f16 | dmin[16] f16 | scales: byte k (0..11) of
 *     output j at 64 + 16k + j | qs: group g (0..3), chunk c (0..7) =
 *     file qs[32g + 4c .. 32g + 4c + 3] of output j at 256 + 512g + 64c + 4j
 *     (low nibbles: sub-block 2g, high: 2g + 1, elements 4c..4c+3).
 *   Q5_K (2816): as Q4_K, plus qh: chunk c (0..7) = file qh[4c..4c+3] at
 *     256 + 64c + 4j; qs moves to 768 + 512g + 64c + 4j.
 *   Q6_K (3360): d[16] f16 | scales: sub-block i (0..15, 16 weights) of
 *     output j at 32 + 16i + j | ql: half h, chunk c (0..15) = file
 *     ql[64h + 4c ..] at 288 + 1024h + 64c + 4j | qh: half h, chunk c (0..7)
 *     = file qh[32h + 4c ..] at 2336 + 512h + 64c + 4j.
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

/* The float steps of one activation block, shared by every SIMD level so all
 * levels round identically (see the top of this file). */
static inline float cb_kq_acc_min(float acc, int isum_sc, float d, float dmin, int m, const cb_block_q8 *x) {
    const float dd = d * x->d;
    acc += (float)isum_sc * dd;
    const float mm = dmin * (float)m;
    acc -= mm * x->s;
    return acc;
}

static inline float cb_kq_acc(float acc, int isum_sc, float d, const cb_block_q8 *x) {
    const float dd = d * x->d;
    acc += (float)isum_sc * dd;
    return acc;
}

/* The Q6_K panel kernels' integer offsets: for each of n activation blocks,
 * xc[2i] = -32 * sum(qs[0..16)) and xc[2i + 1] = -32 * sum(qs[16..32)), so a
 * 16-weight half read as unsigned q in 0..63 starts its exact sum there. */
void cb_kq_q6_offsets(const cb_block_q8 *xq, int64_t n, int32_t *xc);

/* Dequantize n (multiple of 256) weights of one row. */
void cb_kq_row_f32(int type, const void *row, int64_t n, float *out);

/* cb_kernels.matmul_rows for K-quant weights at SIMD level `simd`
 * (falls back to scalar when the level is not compiled in). */
void cb_kq_matmul_rows(int simd, const cb_weight *w, const cb_block_q8 *xq, int n_rows,
                       float *y, int64_t ldy, int64_t o0, int64_t o1);

/* Per-level implementations (kquants_<level>.c); the SIMD ones return 0 when
 * not compiled for x86 (then the caller uses scalar). */
void cb_kq_matmul_rows_scalar(const cb_weight *w, const cb_block_q8 *xq, int n_rows,
                              float *y, int64_t ldy, int64_t o0, int64_t o1);
int  cb_kq_matmul_rows_avx2(const cb_weight *w, const cb_block_q8 *xq, int n_rows,
                            float *y, int64_t ldy, int64_t o0, int64_t o1);
int  cb_kq_matmul_rows_avx512(const cb_weight *w, const cb_block_q8 *xq, int n_rows,
                              float *y, int64_t ldy, int64_t o0, int64_t o1);

#endif
