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

void cb_score_row(const float *logits, int n_vocab, int32_t target, int n_top,
                  float *logprob, int32_t *argmax, int32_t *top_tokens, float *top_logprobs) {
    if (n_top < 0) n_top = 0;
    if (n_top > CB_MAX_LOGPROBS) n_top = CB_MAX_LOGPROBS;
    /* 1. the best max(1, n_top) entries by insertion into a short sorted
     *    list: most entries are rejected by one compare with its last */
    const int keep = n_top > 0 ? n_top : 1;
    int32_t top[CB_MAX_LOGPROBS];
    float   topl[CB_MAX_LOGPROBS];
    int n_have = 0;
    for (int i = 0; i < n_vocab; i++) {
        const float x = clean(logits[i]);
        if (x == -INFINITY) continue;
        if (n_have == keep && !before(x, i, topl[keep - 1], top[keep - 1])) continue;
        int j = n_have < keep ? n_have++ : keep - 1;
        while (j > 0 && before(x, i, topl[j - 1], top[j - 1])) { top[j] = top[j - 1]; topl[j] = topl[j - 1]; j--; }
        top[j] = i;
        topl[j] = x;
    }
    double log_sum = 0.0;
    const float m = n_have > 0 ? topl[0] : 0.0f;
    if (n_have > 0) {
        /* 2. log-sum-exp at temperature 1: x - m <= 0, so expf never
         *    overflows, and -inf entries add exactly 0 */
        double sum = 0.0;
        for (int i = 0; i < n_vocab; i++) sum += expf(clean(logits[i]) - m);
        log_sum = log(sum);
    }
    /* logprob(t) = (x_t - m) - log(sum), as the sampler's */
    *argmax = n_have > 0 ? top[0] : -1;
    *logprob = n_have > 0 ? (float)(((double)clean(logits[target]) - (double)m) - log_sum) : -INFINITY;
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
