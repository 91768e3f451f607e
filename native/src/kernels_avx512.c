/*
 * kernels_avx512.c — AVX-512 F/BW/VL + VNNI kernels.
 *
 * Compiled with per-function target attributes (the build uses plain flags),
 * selected at run time by cb_kernels_get() only when cb_simd_detect() says
 * the CPU and OS support it.
 *
 * Quantized weights (Q4_0, Q4_1, Q8_0) against int8 activation blocks.
 * One zmm holds ONE block of TWO output rows: lanes 0-7 belong to output o,
 * lanes 8-15 to output o+1, and the activation block is broadcast to both
 * halves.  vpdpbusd multiplies unsigned weight bytes by signed activation
 * bytes, so
 *   Q4_1: nibbles 0..15 directly (the min term m*s is added separately);
 *   Q4_0: nibbles 0..15, accumulator pre-loaded with -8 * sum(x) (exact);
 *   Q8_0: w ^ 0x80 = w + 128, accumulator pre-loaded with -128 * sum(x).
 * Integer sums are exact, so the only roundings are the float steps, which
 * happen per (activation row r, output o) in this fixed order:
 *   for each block b:  acc[lane] = fma(float(isum[lane]) * dx_b, dw_b, acc[lane])
 *   (Q4_1) m[b % 4] = fma(mw_b, s_b, m[b % 4]) in block order,
 *   y = (((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))) + ((m0 + m2) + (m1 + m3)).
 * A tile of R rows x 4 outputs shares the weight unpacking across rows and the
 * activation loads across outputs, but does per (r, o) exactly the ops above,
 * so a result never depends on R, on the tile an output lands in, or on the
 * thread: batch invariance.
 *
 * Float weights (F32/F16/BF16): per (r, o) one 16-lane fma accumulator over
 * the row in steps of 16 (masked tail), reduced by hsum16 below.
 */
#include "kernels.h"
#include "colibri.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INL  __attribute__((always_inline)) inline

/* Blocks per super-chunk of precomputed weight scales (multiple of 4):
 * bounds the stack buffer; n_in up to KB*32 = 8192 takes one super-chunk. */
#define KB 256

/* Float scales of the 4 outputs of a tile for one super-chunk, block-major
 * so that one 16-lane gather fills 4 blocks x 4 outputs (a row of 18 blocks,
 * n_in = 576, takes 5 gathers per tile instead of 8 output-major). */
typedef struct {
    float dw[KB][4];  /* weight scale d of block b, output j */
    float mw[KB][4];  /* Q4_1 min m of block b, output j */
} qscales;

/* Activation side data precomputed once per matmul_rows call (per thread),
 * so the inner loops load it instead of gathering or recomputing it:
 *   XS_MAX  floats: Q4_1 s = d * sum(q) of each block, contiguous per row
 *           (larger calls are split into row groups that fit);
 *   XC_MAX  blocks: Q4_0 / Q8_0 offset corrections (-8 or -128 times the
 *           4-byte partial sums of q, 8 int32 lanes), used when all rows fit
 *           (decode and small batches); otherwise computed in the loop.
 * Both are exact copies / integer results: bit-identical either way. */
#define XS_MAX 4096
#define XC_MAX 512

/* Output tiles of 4 rows between a tile's software prefetch and its use. */
#define CB_PF_TILES 2

/* ---------------------------------------------------------------- helpers */

/* Sum of lanes 0-7 (returned in lane 0) and of lanes 8-15 (lane 8), with the
 * same tree for both halves. */
T512 static INL __m512 hsum8x2(__m512 v) {
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
    v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));
    v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1)));
    return v;
}

/* Fixed-tree sum of 16 lanes. */
T512 static INL float hsum16(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_shuffle_ps(b, b, 1));
    return _mm_cvtss_f32(b);
}

/* [lo8(a) + hi8(a), lo8(b) + hi8(b)]: two 16-lane block-indexed sums folded
 * into the 8-lane halves of a pair accumulator. */
T512 static INL __m512 fold2(__m512 a, __m512 b) {
    __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(b), 1)));
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(a8)),
                                               _mm256_castps_pd(b8), 1));
}

static inline __mmask16 tail_mask(int64_t rem) {
    return rem >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << rem) - 1u);
}

/* --------------------------------------------------------- quantization */

T512 static void quantize_q8_avx512(const float *x, cb_block_q8 *q, int64_t n) {
    for (int64_t b = 0; b < n / CB_QK; b++) {
        const __m512 v0 = _mm512_loadu_ps(x + b * CB_QK);
        const __m512 v1 = _mm512_loadu_ps(x + b * CB_QK + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        /* Same scalar steps as the scalar path, so the bytes match it. */
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));  /* round to nearest even */
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
        _mm_storeu_si128((__m128i *)q[b].qs, _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(q[b].qs + 16), _mm512_cvtsepi32_epi8(q1));
        const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        q[b].d = d;
        q[b].s = d * (float)sum;
    }
}

/* ------------------------------------------------------ quantized matmul */

/* Gather the f16 scales (and Q4_1 mins) of blocks [b0, b0+nbk) of the 4
 * output rows wp[] into s (block-major); lanes past nbk are stored as 0. */
T512 static void load_scales(int type, const uint8_t *const wp[4], size_t bsz,
                             int64_t b0, int nbk, qscales *s) {
    const uint8_t *base = wp[0] + (size_t)b0 * bsz;
    const ptrdiff_t o1 = wp[1] - wp[0], o2 = wp[2] - wp[0], o3 = wp[3] - wp[0];
    if (o3 < 0 || o3 > (ptrdiff_t)1 << 30) {
        /* Offsets beyond the gather's int32 index (rows over 256 MiB): the
         * same conversions one by one (vcvtph2ps is exact, as is this). */
        for (int b = 0; b < ((nbk + 3) & ~3); b++)
            for (int j = 0; j < 4; j++) {
                uint16_t d = 0, m = 0;
                if (b < nbk) {
                    memcpy(&d, wp[j] + (size_t)(b0 + b) * bsz, 2);
                    memcpy(&m, wp[j] + (size_t)(b0 + b) * bsz + 2, 2);
                }
                s->dw[b][j] = cb_f16_to_f32(d);
                s->mw[b][j] = type == CB_TYPE_Q4_1 ? cb_f16_to_f32(m) : 0.0f;
            }
        return;
    }
    const int bs = (int)bsz;
    __m512i idx = _mm512_add_epi32(
        _mm512_setr_epi32(0, (int)o1, (int)o2, (int)o3, 0, (int)o1, (int)o2, (int)o3,
                          0, (int)o1, (int)o2, (int)o3, 0, (int)o1, (int)o2, (int)o3),
        _mm512_setr_epi32(0, 0, 0, 0, bs, bs, bs, bs, 2 * bs, 2 * bs, 2 * bs, 2 * bs,
                          3 * bs, 3 * bs, 3 * bs, 3 * bs));
    const __m512i step = _mm512_set1_epi32(4 * bs);
    for (int c = 0; c < nbk; c += 4, idx = _mm512_add_epi32(idx, step)) {
        /* 32 bits at each block start: d (and m for Q4_1); always inside
         * the block since every block is at least 18 bytes. */
        const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), tail_mask(4 * (nbk - c)),
                                                      idx, base, 1);
        _mm512_store_ps(&s->dw[c][0], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)));
        if (type == CB_TYPE_Q4_1)
            _mm512_store_ps(&s->mw[c][0], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16))));
    }
}

/* Unsigned weight bytes of one block of outputs a (lanes 0-7) and b (8-15),
 * in the lane order of a broadcast activation block. */
T512 static INL __m512i load_w2(int type, const uint8_t *a, const uint8_t *b) {
    if (type == CB_TYPE_Q8_0) {
        const __m512i w = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(a + 2))),
            _mm256_loadu_si256((const __m256i *)(b + 2)), 1);
        return _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80));
    }
    const size_t off = type == CB_TYPE_Q4_1 ? 4 : 2;  /* qs after d (and m) */
    __m512i w = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(a + off)));
    w = _mm512_mask_broadcast_i32x4(w, 0xFF00, _mm_loadu_si128((const __m128i *)(b + off)));
    /* 128-bit lanes: a low nibbles (elements 0-15), a high nibbles (16-31),
     * then the same for b. */
    const __m512i shift = _mm512_setr_epi64(0, 0, 0x0004000400040004LL, 0x0004000400040004LL,
                                            0, 0, 0x0004000400040004LL, 0x0004000400040004LL);
    return _mm512_and_si512(_mm512_srlv_epi16(w, shift), _mm512_set1_epi8(0x0F));
}

/* One tile: R activation rows x 4 outputs (wp[0..3], duplicates allowed),
 * writing y[r][j] for j < no.  *cached remembers which super-chunk's scales
 * are in s (scales depend only on the outputs, so a tile column reuses them
 * across its row tiles when the row fits in one super-chunk).
 * xs: Q4_1 block sums s of these rows, contiguous (row stride nb), or NULL
 * to read them from xr; xc: Q4_0 / Q8_0 corrections (row stride nb) or NULL
 * to compute them here. */
T512 static INL void q_tile(const int type, const int R, const uint8_t *const wp[4], size_t bsz,
                            int64_t nb, const cb_block_q8 *xr, const float *xs, const __m256i *xc,
                            qscales *s, int64_t *cached, float *y, int64_t ldy, int no) {
    const __m512i zero = _mm512_setzero_si512();
    const __m512i kcorr = _mm512_set1_epi8(type == CB_TYPE_Q8_0 ? (char)0x80 : 8);
    const __m512i rep4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 acc[4][2], macc[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        acc[r][0] = _mm512_setzero_ps(); acc[r][1] = _mm512_setzero_ps(); macc[r] = _mm512_setzero_ps();
    }

    for (int64_t b0 = 0; b0 < nb; b0 += KB) {
        const int nbk = (int)(nb - b0 < KB ? nb - b0 : KB);
        if (*cached != b0) { load_scales(type, wp, bsz, b0, nbk, s); *cached = b0; }
        for (int b = 0; b < nbk; b++) {
            const size_t wo = (size_t)(b0 + b) * bsz;
            const __m512i W0 = load_w2(type, wp[0] + wo, wp[1] + wo);
            const __m512i W1 = load_w2(type, wp[2] + wo, wp[3] + wo);
            const __m512 D0 = _mm512_mask_broadcastss_ps(_mm512_set1_ps(s->dw[b][0]), 0xFF00, _mm_set_ss(s->dw[b][1]));
            const __m512 D1 = _mm512_mask_broadcastss_ps(_mm512_set1_ps(s->dw[b][2]), 0xFF00, _mm_set_ss(s->dw[b][3]));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const cb_block_q8 *xb = xr + (int64_t)r * nb + b0 + b;
                const __m512i X = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)xb->qs));
                __m512i init = zero;
                if (type != CB_TYPE_Q4_1) {
                    if (xc) init = _mm512_broadcast_i64x4(_mm256_load_si256(xc + (int64_t)r * nb + b0 + b));
                    else init = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, kcorr, X));
                }
                const __m512 dx = _mm512_set1_ps(xb->d);
                const __m512 f0 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(init, W0, X));
                const __m512 f1 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(init, W1, X));
                acc[r][0] = _mm512_fmadd_ps(_mm512_mul_ps(f0, dx), D0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(_mm512_mul_ps(f1, dx), D1, acc[r][1]);
            }
        }
        if (type == CB_TYPE_Q4_1) {
            /* min terms m_b * s_b, 4 blocks x 4 outputs per fma: lane
             * 4*(b%4)+j accumulates output j over blocks b = 4k + (b%4). */
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const cb_block_q8 *xrow = xr + (int64_t)r * nb + b0;
                for (int c = 0; c < nbk; c += 4) {
                    const int n4 = nbk - c < 4 ? nbk - c : 4;
                    __m128 s4;
                    if (xs) {
                        s4 = _mm_maskz_loadu_ps((__mmask8)((1u << n4) - 1u), xs + (int64_t)r * nb + b0 + c);
                    } else {
                        float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        for (int i = 0; i < n4; i++) t[i] = xrow[c + i].s;
                        s4 = _mm_loadu_ps(t);
                    }
                    const __m512 sx = _mm512_permutexvar_ps(rep4, _mm512_castps128_ps512(s4));
                    macc[r] = _mm512_fmadd_ps(_mm512_load_ps(&s->mw[c][0]), sx, macc[r]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const __m512 h0 = hsum8x2(acc[r][0]), h1 = hsum8x2(acc[r][1]);
        float v[4] = {
            _mm512_cvtss_f32(h0), _mm_cvtss_f32(_mm512_extractf32x4_ps(h0, 2)),
            _mm512_cvtss_f32(h1), _mm_cvtss_f32(_mm512_extractf32x4_ps(h1, 2)),
        };
        if (type == CB_TYPE_Q4_1) {
            /* lanes j, 4+j, 8+j, 12+j -> output j: (l0 + l2) + (l1 + l3) by 128-bit lane */
            const __m128 q0 = _mm512_castps512_ps128(macc[r]), q1 = _mm512_extractf32x4_ps(macc[r], 1);
            const __m128 q2 = _mm512_extractf32x4_ps(macc[r], 2), q3 = _mm512_extractf32x4_ps(macc[r], 3);
            float m[4];
            _mm_storeu_ps(m, _mm_add_ps(_mm_add_ps(q0, q2), _mm_add_ps(q1, q3)));
            for (int j = 0; j < 4; j++) v[j] += m[j];
        }
        for (int j = 0; j < no; j++) y[r * ldy + j] = v[j];
    }
}

/* Output tiles of 4 over [o0, o1) for rows [r0, r1) of the call. */
T512 static INL void q_rows(const int type, const cb_weight *w, const cb_block_q8 *xq, const float *xs,
                            const __m256i *xc, int r0, int r1, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t nb = w->n_in / CB_QK;
    const size_t bsz = cb_type_block_bytes(type);
    _Alignas(64) qscales s;
    /* Output tile outer (its weights stay in L1/L2 and its scales are
     * gathered once), activation row tiles of 4 inner. */
    for (int64_t o = o0; o < o1; o += 4) {
        const int no = (int)(o1 - o < 4 ? o1 - o : 4);
        const uint8_t *wp[4];
        for (int j = 0; j < 4; j++)
            wp[j] = (const uint8_t *)w->data + (size_t)(o + (j < no ? j : no - 1)) * w->row_bytes;
        int64_t cached = -1;
        /* Software prefetch of the tile CB_PF_TILES ahead.  Decode streams
         * every weight once from L3/DRAM and the hardware prefetcher alone
         * leaves one thread latency-bound (measured: a 30-layer Q4_1 decode
         * emulation went from ~6 to ~7.7 GB/s on the 2-core VM). */
        if (o + 4 * CB_PF_TILES < o1) {
            const int64_t on = o + 4 * CB_PF_TILES;
            const char *p = (const char *)w->data + (size_t)on * w->row_bytes;
            const size_t bytes = (size_t)(o1 - on < 4 ? o1 - on : 4) * w->row_bytes;
            for (size_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
        }
        int r = r0;
        for (; r + 4 <= r1; r += 4)
            q_tile(type, 4, wp, bsz, nb, xq + (int64_t)r * nb, xs ? xs + (int64_t)(r - r0) * nb : NULL,
                   xc ? xc + (int64_t)(r - r0) * nb : NULL, &s, &cached, y + r * ldy + o, ldy, no);
        const float *xsr = xs ? xs + (int64_t)(r - r0) * nb : NULL;
        const __m256i *xcr = xc ? xc + (int64_t)(r - r0) * nb : NULL;
        switch (r1 - r) {
        case 3: q_tile(type, 3, wp, bsz, nb, xq + (int64_t)r * nb, xsr, xcr, &s, &cached, y + r * ldy + o, ldy, no); break;
        case 2: q_tile(type, 2, wp, bsz, nb, xq + (int64_t)r * nb, xsr, xcr, &s, &cached, y + r * ldy + o, ldy, no); break;
        case 1: q_tile(type, 1, wp, bsz, nb, xq + (int64_t)r * nb, xsr, xcr, &s, &cached, y + r * ldy + o, ldy, no); break;
        default: break;
        }
    }
}

T512 static INL void matmul_q(const int type, const cb_weight *w, const cb_block_q8 *xq,
                              int n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t nb = w->n_in / CB_QK;
    if (nb <= 0) return;
    if (type == CB_TYPE_Q4_1) {
        /* Row groups whose block sums fit XS_MAX (multiples of 4 rows, so
         * the row tiles are the same as without groups when one suffices). */
        _Alignas(64) float xs[XS_MAX];
        int64_t g = XS_MAX / nb;
        if (g >= 4) g &= ~(int64_t)3;
        if (g < 1) {  /* a row longer than XS_MAX blocks: read s in the loop */
            q_rows(type, w, xq, NULL, NULL, 0, n_rows, y, ldy, o0, o1);
            return;
        }
        for (int r0 = 0; r0 < n_rows; r0 += (int)g) {
            const int r1 = r0 + g < n_rows ? r0 + (int)g : n_rows;
            for (int64_t i = 0; i < (int64_t)(r1 - r0) * nb; i++) xs[i] = xq[(int64_t)r0 * nb + i].s;
            q_rows(type, w, xq, xs, NULL, r0, r1, y, ldy, o0, o1);
        }
        return;
    }
    if ((int64_t)n_rows * nb <= XC_MAX) {
        _Alignas(64) __m256i xc[XC_MAX];
        const __m256i k = _mm256_set1_epi8(type == CB_TYPE_Q8_0 ? (char)0x80 : 8);
        for (int64_t i = 0; i < (int64_t)n_rows * nb; i++) {
            const __m256i X = _mm256_loadu_si256((const __m256i *)xq[i].qs);
            xc[i] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), k, X));
        }
        q_rows(type, w, xq, NULL, xc, 0, n_rows, y, ldy, o0, o1);
        return;
    }
    q_rows(type, w, xq, NULL, NULL, 0, n_rows, y, ldy, o0, o1);
}

T512 static void matmul_q4_0(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                             int64_t ldy, int64_t o0, int64_t o1) {
    matmul_q(CB_TYPE_Q4_0, w, xq, n_rows, y, ldy, o0, o1);
}
T512 static void matmul_q4_1(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                             int64_t ldy, int64_t o0, int64_t o1) {
    matmul_q(CB_TYPE_Q4_1, w, xq, n_rows, y, ldy, o0, o1);
}
T512 static void matmul_q8_0(const cb_weight *w, const cb_block_q8 *xq, int n_rows, float *y,
                             int64_t ldy, int64_t o0, int64_t o1) {
    matmul_q(CB_TYPE_Q8_0, w, xq, n_rows, y, ldy, o0, o1);
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
    case CB_TYPE_Q4_0: matmul_q4_0(w, xq, n_rows, y, ldy, o0, o1); break;
    case CB_TYPE_Q4_1: matmul_q4_1(w, xq, n_rows, y, ldy, o0, o1); break;
    case CB_TYPE_Q8_0: matmul_q8_0(w, xq, n_rows, y, ldy, o0, o1); break;
    case CB_TYPE_F32:  matmul_f32(w, xf, n_rows, y, ldy, o0, o1); break;
    case CB_TYPE_F16:  matmul_f16(w, xf, n_rows, y, ldy, o0, o1); break;
    case CB_TYPE_BF16: matmul_bf16(w, xf, n_rows, y, ldy, o0, o1); break;
    default: break;
    }
}

/* ------------------------------------------------------------ float helpers */

T512 static float dot_f32_avx512(const float *a, const float *b, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
    }
    return hsum16(acc);
}

T512 static void axpy_f32_avx512(float *y, float a, const float *x, int64_t n) {
    const __m512 va = _mm512_set1_ps(a);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 v = _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

static const cb_kernels table = {
    CB_SIMD_AVX512, quantize_q8_avx512, matmul_rows_avx512, dot_f32_avx512, axpy_f32_avx512
};

const cb_kernels *cb_kernels_avx512_table(void);
const cb_kernels *cb_kernels_avx512_table(void) { return &table; }

#else  /* not x86 */

const cb_kernels *cb_kernels_avx512_table(void);
const cb_kernels *cb_kernels_avx512_table(void) { return 0; }

#endif
