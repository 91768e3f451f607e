/*
 * kquants_avx512.c — K-quant matmul with AVX-512 VNNI (vpdpbusd on 256-bit
 * vectors: unsigned weight bytes x signed activation bytes summed in fours
 * straight into int32, no int16 intermediate).  Body in kquants_simd.h.
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

int cb_kq_matmul_rows_avx512(const cb_weight *w, const cb_block_q8 *xq, int n_rows,
                             float *y, int64_t ldy, int64_t o0, int64_t o1) {
    switch (w->type) {
    case CB_TYPE_Q4_K: matmul_q45_K_avx512(0, w, xq, n_rows, y, ldy, o0, o1); return 1;
    case CB_TYPE_Q5_K: matmul_q45_K_avx512(1, w, xq, n_rows, y, ldy, o0, o1); return 1;
    case CB_TYPE_Q6_K: matmul_q6_K_avx512(w, xq, n_rows, y, ldy, o0, o1); return 1;
    default: return 0;
    }
}

#else  /* not x86 */

int cb_kq_matmul_rows_avx512(const cb_weight *w, const cb_block_q8 *xq, int n_rows,
                             float *y, int64_t ldy, int64_t o0, int64_t o1) { return 0; }

#endif
