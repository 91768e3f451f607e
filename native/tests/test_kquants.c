/*
 * test_kquants.c — K-quant (Q4_K, Q5_K, Q6_K) decoding and matmul kernels.
 *
 *  - decoding: blocks packed here from known (scale, min, quant) values by
 *    the packing rules written out independently of kquants_scalar.c decode
 *    to exactly d*sc*q - dmin*m (Q4_K, Q5_K) and d*sc*(q-32) (Q6_K);
 *  - matmul: every level against a double-precision dot of the decoded
 *    weights with the decoded int8 activations (the only rounding left is
 *    float accumulation), levels bit-identical to each other, rows
 *    bit-identical alone and in a batch.
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

static void test_matmul(int type) {
    enum { N_OUT = 19, N_IN = 768, N_ROWS = 6 };
    const size_t rb = cb_kq_block_bytes(type) * (N_IN / 256);
    uint8_t *w = malloc(rb * N_OUT);
    float *x = malloc(sizeof(float) * N_ROWS * N_IN), *wf = malloc(sizeof(float) * N_IN);
    cb_block_q8 *xq = malloc(sizeof(cb_block_q8) * N_ROWS * (N_IN / 32));
    float y[3][N_ROWS * N_OUT], y1[N_OUT];
    for (int o = 0; o < N_OUT; o++) random_row(type, w + (size_t)o * rb, N_IN);
    for (int i = 0; i < N_ROWS * N_IN; i++) x[i] = rndf();
    const cb_kernels *ks = cb_kernels_get(CB_SIMD_SCALAR);
    for (int r = 0; r < N_ROWS; r++) ks->quantize_q8(x + r * N_IN, xq + r * (N_IN / 32), N_IN);
    cb_weight wt = { type, N_IN, N_OUT, w, rb, NULL };
    for (int lvl = 0; lvl <= 2; lvl++) {
        if (lvl > 0 && cb_simd_detect() < lvl) { memcpy(y[lvl], y[0], sizeof y[0]); continue; }
        cb_kq_matmul_rows(lvl, &wt, xq, N_ROWS, y[lvl], N_OUT, 0, N_OUT);
        CHECK(memcmp(y[lvl], y[0], sizeof y[0]) == 0);  /* levels bit-identical */
        /* one row alone, and a sub-range of outputs, give the same bits */
        cb_kq_matmul_rows(lvl, &wt, xq + 3 * (N_IN / 32), 1, y1, N_OUT, 0, N_OUT);
        CHECK(memcmp(y1, y[lvl] + 3 * N_OUT, sizeof y1) == 0);
        cb_kq_matmul_rows(lvl, &wt, xq, N_ROWS, y1, 0, 5, 6);  /* ldy 0: all rows write y1[5] */
        CHECK(y1[5] == y[lvl][(N_ROWS - 1) * N_OUT + 5]);
    }
    double worst = 0;
    for (int o = 0; o < N_OUT; o++) {
        cb_kq_row_f32(type, w + (size_t)o * rb, N_IN, wf);
        for (int r = 0; r < N_ROWS; r++) {
            double ref = 0, mag = 0;
            for (int i = 0; i < N_IN; i++) {
                const cb_block_q8 *b = &xq[r * (N_IN / 32) + i / 32];
                const double xv = (double)b->d * b->qs[i % 32];
                ref += (double)wf[i] * xv;
                mag += fabs((double)wf[i] * xv);
            }
            const double e = fabs(ref - y[0][r * N_OUT + o]) / (mag + 1e-30);
            if (e > worst) worst = e;
        }
    }
    CHECK(worst < 1e-5);
    free(w); free(x); free(wf); free(xq);
}

int main(void) {
    CHECK(cb_kq_block_bytes(CB_TYPE_Q4_K) == 144 && sizeof(cb_block_q4_K) == 144);
    CHECK(cb_kq_block_bytes(CB_TYPE_Q5_K) == 176 && sizeof(cb_block_q5_K) == 176);
    CHECK(cb_kq_block_bytes(CB_TYPE_Q6_K) == 210 && sizeof(cb_block_q6_K) == 210);
    CHECK(cb_kq_block_bytes(CB_TYPE_Q8_0) == 0 && !cb_kq_is_kquant(CB_TYPE_Q4_0));
    test_decode_q45(0);
    test_decode_q45(1);
    test_decode_q6();
    test_matmul(CB_TYPE_Q4_K);
    test_matmul(CB_TYPE_Q5_K);
    test_matmul(CB_TYPE_Q6_K);
    return cb_test_report("kquants");
}
