/*
 * kquants_simd.h — the K-quant matmul body shared by kquants_avx2.c and
 * kquants_avx512.c (included once by each with its own KQ_ATTR target
 * attribute, KQ_MULSUM and function-name suffix).  Not a public header.
 *
 * The row kernels of Q2_K and Q3_K (Q4_K / Q5_K / Q6_K run panel kernels;
 * their matrices without the panel layout, rows past CB_PACK_MAX_BLOCKS
 * blocks, go to the scalar path).  One weight row's block is unpacked to
 * 32 bytes per 32-weight block once and reused for a tile of up to 4
 * activation rows.  Per (row, output) the integer block sum is exact
 * (KQ_MULSUM: unsigned weight bytes x signed activation bytes -> 8 int32
 * partial sums, reduced in integers), then the same scalar float steps as
 * the scalar path, block by block — so results are bit-identical to
 * kquants_scalar.c whatever the tiling.
 *
 * Needs before inclusion: KQ_ATTR, KQ_MULSUM(w_u8, x_s8) -> __m256i of 8 int32,
 * KQ_FN(name) (suffixing the level).
 */
#ifndef KQ_ATTR
#error "include from kquants_avx2.c / kquants_avx512.c"
#endif

#define KQ_TILE 4

/* Software prefetch into L2 of part k of n of the `bytes` at p (64-byte
 * lines): a super-block's prefetches spread over its inner loop instead of
 * issued in one burst (up to 52 lines for a Q6_K panel super-block), which
 * held the loads behind it once the miss buffers were full: the panel
 * kernels of both levels call it once per inner step with p NULL when
 * there is nothing to prefetch (bench_kquants from DRAM, Intel Xeon, AVX2:
 * Q6_K +17%, Q5_K +24%, Q4_K +5%).  Whether a panel is prefetched at all
 * is cb_prefetch_panels' choice (kernels.c: not for most types on AMD). */
static inline __attribute__((always_inline)) void kq_prefetch_part(const uint8_t *p, size_t bytes, int k, int n) {
    if (!p) return;
    const size_t lines = (bytes + 63) / 64, l0 = lines * (size_t)k / (size_t)n, l1 = lines * (size_t)(k + 1) / (size_t)n;
    for (size_t l = l0; l < l1; l++) _mm_prefetch((const char *)p + 64 * l, _MM_HINT_T1);
}

KQ_ATTR static inline int KQ_FN(hsum4)(__m128i s) {
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

KQ_ATTR static inline int KQ_FN(hsum8)(__m256i v) {
    return KQ_FN(hsum4)(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

/* Q2_K (q3 = 0) and Q3_K (q3 = 1): weights as unsigned bytes (Q2_K: q in
 * 0..3; Q3_K: q + 4 * hbit in 0..7, the -4 folded in through the halves'
 * activation sums), then the scalar path's integer and float steps. */
KQ_ATTR static void KQ_FN(matmul_q23_K)(const int q3, const cb_weight *w, const cb_block_q8 *xq, int n_rows,
                                        float *y, int64_t ldy, int64_t o0, int64_t o1) {
    const int64_t nsb = w->n_in / CB_QK_K, nb = w->n_in / CB_QK;
    const size_t bsz = q3 ? sizeof(cb_block_q3_K) : sizeof(cb_block_q2_K);
    const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), ones = _mm256_set1_epi8(1);
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *wr = (const uint8_t *)w->data + (size_t)o * w->row_bytes;
        for (int r0 = 0; r0 < n_rows; r0 += KQ_TILE) {
            const int R = n_rows - r0 < KQ_TILE ? n_rows - r0 : KQ_TILE;
            float acc[KQ_TILE] = { 0.0f, 0.0f, 0.0f, 0.0f };
            for (int64_t s = 0; s < nsb; s++) {
                const uint8_t *blk = wr + (size_t)s * bsz;
                int sc3[16];
                if (q3) cb_kq3_scales(blk + 96, sc3);
                uint16_t dh, mh = 0;
                memcpy(&dh, blk + (q3 ? 108 : 80), 2);
                if (!q3) memcpy(&mh, blk + 82, 2);
                const float d = cb_f16_to_f32(dh), dmin = cb_f16_to_f32(mh);
                const uint8_t *qs = blk + (q3 ? 32 : 16);
                const __m256i hm = q3 ? _mm256_loadu_si256((const __m256i *)blk) : _mm256_setzero_si256();
                for (int h = 0; h < 2; h++) {
                    const __m256i qv = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
                    for (int k = 0; k < 4; k++) {
                        __m256i wq = _mm256_and_si256(_mm256_srli_epi16(qv, 2 * k), m2);
                        if (q3)
                            wq = _mm256_or_si256(wq, _mm256_slli_epi16(
                                     _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + k), one), 2));
                        const int i = 8 * h + 2 * k;
                        for (int r = 0; r < R; r++) {
                            const cb_block_q8 *xb = xq + (int64_t)(r0 + r) * nb + s * 8 + h * 4 + k;
                            const __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);
                            const __m256i p = KQ_MULSUM(wq, xv);
                            const __m256i ps = KQ_MULSUM(ones, xv);
                            const int xs0 = KQ_FN(hsum4)(_mm256_castsi256_si128(ps));
                            const int xs1 = KQ_FN(hsum4)(_mm256_extracti128_si256(ps, 1));
                            int i0 = KQ_FN(hsum4)(_mm256_castsi256_si128(p));
                            int i1 = KQ_FN(hsum4)(_mm256_extracti128_si256(p, 1));
                            if (q3) {
                                i0 -= 4 * xs0;
                                i1 -= 4 * xs1;
                                acc[r] = cb_kq_acc(acc[r], sc3[i] * i0 + sc3[i + 1] * i1, d, xb);
                            } else {
                                acc[r] = cb_kq_acc(acc[r], (blk[i] & 0xF) * i0 + (blk[i + 1] & 0xF) * i1, d, xb);
                                const float dm = dmin * xb->d;
                                acc[r] -= (float)((blk[i] >> 4) * xs0 + (blk[i + 1] >> 4) * xs1) * dm;
                            }
                        }
                    }
                }
            }
            for (int r = 0; r < R; r++) y[(int64_t)(r0 + r) * ldy + o] = acc[r];
        }
    }
}
