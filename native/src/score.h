/*
 * score.h — teacher-forced scoring of logits rows: the log-probability of a
 * given next token, the most probable token and the best n alternatives.
 *
 * The same log-softmax as the sampler's logprobs (sampler.c): at temperature
 * 1 over the raw row, log-sum-exp with a double accumulator, NaN entries
 * never win and score as -inf, +inf is clamped to FLT_MAX.  One row never
 * depends on another, so rows split over threads give the same bits.
 */
#ifndef CB_SCORE_H
#define CB_SCORE_H

#include <stdint.h>

#include "colibri.h"
#include "kernels.h"

/* Score one row of n_vocab logits against `target` (0 <= target < n_vocab):
 * *logprob = log p(target) (-inf if it scores -inf), *argmax = first index
 * of the maximum (-1 if every entry is -inf / NaN), and the best n_top
 * (0..CB_MAX_LOGPROBS) ids with their log-probabilities, best first, lower
 * id first on equal logits (-1 / -inf where fewer tokens can be scored). */
void cb_score_row(const float *logits, int n_vocab, int32_t target, int n_top,
                  float *logprob, int32_t *argmax, int32_t *top_tokens, float *top_logprobs);

/* cb_score_row over rows i < n (stride n_vocab) against targets[i], writing
 * logprob[i], argmax[i] and top_*[i * n_top ..]; rows are split over the
 * pool's threads (pool NULL: the calling thread does all). */
void cb_score_batch(cb_pool *pool, const float *rows, int n, int n_vocab, const int32_t *targets, int n_top,
                   float *logprob, int32_t *argmax, int32_t *top_tokens, float *top_logprobs);

#endif
