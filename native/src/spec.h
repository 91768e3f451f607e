/*
 * spec.h — draft sources for speculative decoding and the policy that decides
 * how deep to draft and when a source is not worth it.
 *
 * Verification lives in engine.c: drafted tokens ride in the step's batch as
 * extra rows of their request, each row is sampled with the request's own
 * sampler, and drafts are accepted while they equal what was sampled.  For a
 * deterministic draft (all sources here draft greedily) that rule IS
 * speculative sampling with a point-mass proposal, so the output
 * distribution is the target's exactly, greedy or not.
 */
#ifndef CB_SPEC_H
#define CB_SPEC_H

#include "forward.h"

/* A drafter: a model (a separate draft model, or the target with layers
 * skipped) with its own KV per slot, kept in sync with the slots' token
 * histories by prefilling whatever differs before each draft. */
typedef struct {
    const cb_model *model;
    cb_ctx    ctx;        /* own KV cache [n_slots x n_ctx] and buffers */
    uint8_t  *skip;       /* [n_layer] layer mask (owned), or NULL */
    int32_t  *tokens;     /* [n_slots x n_ctx] tokens whose draft KV is valid */
    int      *n_past;     /* [n_slots] */
    int32_t  *b_tokens, *b_pos, *b_slot, *b_logit; /* [n_batch] batch under construction */
    int      *row_req;    /* [n_logits] which request a logits row belongs to */
    double    catchup_ms; /* time of the last draft call's history catch-up */
} cb_drafter;

int  cb_drafter_init(cb_drafter *d, const cb_model *model, const cb_kernels *k, cb_pool *pool,
                     int n_slots, int n_ctx, int n_batch, const int32_t *skip_layers, int n_skip,
                     int default_skip, char *err, size_t err_len);
void cb_drafter_free(cb_drafter *d);

/* One drafting job: request with history hist[0..n_hist) (the last entry is
 * the token about to be verified) on `slot`, wanting k tokens. */
typedef struct {
    int            slot;
    const int32_t *hist;
    int            n_hist;
    int            k;
    int32_t       *out;     /* [k] drafted tokens */
    int            n_out;   /* filled in */
} cb_draft_job;

/* Draft greedily for all jobs at once: one batched forward per draft
 * position (plus catch-up prefill of each slot's history). */
void cb_drafter_draft(cb_drafter *d, cb_draft_job *jobs, int n_jobs);
/* Time (ms) the last cb_drafter_draft spent catching up on history rather
 * than drafting: a one-off cost per new prompt, kept out of the per-token
 * drafting cost the policy weighs. */
double cb_drafter_last_catchup_ms(const cb_drafter *d);

/* Prompt lookup: find the most recent earlier occurrence of the last n tokens
 * (n from ngram_max down to ngram_min) and propose what followed it.
 * Returns the number of tokens written to out (<= k). */
int cb_lookup_draft(const int32_t *hist, int n_hist, int ngram_min, int ngram_max, int k, int32_t *out);

/* ------------------------------------------------------------------ policy */

#define CB_COST_BUCKETS 128  /* step time is tracked for batches of 1..128 rows */

typedef struct {
    cb_spec_stats st[CB_SPEC_N_SOURCES];   /* per source (bit index) */
    int     pause_left[CB_SPEC_N_SOURCES]; /* steps until a paused source is probed again */
    int     pause_len[CB_SPEC_N_SOURCES];  /* current pause length (doubles while unprofitable) */
    double  draft_ms_tok[CB_SPEC_N_SOURCES]; /* smoothed drafting cost per token (ms) */
    double  step_ms[CB_COST_BUCKETS + 1];  /* smoothed forward time by batch rows (0 = unknown) */
} cb_spec_policy;

void cb_spec_policy_init(cb_spec_policy *p);
/* Depth to draft for `source` when the step already has `base_rows` rows:
 * 0 means do not draft (source paused or not profitable). */
int  cb_spec_policy_k(cb_spec_policy *p, int source_bit, const cb_spec_params *sp, int base_rows);
/* Record a verified draft: n proposed, a accepted. */
void cb_spec_policy_record(cb_spec_policy *p, int source_bit, int n, int a);
/* Record the forward time of a step of `rows` rows. */
void cb_spec_policy_step(cb_spec_policy *p, int rows, double ms);
/* Bit index (0..3) of a single cb_spec_source flag. */
int  cb_spec_bit(int source);

#endif
