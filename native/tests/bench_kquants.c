/*
 * bench_kquants.c — decode-shaped micro-benchmark of the K-quant and Q5_0
 * matmul kernels against the machine's read bandwidth (not a test; build by
 * hand):
 *
 *   cc -std=c11 -D_GNU_SOURCE -O2 -Inative/include -Inative/src \
 *      native/tests/bench_kquants.c native/src/kernels*.c native/src/kquants*.c \
 *      native/src/pool.c -lm -lpthread -o /tmp/bench_kquants && /tmp/bench_kquants [rows [n_out [MB [n_in]]]]
 *
 * For each type, a set of matrices of the Qwen2.5-1.5B FFN shape (8960 x
 * 1536) adding up to ~512 MB is cycled through, so the weights stream from
 * DRAM as in decode; reported: GB/s of weight bytes per second of the
 * thread's CPU time and of wall time, next to a plain AVX-512 / scalar read
 * loop over the same bytes timed the same way.  The ratio kernel / read loop
 * is the fraction of the memory-bound limit the kernel reaches on this
 * machine, and CPU time keeps it meaningful when other processes share the
 * cores (wall time does not).  A small n_out and MB (e.g. 1 896 1) keep the
 * weights in cache: the kernel's compute throughput alone.  Env:
 * CB_BENCH_SIMD=0/1/2 forces a level, CB_BENCH_UNPACKED=1 the file layout
 * (row kernels), CB_BENCH_THREADS=n runs cb_matmul on a pool of n threads
 * (then the wall GB/s is the figure), CB_BENCH_PREQ=1 quantizes the activations once outside the
 * timing and calls the kernel directly (the kernel without cb_matmul's
 * quantization).  COLIBRI_LAB_PREFETCH=0 / 1 forces the panels' software
 * prefetch off / on (default: the engine's choice by CPU, cb_prefetch_panels),
 * CB_BENCH_YMM=0 / 1 runs one- and two-row Q4_K at the AVX-512 level on
 * the 512-bit / 256-bit kernel (default: the engine's choice by CPU,
 * cb_ymm_decode), CB_BENCH_TYPE=n only type n (CB_TYPE_*, e.g. 12 Q4_K),
 * CB_BENCH_PASSES=n passes over the matrices per timed rep (in cache, e.g.
 * `8 448 0`, one pass is tens of microseconds: too short to time alone).
 * GOP/s counts a multiply and an add per weight and row.
 * At AVX-512 each run is followed by a vpdpbusd peak loop (peak_gops):
 * kernel/peak is the number to compare across builds and windows.
 */
#include "colibri.h"
#include "kernels.h"
#include "kquants.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static double clk(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)rs; }

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static float read_loop(const uint8_t *p, size_t n) {
    __m512i acc = _mm512_setzero_si512();
    for (size_t i = 0; i + 256 <= n; i += 256) {
        acc = _mm512_xor_si512(acc, _mm512_load_si512((const void *)(p + i)));
        acc = _mm512_xor_si512(acc, _mm512_load_si512((const void *)(p + i + 64)));
        acc = _mm512_xor_si512(acc, _mm512_load_si512((const void *)(p + i + 128)));
        acc = _mm512_xor_si512(acc, _mm512_load_si512((const void *)(p + i + 192)));
    }
    return (float)_mm512_reduce_add_epi32(acc);
}
#endif

/* The machine's int8 compute peak right now: 8 independent vpdpbusd zmm
 * chains with register operands (1 vpdpbusd = 64 multiply-adds = 128 OP);
 * returns GOP/s of this thread's CPU time.  Timed beside each kernel run,
 * kernel / peak is the fraction of the peak the kernel reaches, which stays
 * comparable when co-tenants or the clock move both (the absolute GOP/s do
 * not, on a shared machine). */
#if defined(__x86_64__)
__attribute__((target("avx512f,avx512vnni"))) static double peak_gops(long iters) {
    __m512i a0 = _mm512_set1_epi32(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    const __m512i w = _mm512_set1_epi32(0x01010101), x = _mm512_set1_epi32(0x01FF01FF);
    double c0 = clk(CLOCK_THREAD_CPUTIME_ID);
    for (long i = 0; i < iters; i++) {
        __asm__ volatile("vpdpbusd %2, %1, %0" : "+v"(a0) : "v"(w), "v"(x));
        __asm__ volatile("vpdpbusd %2, %1, %0" : "+v"(a1) : "v"(w), "v"(x));
        __asm__ volatile("vpdpbusd %2, %1, %0" : "+v"(a2) : "v"(w), "v"(x));
        __asm__ volatile("vpdpbusd %2, %1, %0" : "+v"(a3) : "v"(w), "v"(x));
        __asm__ volatile("vpdpbusd %2, %1, %0" : "+v"(a4) : "v"(w), "v"(x));
        __asm__ volatile("vpdpbusd %2, %1, %0" : "+v"(a5) : "v"(w), "v"(x));
        __asm__ volatile("vpdpbusd %2, %1, %0" : "+v"(a6) : "v"(w), "v"(x));
        __asm__ volatile("vpdpbusd %2, %1, %0" : "+v"(a7) : "v"(w), "v"(x));
    }
    double c1 = clk(CLOCK_THREAD_CPUTIME_ID);
    volatile int keep = _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(
                            _mm512_add_epi32(a2, a3), _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)))));
    (void)keep;
    return (double)iters * 8 * 128 / 1e9 / (c1 - c0);
}
#else
static double peak_gops(long iters) { (void)iters; return 0.0; }
#endif

int main(int argc, char **argv) {
    const int rows = argc > 1 ? atoi(argv[1]) : 1;
    const int simd = getenv("CB_BENCH_SIMD") ? atoi(getenv("CB_BENCH_SIMD")) : cb_simd_detect();  /* 0 scalar, 1 avx2, 2 avx512 */
    const cb_kernels *k = cb_kernels_get(simd);
    const int64_t n_out = argc > 2 ? atoi(argv[2]) : 8960, n_in = argc > 4 ? atoi(argv[4]) : 1536;
    const size_t total = (size_t)(argc > 3 ? atoi(argv[3]) : 512) << 20;
    const int types[] = { CB_TYPE_Q4_K, CB_TYPE_Q6_K, CB_TYPE_Q5_0, CB_TYPE_Q8_0, CB_TYPE_Q5_K, CB_TYPE_Q4_1, CB_TYPE_Q4_0 };
    float *x = malloc(sizeof(float) * (size_t)n_in * rows);
    float *y = malloc(sizeof(float) * (size_t)n_out * rows);
    for (int64_t i = 0; i < n_in * rows; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) / 500.0f;
    void *scratch = aligned_alloc(64, cb_matmul_scratch(n_in, rows));
    const int preq = getenv("CB_BENCH_PREQ") && atoi(getenv("CB_BENCH_PREQ"));
    const int nrep = getenv("CB_BENCH_REPS") ? atoi(getenv("CB_BENCH_REPS")) : 3;  /* the first warms up */
    /* passes over the matrices per timed rep: in cache one pass of a small matrix is tens of
     * microseconds, too short to time (CB_BENCH_PASSES=200 with e.g. `8 448 0`) */
    const int passes = getenv("CB_BENCH_PASSES") ? atoi(getenv("CB_BENCH_PASSES")) : 1;
    /* CB_BENCH_THREADS=n: cb_matmul over a pool of n threads (compare the wall GB/s then) */
    const int nthr = getenv("CB_BENCH_THREADS") ? atoi(getenv("CB_BENCH_THREADS")) : 1;
    cb_pool *pool = nthr > 1 ? cb_pool_new(nthr) : NULL;
    if (getenv("CB_BENCH_YMM")) cb_ymm_decode_set(atoi(getenv("CB_BENCH_YMM")));
    const int only = getenv("CB_BENCH_TYPE") ? atoi(getenv("CB_BENCH_TYPE")) : -1;
    printf("simd %s, rows %d, shape %lld x %lld\n", cb_simd_name(simd), rows, (long long)n_out, (long long)n_in);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int type = types[ti];
        if (only >= 0 && type != only) continue;
        if (n_in % cb_type_block(type) != 0) {  /* e.g. 640 inputs: no 256-wide K-quant super-blocks */
            printf("%-5s skipped: %lld inputs are not whole blocks of this type\n", cb_type_name(type), (long long)n_in);
            continue;
        }
        const size_t mbytes = cb_type_size(type, n_in) * (size_t)n_out;
        const int n_mat = (int)(total / mbytes) + 1;
        cb_weight *w = calloc((size_t)n_mat, sizeof *w);
        uint8_t *raw = cb_big_alloc(mbytes);
        for (size_t i = 0; i < mbytes; i++) raw[i] = (uint8_t)rnd();
        /* finite scales: every f16 field a small positive value */
        const size_t bb = cb_type_block_bytes(type);
        for (size_t b = 0; b < mbytes / bb; b++) {
            uint8_t *blk = raw + b * bb;
            const uint16_t h = 0x2000 + (rnd() & 0x3FF);
            switch (type) {
            case CB_TYPE_Q6_K: memcpy(blk + 208, &h, 2); break;
            case CB_TYPE_Q4_K: case CB_TYPE_Q5_K: case CB_TYPE_Q4_1: memcpy(blk, &h, 2); memcpy(blk + 2, &h, 2); break;
            default: memcpy(blk, &h, 2); break;
            }
        }
        for (int i = 0; i < n_mat; i++) {
            w[i].type = type; w[i].n_in = n_in; w[i].n_out = n_out; w[i].data = raw;
            w[i].row_bytes = cb_type_size(type, n_in);
            if (cb_pack_wanted(simd, type) && !(getenv("CB_BENCH_UNPACKED") && atoi(getenv("CB_BENCH_UNPACKED"))))
                cb_pack_alloc(&w[i]);
        }
        uint8_t *reads = w[0].packed ? NULL : cb_big_alloc(mbytes * (size_t)n_mat);
        const int fmt = cb_type_act(type);
        const cb_block_q8 *xq = scratch;
        const cb_block_q8k *xk = (const cb_block_q8k *)((const char *)scratch + cb_act_q8k_offset(n_in, rows, fmt));
        if (preq) cb_quantize_rows(k, x, scratch, n_in, rows, 0, rows, fmt);
        for (int rep = 0; rep < nrep; rep++) {
            double c0 = clk(CLOCK_THREAD_CPUTIME_ID), t0 = clk(CLOCK_MONOTONIC);
            for (int pass = 0; pass < passes; pass++) {
                if (preq)  /* the kernel alone: activations quantized once, outside the timing */
                    for (int i = 0; i < n_mat; i++) {
                        if (cb_kq_is_kquant(type)) cb_kq_matmul_rows(simd, &w[i], xq, xk, rows, y, n_out, 0, n_out);
                        else k->matmul_rows(&w[i], xq, x, rows, y, n_out, 0, n_out);
                    }
                else
                    for (int i = 0; i < n_mat; i++) cb_matmul(pool, k, &w[i], x, rows, y, scratch);
            }
            double c1 = clk(CLOCK_THREAD_CPUTIME_ID), t1 = clk(CLOCK_MONOTONIC);
            float sink = 0.0f;
#if defined(__x86_64__)
            if (simd == CB_SIMD_AVX512)
                for (int pass = 0; pass < passes; pass++)
                    for (int i = 0; i < n_mat; i++)
                        sink += read_loop(w[i].packed ? (const uint8_t *)w[i].packed : reads + (size_t)i * mbytes, mbytes);
#endif
            double c2 = clk(CLOCK_THREAD_CPUTIME_ID), t2 = clk(CLOCK_MONOTONIC);
            const double gb = (double)mbytes * n_mat * passes / 1e9;
            const double gop = 2.0 * (double)n_out * (double)n_in * rows * n_mat * passes / 1e9;  /* multiply + add */
            /* 1M iterations, ~2 ms: after a 45 ms peak loop (20M) the next in-cache rep read 2-3x slower on a
             * Zen 4 VM (the weights leave the caches meanwhile, or the vector units slow down), from DRAM the same */
            const double pk = simd == CB_SIMD_AVX512 ? peak_gops(1000000) : 0.0;
            printf("%-5s kernel %6.1f GB/s cpu %6.1f GB/s wall %7.1f GOP/s cpu | read loop %6.1f cpu %6.1f wall | kernel/read %.2f (cpu) | peak %5.0f GOP/s, kernel/peak %.3f%s\n",
                   cb_type_name(type), gb / (c1 - c0), gb / (t1 - t0), gop / (c1 - c0), gb / (c2 - c1), gb / (t2 - t1),
                   (c2 - c1) / (c1 - c0), pk, pk > 0 ? gop / (c1 - c0) / pk : 0.0, sink == 12345.0f ? " " : "");
            volatile float keep = sink; (void)keep;
        }
        for (int i = 0; i < n_mat; i++) free((void *)w[i].packed);
        free(reads);
        free(w);
        free(raw);
    }
    if (pool) cb_pool_free(pool);
    free(x); free(y); free(scratch);
    return 0;
}
