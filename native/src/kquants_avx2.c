/*
 * kquants_avx2.c — K-quant matmul with AVX2 (vpmaddubsw + vpmaddwd for the
 * integer block sums; unsigned weights <= 63 times int8 activations cannot
 * saturate the int16 pair sums: 2*63*127 < 32767).  Packed Q4_K / Q5_K /
 * Q6_K matrices run the panel kernels below; Q2_K and Q3_K the row kernels
 * of kquants_simd.h.
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
 * outputs against cb_block_q8k activations: each 64-byte chunk row of a
 * panel is two ymm of 8 outputs x 4 weights.  vpmaddubsw against 4
 * broadcast activation bytes gives each output's pair sums in its lane
 * (int16: for Q4_K the 8 chunks of a sub-block add up to at most
 * 8 * 2 * 15 * 127 = 30480, Q5_K 4 chunks 4 * 2 * 31 * 127 = 31496, Q6_K 2
 * chunks 2 * 2 * 63 * 127 = 32004), and vpmaddwd against the sub-block's
 * scale (both int16 halves of each lane) finishes sc * sum in int32: the
 * scales cost nothing beyond the int32 widening.  Mins and Q6_K's -32
 * offsets: vpmaddwd of int16 pairs against the activations' sums.  Then the
 * float step of kquants.h per (row, output, super-block), so the results
 * are the scalar path's bits whatever the tile or the work split. */

/* Activation rows per tile: each sub-block's 8 weight vectors are decoded
 * once per tile, so 8 rows halve that cost against 4; with 16 ymm the
 * weights no longer all stay in registers and the compiler reloads some
 * from L1, which costs load slots, not ALU ones (bench_kquants, AVX2,
 * Intel Xeon: Q4_K +5%, Q6_K +5-9%, Q5_K +24% against 4 rows). */
#define KP2_ROWS 8
#define KP2_PF_PANELS 2  /* panels between a panel's software prefetch and its use */
#define KP2_ROW_BLOCK_BYTES (192 * 1024)  /* int8 activations per row block (L2-resident) */

#define KP2_INL static inline __attribute__((always_inline))

KQ_ATTR KP2_INL __m256i kp2_bcast(const cb_i32u *x) { return _mm256_set1_epi32(*x); }

/* Int16 pairs (a_o, b_o) of two 8-byte rows in lane o (o < 8). */
KQ_ATTR KP2_INL __m256i kp2_pairs_u8(__m128i a, __m128i b) { return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(a, b)); }
KQ_ATTR KP2_INL __m256i kp2_pairs_i8(__m128i a, __m128i b) { return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b)); }
/* The same of bytes 8..15 of two 16-byte rows (half 1 of a panel's scale rows). */
KQ_ATTR KP2_INL __m256i kp2_pairs_u8_hi(__m128i a, __m128i b) { return _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(a, b)); }

/* The 8 outputs' accumulators: acc[r] += u (in memory: the ymm go to weights and sums). */
KQ_ATTR KP2_INL void kp2_acc(float *acc, __m256 u) { _mm256_store_ps(acc, _mm256_add_ps(_mm256_load_ps(acc), u)); }

/* Sub-block scales (int16 lanes s_0 s_0 s_1 s_1 ...: kp2_pairs_u8(s, s)) and
 * mins (int16 pairs m_2k, m_2k+1) of both halves of a Q4_K / Q5_K panel
 * super-block at once: each 16-byte scale row holds half 0's 8 outputs then
 * half 1's, so the 6-bit unpacking runs once for the 16 outputs and the
 * low / high byte pairs split the halves. */
KQ_ATTR KP2_INL void kp2_scales_q45(const uint8_t *p, __m256i (*sc)[8], __m256i (*mp)[4]) {
    __m128i S[12], mn[8];
#pragma GCC unroll 12
    for (int k = 0; k < 12; k++) S[k] = _mm_loadu_si128((const __m128i *)(p + 64 + 16 * k));
    const __m128i m6 = _mm_set1_epi8(63), m4 = _mm_set1_epi8(15), top2 = _mm_set1_epi8(0x30);
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        __m128i s8;
        if (j < 4) {
            s8 = _mm_and_si128(S[j], m6);
            mn[j] = _mm_and_si128(S[j + 4], m6);
        } else {
            s8 = _mm_or_si128(_mm_and_si128(S[j + 4], m4), _mm_and_si128(_mm_srli_epi16(S[j - 4], 2), top2));
            mn[j] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(S[j + 4], 4), m4), _mm_and_si128(_mm_srli_epi16(S[j], 2), top2));
        }
        sc[0][j] = kp2_pairs_u8(s8, s8);
        sc[1][j] = kp2_pairs_u8_hi(s8, s8);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        mp[0][k] = kp2_pairs_u8(mn[2 * k], mn[2 * k + 1]);
        mp[1][k] = kp2_pairs_u8_hi(mn[2 * k], mn[2 * k + 1]);
    }
}

/* Super-block s (at p) of half hv (8 outputs) of a Q4_K / Q5_K panel x R
 * rows, its scales and mins from kp2_scales_q45: acc[r] += its float step. */
KQ_ATTR KP2_INL void kp2_sb_q45(const int q5, const int R, const uint8_t *p, int hv, int nh, int64_t s, int64_t nsb,
                                const __m256i *sc, const __m256i *mp, const cb_block_q8k *xr, float (*acc)[8],
                                const uint8_t *pf, size_t pb) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    {
        __m256i isum[KP2_ROWS];
        const uint8_t *qs = p + (q5 ? 768 : 256) + 32 * hv;
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) isum[r] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            kq_prefetch_part(pf, pb, 8 * hv + j, 8 * nh);
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
            const __m256i scj = sc[j];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const cb_i32u *x4 = (const cb_i32u *)(xr[(int64_t)r * nsb + s].qs + 32 * j);
                if (q5) {  /* 5-bit: four chunks per int16 sum */
#pragma GCC unroll 2
                    for (int c = 0; c < 8; c += 4) {
                        __m256i p16 = _mm256_maddubs_epi16(W[c], kp2_bcast(x4 + c));
#pragma GCC unroll 3
                        for (int e = 1; e < 4; e++) p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(W[c + e], kp2_bcast(x4 + c + e)));
                        isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p16, scj));
                    }
                } else {
                    __m256i p16 = _mm256_maddubs_epi16(W[0], kp2_bcast(x4));
#pragma GCC unroll 7
                    for (int c = 1; c < 8; c++) p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(W[c], kp2_bcast(x4 + c)));
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p16, scj));
                }
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * hv)));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * hv)));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const cb_block_q8k *xb = xr + (int64_t)r * nsb + s;
            const cb_i32u *b2 = (const cb_i32u *)xb->bs32;
            __m256i ms = _mm256_madd_epi16(mp[0], kp2_bcast(b2));
#pragma GCC unroll 3
            for (int k = 1; k < 4; k++) ms = _mm256_add_epi32(ms, _mm256_madd_epi16(mp[k], kp2_bcast(b2 + k)));
            const __m256 a = _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum[r]));
            const __m256 b = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(ms));
            kp2_acc(acc[r], _mm256_mul_ps(_mm256_sub_ps(a, b), _mm256_set1_ps(xb->d)));
        }
    }
}

/* The 4 chunks of half hv (8 outputs) of Q6_K panel group g (kquants.h's
 * regrouped layout; g points at the half): unsigned q in 0..63. */
KQ_ATTR KP2_INL void kp2_q6_group(const uint8_t *g, __m256i *W) {
    const __m256i m63 = _mm256_set1_epi8(63);
    const __m256i a = _mm256_loadu_si256((const __m256i *)g), b = _mm256_loadu_si256((const __m256i *)(g + 64)),
                  c = _mm256_loadu_si256((const __m256i *)(g + 128));
    W[0] = _mm256_and_si256(a, m63);
    W[1] = _mm256_and_si256(b, m63);
    W[2] = _mm256_and_si256(c, m63);
    W[3] = _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 6), _mm256_set1_epi8(3)),
                                           _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi8(12))),
                           _mm256_and_si256(_mm256_srli_epi16(c, 2), _mm256_set1_epi8(48)));
}

/* Super-block s (at p) of half hv of a Q6_K panel x R rows; the -32
 * offsets at its end as sum_i (-32 sc_i) * bs16_i. */
KQ_ATTR KP2_INL void kp2_sb_q6(const int R, const uint8_t *p, int hv, int nh, int64_t s, int64_t nsb,
                               const cb_block_q8k *xr, float (*acc)[8], const uint8_t *pf, size_t pb) {
    {
        __m256i isum[KP2_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) isum[r] = _mm256_setzero_si256();
        for (int b = 0; b < 8; b++) {
            kq_prefetch_part(pf, pb, 8 * hv + b, 8 * nh);
            /* each sub-block scale in both int16 halves of its output's lane */
            const __m128i sl8 = _mm_loadl_epi64((const __m128i *)(p + 32 + 16 * (2 * b) + 8 * hv));
            const __m128i sh8 = _mm_loadl_epi64((const __m128i *)(p + 32 + 16 * (2 * b + 1) + 8 * hv));
            const __m256i sl = kp2_pairs_i8(sl8, sl8);
            const __m256i sh = kp2_pairs_i8(sh8, sh8);
            __m256i W[8];
            kp2_q6_group(p + 288 + 192 * (2 * b) + 32 * hv, W);
            kp2_q6_group(p + 288 + 192 * (2 * b + 1) + 32 * hv, W + 4);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const cb_i32u *x4 = (const cb_i32u *)(xr[(int64_t)r * nsb + s].qs + 32 * b);
                __m256i t = isum[r];
#pragma GCC unroll 4
                for (int c = 0; c < 8; c += 2) {
                    const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(W[c], kp2_bcast(x4 + c)),
                                                         _mm256_maddubs_epi16(W[c + 1], kp2_bcast(x4 + c + 1)));
                    t = _mm256_add_epi32(t, _mm256_madd_epi16(p16, c < 4 ? sl : sh));
                }
                isum[r] = t;
            }
        }
        __m256i op[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m256i pr = kp2_pairs_i8(_mm_loadl_epi64((const __m128i *)(p + 32 + 16 * (2 * k) + 8 * hv)),
                                            _mm_loadl_epi64((const __m128i *)(p + 32 + 16 * (2 * k + 1) + 8 * hv)));
            op[k] = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(pr, 5));
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * hv)));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const cb_block_q8k *xb = xr + (int64_t)r * nsb + s;
            const cb_i32u *b2 = (const cb_i32u *)xb->bs16;
            __m256i t = isum[r];
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) t = _mm256_add_epi32(t, _mm256_madd_epi16(op[k], kp2_bcast(b2 + k)));
            const __m256 a = _mm256_mul_ps(d, _mm256_cvtepi32_ps(t));
            kp2_acc(acc[r], _mm256_mul_ps(a, _mm256_set1_ps(xb->d)));
        }
    }
}

/* One panel (16 outputs, no <= 16 of them wanted) x R rows: super-blocks
 * outer and the two halves inner, so each 64-byte panel row is consumed
 * whole while it is in L1 (two passes over the panel, one per half, left
 * the first pass waiting on DRAM at half the work per line); pf: the panel
 * KP2_PF_PANELS ahead, prefetched into L2 a super-block per super-block,
 * spread over its inner steps (the first row tile only), as the AVX-512
 * kernels do. */
KQ_ATTR KP2_INL void kp2_tile(const int type, const int R, const uint8_t *panel, int64_t nsb,
                              const cb_block_q8k *xr, float *y, int64_t ldy, int no, const uint8_t *pf) {
    const size_t pb = cb_pack_block_bytes(type);
    _Alignas(32) float acc[2][KP2_ROWS][8] = { { { 0 } } };
    const int nh = no > 8 ? 2 : 1;
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *p = panel + (size_t)s * pb, *pfs = pf ? pf + (size_t)s * pb : NULL;
        if (type == CB_TYPE_Q6_K) {
            for (int hv = 0; hv < nh; hv++) kp2_sb_q6(R, p, hv, nh, s, nsb, xr, acc[hv], pfs, pb);
        } else {
            __m256i sc[2][8], mp[2][4];
            kp2_scales_q45(p, sc, mp);
            for (int hv = 0; hv < nh; hv++)
                kp2_sb_q45(type == CB_TYPE_Q5_K, R, p, hv, nh, s, nsb, sc[hv], mp[hv], xr, acc[hv], pfs, pb);
        }
    }
    for (int hv = 0; hv < nh; hv++) {
        const int n = no - 8 * hv < 8 ? no - 8 * hv : 8;
        for (int r = 0; r < R; r++) memcpy(y + (int64_t)r * ldy + 8 * hv, acc[hv][r], (size_t)n * sizeof(float));
    }
}

/* Panels over outputs [o0, o1) (o0 a multiple of CB_PANEL) in row blocks
 * whose int8 activations stay in L2 while the panels pass over them (as
 * kquants_avx512.c), rows in tiles of KP2_ROWS; the split changes which tile
 * a row is in, never the order of a row's float steps. */
KQ_ATTR KP2_INL void kp2_rows(const int type, const cb_weight *w, const cb_block_q8k *xk,
                              int n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t nsb = w->n_in / CB_QK_K;
    const size_t psz = (size_t)nsb * cb_pack_block_bytes(type);
    const int pfp = cb_prefetch_panels(type, n_rows);
    int rb = (int)(KP2_ROW_BLOCK_BYTES / ((size_t)nsb * sizeof(cb_block_q8k)));
    rb = rb < KP2_ROWS ? KP2_ROWS : rb - rb % KP2_ROWS;
    for (int r0 = 0; r0 < n_rows; r0 += rb) {
        const int r1 = r0 + rb < n_rows ? r0 + rb : n_rows;
        for (int64_t o = o0; o < o1; o += CB_PANEL) {
            const uint8_t *panel = (const uint8_t *)w->packed + (size_t)(o / CB_PANEL) * psz;
            const int no = (int)(o1 - o < CB_PANEL ? o1 - o : CB_PANEL);
            const uint8_t *pf = pfp && o + KP2_PF_PANELS * CB_PANEL < w->n_out ? panel + KP2_PF_PANELS * psz : NULL;
            for (int r = r0, R; r < r1; r += R, pf = NULL) {
                R = r1 - r >= 8 ? 8 : r1 - r < 4 ? r1 - r : 4;
                const cb_block_q8k *xr = xk + (int64_t)r * nsb;
                float *yr = y + r * ldy + o;
                switch (R) {  /* a constant row count per call (8, then 4, then the tail): the row loops unroll */
                case 8: kp2_tile(type, 8, panel, nsb, xr, yr, ldy, no, pf); break;
                case 4: kp2_tile(type, 4, panel, nsb, xr, yr, ldy, no, pf); break;
                case 3: kp2_tile(type, 3, panel, nsb, xr, yr, ldy, no, pf); break;
                case 2: kp2_tile(type, 2, panel, nsb, xr, yr, ldy, no, pf); break;
                default: kp2_tile(type, 1, panel, nsb, xr, yr, ldy, no, pf); break;
                }
            }
        }
    }
}

KQ_ATTR static void kp2_matmul_q4_K(const cb_weight *w, const cb_block_q8k *xk, int n_rows, float *y,
                                    int64_t ldy, int64_t o0, int64_t o1) {
    kp2_rows(CB_TYPE_Q4_K, w, xk, n_rows, y, ldy, o0, o1);
}

KQ_ATTR static void kp2_matmul_q5_K(const cb_weight *w, const cb_block_q8k *xk, int n_rows, float *y,
                                    int64_t ldy, int64_t o0, int64_t o1) {
    kp2_rows(CB_TYPE_Q5_K, w, xk, n_rows, y, ldy, o0, o1);
}

KQ_ATTR static void kp2_matmul_q6_K(const cb_weight *w, const cb_block_q8k *xk, int n_rows, float *y,
                                    int64_t ldy, int64_t o0, int64_t o1) {
    kp2_rows(CB_TYPE_Q6_K, w, xk, n_rows, y, ldy, o0, o1);
}

/* cb_kq_quantize_q8k_scalar's bytes (see kquants_avx512.c). */
KQ_ATTR static void kq2_quantize_q8k(const float *x, cb_block_q8k *q, int64_t n) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < n / CB_QK_K; b++) {
        const float *xb = x + b * CB_QK_K;
        __m256 mx = _mm256_setzero_ps();
        for (int i = 0; i < 32; i++) mx = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + 8 * i), absm), mx);
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float d = _mm_cvtss_f32(m4) / 127.0f;
        const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
        for (int g = 0; g < 8; g++) {  /* 32 values */
            __m256i v[4];
            for (int e = 0; e < 4; e++) {
                v[e] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 32 * g + 8 * e), id));
                v[e] = _mm256_min_epi32(_mm256_max_epi32(v[e], nlim), lim);
            }
            const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            _mm256_storeu_si256((__m256i *)(q[b].qs + 32 * g), _mm256_permutevar8x32_epi32(p, perm));
            q[b].bs16[2 * g] = (int16_t)hsum8_avx2(_mm256_add_epi32(v[0], v[1]));
            q[b].bs16[2 * g + 1] = (int16_t)hsum8_avx2(_mm256_add_epi32(v[2], v[3]));
            q[b].bs32[g] = (int16_t)(q[b].bs16[2 * g] + q[b].bs16[2 * g + 1]);
        }
        q[b].d = d;
        memset(q[b].pad, 0, sizeof q[b].pad);  /* defined bytes: blocks compare with memcmp */
    }
}

int cb_kq_quantize_q8k_avx2(const float *x, cb_block_q8k *q, int64_t n) {
    kq2_quantize_q8k(x, q, n);
    return 1;
}

int cb_kq_matmul_rows_avx2(const cb_weight *w, const cb_block_q8 *xq, const cb_block_q8k *xk, int n_rows,
                           float *y, int64_t ldy, int64_t o0, int64_t o1) {
    switch (w->type) {
    case CB_TYPE_Q2_K: matmul_q23_K_avx2(0, w, xq, n_rows, y, ldy, o0, o1); return 1;
    case CB_TYPE_Q3_K: matmul_q23_K_avx2(1, w, xq, n_rows, y, ldy, o0, o1); return 1;
    case CB_TYPE_Q4_K: if (!w->packed) return 0; kp2_matmul_q4_K(w, xk, n_rows, y, ldy, o0, o1); return 1;
    case CB_TYPE_Q5_K: if (!w->packed) return 0; kp2_matmul_q5_K(w, xk, n_rows, y, ldy, o0, o1); return 1;
    case CB_TYPE_Q6_K: if (!w->packed) return 0; kp2_matmul_q6_K(w, xk, n_rows, y, ldy, o0, o1); return 1;
    default: return 0;
    }
}

#else  /* not x86 */

int cb_kq_matmul_rows_avx2(const cb_weight *w, const cb_block_q8 *xq, const cb_block_q8k *xk, int n_rows,
                           float *y, int64_t ldy, int64_t o0, int64_t o1) { return 0; }
int cb_kq_quantize_q8k_avx2(const float *x, cb_block_q8k *q, int64_t n) { return 0; }

#endif
