/*
 * sampler.h — turning one row of logits into one token.
 *
 * Order (as llama.cpp): logit bias -> repetition / presence / frequency
 * penalties over the recent window -> (greedy: argmax) or top-k -> temperature
 * -> softmax -> top-p -> min-p -> draw with the request's own RNG.  Logprobs
 * are the log-softmax of the penalised logits at temperature 1, so they do not
 * depend on the sampling settings beyond the penalties and bias.
 */
#ifndef CB_SAMPLER_H
#define CB_SAMPLER_H

#include <stdint.h>
#include "colibri.h"

/* xoshiro256** state; seeded with splitmix64(seed). */
typedef struct { uint64_t s[4]; } cb_rng;

void     cb_rng_seed(cb_rng *rng, uint64_t seed);
uint64_t cb_rng_next(cb_rng *rng);
double   cb_rng_uniform(cb_rng *rng);  /* [0, 1) */

/* Scratch for one sampling call over a vocabulary of n_vocab (allocated once
 * per engine; the sampling itself allocates nothing). */
typedef struct {
    int    n_vocab;
    float *logits;    /* [n_vocab] working copy */
    int   *idx;       /* [n_vocab] candidate ids */
    float *probs;     /* [n_vocab] */
} cb_sampler_scratch;

int  cb_sampler_scratch_init(cb_sampler_scratch *s, int n_vocab);
void cb_sampler_scratch_free(cb_sampler_scratch *s);

typedef struct {
    int32_t token;
    float   logprob;
    int     n_top;
    int32_t top_tokens[CB_MAX_LOGPROBS];
    float   top_logprobs[CB_MAX_LOGPROBS];
} cb_sample_result;

/* Sample one token.  `logits` is read only.  `history` holds the tokens the
 * penalties look at (prompt + output, oldest first).  `mask` (nullable) is a
 * bitset over the vocabulary: bit clear = token forbidden (grammar).  Returns
 * CB_OK, or CB_ERR_ARG when every token is forbidden. */
int cb_sample(const cb_sampling_params *p, cb_rng *rng, cb_sampler_scratch *s,
              const float *logits, const int32_t *history, int n_history,
              const uint32_t *mask, cb_sample_result *out);

/* 1 if cb_sample with these params and no mask is the argmax of the raw row
 * (greedy; no bias, penalties or logprobs): the first index of the row's
 * maximum, NaN never winning (where every entry is -inf or NaN, or the
 * maximum is +inf, cb_sample itself decides).  It needs no scratch, history
 * or RNG, so the engine takes it from the LM head (cb_matmul_argmax). */
int cb_sample_is_argmax(const cb_sampling_params *p);

#endif
