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
                     int n_slots, int n_ctx, int n_batch, int kv_f16, const int32_t *skip_layers, int n_skip,
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

/* Prompt lookup: among the earlier occurrences of the history's last tokens,
 * take the one whose match with the suffix is longest (compared up to
 * ngram_max tokens; a tie goes to the most recent) and at least ngram_min
 * long, and propose what followed it.  The continuation may run past the end
 * of the history into the draft itself (a repeating span drafts its next
 * period).  Returns the number of tokens written to out (<= k); *match_len
 * (nullable) gets the length of the chosen match, counted up to
 * CB_LOOKUP_MATCH_CAP whatever ngram_max is: how long the text has been
 * copying, which predicts how far the draft will be accepted. */
#define CB_LOOKUP_MATCH_CAP 32
int cb_lookup_draft(const int32_t *hist, int n_hist, int ngram_min, int ngram_max, int k, int32_t *out);
int cb_lookup_draft_ex(const int32_t *hist, int n_hist, int ngram_min, int ngram_max, int k, int32_t *out,
                       int *match_len);
/* Acceptance class of a lookup draft by its match length (0..CB_SPEC_N_CLASS-1). */
int cb_lookup_class(int match_len);

/* ------------------------------------------------------------------ policy */

#define CB_COST_BUCKETS 128  /* step time is tracked for batches of 1..128 rows */
#define CB_SPEC_N_CLASS 5    /* acceptance classes per source (lookup: by match length; others: class 0) */

typedef struct {
    double  rate[CB_SPEC_MAX_K];   /* smoothed P(accept at i | accepted before i) */
    int64_t tried[CB_SPEC_MAX_K];  /* verifications that reached position i */
    int64_t drafts;                /* verified drafts of this class */
    int64_t decisions;             /* times the policy was asked for this class */
    int64_t skipped;               /* of those, answered 0 (not profitable) */
} cb_spec_class;

typedef struct {
    cb_spec_stats st[CB_SPEC_N_SOURCES];   /* per source (bit index), aggregated over classes */
    cb_spec_class cls[CB_SPEC_N_SOURCES][CB_SPEC_N_CLASS];
    int     pause_left[CB_SPEC_N_SOURCES]; /* steps until a paused source is probed again */
    int     pause_len[CB_SPEC_N_SOURCES];  /* current pause length (doubles while unprofitable) */
    double  draft_ms_tok[CB_SPEC_N_SOURCES]; /* smoothed drafting cost per token (ms) */
    double  step_ms[CB_COST_BUCKETS + 1];  /* smoothed step time by batch rows (0 = unknown) */
    int     step_n[CB_COST_BUCKETS + 1];   /* steps measured per bucket */
} cb_spec_policy;

void cb_spec_policy_init(cb_spec_policy *p);
/* Depth to draft for `source` when the step already has `base_rows` rows:
 * 0 means do not draft (source paused or not profitable).  Used before a
 * costly draft (a drafter model): class 0, no pausing per class, a source
 * whose best gain is below 1 is paused for a while. */
int  cb_spec_policy_k(cb_spec_policy *p, int source_bit, const cb_spec_params *sp, int base_rows);
/* Depth to verify of a draft that is already made (n_avail tokens, class
 * `cls`): for a source whose drafts cost next to nothing (prompt lookup), so
 * the choice can depend on what was found.  0: not worth verifying. */
int  cb_spec_policy_k_class(cb_spec_policy *p, int source_bit, int cls, const cb_spec_params *sp, int base_rows,
                            int n_avail);
/* Record a verified draft of class `cls`: n proposed, a accepted. */
void cb_spec_policy_record_class(cb_spec_policy *p, int source_bit, int cls, int n, int a);
/* Record a verified draft (class 0): n proposed, a accepted. */
void cb_spec_policy_record(cb_spec_policy *p, int source_bit, int n, int a);
/* Record the time of a step of `rows` rows (forward and sampling, drafting excluded). */
void cb_spec_policy_step(cb_spec_policy *p, int rows, double ms);
/* Bit index (0..3) of a single cb_spec_source flag. */
int  cb_spec_bit(int source);

#endif
