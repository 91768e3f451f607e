/*
 * kquants_avx2.c — K-quant matmul with AVX2 (vpmaddubsw + vpmaddwd for the
 * integer block sums; unsigned weights <= 63 times int8 activations cannot
 * saturate the int16 pair sums: 2*63*127 < 32767).  Packed Q4_K / Q5_K /
 * Q6_K matrices run the panel kernels below; unpacked ones, Q2_K and Q3_K
 * the row kernels of kquants_simd.h.
 */
#include "kquants.h"
#include "colibri.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#define KQ_ATTR __attribute__((target("avx2,fma,f16c")))
#define KQ_FN(name) name##_avx2
KQ_ATTR static inline __m256i kq_mulsum_avx2(__m256i wu, __m256i xs) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(wu, xs), _mm256_set1_epi16(1));
}
#define KQ_MULSUM(a, b) kq_mulsum_avx2(a, b)
#include "kquants_simd.h"

/* ------------------------------------------------------------ panel kernels
 *
 * Q4_K, Q5_K and Q6_K matrices packed at model load (the panel layout of
 * kquants.h, the one the AVX-512 kernels read) run here as two halves of 8
 * outputs: each 64-byte chunk row of a panel is two ymm of 8 outputs x 4
 * weights.  vpmaddubsw against 4 broadcast activation bytes gives each
 * output's pair sums in its lane (int16: for 4-bit quants the 8 chunks of a
 * block add up to at most 8 * 2 * 15 * 127 = 30480, for Q5_K / Q6_K two
 * chunks at a time, <= 2 * 2 * 63 * 127 = 32004), one vpmaddwd finishes the
 * int32 sums, and the scale arithmetic runs on 8 outputs at once: no
 * horizontal sums.  Per (activation row, output) the float steps are those
 * of the AVX-512 panel kernels, in block order, so the result does not
 * depend on the tile or the work split (batch invariance). */

#define KP2_ROWS 4  /* activation rows per tile: 8 weight vectors + 4 accumulators fit the 16 ymm */

typedef int32_t kq2_i32u __attribute__((may_alias, aligned(1)));

KQ_ATTR static inline __m256i kp2_bcast(const kq2_i32u *x) { return _mm256_set1_epi32(*x); }

/* d * sc_j and dmin * m_j of 8 outputs (half hv of a Q4_K / Q5_K panel super-block). */
KQ_ATTR static inline __attribute__((always_inline)) void kp2_scales_q45(const uint8_t *p, int hv, __m256 *dsc, __m256 *dmm) {
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * hv)));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * hv)));
    __m128i S[12];
#pragma GCC unroll 12
    for (int k = 0; k < 12; k++) S[k] = _mm_loadl_epi64((const __m128i *)(p + 64 + 16 * k + 8 * hv));
    const __m128i m6 = _mm_set1_epi8(63), m4 = _mm_set1_epi8(15), top2 = _mm_set1_epi8(0x30);
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        __m128i sc, mn;
        if (j < 4) {
            sc = _mm_and_si128(S[j], m6);
            mn = _mm_and_si128(S[j + 4], m6);
        } else {
            sc = _mm_or_si128(_mm_and_si128(S[j + 4], m4), _mm_and_si128(_mm_srli_epi16(S[j - 4], 2), top2));
            mn = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(S[j + 4], 4), m4), _mm_and_si128(_mm_srli_epi16(S[j], 2), top2));
        }
        dsc[j] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc)));
        dmm[j] = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn)));
    }
}

/* Half hv (8 outputs) of one Q4_K / Q5_K panel x R rows. */
KQ_ATTR static inline __attribute__((always_inline)) void kp2_tile_q45(const int q5, const int R, const uint8_t *panel, int hv, int64_t nsb, int64_t nb,
                                 const cb_block_q8 *xr, float *y, int64_t ldy, int no) {
    const size_t pb = q5 ? 16 * 176 : 16 * 144;
    const __m256i lo4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10), ones = _mm256_set1_epi16(1);
    __m256 acc[KP2_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *p = panel + (size_t)s * pb;
        __m256 dsc[8], dmm[8];
        kp2_scales_q45(p, hv, dsc, dmm);
        const uint8_t *qs = p + (q5 ? 768 : 256) + 32 * hv;
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = qs + 512 * (j >> 1);
            __m256i W[8];
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 64 * c));
                W[c] = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(v, 4) : v, lo4);
                if (q5) {
                    const __m256i h = _mm256_loadu_si256((const __m256i *)(p + 256 + 64 * c + 32 * hv));
                    const __m256i hb = j <= 4 ? _mm256_slli_epi16(h, 4 - j) : _mm256_srli_epi16(h, j - 4);
                    W[c] = _mm256_or_si256(W[c], _mm256_and_si256(hb, b4));
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const cb_block_q8 *xb = xr + (int64_t)r * nb + s * 8 + j;
                const kq2_i32u *x4 = (const kq2_i32u *)xb->qs;
                __m256i is;
                if (q5) {  /* 5-bit: two chunks per int16 sum */
                    is = _mm256_setzero_si256();
#pragma GCC unroll 4
                    for (int c = 0; c < 8; c += 2) {
                        const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(W[c], kp2_bcast(x4 + c)),
                                                              _mm256_maddubs_epi16(W[c + 1], kp2_bcast(x4 + c + 1)));
                        is = _mm256_add_epi32(is, _mm256_madd_epi16(p16, ones));
                    }
                } else {
                    __m256i p16 = _mm256_maddubs_epi16(W[0], kp2_bcast(x4));
#pragma GCC unroll 7
                    for (int c = 1; c < 8; c++) p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(W[c], kp2_bcast(x4 + c)));
                    is = _mm256_madd_epi16(p16, ones);
                }
                const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(is), _mm256_set1_ps(xb->d));
                acc[r] = _mm256_fmadd_ps(t, dsc[j], acc[r]);
                acc[r] = _mm256_fnmadd_ps(dmm[j], _mm256_set1_ps(xb->s), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        _Alignas(32) float out[8];
        _mm256_store_ps(out, acc[r]);
        memcpy(y + (int64_t)r * ldy, out, (size_t)no * sizeof(float));
    }
}

/* Half hv of one Q6_K panel x R rows; xc: -32 x each 16-activation half's sum. */
KQ_ATTR static inline __attribute__((always_inline)) void kp2_tile_q6(const int R, const uint8_t *panel, int hv, int64_t nsb, int64_t nb,
                                const cb_block_q8 *xr, const int32_t *xc, float *y, int64_t ldy, int no) {
    const size_t pb = 16 * 210;
    const __m256i lo4 = _mm256_set1_epi8(0x0F), b45 = _mm256_set1_epi8(0x30), ones = _mm256_set1_epi16(1);
    __m256 acc[KP2_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *p = panel + (size_t)s * pb;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * hv)));
        for (int b = 0; b < 8; b++) {
            const int h = b >> 2, k = b & 3;
            const uint8_t *ql = p + 288 + 1024 * h + 512 * (k & 1) + 32 * hv, *qh = p + 2336 + 512 * h + 32 * hv;
            const __m256 sl = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                  _mm_loadl_epi64((const __m128i *)(p + 32 + 16 * (2 * b) + 8 * hv)))));
            const __m256 sh = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                  _mm_loadl_epi64((const __m128i *)(p + 32 + 16 * (2 * b + 1) + 8 * hv)))));
            __m256i W[8];
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                const __m256i l = _mm256_loadu_si256((const __m256i *)(ql + 64 * c));
                const __m256i hq = _mm256_loadu_si256((const __m256i *)(qh + 64 * c));
                const __m256i nib = _mm256_and_si256(k & 2 ? _mm256_srli_epi16(l, 4) : l, lo4);
                const __m256i hi = _mm256_and_si256(k < 3 ? _mm256_slli_epi16(hq, 4 - 2 * k) : _mm256_srli_epi16(hq, 2), b45);
                W[c] = _mm256_or_si256(nib, hi);
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const int64_t bi = (int64_t)r * nb + s * 8 + b;
                const cb_block_q8 *xb = xr + bi;
                const kq2_i32u *x4 = (const kq2_i32u *)xb->qs;
                __m256i s0 = _mm256_set1_epi32(xc[2 * bi]), s1 = _mm256_set1_epi32(xc[2 * bi + 1]);
#pragma GCC unroll 2
                for (int c = 0; c < 4; c += 2) {
                    s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_add_epi16(
                             _mm256_maddubs_epi16(W[c], kp2_bcast(x4 + c)),
                             _mm256_maddubs_epi16(W[c + 1], kp2_bcast(x4 + c + 1))), ones));
                    s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_add_epi16(
                             _mm256_maddubs_epi16(W[c + 4], kp2_bcast(x4 + c + 4)),
                             _mm256_maddubs_epi16(W[c + 5], kp2_bcast(x4 + c + 5))), ones));
                }
                const __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), sl, _mm256_mul_ps(_mm256_cvtepi32_ps(s1), sh));
                acc[r] = _mm256_fmadd_ps(t, _mm256_set1_ps(xb->d), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        _Alignas(32) float out[8];
        _mm256_store_ps(out, acc[r]);
        memcpy(y + (int64_t)r * ldy, out, (size_t)no * sizeof(float));
    }
}

KQ_ATTR static inline __attribute__((always_inline)) void kp2_tile(const int type, const int R, const uint8_t *panel,
        int hv, int64_t nsb, int64_t nb, const cb_block_q8 *xr, const int32_t *xc, float *y, int64_t ldy, int no) {
    if (type == CB_TYPE_Q6_K) kp2_tile_q6(R, panel, hv, nsb, nb, xr, xc, y, ldy, no);
    else kp2_tile_q45(type == CB_TYPE_Q5_K, R, panel, hv, nsb, nb, xr, y, ldy, no);
}

/* Panels over outputs [o0, o1) (o0 a multiple of CB_PANEL), each as two
 * halves of 8 outputs, rows in tiles of KP2_ROWS. */
KQ_ATTR static inline __attribute__((always_inline)) void kp2_rows(const int type, const cb_weight *w, const cb_block_q8 *xq, const int32_t *xc,
                             int n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t nsb = w->n_in / CB_QK_K, nb = w->n_in / CB_QK;
    const size_t psz = (size_t)nsb * cb_pack_block_bytes(type);
    for (int64_t o = o0; o < o1; o += CB_PANEL) {
        const uint8_t *panel = (const uint8_t *)w->packed + (size_t)(o / CB_PANEL) * psz;
        for (int hv = 0; hv < 2; hv++) {
            const int64_t oh = o + 8 * hv;
            if (oh >= o1) break;
            const int no = (int)(o1 - oh < 8 ? o1 - oh : 8);
            for (int r = 0; r < n_rows; r += KP2_ROWS) {
                const int R = n_rows - r < KP2_ROWS ? n_rows - r : KP2_ROWS;
                const cb_block_q8 *xr = xq + (int64_t)r * nb;
                float *yr = y + r * ldy + oh;
                const int32_t *xcr = xc ? xc + 2 * (int64_t)r * nb : NULL;
                switch (R) {  /* a constant row count per call: the row loops unroll */
                case 4: kp2_tile(type, 4, panel, hv, nsb, nb, xr, xcr, yr, ldy, no); break;
                case 3: kp2_tile(type, 3, panel, hv, nsb, nb, xr, xcr, yr, ldy, no); break;
                case 2: kp2_tile(type, 2, panel, hv, nsb, nb, xr, xcr, yr, ldy, no); break;
                default: kp2_tile(type, 1, panel, hv, nsb, nb, xr, xcr, yr, ldy, no); break;
                }
            }
        }
    }
}

KQ_ATTR static void kp2_matmul_q4_K(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                                    int64_t ldy, int64_t o0, int64_t o1) {
    kp2_rows(CB_TYPE_Q4_K, w, xq, NULL, n_rows, y, ldy, o0, o1);
}

KQ_ATTR static void kp2_matmul_q5_K(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                                    int64_t ldy, int64_t o0, int64_t o1) {
    kp2_rows(CB_TYPE_Q5_K, w, xq, NULL, n_rows, y, ldy, o0, o1);
}

#define KP2_XC_MAX (2 * CB_PACK_MAX_BLOCKS)

KQ_ATTR static void kp2_matmul_q6_K(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                                    int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t nb = w->n_in / CB_QK;
    if (nb <= 0) return;
    _Alignas(32) int32_t xc[KP2_XC_MAX];
    int64_t g = KP2_XC_MAX / (2 * nb);
    if (g >= KP2_ROWS) g -= g % KP2_ROWS;
    for (int r0 = 0; r0 < n_rows; r0 += (int)g) {
        const int r1 = r0 + g < n_rows ? r0 + (int)g : n_rows;
        cb_kq_q6_offsets(xq + (int64_t)r0 * nb, (int64_t)(r1 - r0) * nb, xc);
        kp2_rows(CB_TYPE_Q6_K, w, xq + (int64_t)r0 * nb, xc, r1 - r0, y + (int64_t)r0 * ldy, ldy, o0, o1);
    }
}

int cb_kq_matmul_rows_avx2(const cb_weight *w, const cb_block_q8 *xq, int n_rows,
                           float *y, int64_t ldy, int64_t o0, int64_t o1) {
    switch (w->type) {
    case CB_TYPE_Q2_K: matmul_q23_K_avx2(0, w, xq, n_rows, y, ldy, o0, o1); return 1;
    case CB_TYPE_Q3_K: matmul_q23_K_avx2(1, w, xq, n_rows, y, ldy, o0, o1); return 1;
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K:
        if (w->packed && w->type == CB_TYPE_Q4_K) kp2_matmul_q4_K(w, xq, n_rows, y, ldy, o0, o1);
        else if (w->packed) kp2_matmul_q5_K(w, xq, n_rows, y, ldy, o0, o1);
        else matmul_q45_K_avx2(w->type == CB_TYPE_Q5_K, w, xq, n_rows, y, ldy, o0, o1);
        return 1;
    case CB_TYPE_Q6_K:
        if (w->packed) kp2_matmul_q6_K(w, xq, n_rows, y, ldy, o0, o1);
        else matmul_q6_K_avx2(w, xq, n_rows, y, ldy, o0, o1);
        return 1;
    default: return 0;
    }
}

#else  /* not x86 */

int cb_kq_matmul_rows_avx2(const cb_weight *w, const cb_block_q8 *xq, int n_rows,
                           float *y, int64_t ldy, int64_t o0, int64_t o1) { return 0; }

#endif
