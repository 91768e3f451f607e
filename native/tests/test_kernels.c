/*
 * test_kernels.c — type table, conversions, activation quantization, and the
 * matmul kernels of every SIMD level this CPU has (scalar always) against
 * independent double-precision references, plus batch invariance: a row's
 * result is bit-identical whatever the batch size, tile, o-range or threads.
 */
#include "colibri.h"
#include "kernels.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- helpers */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd_u32(void) {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static float rnd_f(void) { return (float)((rnd_u32() & 0xFFFFFF) / 16777216.0 * 2.0 - 1.0); }

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static uint16_t get16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

/* Independent half -> float (plain arithmetic, no bit tricks). */
static double ref_f16(uint16_t h) {
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) v = ldexp((double)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexp(1024.0 + m, e - 25);
    return s ? -v : v;
}

/* Reference quantizers (ggml's algorithms) producing raw GGUF blocks. */
static size_t ref_row_bytes(int type, int n) {
    switch (type) {
    case CB_TYPE_F32: return 4u * n;
    case CB_TYPE_F16: case CB_TYPE_BF16: return 2u * n;
    case CB_TYPE_Q4_0: return (size_t)n / 32 * 18;
    case CB_TYPE_Q4_1: return (size_t)n / 32 * 20;
    case CB_TYPE_Q8_0: return (size_t)n / 32 * 34;
    }
    return 0;
}

static void ref_quantize_row(int type, const float *x, int n, uint8_t *out) {
    switch (type) {
    case CB_TYPE_F32: memcpy(out, x, 4u * n); return;
    case CB_TYPE_F16: for (int i = 0; i < n; i++) put16(out + 2 * i, cb_f32_to_f16(x[i])); return;
    case CB_TYPE_BF16:
        for (int i = 0; i < n; i++) {  /* round to nearest even */
            uint32_t u; memcpy(&u, &x[i], 4);
            u += 0x7FFF + ((u >> 16) & 1);
            put16(out + 2 * i, (uint16_t)(u >> 16));
        }
        return;
    }
    for (int b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        if (type == CB_TYPE_Q8_0) {
            uint8_t *o = out + 34 * b;
            float amax = 0;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
            const float d = amax / 127, id = d ? 1 / d : 0;
            put16(o, cb_f32_to_f16(d));
            for (int i = 0; i < 32; i++) o[2 + i] = (uint8_t)(int8_t)roundf(xb[i] * id);
        } else if (type == CB_TYPE_Q4_0) {
            uint8_t *o = out + 18 * b;
            float amax = 0, max = 0;
            for (int i = 0; i < 32; i++) if (fabsf(xb[i]) > amax) { amax = fabsf(xb[i]); max = xb[i]; }
            const float d = max / -8, id = d ? 1 / d : 0;
            put16(o, cb_f32_to_f16(d));
            for (int i = 0; i < 16; i++) {
                int a = (int)(xb[i] * id + 8.5f), c = (int)(xb[i + 16] * id + 8.5f);
                a = a > 15 ? 15 : a; c = c > 15 ? 15 : c;
                o[2 + i] = (uint8_t)(a | (c << 4));
            }
        } else {  /* Q4_1 */
            uint8_t *o = out + 20 * b;
            float mn = xb[0], mx = xb[0];
            for (int i = 1; i < 32; i++) { mn = fminf(mn, xb[i]); mx = fmaxf(mx, xb[i]); }
            const float d = (mx - mn) / 15, id = d ? 1 / d : 0;
            put16(o, cb_f32_to_f16(d));
            put16(o + 2, cb_f32_to_f16(mn));
            for (int i = 0; i < 16; i++) {
                int a = (int)((xb[i] - mn) * id + 0.5f), c = (int)((xb[i + 16] - mn) * id + 0.5f);
                a = a > 15 ? 15 : a; c = c > 15 ? 15 : c;
                o[4 + i] = (uint8_t)(a | (c << 4));
            }
        }
    }
}

/* Reference dequantization to double. */
static void ref_dequant_row(int type, const uint8_t *p, int n, double *out) {
    for (int i = 0; i < n; i++) {
        switch (type) {
        case CB_TYPE_F32: { float v; memcpy(&v, p + 4 * i, 4); out[i] = v; break; }
        case CB_TYPE_F16: out[i] = ref_f16(get16(p + 2 * i)); break;
        case CB_TYPE_BF16: { uint32_t u = (uint32_t)get16(p + 2 * i) << 16; float v; memcpy(&v, &u, 4); out[i] = v; break; }
        case CB_TYPE_Q8_0: { const uint8_t *b = p + 34 * (i / 32); out[i] = ref_f16(get16(b)) * (int8_t)b[2 + i % 32]; break; }
        case CB_TYPE_Q4_0: {
            const uint8_t *b = p + 18 * (i / 32); const int j = i % 32;
            const int q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
            out[i] = ref_f16(get16(b)) * (q - 8); break;
        }
        case CB_TYPE_Q4_1: {
            const uint8_t *b = p + 20 * (i / 32); const int j = i % 32;
            const int q = j < 16 ? (b[4 + j] & 15) : (b[4 + j - 16] >> 4);
            out[i] = ref_f16(get16(b)) * q + ref_f16(get16(b + 2)); break;
        }
        }
    }
}

/* Reference activation quantizer: d = max|x|/127, q = nearest (ties even). */
static void ref_quant_act(const float *x, int n, float *d, int8_t *q) {
    for (int b = 0; b < n / 32; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * b + i]));
        d[b] = amax / 127.0f;
        const float id = d[b] ? 1.0f / d[b] : 0.0f;
        for (int i = 0; i < 32; i++) q[32 * b + i] = (int8_t)nearbyintf(x[32 * b + i] * id);
    }
}

static int is_quant(int type) { return type == CB_TYPE_Q4_0 || type == CB_TYPE_Q4_1 || type == CB_TYPE_Q8_0; }

static const int types[] = { CB_TYPE_F32, CB_TYPE_F16, CB_TYPE_BF16, CB_TYPE_Q8_0, CB_TYPE_Q4_0, CB_TYPE_Q4_1 };
#define N_TYPES 6

/* ------------------------------------------------------------- tests */

static void test_type_table(void) {
    CHECK(cb_type_size(CB_TYPE_Q4_1, 576) == 18 * 20);
    CHECK(cb_type_size(CB_TYPE_Q4_0, 64) == 2 * 18);
    CHECK(cb_type_size(CB_TYPE_Q8_0, 32) == 34);
    CHECK(cb_type_size(CB_TYPE_F16, 3) == 6);
    CHECK(cb_type_size(CB_TYPE_BF16, 5) == 10);
    CHECK(cb_type_size(CB_TYPE_F32, 7) == 28);
    CHECK(cb_type_size(CB_TYPE_Q8_0, 33) == 0);   /* not a multiple of the block */
    CHECK(cb_type_size(12345, 32) == 0);          /* unknown type */
    CHECK(cb_type_size(CB_TYPE_F32, -4) == 0);
    CHECK(strcmp(cb_type_name(CB_TYPE_Q4_1), "q4_1") == 0);
    CHECK(strcmp(cb_type_name(CB_TYPE_BF16), "bf16") == 0);
    CHECK(strcmp(cb_type_name(99), "unknown") == 0);
    CHECK(cb_type_supported(CB_TYPE_Q8_0) && cb_type_supported(6) && !cb_type_supported(23));  /* Q5_0 yes, IQ4_XS no */
    CHECK(sizeof(cb_block_q4_0) == 18 && sizeof(cb_block_q4_1) == 20 && sizeof(cb_block_q8_0) == 34);
    CHECK(sizeof(cb_block_q8) == 40);
}

static void test_conversions(void) {
    CHECK(cb_f32_to_f16(1.0f) == 0x3C00);
    CHECK(cb_f32_to_f16(-2.0f) == 0xC000);
    CHECK(cb_f32_to_f16(65504.0f) == 0x7BFF);
    CHECK(cb_f32_to_f16(1e6f) == 0x7C00);                      /* overflow -> inf */
    CHECK(cb_f32_to_f16(0.1f) == 0x2E66);
    CHECK(cb_f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3C00);     /* tie -> even */
    CHECK(cb_f32_to_f16(1.0f + 3 * ldexpf(1, -11)) == 0x3C02); /* tie -> even (up) */
    CHECK(cb_f32_to_f16(ldexpf(1, -24)) == 0x0001);            /* smallest subnormal */
    CHECK((cb_f32_to_f16(NAN) & 0x7C00) == 0x7C00 && (cb_f32_to_f16(NAN) & 0x3FF) != 0);
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const double r = ref_f16((uint16_t)h);
        const float f = cb_f16_to_f32((uint16_t)h);
        if (isnan(r)) { if (!isnan(f)) bad++; continue; }
        if ((double)f != r) bad++;
        if (cb_f32_to_f16(f) != h) bad++;  /* round trip */
    }
    CHECK_MSG(bad == 0, "%d f16 values wrong", bad);
    CHECK(cb_bf16_to_f32(0x3F80) == 1.0f && cb_bf16_to_f32(0xC040) == -3.0f);
}

static void test_simd_names(void) {
    const int best = cb_simd_detect();
    CHECK(best >= CB_SIMD_SCALAR && best <= CB_SIMD_AVX512);
    CHECK(strcmp(cb_simd_name(CB_SIMD_SCALAR), "scalar") == 0);
    CHECK(strcmp(cb_simd_name(CB_SIMD_AVX2), "avx2") == 0);
    CHECK(strcmp(cb_simd_name(CB_SIMD_AVX512), "avx512") == 0);
    CHECK(cb_kernels_get(CB_SIMD_SCALAR) != NULL);
    for (int s = CB_SIMD_SCALAR; s <= CB_SIMD_AVX512; s++) {
        const cb_kernels *k = cb_kernels_get(s);
        CHECK((k != NULL) == (s <= best));
        if (k) CHECK(k->simd == s);
    }
    CHECK(cb_kernels_get(7) == NULL);
    printf("simd: best level %s\n", cb_simd_name(best));
}

static void test_quantize_act(const cb_kernels *k) {
    enum { N = 32 * 37 };  /* two groups of 16 blocks (the AVX-512 path's unit) and a tail of 5 */
    float x[N], d[N / 32];
    int8_t q[N];
    for (int i = 0; i < N; i++) x[i] = rnd_f() * (i < 32 ? 0.001f : (float)(1 + i % 5));
    for (int i = 32; i < 64; i++) x[i] = 0.0f;  /* zero block */
    for (int i = 32 * 20; i < 32 * 21; i++) x[i] = 0.0f;  /* and one inside the second group */
    x[70] = -5.0f;                               /* negative max */
    x[100] = 127.5f / 127.0f * 3.0f;             /* exercise rounding near ties */
    x[32 * 35 + 3] = -1e-30f;                    /* a tiny block in the tail */
    cb_block_q8 blk[N / 32];
    memset(blk, 0x55, sizeof(blk));
    k->quantize_q8(x, blk, N);
    ref_quant_act(x, N, d, q);
    int bad = 0;
    for (int b = 0; b < N / 32; b++) {
        int sum = 0;
        if (blk[b].d != d[b]) bad++;
        for (int i = 0; i < 32; i++) { if (blk[b].qs[i] != q[32 * b + i]) bad++; sum += q[32 * b + i]; }
        if (blk[b].s != d[b] * (float)sum) bad++;
    }
    CHECK_MSG(bad == 0, "%s: %d quantized activation values differ", cb_simd_name(k->simd), bad);
    CHECK(blk[1].d == 0.0f && blk[1].s == 0.0f && blk[20].d == 0.0f);
    for (int i = 0; i < 32; i++) CHECK(blk[1].qs[i] == 0 && blk[20].qs[i] == 0);
}

/* Compare one type at one SIMD level on one shape. */
/* The first index of the largest non-NaN entry, -1 when every entry is
 * -inf or NaN (the greedy token cb_sample takes). */
static int64_t ref_first_max(const float *x, int64_t n, float *max) {
    float m = -INFINITY;
    int64_t at = -1;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(x[i]) && x[i] > -INFINITY && (at < 0 || x[i] > m)) { m = x[i]; at = i; }
    *max = m;
    return at;
}

/* AVX-512 and AVX2 read quantized weights in the panel layout, as the
 * engine packs them at model load; scalar reads the file layout.  Sets
 * w->packed and returns the buffer to free (NULL when not packed). */
static void *pack_for(const cb_kernels *k, cb_weight *w) {
    w->packed = NULL;
    if (!cb_pack_wanted(k->simd, w->type) || !cb_pack_bytes(w->type, w->n_in, w->n_out)) return NULL;
    void *p = cb_pack_alloc(w);
    CHECK(p != NULL);
    return p;
}

static void test_matmul_shape(const cb_kernels *k, int type, int n_out, int n_in, int n_rows) {
    const char *lvl = cb_simd_name(k->simd), *tn = cb_type_name(type);
    const size_t rb = ref_row_bytes(type, n_in);
    uint8_t *w = malloc(rb * n_out);
    float *wf = malloc(sizeof(float) * n_in);
    float *x = malloc(sizeof(float) * n_in * n_rows);
    float *y = malloc(sizeof(float) * n_out * n_rows);
    float *y1 = malloc(sizeof(float) * n_out * n_rows);
    float *y2 = malloc(sizeof(float) * n_out * n_rows);
    double *wd = malloc(sizeof(double) * n_in * n_out);
    float *xd = malloc(sizeof(float) * (n_in / 32 + 1) * n_rows);
    int8_t *xq = malloc((size_t)n_in * n_rows);
    void *scratch = aligned_alloc(64, cb_matmul_scratch(n_in, n_rows));
    for (int o = 0; o < n_out; o++) {
        /* a row offset makes Q4_1 mins and Q4_0 asymmetry matter */
        const float off = (o % 3) * 0.3f;
        for (int i = 0; i < n_in; i++) wf[i] = rnd_f() + off;
        ref_quantize_row(type, wf, n_in, w + rb * o);
        ref_dequant_row(type, w + rb * o, n_in, wd + (size_t)n_in * o);
    }
    for (int i = 0; i < n_in * n_rows; i++) x[i] = rnd_f() * 2.0f;
    if (is_quant(type)) for (int r = 0; r < n_rows; r++) ref_quant_act(x + r * n_in, n_in, xd + r * (n_in / 32), xq + r * n_in);

    cb_weight wt = { type, n_in, n_out, w, cb_type_size(type, n_in), NULL };
    CHECK(wt.row_bytes == rb);
    /* AVX-512 reads quantized weights in the panel layout (as the engine
     * packs them at model load); the other levels read the file layout. */
    void *packed = pack_for(k, &wt);

    /* Reference: each row alone, one thread, whole o-range. */
    for (int r = 0; r < n_rows; r++) {
        cb_block_q8 *qb = scratch;
        if (is_quant(type)) k->quantize_q8(x + r * n_in, qb, n_in);
        k->matmul_rows(&wt, qb, x + r * n_in, 1, y1 + r * n_out, n_out, 0, n_out);
    }

    /* Accuracy against double references. */
    double err_exact = 0, num = 0, den = 0;
    int n_bound = 0;
    for (int r = 0; r < n_rows; r++) {
        for (int o = 0; o < n_out; o++) {
            const double *wr = wd + (size_t)n_in * o;
            double ref = 0, exact = 0, mag = 0;
            for (int i = 0; i < n_in; i++) ref += wr[i] * x[r * n_in + i];
            if (is_quant(type)) {
                /* same activation quantization as the kernel, double math */
                for (int i = 0; i < n_in; i++) {
                    const double t = wr[i] * xd[r * (n_in / 32) + i / 32] * xq[r * n_in + i];
                    exact += t; mag += fabs(t);
                }
            } else {
                for (int i = 0; i < n_in; i++) mag += fabs(wr[i] * x[r * n_in + i]);
                exact = ref;
            }
            const double v = y1[r * n_out + o];
            num += (v - ref) * (v - ref); den += ref * ref;
            if (is_quant(type)) {
                /* rounding x to the int8 grid moves each x_i by at most d_x / 2 */
                double bound = 1e-5 * mag;
                for (int i = 0; i < n_in; i++) bound += fabs(wr[i]) * xd[r * (n_in / 32) + i / 32] * 0.5;
                if (fabs(v - ref) > bound * 1.0001) n_bound++;
            }
            const double e = fabs(v - exact) / (mag + 1e-30);
            if (e > err_exact) err_exact = e;
        }
    }
    /* relative error of the whole result (a single small dot can be off by
     * more than 2%; the bound above covers every element) */
    const double err_q = sqrt(num / (den + 1e-30));
    if (!is_quant(type) || (n_in >= 64 && n_out * n_rows >= 30))
        CHECK_MSG(err_q <= (is_quant(type) ? 2e-2 : 1e-5), "%s %s %dx%d: rel err vs dequant ref %g", lvl, tn, n_out, n_in, err_q);
    CHECK_MSG(n_bound == 0, "%s %s %dx%d: %d results outside the activation-rounding bound", lvl, tn, n_out, n_in, n_bound);
    CHECK_MSG(err_exact <= 1e-5, "%s %s %dx%d: err vs same-quantization ref %g", lvl, tn, n_out, n_in, err_exact);

    /* Batch invariance: every n_rows prefix in one call, and split o-ranges. */
    int diff = 0;
    for (int nr = 1; nr <= n_rows; nr++) {
        cb_block_q8 *qb = scratch;
        if (is_quant(type)) for (int r = 0; r < nr; r++) k->quantize_q8(x + r * n_in, qb + r * (n_in / 32), n_in);
        memset(y, 0, sizeof(float) * n_out * nr);
        /* random split of [0, n_out) into up to 3 ranges */
        int a = (int)(rnd_u32() % (n_out + 1)), c = (int)(rnd_u32() % (n_out + 1));
        if (a > c) { int t = a; a = c; c = t; }
        if (wt.packed) { a -= a % CB_PANEL; c -= c % CB_PANEL; }  /* ranges start on panels */
        k->matmul_rows(&wt, qb, x, nr, y, n_out, 0, a);
        k->matmul_rows(&wt, qb, x, nr, y, n_out, a, c);
        k->matmul_rows(&wt, qb, x, nr, y, n_out, c, n_out);
        if (memcmp(y, y1, sizeof(float) * n_out * nr) != 0) diff++;
    }
    CHECK_MSG(diff == 0, "%s %s %dx%d: %d batch sizes not bit-identical to single rows", lvl, tn, n_out, n_in, diff);

    /* Through cb_matmul with 1..3 threads (shared-scratch and local paths). */
    for (int nth = 1; nth <= 3; nth++) {
        cb_pool *pool = cb_pool_new(nth);
        CHECK(pool != NULL);
        for (int nr = 1; nr <= n_rows; nr += (nr < 3 ? 1 : 3)) {
            memset(y2, 0xFF, sizeof(float) * n_out * nr);
            cb_matmul(pool, k, &wt, x, nr, y2, scratch);
            CHECK_MSG(memcmp(y2, y1, sizeof(float) * n_out * nr) == 0,
                      "%s %s %dx%d: cb_matmul nth=%d n_rows=%d differs", lvl, tn, n_out, n_in, nth, nr);
            /* with each row's argmax taken as the threads go: same outputs, the row's first maximum */
            float pmax[3 * 128], amax[128];
            int64_t pidx[3 * 128], aidx[128];
            if (nr <= 128) {
                memset(y2, 0xFF, sizeof(float) * n_out * nr);
                cb_matmul_argmax(pool, k, &wt, x, nr, y2, scratch, pmax, pidx, amax, aidx);
                CHECK_MSG(memcmp(y2, y1, sizeof(float) * n_out * nr) == 0, "%s %s: cb_matmul_argmax outputs differ", lvl, tn);
                int bad = 0;
                for (int r = 0; r < nr; r++) {
                    float m;
                    if (aidx[r] != ref_first_max(y1 + (size_t)r * n_out, n_out, &m) || (aidx[r] >= 0 && amax[r] != m)) bad++;
                }
                CHECK_MSG(bad == 0, "%s %s %dx%d nth=%d: %d rows' argmax wrong", lvl, tn, n_out, n_in, nth, bad);
            }
        }
        cb_pool_free(pool);
    }
    /* The public test hook runs the same path. */
    CHECK(cb_kernel_matmul(type, w, n_out, n_in, x, n_rows, y2, k->simd, 2) == CB_OK);
    CHECK_MSG(memcmp(y2, y1, sizeof(float) * n_out * n_rows) == 0, "%s %s: cb_kernel_matmul differs", lvl, tn);

    free(w); free(wf); free(x); free(y); free(y1); free(y2); free(wd); free(xd); free(xq); free(scratch); free(packed);
}

/* cb_matmul_multi: n_w weights of mixed types and sizes (sharing n_in) in
 * one run give, for each weight, exactly cb_matmul's bits at 1..3 threads,
 * including more weights than one run takes (the call splits) and a weight
 * with no rows.  References are separate single-thread cb_matmul calls. */
static void test_matmul_multi(const cb_kernels *k, int n_in, int n_rows) {
    enum { NW = CB_MATMUL_MULTI_MAX + 3 };
    cb_weight wt[NW];
    const cb_weight *wp[NW];
    float *yref[NW], *ymul[NW];
    uint8_t *wdata[NW];
    void *wpk[NW];
    float *wf = malloc(sizeof(float) * n_in);
    float *x = malloc(sizeof(float) * n_in * n_rows);
    void *scratch = aligned_alloc(64, cb_matmul_scratch(n_in, n_rows));
    cb_block_q8 *xq = aligned_alloc(64, cb_matmul_scratch(n_in, n_rows));
    for (int i = 0; i < n_in * n_rows; i++) x[i] = rnd_f() * 3.0f;
    for (int r = 0; r < n_rows; r++) k->quantize_q8(x + (size_t)r * n_in, xq + (size_t)r * (n_in / CB_QK), n_in);
    for (int i = 0; i < NW; i++) {
        const int type = types[i % N_TYPES];
        const int n_out = i == 4 ? 0 : 3 + (int)(rnd_u32() % 90);  /* weight 4 has no rows */
        const size_t rb = ref_row_bytes(type, n_in);
        wdata[i] = malloc(rb * (size_t)(n_out > 0 ? n_out : 1));
        for (int o = 0; o < n_out; o++) {
            for (int j = 0; j < n_in; j++) wf[j] = rnd_f() + (o % 3) * 0.3f;
            ref_quantize_row(type, wf, n_in, wdata[i] + rb * o);
        }
        wt[i].type = type; wt[i].n_in = n_in; wt[i].n_out = n_out; wt[i].data = wdata[i];
        wt[i].row_bytes = cb_type_size(type, n_in);
        wpk[i] = pack_for(k, &wt[i]);
        wp[i] = &wt[i];
        yref[i] = malloc(sizeof(float) * (size_t)(n_out > 0 ? n_out : 1) * n_rows);
        ymul[i] = malloc(sizeof(float) * (size_t)(n_out > 0 ? n_out : 1) * n_rows);
        cb_matmul(NULL, k, &wt[i], x, n_rows, yref[i], scratch);
    }
    for (int nth = 1; nth <= 3; nth++) {
        cb_pool *pool = cb_pool_new(nth);
        CHECK(pool != NULL);
        for (int nw = 1; nw <= NW; nw += (nw < 3 ? 1 : 4)) {
            for (int i = 0; i < nw; i++) memset(ymul[i], 0xFF, sizeof(float) * (size_t)wt[i].n_out * n_rows);
            /* odd nw: activations quantized beforehand (as a norm task does) */
            cb_matmul_multi(pool, k, wp, nw, x, nw % 2 ? xq : NULL, n_rows, ymul, scratch);
            int diff = 0;
            for (int i = 0; i < nw; i++)
                if (memcmp(ymul[i], yref[i], sizeof(float) * (size_t)wt[i].n_out * n_rows) != 0) diff++;
            CHECK_MSG(diff == 0, "%s multi n_in=%d rows=%d nth=%d n_w=%d: %d outputs differ from cb_matmul",
                      cb_simd_name(k->simd), n_in, n_rows, nth, nw, diff);
        }
        cb_pool_free(pool);
    }
    for (int i = 0; i < NW; i++) { free(wdata[i]); free(wpk[i]); free(yref[i]); free(ymul[i]); }
    free(wf); free(x); free(scratch); free(xq);
}

/* rmsnorm (also in place) and swiglu against double references, over
 * lengths that end in a partial vector and gates far into both tails. */
/* argmax over a row cut into ranges scanned in a shuffled order (as threads
 * finish them) gives the whole row's first maximum: ties, NaN, -inf, +inf,
 * zeros of both signs, tails shorter than a vector. */
static void test_argmax(const cb_kernels *k) {
    enum { N = 301 };
    float x[N];
    for (int trial = 0; trial < 400; trial++) {
        const int n = 1 + (int)(rnd_u32() % N), kind = trial % 8;
        for (int i = 0; i < n; i++) {
            x[i] = (float)((int)(rnd_u32() % 9) - 4);  /* many ties */
            if (kind == 1 && i % 7 == 3) x[i] = NAN;
            if (kind == 2) x[i] = -INFINITY;
            if (kind == 3 && i % 5 == 0) x[i] = NAN;
            if (kind == 3 && i % 5 != 0) x[i] = -INFINITY;
            if (kind == 4 && i == n / 2) x[i] = INFINITY;
            if (kind == 5) x[i] = i % 2 ? 0.0f : -0.0f;
            if (kind == 6) x[i] = rnd_f();
        }
        float want_m;
        const int64_t want = ref_first_max(x, n, &want_m);
        int cuts[4] = { 0, (int)(rnd_u32() % (n + 1)), (int)(rnd_u32() % (n + 1)), n };
        if (cuts[1] > cuts[2]) { int t = cuts[1]; cuts[1] = cuts[2]; cuts[2] = t; }
        float m = -INFINITY;
        int64_t at = -1;
        for (int j = 0; j < 3; j++) {
            const int c = (j + trial) % 3;  /* ranges in a rotated order */
            float pm = -INFINITY;
            int64_t pi = -1;
            k->argmax(x + cuts[c], cuts[c + 1] - cuts[c], cuts[c], &pm, &pi);
            if (pi >= 0 && (at < 0 || pm > m || (pm == m && pi < at))) { m = pm; at = pi; }
        }
        CHECK_MSG(at == want, "%s argmax trial %d (n=%d kind %d): %lld, want %lld", cb_simd_name(k->simd), trial, n,
                  kind, (long long)at, (long long)want);
        if (want >= 0) CHECK(m == want_m);
    }
}

/* rope: every level gives the scalar loop's bits, for both pairings, full
 * and partial rotation (dimensions past n_rot untouched), and head sizes
 * whose pairs do not fill a vector (the fallback); against a double
 * reference too, so the scalar loop itself is checked. */
static void test_rope(const cb_kernels *k) {
    static const int shapes[][3] = {  /* head_dim, n_rot, n_heads */
        { 64, 64, 9 }, { 128, 128, 3 }, { 128, 64, 2 }, { 64, 32, 5 }, { 80, 80, 2 }, { 96, 48, 1 }, { 8, 8, 4 },
    };
    float cs[128], v[9 * 128], ref[9 * 128], want[9 * 128];
    for (size_t a = 0; a < sizeof shapes / sizeof shapes[0]; a++) {
        const int hd = shapes[a][0], n_rot = shapes[a][1], nh = shapes[a][2];
        for (int neox = 0; neox <= 1; neox++) {
            for (int i = 0; i < n_rot / 2; i++) {
                const double th = (37 + a) * pow(10000.0, -2.0 * i / n_rot);
                cs[2 * i] = (float)cos(th); cs[2 * i + 1] = (float)sin(th);
            }
            for (int i = 0; i < nh * hd; i++) v[i] = ref[i] = want[i] = rnd_f() * 3.0f;
            k->rope(v, cs, nh, hd, n_rot, neox);
            cb_rope_generic(ref, cs, nh, hd, n_rot, neox);
            CHECK_MSG(memcmp(v, ref, sizeof(float) * nh * hd) == 0, "%s rope hd=%d n_rot=%d neox=%d differs from scalar",
                      cb_simd_name(k->simd), hd, n_rot, neox);
            int bad = 0;
            for (int h = 0; h < nh; h++) {
                const float *x = want + h * hd, *y = v + h * hd;
                for (int i = 0; i < n_rot / 2; i++) {
                    const int ia = neox ? i : 2 * i, ib = neox ? i + n_rot / 2 : 2 * i + 1;
                    const double ea = (double)x[ia] * cs[2 * i] - (double)x[ib] * cs[2 * i + 1];
                    const double eb = (double)x[ia] * cs[2 * i + 1] + (double)x[ib] * cs[2 * i];
                    if (fabs(y[ia] - ea) > 1e-5 || fabs(y[ib] - eb) > 1e-5) bad++;
                }
                for (int i = n_rot; i < hd; i++) if (y[i] != x[i]) bad++;
            }
            CHECK_MSG(bad == 0, "%s rope hd=%d n_rot=%d neox=%d: %d wrong", cb_simd_name(k->simd), hd, n_rot, neox, bad);
        }
    }
}

static void test_norm_swiglu(const cb_kernels *k) {
    static const int ns[] = { 1, 7, 64, 67, 576, 1536 };
    enum { MAXN = 1536 };
    float *x = malloc(sizeof(float) * MAXN), *w = malloc(sizeof(float) * MAXN);
    float *o = malloc(sizeof(float) * MAXN), *g = malloc(sizeof(float) * MAXN), *u = malloc(sizeof(float) * MAXN);
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
        const int n = ns[a];
        double ss = 0;
        for (int i = 0; i < n; i++) { x[i] = rnd_f() * 4.0f; w[i] = 1.0f + rnd_f(); ss += (double)x[i] * x[i]; }
        const double sc = 1.0 / sqrt(ss / n + 1e-5);
        k->rmsnorm(x, w, o, n, 1e-5f);
        int bad = 0;
        for (int i = 0; i < n; i++) if (fabs(o[i] - x[i] * sc * w[i]) > 1e-6 * (fabs(x[i] * sc * w[i]) + 1e-6)) bad++;
        k->rmsnorm(x, w, x, n, 1e-5f);  /* in place */
        if (memcmp(x, o, sizeof(float) * n) != 0) bad++;
        CHECK_MSG(bad == 0, "%s rmsnorm n=%d: %d wrong", cb_simd_name(k->simd), n, bad);

        for (int i = 0; i < n; i++) {
            g[i] = i % 13 == 5 ? (i % 2 ? 120.0f : -120.0f) : rnd_f() * 12.0f;
            u[i] = rnd_f() * 2.0f;
        }
        memcpy(o, g, sizeof(float) * n);
        k->swiglu(o, u, n);
        bad = 0;
        for (int i = 0; i < n; i++) {
            const double ref = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
            if (fabs(o[i] - ref) > 2e-6 * fabs(ref) + 1e-30 && fabs(o[i] - ref) > 1e-30) bad++;
        }
        CHECK_MSG(bad == 0, "%s swiglu n=%d: %d wrong", cb_simd_name(k->simd), n, bad);

        /* GEGLU (gelu-tanh gate) */
        memcpy(o, g, sizeof(float) * n);
        k->geglu(o, u, n);
        bad = 0;
        for (int i = 0; i < n; i++) {
            const double x = g[i];
            const double ref = 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))) * u[i];
            /* 1 + tanh cancels for negative x: f32 keeps |x u| * 2^-24-ish absolutely */
            if (fabs(o[i] - ref) > 4e-6 * fabs(ref) + 1e-6 * fabs(x * u[i])) bad++;
        }
        CHECK_MSG(bad == 0, "%s geglu n=%d: %d wrong", cb_simd_name(k->simd), n, bad);
    }
    free(x); free(w); free(o); free(g); free(u);
}

/* attn against a double-precision softmax reference (f32 KV, and f16 KV
 * against the reference over the f16-rounded values), and head j's bits the
 * same whether it runs alone or in a group of g heads (what the engine's
 * work split relies on). */
static void test_attention(const cb_kernels *k) {
    static const int hds[] = { 64, 80, 7, 128 }, poss[] = { 1, 5, 17, 100 };
    enum { G = 5, MAXP = 100, MAXHD = 128, STRIDE = 3 * MAXHD + 5 };
    float *q = malloc(sizeof(float) * G * MAXHD), *out = malloc(sizeof(float) * G * MAXHD);
    float *one = malloc(sizeof(float) * MAXHD), *sc = malloc(sizeof(float) * G * MAXP);
    float *K = malloc(sizeof(float) * MAXP * STRIDE), *V = malloc(sizeof(float) * MAXP * STRIDE);
    uint16_t *Kh = malloc(sizeof(uint16_t) * MAXP * STRIDE), *Vh = malloc(sizeof(uint16_t) * MAXP * STRIDE);
    for (int f16 = 0; f16 <= 1; f16++) {
        for (int i = 0; i < MAXP * STRIDE; i++) {
            K[i] = rnd_f() * 2.0f; V[i] = rnd_f();
            if (f16) {  /* the reference sees exactly the stored values */
                Kh[i] = cb_f32_to_f16(K[i]); Vh[i] = cb_f32_to_f16(V[i]);
                K[i] = cb_f16_to_f32(Kh[i]); V[i] = cb_f16_to_f32(Vh[i]);
            }
        }
        const void *Kp = f16 ? (const void *)Kh : (const void *)K, *Vp = f16 ? (const void *)Vh : (const void *)V;
        for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++)
            for (size_t b = 0; b < sizeof poss / sizeof poss[0]; b++) {
                const int hd = hds[a], n_pos = poss[b];
                const float scale = 1.0f / sqrtf((float)hd);
                for (int i = 0; i < G * hd; i++) q[i] = rnd_f() * 3.0f;
                k->attn(q, G, hd, Kp, Vp, STRIDE, f16, n_pos, scale, sc, out);
                double worst = 0;
                int diff = 0;
                for (int j = 0; j < G; j++) {
                    double s[MAXP], mx = -1e300, sum = 0;
                    for (int p = 0; p < n_pos; p++) {
                        double d = 0;
                        for (int i = 0; i < hd; i++) d += (double)q[j * hd + i] * K[p * STRIDE + i];
                        s[p] = d * scale;
                        if (s[p] > mx) mx = s[p];
                    }
                    for (int p = 0; p < n_pos; p++) { s[p] = exp(s[p] - mx); sum += s[p]; }
                    for (int i = 0; i < hd; i++) {
                        double ref = 0;
                        for (int p = 0; p < n_pos; p++) ref += s[p] / sum * V[p * STRIDE + i];
                        const double e = fabs(out[j * hd + i] - ref);
                        if (e > worst) worst = e;
                    }
                    k->attn(q + j * hd, 1, hd, Kp, Vp, STRIDE, f16, n_pos, scale, sc, one);
                    if (memcmp(one, out + j * hd, sizeof(float) * hd) != 0) diff++;
                }
                CHECK_MSG(worst <= 2e-6, "%s attn kv_f16=%d hd=%d n_pos=%d: max abs error %g", cb_simd_name(k->simd),
                          f16, hd, n_pos, worst);
                CHECK_MSG(diff == 0, "%s attn kv_f16=%d hd=%d n_pos=%d: %d heads differ alone vs in a group",
                          cb_simd_name(k->simd), f16, hd, n_pos, diff);
            }
    }
    /* to_f16: bit-exact with ggml's scalar conversion, specials included */
    enum { NC = 4099 };
    float *xs = malloc(sizeof(float) * NC);
    uint16_t *hs = malloc(sizeof(uint16_t) * NC);
    for (int i = 0; i < NC; i++) {
        const int kind = i % 9;
        xs[i] = kind == 0 ? rnd_f() * 1e-6f : kind == 1 ? rnd_f() * 7e4f : kind == 2 ? 65520.0f :
                kind == 3 ? -INFINITY : kind == 4 ? 6.103515625e-05f * (0.5f + rnd_f()) :
                kind == 5 ? 1.0f + (float)(i % 7) * 0x1p-11f : rnd_f() * 100.0f;
    }
    k->to_f16(xs, hs, NC);
    int bad = 0;
    for (int i = 0; i < NC; i++) if (hs[i] != cb_f32_to_f16(xs[i])) bad++;
    CHECK_MSG(bad == 0, "%s to_f16: %d of %d differ from cb_f32_to_f16", cb_simd_name(k->simd), bad, NC);
    free(xs); free(hs);
    free(q); free(out); free(one); free(sc); free(K); free(V); free(Kh); free(Vh);
}

static void test_row_dequant(void) {
    enum { N = 96 };
    float x[N], out[N];
    uint8_t raw[N * 4];
    double ref[N];
    for (int t = 0; t < N_TYPES; t++) {
        const int type = types[t];
        for (int i = 0; i < N; i++) x[i] = rnd_f();
        /* row 1 of a 2-row matrix: checks the row offset */
        uint8_t two[2 * N * 4];
        ref_quantize_row(type, x, N, raw);
        memset(two, 0, sizeof(two));
        memcpy(two + ref_row_bytes(type, N), raw, ref_row_bytes(type, N));
        cb_weight w = { type, N, 2, two, cb_type_size(type, N), NULL };
        cb_weight_row_f32(&w, 1, out);
        ref_dequant_row(type, raw, N, ref);
        int bad = 0;
        for (int i = 0; i < N; i++) if ((double)out[i] != (double)(float)ref[i] && fabs(out[i] - ref[i]) > 1e-6) bad++;
        CHECK_MSG(bad == 0, "cb_weight_row_f32 %s: %d wrong", cb_type_name(type), bad);
    }
}

/* cb_big_alloc: zeroed, 64-byte aligned below 2 MiB and 2 MiB-aligned from
 * there (the huge-page advice), NULL instead of a wrapped size. */
static void test_big_alloc(void) {
    static const size_t sizes[] = { 0, 1, 100, (size_t)2 << 20, ((size_t)3 << 20) + 5 };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint8_t *p = cb_big_alloc(sizes[i]);
        CHECK_MSG(p != NULL, "cb_big_alloc(%zu) failed", sizes[i]);
        if (!p) continue;
        const size_t align = sizes[i] >= ((size_t)2 << 20) ? ((size_t)2 << 20) : 64;
        CHECK_MSG((uintptr_t)p % align == 0, "cb_big_alloc(%zu) not %zu-aligned", sizes[i], align);
        size_t nonzero = 0;
        for (size_t j = 0; j < sizes[i]; j++) nonzero += p[j] != 0;
        CHECK_MSG(nonzero == 0, "cb_big_alloc(%zu): %zu bytes not zeroed", sizes[i], nonzero);
        if (sizes[i]) p[sizes[i] - 1] = 1;  /* the whole size is usable */
        free(p);
    }
    CHECK(cb_big_alloc(SIZE_MAX) == NULL);
    CHECK(cb_big_alloc(SIZE_MAX - 100) == NULL);
}

static void test_hook_args(void) {
    float x[64] = {0}, y[4];
    uint8_t w[4 * 34 * 2] = {0};
    CHECK(cb_kernel_matmul(77, w, 1, 32, x, 1, y, CB_SIMD_SCALAR, 1) == CB_ERR_UNSUPPORTED);
    CHECK(cb_kernel_matmul(CB_TYPE_Q8_0, w, 1, 48, x, 1, y, CB_SIMD_SCALAR, 1) == CB_ERR_ARG);
    CHECK(cb_kernel_matmul(CB_TYPE_Q8_0, w, 0, 32, x, 1, y, CB_SIMD_SCALAR, 1) == CB_ERR_ARG);
    CHECK(cb_kernel_matmul(CB_TYPE_Q8_0, NULL, 1, 32, x, 1, y, CB_SIMD_SCALAR, 1) == CB_ERR_ARG);
    CHECK(cb_kernel_matmul(CB_TYPE_Q8_0, w, 1, 32, x, 1, y, 9, 1) == CB_ERR_ARG);
    CHECK(cb_kernel_matmul(CB_TYPE_Q8_0, w, 1, 32, x, 1, y, CB_SIMD_SCALAR, 0) == CB_ERR_ARG);
    for (int s = CB_SIMD_AVX2; s <= CB_SIMD_AVX512; s++)
        if (!cb_kernels_get(s)) CHECK(cb_kernel_matmul(CB_TYPE_Q8_0, w, 1, 32, x, 1, y, s, 1) == CB_ERR_UNSUPPORTED);
    CHECK(cb_kernel_matmul(CB_TYPE_Q8_0, w, 2, 64, x, 1, y, CB_SIMD_SCALAR, 1) == CB_OK);
    CHECK(y[0] == 0.0f && y[1] == 0.0f);
}

int main(void) {
    test_type_table();
    test_conversions();
    test_simd_names();
    test_row_dequant();
    test_hook_args();
    test_big_alloc();
    static const int shapes[][3] = {  /* n_out, n_in, n_rows */
        { 1, 32, 5 }, { 37, 64, 9 }, { 70, 576, 9 }, { 19, 1536, 6 }, { 5, 96, 3 },
    };
    for (int s = CB_SIMD_SCALAR; s <= CB_SIMD_AVX512; s++) {
        const cb_kernels *k = cb_kernels_get(s);
        if (!k) { printf("simd %s: not available, skipped\n", cb_simd_name(s)); continue; }
        test_quantize_act(k);
        test_attention(k);
        test_norm_swiglu(k);
        test_rope(k);
        test_argmax(k);
        for (int t = 0; t < N_TYPES; t++)
            for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
                test_matmul_shape(k, types[t], shapes[i][0], shapes[i][1], shapes[i][2]);
        /* float weights with n_in not a multiple of 16: masked tails */
        test_matmul_shape(k, CB_TYPE_F32, 9, 37, 5);
        test_matmul_shape(k, CB_TYPE_F16, 6, 21, 4);
        test_matmul_shape(k, CB_TYPE_BF16, 3, 13, 5);
    }
    /* Long rows, and the AVX-512 per-call Q4_0 / Q8_0 corrections, kept for
     * row groups of PC_MAX / blocks rows (80 rows at 48 blocks: 90 rows take
     * two groups); rows past CB_PACK_MAX_BLOCKS have no panel layout and
     * take the AVX2 kernel.  Every path must give the single-row bits. */
    for (int s = CB_SIMD_SCALAR; s <= CB_SIMD_AVX512; s++) {
        const cb_kernels *k = cb_kernels_get(s);
        if (k) { test_matmul_shape(k, CB_TYPE_Q4_1, 6, 32 * 300, 5); test_matmul_shape(k, CB_TYPE_Q8_0, 5, 32 * 270, 2); }
    }
    for (int s = CB_SIMD_SCALAR; s <= CB_SIMD_AVX512; s++) {
        const cb_kernels *k = cb_kernels_get(s);
        if (!k) continue;
        test_matmul_shape(k, CB_TYPE_Q8_0, 6, 1536, 12);
        test_matmul_shape(k, CB_TYPE_Q4_0, 6, 1536, 12);
        test_matmul_shape(k, CB_TYPE_Q4_1, 5, 1536, 90);
        test_matmul_shape(k, CB_TYPE_Q8_0, 21, 1536, 90);
        test_matmul_shape(k, CB_TYPE_Q4_1, 3, 32 * 4100, 2);
        test_matmul_shape(k, CB_TYPE_Q4_0, 3, 32 * 4100, 2);
    }
    for (int s = CB_SIMD_SCALAR; s <= CB_SIMD_AVX512; s++) {
        const cb_kernels *k = cb_kernels_get(s);
        if (!k) continue;
        test_matmul_multi(k, 576, 1);    /* decode: thread-local quantization */
        test_matmul_multi(k, 576, 7);
        test_matmul_multi(k, 96, 300);   /* shared scratch quantized by a pool run */
    }
    return cb_test_report("test_kernels");
}
