/*
 * test_sampler.c — the token sampler (native/src/sampler.c).
 *
 * Expected values are computed here by independent, deliberately naive
 * reference code (double-precision log-softmax, full qsort, O(n^2) counting)
 * or by hand in the comments; statistical checks use fixed seeds and
 * chi-square bounds at p = 0.001, so a correct sampler passes them and a
 * wrong distribution (e.g. temperature ignored, top-k leaking) fails.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"
#include "testutil.h"

#define BIGV 49152

/* Params built here (not via cb_sampling_default_params, which lives in the
 * engine) so this test links against sampler.c alone. */
static cb_sampling_params params(float temp) {
    cb_sampling_params p;
    memset(&p, 0, sizeof p);
    p.temperature = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.seed = 1;
    return p;
}

/* Independent generator for test data (not the RNG under test). */
static uint64_t lcg_state = 0x1234567ULL;
static double lcg_uniform(void) {
    lcg_state = lcg_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(lcg_state >> 11) * (1.0 / 9007199254740992.0);
}
static float lcg_normal(void) {
    double u1 = lcg_uniform(), u2 = lcg_uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Reference log-softmax in double over the finite entries. */
static void ref_logsoftmax(const float *l, int n, double *out) {
    double m = -INFINITY;
    for (int i = 0; i < n; i++) if (l[i] > m) m = l[i];
    double s = 0.0;
    for (int i = 0; i < n; i++) s += exp((double)l[i] - m);
    double lse = m + log(s);
    for (int i = 0; i < n; i++) out[i] = (double)l[i] - lse;
}

static float lp_of(const cb_sample_result *r, int tok) {
    for (int j = 0; j < r->n_top; j++) if (r->top_tokens[j] == tok) return r->top_logprobs[j];
    return NAN;
}

static void set_bit(uint32_t *mask, int i) { mask[i >> 5] |= 1u << (i & 31); }

/* ------------------------------------------------------------------ RNG */

static void test_rng(void) {
    /* Known answers from an independent Python implementation of the
     * reference algorithms; the seeded state for seed 0 is splitmix64's
     * published first four outputs (e220a8397b1dcdaf, 6e789e6aa1b965f4, ...). */
    cb_rng r;
    cb_rng_seed(&r, 0);
    CHECK(r.s[0] == 0xe220a8397b1dcdafULL);
    CHECK(r.s[1] == 0x6e789e6aa1b965f4ULL);
    CHECK(r.s[2] == 0x06c45d188009454fULL);
    CHECK(r.s[3] == 0xf88bb8a8724c81ecULL);
    CHECK(cb_rng_next(&r) == 0x99ec5f36cb75f2b4ULL);
    CHECK(cb_rng_next(&r) == 0xbf6e1f784956452aULL);
    CHECK(cb_rng_next(&r) == 0x1a5f849d4933e6e0ULL);
    cb_rng_seed(&r, 42);
    CHECK(cb_rng_next(&r) == 0x15780b2e0c2ec716ULL);
    CHECK(cb_rng_next(&r) == 0x6104d9866d113a7eULL);
    CHECK(cb_rng_next(&r) == 0xae17533239e499a1ULL);

    /* uniform in [0, 1), mean ~ 0.5 (sd of the mean over 10000 = 0.0029) */
    cb_rng_seed(&r, 7);
    double sum = 0.0, lo = 1.0, hi = 0.0;
    for (int i = 0; i < 10000; i++) {
        double u = cb_rng_uniform(&r);
        sum += u;
        if (u < lo) lo = u;
        if (u > hi) hi = u;
    }
    CHECK(lo >= 0.0 && hi < 1.0);
    CHECK_MSG(fabs(sum / 10000 - 0.5) < 0.015, "mean %f", sum / 10000);
}

/* --------------------------------------------------------------- greedy */

static void test_greedy(cb_sampler_scratch *s) {
    cb_sampling_params p = params(0.0f);
    cb_sample_result r;
    float l[8] = {0.1f, -2.0f, 3.5f, 1.0f, 3.4f, 0.0f, -1.0f, 2.0f};
    CHECK(cb_sample(&p, NULL, s, l, NULL, 0, NULL, &r) == CB_OK);   /* greedy needs no RNG */
    CHECK(r.token == 2);

    /* ties: lowest id wins */
    float t[8] = {1.0f, 5.0f, 2.0f, 5.0f, 5.0f, -1.0f, 0.0f, 5.0f};
    CHECK(cb_sample(&p, NULL, s, t, NULL, 0, NULL, &r) == CB_OK);
    CHECK(r.token == 1);

    /* the logits row is read only */
    float copy[8];
    memcpy(copy, l, sizeof l);
    p.n_logprobs = 3;
    CHECK(cb_sample(&p, NULL, s, l, NULL, 0, NULL, &r) == CB_OK);
    CHECK(memcmp(copy, l, sizeof l) == 0);

    /* a greedy call does not advance the RNG */
    cb_rng a, b;
    cb_rng_seed(&a, 5);
    b = a;
    CHECK(cb_sample(&p, &a, s, l, NULL, 0, NULL, &r) == CB_OK);
    CHECK(memcmp(&a, &b, sizeof a) == 0);

    /* NaN logits are never picked; +inf is the max */
    float nanrow[8] = {NAN, 1.0f, NAN, 2.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    p.n_logprobs = 0;
    CHECK(cb_sample(&p, NULL, s, nanrow, NULL, 0, NULL, &r) == CB_OK);
    CHECK(r.token == 3);
    float infrow[8] = {0.0f, 1.0f, INFINITY, 2.0f, INFINITY, 0.0f, 0.0f, 0.0f};
    CHECK(cb_sample(&p, NULL, s, infrow, NULL, 0, NULL, &r) == CB_OK);
    CHECK(r.token == 2);
    CHECK(isnan(r.logprob));  /* greedy without logprobs skips the log-softmax */
    p.n_logprobs = 1;
    CHECK(cb_sample(&p, NULL, s, infrow, NULL, 0, NULL, &r) == CB_OK);
    CHECK(r.token == 2);
    CHECK(isfinite(r.logprob) && fabsf(r.logprob - logf(0.5f)) < 1e-5f);  /* two tied +inf share */
    p.n_logprobs = 0;
}

/* ------------------------------------------------------- bias and mask */

static void test_bias_mask(cb_sampler_scratch *s) {
    cb_sample_result r;
    float l[8] = {0.1f, -2.0f, 3.5f, 1.0f, 3.4f, 0.0f, -1.0f, 2.0f};
    cb_sampling_params p = params(0.0f);
    int32_t bt[2] = {2, 6};
    float bv[2] = {-INFINITY, 10.0f};

    /* ban the argmax: the runner-up wins */
    p.n_logit_bias = 1; p.logit_bias_tokens = bt; p.logit_bias_values = bv;
    CHECK(cb_sample(&p, NULL, s, l, NULL, 0, NULL, &r) == CB_OK);
    CHECK(r.token == 4);
    /* a positive bias is added: -1 + 10 = 9 beats everything */
    p.n_logit_bias = 2;
    p.n_logprobs = 8;
    CHECK(cb_sample(&p, NULL, s, l, NULL, 0, NULL, &r) == CB_OK);
    CHECK(r.token == 6);
    CHECK(r.n_top == 7);                         /* the banned token is not listed */
    CHECK(isnan(lp_of(&r, 2)));
    CHECK(fabsf((lp_of(&r, 6) - lp_of(&r, 0)) - (9.0f - 0.1f)) < 1e-4f);

    /* a banned token is never sampled, even at a high temperature */
    cb_rng rng;
    cb_rng_seed(&rng, 3);
    p = params(5.0f);
    p.n_logit_bias = 1; p.logit_bias_tokens = bt; p.logit_bias_values = bv;
    int seen2 = 0, seen_other = 0;
    for (int i = 0; i < 500; i++) {
        CHECK(cb_sample(&p, &rng, s, l, NULL, 0, NULL, &r) == CB_OK);
        if (r.token == 2) seen2++; else seen_other++;
    }
    CHECK(seen2 == 0 && seen_other == 500);

    /* grammar mask: only 1, 5 and 7 allowed; greedy takes 7 (2.0) */
    uint32_t mask[1] = {0};
    set_bit(mask, 1); set_bit(mask, 5); set_bit(mask, 7);
    p = params(0.0f);
    p.n_logprobs = 8;
    CHECK(cb_sample(&p, NULL, s, l, NULL, 0, mask, &r) == CB_OK);
    CHECK(r.token == 7);
    CHECK(r.n_top == 3);
    /* logprob renormalises over the allowed set only */
    double e = exp(-2.0) + exp(0.0) + exp(2.0);
    CHECK(fabs(r.logprob - (2.0 - log(e))) < 1e-5);
    /* a +inf bias cannot resurrect a masked token */
    float inf_bias[1] = {INFINITY};
    int32_t inf_tok[1] = {2};
    p.n_logit_bias = 1; p.logit_bias_tokens = inf_tok; p.logit_bias_values = inf_bias;
    CHECK(cb_sample(&p, NULL, s, l, NULL, 0, mask, &r) == CB_OK);
    CHECK(r.token == 7);
    /* ...but on an allowed token it forces it */
    CHECK(cb_sample(&p, NULL, s, l, NULL, 0, NULL, &r) == CB_OK);
    CHECK(r.token == 2);
    CHECK(fabsf(r.logprob) < 1e-6f);

    /* sampled under the mask: only allowed tokens appear */
    p = params(1.0f);
    cb_rng_seed(&rng, 11);
    int bad = 0;
    for (int i = 0; i < 500; i++) {
        CHECK(cb_sample(&p, &rng, s, l, NULL, 0, mask, &r) == CB_OK);
        if (r.token != 1 && r.token != 5 && r.token != 7) bad++;
    }
    CHECK(bad == 0);

    /* everything forbidden: an error, never a token */
    uint32_t none[1] = {0};
    p = params(0.0f);
    CHECK(cb_sample(&p, NULL, s, l, NULL, 0, none, &r) == CB_ERR_ARG);
    CHECK(r.token == -1);
    p = params(1.0f);
    CHECK(cb_sample(&p, &rng, s, l, NULL, 0, none, &r) == CB_ERR_ARG);
    CHECK(r.token == -1);
    /* ...also when the bias bans the only allowed tokens */
    int32_t bt3[3] = {1, 5, 7};
    float bv3[3] = {-INFINITY, -INFINITY, -INFINITY};
    p.n_logit_bias = 3; p.logit_bias_tokens = bt3; p.logit_bias_values = bv3;
    CHECK(cb_sample(&p, &rng, s, l, NULL, 0, mask, &r) == CB_ERR_ARG);
    float allnan[8] = {NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN};
    p = params(0.0f);
    CHECK(cb_sample(&p, NULL, s, allnan, NULL, 0, NULL, &r) == CB_ERR_ARG);
}

/* ------------------------------------------------------------ penalties */

/* Naive reference: penalised copy of l for the last `last_n` of hist. */
static void ref_penalise(const float *l, float *out, int n, const int32_t *hist, int nh,
                         int last_n, float rep, float freq, float pres) {
    memcpy(out, l, (size_t)n * sizeof *l);
    int start = last_n < 0 ? 0 : (nh - last_n > 0 ? nh - last_n : 0);
    if (last_n == 0) return;
    for (int t = 0; t < n; t++) {
        int c = 0;
        for (int i = start; i < nh; i++) c += hist[i] == t;
        if (!c) continue;
        float x = out[t];
        x = x > 0 ? x / rep : x * rep;
        out[t] = x - c * freq - pres;
    }
}

static void check_penalty_case(cb_sampler_scratch *s, const float *l, const int32_t *h, int nh,
                               int last_n, float rep, float freq, float pres) {
    cb_sampling_params p = params(0.0f);
    p.repeat_penalty = rep; p.frequency_penalty = freq; p.presence_penalty = pres;
    p.repeat_last_n = last_n;
    p.n_logprobs = 8;
    cb_sample_result r;
    CHECK(cb_sample(&p, NULL, s, l, h, nh, NULL, &r) == CB_OK);
    float ref[8];
    double lref[8];
    ref_penalise(l, ref, 8, h, nh, last_n, rep, freq, pres);
    ref_logsoftmax(ref, 8, lref);
    int arg = 0;
    for (int i = 1; i < 8; i++) if (ref[i] > ref[arg]) arg = i;
    CHECK_MSG(r.token == arg, "rep %g freq %g pres %g last %d: token %d want %d",
              rep, freq, pres, last_n, r.token, arg);
    CHECK(r.n_top == 8);
    for (int t = 0; t < 8; t++)
        CHECK_MSG(fabs(lp_of(&r, t) - lref[t]) < 1e-5, "tok %d lp %f ref %f", t, lp_of(&r, t), lref[t]);
}

static void test_penalties(cb_sampler_scratch *s) {
    const float l[8] = {1.0f, 2.0f, 3.0f, -1.0f, 0.5f, 2.5f, 0.0f, -2.0f};
    const int32_t h[5] = {2, 3, 2, 2, 6};
    cb_sampling_params p = params(0.0f);
    p.n_logprobs = 8;
    p.repeat_last_n = -1;
    cb_sample_result r;

    /* hand-computed: repeat 2 divides 3 -> 1.5 once (not per occurrence),
     * multiplies -1 -> -2, leaves 0 at 0; argmax moves from 2 to 5 */
    CHECK(cb_sample(&p, NULL, s, l, h, 5, NULL, &r) == CB_OK);
    CHECK(r.token == 2);
    p.repeat_penalty = 2.0f;
    CHECK(cb_sample(&p, NULL, s, l, h, 5, NULL, &r) == CB_OK);
    CHECK(r.token == 5);
    CHECK(fabsf((lp_of(&r, 2) - lp_of(&r, 0)) - 0.5f) < 1e-5f);
    CHECK(fabsf((lp_of(&r, 3) - lp_of(&r, 0)) - (-3.0f)) < 1e-5f);
    CHECK(fabsf((lp_of(&r, 6) - lp_of(&r, 0)) - (-1.0f)) < 1e-5f);
    CHECK(fabsf((lp_of(&r, 5) - lp_of(&r, 0)) - 1.5f) < 1e-5f);   /* untouched */

    /* frequency 0.5: token 2 seen 3 times -> 3 - 1.5 */
    p.repeat_penalty = 1.0f; p.frequency_penalty = 0.5f;
    CHECK(cb_sample(&p, NULL, s, l, h, 5, NULL, &r) == CB_OK);
    CHECK(fabsf((lp_of(&r, 2) - lp_of(&r, 0)) - 0.5f) < 1e-5f);
    CHECK(fabsf((lp_of(&r, 3) - lp_of(&r, 0)) - (-2.5f)) < 1e-5f);
    /* presence 0.7: once per distinct token */
    p.frequency_penalty = 0.0f; p.presence_penalty = 0.7f;
    CHECK(cb_sample(&p, NULL, s, l, h, 5, NULL, &r) == CB_OK);
    CHECK(fabsf((lp_of(&r, 2) - lp_of(&r, 0)) - 1.3f) < 1e-5f);
    CHECK(fabsf((lp_of(&r, 6) - lp_of(&r, 0)) - (-1.7f)) < 1e-5f);
    CHECK(r.token == 5);        /* 2.3 < 2.5 */

    /* window of 2 (tokens 2, 6): 3 untouched; 2 counted once */
    p.presence_penalty = 0.0f; p.frequency_penalty = 0.5f; p.repeat_last_n = 2;
    CHECK(cb_sample(&p, NULL, s, l, h, 5, NULL, &r) == CB_OK);
    CHECK(fabsf((lp_of(&r, 2) - lp_of(&r, 0)) - 1.5f) < 1e-5f);
    CHECK(fabsf((lp_of(&r, 3) - lp_of(&r, 0)) - (-2.0f)) < 1e-5f);
    /* window 0: no penalties at all */
    p.repeat_last_n = 0; p.repeat_penalty = 3.0f; p.presence_penalty = 1.0f;
    CHECK(cb_sample(&p, NULL, s, l, h, 5, NULL, &r) == CB_OK);
    CHECK(r.token == 2);
    CHECK(fabsf((lp_of(&r, 2) - lp_of(&r, 0)) - 2.0f) < 1e-5f);

    /* combinations against the naive reference */
    const int lasts[4] = {-1, 0, 1, 3};
    for (int a = 0; a < 4; a++) {
        check_penalty_case(s, l, h, 5, lasts[a], 2.0f, 0.5f, 0.7f);
        check_penalty_case(s, l, h, 5, lasts[a], 1.3f, 0.0f, 0.0f);
        check_penalty_case(s, l, h, 5, lasts[a], 1.0f, 1.1f, -0.4f);
        check_penalty_case(s, l, h, 5, lasts[a], 0.8f, 0.2f, 0.3f);   /* < 1 favours repeats */
    }
    /* history ids out of range are ignored, not indexed */
    const int32_t hbad[4] = {-5, 2, 1000000, 2};
    check_penalty_case(s, l, hbad + 1, 1, -1, 2.0f, 0.0f, 0.0f);
    p = params(0.0f);
    p.repeat_penalty = 2.0f; p.repeat_last_n = -1; p.n_logprobs = 8;
    CHECK(cb_sample(&p, NULL, s, l, hbad, 4, NULL, &r) == CB_OK);
    CHECK(fabsf((lp_of(&r, 2) - lp_of(&r, 0)) - 0.5f) < 1e-5f);
}

/* ------------------------------------------------------------- logprobs */

static const float *g_sort_logits;
static int cmp_desc(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    float lx = g_sort_logits[x], ly = g_sort_logits[y];
    if (lx > ly) return -1;
    if (lx < ly) return 1;
    return (x > y) - (x < y);
}

static void test_logprobs(cb_sampler_scratch *s8, cb_sampler_scratch *sb) {
    cb_sample_result r;
    cb_sampling_params p = params(0.0f);
    p.n_logprobs = 8;
    float l[8] = {0.3f, -1.2f, 2.2f, 2.2f, 0.0f, -7.0f, 1.1f, 0.9f};
    CHECK(cb_sample(&p, NULL, s8, l, NULL, 0, NULL, &r) == CB_OK);
    CHECK(r.n_top == 8);
    double tot = 0.0;
    for (int j = 0; j < r.n_top; j++) tot += exp(r.top_logprobs[j]);
    CHECK_MSG(fabs(tot - 1.0) < 1e-5, "sum %f", tot);
    CHECK(r.top_tokens[0] == 2 && r.top_tokens[1] == 3);       /* tie: lower id first */
    CHECK(r.token == 2 && r.logprob == r.top_logprobs[0]);
    for (int j = 1; j < r.n_top; j++) CHECK(r.top_logprobs[j] <= r.top_logprobs[j - 1]);

    /* stability: +80 overflows a naive float exp, +1e4 too; logprobs unchanged */
    double ref[8];
    ref_logsoftmax(l, 8, ref);
    const float offs[3] = {80.0f, 1e4f, -1e4f};
    for (int o = 0; o < 3; o++) {
        float sh[8];
        for (int i = 0; i < 8; i++) sh[i] = l[i] + offs[o];
        CHECK(cb_sample(&p, NULL, s8, sh, NULL, 0, NULL, &r) == CB_OK);
        for (int t = 0; t < 8; t++)
            CHECK_MSG(fabs(lp_of(&r, t) - ref[t]) < 2e-3, "off %g tok %d: %f vs %f", offs[o], t, lp_of(&r, t), ref[t]);
    }
    /* logprobs do not depend on temperature / top-k / top-p */
    p = params(0.7f);
    p.top_k = 2; p.top_p = 0.5f; p.n_logprobs = 8;
    cb_rng rng;
    cb_rng_seed(&rng, 1);
    CHECK(cb_sample(&p, &rng, s8, l, NULL, 0, NULL, &r) == CB_OK);
    for (int t = 0; t < 8; t++) CHECK(fabs(lp_of(&r, t) - ref[t]) < 1e-5);
    CHECK(fabs(r.logprob - ref[r.token]) < 1e-5);
    /* n_logprobs limits the list; 0 gives none */
    p.n_logprobs = 3;
    CHECK(cb_sample(&p, &rng, s8, l, NULL, 0, NULL, &r) == CB_OK);
    CHECK(r.n_top == 3 && r.top_tokens[2] == 6);
    p.n_logprobs = 0;
    CHECK(cb_sample(&p, &rng, s8, l, NULL, 0, NULL, &r) == CB_OK);
    CHECK(r.n_top == 0);

    /* full vocabulary against a double reference and a full sort */
    float *big = malloc(BIGV * sizeof *big);
    double *bref = malloc(BIGV * sizeof *bref);
    int *order = malloc(BIGV * sizeof *order);
    for (int i = 0; i < BIGV; i++) big[i] = 3.0f * lcg_normal();
    big[777] = big[12345] = 20.0f;       /* a tie at the top */
    big[40000] = 19.0f;
    ref_logsoftmax(big, BIGV, bref);
    for (int i = 0; i < BIGV; i++) order[i] = i;
    g_sort_logits = big;
    qsort(order, BIGV, sizeof *order, cmp_desc);
    p = params(0.0f);
    p.n_logprobs = CB_MAX_LOGPROBS;
    CHECK(cb_sample(&p, NULL, sb, big, NULL, 0, NULL, &r) == CB_OK);
    CHECK(r.token == 777);
    CHECK(fabs(r.logprob - bref[777]) < 1e-4);
    CHECK(r.n_top == CB_MAX_LOGPROBS);
    for (int j = 0; j < r.n_top; j++) {
        CHECK_MSG(r.top_tokens[j] == order[j], "rank %d: %d vs %d", j, r.top_tokens[j], order[j]);
        CHECK(fabs(r.top_logprobs[j] - bref[order[j]]) < 1e-4);
    }
    free(big); free(bref); free(order);
}

/* ------------------------------------------------- truncation equivalences */

static void test_equivalences(cb_sampler_scratch *s) {
    cb_sample_result g, r;
    cb_rng rng;
    cb_rng_seed(&rng, 99);
    float l[8] = {0.3f, 1.7f, -0.2f, 1.7f, 1.69f, 0.0f, 1.0f, 1.5f};
    cb_sampling_params p = params(0.0f);
    CHECK(cb_sample(&p, NULL, s, l, NULL, 0, NULL, &g) == CB_OK);
    CHECK(g.token == 1);
    const float temps[5] = {0.1f, 0.5f, 1.0f, 3.0f, 100.0f};
    for (int t = 0; t < 5; t++) {
        for (int i = 0; i < 50; i++) {
            p = params(temps[t]);
            p.top_k = 1;
            CHECK(cb_sample(&p, &rng, s, l, NULL, 0, NULL, &r) == CB_OK);
            CHECK_MSG(r.token == g.token, "top-k 1 at T=%g gave %d", temps[t], r.token);
            p = params(temps[t]);
            p.top_p = 1e-6f;
            CHECK(cb_sample(&p, &rng, s, l, NULL, 0, NULL, &r) == CB_OK);
            CHECK_MSG(r.token == g.token, "top-p tiny at T=%g gave %d", temps[t], r.token);
            p.top_p = 0.0f;
            CHECK(cb_sample(&p, &rng, s, l, NULL, 0, NULL, &r) == CB_OK);
            CHECK(r.token == g.token);
            /* min-p 1 keeps only the max */
            p = params(temps[t]);
            p.min_p = 1.0f;
            CHECK(cb_sample(&p, &rng, s, l, NULL, 0, NULL, &r) == CB_OK);
            CHECK(r.token == 1 || r.token == 3);     /* the two tied maxima */
        }
    }
    /* a tiny temperature behaves like greedy (no NaN from 1/T) */
    p = params(1e-30f);
    for (int i = 0; i < 20; i++) {
        CHECK(cb_sample(&p, &rng, s, l, NULL, 0, NULL, &r) == CB_OK);
        CHECK(r.token == 1 || r.token == 3);
    }
}

/* ---------------------------------------------------------- distributions */

/* Draw n tokens and return the chi-square statistic of the counts against
 * the expected probabilities `pe` (tokens with pe == 0 must never appear:
 * *leaks counts them). */
static double draw_chi2(cb_sampler_scratch *s, const cb_sampling_params *p, uint64_t seed,
                        const float *l, const double *pe, int nv, int n, int *leaks) {
    cb_rng rng;
    cb_rng_seed(&rng, seed);
    int cnt[8] = {0};
    cb_sample_result r;
    for (int i = 0; i < n; i++) {
        if (cb_sample(p, &rng, s, l, NULL, 0, NULL, &r) != CB_OK || r.token < 0 || r.token >= nv) {
            (*leaks)++;
            continue;
        }
        cnt[r.token]++;
    }
    double chi = 0.0;
    for (int t = 0; t < nv; t++) {
        if (pe[t] == 0.0) { *leaks += cnt[t]; continue; }
        double e = n * pe[t];
        chi += (cnt[t] - e) * (cnt[t] - e) / e;
    }
    return chi;
}

/* Reference softmax at temperature T restricted to `keep` (NULL = all). */
static void ref_probs(const float *l, int nv, double T, const int *keep, double *pe) {
    double m = -INFINITY, z = 0.0;
    for (int t = 0; t < nv; t++) if ((!keep || keep[t]) && l[t] > m) m = l[t];
    for (int t = 0; t < nv; t++) { pe[t] = (!keep || keep[t]) ? exp((l[t] - m) / T) : 0.0; z += pe[t]; }
    for (int t = 0; t < nv; t++) pe[t] /= z;
}

static void test_distributions(cb_sampler_scratch *s) {
    const float l[8] = {0.5f, 1.2f, -0.3f, 0.9f, 0.0f, 1.5f, -1.0f, 0.2f};
    double pe[8];
    int leaks;
    cb_sampling_params p;
    const int N = 20000;
    /* chi-square critical values at p = 0.001: df 7 -> 24.32, 2 -> 13.82, 1 -> 10.83 */

    p = params(1.0f);
    ref_probs(l, 8, 1.0, NULL, pe);
    leaks = 0;
    double chi = draw_chi2(s, &p, 1234, l, pe, 8, N, &leaks);
    CHECK_MSG(chi < 24.32 && leaks == 0, "T=1 chi2 %f leaks %d", chi, leaks);
    /* the same counts are far from the T=0.5 distribution: the test has teeth */
    double pe_half[8];
    ref_probs(l, 8, 0.5, NULL, pe_half);
    leaks = 0;
    chi = draw_chi2(s, &p, 1234, l, pe_half, 8, N, &leaks);
    CHECK_MSG(chi > 100.0, "T=1 draws vs T=0.5 probs: chi2 only %f", chi);

    p = params(0.5f);
    leaks = 0;
    chi = draw_chi2(s, &p, 4321, l, pe_half, 8, N, &leaks);
    CHECK_MSG(chi < 24.32 && leaks == 0, "T=0.5 chi2 %f leaks %d", chi, leaks);

    /* top-k 3: tokens 5, 1, 3 only, renormalised */
    int keep[8] = {0, 1, 0, 1, 0, 1, 0, 0};
    p = params(1.0f);
    p.top_k = 3;
    ref_probs(l, 8, 1.0, keep, pe);
    leaks = 0;
    chi = draw_chi2(s, &p, 777, l, pe, 8, N, &leaks);
    CHECK_MSG(chi < 13.82 && leaks == 0, "top-k 3 chi2 %f leaks %d", chi, leaks);

    /* top-p 0.7 on p = .5 .3 .15 .05 (ids permuted): keeps the .5 and .3 */
    float lp[8];
    const int ids[4] = {6, 1, 4, 0};
    const double pw[4] = {0.5, 0.3, 0.15, 0.05};
    for (int t = 0; t < 8; t++) lp[t] = -INFINITY;
    for (int j = 0; j < 4; j++) lp[ids[j]] = (float)log(pw[j]);
    p = params(1.0f);
    p.top_p = 0.7f;
    int keep_p[8] = {0};
    keep_p[6] = keep_p[1] = 1;
    ref_probs(lp, 8, 1.0, keep_p, pe);
    leaks = 0;
    chi = draw_chi2(s, &p, 55, lp, pe, 8, 5000, &leaks);
    CHECK_MSG(chi < 10.83 && leaks == 0, "top-p chi2 %f leaks %d", chi, leaks);
    /* top-p 0.85 keeps three (cum .8 < .85 <= .95) */
    p.top_p = 0.85f;
    keep_p[4] = 1;
    ref_probs(lp, 8, 1.0, keep_p, pe);
    leaks = 0;
    chi = draw_chi2(s, &p, 56, lp, pe, 8, 5000, &leaks);
    CHECK_MSG(chi < 13.82 && leaks == 0, "top-p .85 chi2 %f leaks %d", chi, leaks);

    /* min-p 0.2 on the same: cut = 0.1 -> drops .05; keeps .5 .3 .15 */
    p = params(1.0f);
    p.min_p = 0.2f;
    leaks = 0;
    chi = draw_chi2(s, &p, 57, lp, pe, 8, 5000, &leaks);
    CHECK_MSG(chi < 13.82 && leaks == 0, "min-p chi2 %f leaks %d", chi, leaks);
    /* min-p 0.5: cut .25 keeps .5 and .3 */
    p.min_p = 0.5f;
    keep_p[4] = 0;
    ref_probs(lp, 8, 1.0, keep_p, pe);
    leaks = 0;
    chi = draw_chi2(s, &p, 58, lp, pe, 8, 5000, &leaks);
    CHECK_MSG(chi < 10.83 && leaks == 0, "min-p .5 chi2 %f leaks %d", chi, leaks);
    /* min-p applies after temperature: at T = 2 the probs are ∝ sqrt(p),
     * .707 .548 .387 .224 -> cut .5*.707 = .354 keeps three */
    p.temperature = 2.0f;
    keep_p[4] = 1;
    ref_probs(lp, 8, 2.0, keep_p, pe);
    leaks = 0;
    chi = draw_chi2(s, &p, 59, lp, pe, 8, 5000, &leaks);
    CHECK_MSG(chi < 13.82 && leaks == 0, "min-p T=2 chi2 %f leaks %d", chi, leaks);
}

/* -------------------------------------------------------- determinism */

static void run_sequence(cb_sampler_scratch *s, uint64_t seed, int32_t *toks, int n) {
    cb_sampling_params p = params(0.9f);
    p.top_k = 5; p.top_p = 0.95f; p.repeat_penalty = 1.1f; p.frequency_penalty = 0.1f;
    p.seed = seed;
    cb_rng rng;
    cb_rng_seed(&rng, seed);
    float l[8];
    for (int i = 0; i < n; i++) {
        for (int t = 0; t < 8; t++) l[t] = (float)sin(0.7 * i + t) + 0.1f * t;
        cb_sample_result r;
        if (cb_sample(&p, &rng, s, l, toks, i, NULL, &r) != CB_OK) { toks[i] = -1; continue; }
        toks[i] = r.token;
    }
}

static void test_determinism(cb_sampler_scratch *s) {
    int32_t a[64], b[64], c[64];
    run_sequence(s, 2024, a, 64);
    run_sequence(s, 2024, b, 64);
    run_sequence(s, 2025, c, 64);
    CHECK(memcmp(a, b, sizeof a) == 0);
    int diff = 0, bad = 0;
    for (int i = 0; i < 64; i++) { diff += a[i] != c[i]; bad += a[i] < 0 || a[i] >= 8; }
    CHECK_MSG(diff > 0, "seeds 2024 and 2025 gave the same 64 tokens");
    CHECK(bad == 0);
}

/* ------------------------------------------------------ full vocabulary */

static void test_big_vocab(cb_sampler_scratch *s) {
    float *l = malloc(BIGV * sizeof *l);
    int *order = malloc(BIGV * sizeof *order);
    int *rank = malloc(BIGV * sizeof *rank);
    int32_t *hist = malloc(300 * sizeof *hist);
    for (int i = 0; i < BIGV; i++) l[i] = 2.0f * lcg_normal();
    for (int i = 0; i < 300; i++) hist[i] = (int32_t)(lcg_uniform() * BIGV);
    cb_rng rng;
    cb_rng_seed(&rng, 8);
    cb_sample_result r;

    /* greedy == argmax */
    int arg = 0;
    for (int i = 1; i < BIGV; i++) if (l[i] > l[arg]) arg = i;
    cb_sampling_params p = params(0.0f);
    p.n_logprobs = 5;
    CHECK(cb_sample(&p, NULL, s, l, NULL, 0, NULL, &r) == CB_OK);
    CHECK(r.token == arg && r.n_top == 5 && r.top_tokens[0] == arg);

    /* plain sampling, sampling with penalties + typical chat settings */
    p = params(1.0f);
    CHECK(cb_sample(&p, &rng, s, l, NULL, 0, NULL, &r) == CB_OK);
    CHECK(r.token >= 0 && r.token < BIGV);
    p = params(0.8f);
    p.top_k = 40; p.top_p = 0.95f; p.min_p = 0.05f; p.repeat_penalty = 1.1f; p.repeat_last_n = 64;
    p.n_logprobs = CB_MAX_LOGPROBS;
    g_sort_logits = l;
    for (int i = 0; i < BIGV; i++) order[i] = i;
    qsort(order, BIGV, sizeof *order, cmp_desc);
    for (int i = 0; i < BIGV; i++) rank[order[i]] = i;
    int worst = 0;
    for (int i = 0; i < 50; i++) {
        CHECK(cb_sample(&p, &rng, s, l, NULL, 0, NULL, &r) == CB_OK);
        if (r.token >= 0 && r.token < BIGV && rank[r.token] > worst) worst = rank[r.token];
    }
    CHECK_MSG(worst < 40, "top-k 40 drew rank %d", worst);
    CHECK(cb_sample(&p, &rng, s, l, hist, 300, NULL, &r) == CB_OK);

    /* top-k alone, through both selection paths (small k: heap, large k:
     * quickselect): never beyond rank k, and reaching deep into the top k */
    const int ks[3] = {40, 513, 1000};
    for (int c = 0; c < 3; c++) {
        p = params(1.0f);
        p.top_k = ks[c];
        int maxrank = 0;
        for (int i = 0; i < 100; i++) {
            CHECK(cb_sample(&p, &rng, s, l, NULL, 0, NULL, &r) == CB_OK);
            if (r.token >= 0 && r.token < BIGV && rank[r.token] > maxrank) maxrank = rank[r.token];
        }
        CHECK_MSG(maxrank < ks[c] && maxrank >= ks[c] / 4, "top-k %d: max rank %d", ks[c], maxrank);
    }

    /* top-p without top-k on a flat-ish distribution: the kept prefix is
     * thousands of tokens, so the partial sort must grow past its first
     * chunk.  Reference cut from a full sort in double. */
    const float tps[2] = {0.9f, 0.6f};
    for (int c = 0; c < 2; c++) {
        double z = 0.0, m = l[order[0]];
        for (int i = 0; i < BIGV; i++) z += exp(l[i] - m);
        double cum = 0.0;
        int K = BIGV;
        for (int i = 0; i < BIGV; i++) {
            cum += exp(l[order[i]] - m) / z;
            if (cum >= tps[c]) { K = i + 1; break; }
        }
        p = params(1.0f);
        p.top_p = tps[c];
        int maxrank = 0;
        for (int i = 0; i < 200; i++) {
            CHECK(cb_sample(&p, &rng, s, l, NULL, 0, NULL, &r) == CB_OK);
            if (r.token >= 0 && r.token < BIGV && rank[r.token] > maxrank) maxrank = rank[r.token];
        }
        /* +1: float vs double rounding may move the cut by one token */
        CHECK_MSG(maxrank <= K, "top-p %g: drew rank %d, cut %d", tps[c], maxrank, K);
        CHECK_MSG(K > 1024 && maxrank > 256, "top-p %g: cut %d, max rank %d (chunk growth not exercised)",
                  tps[c], K, maxrank);
    }

    /* peaked distribution: the cut falls inside the first chunk */
    for (int i = 0; i < BIGV; i++) l[i] *= 4.0f;
    {
        double z = 0.0, m = l[order[0]];
        for (int i = 0; i < BIGV; i++) z += exp(l[i] - m);
        double cum = 0.0;
        int K = BIGV;
        for (int i = 0; i < BIGV; i++) {
            cum += exp(l[order[i]] - m) / z;
            if (cum >= 0.8) { K = i + 1; break; }
        }
        p = params(1.0f);
        p.top_p = 0.8f;
        int maxrank = 0;
        for (int i = 0; i < 100; i++) {
            CHECK(cb_sample(&p, &rng, s, l, NULL, 0, NULL, &r) == CB_OK);
            if (rank[r.token] > maxrank) maxrank = rank[r.token];
        }
        CHECK_MSG(K < 256 && maxrank <= K, "peaked top-p: cut %d max rank %d", K, maxrank);
    }
    free(l); free(order); free(rank); free(hist);
}

/* ---------------------------------------------------------- bad arguments */

static void test_bad_args(cb_sampler_scratch *s) {
    cb_sample_result r;
    float l[8] = {0};
    cb_rng rng;
    cb_rng_seed(&rng, 1);
    cb_sampling_params p = params(1.0f);
    CHECK(cb_sample(NULL, &rng, s, l, NULL, 0, NULL, &r) == CB_ERR_ARG);
    CHECK(cb_sample(&p, &rng, s, NULL, NULL, 0, NULL, &r) == CB_ERR_ARG);
    CHECK(cb_sample(&p, &rng, s, l, NULL, 0, NULL, NULL) == CB_ERR_ARG);
    CHECK(cb_sample(&p, NULL, s, l, NULL, 0, NULL, &r) == CB_ERR_ARG);     /* sampling needs an RNG */
    CHECK(cb_sample(&p, &rng, s, l, NULL, 3, NULL, &r) == CB_ERR_ARG);     /* history missing */
    p.n_logit_bias = 2;
    CHECK(cb_sample(&p, &rng, s, l, NULL, 0, NULL, &r) == CB_ERR_ARG);     /* bias arrays missing */
    /* out-of-range bias ids are ignored */
    int32_t bt[2] = {-1, 8};
    float bv[2] = {5.0f, 5.0f};
    p.logit_bias_tokens = bt; p.logit_bias_values = bv;
    CHECK(cb_sample(&p, &rng, s, l, NULL, 0, NULL, &r) == CB_OK);
    cb_sampler_scratch bad;
    CHECK(cb_sampler_scratch_init(&bad, 0) == CB_ERR_ARG);
    CHECK(bad.logits == NULL);
    cb_sampler_scratch_free(&bad);
    CHECK(cb_sample(&p, &rng, &bad, l, NULL, 0, NULL, &r) == CB_ERR_ARG);
}

/* The greedy shortcut (no mask, bias, penalties or logprobs: argmax of the
 * raw row) must pick what the general path picks (forced by n_logprobs = 1,
 * or by a mask that allows everything), over rows with ties, NaN, -inf,
 * FLT_MAX and +inf scattered through the vectorized body and the tail. */
static void test_greedy_shortcut(cb_sampler_scratch *s) {
    const int n = s->n_vocab;
    float *l = malloc(sizeof(float) * (size_t)n);
    uint32_t *all = malloc(sizeof(uint32_t) * (size_t)((n + 31) / 32));
    for (int i = 0; i < (n + 31) / 32; i++) all[i] = 0xFFFFFFFFu;
    cb_sampling_params fast = params(0.0f), slow = params(0.0f);
    slow.n_logprobs = 1;
    int bad = 0;
    for (int it = 0; it < 400; it++) {
        for (int i = 0; i < n; i++) l[i] = (float)(int)(lcg_uniform() * 50) * 0.25f;  /* many ties */
        const int k = it % 8;
        for (int j = 0; j < 1 + it % 5; j++) {
            const int i = (int)(lcg_uniform() * n);
            l[i] = k == 0 ? NAN : k == 1 ? -INFINITY : k == 2 ? FLT_MAX : k == 3 ? INFINITY : 100.0f;
        }
        if (it % 11 == 0) for (int i = 0; i < n; i++) l[i] = it % 2 ? NAN : -INFINITY;
        cb_sample_result a, b, c;
        const int ra = cb_sample(&fast, NULL, s, l, NULL, 0, NULL, &a);
        const int rb = cb_sample(&slow, NULL, s, l, NULL, 0, NULL, &b);
        const int rc = cb_sample(&fast, NULL, s, l, NULL, 0, all, &c);
        if (ra != rb || ra != rc || (ra == CB_OK && (a.token != b.token || a.token != c.token))) bad++;
    }
    CHECK_MSG(bad == 0, "greedy shortcut differs from the general path on %d rows", bad);
    free(l); free(all);
}

int main(void) {
    cb_sampler_scratch s8, sb;
    CHECK(cb_sampler_scratch_init(&s8, 8) == CB_OK);
    CHECK(cb_sampler_scratch_init(&sb, BIGV) == CB_OK);
    test_rng();
    test_greedy(&s8);
    test_bias_mask(&s8);
    test_penalties(&s8);
    test_logprobs(&s8, &sb);
    test_equivalences(&s8);
    test_distributions(&s8);
    test_determinism(&s8);
    test_big_vocab(&sb);
    test_greedy_shortcut(&sb);
    test_bad_args(&s8);
    cb_sampler_scratch_free(&s8);
    cb_sampler_scratch_free(&sb);
    return cb_test_report("test_sampler");
}
