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

#include "bpe.h"
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
    double    step_ms;    /* smoothed time of one drafting forward (one position of every job) */
    /* narrowed head (cb_drafter_narrow_head): the LM head scores tokens
     * [0, ctx.head_rows); a job's history tokens past them are scored one by
     * one (xtok), so whatever the text already holds can still be drafted */
    uint8_t  *xseen;      /* [n_vocab] scratch marks, all 0 between calls */
    int32_t  *xtok;       /* [n_slots x CB_DRAFT_XTOK] per job: its history's tokens >= head_rows */
    int      *n_xtok;     /* [n_slots] */
    float    *xrow;       /* [n_embd] a dequantized output row */
} cb_drafter;

#define CB_DRAFT_HEAD 32768  /* tokens a narrowed drafter head scores (the most frequent BPE merges) */
#define CB_DRAFT_XTOK 512    /* history tokens past them scored per job */

int  cb_drafter_init(cb_drafter *d, const cb_model *model, const cb_kernels *k, cb_pool *pool,
                     int n_slots, int n_ctx, int n_batch, int kv_f16, const int32_t *skip_layers, int n_skip,
                     int default_skip, char *err, size_t err_len);
void cb_drafter_free(cb_drafter *d);
/* Greedy drafting with a narrowed LM head: only tokens [0, rows) (rows a
 * multiple of CB_PANEL, below the vocabulary) and the tokens each job's
 * history holds are candidates.  In a byte-level BPE vocabulary ids follow
 * merge order, which follows frequency, so the first CB_DRAFT_HEAD of
 * Qwen2.5's 151,936 tokens cover most text, and a draft is only a proposal:
 * verification keeps the output exact.  The 0.5B drafter's head is 145 of
 * its 405 MB read per token.  CB_OK, or CB_ERR_ARG / CB_ERR_NOMEM. */
int  cb_drafter_narrow_head(cb_drafter *d, int64_t rows);

/* One drafting job: request with history hist[0..n_hist) (the last entry is
 * the token about to be verified) on `slot`, wanting k tokens.  With a
 * prefix, the first drafted tokens must spell prefix[0..n_prefix) (each is
 * the most likely token that spells the next bytes of it): the
 * cross-vocabulary drafter continues from its own token boundary, which may
 * lie inside the text already decided. */
/* A continuation of a draft from elsewhere (prompt lookup over the history
 * and the tokens drafted so far): writes up to cap tokens to ext and returns
 * how many, at least `want` (the tokens the model would still draft) or 0:
 * none, the model drafts on. */
typedef int (*cb_draft_extend_fn)(void *ctx, int arg, const int32_t *drafted, int n_drafted, int32_t *ext, int want,
                                  int cap);

typedef struct {
    int            slot;
    const int32_t *hist;
    int            n_hist;
    int            k;
    int32_t       *out;     /* [max(k, k_total)] drafted tokens */
    int            n_out;   /* filled in */
    const uint8_t *prefix;  /* nullable */
    int            n_prefix;
    /* nullable: asked after each token the model drafts (while it has k_total
     * > n_out); a continuation it gives ends the job (the model drafts no
     * further), up to k_total tokens in all.  A copied span then costs no
     * drafting forwards. */
    cb_draft_extend_fn extend;
    void          *extend_ctx;
    int            extend_arg;
    int            k_total;
    int            n_model; /* filled in: tokens the model drafted (out[n_model..n_out) came from extend) */
} cb_draft_job;

/* Draft greedily for all jobs at once: one batched forward per draft
 * position (plus catch-up prefill of each slot's history). */
void cb_drafter_draft(cb_drafter *d, cb_draft_job *jobs, int n_jobs);
/* Bring the drafter's KV of `slot` up to hist[0..n_hist) without drafting
 * (a prompt just prefilled by the target: its drafter prefill belongs to
 * the prompt, not to the first draft).  Returns the rows it ran. */
int  cb_drafter_sync(cb_drafter *d, int slot, const int32_t *hist, int n_hist);
/* Time (ms) the last cb_drafter_draft spent catching up on history rather
 * than drafting: a one-off cost per new prompt, kept out of the per-token
 * drafting cost the policy weighs. */
double cb_drafter_last_catchup_ms(const cb_drafter *d);

/* CB_OK if `draft` has exactly the target's vocabulary (same size, the same
 * bytes and type for every token), else CB_ERR_ARG with a message naming
 * both sizes and the first token that differs. */
int  cb_vocab_check(const cb_model *target, const cb_model *draft, char *err, size_t err_len);

/* ------------------------------------------- cross-vocabulary drafter
 *
 * A draft model whose vocabulary differs from the target's (SmolLM2 drafting
 * for Qwen2.5).  Per slot it keeps the target's history as text, tokenized
 * in the drafter's vocabulary up to the last boundary no further text can
 * move (cb_bpe_tokenize_ex's stable ids); the bytes after it (the tail) are
 * text the drafter must re-spell.  A draft: the drafter continues from its
 * stable tokens, its first tokens constrained to spell the tail; what it
 * writes after the tail is tokenized in the target's vocabulary and the
 * stable ids of that are the draft.  Control tokens (<|im_start|>, ...) map
 * to the drafter's control token of the same text when it has one.
 * Deterministic in the history, like every source here, so verification
 * keeps the target's distribution (spec.h's header comment). */

#define CB_XTAIL      2048  /* bytes of undecided text a slot may hold */
#define CB_XDRAFT_MAX 40    /* drafter tokens per draft (k target tokens take k + 1) */

typedef struct {
    int32_t *tgt;      /* [n_ctx] target tokens turned into text so far */
    int      n_tgt;
    int32_t *dtok;     /* [n_ctx_d] committed drafter tokens (the text up to the tail) */
    int      n_dtok;
    uint8_t  tail[CB_XTAIL];
    int      n_tail;
    int      broken;   /* the history holds text the drafter cannot spell, or is too long: no drafts */
} cb_xslot;

typedef struct {
    cb_drafter      d;         /* the draft model, its KV per slot in its own vocabulary */
    const cb_model *target;
    cb_bpe         *bpe_d, *bpe_t;   /* canonical tokenizers of the drafter's and the target's vocabulary */
    void           *scratch;
    size_t          scratch_size;
    int32_t        *t2d_special;     /* [target n_vocab] control token -> drafter token of the same text, or -1 */
    int32_t        *d2t_special;     /* [drafter n_vocab] the other way */
    cb_xslot       *slots;           /* [n_slots] */
    int             n_slots, n_ctx;
    cb_draft_job   *djobs;           /* [n_slots] the drafter's jobs of one call */
    int32_t        *dout;            /* [n_slots x CB_XDRAFT_MAX] their drafted tokens */
    int32_t        *tail_ids;        /* [CB_XTAIL] a slot's tail in the drafter's vocabulary */
} cb_xdrafter;

/* The draft model's KV holds n_ctx_d positions per slot (a text takes more
 * tokens in a smaller vocabulary). */
int  cb_xdrafter_init(cb_xdrafter *x, const cb_model *target, const cb_model *draft, const cb_kernels *k,
                      cb_pool *pool, int n_slots, int n_ctx, int n_ctx_d, int n_batch, int kv_f16,
                      char *err, size_t err_len);
void cb_xdrafter_free(cb_xdrafter *x);
/* Draft for all jobs (histories and outputs in the target's vocabulary). */
void cb_xdrafter_draft(cb_xdrafter *x, cb_draft_job *jobs, int n_jobs);
/* cb_drafter_sync for the cross-vocabulary drafter: the slot's text up to
 * the target history hist[0..n_hist), its stable drafter tokens prefilled. */
int  cb_xdrafter_sync(cb_xdrafter *x, int slot, const int32_t *hist, int n_hist);

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
    /* What a source saved lately, for the sources whose drafts are free to
     * make (prompt lookup): decayed counts of the decode steps it was
     * available for (with no other source drafting) and of the tokens its
     * drafts had accepted; their ratio is the share of those steps it saved. */
    double  save_steps[CB_SPEC_N_SOURCES];
    double  save_tokens[CB_SPEC_N_SOURCES];
    int64_t save_n[CB_SPEC_N_SOURCES];     /* steps counted (undecayed) */
} cb_spec_policy;

/* A request's own record of each source: the policy blends it with the
 * engine-wide estimate, so that the choice of source and depth follows what
 * this request's text does (a code edit copies, a chat answer does not). */
typedef struct {
    int tried[CB_SPEC_N_SOURCES][CB_SPEC_MAX_K];     /* verifications that reached position i */
    int accepted[CB_SPEC_N_SOURCES][CB_SPEC_MAX_K];  /* of those, accepted */
    /* the same by acceptance class (lookup drafts: a docstring's short
     * matches fail where the same request's copied code holds) */
    int cls_tried[CB_SPEC_N_CLASS][CB_SPEC_MAX_K];
    int cls_accepted[CB_SPEC_N_CLASS][CB_SPEC_MAX_K];
    int wait[CB_SPEC_N_SOURCES];     /* decode steps before this request tries the source again */
    int backoff[CB_SPEC_N_SOURCES];  /* the next wait (doubles while the source does not pay) */
} cb_spec_req;

void cb_spec_req_init(cb_spec_req *q);

void cb_spec_policy_init(cb_spec_policy *p);
/* Depth (0: do not draft) and expected gain (tokens per unit of step time
 * relative to a plain step) of drafting up to n_avail tokens with drafter
 * source b for request q, from the blend of q's acceptance and the
 * engine-wide one, the measured verify cost of base_rows + k rows and the
 * source's measured cost per drafted token.  A source that does not pay
 * waits (per request, doubling), then is probed at depth <= 2 with a gain
 * just above 1, so that it is taken only when nothing else pays. */
int  cb_spec_policy_plan(cb_spec_policy *p, cb_spec_req *q, int b, const cb_spec_params *sp, int base_rows,
                         int n_avail, double *gain);
/* Record a verified draft in the request's record too. */
void cb_spec_req_record(cb_spec_req *q, int b, int n, int a);
/* ... and a lookup draft of class `cls` in its record by class. */
void cb_spec_req_record_class(cb_spec_req *q, int cls, int n, int a);
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
/* The same with the class's acceptance blended with request q's own record
 * of that class (nullable: the engine-wide estimate alone). */
int  cb_spec_policy_k_class_req(cb_spec_policy *p, const cb_spec_req *q, int source_bit, int cls,
                                const cb_spec_params *sp, int base_rows, int n_avail);
/* Depth of a lookup draft of class `cls` appended to a draft that already
 * puts base_rows rows in the step (a drafter's tokens before it): priced at
 * the marginal verify cost of its rows, 0 when it does not pay.  Pricing
 * only: no probes, no exploration, no decision counted.  q (nullable): the
 * request whose record of the class is blended in, as in k_class_req. */
int  cb_spec_policy_k_ext(const cb_spec_policy *p, const cb_spec_req *q, int source_bit, int cls,
                          const cb_spec_params *sp, int base_rows, int n_avail);
/* Whether class `cls` of source b is still in its warm-up (fewer verified
 * drafts behind its estimates than the policy trusts): its estimate is the
 * prior, so comparing it with a learned source's would never try it. */
int  cb_spec_policy_class_learning(const cb_spec_policy *p, int source_bit, int cls);
/* Count one decode step of a request for which source b (prompt lookup) was
 * available and no other source drafted, whether or not b found a draft:
 * the denominator of the share of steps b saved (cb_spec_policy_saved). */
void cb_spec_policy_consider(cb_spec_policy *p, int source_bit);
/* Share of the counted decode steps that source b's accepted drafts saved
 * lately (a decayed window of about CB_SPEC_SAVE_WINDOW steps); -1 until
 * that many steps are counted. */
double cb_spec_policy_saved(const cb_spec_policy *p, int source_bit);
/* Record a verified draft of class `cls`: n proposed, a accepted. */
void cb_spec_policy_record_class(cb_spec_policy *p, int source_bit, int cls, int n, int a);
/* Record a verified draft (class 0): n proposed, a accepted. */
void cb_spec_policy_record(cb_spec_policy *p, int source_bit, int n, int a);
/* Record the time of a step of `rows` rows (forward and sampling, drafting excluded). */
void cb_spec_policy_step(cb_spec_policy *p, int rows, double ms);
/* Prompt rows to put in a step that already has rows_decode decode rows
 * (drafts included), at most max_rows, from the measured step times: the
 * largest count whose step costs at most (1 + slack) x a step of the decode
 * rows alone, so that a stream's token gap beside a prompt stays within the
 * slack of a plain decode step.  Where not even one prompt row fits, the
 * count that adds the least step time per prompt row (the fewest rows on
 * ties), so that prompts still progress.  0 while it cannot tell (no step of
 * rows_decode rows, or none larger, measured yet; rows_decode outside
 * 1..CB_COST_BUCKETS-1; max_rows < 1; slack < 0): the caller keeps its own
 * budget. */
int  cb_spec_prompt_rows(const cb_spec_policy *p, int rows_decode, int max_rows, double slack);
/* Bit index (0..3) of a single cb_spec_source flag. */
int  cb_spec_bit(int source);

#endif
