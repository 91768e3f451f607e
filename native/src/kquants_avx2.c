/*
 * kquants_avx2.c — K-quant matmul with AVX2 (vpmaddubsw + vpmaddwd for the
 * integer block sums; unsigned weights <= 63 times int8 activations cannot
 * saturate the int16 pair sums: 2*63*127 < 32767).  Body in kquants_simd.h.
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

int cb_kq_matmul_rows_avx2(const cb_weight *w, const cb_block_q8 *xq, int n_rows,
                           float *y, int64_t ldy, int64_t o0, int64_t o1) {
    switch (w->type) {
    case CB_TYPE_Q2_K: matmul_q23_K_avx2(0, w, xq, n_rows, y, ldy, o0, o1); return 1;
    case CB_TYPE_Q3_K: matmul_q23_K_avx2(1, w, xq, n_rows, y, ldy, o0, o1); return 1;
    case CB_TYPE_Q4_K: matmul_q45_K_avx2(0, w, xq, n_rows, y, ldy, o0, o1); return 1;
    case CB_TYPE_Q5_K: matmul_q45_K_avx2(1, w, xq, n_rows, y, ldy, o0, o1); return 1;
    case CB_TYPE_Q6_K: matmul_q6_K_avx2(w, xq, n_rows, y, ldy, o0, o1); return 1;
    default: return 0;
    }
}

#else  /* not x86 */

int cb_kq_matmul_rows_avx2(const cb_weight *w, const cb_block_q8 *xq, int n_rows,
                           float *y, int64_t ldy, int64_t o0, int64_t o1) { return 0; }

#endif
