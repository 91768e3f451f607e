/*
 * kernels_avx2.c — AVX2 + FMA + F16C kernels (per-function target attributes,
 * selected at run time).
 *
 * Quantized weights: one ymm holds one block of one output (32 bytes), the
 * weight block is unpacked once per tile and reused for up to 4 activation
 * rows.  Products use vpmaddubsw (unsigned x signed -> int16 pairs, no
 * saturation possible for these ranges) then vpmaddwd with ones -> 8 int32:
 *   Q4_1 / Q5_1: quants 0..15 / 0..31 times x;
 *   Q4_0 / Q5_0 / Q8_0: signed weights through the sign trick |w| * sign(x, w)
 *   (|w| <= 128, |x| <= 127: pair sums stay below 32767).
 * Per (activation row r, output o), in this fixed order for every tiling:
 *   for each block b:  acc[8] = fma(float(isum[8]) * dx_b, dw_b, acc[8])
 *                      (Q4_1, Q5_1) m = fma_ss(mw_b, s_b, m)
 *   y = hsum8(acc) + m,   hsum8 = ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
 * Float weights: per (r, o) an 8-lane fma accumulator over the row in steps of
 * 8 (tail through a zero-padded copy), hsum8.
 */
#include "kernels.h"
#include "colibri.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define T2  __attribute__((target("avx2,fma,f16c")))
#define INL __attribute__((always_inline)) inline

T2 static INL float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}

static inline uint16_t rd16(const void *p) { uint16_t v; memcpy(&v, p, 2); return v; }

/* --------------------------------------------------------- quantization */

T2 static void quantize_q8_avx2(const float *x, cb_block_q8 *q, int64_t n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / CB_QK; b++) {
        const float *xb = x + b * CB_QK;
        const __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        const __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float amax = _mm_cvtss_f32(m4);
        /* Same scalar steps as the scalar path, so the bytes match it. */
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid));  /* round to nearest even */
        const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
        const __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid));
        const __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
        /* packs interleave 128-bit lanes; the permute restores element order. */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)q[b].qs, p);
        __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
        q[b].d = d;
        q[b].s = d * (float)_mm_cvtsi128_si32(s4);
    }
}

/* ------------------------------------------------------ quantized matmul */

/* Bit j of the 32-bit little-endian word at p as 0x10 in byte j (the 5th
 * bit of element j of a Q5_0 / Q5_1 block): broadcast, route byte j/8 to
 * byte j, keep bit j%8, compare. */
T2 static INL __m256i bits_to_0x10(const uint8_t *p) {
    uint32_t h;
    memcpy(&h, p, 4);
    const __m256i route = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                           2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), route), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(0x10));
}

/* Q4_1 / Q5_1: unsigned weights plus a min. */
static inline int q_has_min(int type) { return type == CB_TYPE_Q4_1 || type == CB_TYPE_Q5_1; }

/* Block b of a legacy-type weight row (at blk): its weights W (Q4_1 / Q5_1:
 * unsigned quants; else signed), the bytes vpmaddubsw takes (|w| for signed
 * types), the scale D and the min M (Q4_1 / Q5_1; else 0). */
T2 static INL void q_block(const int type, const uint8_t *blk, __m256i *W, __m256i *AW, __m256 *D, __m128 *M) {
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const int has_m = q_has_min(type);
    *D = _mm256_set1_ps(_cvtsh_ss(rd16(blk)));
    if (type == CB_TYPE_Q8_0) {
        *W = _mm256_loadu_si256((const __m256i *)(blk + 2));
    } else {
        const size_t qoff = type == CB_TYPE_Q4_0 ? 2 : type == CB_TYPE_Q4_1 ? 4 : type == CB_TYPE_Q5_0 ? 6 : 8;
        const __m128i qs = _mm_loadu_si128((const __m128i *)(blk + qoff));
        *W = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), low4), _mm_and_si128(qs, low4));
        if (type == CB_TYPE_Q5_0 || type == CB_TYPE_Q5_1) *W = _mm256_or_si256(*W, bits_to_0x10(blk + qoff - 4));
        if (type == CB_TYPE_Q4_0) *W = _mm256_sub_epi8(*W, _mm256_set1_epi8(8));
        if (type == CB_TYPE_Q5_0) *W = _mm256_sub_epi8(*W, _mm256_set1_epi8(16));
    }
    *AW = has_m ? *W : _mm256_sign_epi8(*W, *W);  /* |w| */
    *M = has_m ? _mm_set_ss(_cvtsh_ss(rd16(blk + 2))) : _mm_setzero_ps();
}

/* One (activation row, output row) block product into acc / macc: the only
 * float steps of an output, in block order, whatever the tile shape. */
T2 static INL void q_step(const int type, __m256i W, __m256i AW, __m256 D, __m128 M, const cb_block_q8 *xb,
                          __m256 *acc, __m128 *macc) {
    const int has_m = q_has_min(type);
    __m256i X = _mm256_loadu_si256((const __m256i *)xb->qs);
    if (!has_m) X = _mm256_sign_epi8(X, W);
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(AW, X), _mm256_set1_epi16(1));
    const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(xb->d));
    *acc = _mm256_fmadd_ps(t, D, *acc);
    if (has_m) *macc = _mm_fmadd_ss(M, _mm_set_ss(xb->s), *macc);
}

/* R activation rows x 1 output row wr. */
T2 static INL void q_tile(const int type, const int R, const uint8_t *wr, size_t bsz, int64_t nb,
                          const cb_block_q8 *xr, float *y, int64_t ldy) {
    __m256 acc[4];
    __m128 macc[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) { acc[r] = _mm256_setzero_ps(); macc[r] = _mm_setzero_ps(); }
    for (int64_t b = 0; b < nb; b++) {
        __m256i W, AW;
        __m256 D;
        __m128 M;
        q_block(type, wr + (size_t)b * bsz, &W, &AW, &D, &M);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) q_step(type, W, AW, D, M, xr + (int64_t)r * nb + b, &acc[r], &macc[r]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) y[r * ldy] = hsum8(acc[r]) + _mm_cvtss_f32(macc[r]);
}

/* One activation row x Q_OUTS output rows (from wr, rb bytes apart): the
 * decode shape, where one output's fma chain alone leaves the core waiting
 * on its latency; Q_OUTS independent chains, each output's steps those of
 * q_tile, so the bits do not depend on which of the two ran. */
#define Q_OUTS 4
/* Rows ahead of the one being read that q_tile_outs prefetches (spread over
 * its blocks): without it the one-row Q8_0 stream from DRAM ran at 6.3 GB/s,
 * with it 14.5 (8 or 16 rows the same, 32 and 64 ~10% less; bench_kquants,
 * AVX2 level, Intel Xeon). */
#define Q_PF_ROWS 16
T2 static INL void q_tile_outs(const int type, const uint8_t *wr, size_t rb, size_t bsz, int64_t nb,
                               const cb_block_q8 *xr, float *y, const uint8_t *pf_end) {
    __m256 acc[Q_OUTS];
    __m128 macc[Q_OUTS];
#pragma GCC unroll 4
    for (int k = 0; k < Q_OUTS; k++) { acc[k] = _mm256_setzero_ps(); macc[k] = _mm_setzero_ps(); }
    const uint8_t *pf = wr + (Q_PF_ROWS + Q_OUTS) * rb <= pf_end ? wr + Q_PF_ROWS * rb : NULL;
    const size_t pf_step = (Q_OUTS * rb + (size_t)nb - 1) / (size_t)nb;  /* bytes of the rows ahead per block */
    for (int64_t b = 0; b < nb; b++) {
        if (pf)
            for (size_t off = (size_t)b * pf_step; off < (size_t)(b + 1) * pf_step && off < Q_OUTS * rb; off += 64)
                _mm_prefetch((const char *)pf + off, _MM_HINT_T0);
#pragma GCC unroll 4
        for (int k = 0; k < Q_OUTS; k++) {
            __m256i W, AW;
            __m256 D;
            __m128 M;
            q_block(type, wr + k * rb + (size_t)b * bsz, &W, &AW, &D, &M);
            q_step(type, W, AW, D, M, xr + b, &acc[k], &macc[k]);
        }
    }
#pragma GCC unroll 4
    for (int k = 0; k < Q_OUTS; k++) y[k] = hsum8(acc[k]) + _mm_cvtss_f32(macc[k]);
}

T2 static INL void matmul_q(const int type, const cb_weight *w, const cb_block_q8 *xq,
                            int n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t nb = w->n_in / CB_QK;
    const size_t bsz = cb_type_block_bytes(type), rb = w->row_bytes;
    int64_t o = o0;
    if (n_rows == 1)
        for (; o + Q_OUTS <= o1; o += Q_OUTS)
            q_tile_outs(type, (const uint8_t *)w->data + (size_t)o * rb, rb, bsz, nb, xq, y + o,
                        (const uint8_t *)w->data + (size_t)w->n_out * rb);
    for (; o < o1; o++) {
        const uint8_t *wr = (const uint8_t *)w->data + (size_t)o * rb;
        int r = 0;
        for (; r + 4 <= n_rows; r += 4) q_tile(type, 4, wr, bsz, nb, xq + (int64_t)r * nb, y + r * ldy + o, ldy);
        switch (n_rows - r) {
        case 3: q_tile(type, 3, wr, bsz, nb, xq + (int64_t)r * nb, y + r * ldy + o, ldy); break;
        case 2: q_tile(type, 2, wr, bsz, nb, xq + (int64_t)r * nb, y + r * ldy + o, ldy); break;
        case 1: q_tile(type, 1, wr, bsz, nb, xq + (int64_t)r * nb, y + r * ldy + o, ldy); break;
        default: break;
        }
    }
}

T2 static void matmul_q4_0(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                           int64_t ldy, int64_t o0, int64_t o1) {
    matmul_q(CB_TYPE_Q4_0, w, xq, n_rows, y, ldy, o0, o1);
}
T2 static void matmul_q4_1(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                           int64_t ldy, int64_t o0, int64_t o1) {
    matmul_q(CB_TYPE_Q4_1, w, xq, n_rows, y, ldy, o0, o1);
}
T2 static void matmul_q5_0(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                           int64_t ldy, int64_t o0, int64_t o1) {
    matmul_q(CB_TYPE_Q5_0, w, xq, n_rows, y, ldy, o0, o1);
}
T2 static void matmul_q5_1(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                           int64_t ldy, int64_t o0, int64_t o1) {
    matmul_q(CB_TYPE_Q5_1, w, xq, n_rows, y, ldy, o0, o1);
}
T2 static void matmul_q8_0(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                           int64_t ldy, int64_t o0, int64_t o1) {
    matmul_q(CB_TYPE_Q8_0, w, xq, n_rows, y, ldy, o0, o1);
}

/* ------------------------------------------- panel kernels (legacy types)
 *
 * Q4_0, Q4_1 and Q5_0 matrices packed at model load (the panel layout
 * of kernels.h, the one kernels_avx512.c reads) run here as two halves of 8
 * outputs: each 64-byte chunk row of a panel block is two ymm of 8 outputs x
 * 4 weights, so vpmaddubsw against 4 broadcast activation bytes leaves each
 * output's pair sums in its own lane and the float work of a block is one
 * vector per 8 outputs, not one per output as in the row kernels above.
 * Weights as the panel stores them: Q4_0 / Q4_1 nibbles 0..15, Q5_0 0..31
 * (the fifth bit added), their int16 sums over 8 (Q4) or 4 (Q5_0) chunks
 * bounded by 30480 / 31496.  Per (row r, output lane), in block order, the
 * AVX-512 kernel's steps:
 *   isum = c_rb + sum of the products   (exact integers; c_rb = -8 / -16 *
 *                                        sum(q_x) for Q4_0 / Q5_0, Q4_1 0)
 *   acc  = fma(float(isum) * dx_rb, dw, acc)
 *   Q4_1: acc = fma(mw, s_rb, acc)
 * so these types give the AVX-512 level's bits, and a row's outputs never
 * depend on the tile, the panel's place in the work split or the thread.
 * Q8_0 keeps the row kernel: its signed bytes need the sign trick per row
 * and chunk, and the panel form of it measured slower at 4 and 8 rows
 * (bench_kquants, AVX2 level, Intel Xeon). */

/* Activation rows per tile: each block's weights are decoded once per tile;
 * 8 rows against 4: Q5_0 +10%, Q4_0 / Q4_1 +3-5% at prefill shapes
 * (bench_kquants, AVX2 level, Intel Xeon). */
#define PT2_ROWS 8
#define PT2_PF_PANELS 2  /* panels between a panel's software prefetch and its use (as kernels_avx512.c) */

/* The 8 weight vectors (chunks 0..7, 4 weights x 8 outputs each) of half hv
 * of the panel block at p. */
T2 static INL void p2_weights(const int type, const uint8_t *p, int hv, __m256i *W) {
    const uint8_t *q = p + (type == CB_TYPE_Q4_1 ? 64 : type == CB_TYPE_Q5_0 ? 96 : 32) + 32 * hv;
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 64 * c));
        W[c] = _mm256_and_si256(v, lo4);
        W[c + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
    }
    if (type == CB_TYPE_Q5_0) {
        /* byte c of each output's regrouped qh word holds the fifth bits of
         * chunk c (low nibbles' in bits 0..3, high nibbles' in 4..7): copy it
         * to the output's 4 bytes, keep bit t of byte t, 0x10 where set */
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 32 + 32 * hv));
        const __m256i route = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404, 0x08080808,
                                                0x0C0C0C0C);
        const __m256i bit_lo = _mm256_set1_epi32(0x08040201), bit_hi = _mm256_set1_epi32((int)0x80402010u);
        const __m256i b16 = _mm256_set1_epi8(16);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m256i hb = _mm256_shuffle_epi8(qh, _mm256_add_epi8(route, _mm256_set1_epi8((char)c)));
            W[c] = _mm256_or_si256(W[c], _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, bit_lo), bit_lo), b16));
            W[c + 4] = _mm256_or_si256(W[c + 4],
                                       _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, bit_hi), bit_hi), b16));
        }
    }
}

/* The integer sum of one activation block x4 (8 x 4 bytes) against the
 * weights W of 8 outputs, started at c (exact). */
T2 static INL __m256i p2_isum(const int type, const __m256i *W, const cb_i32u *x4, int32_t c) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s = _mm256_set1_epi32(c);
    __m256i p16 = _mm256_maddubs_epi16(W[0], _mm256_set1_epi32(x4[0]));
#pragma GCC unroll 3
    for (int g = 1; g < 4; g++) p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(W[g], _mm256_set1_epi32(x4[g])));
    if (type == CB_TYPE_Q5_0) {  /* 0..31: four chunks per int16 sum */
        s = _mm256_add_epi32(s, _mm256_madd_epi16(p16, ones));
        p16 = _mm256_maddubs_epi16(W[4], _mm256_set1_epi32(x4[4]));
    } else {
        p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(W[4], _mm256_set1_epi32(x4[4])));
    }
#pragma GCC unroll 3
    for (int g = 5; g < 8; g++) p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(W[g], _mm256_set1_epi32(x4[g])));
    return _mm256_add_epi32(s, _mm256_madd_epi16(p16, ones));
}

/* One panel (16 outputs, the first no of them wanted) x R activation rows
 * over all nb blocks: blocks outer and the two halves inner, so each 64-byte
 * panel row is consumed whole while it is in L1; pf: the panel
 * PT2_PF_PANELS ahead, prefetched into L2 block by block (first row tile). */
T2 static INL void p2_tile(const int type, const int R, const uint8_t *panel, int64_t nb, const cb_block_q8 *xr,
                           const int32_t *xc, float *y, int64_t ldy, int no, const uint8_t *pf) {
    const size_t pb = cb_pack_block_bytes(type);  /* constant: the prefetch loop unrolls */
    _Alignas(32) float acc[2][PT2_ROWS][8];
    const int nh = no > 8 ? 2 : 1;
    for (int hv = 0; hv < 2; hv++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) _mm256_store_ps(acc[hv][r], _mm256_setzero_ps());
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = panel + (size_t)b * pb;
        if (pf)
#pragma GCC unroll 16
            for (size_t off = 0; off < pb; off += 64) _mm_prefetch((const char *)pf + (size_t)b * pb + off, _MM_HINT_T1);
        for (int hv = 0; hv < nh; hv++) {
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * hv)));
            const __m256 mw = type == CB_TYPE_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * hv)))
                                                   : _mm256_setzero_ps();
            __m256i W[8];
            p2_weights(type, p, hv, W);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const cb_block_q8 *xb = xr + (int64_t)r * nb + b;
                const __m256i s = p2_isum(type, W, (const cb_i32u *)xb->qs, xc ? xc[(int64_t)r * nb + b] : 0);
                const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(xb->d));
                __m256 a = _mm256_fmadd_ps(t, dw, _mm256_load_ps(acc[hv][r]));
                if (type == CB_TYPE_Q4_1) a = _mm256_fmadd_ps(mw, _mm256_set1_ps(xb->s), a);
                _mm256_store_ps(acc[hv][r], a);
            }
        }
    }
    for (int hv = 0; hv < nh; hv++) {
        const int n = no - 8 * hv < 8 ? no - 8 * hv : 8;
        for (int r = 0; r < R; r++) memcpy(y + (int64_t)r * ldy + 8 * hv, acc[hv][r], (size_t)n * sizeof(float));
    }
}

/* Panels over outputs [o0, o1) (o0 a multiple of CB_PANEL) for rows
 * [0, n_rows): panel outer (its weights stay in L1/L2), row tiles inner. */
T2 static INL void p2_rows(const int type, const cb_weight *w, const cb_block_q8 *xq, const int32_t *xc,
                           int n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t nb = w->n_in / CB_QK;
    const size_t psz = (size_t)nb * cb_pack_block_bytes(type);
    const int pfp = cb_prefetch_panels(type, n_rows);
    for (int64_t o = o0; o < o1; o += CB_PANEL) {
        const uint8_t *panel = (const uint8_t *)w->packed + (size_t)(o / CB_PANEL) * psz;
        const int no = (int)(o1 - o < CB_PANEL ? o1 - o : CB_PANEL);
        const uint8_t *pf = pfp && o + PT2_PF_PANELS * CB_PANEL < w->n_out ? panel + PT2_PF_PANELS * psz : NULL;
        for (int r = 0, R; r < n_rows; r += R, pf = NULL) {
            R = n_rows - r >= 8 ? 8 : n_rows - r >= 4 ? 4 : n_rows - r;  /* tiles of 8, then 4, then the tail */
            const cb_block_q8 *xr = xq + (int64_t)r * nb;
            const int32_t *xcr = xc ? xc + (int64_t)r * nb : NULL;
            float *yr = y + r * ldy + o;
            switch (R) {  /* a constant row count per call: the row loops unroll */
            case 8: p2_tile(type, 8, panel, nb, xr, xcr, yr, ldy, no, pf); break;
            case 4: p2_tile(type, 4, panel, nb, xr, xcr, yr, ldy, no, pf); break;
            case 3: p2_tile(type, 3, panel, nb, xr, xcr, yr, ldy, no, pf); break;
            case 2: p2_tile(type, 2, panel, nb, xr, xcr, yr, ldy, no, pf); break;
            default: p2_tile(type, 1, panel, nb, xr, xcr, yr, ldy, no, pf); break;
            }
        }
    }
}

/* Q4_0 / Q5_0: each (row, block) sum starts at -8 / -16 times the sum of the
 * activation bytes (cb_q8_offsets), for groups of rows at a time. */
T2 static INL void matmul_p2(const int type, const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                             int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t nb = w->n_in / CB_QK;
    if (nb <= 0) return;
    if (type == CB_TYPE_Q4_1) { p2_rows(type, w, xq, NULL, n_rows, y, ldy, o0, o1); return; }
    _Alignas(32) int32_t xc[CB_PACK_MAX_BLOCKS];
    int64_t g = CB_PACK_MAX_BLOCKS / nb;  /* rows per group (>= 1: packed rows have <= that many blocks) */
    if (g >= PT2_ROWS) g -= g % PT2_ROWS;
    for (int r0 = 0; r0 < n_rows; r0 += (int)g) {
        const int r1 = r0 + g < n_rows ? r0 + (int)g : n_rows;
        cb_q8_offsets(xq + (int64_t)r0 * nb, (int64_t)(r1 - r0) * nb, type == CB_TYPE_Q5_0 ? -16 : -8, xc);
        p2_rows(type, w, xq + (int64_t)r0 * nb, xc, r1 - r0, y + (int64_t)r0 * ldy, ldy, o0, o1);
    }
}

T2 static void matmul_p2_4_0(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                             int64_t ldy, int64_t o0, int64_t o1) {
    matmul_p2(CB_TYPE_Q4_0, w, xq, n_rows, y, ldy, o0, o1);
}
T2 static void matmul_p2_4_1(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                             int64_t ldy, int64_t o0, int64_t o1) {
    matmul_p2(CB_TYPE_Q4_1, w, xq, n_rows, y, ldy, o0, o1);
}
T2 static void matmul_p2_5_0(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                             int64_t ldy, int64_t o0, int64_t o1) {
    matmul_p2(CB_TYPE_Q5_0, w, xq, n_rows, y, ldy, o0, o1);
}

/* ----------------------------------------------------------- float matmul */

/* 8 weights from element i (n - i >= 8). */
T2 static INL __m256 load_wf(int type, const uint8_t *p, int64_t i) {
    if (type == CB_TYPE_F32) return _mm256_loadu_ps((const float *)p + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (type == CB_TYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  /* bf16 */
}

/* R rows x 2 outputs (wp[1] may duplicate wp[0]). */
T2 static INL void f_tile(const int type, const int R, const uint8_t *const wp[2], int64_t n,
                          const float *xr, float *y, int64_t ldy, int no) {
    const size_t esz = type == CB_TYPE_F32 ? 4 : 2;
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) { acc[r][0] = _mm256_setzero_ps(); acc[r][1] = _mm256_setzero_ps(); }
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 W0 = load_wf(type, wp[0], i), W1 = load_wf(type, wp[1], i);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m256 X = _mm256_loadu_ps(xr + r * n + i);
            acc[r][0] = _mm256_fmadd_ps(W0, X, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(W1, X, acc[r][1]);
        }
    }
    if (i < n) {  /* tail: zero-padded copies, same fma per lane */
        _Alignas(32) uint8_t wb[2][32];
        memset(wb, 0, sizeof(wb));
        memcpy(wb[0], wp[0] + (size_t)i * esz, (size_t)(n - i) * esz);
        memcpy(wb[1], wp[1] + (size_t)i * esz, (size_t)(n - i) * esz);
        const __m256 W0 = load_wf(type, wb[0], 0), W1 = load_wf(type, wb[1], 0);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            _Alignas(32) float xb[8] = {0};
            memcpy(xb, xr + r * n + i, (size_t)(n - i) * sizeof(float));
            const __m256 X = _mm256_load_ps(xb);
            acc[r][0] = _mm256_fmadd_ps(W0, X, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(W1, X, acc[r][1]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        for (int j = 0; j < no; j++) y[r * ldy + j] = hsum8(acc[r][j]);
}

T2 static INL void matmul_f(const int type, const cb_weight *w, const float *xf, int n_rows,
                            float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t n = w->n_in;
    for (int64_t o = o0; o < o1; o += 2) {
        const int no = o1 - o < 2 ? 1 : 2;
        const uint8_t *wp[2];
        wp[0] = (const uint8_t *)w->data + (size_t)o * w->row_bytes;
        wp[1] = (const uint8_t *)w->data + (size_t)(o + no - 1) * w->row_bytes;
        int r = 0;
        for (; r + 4 <= n_rows; r += 4) f_tile(type, 4, wp, n, xf + r * n, y + r * ldy + o, ldy, no);
        switch (n_rows - r) {
        case 3: f_tile(type, 3, wp, n, xf + r * n, y + r * ldy + o, ldy, no); break;
        case 2: f_tile(type, 2, wp, n, xf + r * n, y + r * ldy + o, ldy, no); break;
        case 1: f_tile(type, 1, wp, n, xf + r * n, y + r * ldy + o, ldy, no); break;
        default: break;
        }
    }
}

T2 static void matmul_f32(const cb_weight *w, const float *xf, int n_rows, float *y,
                          int64_t ldy, int64_t o0, int64_t o1) {
    matmul_f(CB_TYPE_F32, w, xf, n_rows, y, ldy, o0, o1);
}
T2 static void matmul_f16(const cb_weight *w, const float *xf, int n_rows, float *y,
                          int64_t ldy, int64_t o0, int64_t o1) {
    matmul_f(CB_TYPE_F16, w, xf, n_rows, y, ldy, o0, o1);
}
T2 static void matmul_bf16(const cb_weight *w, const float *xf, int n_rows, float *y,
                           int64_t ldy, int64_t o0, int64_t o1) {
    matmul_f(CB_TYPE_BF16, w, xf, n_rows, y, ldy, o0, o1);
}

static void matmul_rows_avx2(const cb_weight *w, const cb_block_q8 *xq, const float *xf,
                             int n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    switch (w->type) {
    case CB_TYPE_Q4_0: (w->packed ? matmul_p2_4_0 : matmul_q4_0)(w, xq, n_rows, y, ldy, o0, o1); break;
    case CB_TYPE_Q4_1: (w->packed ? matmul_p2_4_1 : matmul_q4_1)(w, xq, n_rows, y, ldy, o0, o1); break;
    case CB_TYPE_Q5_0: (w->packed ? matmul_p2_5_0 : matmul_q5_0)(w, xq, n_rows, y, ldy, o0, o1); break;
    case CB_TYPE_Q5_1: matmul_q5_1(w, xq, n_rows, y, ldy, o0, o1); break;
    case CB_TYPE_Q8_0: matmul_q8_0(w, xq, n_rows, y, ldy, o0, o1); break;  /* packed or not: the row kernel */
    case CB_TYPE_F32:  matmul_f32(w, xf, n_rows, y, ldy, o0, o1); break;
    case CB_TYPE_F16:  matmul_f16(w, xf, n_rows, y, ldy, o0, o1); break;
    case CB_TYPE_BF16: matmul_bf16(w, xf, n_rows, y, ldy, o0, o1); break;
    default: break;
    }
}

/* ------------------------------------------------------------ float helpers */

T2 static float dot_f32_avx2(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    if (i < n) {
        _Alignas(32) float ta[8] = {0}, tb[8] = {0};
        memcpy(ta, a + i, (size_t)(n - i) * sizeof(float));
        memcpy(tb, b + i, (size_t)(n - i) * sizeof(float));
        acc = _mm256_fmadd_ps(_mm256_load_ps(ta), _mm256_load_ps(tb), acc);
    }
    return hsum8(acc);
}

T2 static void axpy_f32_avx2(float *y, float a, const float *x, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    /* Tail with the same fused operation per element as the vector body. */
    for (; i < n; i++) y[i] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(x[i]), _mm_set_ss(y[i])));
}

/* f16 <-> f32 rows with F16C, scalar tails (same rounding: nearest even). */
T2 static void from_f16_avx2(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = cb_f16_to_f32(x[i]);
}

T2 static void to_f16_avx2(const float *x, uint16_t *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = cb_f32_to_f16(x[i]);
}

/* -------------------------------------------------------------- attention */

/* e^x as 2^n * e^r with n = round(x / ln 2), |r| <= ln 2 / 2, e^r by its
 * degree-6 Taylor polynomial; x clamped to [-87, 88] (normal floats), 2^n
 * built in the exponent field (exact, as vscalefps): exp512's values. */
T2 static INL __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);      /* ln 2, high part */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);          /* ln 2, low part */
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* Heads of the V pass that keep their accumulators in registers together,
 * and head-dim elements per V accumulator group (4 vectors). */
#define ATTN2_HEADS 2
#define ATTN2_VDIM  32

/* 8 elements of KV row p from element i on, f16 or f32. */
T2 static INL __m256 kv_load8(const void *base, size_t stride, int kv_f16, int p, int i) {
    if (kv_f16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + (size_t)p * stride + i)));
    return _mm256_loadu_ps((const float *)base + (size_t)p * stride + i);
}

/* Scores of one head for 8 positions (Kb: the 8 K rows as f32, hd apart):
 * 8 independent fma chains over hd, then lane p = the sum of chain p's 8
 * lanes by a fixed transpose-add tree (each lane adds only its own chain's
 * lanes, in one order). */
T2 static INL __m256 attn_scores8(const float *q, const int hd, const float *Kb) {
    __m256 a[8];
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++) a[p] = _mm256_setzero_ps();
    for (int i = 0; i < hd; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
#pragma GCC unroll 8
        for (int p = 0; p < 8; p++) a[p] = _mm256_fmadd_ps(qv, _mm256_load_ps(Kb + p * hd + i), a[p]);
    }
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);  /* per 128-bit half: chains 0-3, 4-7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* out[j][i0 .. i0+31] = sum_p w[j][p] * V[p][i0 ..] for NJ heads, positions
 * in order (one fma chain per output). */
T2 static INL void attn_v_block8(const float *w, int n_pos, int NJ, const void *V, size_t stride, int kv_f16,
                                 int hd, int i0, float *out) {
    __m256 acc[ATTN2_HEADS][4];
    const int nv = (hd - i0) / 8 < 4 ? (hd - i0) / 8 : 4;
#pragma GCC unroll 2
    for (int j = 0; j < NJ; j++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) acc[j][v] = _mm256_setzero_ps();
    if (nv == 4) {
        for (int p = 0; p < n_pos; p++) {
            __m256 vv[4];
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) vv[v] = kv_load8(V, stride, kv_f16, p, i0 + 8 * v);
#pragma GCC unroll 2
            for (int j = 0; j < NJ; j++) {
                const __m256 wj = _mm256_set1_ps(w[(size_t)j * n_pos + p]);
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++) acc[j][v] = _mm256_fmadd_ps(wj, vv[v], acc[j][v]);
            }
        }
    } else {  /* the last group of a head size that is not a multiple of 32 */
        for (int p = 0; p < n_pos; p++)
            for (int v = 0; v < nv; v++) {
                const __m256 vv = kv_load8(V, stride, kv_f16, p, i0 + 8 * v);
                for (int j = 0; j < NJ; j++)
                    acc[j][v] = _mm256_fmadd_ps(_mm256_set1_ps(w[(size_t)j * n_pos + p]), vv, acc[j][v]);
            }
    }
    for (int j = 0; j < NJ; j++)
        for (int v = 0; v < nv; v++) _mm256_storeu_ps(out + (size_t)j * hd + i0 + 8 * v, acc[j][v]);
}

/* kernels_avx512.c's three passes at 8 lanes, over the g query heads that
 * share one KV head: 1. scores 8 positions at a time (the block's K rows
 * converted to f32 once for all g heads); 2. softmax per head (exp256);
 * 3. weighted V, 32 outputs of up to ATTN2_HEADS heads at a time.  Per head
 * every operation and its order are the same whatever g is, and a
 * position's score does not depend on n_pos (blocks start at position 0).
 * Head sizes that are not a multiple of 8 take cb_attn_generic. */
T2 static INL void attn_body8(const float *q, int g, const int hd, const void *K, const void *V, size_t stride,
                              int kv_f16, int n_pos, float scale, float *scores, float *out) {
    _Alignas(32) float kb[8 * CB_MAX_HEAD_DIM];
    const __m256 vscale = _mm256_set1_ps(scale);
    const size_t row = stride * (kv_f16 ? sizeof(uint16_t) : sizeof(float));
    /* 1. scores[j][p] = scale * dot(q[j], K[p]) */
    for (int p0 = 0; p0 < n_pos; p0 += 8) {
        const int np = n_pos - p0 < 8 ? n_pos - p0 : 8;
        /* as kernels_avx512.c: prefetch the next K block's rows and this block's V rows, row by row */
        const int nk = n_pos - p0 - 8 < 8 ? n_pos - p0 - 8 : 8;
        const char *kn = (const char *)K + (size_t)(p0 + 8) * row, *vb = (const char *)V + (size_t)p0 * row;
        for (int p = 0; p < 8; p++) {
            for (size_t b = (size_t)p * row; b < (size_t)(p + 1) * row; b += 64) {
                if (p < nk) _mm_prefetch(kn + b, _MM_HINT_T0);
                if (p < np) _mm_prefetch(vb + b, _MM_HINT_T0);
            }
            for (int i = 0; i < hd; i += 8)
                _mm256_store_ps(kb + (size_t)p * hd + i, p < np ? kv_load8(K, stride, kv_f16, p0 + p, i) : _mm256_setzero_ps());
        }
        for (int j = 0; j < g; j++) {
            _Alignas(32) float sc[8];
            _mm256_store_ps(sc, _mm256_mul_ps(attn_scores8(q + (size_t)j * hd, hd, kb), vscale));
            memcpy(scores + (size_t)j * n_pos + p0, sc, (size_t)np * sizeof(float));
        }
    }
    /* 2. softmax per head: weights e^(s - max) / sum, in place (lane-wise
     * max and sums, then a fixed reduction; the tail one position at a time) */
    for (int j = 0; j < g; j++) {
        float *sj = scores + (size_t)j * n_pos;
        const int n8 = n_pos & ~7;
        __m256 vmax = _mm256_set1_ps(-INFINITY);
        for (int p = 0; p < n8; p += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(sj + p));
        _Alignas(32) float l[8];
        _mm256_store_ps(l, vmax);
        float mx = l[0];
        for (int i = 1; i < 8; i++) mx = l[i] > mx ? l[i] : mx;
        for (int p = n8; p < n_pos; p++) mx = sj[p] > mx ? sj[p] : mx;
        const __m256 vmx = _mm256_set1_ps(mx);
        __m256 vsum = _mm256_setzero_ps();
        for (int p = 0; p < n8; p += 8) {
            const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sj + p), vmx));
            _mm256_storeu_ps(sj + p, e);
            vsum = _mm256_add_ps(vsum, e);
        }
        float sum = hsum8(vsum);
        if (n8 < n_pos) {
            _Alignas(32) float t[8] = { 0 };
            memcpy(t, sj + n8, (size_t)(n_pos - n8) * sizeof(float));
            _mm256_store_ps(t, exp256(_mm256_sub_ps(_mm256_load_ps(t), vmx)));
            for (int p = n8; p < n_pos; p++) { sj[p] = t[p - n8]; sum += sj[p]; }
        }
        const __m256 inv = _mm256_set1_ps(1.0f / sum);
        for (int p = 0; p < n8; p += 8) _mm256_storeu_ps(sj + p, _mm256_mul_ps(_mm256_loadu_ps(sj + p), inv));
        for (int p = n8; p < n_pos; p++) sj[p] *= 1.0f / sum;
    }
    /* 3. out[j] = sum_p w[j][p] * V[p] */
    for (int i0 = 0; i0 < hd; i0 += ATTN2_VDIM)
        for (int j0 = 0; j0 < g; j0 += ATTN2_HEADS) {
            const float *w = scores + (size_t)j0 * n_pos;
            float *o = out + (size_t)j0 * hd;
            if (g - j0 >= 2) attn_v_block8(w, n_pos, 2, V, stride, kv_f16, hd, i0, o);
            else attn_v_block8(w, n_pos, 1, V, stride, kv_f16, hd, i0, o);
        }
}

/* Same code for every hd, compiled with a constant hd for 64 and 128. */
T2 static void attn_avx2(const float *q, int g, int hd, const void *K, const void *V, size_t stride, int kv_f16,
                         int n_pos, float scale, float *scores, float *out) {
    switch (hd) {
    case 64:  attn_body8(q, g, 64, K, V, stride, kv_f16, n_pos, scale, scores, out); break;
    case 128: attn_body8(q, g, 128, K, V, stride, kv_f16, n_pos, scale, scores, out); break;
    default:
        if (hd % 8 == 0 && hd <= CB_MAX_HEAD_DIM) attn_body8(q, g, hd, K, V, stride, kv_f16, n_pos, scale, scores, out);
        else cb_attn_generic(dot_f32_avx2, axpy_f32_avx2, from_f16_avx2, q, g, hd, K, V, stride, kv_f16, n_pos,
                             scale, scores, out);
        break;
    }
}


/* silu and gelu_tanh at 8 lanes with exp256 (kernels_avx512.c's silu16 and
 * gelu16). */
T2 static INL __m256 silu8(__m256 x) {
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}
T2 static INL __m256 gelu8(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 z = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(-CB_GELU_2K), x),
                                   _mm256_fmadd_ps(_mm256_set1_ps(CB_GELU_A), _mm256_mul_ps(x, x), one));
    return _mm256_div_ps(x, _mm256_add_ps(one, exp256(z)));
}

/* g = act(g) * u over n floats, 8 at a time; the tail through a
 * zero-padded copy. */
T2 static INL void gate_avx2(float *g, const float *u, int64_t n, __m256 (*act)(__m256)) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(g + i, _mm256_mul_ps(act(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
    if (i < n) {
        _Alignas(32) float tg[8] = { 0 }, tu[8] = { 0 };
        memcpy(tg, g + i, (size_t)(n - i) * sizeof(float));
        memcpy(tu, u + i, (size_t)(n - i) * sizeof(float));
        _mm256_store_ps(tg, _mm256_mul_ps(act(_mm256_load_ps(tg)), _mm256_load_ps(tu)));
        memcpy(g + i, tg, (size_t)(n - i) * sizeof(float));
    }
}

T2 static void swiglu_avx2(float *g, const float *u, int64_t n) { gate_avx2(g, u, n, silu8); }
T2 static void geglu_avx2(float *g, const float *u, int64_t n) { gate_avx2(g, u, n, gelu8); }

static const cb_kernels table = {
    CB_SIMD_AVX2, quantize_q8_avx2, matmul_rows_avx2, attn_avx2, to_f16_avx2, cb_rmsnorm_generic,
    swiglu_avx2, geglu_avx2, cb_rope_generic, cb_argmax_generic
};

const cb_kernels *cb_kernels_avx2_table(void);
const cb_kernels *cb_kernels_avx2_table(void) { return &table; }

#else  /* not x86 */

const cb_kernels *cb_kernels_avx2_table(void);
const cb_kernels *cb_kernels_avx2_table(void) { return 0; }

#endif
