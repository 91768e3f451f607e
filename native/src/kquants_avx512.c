/*
 * kquants_avx512.c — K-quant matmul with AVX-512 VNNI.
 *
 * Q4_K, Q5_K and Q6_K matrices packed at model load (the panel layout in
 * kquants.h) run panel kernels against cb_block_q8k activations: 16
 * outputs per vector, 4 weights of one output per 32-bit lane, so vpdpbusd
 * against 4 broadcast activation bytes finishes each output's integer sum
 * of a sub-block in its own lane.  The sub-block scales are applied in
 * integers (vpmulld, then vpaddd into the super-block's sum), the mins
 * (Q4_K / Q5_K) with vpdpwssd of int16 pairs against the activations'
 * int16 sums, Q6_K's -32 offsets as the starts of the vpdpbusd chains
 * (-32 * bs16 broadcast), and each (row, 16 outputs, super-block) takes
 * ONE float step, the one of kquants.h:
 *     acc += (d * float(isum) - dmin * float(msum)) * dx      (Q4_K, Q5_K)
 *     acc += (d * float(isum)) * dx                             (Q6_K)
 * as separate multiplies, subtractions and adds (no FMA), so the results are
 * the scalar path's bits, whatever the tile, the panel's place in the work
 * split or the thread (batch invariance).  On Zen 4 (cb_ymm_decode) one- and
 * two-row Q4_K runs the same steps on 256-bit halves of the panels (ky_*).
 *
 * Q2_K and Q3_K run the row kernels of kquants_simd.h with vpdpbusd on
 * 256-bit vectors against cb_block_q8 activations.
 */
#include "kquants.h"
#include "colibri.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define KQ_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define KQ_FN(name) name##_avx512
KQ_ATTR static inline __m256i kq_mulsum_avx512(__m256i wu, __m256i xs) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), wu, xs);
}
#define KQ_MULSUM(a, b) kq_mulsum_avx512(a, b)
#include "kquants_simd.h"

#define INL __attribute__((always_inline)) inline

/* Activation rows per tile (16 measured no faster in cache, single vpdpbusd
 * chains per sub-block slower than two). */
#define KP_ROWS 8
/* Panels between a panel's software prefetch and its use (as kernels_avx512.c). */
#define KP_PF_PANELS 2

/* dpbusd: 4 activation bytes; dpwssd: an int16 pair of activation sums */
CB_BCAST_DOT(KQ_ATTR, kp_dp, __m512i, "vpdpbusd", 16, _mm512_dpbusd_epi32, _mm512_set1_epi32)
CB_BCAST_DOT(KQ_ATTR, kp_dpw, __m512i, "vpdpwssd", 16, _mm512_dpwssd_epi32, _mm512_set1_epi32)
CB_BCAST_DOT(KQ_ATTR, ky_dp, __m256i, "vpdpbusd", 8, _mm256_dpbusd_epi32, _mm256_set1_epi32)
CB_BCAST_DOT(KQ_ATTR, ky_dpw, __m256i, "vpdpwssd", 8, _mm256_dpwssd_epi32, _mm256_set1_epi32)

static inline __mmask16 kp_mask(int64_t rem) {
    return rem >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << rem) - 1u);
}

/* Int16 pairs (a_o, b_o) of two 16-byte rows (one byte per output o) in
 * lane o: the vpdpwssd operand against a broadcast pair of activation sums. */
KQ_ATTR static INL __m512i kp_pairs_u8(__m128i a, __m128i b) {
    return _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(a, b), _mm_unpacklo_epi8(a, b)));
}

/* The 6-bit scale (mins = 0) or min (mins = 1) fields of sub-block j of
 * 16 outputs of a Q4_K / Q5_K panel super-block p: the 12 packed scale bytes
 * of every output are one byte row each (byte k of output j at 64 + 16k +
 * j), so the fields of 16 outputs come out of 16-byte rows with byte masks
 * and 16-bit shifts (the bits a shift carries across a byte are masked
 * off), as ggml's get_scale_min_k4 does per output. */
KQ_ATTR static INL __m128i kp_field_q45(const uint8_t *p, int j, int mins) {
    const __m128i m6 = _mm_set1_epi8(63), m4 = _mm_set1_epi8(15), top2 = _mm_set1_epi8(0x30);
    const __m128i *S = (const __m128i *)(p + 64);
    if (j < 4) return _mm_and_si128(_mm_loadu_si128(S + j + 4 * mins), m6);
    const __m128i lo = _mm_loadu_si128(S + j + 4), hi = _mm_loadu_si128(S + j - 4 + 4 * mins);
    /* (q >> 6) << 4 == (q >> 2) & 0x30 */
    return _mm_or_si128(_mm_and_si128(mins ? _mm_srli_epi16(lo, 4) : lo, m4), _mm_and_si128(_mm_srli_epi16(hi, 2), top2));
}

/* The sub-block scales sc_j (int32, 16 outputs) into sc[j] (memory: the
 * kernels read them as vpmulld operands).  Q4_K's even sub-blocks' scales
 * are multiplied by 16: the odd ones' weights are read as the high nibble
 * in place, 16 times the quant (see kp_tile_q45), so the kernel sums
 * 16 * isum (kquants.h bounds it) and scales by d / 16. */
KQ_ATTR static INL void kp_scales_q45(const int q5, const uint8_t *p, __m512i *sc) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        const __m512i v = _mm512_cvtepu8_epi32(kp_field_q45(p, j, 0));
        _mm512_store_si512(sc + j, !q5 && !(j & 1) ? _mm512_slli_epi32(v, 4) : v);
    }
}

/* The mins as int16 pairs (m_2k, m_2k+1), k = 0..3, of 16 outputs. */
KQ_ATTR static INL void kp_mins_q45(const uint8_t *p, __m512i *mp) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) mp[k] = kp_pairs_u8(kp_field_q45(p, 2 * k, 1), kp_field_q45(p, 2 * k + 1, 1));
}

/* One Q4_K / Q5_K panel (16 outputs) x R activation rows over nsb super-blocks. */
KQ_ATTR static INL void kp_tile_q45(const int q5, const int R, const uint8_t *panel, int64_t nsb,
                                    const cb_block_q8k *xr, float *y, int64_t ldy, __mmask16 m,
                                    const uint8_t *pf) {
    const size_t pb = q5 ? 16 * 176 : 16 * 144;
    const __m512i lo4 = _mm512_set1_epi8(0x0F), hi4 = _mm512_set1_epi8((char)0xF0), b4 = _mm512_set1_epi8(0x10);
    _Alignas(64) float acc[KP_ROWS][16];  /* memory: the registers go to weights and integer sums */
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) _mm512_store_ps(acc[r], _mm512_setzero_ps());
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *p = panel + (size_t)s * pb, *pfs = pf ? pf + (size_t)s * pb : NULL;
        _Alignas(64) __m512i sc[8];
        __m512i mp[4], isum[KP_ROWS];
        kp_scales_q45(q5, p, sc);
        const uint8_t *qs = p + (q5 ? 768 : 256);
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) isum[r] = _mm512_setzero_si512();
#pragma GCC unroll 1
        for (int j = 0; j < 8; j++) {  /* sub-block j: nibble j & 1 of group j / 2 */
            kq_prefetch_part(pfs, pb, j, 8);
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
                } else {  /* Q4_K odd sub-blocks: the high nibble in place (16 q) */
                    W[c] = _mm512_and_si512(v, j & 1 ? hi4 : lo4);
                }
            }
            const __m512i scj = sc[j];
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) {
                const cb_i32u *x4 = (const cb_i32u *)(xr[(int64_t)r * nsb + s].qs + 32 * j);
                __m512i t0 = kp_dp(_mm512_setzero_si512(), W[0], x4);
                __m512i t1 = kp_dp(_mm512_setzero_si512(), W[4], x4 + 4);
#pragma GCC unroll 3
                for (int c = 1; c < 4; c++) {
                    t0 = kp_dp(t0, W[c], x4 + c);
                    t1 = kp_dp(t1, W[c + 4], x4 + c + 4);
                }
                isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(_mm512_add_epi32(t0, t1), scj));
            }
        }
        kp_mins_q45(p, mp);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        const __m512 dq = q5 ? d : _mm512_mul_ps(d, _mm512_set1_ps(0.0625f));  /* exact */
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            const cb_block_q8k *xb = xr + (int64_t)r * nsb + s;
            const cb_i32u *b2 = (const cb_i32u *)xb->bs32;
            __m512i ms = kp_dpw(_mm512_setzero_si512(), mp[0], b2);
            ms = kp_dpw(ms, mp[1], b2 + 1);
            ms = kp_dpw(ms, mp[2], b2 + 2);
            ms = kp_dpw(ms, mp[3], b2 + 3);
            const __m512 a = _mm512_mul_ps(dq, _mm512_cvtepi32_ps(isum[r]));
            const __m512 b = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(ms));
            const __m512 u = _mm512_mul_ps(_mm512_sub_ps(a, b), _mm512_set1_ps(xb->d));
            _mm512_store_ps(acc[r], _mm512_add_ps(_mm512_load_ps(acc[r]), u));
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + (int64_t)r * ldy, m, _mm512_load_ps(acc[r]));
}

/* The 4 chunks (4 weights x 16 outputs each) of Q6_K panel group g (the
 * regrouped layout of kquants.h): unsigned q in 0..63. */
KQ_ATTR static INL void kp_q6_group(const uint8_t *g, __m512i *W) {
    const __m512i m63 = _mm512_set1_epi8(63), m3 = _mm512_set1_epi8(3), m12 = _mm512_set1_epi8(12),
                  m48 = _mm512_set1_epi8(48);
    const __m512i a = _mm512_loadu_si512((const void *)g), b = _mm512_loadu_si512((const void *)(g + 64)),
                  c = _mm512_loadu_si512((const void *)(g + 128));
    W[0] = _mm512_and_si512(a, m63);
    W[1] = _mm512_and_si512(b, m63);
    W[2] = _mm512_and_si512(c, m63);
    /* bits 0-1 from a >> 6, 2-3 from b >> 4, 4-5 from c >> 2, joined by byte adds (the fields do not
     * overlap): shifts, ands and adds leave Zen 4's vpdpbusd pipes alone, where vpternlogd (which
     * GCC makes of and / or pairs) takes their slots */
    W[3] = _mm512_add_epi8(_mm512_add_epi8(_mm512_and_si512(_mm512_srli_epi16(a, 6), m3),
                                           _mm512_and_si512(_mm512_srli_epi16(b, 4), m12)),
                           _mm512_and_si512(_mm512_srli_epi16(c, 2), m48));
}

/* One Q6_K panel x R rows.  Weights as unsigned q in 0..63; the -32 of
 * each 16-weight sub-block i is the start of its vpdpbusd chain,
 * -32 * bs16_i broadcast, so each chain sums (q - 32) * x exactly. */
KQ_ATTR static INL void kp_tile_q6(const int R, const uint8_t *panel, int64_t nsb,
                                   const cb_block_q8k *xr, float *y, int64_t ldy, __mmask16 m,
                                   const uint8_t *pf) {
    const size_t pb = 16 * 210;
    _Alignas(64) float acc[KP_ROWS][16];  /* memory: the registers go to weights and integer sums */
    _Alignas(64) int32_t off[KP_ROWS][16];  /* -32 * bs16 of each row's sub-blocks */
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) _mm512_store_ps(acc[r], _mm512_setzero_ps());
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *p = panel + (size_t)s * pb, *pfs = pf ? pf + (size_t)s * pb : NULL;
        __m512i isum[KP_ROWS];
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            isum[r] = _mm512_setzero_si512();
            const __m512i b16 = _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)xr[(int64_t)r * nsb + s].bs16));
            _mm512_store_si512(off[r], _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(b16, 5)));
        }
#pragma GCC unroll 1
        for (int b = 0; b < 8; b++) {  /* 32-weight block b: sub-blocks 2b, 2b + 1 = groups 2b, 2b + 1 */
            kq_prefetch_part(pfs, pb, b, 8);
            const __m512i sl = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * (2 * b))));
            const __m512i sh = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * (2 * b + 1))));
            __m512i W[8];
            kp_q6_group(p + 288 + 192 * (2 * b), W);
            kp_q6_group(p + 288 + 192 * (2 * b + 1), W + 4);
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) {
                const cb_i32u *x4 = (const cb_i32u *)(xr[(int64_t)r * nsb + s].qs + 32 * b);
                __m512i s0 = kp_dp(_mm512_set1_epi32(off[r][2 * b]), W[0], x4);
                __m512i s1 = kp_dp(_mm512_set1_epi32(off[r][2 * b + 1]), W[4], x4 + 4);
#pragma GCC unroll 3
                for (int c = 1; c < 4; c++) {
                    s0 = kp_dp(s0, W[c], x4 + c);
                    s1 = kp_dp(s1, W[c + 4], x4 + c + 4);
                }
                isum[r] = _mm512_add_epi32(isum[r], _mm512_add_epi32(_mm512_mullo_epi32(s0, sl), _mm512_mullo_epi32(s1, sh)));
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            const cb_block_q8k *xb = xr + (int64_t)r * nsb + s;
            const __m512 a = _mm512_mul_ps(d, _mm512_cvtepi32_ps(isum[r]));
            _mm512_store_ps(acc[r], _mm512_add_ps(_mm512_load_ps(acc[r]), _mm512_mul_ps(a, _mm512_set1_ps(xb->d))));
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + (int64_t)r * ldy, m, _mm512_load_ps(acc[r]));
}

/* One panel x R rows of the packed type. */
KQ_ATTR static INL void kp_tile(const int type, const int R, const uint8_t *panel, int64_t nsb,
                                const cb_block_q8k *xr, float *y, int64_t ldy, __mmask16 m, const uint8_t *pf) {
    if (type == CB_TYPE_Q6_K) kp_tile_q6(R, panel, nsb, xr, y, ldy, m, pf);
    else kp_tile_q45(type == CB_TYPE_Q5_K, R, panel, nsb, xr, y, ldy, m, pf);
}

/* Activation bytes of one row block: the rows whose blocks stay in L2 while
 * every panel of the work item passes over them. */
#define KP_ROW_BLOCK_BYTES (192 * 1024)

/* Panels over outputs [o0, o1) (o0 a multiple of CB_PANEL) for rows
 * [0, n_rows): row blocks outer (a prefill's activations would not stay in
 * L2 across the panels otherwise: 512 rows of 1536 inputs are ~0.9 MB of
 * blocks, re-read from L3 for every panel), panels inner (a panel stays in
 * L1/L2 across the row tiles of a block), then row tiles; the first tile of
 * a panel prefetches the panel KP_PF_PANELS ahead (where cb_prefetch_panels
 * says it pays).  The split changes which tile a row is in, never the order
 * of a row's float steps. */
KQ_ATTR static INL void kp_rows(const int type, const cb_weight *w, const cb_block_q8k *xk,
                                int n_rows, float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t nsb = w->n_in / CB_QK_K;
    const size_t pb = cb_pack_block_bytes(type), psz = (size_t)nsb * pb;
    const int pfp = cb_prefetch_panels(type, n_rows);
    int rb = (int)(KP_ROW_BLOCK_BYTES / ((size_t)nsb * sizeof(cb_block_q8k)));
    rb = rb < KP_ROWS ? KP_ROWS : rb - rb % KP_ROWS;
    for (int r0 = 0; r0 < n_rows; r0 += rb) {
        const int r1 = r0 + rb < n_rows ? r0 + rb : n_rows;
        for (int64_t o = o0; o < o1; o += CB_PANEL) {
            const uint8_t *panel = (const uint8_t *)w->packed + (size_t)(o / CB_PANEL) * psz;
            const __mmask16 m = kp_mask(o1 - o);
            const uint8_t *pf = pfp && o + KP_PF_PANELS * CB_PANEL < w->n_out ? panel + KP_PF_PANELS * psz : NULL;
            int r = r0;
            for (; r + KP_ROWS <= r1; r += KP_ROWS, pf = NULL)
                kp_tile(type, KP_ROWS, panel, nsb, xk + (int64_t)r * nsb, y + r * ldy + o, ldy, m, pf);
            /* the tail as tiles of 8, 4, 2, 1 rows */
            if (r1 - r >= 8) { kp_tile(type, 8, panel, nsb, xk + (int64_t)r * nsb, y + r * ldy + o, ldy, m, pf); r += 8; pf = NULL; }
            if (r1 - r >= 4) { kp_tile(type, 4, panel, nsb, xk + (int64_t)r * nsb, y + r * ldy + o, ldy, m, pf); r += 4; pf = NULL; }
            if (r1 - r >= 2) { kp_tile(type, 2, panel, nsb, xk + (int64_t)r * nsb, y + r * ldy + o, ldy, m, pf); r += 2; pf = NULL; }
            if (r1 - r >= 1) kp_tile(type, 1, panel, nsb, xk + (int64_t)r * nsb, y + r * ldy + o, ldy, m, pf);
        }
    }
}

/* ------------------------------------------- one- and two-row Q4_K, 256-bit
 *
 * On a CPU that runs each 512-bit operation as two 256-bit halves (Zen 4:
 * cb_ymm_decode in colibri.h) decode's Q4_K matmuls run this kernel:
 * kp_tile_q45's steps on the two halves of 8 outputs of each panel row
 * (bytes 0-31 and 32-63 of every 64-byte line), vpdpbusd on ymm with the 32
 * registers of AVX-512VL.  Same integer sums, same float step, same bits.
 * Why: from DRAM one row of the 512-bit kernel streams 21-23 GB/s (0.71-0.75
 * of a plain read loop; in L2 it computes 50) and AVX2's vpmaddubsw kernel
 * 22-25 (its compute rate in L2, 28, is the cap), this one 25.6-28.5
 * without software prefetch (0.89-0.90 of the read loop); two rows 24.6 with
 * it against AVX2's 18.0 (bench_kquants, Zen 4, session 25; ky_rows_q4 has
 * the prefetch rule). */
/* One Q4_K panel (no <= 16 outputs wanted) x R (1 or 2) rows. */
KQ_ATTR static INL void ky_tile_q4(const int R, const uint8_t *panel, int64_t nsb, const cb_block_q8k *xr,
                                   float *y, int64_t ldy, int no, const uint8_t *pf) {
    const size_t pb = 16 * 144;
    const __m256i lo4 = _mm256_set1_epi8(0x0F), hi4 = _mm256_set1_epi8((char)0xF0);
    __m256 acc[2][2];  /* [half][row]: 8 outputs each */
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < R; r++) acc[h][r] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *p = panel + (size_t)s * pb, *pfs = pf ? pf + (size_t)s * pb : NULL;
        /* sub-block scales as int32 per half, even ones x 16 as in kp_scales_q45 */
        _Alignas(32) __m256i sc[8][2];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const __m128i f = kp_field_q45(p, j, 0);
            const __m256i v0 = _mm256_cvtepu8_epi32(f), v1 = _mm256_cvtepu8_epi32(_mm_srli_si128(f, 8));
            _mm256_store_si256(&sc[j][0], j & 1 ? v0 : _mm256_slli_epi32(v0, 4));
            _mm256_store_si256(&sc[j][1], j & 1 ? v1 : _mm256_slli_epi32(v1, 4));
        }
        __m256i isum[2][2];
        for (int h = 0; h < 2; h++)
            for (int r = 0; r < R; r++) isum[h][r] = _mm256_setzero_si256();
        const uint8_t *qs = p + 256;
#pragma GCC unroll 1
        for (int j = 0; j < 8; j++) {  /* sub-block j: nibble j & 1 of group j / 2, the high one in place */
            kq_prefetch_part(pfs, pb, j, 8);
            const uint8_t *q = qs + 512 * (j >> 1);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256i W[8];
#pragma GCC unroll 8
                for (int c = 0; c < 8; c++)
                    W[c] = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(q + 64 * c + 32 * h)), j & 1 ? hi4 : lo4);
                const __m256i scj = _mm256_load_si256(&sc[j][h]);
#pragma GCC unroll 2
                for (int r = 0; r < R; r++) {
                    const cb_i32u *x4 = (const cb_i32u *)(xr[(int64_t)r * nsb + s].qs + 32 * j);
                    __m256i t0 = ky_dp(_mm256_setzero_si256(), W[0], x4);
                    __m256i t1 = ky_dp(_mm256_setzero_si256(), W[4], x4 + 4);
#pragma GCC unroll 3
                    for (int c = 1; c < 4; c++) {
                        t0 = ky_dp(t0, W[c], x4 + c);
                        t1 = ky_dp(t1, W[c + 4], x4 + c + 4);
                    }
                    isum[h][r] = _mm256_add_epi32(isum[h][r], _mm256_mullo_epi32(_mm256_add_epi32(t0, t1), scj));
                }
            }
        }
        __m128i mn[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) mn[j] = kp_field_q45(p, j, 1);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i mp[4];  /* int16 pairs (m_2k, m_2k+1) of the half's 8 outputs */
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++)
                mp[k] = _mm256_cvtepu8_epi16(h ? _mm_unpackhi_epi8(mn[2 * k], mn[2 * k + 1])
                                               : _mm_unpacklo_epi8(mn[2 * k], mn[2 * k + 1]));
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * h)));
            const __m256 dq = _mm256_mul_ps(d, _mm256_set1_ps(0.0625f));  /* exact */
            const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * h)));
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                const cb_block_q8k *xb = xr + (int64_t)r * nsb + s;
                const cb_i32u *b2 = (const cb_i32u *)xb->bs32;
                __m256i ms = ky_dpw(_mm256_setzero_si256(), mp[0], b2);
                ms = ky_dpw(ms, mp[1], b2 + 1);
                ms = ky_dpw(ms, mp[2], b2 + 2);
                ms = ky_dpw(ms, mp[3], b2 + 3);
                const __m256 a = _mm256_mul_ps(dq, _mm256_cvtepi32_ps(isum[h][r]));
                const __m256 b = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(ms));
                acc[h][r] = _mm256_add_ps(acc[h][r], _mm256_mul_ps(_mm256_sub_ps(a, b), _mm256_set1_ps(xb->d)));
            }
        }
    }
    for (int h = 0; h < 2 && no > 8 * h; h++) {
        const int n = no - 8 * h < 8 ? no - 8 * h : 8;
        for (int r = 0; r < R; r++)
            _mm256_mask_storeu_ps(y + (int64_t)r * ldy + 8 * h, (__mmask8)((1u << n) - 1u), acc[h][r]);
    }
}

/* Panels over outputs [o0, o1) (o0 a multiple of CB_PANEL) x 1 or 2 rows. */
KQ_ATTR static void ky_rows_q4(const cb_weight *w, const cb_block_q8k *xk, int n_rows, float *y, int64_t ldy,
                               int64_t o0, int64_t o1) {
    const int64_t nsb = w->n_in / CB_QK_K;
    const size_t psz = (size_t)nsb * cb_pack_block_bytes(CB_TYPE_Q4_K);
    /* one row streams faster without the software prefetch (25.6 GB/s
     * against 20.0 with), two with it (24.6 against 22.8): the prefetch
     * only where forced on, as cb_prefetch_panels rules for AMD's
     * kernels with little work per byte */
    const int pfp = n_rows == 1 ? cb_prefetch_mode() == CB_PREFETCH_ON : cb_prefetch_panels(CB_TYPE_Q4_K, n_rows);
    for (int64_t o = o0; o < o1; o += CB_PANEL) {
        const uint8_t *panel = (const uint8_t *)w->packed + (size_t)(o / CB_PANEL) * psz;
        const int no = (int)(o1 - o < CB_PANEL ? o1 - o : CB_PANEL);
        const uint8_t *pf = pfp && o + KP_PF_PANELS * CB_PANEL < w->n_out ? panel + KP_PF_PANELS * psz : NULL;
        if (n_rows == 2) ky_tile_q4(2, panel, nsb, xk, y + o, ldy, no, pf);
        else ky_tile_q4(1, panel, nsb, xk, y + o, ldy, no, pf);
    }
}

/* ------------------------------------------------------------ AMX tiles */

/* Prefill-sized batches (16 rows and more) of Q4_K, Q5_K and Q6_K on CPUs
 * with AMX int8 tiles (Intel Sapphire Rapids and later).  One tile product
 * is a 16-row x 16-output block over 64 inputs: A = 16 activation rows x 64
 * int8 values, read in place from the cb_block_q8k rows with the rows'
 * stride; B = 64 inputs x 16 outputs as the panel layout already orders them
 * (4 consecutive weights of one output per 32-bit lane, 16 outputs a 64-byte
 * row), unpacked to bytes.  The sub-block scales vary every 32 (Q6_K: 16)
 * inputs, so they cannot be applied after a 64-input product; instead they
 * go into B, split into digits small enough that weight x digit is a byte:
 *     Q4_K / Q5_K: sc = 8 a + b (a, b in 0..7, q <= 31: q a <= 217, unsigned),
 *                  isum = 8 (A . Ba) + (A . Bb)
 *     Q6_K:        sc + 128 = d0 + 4 d1 + 16 d2 + 64 d3 (digits 0..3), so
 *                  sc = sum_k 4^k e_k with e_k = d_k (k < 3), e_3 = d3 - 2;
 *                  w = q - 32 in -32..31, so |w e_k| <= 96 is a signed byte:
 *                  isum = sum_k 4^k (A . B_k), B_k = w e_k (signed x signed).
 * Every product accumulates over a whole super-block inside the tile unit,
 * and what comes out is the exact integer isum of kquants.h, the one the
 * VNNI kernel sums; the mins and the ONE float step per super-block are the
 * VNNI kernel's operations in the same order.  So a row's outputs have the
 * same bits whichever kernel takes it (a prefill's 16-row tiles here, its
 * tail and every decode step on VNNI). */
#if (defined(__GNUC__) && __GNUC__ >= 11) || (defined(__clang__) && __clang_major__ >= 12)
#define KA_HAVE 1
#define KA_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,amx-tile,amx-int8")))

/* Super-blocks of one panel staged at once (per thread, on the stack, 32 KB:
 * about an L1): Q4_K / Q5_K 4 x (2 matrices x 4 steps x 1 KB), Q6_K 2 x (4 x 4 x 1 KB). */
#define KA_STAGE_BYTES (32 * 1024)
/* Activation rows a panel's staged weights serve before the next panel: up
 * to KA_TILES tiles of 16, as many as keep the row block's activations within
 * KA_ROW_BLOCK_BYTES (an L2's share). */
#define KA_TILES 8
#define KA_ROW_BLOCK_BYTES (512 * 1024)

typedef struct {
    uint8_t  palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t  rows[16];
} ka_tilecfg;

/* Every tile 16 rows x 64 bytes: 0 and 5 = A of two row tiles, 1 and 4 = B,
 * 2, 3, 6, 7 = C (int32). */
KA_ATTR static void ka_config(void) {
    ka_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) { c.rows[t] = 16; c.colsb[t] = 64; }
    _tile_loadconfig(&c);
}

/* Staged super-blocks of one panel. */
typedef struct {
    _Alignas(64) uint8_t b[KA_STAGE_BYTES];  /* B matrices: [super-block][matrix][step 0..3][16 rows][64] */
    _Alignas(64) int16_t mp[4][4][32];       /* Q4_K / Q5_K: the mins as int16 pairs (kp_mins_q45) */
    _Alignas(64) float   d[4][16];           /* Q4_K: d / 16 (the VNNI kernel's), Q5_K and Q6_K: d */
    _Alignas(64) float   dmin[4][16];
} ka_stage;

static inline int ka_sb(int type) { return type == CB_TYPE_Q6_K ? 2 : 4; }
static inline int ka_mats(int type) { return type == CB_TYPE_Q6_K ? 4 : 2; }
static inline const uint8_t *ka_b(const ka_stage *st, int type, int t, int m, int ks) {
    return st->b + ((size_t)(t * ka_mats(type) + m) * 4 + (size_t)ks) * 1024;
}

/* Digits of 16 outputs' bytes v (one per output) as 16-bit lanes: each
 * 32-bit lane o holds (v_o >> shift & mask) in both halves (the vpmullw
 * operand that multiplies the 4 weight bytes of output o). */
KA_ATTR static INL __m512i ka_digit16(__m128i v, int shift, int mask) {
    const __m512i x = _mm512_and_si512(_mm512_srli_epi32(_mm512_cvtepu8_epi32(v), shift), _mm512_set1_epi32(mask));
    return _mm512_or_si512(x, _mm512_slli_epi32(x, 16));
}

/* Unpack super-blocks [s0, s0 + n) of a panel into B matrices. */
KA_ATTR static void ka_stage_panel(const int type, const uint8_t *panel, int64_t s0, int n, ka_stage *st) {
    const size_t pb = cb_pack_block_bytes(type);
    for (int t = 0; t < n; t++) {
        const uint8_t *p = panel + (size_t)(s0 + t) * pb;
        if (type == CB_TYPE_Q6_K) {
            const __m512i m32 = _mm512_set1_epi8(32), rep = _mm512_set1_epi32(0x01010101);
            for (int i = 0; i < 16; i++) {  /* sub-block i = group i: chunks v = 0..3 of 4 weights x 16 outputs */
                __m512i W[4];
                kp_q6_group(p + 288 + 192 * i, W);
                /* sc + 128 (0..255) of each output in all 4 bytes of its lane */
                const __m128i sc = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * i)), _mm_set1_epi8((char)0x80));
                const __m512i u = _mm512_mullo_epi32(_mm512_cvtepu8_epi32(sc), rep);
                const int ks = i / 4;
                for (int v = 0; v < 4; v++) {
                    const __m512i w = _mm512_sub_epi8(W[v], m32), w2 = _mm512_add_epi8(w, w);
                    const int row = (i % 4) * 4 + v;
                    for (int k = 0; k < 4; k++) {  /* w * digit k, by masked moves and adds of w and 2w */
                        const __mmask64 b0 = _mm512_test_epi8_mask(u, _mm512_set1_epi8((char)(1 << (2 * k))));
                        const __mmask64 b1 = _mm512_test_epi8_mask(u, _mm512_set1_epi8((char)(2 << (2 * k))));
                        __m512i e = _mm512_mask_add_epi8(_mm512_maskz_mov_epi8(b0, w), b1, _mm512_maskz_mov_epi8(b0, w), w2);
                        if (k == 3) e = _mm512_sub_epi8(e, w2);  /* w (d3 - 2) */
                        _mm512_store_si512((void *)(ka_b(st, type, t, k, ks) + 64 * row), e);
                    }
                }
            }
            _mm512_store_ps(st->d[t], _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)));
            continue;
        }
        const int q5 = type == CB_TYPE_Q5_K;
        const __m512i lo4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
        const uint8_t *qs = p + (q5 ? 768 : 256);
        for (int j = 0; j < 8; j++) {  /* sub-block j: rows 8 (j & 1) + c of step j / 2 */
            const __m128i sc = kp_field_q45(p, j, 0);
            const __m512i a16 = ka_digit16(sc, 3, 7), b16 = ka_digit16(sc, 0, 7);
            const uint8_t *q = qs + 512 * (j >> 1);
            for (int c = 0; c < 8; c++) {
                const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * c));
                __m512i w = _mm512_and_si512(j & 1 ? _mm512_srli_epi16(v, 4) : v, lo4);
                if (q5) {  /* quant | (bit j of each qh byte) << 4, 0..31 */
                    const __m512i h = _mm512_loadu_si512((const void *)(p + 256 + 64 * c));
                    const __m512i hb = j <= 4 ? _mm512_slli_epi16(h, 4 - j) : _mm512_srli_epi16(h, j - 4);
                    w = _mm512_or_si512(w, _mm512_and_si512(hb, b4));
                }
                const size_t row = 64 * (size_t)(8 * (j & 1) + c);
                /* byte products in 16-bit multiplies: each byte's product is < 256, so none carries */
                _mm512_store_si512((void *)(ka_b(st, type, t, 0, j >> 1) + row), _mm512_mullo_epi16(w, a16));
                _mm512_store_si512((void *)(ka_b(st, type, t, 1, j >> 1) + row), _mm512_mullo_epi16(w, b16));
            }
        }
        __m512i mp[4];
        kp_mins_q45(p, mp);
        for (int k = 0; k < 4; k++) _mm512_store_si512(st->mp[t][k], mp[k]);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        _mm512_store_ps(st->d[t], q5 ? d : _mm512_mul_ps(d, _mm512_set1_ps(0.0625f)));  /* exact */
        _mm512_store_ps(st->dmin[t], _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32))));
    }
}

/* The float step of super-block t for the 16 rows of a tile whose integer
 * sums are in c (Q4_K / Q5_K: c[0] = A . Ba, c[1] = A . Bb; Q6_K: c[0..3]
 * = A . B_k): as kp_tile_q45 / kp_tile_q6, row by row. */
KA_ATTR static INL void ka_step(const int type, const ka_stage *st, int t, int32_t (*c)[16][16],
                                const cb_block_q8k *xb0, size_t xs, float (*acc)[16]) {
    if (type == CB_TYPE_Q6_K) {
        const __m512 d = _mm512_load_ps(st->d[t]);
#pragma GCC unroll 4
        for (int r = 0; r < 16; r++) {
            const __m512i i0 = _mm512_load_si512((const void *)c[0][r]), i1 = _mm512_load_si512((const void *)c[1][r]),
                          i2 = _mm512_load_si512((const void *)c[2][r]), i3 = _mm512_load_si512((const void *)c[3][r]);
            const __m512i isum = _mm512_add_epi32(_mm512_add_epi32(i0, _mm512_slli_epi32(i1, 2)),
                                                  _mm512_add_epi32(_mm512_slli_epi32(i2, 4), _mm512_slli_epi32(i3, 6)));
            const cb_block_q8k *xb = (const cb_block_q8k *)((const char *)xb0 + (size_t)r * xs);
            const __m512 a = _mm512_mul_ps(d, _mm512_cvtepi32_ps(isum));
            _mm512_store_ps(acc[r], _mm512_add_ps(_mm512_load_ps(acc[r]), _mm512_mul_ps(a, _mm512_set1_ps(xb->d))));
        }
        return;
    }
    const int q5 = type == CB_TYPE_Q5_K;
    const __m512i mp0 = _mm512_load_si512((const void *)st->mp[t][0]), mp1 = _mm512_load_si512((const void *)st->mp[t][1]),
                  mp2 = _mm512_load_si512((const void *)st->mp[t][2]), mp3 = _mm512_load_si512((const void *)st->mp[t][3]);
    const __m512 dq = _mm512_load_ps(st->d[t]), dmin = _mm512_load_ps(st->dmin[t]);
#pragma GCC unroll 4
    for (int r = 0; r < 16; r++) {
        __m512i isum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512((const void *)c[0][r]), 3),
                                        _mm512_load_si512((const void *)c[1][r]));
        if (!q5) isum = _mm512_slli_epi32(isum, 4);  /* the VNNI kernel's 16 * isum against d / 16 */
        const cb_block_q8k *xb = (const cb_block_q8k *)((const char *)xb0 + (size_t)r * xs);
        const cb_i32u *b2 = (const cb_i32u *)xb->bs32;
        __m512i ms = kp_dpw(_mm512_setzero_si512(), mp0, b2);
        ms = kp_dpw(ms, mp1, b2 + 1);
        ms = kp_dpw(ms, mp2, b2 + 2);
        ms = kp_dpw(ms, mp3, b2 + 3);
        const __m512 a = _mm512_mul_ps(dq, _mm512_cvtepi32_ps(isum));
        const __m512 b = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(ms));
        const __m512 u = _mm512_mul_ps(_mm512_sub_ps(a, b), _mm512_set1_ps(xb->d));
        _mm512_store_ps(acc[r], _mm512_add_ps(_mm512_load_ps(acc[r]), u));
    }
}

/* Tiles of 16 rows x one panel over the staged super-blocks [s0, s0 + n):
 * Q4_K / Q5_K two row tiles at a time (x0, x1; x1 NULL: one), sharing each
 * B load; Q6_K one.  x: the tile's first row at super-block 0; xs: bytes
 * from one row to the next. */
KA_ATTR static void ka_tiles(const int type, const ka_stage *st, int64_t s0, int n, const cb_block_q8k *x0,
                             const cb_block_q8k *x1, size_t xs, float (*acc0)[16], float (*acc1)[16]) {
    _Alignas(64) int32_t c[4][16][16];
    for (int t = 0; t < n; t++) {
        const int64_t s = s0 + t;
        if (type == CB_TYPE_Q6_K) {
            _tile_zero(2); _tile_zero(3); _tile_zero(6); _tile_zero(7);
            for (int ks = 0; ks < 4; ks++) {
                _tile_loadd(0, x0[s].qs + 64 * ks, xs);
                _tile_loadd(1, ka_b(st, type, t, 0, ks), 64); _tile_dpbssd(2, 0, 1);
                _tile_loadd(4, ka_b(st, type, t, 1, ks), 64); _tile_dpbssd(3, 0, 4);
                _tile_loadd(1, ka_b(st, type, t, 2, ks), 64); _tile_dpbssd(6, 0, 1);
                _tile_loadd(4, ka_b(st, type, t, 3, ks), 64); _tile_dpbssd(7, 0, 4);
            }
            _tile_stored(2, c[0], 64); _tile_stored(3, c[1], 64); _tile_stored(6, c[2], 64); _tile_stored(7, c[3], 64);
            ka_step(type, st, t, c, x0 + s, xs, acc0);
            continue;
        }
        _tile_zero(2); _tile_zero(3);
        if (x1) { _tile_zero(6); _tile_zero(7); }
        for (int ks = 0; ks < 4; ks++) {
            _tile_loadd(0, x0[s].qs + 64 * ks, xs);
            _tile_loadd(1, ka_b(st, type, t, 0, ks), 64);
            _tile_loadd(4, ka_b(st, type, t, 1, ks), 64);
            _tile_dpbsud(2, 0, 1);
            _tile_dpbsud(3, 0, 4);
            if (x1) {
                _tile_loadd(5, x1[s].qs + 64 * ks, xs);
                _tile_dpbsud(6, 5, 1);
                _tile_dpbsud(7, 5, 4);
            }
        }
        _tile_stored(2, c[0], 64); _tile_stored(3, c[1], 64);
        if (x1) { _tile_stored(6, c[2], 64); _tile_stored(7, c[3], 64); }
        ka_step(type, st, t, c, x0 + s, xs, acc0);
        if (x1) ka_step(type, st, t, c + 2, x1 + s, xs, acc1);
    }
}

/* Rows [0, n16) (a multiple of 16) x outputs [o0, o1): row blocks of up to
 * KA_TILES tiles outer, panels, then staged super-blocks, then tiles. */
KA_ATTR static void ka_rows(const int type, const cb_weight *w, const cb_block_q8k *xk, int n16, float *y,
                            int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t nsb = w->n_in / CB_QK_K;
    const size_t pb = cb_pack_block_bytes(type), psz = (size_t)nsb * pb, xs = (size_t)nsb * sizeof(cb_block_q8k);
    const int nst = ka_sb(type);
    int tiles = (int)(KA_ROW_BLOCK_BYTES / (16 * xs));
    tiles = tiles < 1 ? 1 : tiles > KA_TILES ? KA_TILES : tiles;
    ka_stage st;
    _Alignas(64) float acc[KA_TILES][16][16];
    ka_config();
    for (int r0 = 0; r0 < n16; r0 += 16 * tiles) {
        const int nt = (n16 - r0) / 16 < tiles ? (n16 - r0) / 16 : tiles;
        for (int64_t o = o0; o < o1; o += CB_PANEL) {
            const uint8_t *panel = (const uint8_t *)w->packed + (size_t)(o / CB_PANEL) * psz;
            memset(acc, 0, sizeof(float) * 256 * (size_t)nt);
            for (int64_t s0 = 0; s0 < nsb; s0 += nst) {
                const int n = nsb - s0 < nst ? (int)(nsb - s0) : nst;
                ka_stage_panel(type, panel, s0, n, &st);
                const int step = type == CB_TYPE_Q6_K ? 1 : 2;
                for (int t = 0; t < nt; t += step) {
                    const cb_block_q8k *x0 = xk + (int64_t)(r0 + 16 * t) * nsb;
                    const int two = step == 2 && t + 1 < nt;
                    ka_tiles(type, &st, s0, n, x0, two ? x0 + 16 * nsb : NULL, xs, acc[t], two ? acc[t + 1] : NULL);
                }
            }
            const __mmask16 m = kp_mask(o1 - o);
            for (int t = 0; t < nt; t++)
                for (int r = 0; r < 16; r++)
                    _mm512_mask_storeu_ps(y + (int64_t)(r0 + 16 * t + r) * ldy + o, m, _mm512_load_ps(acc[t][r]));
        }
    }
    _tile_release();
}
#endif  /* AMX compiler support */

/* AMX state: -1 unknown, 0 off or unavailable, 1 on. */
static _Atomic int ka_state = -1;

/* CPUID.(7,0):EDX bits 24 (AMX-TILE) and 25 (AMX-INT8), XCR0 bits 17-18 (tile
 * state enabled by the OS), and Linux's per-process permission for the tile
 * data (arch_prctl ARCH_REQ_XCOMP_PERM). */
static int ka_detect(void) {
#if defined(KA_HAVE) && defined(__linux__)
    const char *env = getenv("COLIBRI_LAB_AMX");
    if (env && strcmp(env, "0") == 0) return 0;
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    if (!((d >> 24) & 1) || !((d >> 25) & 1)) return 0;
    __cpuid(1, a, b, c, d);
    if (!((c >> 27) & 1)) return 0;  /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return 0;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#else
    return 0;
#endif
}

int cb_amx_active(void) {
    int s = atomic_load(&ka_state);
    if (s < 0) {
        s = ka_detect();
        int expect = -1;
        if (!atomic_compare_exchange_strong(&ka_state, &expect, s)) s = expect;
    }
    return s;
}

int cb_amx_enable(int on) {
    if (!on) { atomic_store(&ka_state, 0); return 0; }
    atomic_store(&ka_state, -1);
    return cb_amx_active();
}

/* Rows in 16-row tiles through AMX where it is on, the rest (and every
 * batch under 16 rows) through the VNNI tiles: the same bits either way. */
KQ_ATTR static void kp_matmul(const int type, const cb_weight *w, const cb_block_q8k *xk, int n_rows, float *y,
                              int64_t ldy, int64_t o0, int64_t o1) {
    int n16 = 0;
#ifdef KA_HAVE
    if (n_rows >= 16 && cb_amx_active()) {
        n16 = n_rows - n_rows % 16;
        ka_rows(type, w, xk, n16, y, ldy, o0, o1);
    }
#endif
    if (n16 < n_rows)
        kp_rows(type, w, xk + (int64_t)n16 * (w->n_in / CB_QK_K), n_rows - n16, y + (int64_t)n16 * ldy, ldy, o0, o1);
}

/* cb_kq_quantize_q8k_scalar's bytes: max|x| over 256 values is exact in any
 * order, d and 1/d are the same IEEE operations, cvtps2dq rounds to nearest
 * even as cb_round_q8 does, and the clamp to +-127 is cb_round_q8's. */
KQ_ATTR static void kq_quantize_q8k(const float *x, cb_block_q8k *q, int64_t n) {
    const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
    for (int64_t b = 0; b < n / CB_QK_K; b++) {
        const float *xb = x + b * CB_QK_K;
        __m512 mx = _mm512_setzero_ps();
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++)  /* vmaxps returns its second operand for a NaN: skipped, as in scalar */
            mx = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xb + 16 * i)), mx);
        const float d = _mm512_reduce_max_ps(mx) / 127.0f;
        const __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 16 * i), id));
            v = _mm512_min_epi32(_mm512_max_epi32(v, nlim), lim);  /* NaN -> INT_MIN -> -127, as cb_round_q8 */
            _mm_storeu_si128((__m128i *)(q[b].qs + 16 * i), _mm512_cvtepi32_epi8(v));
            q[b].bs16[i] = (int16_t)_mm512_reduce_add_epi32(v);
        }
        for (int j = 0; j < 8; j++) q[b].bs32[j] = (int16_t)(q[b].bs16[2 * j] + q[b].bs16[2 * j + 1]);
        q[b].d = d;
        memset(q[b].pad, 0, sizeof q[b].pad);  /* defined bytes: blocks compare with memcmp */
    }
}

int cb_kq_quantize_q8k_avx512(const float *x, cb_block_q8k *q, int64_t n) {
    kq_quantize_q8k(x, q, n);
    return 1;
}

int cb_kq_matmul_rows_avx512(const cb_weight *w, const cb_block_q8 *xq, const cb_block_q8k *xk, int n_rows,
                             float *y, int64_t ldy, int64_t o0, int64_t o1) {
    switch (w->type) {
    case CB_TYPE_Q2_K: matmul_q23_K_avx512(0, w, xq, n_rows, y, ldy, o0, o1); return 1;
    case CB_TYPE_Q3_K: matmul_q23_K_avx512(1, w, xq, n_rows, y, ldy, o0, o1); return 1;
    case CB_TYPE_Q4_K:
        if (w->packed && n_rows <= 2 && cb_ymm_decode()) { ky_rows_q4(w, xk, n_rows, y, ldy, o0, o1); return 1; }
        /* fall through */
    case CB_TYPE_Q5_K:
    case CB_TYPE_Q6_K: if (!w->packed) return 0; kp_matmul(w->type, w, xk, n_rows, y, ldy, o0, o1); return 1;
    default: return 0;
    }
}

#else  /* not x86 */

int cb_kq_matmul_rows_avx512(const cb_weight *w, const cb_block_q8 *xq, const cb_block_q8k *xk, int n_rows,
                             float *y, int64_t ldy, int64_t o0, int64_t o1) { return 0; }
int cb_kq_quantize_q8k_avx512(const float *x, cb_block_q8k *q, int64_t n) { return 0; }
int cb_amx_active(void) { return 0; }
int cb_amx_enable(int on) { return 0; }

#endif
