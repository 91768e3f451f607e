/*
 * score.c — log-softmax, target log-probability and top-n of logits rows
 * (see score.h).  Used by the engine's scoring requests: every prompt
 * position of a request with `score` set gets its row scored here, in the
 * step that computed it.
 */
#include "score.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* The sampler's working-copy rule: NaN cannot be scored (-inf), +inf is
 * clamped so x - max never sees inf - inf. */
static inline float clean(float x) {
    x = x != x ? -INFINITY : x;
    return x == INFINITY ? FLT_MAX : x;
}

/* a ranks before b: larger logit, lower id on ties (the sampler's order). */
static inline int before(float la, int a, float lb, int b) { return la > lb || (la == lb && a < b); }

enum { LANES = 16 };  /* independent lanes: the loops below vectorize at any SIMD width */

typedef union { float f; uint32_t u; int32_t i; } f32_bits;

/* e^x for x <= 0, x = -inf included: x = k ln2 + r with |r| <= ln2/2 (two-
 * part ln2), Cephes' expf polynomial for e^r (about 1 ulp), 2^k written into
 * the exponent.  x below -87 is taken as -87 (e^-87 = 1.6e-38: nothing next
 * to the maximum's term of 1).  Branch-free, so a loop of it vectorizes where
 * libm's expf is a call per entry (4.5 -> about 1 ns per entry at -O2). */
static inline float exp_nonpos(float x) {
    /* the clamp on the bits: for x <= 0 a larger magnitude is a larger
     * unsigned pattern (-inf above all), and an integer min vectorizes where
     * GCC keeps a float select as a branch */
    f32_bits c = { x };
    c.u = c.u < 0xC2AE0000u ? c.u : 0xC2AE0000u;  /* -87.0f */
    x = c.f;
    const float shift = 12582912.0f;             /* 1.5 * 2^23: adding it rounds to an integer */
    f32_bits t = { x * 1.44269504088896341f + shift };
    const float k = t.f - shift;
    const float r = (x - k * 0.693359375f) + k * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float er = p * r * r + r + 1.0f;
    f32_bits two_k = { .i = (t.i - 0x4B400000 + 127) << 23 };  /* k >= -126 since x >= -87 */
    return er * two_k.f;
}

void cb_score_row(const float *logits, int n_vocab, int32_t target, int n_top,
                  float *logprob, int32_t *argmax, int32_t *top_tokens, float *top_logprobs) {
    if (n_top < 0) n_top = 0;
    if (n_top > CB_MAX_LOGPROBS) n_top = CB_MAX_LOGPROBS;
    const float *l = logits;
    const int n = n_vocab;
    /* 1. maximum */
    float mx[LANES];
    for (int j = 0; j < LANES; j++) mx[j] = -INFINITY;
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) { const float x = clean(l[i + j]); mx[j] = x > mx[j] ? x : mx[j]; }
    float m = -INFINITY;
    for (int j = 0; j < LANES; j++) m = mx[j] > m ? mx[j] : m;
    for (; i < n; i++) { const float x = clean(l[i]); m = x > m ? x : m; }
    if (m == -INFINITY) {  /* every entry -inf or NaN: nothing can be scored */
        *argmax = -1;
        *logprob = -INFINITY;
        for (int j = 0; j < n_top; j++) { top_tokens[j] = -1; top_logprobs[j] = -INFINITY; }
        return;
    }
    /* 2. log-sum-exp at temperature 1: x - m <= 0, so nothing overflows;
     *    double accumulators per lane */
    double acc[LANES];
    for (int j = 0; j < LANES; j++) acc[j] = 0.0;
    for (i = 0; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += (double)exp_nonpos(clean(l[i + j]) - m);
    double sum = 0.0;
    for (int j = 0; j < LANES; j++) sum += acc[j];
    for (; i < n; i++) sum += (double)exp_nonpos(clean(l[i]) - m);
    const double log_sum = log(sum);
    /* logprob(t) = (x_t - m) - log(sum), as the sampler's */
    *logprob = (float)(((double)clean(l[target]) - (double)m) - log_sum);
    /* 3. the best max(1, n_top) ids, lower id first on ties: insertion into
     *    a short sorted list, looking inside a block of LANES entries only
     *    when one of them beats the list's last (a vectorized compare) */
    const int keep = n_top > 0 ? n_top : 1;
    int32_t top[CB_MAX_LOGPROBS];
    float   topl[CB_MAX_LOGPROBS];
    int n_have = 0;
    float bar = -INFINITY;  /* entries must reach it to enter (the last's value once the list is full) */
    for (i = 0; i < n; i += LANES) {
        const int e = i + LANES <= n ? i + LANES : n;
        if (e - i == LANES) {
            int hit = 0;
            for (int j = 0; j < LANES; j++) hit |= clean(l[i + j]) >= bar;
            if (!hit) continue;
        }
        for (int t = i; t < e; t++) {
            const float x = clean(l[t]);
            if (x == -INFINITY || x < bar) continue;
            if (n_have == keep && !before(x, t, topl[keep - 1], top[keep - 1])) continue;
            int j = n_have < keep ? n_have++ : keep - 1;
            while (j > 0 && before(x, t, topl[j - 1], top[j - 1])) { top[j] = top[j - 1]; topl[j] = topl[j - 1]; j--; }
            top[j] = t;
            topl[j] = x;
            if (n_have == keep) bar = topl[keep - 1];
        }
    }
    *argmax = top[0];
    for (int j = 0; j < n_top; j++) {
        top_tokens[j] = j < n_have ? top[j] : -1;
        top_logprobs[j] = j < n_have ? (float)(((double)topl[j] - (double)m) - log_sum) : -INFINITY;
    }
}

typedef struct {
    const float *rows;
    int n, n_vocab, n_top;
    const int32_t *targets;
    float *logprob;
    int32_t *argmax, *top_tokens;
    float *top_logprobs;
} score_task;

static void score_task_run(void *ctx, int ith, int nth) {
    const score_task *t = ctx;
    for (int i = ith; i < t->n; i += nth)
        cb_score_row(t->rows + (size_t)i * t->n_vocab, t->n_vocab, t->targets[i], t->n_top, &t->logprob[i],
                     &t->argmax[i], t->top_tokens + (size_t)i * t->n_top, t->top_logprobs + (size_t)i * t->n_top);
}

void cb_score_batch(cb_pool *pool, const float *rows, int n, int n_vocab, const int32_t *targets, int n_top,
                   float *logprob, int32_t *argmax, int32_t *top_tokens, float *top_logprobs) {
    if (n_top < 0) n_top = 0;
    if (n_top > CB_MAX_LOGPROBS) n_top = CB_MAX_LOGPROBS;
    score_task t = { rows, n, n_vocab, n_top, targets, logprob, argmax, top_tokens, top_logprobs };
    if (pool && n > 1 && cb_pool_size(pool) > 1) cb_pool_run(pool, score_task_run, &t);
    else score_task_run(&t, 0, 1);
}
