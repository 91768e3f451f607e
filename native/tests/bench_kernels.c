/*
 * bench_kernels.c — micro-benchmark of the matmul kernels on SmolLM2-135M
 * shapes (not a test; build by hand):
 *
 *   cc -std=c11 -D_GNU_SOURCE -O2 -Inative/include -Inative/src \
 *      native/tests/bench_kernels.c native/src/kernels*.c native/src/pool.c \
 *      -lm -lpthread -o /tmp/bench_kernels && /tmp/bench_kernels [simd]
 *
 * Reports: memory read bandwidth (for scale), decode matvec GB/s of weight
 * streaming per shape (hot = the matrix stays in cache; model = cycling
 * through a model-sized set so weights come from L3/DRAM like in decode),
 * a whole-token emulation of SmolLM2-135M Q4_1 (30 layers of 7 matmuls + the
 * Q8_0 LM head), batched decode (all matmuls of a token for B = 1..16 rows),
 * and prefill GFLOP/s at 64 and 512 rows.  At the AVX-512 level the weights
 * are packed into the panel layout as the engine does at load;
 * CB_BENCH_UNPACKED=1 leaves them in the file layout (the AVX-512 table then
 * hands quantized matmuls to the AVX2 kernel), for an A/B of the layout.
 */
#include "colibri.h"
#include "kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (uint32_t)rs; }

/* Random but valid blocks: small positive f16 scales, random quants. */
static void fill_weights(int type, uint8_t *p, size_t bytes, int64_t n_in) {
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)rnd();
    const size_t bb = cb_type_block_bytes(type);
    const size_t nblk = bytes / bb;
    for (size_t b = 0; b < nblk; b++) {
        uint16_t d = cb_f32_to_f16(0.01f + (rnd() % 100) * 1e-4f);
        memcpy(p + b * bb, &d, 2);
        if (type == CB_TYPE_Q4_1) { uint16_t m = cb_f32_to_f16(-0.05f); memcpy(p + b * bb + 2, &m, 2); }
    }
    (void)n_in;
}

typedef struct { int64_t n_out, n_in; int type; const char *name; } shape;

static const shape layer[] = {
    { 576, 576, CB_TYPE_Q4_1, "attn_q 576x576" },
    { 192, 576, CB_TYPE_Q4_1, "attn_k 576->192" },
    { 192, 576, CB_TYPE_Q4_1, "attn_v 576->192" },
    { 576, 576, CB_TYPE_Q4_1, "attn_o 576x576" },
    { 1536, 576, CB_TYPE_Q4_1, "ffn_gate 576->1536" },
    { 1536, 576, CB_TYPE_Q4_1, "ffn_up 576->1536" },
    { 576, 1536, CB_TYPE_Q4_1, "ffn_down 1536->576" },
};
#define N_LAYER_MM 7
#define N_LAYERS 30

/* As the engine does at model load: AVX-512 gets the panel layout. */
static cb_weight make_weight(const shape *s, int simd) {
    cb_weight w;
    w.type = s->type; w.n_in = s->n_in; w.n_out = s->n_out;
    w.row_bytes = cb_type_size(s->type, s->n_in);
    uint8_t *p = aligned_alloc(64, (w.row_bytes * (size_t)w.n_out + 63) & ~(size_t)63);
    fill_weights(s->type, p, w.row_bytes * (size_t)w.n_out, s->n_in);
    w.data = p;
    w.packed = NULL;
    if (simd == CB_SIMD_AVX512 && !getenv("CB_BENCH_UNPACKED")) cb_pack_alloc(&w);
    return w;
}

static void bench_memory(void) {
    const size_t n = (size_t)512 << 20;  /* 512 MiB: larger than any cache here */
    uint64_t *a = aligned_alloc(64, n), *b = aligned_alloc(64, n);
    memset(a, 1, n); memset(b, 2, n);
    double best_r = 1e9, best_c = 1e9;
    volatile uint64_t sink = 0;
    for (int it = 0; it < 3; it++) {
        double t = now();
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i < n / 8; i += 4) { s0 += a[i]; s1 += a[i + 1]; s2 += a[i + 2]; s3 += a[i + 3]; }
        sink += s0 + s1 + s2 + s3;
        t = now() - t; if (t < best_r) best_r = t;
        t = now();
        memcpy(b, a, n);
        t = now() - t; if (t < best_c) best_c = t;
    }
    printf("memory: read %.1f GB/s, memcpy %.1f GB/s (read+write counted once each: %.1f GB/s)\n",
           n / best_r * 1e-9, n / best_c * 1e-9, 2 * n / best_c * 1e-9);
    free(a); free(b);
}

int main(int argc, char **argv) {
    int simd = cb_simd_detect();
    if (argc > 1) {
        for (int s = 0; s <= 2; s++) if (strcmp(argv[1], cb_simd_name(s)) == 0) simd = s;
    }
    const cb_kernels *k = cb_kernels_get(simd);
    if (!k) { fprintf(stderr, "simd level not available\n"); return 1; }
    printf("simd %s\n", cb_simd_name(simd));
    bench_memory();

    const shape head = { 49152, 576, CB_TYPE_Q8_0, "lm_head Q8_0 576->49152" };
    /* the model: 30 layers of distinct weights + the head (~96 MB) */
    cb_weight W[N_LAYERS][N_LAYER_MM];
    size_t model_bytes = 0;
    for (int l = 0; l < N_LAYERS; l++)
        for (int m = 0; m < N_LAYER_MM; m++) { W[l][m] = make_weight(&layer[m], simd); model_bytes += W[l][m].row_bytes * W[l][m].n_out; }
    cb_weight H = make_weight(&head, simd);
    model_bytes += H.row_bytes * H.n_out;

    const int max_rows = 512;
    float *x = aligned_alloc(64, sizeof(float) * 1536 * max_rows);
    float *y = aligned_alloc(64, sizeof(float) * 49152 * 16 + sizeof(float) * 1536 * max_rows);
    for (int i = 0; i < 1536 * max_rows; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
    void *scratch = aligned_alloc(64, cb_matmul_scratch(1536, max_rows));

    for (int nth = 1; nth <= 2; nth++) {
        cb_pool *pool = cb_pool_new(nth);
        printf("\n== %d thread(s)\n", nth);
        printf("decode matvec (n_rows=1), GB/s of weights:      hot     model-cycling\n");
        for (int m = 0; m <= N_LAYER_MM; m++) {
            const shape *s = m < N_LAYER_MM ? &layer[m] : &head;
            if (m == 2 || m == 3 || m == 5) continue;  /* same shapes as another row */
            const size_t bytes = cb_type_size(s->type, s->n_in) * (size_t)s->n_out;
            /* hot: one matrix over and over */
            const cb_weight *w0 = m < N_LAYER_MM ? &W[0][m] : &H;
            int reps = (int)(2e8 / bytes) + 1;
            for (int i = 0; i < 3; i++) cb_matmul(pool, k, w0, x, 1, y, scratch);
            double t = now();
            for (int i = 0; i < reps; i++) cb_matmul(pool, k, w0, x, 1, y, scratch);
            const double hot = bytes * (double)reps / (now() - t) * 1e-9;
            /* cycling through the 30 layers' copies (head: only one copy) */
            double cyc = hot;
            if (m < N_LAYER_MM) {
                int creps = reps / N_LAYERS + 1;
                t = now();
                for (int i = 0; i < creps; i++)
                    for (int l = 0; l < N_LAYERS; l++) cb_matmul(pool, k, &W[l][m], x, 1, y, scratch);
                cyc = bytes * (double)creps * N_LAYERS / (now() - t) * 1e-9;
            }
            printf("  %-26s %8.1f  %8.1f\n", s->name, hot, cyc);
        }
        /* whole-token emulation: all 210 layer matmuls + head, one row */
        double best = 1e9;
        for (int it = 0; it < 20; it++) {
            double t = now();
            for (int l = 0; l < N_LAYERS; l++)
                for (int m = 0; m < N_LAYER_MM; m++) cb_matmul(pool, k, &W[l][m], x, 1, y, scratch);
            cb_matmul(pool, k, &H, x, 1, y, scratch);
            t = now() - t;
            if (t < best) best = t;
        }
        printf("decode token (211 matmuls, %.1f MB): %.2f ms = %.0f tok/s matmul-only, %.1f GB/s\n",
               model_bytes * 1e-6, best * 1e3, 1.0 / best, model_bytes / best * 1e-9);
        /* batched decode: every matmul of a token (head included) for B rows */
        printf("batched decode, all 211 matmuls for B rows:\n");
        double t1 = 0;
        for (int B = 1; B <= 16; B *= 2) {
            double bt = 1e9;
            for (int it = 0; it < 10; it++) {
                double t = now();
                for (int l = 0; l < N_LAYERS; l++)
                    for (int m = 0; m < N_LAYER_MM; m++) cb_matmul(pool, k, &W[l][m], x, B, y, scratch);
                cb_matmul(pool, k, &H, x, B, y, scratch);
                t = now() - t;
                if (t < bt) bt = t;
            }
            if (B == 1) t1 = bt;
            printf("  B=%2d: %.2f ms = %.0f tok/s aggregate, %.2fx one row's tok/s\n", B, bt * 1e3, B / bt, B * t1 / bt);
        }
        /* prefill: layers only (the head runs on the last row) */
        for (int rows = 64; rows <= 512; rows *= 8) {
            double flops = 0;
            for (int m = 0; m < N_LAYER_MM; m++) flops += 2.0 * layer[m].n_in * layer[m].n_out * rows * N_LAYERS;
            flops += 2.0 * 576 * 49152;
            double bt = 1e9;
            for (int it = 0; it < 2; it++) {
                double t = now();
                for (int l = 0; l < N_LAYERS; l++)
                    for (int m = 0; m < N_LAYER_MM; m++) cb_matmul(pool, k, &W[l][m], x, rows, y, scratch);
                cb_matmul(pool, k, &H, x, 1, y, scratch);
                t = now() - t;
                if (t < bt) bt = t;
            }
            printf("prefill %3d rows: %.1f ms, %.1f GFLOP/s, %.0f tok/s matmul-only\n",
                   rows, bt * 1e3, flops / bt * 1e-9, rows / bt);
        }
        cb_pool_free(pool);
    }
    return 0;
}
