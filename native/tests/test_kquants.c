/*
 * test_kquants.c — K-quant (Q4_K, Q5_K, Q6_K) decoding and matmul kernels.
 *
 *  - decoding: blocks packed here from known (scale, min, quant) values by
 *    the packing rules written out independently of kquants_scalar.c decode
 *    to exactly d*sc*q - dmin*m (Q4_K, Q5_K) and d*sc*(q-32) (Q6_K);
 *  - Q8K activations: every level's bytes equal the scalar path's;
 *  - matmul: every level against a double-precision dot of the decoded
 *    weights with the decoded int8 activations (the only rounding left is
 *    float accumulation), levels bit-identical to each other, rows
 *    bit-identical alone and in a batch, and blocks at the int32 bounds.
 */
#include "testutil.h"

#include "colibri.h"
#include "kernels.h"
#include "kquants.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint32_t rng_state = 12345u;
static uint32_t rnd(void) { rng_state = rng_state * 1664525u + 1013904223u; return rng_state >> 8; }
static float rndf(void) { return (float)rnd() / (float)(1u << 24) * 2.0f - 1.0f; }

/* Pack 6-bit (sc, m) pairs the way ggml's quantize_row_q4_K does. */
static void pack_scales(const int sc[8], const int m[8], uint8_t out[12]) {
    for (int j = 0; j < 4; j++) {
        out[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        out[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
        out[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
    }
}

static void test_decode_q45(int q5) {
    uint8_t blk[176];
    memset(blk, 0, sizeof blk);
    const uint16_t d = cb_f32_to_f16(0.25f), dmin = cb_f32_to_f16(0.125f);
    memcpy(blk, &d, 2);
    memcpy(blk + 2, &dmin, 2);
    int sc[8], m[8], q[8][32];
    for (int j = 0; j < 8; j++) { sc[j] = (j * 9 + 5) % 64; m[j] = (j * 17 + 60) % 64; }
    pack_scales(sc, m, blk + 4);
    uint8_t *qh = blk + 16, *qs = q5 ? blk + 48 : blk + 16;
    for (int j = 0; j < 8; j++)
        for (int l = 0; l < 32; l++) {
            q[j][l] = (int)(rnd() % (q5 ? 32 : 16));
            qs[32 * (j / 2) + l] |= (uint8_t)((q[j][l] & 0xF) << (4 * (j & 1)));
            if (q5) qh[l] |= (uint8_t)(((q[j][l] >> 4) & 1) << j);
        }
    float out[256];
    cb_kq_row_f32(q5 ? CB_TYPE_Q5_K : CB_TYPE_Q4_K, blk, 256, out);
    int bad = 0;
    for (int j = 0; j < 8; j++)
        for (int l = 0; l < 32; l++) {
            const float want = 0.25f * (float)sc[j] * (float)q[j][l] - 0.125f * (float)m[j];
            bad += out[32 * j + l] != want;
        }
    CHECK(bad == 0);
}

static void test_decode_q6(void) {
    cb_block_q6_K blk;
    memset(&blk, 0, sizeof blk);
    blk.d = cb_f32_to_f16(0.5f);
    int q[256];
    for (int i = 0; i < 16; i++) blk.scales[i] = (int8_t)(i * 13 - 100);
    for (int i = 0; i < 256; i++) {
        q[i] = (int)(rnd() % 64);
        const int h = i / 128, k = (i % 128) / 32, l = i % 32;
        blk.ql[64 * h + (k & 1) * 32 + l] |= (uint8_t)((q[i] & 0xF) << (k & 2 ? 4 : 0));
        blk.qh[32 * h + l] |= (uint8_t)(((q[i] >> 4) & 3) << (2 * k));
    }
    float out[256];
    cb_kq_row_f32(CB_TYPE_Q6_K, &blk, 256, out);
    int bad = 0;
    for (int i = 0; i < 256; i++) bad += out[i] != 0.5f * (float)blk.scales[i / 16] * (float)(q[i] - 32);
    CHECK(bad == 0);
}

/* Random blocks with finite, small super-block scales. */
static void random_row(int type, uint8_t *p, int n_in) {
    const size_t bb = cb_kq_block_bytes(type);
    for (int b = 0; b < n_in / 256; b++) {
        uint8_t *blk = p + (size_t)b * bb;
        for (size_t i = 0; i < bb; i++) blk[i] = (uint8_t)rnd();
        const uint16_t d = cb_f32_to_f16(0.01f + 0.01f * (float)(rnd() % 100) / 100.0f);
        const uint16_t dm = cb_f32_to_f16(0.005f);
        if (type == CB_TYPE_Q6_K) memcpy(blk + 208, &d, 2);
        else { memcpy(blk, &d, 2); memcpy(blk + 2, &dm, 2); }
    }
}

/* Q8K activations: every level writes the scalar path's bytes, for values
 * that round half-way, a zero block, huge and tiny values; the sums match
 * the quants and the quants the scale. */
static void test_quantize_q8k(void) {
    enum { N = 4 * 256 };
    float x[N];
    for (int i = 0; i < N; i++) x[i] = rndf() * 3.0f;
    for (int i = 256; i < 512; i++) x[i] = 0.0f;                    /* zero block */
    for (int i = 512; i < 768; i++) x[i] = (float)((int)(rnd() % 255) - 127) * 0.5f;  /* many .5 ties */
    x[512] = 63.5f;
    for (int i = 768; i < N; i++) x[i] = rndf() * 1e-30f;
    cb_block_q8k ref[N / 256], got[N / 256];
    cb_kq_quantize_q8k_scalar(x, ref, N);
    for (int b = 0; b < N / 256; b++) {
        int bad = 0;
        for (int i = 0; i < 16; i++) {
            int s16 = 0;
            for (int l = 0; l < 16; l++) s16 += ref[b].qs[16 * i + l];
            bad += s16 != ref[b].bs16[i];
        }
        for (int j = 0; j < 8; j++) bad += ref[b].bs32[j] != ref[b].bs16[2 * j] + ref[b].bs16[2 * j + 1];
        float amax = 0.0f;
        for (int i = 0; i < 256; i++) amax = fabsf(x[256 * b + i]) > amax ? fabsf(x[256 * b + i]) : amax;
        bad += ref[b].d != amax / 127.0f;
        for (int i = 0; i < 256; i++)  /* within half a step of the value */
            bad += fabs((double)ref[b].d * ref[b].qs[i] - x[256 * b + i]) > 0.5 * ref[b].d * (1 + 1e-6);
        CHECK_MSG(bad == 0, "q8k block %d: %d bad fields", b, bad);
    }
    CHECK(ref[1].d == 0.0f && ref[1].bs32[0] == 0);
    for (int lvl = 1; lvl <= 2; lvl++) {
        if (cb_simd_detect() < lvl) continue;
        memset(got, 0x5A, sizeof got);
        cb_kq_quantize_q8k(lvl, x, got, N);
        CHECK_MSG(memcmp(got, ref, sizeof ref) == 0, "q8k level %d differs from scalar", lvl);
    }
}

static void test_matmul(int type) {
    enum { N_OUT = 19, N_IN = 768, N_ROWS = 15 };  /* 15 rows: tiles of 8, 4 and a tail of 3 (AVX2), 8 + 7 (AVX-512) */
    const size_t rb = cb_kq_block_bytes(type) * (N_IN / 256);
    uint8_t *w = malloc(rb * N_OUT);
    float *x = malloc(sizeof(float) * N_ROWS * N_IN), *wf = malloc(sizeof(float) * N_IN);
    cb_block_q8k *xk = malloc(sizeof(cb_block_q8k) * N_ROWS * (N_IN / 256));
    float y[3][N_ROWS * N_OUT], y1[N_OUT];
    for (int o = 0; o < N_OUT; o++) random_row(type, w + (size_t)o * rb, N_IN);
    for (int i = 0; i < N_ROWS * N_IN; i++) x[i] = rndf();
    for (int r = 0; r < N_ROWS; r++) cb_kq_quantize_q8k_scalar(x + r * N_IN, xk + r * (N_IN / 256), N_IN);
    for (int lvl = 0; lvl <= 2; lvl++) {
        if (lvl > 0 && cb_simd_detect() < lvl) { memcpy(y[lvl], y[0], sizeof y[0]); continue; }
        cb_weight wt = { type, N_IN, N_OUT, w, rb, NULL };
        void *pk = cb_pack_wanted(lvl, type) ? cb_pack_alloc(&wt) : NULL;
        CHECK(lvl == 0 || pk != NULL);  /* the SIMD levels read panels */
        cb_kq_matmul_rows(lvl, &wt, NULL, xk, N_ROWS, y[lvl], N_OUT, 0, N_OUT);
        CHECK_MSG(memcmp(y[lvl], y[0], sizeof y[0]) == 0, "type %d level %d differs from scalar", type, lvl);
        /* one row alone, and a sub-range of outputs (a panel's tail), give the same bits */
        for (int r = 0; r < N_ROWS; r++) {
            cb_kq_matmul_rows(lvl, &wt, NULL, xk + r * (N_IN / 256), 1, y1, N_OUT, 0, N_OUT);
            CHECK(memcmp(y1, y[lvl] + r * N_OUT, sizeof y1) == 0);
        }
        cb_kq_matmul_rows(lvl, &wt, NULL, xk, N_ROWS, y1, 0, 16, 19);  /* ldy 0: all rows write y1[16..19) */
        CHECK(memcmp(y1 + 16, y[lvl] + (N_ROWS - 1) * N_OUT + 16, 3 * sizeof(float)) == 0);
        free(pk);
    }
    double worst = 0;
    for (int o = 0; o < N_OUT; o++) {
        cb_kq_row_f32(type, w + (size_t)o * rb, N_IN, wf);
        for (int r = 0; r < N_ROWS; r++) {
            double ref = 0, mag = 0;
            for (int i = 0; i < N_IN; i++) {
                const cb_block_q8k *b = &xk[r * (N_IN / 256) + i / 256];
                const double xv = (double)b->d * b->qs[i % 256];
                ref += (double)wf[i] * xv;
                mag += fabs((double)wf[i] * xv);
            }
            const double e = fabs(ref - y[0][r * N_OUT + o]) / (mag + 1e-30);
            if (e > worst) worst = e;
        }
    }
    CHECK_MSG(worst < 1e-5, "type %d: worst relative error %g", type, worst);
    free(w); free(x); free(wf); free(xk);
}

/* Extreme blocks: every quant and scale at its maximum against activations
 * of +-127 (the int32 bounds of kquants.h), levels bit-identical and equal
 * to the exact product to float rounding. */
static void test_matmul_extremes(int type) {
    enum { N_OUT = 16, N_IN = 2048, N_ROWS = 19 };  /* 19: one AMX tile of 16 rows and a VNNI tail */
    const size_t bb = cb_kq_block_bytes(type), rb = bb * (N_IN / 256);
    uint8_t *w = malloc(rb * N_OUT);
    memset(w, 0xFF, rb * N_OUT);
    const uint16_t one = cb_f32_to_f16(1.0f);
    for (int i = 0; i < N_OUT * N_IN / 256; i++) {
        uint8_t *blk = w + (size_t)i * bb;
        if (type == CB_TYPE_Q6_K) {  /* scales -128 or 127, quants 0 or 63 */
            memcpy(blk + 208, &one, 2);
            for (int k = 0; k < 16; k++) blk[192 + k] = i % 2 ? 0x80 : 0x7F;
            if (i % 3 == 0) memset(blk, 0, 192);
        } else {
            memcpy(blk, &one, 2);
            memcpy(blk + 2, &one, 2);
        }
    }
    float *x = malloc(sizeof(float) * N_ROWS * N_IN), *wf = malloc(sizeof(float) * N_IN);
    for (int i = 0; i < N_ROWS * N_IN; i++) {  /* rows 3k: +127, 3k + 1: -127, 3k + 2: alternating per 16 */
        const int r = i / N_IN;
        x[i] = r % 3 == 0 ? 127.0f : r % 3 == 1 ? -127.0f : (i / 16) % 2 ? 127.0f : -127.0f;
    }
    cb_block_q8k *xk = malloc(sizeof(cb_block_q8k) * N_ROWS * (N_IN / 256));
    for (int r = 0; r < N_ROWS; r++) cb_kq_quantize_q8k_scalar(x + r * N_IN, xk + r * (N_IN / 256), N_IN);
    float y[3][N_ROWS * N_OUT];
    for (int lvl = 0; lvl <= 2; lvl++) {
        if (lvl > 0 && cb_simd_detect() < lvl) { memcpy(y[lvl], y[0], sizeof y[0]); continue; }
        cb_weight wt = { type, N_IN, N_OUT, w, rb, NULL };
        void *pk = cb_pack_wanted(lvl, type) ? cb_pack_alloc(&wt) : NULL;
        cb_kq_matmul_rows(lvl, &wt, NULL, xk, N_ROWS, y[lvl], N_OUT, 0, N_OUT);
        CHECK_MSG(memcmp(y[lvl], y[0], sizeof y[0]) == 0, "extremes type %d level %d differs", type, lvl);
        free(pk);
    }
    int bad = 0;
    for (int o = 0; o < N_OUT; o++) {
        cb_kq_row_f32(type, w + (size_t)o * rb, N_IN, wf);
        for (int r = 0; r < N_ROWS; r++) {
            double ref = 0, mag = 0;
            for (int i = 0; i < N_IN; i++) { ref += (double)wf[i] * x[r * N_IN + i]; mag += fabs((double)wf[i] * x[r * N_IN + i]); }
            bad += fabs(ref - y[0][r * N_OUT + o]) > 1e-6 * mag;
        }
    }
    CHECK_MSG(bad == 0, "extremes type %d: %d outputs off", type, bad);
    free(w); free(x); free(wf); free(xk);
}

/* AMX tiles (16-row tiles of prefill-sized batches at the AVX-512 level)
 * against the scalar path and against the same level with AMX off: the
 * same bits, over several row blocks and staged super-block chunks, a
 * partial last panel, a row tail for VNNI, and a sub-range of outputs. */
static void test_matmul_amx(int type) {
    enum { N_OUT = 37, N_IN = 10 * 256, N_ROWS = 16 * 9 + 5 };
    if (cb_simd_detect() < CB_SIMD_AVX512) return;
    const int had = cb_amx_active();
    if (!had) printf("kquants: AMX not active on this machine; its kernel is not exercised\n");
    const size_t rb = cb_kq_block_bytes(type) * (N_IN / 256);
    uint8_t *w = malloc(rb * N_OUT);
    float *x = malloc(sizeof(float) * N_ROWS * N_IN);
    cb_block_q8k *xk = malloc(sizeof(cb_block_q8k) * N_ROWS * (N_IN / 256));
    float *y0 = malloc(sizeof(float) * N_ROWS * N_OUT), *ya = malloc(sizeof(float) * N_ROWS * N_OUT),
          *yv = malloc(sizeof(float) * N_ROWS * N_OUT), *ys = malloc(sizeof(float) * N_ROWS * N_OUT);
    for (int o = 0; o < N_OUT; o++) random_row(type, w + (size_t)o * rb, N_IN);
    for (int i = 0; i < N_ROWS * N_IN; i++) x[i] = rndf() * (1.0f + (float)(i % 7));
    for (int r = 0; r < N_ROWS; r++) cb_kq_quantize_q8k_scalar(x + r * N_IN, xk + r * (N_IN / 256), N_IN);
    cb_weight wt = { type, N_IN, N_OUT, w, rb, NULL };
    cb_kq_matmul_rows(CB_SIMD_SCALAR, &wt, NULL, xk, N_ROWS, y0, N_OUT, 0, N_OUT);
    void *pk = cb_pack_alloc(&wt);
    CHECK(pk != NULL);
    cb_kq_matmul_rows(CB_SIMD_AVX512, &wt, NULL, xk, N_ROWS, ya, N_OUT, 0, N_OUT);
    CHECK(cb_amx_enable(0) == 0);
    cb_kq_matmul_rows(CB_SIMD_AVX512, &wt, NULL, xk, N_ROWS, yv, N_OUT, 0, N_OUT);
    CHECK(cb_amx_enable(1) == had);
    CHECK_MSG(memcmp(ya, y0, sizeof(float) * N_ROWS * N_OUT) == 0, "type %d: AMX differs from scalar", type);
    CHECK_MSG(memcmp(yv, y0, sizeof(float) * N_ROWS * N_OUT) == 0, "type %d: VNNI differs from scalar", type);
    /* outputs [16, 37) of rows [5, 5 + 32): another tile grouping of the same rows */
    memset(ys, 0, sizeof(float) * N_ROWS * N_OUT);
    cb_kq_matmul_rows(CB_SIMD_AVX512, &wt, NULL, xk + 5 * (N_IN / 256), 32, ys, N_OUT, 16, N_OUT);
    int bad = 0;
    for (int r = 0; r < 32; r++)
        bad += memcmp(ys + r * N_OUT + 16, y0 + (r + 5) * N_OUT + 16, sizeof(float) * (N_OUT - 16)) != 0;
    CHECK_MSG(bad == 0, "type %d: %d rows differ in a sub-range", type, bad);
    free(pk); free(w); free(x); free(xk); free(y0); free(ya); free(yv); free(ys);
}

int main(void) {
    CHECK(cb_kq_block_bytes(CB_TYPE_Q4_K) == 144 && sizeof(cb_block_q4_K) == 144);
    CHECK(cb_kq_block_bytes(CB_TYPE_Q5_K) == 176 && sizeof(cb_block_q5_K) == 176);
    CHECK(cb_kq_block_bytes(CB_TYPE_Q6_K) == 210 && sizeof(cb_block_q6_K) == 210);
    CHECK(cb_kq_block_bytes(CB_TYPE_Q8_0) == 0 && !cb_kq_is_kquant(CB_TYPE_Q4_0));
    test_decode_q45(0);
    test_decode_q45(1);
    test_decode_q6();
    test_quantize_q8k();
    test_matmul(CB_TYPE_Q4_K);
    test_matmul(CB_TYPE_Q5_K);
    test_matmul(CB_TYPE_Q6_K);
    test_matmul_extremes(CB_TYPE_Q4_K);
    test_matmul_extremes(CB_TYPE_Q5_K);
    test_matmul_extremes(CB_TYPE_Q6_K);
    test_matmul_amx(CB_TYPE_Q4_K);
    test_matmul_amx(CB_TYPE_Q5_K);
    test_matmul_amx(CB_TYPE_Q6_K);
    return cb_test_report("kquants");
}
