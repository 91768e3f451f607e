/*
 * kquants_avx512.c — K-quant matmul with AVX-512 VNNI.
 *
 * Q4_K, Q5_K and Q6_K matrices packed at model load (the panel layout in
 * kquants.h) run panel kernels: 16 outputs per vector, 4 weights of one
 * output per 32-bit lane, so vpdpbusd against 4 broadcast activation bytes
 * finishes each output's integer sum of a 32-weight block in its own lane,
 * and the super-block's scales and mins are unpacked once per panel for 16
 * outputs with vector shifts (no per-element gathers, no horizontal sums).
 * A tile of up to KP_ROWS activation rows shares each unpacking of weights.
 *
 * Per (activation row, output) the float steps run in block order,
 *   Q4_K / Q5_K:  acc = fma(float(isum_b) * dx_b, d * sc_b, acc)
 *                 acc = fnma(dmin * m_b, s_b, acc)
 *   Q6_K:         t = float(isum_lo) * (d * sc_lo) + float(isum_hi) * (d * sc_hi)
 *                 acc = fma(t, dx_b, acc)
 * whatever the tile, the panel's place in the work split or the thread, so a
 * row's outputs are bit-identical however the batch is made up (they differ
 * from the scalar path's rounding, as the legacy types' AVX-512 kernels do).
 *
 * Unpacked matrices (rows too long to pack), Q2_K and Q3_K run the row
 * kernels of kquants_simd.h with vpdpbusd on 256-bit vectors.
 */
#include "kquants.h"
#include "colibri.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#define KQ_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define KQ_FN(name) name##_avx512
KQ_ATTR static inline __m256i kq_mulsum_avx512(__m256i wu, __m256i xs) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), wu, xs);
}
#define KQ_MULSUM(a, b) kq_mulsum_avx512(a, b)
#include "kquants_simd.h"

#define INL __attribute__((always_inline)) inline

/* Activation rows per tile. */
#define KP_ROWS 8
/* Panels between a panel's software prefetch and its use (as kernels_avx512.c). */
#define KP_PF_PANELS 2
/* Q6_K offset corrections (two int32 per 32-block per row) precomputed per group of rows. */
#define KP_XC_MAX (2 * CB_PACK_MAX_BLOCKS)

typedef int32_t kq_i32u __attribute__((may_alias, aligned(1)));

/* acc += dpbusd(w, the 4 activation bytes at x broadcast to every lane), the
 * broadcast folded into the instruction's memory operand. */
KQ_ATTR static INL __m512i kp_dp(__m512i acc, __m512i w, const kq_i32u *x) {
#if defined(__GNUC__) || defined(__clang__)
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*x));
    return acc;
#else
    return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(*x));
#endif
}

static inline __mmask16 kp_mask(int64_t rem) {
    return rem >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << rem) - 1u);
}

KQ_ATTR static INL void kp_prefetch(const uint8_t *p, size_t bytes) {
    for (size_t off = 0; off < bytes; off += 64) _mm_prefetch((const char *)p + off, _MM_HINT_T1);
}

/* d * sc_j and dmin * m_j (j = 0..7) of one Q4_K / Q5_K panel super-block,
 * 16 outputs each: the 12 packed scale bytes of every output are one byte
 * row each (byte k of output j at 64 + 16k + j), so the 6-bit fields of 16
 * outputs come out of 16-byte rows with byte masks and 16-bit shifts (the
 * bits a shift carries across a byte are masked off), as ggml's
 * get_scale_min_k4 does per output, then widen to floats.  The odd
 * Q4_K sub-blocks' scales are divided by 16 (exact): their weights are read
 * as the high nibble in place, 16 times the quant (see kp_tile_q45). */
KQ_ATTR static INL void kp_scales_q45(const int q5, const uint8_t *p, __m512 *dsc, __m512 *dmm) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
    const __m512 d16 = _mm512_mul_ps(d, _mm512_set1_ps(0.0625f));
    __m128i S[12];
#pragma GCC unroll 12
    for (int k = 0; k < 12; k++) S[k] = _mm_loadu_si128((const __m128i *)(p + 64 + 16 * k));
    const __m128i m6 = _mm_set1_epi8(63), m4 = _mm_set1_epi8(15), top2 = _mm_set1_epi8(0x30);
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        __m128i sc, mn;
        if (j < 4) {
            sc = _mm_and_si128(S[j], m6);
            mn = _mm_and_si128(S[j + 4], m6);
        } else {  /* (q >> 6) << 4 == (q >> 2) & 0x30 */
            sc = _mm_or_si128(_mm_and_si128(S[j + 4], m4), _mm_and_si128(_mm_srli_epi16(S[j - 4], 2), top2));
            mn = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(S[j + 4], 4), m4), _mm_and_si128(_mm_srli_epi16(S[j], 2), top2));
        }
        dsc[j] = _mm512_mul_ps(j & 1 && !q5 ? d16 : d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc)));
        dmm[j] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mn)));
    }
}

/* One Q4_K / Q5_K panel (16 outputs) x R activation rows over nsb super-blocks. */
KQ_ATTR static INL void kp_tile_q45(const int q5, const int R, const uint8_t *panel, int64_t nsb, int64_t nb,
                                    const cb_block_q8 *xr, float *y, int64_t ldy, __mmask16 m,
                                    const uint8_t *pf) {
    const size_t pb = q5 ? 16 * 176 : 16 * 144;
    const __m512i lo4 = _mm512_set1_epi8(0x0F), hi4 = _mm512_set1_epi8((char)0xF0), b4 = _mm512_set1_epi8(0x10);
    __m512 acc[KP_ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *p = panel + (size_t)s * pb;
        if (pf) kp_prefetch(pf + (size_t)s * pb, pb);
        __m512 dsc[8], dmm[8];
        kp_scales_q45(q5, p, dsc, dmm);
        const uint8_t *qs = p + (q5 ? 768 : 256);
#pragma GCC unroll 1
        for (int j = 0; j < 8; j++) {  /* sub-block j: nibble j & 1 of group j / 2 */
            const uint8_t *q = qs + 512 * (j >> 1);
            __m512i W[8];
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * c));
                if (q5) {  /* quant | (bit j of each qh byte) << 4, 0..31 */
                    const __m512i h = _mm512_loadu_si512((const void *)(p + 256 + 64 * c));
                    const __m512i hb = j <= 4 ? _mm512_slli_epi16(h, 4 - j) : _mm512_srli_epi16(h, j - 4);
                    W[c] = _mm512_or_si512(_mm512_and_si512(j & 1 ? _mm512_srli_epi16(v, 4) : v, lo4),
                                           _mm512_and_si512(hb, b4));
                } else {  /* Q4_K odd sub-blocks: the high nibble in place (16 q), its scale / 16 */
                    W[c] = _mm512_and_si512(v, j & 1 ? hi4 : lo4);
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const cb_block_q8 *xb = xr + (int64_t)r * nb + s * 8 + j;
                const kq_i32u *x4 = (const kq_i32u *)xb->qs;
                __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    s0 = kp_dp(s0, W[c], x4 + c);
                    s1 = kp_dp(s1, W[c + 4], x4 + c + 4);
                }
                const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_set1_ps(xb->d));
                acc[r] = _mm512_fmadd_ps(t, dsc[j], acc[r]);
                acc[r] = _mm512_fnmadd_ps(dmm[j], _mm512_set1_ps(xb->s), acc[r]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + (int64_t)r * ldy, m, acc[r]);
}

/* One Q6_K panel x R rows.  Weights as unsigned q in 0..63; each 16-weight
 * half starts its integer sum at -32 times its activations' sum (xc, exact). */
KQ_ATTR static INL void kp_tile_q6(const int R, const uint8_t *panel, int64_t nsb, int64_t nb,
                                   const cb_block_q8 *xr, const int32_t *xc, float *y, int64_t ldy,
                                   __mmask16 m, const uint8_t *pf) {
    const size_t pb = 16 * 210;
    const __m512i lo4 = _mm512_set1_epi8(0x0F), b45 = _mm512_set1_epi8(0x30);
    __m512 acc[KP_ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *p = panel + (size_t)s * pb;
        if (pf) kp_prefetch(pf + (size_t)s * pb, pb);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#pragma GCC unroll 1
        for (int b = 0; b < 8; b++) {  /* 32-weight block b = 4h + k */
            const int h = b >> 2, k = b & 3;
            const uint8_t *ql = p + 288 + 1024 * h + 512 * (k & 1), *qh = p + 2336 + 512 * h;
            const __m512 sl = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                  _mm_loadu_si128((const __m128i *)(p + 32 + 16 * (2 * b))))));
            const __m512 sh = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                  _mm_loadu_si128((const __m128i *)(p + 32 + 16 * (2 * b + 1))))));
            __m512i W[8];
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                const __m512i l = _mm512_loadu_si512((const void *)(ql + 64 * c));
                const __m512i hv = _mm512_loadu_si512((const void *)(qh + 64 * c));
                const __m512i nib = _mm512_and_si512(k & 2 ? _mm512_srli_epi16(l, 4) : l, lo4);
                const __m512i hi = _mm512_and_si512(k < 3 ? _mm512_slli_epi16(hv, 4 - 2 * k) : _mm512_srli_epi16(hv, 2), b45);
                W[c] = _mm512_or_si512(nib, hi);
            }
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const int64_t bi = (int64_t)r * nb + s * 8 + b;
                const cb_block_q8 *xb = xr + bi;
                const kq_i32u *x4 = (const kq_i32u *)xb->qs;
                __m512i s0 = _mm512_set1_epi32(xc[2 * bi]), s1 = _mm512_set1_epi32(xc[2 * bi + 1]);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    s0 = kp_dp(s0, W[c], x4 + c);
                    s1 = kp_dp(s1, W[c + 4], x4 + c + 4);
                }
                const __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), sl, _mm512_mul_ps(_mm512_cvtepi32_ps(s1), sh));
                acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(xb->d), acc[r]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + (int64_t)r * ldy, m, acc[r]);
}

/* One panel x R rows of the packed type. */
KQ_ATTR static INL void kp_tile(const int type, const int R, const uint8_t *panel, int64_t nsb, int64_t nb,
                                const cb_block_q8 *xr, const int32_t *xc, float *y, int64_t ldy, __mmask16 m,
                                const uint8_t *pf) {
    if (type == CB_TYPE_Q6_K) kp_tile_q6(R, panel, nsb, nb, xr, xc, y, ldy, m, pf);
    else kp_tile_q45(type == CB_TYPE_Q5_K, R, panel, nsb, nb, xr, y, ldy, m, pf);
}

/* Activation bytes (int8 blocks) of one row block: the rows whose blocks
 * stay in L2 while every panel of the work item passes over them. */
#define KP_ROW_BLOCK_BYTES (192 * 1024)

/* Panels over outputs [o0, o1) (o0 a multiple of CB_PANEL) for rows
 * [0, n_rows): row blocks outer (a prefill's activations would not stay in
 * L2 across the panels otherwise: 512 rows of 1536 inputs are ~1 MB of
 * blocks, re-read from L3 for every panel), panels inner (a panel stays in
 * L1 across the row tiles of a block), then row tiles; the first tile of a
 * panel prefetches the panel KP_PF_PANELS ahead.  The split changes which
 * tile a row is in, never the order of a row's float steps. */
KQ_ATTR static INL void kp_rows(const int type, const cb_weight *w, const cb_block_q8 *xq, const int32_t *xc,
                                int n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t nsb = w->n_in / CB_QK_K, nb = w->n_in / CB_QK;
    const size_t pb = cb_pack_block_bytes(type), psz = (size_t)nsb * pb;
    int rb = (int)(KP_ROW_BLOCK_BYTES / ((size_t)nb * sizeof(cb_block_q8)));
    rb = rb < KP_ROWS ? KP_ROWS : rb - rb % KP_ROWS;
    for (int r0 = 0; r0 < n_rows; r0 += rb) {
        const int r1 = r0 + rb < n_rows ? r0 + rb : n_rows;
        for (int64_t o = o0; o < o1; o += CB_PANEL) {
            const uint8_t *panel = (const uint8_t *)w->packed + (size_t)(o / CB_PANEL) * psz;
            const __mmask16 m = kp_mask(o1 - o);
            const uint8_t *pf = o + KP_PF_PANELS * CB_PANEL < w->n_out ? panel + KP_PF_PANELS * psz : NULL;
            int r = r0;
            for (; r + KP_ROWS <= r1; r += KP_ROWS, pf = NULL)
                kp_tile(type, KP_ROWS, panel, nsb, nb, xq + (int64_t)r * nb, xc ? xc + 2 * (int64_t)r * nb : NULL,
                        y + r * ldy + o, ldy, m, pf);
            const cb_block_q8 *xr = xq + (int64_t)r * nb;
            const int32_t *xcr = xc ? xc + 2 * (int64_t)r * nb : NULL;
            float *yr = y + r * ldy + o;
            switch (r1 - r) {
            case 7: kp_tile(type, 7, panel, nsb, nb, xr, xcr, yr, ldy, m, pf); break;
            case 6: kp_tile(type, 6, panel, nsb, nb, xr, xcr, yr, ldy, m, pf); break;
            case 5: kp_tile(type, 5, panel, nsb, nb, xr, xcr, yr, ldy, m, pf); break;
            case 4: kp_tile(type, 4, panel, nsb, nb, xr, xcr, yr, ldy, m, pf); break;
            case 3: kp_tile(type, 3, panel, nsb, nb, xr, xcr, yr, ldy, m, pf); break;
            case 2: kp_tile(type, 2, panel, nsb, nb, xr, xcr, yr, ldy, m, pf); break;
            case 1: kp_tile(type, 1, panel, nsb, nb, xr, xcr, yr, ldy, m, pf); break;
            default: break;
            }
        }
    }
}

KQ_ATTR static void kp_matmul_q4_K(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                                   int64_t ldy, int64_t o0, int64_t o1) {
    kp_rows(CB_TYPE_Q4_K, w, xq, NULL, n_rows, y, ldy, o0, o1);
}

KQ_ATTR static void kp_matmul_q5_K(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                                   int64_t ldy, int64_t o0, int64_t o1) {
    kp_rows(CB_TYPE_Q5_K, w, xq, NULL, n_rows, y, ldy, o0, o1);
}

/* Q6_K: the -32 offsets of each 16-activation half, for groups of rows. */
KQ_ATTR static void kp_matmul_q6_K(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                                   int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t nb = w->n_in / CB_QK;
    if (nb <= 0) return;
    _Alignas(64) int32_t xc[KP_XC_MAX];
    int64_t g = KP_XC_MAX / (2 * nb);  /* rows per group (>= 1: packed rows have <= CB_PACK_MAX_BLOCKS blocks) */
    if (g >= KP_ROWS) g -= g % KP_ROWS;
    for (int r0 = 0; r0 < n_rows; r0 += (int)g) {
        const int r1 = r0 + g < n_rows ? r0 + (int)g : n_rows;
        cb_kq_q6_offsets(xq + (int64_t)r0 * nb, (int64_t)(r1 - r0) * nb, xc);
        kp_rows(CB_TYPE_Q6_K, w, xq + (int64_t)r0 * nb, xc, r1 - r0, y + (int64_t)r0 * ldy, ldy, o0, o1);
    }
}

int cb_kq_matmul_rows_avx512(const cb_weight *w, const cb_block_q8 *xq, int n_rows,
                             float *y, int64_t ldy, int64_t o0, int64_t o1) {
    switch (w->type) {
    case CB_TYPE_Q2_K: matmul_q23_K_avx512(0, w, xq, n_rows, y, ldy, o0, o1); return 1;
    case CB_TYPE_Q3_K: matmul_q23_K_avx512(1, w, xq, n_rows, y, ldy, o0, o1); return 1;
    case CB_TYPE_Q4_K:
        if (w->packed) kp_matmul_q4_K(w, xq, n_rows, y, ldy, o0, o1);
        else matmul_q45_K_avx512(0, w, xq, n_rows, y, ldy, o0, o1);
        return 1;
    case CB_TYPE_Q5_K:
        if (w->packed) kp_matmul_q5_K(w, xq, n_rows, y, ldy, o0, o1);
        else matmul_q45_K_avx512(1, w, xq, n_rows, y, ldy, o0, o1);
        return 1;
    case CB_TYPE_Q6_K:
        if (w->packed) kp_matmul_q6_K(w, xq, n_rows, y, ldy, o0, o1);
        else matmul_q6_K_avx512(w, xq, n_rows, y, ldy, o0, o1);
        return 1;
    default: return 0;
    }
}

#else  /* not x86 */

int cb_kq_matmul_rows_avx512(const cb_weight *w, const cb_block_q8 *xq, int n_rows,
                             float *y, int64_t ldy, int64_t o0, int64_t o1) { return 0; }

#endif
