/*
 * kernels_avx512.c — AVX-512 F/BW/VL + VNNI kernels.
 *
 * Compiled with per-function target attributes (the build uses plain flags),
 * selected at run time by cb_kernels_get() only when cb_simd_detect() says
 * the CPU and OS support it.
 *
 * Quantized weights (Q4_0, Q4_1, Q5_0, Q8_0) against int8 activation blocks, read
 * in the panel layout built at model load (kernels.h): a zmm lane is one
 * output, so 8 vpdpbusd per block leave a finished integer sum per output
 * and the float work (convert, two scales, fma) is one vector per block per
 * 16 outputs.  vpdpbusd multiplies unsigned weight bytes by signed
 * activation bytes, so
 *   Q4_1: nibbles 0..15 directly, plus the min term m * s (s = d_x * sum q_x);
 *   Q4_0: nibbles 0..15, integer sum started at -8 * sum(q_x) (exact);
 *   Q5_0: nibbles plus the fifth bit (a masked byte add of 16), 0..31,
 *         integer sum started at -16 * sum(q_x);
 *   Q8_0: stored as q + 128, integer sum started at -128 * sum(q_x).
 * Integer sums are exact in any order; the float steps happen per (row r,
 * output o) in block order (see p_tile), whatever the tile, so a result never
 * depends on how many rows are in the batch or which thread computed it:
 * batch invariance.  A quantized matrix without a panel layout (rows past
 * CB_PACK_MAX_BLOCKS) takes the AVX2 kernel.
 *
 * Float weights (F32/F16/BF16): per (r, o) one 16-lane fma accumulator over
 * the row in steps of 16 (masked tail), reduced by hsum16 below.
 */
#include "kernels.h"
#include "colibri.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INL  __attribute__((always_inline)) inline

const cb_kernels *cb_kernels_avx2_table(void);  /* kernels_avx2.c */

/* ---------------------------------------------------------------- helpers */

/* Fixed-tree sum of 16 lanes. */
T512 static INL float hsum16(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_shuffle_ps(b, b, 1));
    return _mm_cvtss_f32(b);
}

static inline __mmask16 tail_mask(int64_t rem) {
    return rem >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << rem) - 1u);
}

/* --------------------------------------------------------- quantization */

/* One block the scalar way: the same steps as the scalar path, so the bytes match it. */
T512 static INL void quantize_block(const float *x, cb_block_q8 *q) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512 vid = _mm512_set1_ps(id);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));  /* round to nearest even */
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
    _mm_storeu_si128((__m128i *)q->qs, _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(q->qs + 16), _mm512_cvtsepi32_epi8(q1));
    const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    q->d = d;
    q->s = d * (float)sum;
}

/* Transposed reductions: 16 vectors in, lane j of the result = the sum (or
 * the max) of vector j's lanes, by a tree of 15 shuffle + op steps instead
 * of 16 horizontal reductions.  Each lane only ever combines lanes of its
 * own vector, in a fixed order (attention's scores depend on that; maxima
 * and integer sums are exact in any order).  Steps: per 128-bit lane
 * [a0 op a2, b0 op b2, a1 op a3, b1 op b3]; then pairs of those; then
 * 128-bit lanes pairwise. */
T512 static INL __m512 tree_op(__m512 a, __m512 b, const int max) { return max ? _mm512_max_ps(a, b) : _mm512_add_ps(a, b); }
T512 static INL __m512 tree1(__m512 a, __m512 b, const int max) {
    return tree_op(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b), max);
}
T512 static INL __m512 tree2(__m512 x, __m512 y, const int max) {
    const __m512d a = _mm512_castps_pd(x), b = _mm512_castps_pd(y);
    return tree_op(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)), max);
}
T512 static INL __m512 tree4(__m512 x, __m512 y, const int max) {
    return tree_op(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xDD), max);
}
T512 static INL __m512 tree16(const __m512 *a, const int max) {
    const __m512 b0 = tree2(tree1(a[0], a[1], max), tree1(a[2], a[3], max), max);
    const __m512 b1 = tree2(tree1(a[4], a[5], max), tree1(a[6], a[7], max), max);
    const __m512 b2 = tree2(tree1(a[8], a[9], max), tree1(a[10], a[11], max), max);
    const __m512 b3 = tree2(tree1(a[12], a[13], max), tree1(a[14], a[15], max), max);
    return tree4(tree4(b0, b1, max), tree4(b2, b3, max), max);
}
/* The same tree over 32-bit integer sums. */
T512 static INL __m512i tsum16(const __m512i *a) {
    __m512i b[8], c[4];
    for (int j = 0; j < 8; j++)
        b[j] = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2 * j], a[2 * j + 1]), _mm512_unpackhi_epi32(a[2 * j], a[2 * j + 1]));
    for (int j = 0; j < 4; j++)
        c[j] = _mm512_add_epi32(_mm512_unpacklo_epi64(b[2 * j], b[2 * j + 1]), _mm512_unpackhi_epi64(b[2 * j], b[2 * j + 1]));
    const __m512i e0 = _mm512_add_epi32(_mm512_shuffle_i32x4(c[0], c[1], 0x88), _mm512_shuffle_i32x4(c[0], c[1], 0xDD));
    const __m512i e1 = _mm512_add_epi32(_mm512_shuffle_i32x4(c[2], c[3], 0x88), _mm512_shuffle_i32x4(c[2], c[3], 0xDD));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(e0, e1, 0x88), _mm512_shuffle_i32x4(e0, e1, 0xDD));
}

/* 16 blocks at a time: their maxima and sums reduced together (one
 * transpose tree each instead of two horizontal reductions per block) and
 * the scales divided as one vector; every value is the scalar path's (IEEE
 * division, exact integer sums, max in any order). */
T512 static void quantize_q8_avx512(const float *x, cb_block_q8 *q, int64_t n) {
    const int64_t nb = n / CB_QK;
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16) {
        const float *xb = x + b * CB_QK;
        __m512 a[16];
        for (int j = 0; j < 16; j++)
            a[j] = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xb + 32 * j)), _mm512_abs_ps(_mm512_loadu_ps(xb + 32 * j + 16)));
        const __m512 d = _mm512_div_ps(tree16(a, 1), _mm512_set1_ps(127.0f));
        const __mmask16 nz = _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_OQ);
        const __m512 id = _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0f), d);
        __m512i sums[16];
        for (int j = 0; j < 16; j++) {
            const __m512 vid = _mm512_permutexvar_ps(_mm512_set1_epi32(j), id);
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 32 * j), vid));
            const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 32 * j + 16), vid));
            _mm_storeu_si128((__m128i *)q[b + j].qs, _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(q[b + j].qs + 16), _mm512_cvtsepi32_epi8(q1));
            sums[j] = _mm512_add_epi32(q0, q1);
        }
        float dd[16], ss[16];
        _mm512_storeu_ps(dd, d);
        _mm512_storeu_ps(ss, _mm512_mul_ps(d, _mm512_cvtepi32_ps(tsum16(sums))));
        for (int j = 0; j < 16; j++) { q[b + j].d = dd[j]; q[b + j].s = ss[j]; }
    }
    for (; b < nb; b++) quantize_block(x + b * CB_QK, q + b);
}

/* ------------------------------------------- quantized matmul, panel layout */

/* acc += dpbusd(w, the 4 activation bytes at x broadcast to every lane) */
CB_BCAST_DOT(T512, dpbusd_bcast, __m512i, "vpdpbusd", 16, _mm512_dpbusd_epi32, _mm512_set1_epi32)

/* Rows of a panel tile (activation rows sharing one unpacking of weights). */
#define PT_ROWS 8
/* Panels between a panel's software prefetch and its use (2 vs 4 in
 * interleaved runs, 2 threads: one stream -1..4%, 8 streams -0..2%). */
#define PF_PANELS 2
/* Q4_0 / Q5_0 / Q8_0 offset corrections precomputed per call (int32 per row-block). */
#define PC_MAX CB_PACK_MAX_BLOCKS

/* One panel (16 outputs) x R activation rows over all nb blocks; y[r][0..16)
 * masked by m.  Per (row r, output lane), in block order:
 *   isum = c_rb + sum_g dpbusd(W_g, x_g)      (exact integers, any order)
 *   acc  = fma(float(isum) * dx_rb, dw, acc)
 *   Q4_1: acc = fma(mw, s_rb, acc)
 * which depends on neither R nor the panel's place in the work split, so a
 * row's outputs are bit-identical however the batch is made up. */
T512 static INL void p_tile(const int type, const int R, const uint8_t *panel, int64_t nb,
                            const cb_block_q8 *xr, const int32_t *xc, float *y, int64_t ldy, __mmask16 m,
                            const uint8_t *pf) {
    const size_t pb = cb_pack_block_bytes(type);  /* constant: the prefetch loop unrolls */
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    __m512 acc[PT_ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = panel + (size_t)b * pb;
        if (pf)  /* the same block of a panel ahead, so its weights stream in while this one computes */
#pragma GCC unroll 16
            for (size_t off = 0; off < pb; off += 64) _mm_prefetch((const char *)pf + (size_t)b * pb + off, _MM_HINT_T1);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        __m512 mw = _mm512_setzero_ps();
        if (type == CB_TYPE_Q4_1) mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
        const uint8_t *q = p + (type == CB_TYPE_Q4_1 ? 64 : type == CB_TYPE_Q5_0 ? 96 : 32);
        __m512i W[8];
        if (type == CB_TYPE_Q8_0) {
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) W[g] = _mm512_loadu_si512((const void *)(q + 64 * g));
        } else {
            /* Q5_0: byte c of each output's regrouped qh word holds the fifth
             * bits of chunk c (low nibbles' in bits 0..3, high nibbles' in
             * 4..7): copy it to the output's 4 bytes, test bit i of byte i */
            const __m512i qh = type == CB_TYPE_Q5_0 ? _mm512_loadu_si512((const void *)(p + 32)) : _mm512_setzero_si512();
            const __m512i route = _mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0);
            const __m512i bit_lo = _mm512_set1_epi32(0x08040201), bit_hi = _mm512_set1_epi32((int)0x80402010u);
            const __m512i b16 = _mm512_set1_epi8(16);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * c));
                W[c] = _mm512_and_si512(v, lo4);
                W[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
                if (type == CB_TYPE_Q5_0) {
                    const __m512i hb = _mm512_shuffle_epi8(qh, _mm512_add_epi8(route, _mm512_set1_epi8((char)c)));
                    W[c] = _mm512_mask_add_epi8(W[c], _mm512_test_epi8_mask(hb, bit_lo), W[c], b16);
                    W[c + 4] = _mm512_mask_add_epi8(W[c + 4], _mm512_test_epi8_mask(hb, bit_hi), W[c + 4], b16);
                }
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const cb_block_q8 *xb = xr + (int64_t)r * nb + b;
            const cb_i32u *xq = (const cb_i32u *)xb->qs;  /* read in place: broadcast from memory, not via a GPR */
            __m512i s0 = type == CB_TYPE_Q4_1 ? _mm512_setzero_si512() : _mm512_set1_epi32(xc[(int64_t)r * nb + b]);
            if (R < 4) {
                /* two dependency chains: few rows are latency-bound on one */
                __m512i s1 = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int g = 0; g < 4; g++) {
                    s0 = dpbusd_bcast(s0, W[g], xq + g);
                    s1 = dpbusd_bcast(s1, W[g + 4], xq + g + 4);
                }
                s0 = _mm512_add_epi32(s0, s1);
            } else {
#pragma GCC unroll 8
                for (int g = 0; g < 8; g++) s0 = dpbusd_bcast(s0, W[g], xq + g);
            }
            const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(s0), _mm512_set1_ps(xb->d));
            acc[r] = _mm512_fmadd_ps(t, dw, acc[r]);
            if (type == CB_TYPE_Q4_1) acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xb->s), acc[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + (int64_t)r * ldy, m, acc[r]);
}

/* Panels over outputs [o0, o1) (o0 a multiple of CB_PANEL) for rows [0, n_rows):
 * panel outer (its weights stay in L1/L2), row tiles of PT_ROWS inner. */
T512 static INL void p_rows(const int type, const cb_weight *w, const cb_block_q8 *xq, const int32_t *xc,
                            int n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t nb = w->n_in / CB_QK;
    const size_t pb = cb_pack_block_bytes(type);
    const int pfp = cb_prefetch_panels(type, n_rows);
    for (int64_t o = o0; o < o1; o += CB_PANEL) {
        const uint8_t *panel = (const uint8_t *)w->packed + (size_t)(o / CB_PANEL) * (size_t)nb * pb;
        const __mmask16 m = tail_mask(o1 - o);
        /* software prefetch (into L2) of the panel PF_PANELS ahead by the
         * first row tile: decode streams every weight once from L3 / DRAM,
         * and the hardware prefetcher alone leaves the kernel waiting at a
         * few rows (into L1 it was slower: L1 holds fewer misses in flight);
         * where the CPU's own prefetcher does better, not (cb_prefetch_panels) */
        const uint8_t *pf = pfp && o + PF_PANELS * CB_PANEL < w->n_out ? panel + (size_t)PF_PANELS * (size_t)nb * pb : NULL;
        int r = 0;
        for (; r + PT_ROWS <= n_rows; r += PT_ROWS, pf = NULL)
            p_tile(type, PT_ROWS, panel, nb, xq + (int64_t)r * nb, xc ? xc + (int64_t)r * nb : NULL,
                   y + r * ldy + o, ldy, m, pf);
        const cb_block_q8 *xr = xq + (int64_t)r * nb;
        const int32_t *xcr = xc ? xc + (int64_t)r * nb : NULL;
        float *yr = y + r * ldy + o;
        switch (n_rows - r) {
        case 7: p_tile(type, 7, panel, nb, xr, xcr, yr, ldy, m, pf); break;
        case 6: p_tile(type, 6, panel, nb, xr, xcr, yr, ldy, m, pf); break;
        case 5: p_tile(type, 5, panel, nb, xr, xcr, yr, ldy, m, pf); break;
        case 4: p_tile(type, 4, panel, nb, xr, xcr, yr, ldy, m, pf); break;
        case 3: p_tile(type, 3, panel, nb, xr, xcr, yr, ldy, m, pf); break;
        case 2: p_tile(type, 2, panel, nb, xr, xcr, yr, ldy, m, pf); break;
        case 1: p_tile(type, 1, panel, nb, xr, xcr, yr, ldy, m, pf); break;
        default: break;
        }
    }
}

/* Q4_0 / Q5_0 / Q8_0: the weights are stored as unsigned q (Q4_0, Q5_0) or q + 128 (Q8_0),
 * so each (row, block) starts its integer sum at -8 or -128 times the sum of
 * the activation bytes (exact), precomputed here for groups of rows. */
T512 static INL void matmul_p(const int type, const cb_weight *w, const cb_block_q8 *xq,
                              int n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t nb = w->n_in / CB_QK;
    if (nb <= 0) return;
    if (type == CB_TYPE_Q4_1) { p_rows(type, w, xq, NULL, n_rows, y, ldy, o0, o1); return; }
    const int32_t k = type == CB_TYPE_Q8_0 ? -128 : type == CB_TYPE_Q5_0 ? -16 : -8;
    _Alignas(64) int32_t xc[PC_MAX];
    int64_t g = PC_MAX / nb;  /* rows per group (>= 1: packed rows have <= PC_MAX blocks) */
    if (g >= PT_ROWS) g -= g % PT_ROWS;
    for (int r0 = 0; r0 < n_rows; r0 += (int)g) {
        const int r1 = r0 + g < n_rows ? r0 + (int)g : n_rows;
        cb_q8_offsets(xq + (int64_t)r0 * nb, (int64_t)(r1 - r0) * nb, k, xc);
        p_rows(type, w, xq + (int64_t)r0 * nb, xc, r1 - r0, y + (int64_t)r0 * ldy, ldy, o0, o1);
    }
}

T512 static void matmul_p4_0(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                             int64_t ldy, int64_t o0, int64_t o1) {
    matmul_p(CB_TYPE_Q4_0, w, xq, n_rows, y, ldy, o0, o1);
}
T512 static void matmul_p4_1(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                             int64_t ldy, int64_t o0, int64_t o1) {
    matmul_p(CB_TYPE_Q4_1, w, xq, n_rows, y, ldy, o0, o1);
}
T512 static void matmul_p5_0(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                             int64_t ldy, int64_t o0, int64_t o1) {
    matmul_p(CB_TYPE_Q5_0, w, xq, n_rows, y, ldy, o0, o1);
}
T512 static void matmul_p8_0(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                             int64_t ldy, int64_t o0, int64_t o1) {
    matmul_p(CB_TYPE_Q8_0, w, xq, n_rows, y, ldy, o0, o1);
}

/* ----------------------------------------------------------- float matmul */

T512 static INL __m512 load_wf(int type, const uint8_t *p, int64_t i, __mmask16 m) {
    if (type == CB_TYPE_F32) return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
    if (type == CB_TYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));  /* bf16 */
}

/* R rows x 4 outputs; per (r, o) one 16-lane accumulator, hsum16. */
T512 static INL void f_tile(const int type, const int R, const uint8_t *const wp[4], int64_t n,
                            const float *xr, float *y, int64_t ldy, int no) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 W0 = load_wf(type, wp[0], i, m), W1 = load_wf(type, wp[1], i, m);
        const __m512 W2 = load_wf(type, wp[2], i, m), W3 = load_wf(type, wp[3], i, m);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m512 X = _mm512_maskz_loadu_ps(m, xr + r * n + i);
            acc[r][0] = _mm512_fmadd_ps(W0, X, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(W1, X, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(W2, X, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(W3, X, acc[r][3]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        for (int j = 0; j < no; j++) y[r * ldy + j] = hsum16(acc[r][j]);
}

T512 static INL void matmul_f(const int type, const cb_weight *w, const float *xf, int n_rows,
                              float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t n = w->n_in;
    for (int64_t o = o0; o < o1; o += 4) {
        const int no = (int)(o1 - o < 4 ? o1 - o : 4);
        const uint8_t *wp[4];
        for (int j = 0; j < 4; j++)
            wp[j] = (const uint8_t *)w->data + (size_t)(o + (j < no ? j : no - 1)) * w->row_bytes;
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

T512 static void matmul_f32(const cb_weight *w, const float *xf, int n_rows, float *y,
                            int64_t ldy, int64_t o0, int64_t o1) {
    matmul_f(CB_TYPE_F32, w, xf, n_rows, y, ldy, o0, o1);
}
T512 static void matmul_f16(const cb_weight *w, const float *xf, int n_rows, float *y,
                            int64_t ldy, int64_t o0, int64_t o1) {
    matmul_f(CB_TYPE_F16, w, xf, n_rows, y, ldy, o0, o1);
}
T512 static void matmul_bf16(const cb_weight *w, const float *xf, int n_rows, float *y,
                             int64_t ldy, int64_t o0, int64_t o1) {
    matmul_f(CB_TYPE_BF16, w, xf, n_rows, y, ldy, o0, o1);
}

static void matmul_rows_avx512(const cb_weight *w, const cb_block_q8 *xq, const float *xf,
                               int n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    switch (w->type) {
    case CB_TYPE_Q4_0: case CB_TYPE_Q4_1: case CB_TYPE_Q5_0: case CB_TYPE_Q8_0:
        if (!w->packed) {
            cb_kernels_avx2_table()->matmul_rows(w, xq, xf, n_rows, y, ldy, o0, o1);
            break;
        }
        if (w->type == CB_TYPE_Q4_0) matmul_p4_0(w, xq, n_rows, y, ldy, o0, o1);
        else if (w->type == CB_TYPE_Q4_1) matmul_p4_1(w, xq, n_rows, y, ldy, o0, o1);
        else if (w->type == CB_TYPE_Q5_0) matmul_p5_0(w, xq, n_rows, y, ldy, o0, o1);
        else matmul_p8_0(w, xq, n_rows, y, ldy, o0, o1);
        break;
    case CB_TYPE_Q5_1:  /* no panel layout (no real file uses it much): the AVX2 kernel */
        cb_kernels_avx2_table()->matmul_rows(w, xq, xf, n_rows, y, ldy, o0, o1);
        break;
    case CB_TYPE_F32:  matmul_f32(w, xf, n_rows, y, ldy, o0, o1); break;
    case CB_TYPE_F16:  matmul_f16(w, xf, n_rows, y, ldy, o0, o1); break;
    case CB_TYPE_BF16: matmul_bf16(w, xf, n_rows, y, ldy, o0, o1); break;
    default: break;
    }
}

/* -------------------------------------------------------------- attention */

/* e^x as 2^n * e^r with n = round(x / ln 2), |r| <= ln 2 / 2, e^r by its
 * degree-6 Taylor polynomial (truncation error < 2e-7 relative); x is
 * clamped to [-87, 88], the range where e^x is a normal float. */
T512 static INL __m512 exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);      /* ln 2, high part */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);          /* ln 2, low part */
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* Heads of the V pass that keep their accumulators in registers together,
 * and head-dim elements per V accumulator group (4 vectors). */
#define ATTN_HEADS 4
#define ATTN_VDIM  64

/* 16 elements of KV row p from lane i on (masked), f16 or f32. */
T512 static INL __m512 kv_load(const void *base, size_t stride, int kv_f16, int p, int i, __mmask16 m) {
    if (kv_f16)
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)base + (size_t)p * stride + i));
    return _mm512_maskz_loadu_ps(m, (const float *)base + (size_t)p * stride + i);
}

/* Scores of one head for 16 positions: Kb holds the 16 K rows as f32, ks
 * apart, zero past hd (q is masked to hd, so padding multiplies zeros).
 * 16 independent fma chains over hd, then lane p of the result = the sum of
 * chain p's 16 lanes by a transpose-add tree (15 shuffle+add steps for 16
 * sums instead of one horizontal sum each).  Each lane only ever adds lanes
 * of its own chain, in a fixed order.  Called with a constant hd and ks for
 * the common head sizes, so every K load is one fma operand at a constant
 * offset and the chains stay in registers. */
T512 static INL __m512 attn_scores16(const float *q, const int hd, const int ks, const float *Kb) {
#define A16(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
#define DECL(p) __m512 a##p = _mm512_setzero_ps();
#define STEP(p) a##p = _mm512_fmadd_ps(qv, _mm512_load_ps(Kb + (p) * ks + i), a##p);
    A16(DECL)
    for (int i = 0; i < hd; i += 16) {
        const __m512 qv = _mm512_maskz_loadu_ps(tail_mask(hd - i), q + i);
        A16(STEP)
    }
#undef STEP
#undef DECL
#undef A16
    const __m512 a[16] = { a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 };
    return tree16(a, 0);
}

/* out[j][i0 .. i0+63] = sum_p w[j][p] * V[p][i0 ..] for NJ heads: 4 * NJ
 * accumulators in registers, positions in order (one fma chain per output). */
T512 static INL void attn_v_block(const float *w, int n_pos, int NJ, const void *V, size_t stride, int kv_f16,
                                  int hd, int i0, float *out) {
    __m512 acc[ATTN_HEADS][4];
    __mmask16 m[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) m[v] = i0 + 16 * v < hd ? tail_mask(hd - i0 - 16 * v) : 0;
#pragma GCC unroll 4
    for (int j = 0; j < NJ; j++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) acc[j][v] = _mm512_setzero_ps();
    for (int p = 0; p < n_pos; p++) {
        __m512 vv[4];
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) vv[v] = kv_load(V, stride, kv_f16, p, i0 + 16 * v, m[v]);
#pragma GCC unroll 4
        for (int j = 0; j < NJ; j++) {
            const __m512 wj = _mm512_set1_ps(w[(size_t)j * n_pos + p]);
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) acc[j][v] = _mm512_fmadd_ps(wj, vv[v], acc[j][v]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NJ; j++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) _mm512_mask_storeu_ps(out + (size_t)j * hd + i0 + 16 * v, m[v], acc[j][v]);
}

/* Three passes over the group of g query heads that share one KV head:
 * 1. scores, 16 positions at a time: the block's K rows converted to f32
 *    once for all g heads, then per head 16 dot products reduced together;
 * 2. softmax per head over positions (16 per vector, exp512);
 * 3. weighted V, 64 outputs of up to ATTN_HEADS heads at a time, each V row
 *    loaded once per group.
 * Per head every operation and its order are the same whatever g is, and a
 * position's score does not depend on n_pos (blocks start at position 0).
 * hd is a constant for the common head sizes (see attn_avx512). */
T512 static INL void attn_body(const float *q, int g, const int hd, const void *K, const void *V, size_t stride,
                               int kv_f16, int n_pos, float scale, float *scores, float *out) {
    const int ks = (hd + 15) & ~15;  /* kb row stride: whole vectors, zero past hd */
    _Alignas(64) float kb[16 * CB_MAX_HEAD_DIM];
    const __m512 vscale = _mm512_set1_ps(scale);
    const size_t row = stride * (kv_f16 ? sizeof(uint16_t) : sizeof(float));
    /* 1. scores[j][p] = scale * dot(q[j], K[p]) */
    for (int p0 = 0; p0 < n_pos; p0 += 16) {
        const int np = n_pos - p0 < 16 ? n_pos - p0 : 16;
        /* KV comes from L3 / DRAM (the weight stream evicts it between
         * layers): as each K row of this block is converted, prefetch the
         * same row of the next K block and of this block's V rows, which
         * pass 3 reads.  One position at a time, not the whole block in a
         * burst: a burst fills the line-fill buffers and the prefetches
         * themselves stall (measured at 8 streams: attention 0.58-0.64 ->
         * 0.52-0.54 ms per step; no prefetch 0.66-0.77) */
        const int nk = n_pos - p0 - 16 < 16 ? n_pos - p0 - 16 : 16;
        const char *kn = (const char *)K + (size_t)(p0 + 16) * row, *vb = (const char *)V + (size_t)p0 * row;
        for (int p = 0; p < 16; p++) {
            for (size_t b = (size_t)p * row; b < (size_t)(p + 1) * row; b += 64) {
                if (p < nk) _mm_prefetch(kn + b, _MM_HINT_T0);
                if (p < np) _mm_prefetch(vb + b, _MM_HINT_T0);
            }
            for (int i = 0; i < ks; i += 16) {
                const __mmask16 m = tail_mask(hd - i);
                _mm512_store_ps(kb + (size_t)p * ks + i, p < np ? kv_load(K, stride, kv_f16, p0 + p, i, m) : _mm512_setzero_ps());
            }
        }
        const __mmask16 mp = tail_mask(np);
        for (int j = 0; j < g; j++)
            _mm512_mask_storeu_ps(scores + (size_t)j * n_pos + p0, mp,
                                  _mm512_mul_ps(attn_scores16(q + (size_t)j * hd, hd, ks, kb), vscale));
    }
    /* 2. softmax per head: weights e^(s - max) / sum, in place */
    for (int j = 0; j < g; j++) {
        float *sj = scores + (size_t)j * n_pos;
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        for (int p = 0; p < n_pos; p += 16)
            vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail_mask(n_pos - p), sj + p));
        const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
        __m512 vsum = _mm512_setzero_ps();
        for (int p = 0; p < n_pos; p += 16) {
            const __mmask16 m = tail_mask(n_pos - p);
            const __m512 e = _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sj + p), mx)));
            _mm512_mask_storeu_ps(sj + p, m, e);
            vsum = _mm512_add_ps(vsum, e);
        }
        const __m512 inv = _mm512_set1_ps(1.0f / hsum16(vsum));
        for (int p = 0; p < n_pos; p += 16) {
            const __mmask16 m = tail_mask(n_pos - p);
            _mm512_mask_storeu_ps(sj + p, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, sj + p), inv));
        }
    }
    /* 3. out[j] = sum_p w[j][p] * V[p] */
    for (int i0 = 0; i0 < hd; i0 += ATTN_VDIM)
        for (int j0 = 0; j0 < g; j0 += ATTN_HEADS) {
            const float *w = scores + (size_t)j0 * n_pos;
            float *o = out + (size_t)j0 * hd;
            switch (g - j0 < ATTN_HEADS ? g - j0 : ATTN_HEADS) {  /* constant NJ: registers */
            case 1:  attn_v_block(w, n_pos, 1, V, stride, kv_f16, hd, i0, o); break;
            case 2:  attn_v_block(w, n_pos, 2, V, stride, kv_f16, hd, i0, o); break;
            case 3:  attn_v_block(w, n_pos, 3, V, stride, kv_f16, hd, i0, o); break;
            default: attn_v_block(w, n_pos, 4, V, stride, kv_f16, hd, i0, o); break;
            }
        }
}

/* Same code for every hd, compiled with a constant hd for 64 and 128. */
T512 static void attn_avx512(const float *q, int g, int hd, const void *K, const void *V, size_t stride,
                             int kv_f16, int n_pos, float scale, float *scores, float *out) {
    switch (hd) {
    case 64:  attn_body(q, g, 64, K, V, stride, kv_f16, n_pos, scale, scores, out); break;
    case 128: attn_body(q, g, 128, K, V, stride, kv_f16, n_pos, scale, scores, out); break;
    default:  attn_body(q, g, hd, K, V, stride, kv_f16, n_pos, scale, scores, out); break;
    }
}

T512 static void to_f16_avx512(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        _mm256_mask_storeu_epi16(y + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i), _MM_FROUND_TO_NEAREST_INT));
    }
}

/* ------------------------------------------------------- norms, SwiGLU */

/* Sum of squares in double over 2 x 8 lanes (fixed order), then the same
 * (x * scale) * w per element as the scalar code. */
T512 static void rmsnorm_avx512(const float *x, const float *w, float *o, int n, float eps) {
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    for (int i = 0; i < n; i += 16) {
        const __m512 v = _mm512_maskz_loadu_ps(tail_mask(n - i), x + i);
        const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        a0 = _mm512_fmadd_pd(lo, lo, a0);
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    const double ss = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    const __m512 scale = _mm512_set1_ps((float)(1.0 / sqrt(ss / n + eps)));
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), scale);
        _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i)));
    }
}

/* silu(x) = x / (1 + e^-x), and gelu_tanh(x) as x / (1 + e^(-2 sqrt(2/pi) x
 * (1 + 0.044715 x^2))) (kernels.h); exp512 clamps the exponent, so large |x|
 * give x or 0. */
T512 static INL __m512 silu16(__m512 x) {
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}
T512 static INL __m512 gelu16(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 z = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(-CB_GELU_2K), x),
                                   _mm512_fmadd_ps(_mm512_set1_ps(CB_GELU_A), _mm512_mul_ps(x, x), one));
    return _mm512_div_ps(x, _mm512_add_ps(one, exp512(z)));
}

/* g = act(g) * u over n floats, 16 at a time (the tail masked). */
T512 static INL void gate_avx512(float *g, const float *u, int64_t n, __m512 (*act)(__m512)) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 s = act(_mm512_maskz_loadu_ps(m, g + i));
        _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)));
    }
}

T512 static void swiglu_avx512(float *g, const float *u, int64_t n) { gate_avx512(g, u, n, silu16); }
T512 static void geglu_avx512(float *g, const float *u, int64_t n) { gate_avx512(g, u, n, gelu16); }

/* Pairs of 8 (interleaved) or 16 (neox) at a time; the products and sums
 * are the scalar code's, one rounding each (mul, then add: no fma). */
T512 static void rope_avx512(float *v, const float *cs, int n_heads, int head_dim, int n_rot, int neox) {
    const int half = n_rot / 2;
    if (neox ? half % 16 != 0 : n_rot % 16 != 0) {  /* odd sizes: the scalar loop */
        cb_rope_generic(v, cs, n_heads, head_dim, n_rot, neox);
        return;
    }
    /* even lanes take -sin: a' = a c + b (-s), b' = b c + a s */
    const __m512i neg_even = _mm512_set1_epi64(0x80000000LL);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (int j = 0; j < (neox ? half : n_rot); j += 16) {
        __m512 C, S;
        if (neox) {  /* cos / sin of pairs j..j+15, each in its own vector */
            const __m512 a = _mm512_loadu_ps(cs + 2 * j), b = _mm512_loadu_ps(cs + 2 * j + 16);
            C = _mm512_permutex2var_ps(a, even, b);
            S = _mm512_permutex2var_ps(a, odd, b);
        } else {     /* lanes (2i, 2i+1) hold pair j/2 + i: [c c], [-s s] */
            const __m512 a = _mm512_loadu_ps(cs + j);
            C = _mm512_permute_ps(a, 0xA0);
            S = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_permute_ps(a, 0xF5)), neg_even));
        }
        for (int h = 0; h < n_heads; h++) {
            float *x = v + (size_t)h * head_dim;
            if (neox) {
                const __m512 lo = _mm512_loadu_ps(x + j), hi = _mm512_loadu_ps(x + j + half);
                _mm512_storeu_ps(x + j, _mm512_sub_ps(_mm512_mul_ps(lo, C), _mm512_mul_ps(hi, S)));
                _mm512_storeu_ps(x + j + half, _mm512_add_ps(_mm512_mul_ps(lo, S), _mm512_mul_ps(hi, C)));
            } else {
                const __m512 a = _mm512_loadu_ps(x + j);
                const __m512 sw = _mm512_permute_ps(a, 0xB1);  /* (b, a) in each pair */
                _mm512_storeu_ps(x + j, _mm512_add_ps(_mm512_mul_ps(a, C), _mm512_mul_ps(sw, S)));
            }
        }
    }
}

/* The maximum over 16 lanes (vmaxps returns its second operand when the
 * first is NaN, so NaN never enters), then the first index holding it: the
 * scalar scan's answer (zeros of either sign compare equal in both). */
T512 static void argmax_avx512(const float *x, int64_t n, int64_t base, float *max, int64_t *idx) {
    __m512 m = _mm512_set1_ps(*max);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(_mm512_loadu_ps(x + i), m);
    if (i < n) {
        const __mmask16 t = tail_mask(n - i);
        m = _mm512_mask_max_ps(m, t, _mm512_maskz_loadu_ps(t, x + i), m);
    }
    const float mx = _mm512_reduce_max_ps(m);
    if (!(mx > *max)) return;
    const __m512 v = _mm512_set1_ps(mx);
    for (i = 0; i < n; i += 16) {
        const __mmask16 hit = _mm512_mask_cmp_ps_mask(tail_mask(n - i), _mm512_maskz_loadu_ps(tail_mask(n - i), x + i), v, _CMP_EQ_OQ);
        if (hit) {
            const int64_t at = i + __builtin_ctz((unsigned)hit);
            *max = x[at];
            *idx = base + at;
            return;
        }
    }
}

static const cb_kernels table = {
    CB_SIMD_AVX512, quantize_q8_avx512, matmul_rows_avx512, attn_avx512, to_f16_avx512, rmsnorm_avx512,
    swiglu_avx512, geglu_avx512, rope_avx512, argmax_avx512
};

const cb_kernels *cb_kernels_avx512_table(void);
const cb_kernels *cb_kernels_avx512_table(void) { return &table; }

#else  /* not x86 */

const cb_kernels *cb_kernels_avx512_table(void);
const cb_kernels *cb_kernels_avx512_table(void) { return 0; }

#endif
