/*
 * engine.c — KV slots, requests and the step loop (continuous batching).
 *
 * A request goes QUEUED -> PREFILL -> DECODE -> (freed).  Each cb_engine_step:
 *   1. finishes cancelled requests and frees their slots;
 *   2. admits queued requests in FIFO order to a slot (its pinned slot, or the
 *      free slot whose KV shares the longest prefix with the prompt, least
 *      recently used on ties), reusing that prefix and optionally copying a
 *      longer one from another slot;
 *   3. builds ONE batch: a decode row for every running request, then prefill
 *      chunks while the batch has room (when some request decodes, n_chunk
 *      rows in all: the decode rows first, the prompts the rest, at least a
 *      quarter of n_chunk, and once step times are measured no more prompt
 *      rows than keep the step within prompt_slack of a decode-only step;
 *      both scaled by prompts per decoding stream when prompts outnumber
 *      the streams);
 *   4. runs the forward and samples every row that ends a prompt or decodes.
 */
#include "bpe.h"
#include "forward.h"
#include "sampler.h"
#include "score.h"
#include "spec.h"
#include "stopstr.h"
#include "util.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CB_MAX_REQUESTS 1024

typedef enum { RQ_FREE = 0, RQ_QUEUED, RQ_PREFILL, RQ_DECODE } rq_state;

typedef struct {
    rq_state state;
    int64_t  id;
    int64_t  seq;            /* submission order: FIFO admission */
    int      slot;           /* pinned slot (-1 any) while queued; assigned slot after */
    int32_t *prompt;         /* [n_prompt] owned */
    int      n_prompt;
    int      n_prompt_done;  /* prompt tokens whose KV is in the slot */
    int      cached;         /* of those, reused from an earlier request */
    int      max_tokens;
    int      n_gen;          /* completion tokens emitted */
    int      ignore_eos, return_logits, copy_prefix;
    int      score;          /* teacher-forced scoring: every prompt position's row is scored */
    int      score_lr0, score_n, score_pos; /* this step's scored rows: logits rows [lr0, lr0 + n), prompt positions from pos */
    int      cancelled;
    cb_sampling_params sp;   /* logit bias arrays point into bias_tok / bias_val */
    int32_t *bias_tok;       /* owned */
    float   *bias_val;       /* owned */
    cb_rng   rng;
    cb_stopstr stop;
    cb_matcher *matcher;     /* grammar state (owned), NULL without a grammar */
    double   mask_us;        /* time spent computing grammar masks */
    int      n_masks;        /* masks computed */
    int32_t  pending;        /* sampled token not yet fed through the model */
    /* speculative decoding */
    cb_spec_params spec;     /* sources = 0: off */
    int      n_draft;        /* drafts riding in this step's batch */
    int      draft_src;      /* bit index of the source that drafted them */
    int      draft_cls;      /* the policy's acceptance class of the draft (lookup: by match length) */
    int32_t  draft[CB_SPEC_MAX_K];
    int      lrow0;          /* first logits row of this request in the step */
    int      k_want;         /* drafts asked of a drafter this step */
    int      draft_cap;      /* most draft rows this step (max_tokens, context, room) */
    int      n_draft_model;  /* of the drafts, the drafter's; the rest continue them by prompt lookup */
    int      ext_cls;        /* that continuation's lookup class */
    int      drafters_synced;/* the drafters have the prompt (prefilled with it) */
    int      base_pos;       /* position of `pending` in this step */
    cb_request_metrics spec_m; /* draft counters accumulated (draft_* fields only) */
    cb_spec_req sq;          /* this request's acceptance per source, for the policy */
    double   draft_ms;       /* time spent drafting for it */
    uint64_t *expert_seen;   /* MoE: bitset [n_layer * n_expert] of experts this request routed to (owned) */
    int64_t  experts_routed; /* MoE: routings of this request's rows */
    double   t_submit, t_admit, t_prefill_done, t_first;
} cb_request;

typedef struct {
    int32_t *tokens;   /* [n_ctx] token at each position with KV */
    int      n_past;   /* positions [0, n_past) hold valid KV */
    int      req;      /* index into requests, -1 when free */
    uint64_t last_used;/* LRU clock value of the last release */
} cb_slot;

struct cb_engine {
    const cb_model   *model;
    cb_engine_params  params;
    cb_pool          *pool;
    cb_ctx            ctx;
    cb_slot          *slots;       /* [n_slots] */
    cb_request       *reqs;        /* [CB_MAX_REQUESTS] */
    int              *order;       /* [CB_MAX_REQUESTS] request indices, admission order */
    int               n_order;
    int64_t           next_id, next_seq;
    uint64_t          lru_clock;
    cb_sampler_scratch sampler;
    uint32_t         *mask;        /* [ceil(n_vocab/32)] grammar mask of the row being sampled */
    double            step_grammar_ms; /* grammar time in the current step */
    /* batch under construction, [n_batch] each */
    int32_t *b_tokens, *b_pos, *b_slot, *b_logit;
    int     *logit_req;            /* [n_logits] request index per logits row (-1: a scored prompt row) */
    /* scored prompt rows of one step, by logits row (top_*: CB_MAX_LOGPROBS per row) */
    int32_t *score_target, *score_argmax, *score_top;
    float   *score_logprob, *score_top_lp;
    /* pending events (FIFO) */
    cb_event *events;              /* [ev_cap] */
    int       ev_head, ev_count, ev_cap;
    cb_step_stats last;
    int64_t   n_steps;
    /* speculative decoding */
    cb_drafter draft_model;        /* valid when params.draft_model */
    cb_drafter layer_skip;         /* valid when params.layer_skip */
    cb_xdrafter xdraft;            /* valid when params.xdraft_model */
    cb_spec_policy policy;
    cb_bpe   *bpe;                 /* canonical tokenizer for grammar-forced drafts (NULL if unsupported) */
    void     *bpe_scratch;
    size_t    bpe_scratch_size;
    cb_draft_job *jobs;            /* [n_slots] drafting jobs of one step */
    int      *job_req;             /* [n_slots] request index per job */
    double    step_draft_ms;
    int       plan_base_rows;      /* decode rows of the step being planned (drafts' verify base) */
};

#define CB_FORCED_MAX 256  /* longest grammar-forced span drafted at once (bytes) */
#define CB_MIN_REUSE  32   /* prefix matches shorter than this do not steer slot choice */

const char *cb_status_str(int s) {
    switch (s) {
    case CB_OK: return "ok";
    case CB_ERR_IO: return "io error";
    case CB_ERR_FORMAT: return "format error";
    case CB_ERR_UNSUPPORTED: return "unsupported";
    case CB_ERR_NOMEM: return "out of memory";
    case CB_ERR_ARG: return "invalid argument";
    case CB_ERR_FULL: return "full";
    case CB_ERR_CONTEXT: return "context length exceeded";
    case CB_ERR_NOT_FOUND: return "not found";
    case CB_ERR_BUSY: return "busy";
    default: return "unknown error";
    }
}

const char *cb_finish_str(int f) {
    switch (f) {
    case CB_FINISH_STOP: return "stop";
    case CB_FINISH_LENGTH: return "length";
    case CB_FINISH_CANCELLED: return "cancelled";
    case CB_FINISH_CONTEXT: return "context";
    case CB_FINISH_ERROR: return "error";
    default: return "none";
    }
}

/* ------------------------------------------------------------- defaults */

cb_engine_params cb_engine_default_params(void) {
    cb_engine_params p = { 0 };
    p.n_slots = 1;
    p.prompt_slack = 0.25f;  /* a 1-row decode step of qwen2.5-coder-1.5b (2 threads, Zen 5) takes +15% at 4 rows, +60% at 8 */
    p.simd = CB_SIMD_AUTO;
    p.prefix_reuse = 1;
    p.kv_f16 = 1;
    return p;
}

cb_sampling_params cb_sampling_default_params(void) {
    cb_sampling_params p = { 0 };
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    return p;
}

cb_spec_params cb_spec_default_params(void) {
    cb_spec_params p;
    memset(&p, 0, sizeof p);
    p.k_max = 8;
    p.adaptive = 1;
    p.ngram_max = 16;  /* the longest match wins: a copy keeps following its source */
    p.ngram_min = 2;  /* a one-token match proposes noise: measured 1.11x vs 1.31x on copy-heavy edits */
    return p;
}

cb_request_params cb_request_default_params(void) {
    cb_request_params r;
    memset(&r, 0, sizeof r);
    r.slot = -1;
    r.max_tokens = 16;
    r.sampling = cb_sampling_default_params();
    r.spec = cb_spec_default_params();
    r.spec.sources = 0;
    return r;
}

/* ------------------------------------------------------------ lifecycle */

int cb_engine_new(const cb_model *model, const cb_engine_params *params, cb_engine **out,
                  char *err, size_t err_len) {
    if (err && err_len) err[0] = 0;
    if (!out) return CB_ERR_ARG;
    *out = NULL;
    if (!model || model->info.n_layer == 0) { set_err(err, err_len, "no model (or a validate-only model)"); return CB_ERR_ARG; }
    cb_engine_params p = params ? *params : cb_engine_default_params();
    const cb_model_info *I = &model->info;
    if (p.n_slots < 1 || p.n_slots > 256) { set_err(err, err_len, "n_slots must be in [1, 256], got %d", p.n_slots); return CB_ERR_ARG; }
    if (p.n_ctx == 0) p.n_ctx = I->n_ctx_train < 4096 ? I->n_ctx_train : 4096;
    if (p.n_ctx < 2 || p.n_ctx > (1 << 20)) { set_err(err, err_len, "n_ctx must be in [2, 1048576], got %d", p.n_ctx); return CB_ERR_ARG; }
    if (p.n_threads == 0) { long n = sysconf(_SC_NPROCESSORS_ONLN); p.n_threads = n > 0 ? (int)n : 1; }
    if (p.n_threads < 1 || p.n_threads > 512) { set_err(err, err_len, "n_threads must be in [1, 512], got %d", p.n_threads); return CB_ERR_ARG; }
    if (p.n_batch == 0) p.n_batch = 512;
    if (p.n_batch < p.n_slots || p.n_batch > 65536) { set_err(err, err_len, "n_batch must be in [n_slots, 65536], got %d", p.n_batch); return CB_ERR_ARG; }
    /* default step budget: 3 rows per thread.  The quantized matmuls stream
     * their weights up to a few rows per thread, then pay per row: at 2
     * threads a step of 4 rows takes 1.1x one of 2 rows, 8 rows 1.5x, 12
     * rows 2.4x, prompt rows or decode rows alike (qwen2.5-coder-1.5b,
     * scripts/bench_step_mix.py, docs/bench/serve.md) */
    if (p.n_chunk == 0) p.n_chunk = 3 * p.n_threads;
    if (p.n_chunk > p.n_batch) p.n_chunk = p.n_batch;
    if (p.n_chunk < 1) { set_err(err, err_len, "n_chunk must be >= 1, got %d", p.n_chunk); return CB_ERR_ARG; }
    if (isnan(p.prompt_slack) || p.prompt_slack > 1000) { set_err(err, err_len, "prompt_slack must be <= 1000 (< 0: off), got %g", p.prompt_slack); return CB_ERR_ARG; }
    if (p.simd == CB_SIMD_AUTO) p.simd = cb_simd_detect();
    const cb_kernels *k = cb_kernels_get(p.simd);
    if (!k) { set_err(err, err_len, "SIMD level %d (%s) is not available on this CPU", p.simd, cb_simd_name(p.simd)); return CB_ERR_UNSUPPORTED; }

    cb_engine *e = calloc(1, sizeof *e);
    if (!e) { set_err(err, err_len, "out of memory"); return CB_ERR_NOMEM; }
    e->model = model;
    e->params = p;
    int n_logits = p.n_slots * 4 > 32 ? p.n_slots * 4 : 32;
    if (n_logits > p.n_batch) n_logits = p.n_batch;
    int rc;
    e->pool = cb_pool_new(p.n_threads);
    if (!e->pool) { set_err(err, err_len, "could not start %d threads", p.n_threads); rc = CB_ERR_NOMEM; goto fail; }
    if ((rc = cb_ctx_init(&e->ctx, model, k, e->pool, p.n_slots, p.n_ctx, p.n_batch, n_logits, p.kv_f16, err, err_len))) goto fail;
    e->slots = calloc((size_t)p.n_slots, sizeof(cb_slot));
    e->reqs = calloc(CB_MAX_REQUESTS, sizeof(cb_request));
    e->order = calloc(CB_MAX_REQUESTS, sizeof(int));
    e->b_tokens = calloc((size_t)p.n_batch, sizeof(int32_t));
    e->b_pos = calloc((size_t)p.n_batch, sizeof(int32_t));
    e->b_slot = calloc((size_t)p.n_batch, sizeof(int32_t));
    e->b_logit = calloc((size_t)p.n_batch, sizeof(int32_t));
    e->logit_req = calloc((size_t)n_logits, sizeof(int));
    e->score_target = calloc((size_t)n_logits, sizeof(int32_t));
    e->score_argmax = calloc((size_t)n_logits, sizeof(int32_t));
    e->score_logprob = calloc((size_t)n_logits, sizeof(float));
    e->score_top = calloc((size_t)n_logits * CB_MAX_LOGPROBS, sizeof(int32_t));
    e->score_top_lp = calloc((size_t)n_logits * CB_MAX_LOGPROBS, sizeof(float));
    e->ev_cap = 2 * CB_MAX_REQUESTS + 16;
    e->events = calloc((size_t)e->ev_cap, sizeof(cb_event));
    if (!e->slots || !e->reqs || !e->order || !e->b_tokens || !e->b_pos || !e->b_slot || !e->b_logit ||
        !e->logit_req || !e->events || !e->score_target || !e->score_argmax || !e->score_logprob ||
        !e->score_top || !e->score_top_lp) { set_err(err, err_len, "out of memory"); rc = CB_ERR_NOMEM; goto fail; }
    for (int s = 0; s < p.n_slots; s++) {
        e->slots[s].req = -1;
        e->slots[s].tokens = calloc((size_t)p.n_ctx, sizeof(int32_t));
        if (!e->slots[s].tokens) { set_err(err, err_len, "out of memory"); rc = CB_ERR_NOMEM; goto fail; }
    }
    if ((rc = cb_sampler_scratch_init(&e->sampler, I->n_vocab))) { set_err(err, err_len, "out of memory"); goto fail; }
    e->mask = calloc((size_t)(I->n_vocab + 31) / 32, sizeof(uint32_t));
    e->jobs = calloc((size_t)p.n_slots, sizeof(cb_draft_job));
    e->job_req = calloc((size_t)p.n_slots, sizeof(int));
    if (!e->mask || !e->jobs || !e->job_req) { set_err(err, err_len, "out of memory"); rc = CB_ERR_NOMEM; goto fail; }
    cb_spec_policy_init(&e->policy);
    if (p.draft_model) {
        if ((rc = cb_vocab_check(model, p.draft_model, err, err_len))) goto fail;
        if ((rc = cb_drafter_init(&e->draft_model, p.draft_model, k, e->pool, p.n_slots, p.n_ctx, p.n_batch, p.kv_f16,
                                  NULL, 0, 0, err, err_len))) goto fail;
        if (p.draft_model->info.n_vocab > 2 * CB_DRAFT_HEAD &&
            (rc = cb_drafter_narrow_head(&e->draft_model, CB_DRAFT_HEAD))) { set_err(err, err_len, "out of memory"); goto fail; }
    }
    if (p.xdraft_model) {
        if (p.xdraft_model->info.n_layer == 0) { set_err(err, err_len, "the cross-vocabulary draft model is validate-only"); rc = CB_ERR_ARG; goto fail; }
        /* a smaller vocabulary spells the same text in more tokens */
        int n_ctx_d = p.n_ctx + p.n_ctx / 2;
        if ((rc = cb_xdrafter_init(&e->xdraft, model, p.xdraft_model, k, e->pool, p.n_slots, p.n_ctx, n_ctx_d,
                                   p.n_batch > n_ctx_d ? n_ctx_d : p.n_batch, p.kv_f16, err, err_len))) goto fail;
    }
    if (p.layer_skip) {
        if ((rc = cb_drafter_init(&e->layer_skip, model, k, e->pool, p.n_slots, p.n_ctx, p.n_batch, p.kv_f16,
                                  p.skip_layers, p.n_skip_layers, 1, err, err_len))) goto fail;
        if (I->n_vocab > 2 * CB_DRAFT_HEAD &&
            (rc = cb_drafter_narrow_head(&e->layer_skip, CB_DRAFT_HEAD))) { set_err(err, err_len, "out of memory"); goto fail; }
    }
    e->params.skip_layers = NULL;  /* copied into the drafter's mask */
    if (cb_bpe_build(model, &e->bpe, NULL, 0) == CB_OK) {
        e->bpe_scratch_size = cb_bpe_scratch_size(CB_FORCED_MAX);
        e->bpe_scratch = malloc(e->bpe_scratch_size);
        if (!e->bpe_scratch) { set_err(err, err_len, "out of memory"); rc = CB_ERR_NOMEM; goto fail; }
    }
    e->next_id = 1;
    *out = e;
    return CB_OK;
fail:
    cb_engine_free(e);
    return rc;
}

static void req_release(cb_request *r) {
    free(r->prompt);
    free(r->bias_tok);
    free(r->bias_val);
    cb_matcher_free(r->matcher);
    free(r->expert_seen);
    cb_stopstr_free(&r->stop);
    memset(r, 0, sizeof *r);
}

void cb_engine_free(cb_engine *e) {
    if (!e) return;
    if (e->reqs)
        for (int i = 0; i < CB_MAX_REQUESTS; i++)
            if (e->reqs[i].state != RQ_FREE) req_release(&e->reqs[i]);
    if (e->slots)
        for (int s = 0; s < e->params.n_slots; s++) free(e->slots[s].tokens);
    cb_sampler_scratch_free(&e->sampler);
    free(e->mask);
    free(e->jobs);
    free(e->job_req);
    if (e->draft_model.model) cb_drafter_free(&e->draft_model);
    if (e->layer_skip.model) cb_drafter_free(&e->layer_skip);
    if (e->xdraft.target) cb_xdrafter_free(&e->xdraft);
    cb_bpe_free(e->bpe);
    free(e->bpe_scratch);
    cb_ctx_free(&e->ctx);
    cb_pool_free(e->pool);
    free(e->slots); free(e->reqs); free(e->order); free(e->b_tokens); free(e->b_pos);
    free(e->b_slot); free(e->b_logit); free(e->logit_req); free(e->events);
    free(e->score_target); free(e->score_argmax); free(e->score_logprob); free(e->score_top); free(e->score_top_lp);
    free(e);
}

void cb_engine_get_params(const cb_engine *e, cb_engine_params *p) { *p = e->params; }

/* ------------------------------------------------------------- requests */

static int validate_sampling(const cb_sampling_params *s, int n_vocab, char *err, size_t err_len) {
    if (!(s->temperature >= 0 && s->temperature <= 1e4)) { set_err(err, err_len, "temperature must be in [0, 10000], got %g", s->temperature); return CB_ERR_ARG; }
    if (s->top_k < 0) { set_err(err, err_len, "top_k must be >= 0, got %d", s->top_k); return CB_ERR_ARG; }
    if (!(s->top_p > 0 && s->top_p <= 1)) { set_err(err, err_len, "top_p must be in (0, 1], got %g", s->top_p); return CB_ERR_ARG; }
    if (!(s->min_p >= 0 && s->min_p <= 1)) { set_err(err, err_len, "min_p must be in [0, 1], got %g", s->min_p); return CB_ERR_ARG; }
    if (!(s->repeat_penalty > 0 && s->repeat_penalty <= 100)) { set_err(err, err_len, "repeat_penalty must be in (0, 100], got %g", s->repeat_penalty); return CB_ERR_ARG; }
    if (s->repeat_last_n < -1) { set_err(err, err_len, "repeat_last_n must be >= -1, got %d", s->repeat_last_n); return CB_ERR_ARG; }
    if (!(fabsf(s->presence_penalty) <= 100)) { set_err(err, err_len, "presence_penalty must be in [-100, 100], got %g", s->presence_penalty); return CB_ERR_ARG; }
    if (!(fabsf(s->frequency_penalty) <= 100)) { set_err(err, err_len, "frequency_penalty must be in [-100, 100], got %g", s->frequency_penalty); return CB_ERR_ARG; }
    if (s->n_logprobs < 0 || s->n_logprobs > CB_MAX_LOGPROBS) { set_err(err, err_len, "n_logprobs must be in [0, %d], got %d", CB_MAX_LOGPROBS, s->n_logprobs); return CB_ERR_ARG; }
    if (s->n_logit_bias < 0 || s->n_logit_bias > n_vocab) { set_err(err, err_len, "n_logit_bias must be in [0, n_vocab], got %d", s->n_logit_bias); return CB_ERR_ARG; }
    if (s->n_logit_bias > 0 && (!s->logit_bias_tokens || !s->logit_bias_values)) { set_err(err, err_len, "logit bias arrays are NULL"); return CB_ERR_ARG; }
    for (int i = 0; i < s->n_logit_bias; i++) {
        if (s->logit_bias_tokens[i] < 0 || s->logit_bias_tokens[i] >= n_vocab) { set_err(err, err_len, "logit_bias token %d is out of range [0, %d)", s->logit_bias_tokens[i], n_vocab); return CB_ERR_ARG; }
        float v = s->logit_bias_values[i];
        if (isnan(v) || v == INFINITY) { set_err(err, err_len, "logit_bias value for token %d must be finite or -inf", s->logit_bias_tokens[i]); return CB_ERR_ARG; }
    }
    return CB_OK;
}

int cb_engine_submit(cb_engine *e, const cb_request_params *q, int64_t *id_out, char *err, size_t err_len) {
    if (err && err_len) err[0] = 0;
    if (!e || !q || !id_out) return CB_ERR_ARG;
    int n_vocab = e->model->info.n_vocab;
    if (q->n_tokens < 1 || !q->tokens) { set_err(err, err_len, "a request needs at least one prompt token"); return CB_ERR_ARG; }
    for (int i = 0; i < q->n_tokens; i++)
        if (q->tokens[i] < 0 || q->tokens[i] >= n_vocab) { set_err(err, err_len, "prompt token %d at index %d is out of range [0, %d)", q->tokens[i], i, n_vocab); return CB_ERR_ARG; }
    if (q->slot < -1 || q->slot >= e->params.n_slots) { set_err(err, err_len, "slot %d is out of range [-1, %d)", q->slot, e->params.n_slots); return CB_ERR_ARG; }
    if (q->max_tokens < 0) { set_err(err, err_len, "max_tokens must be >= 0, got %d", q->max_tokens); return CB_ERR_ARG; }
    if (q->score && q->n_tokens < 2) { set_err(err, err_len, "scoring needs at least 2 prompt tokens (the first is context only), got %d", q->n_tokens); return CB_ERR_ARG; }
    if (q->n_stop < 0 || q->n_stop > CB_MAX_STOP) { set_err(err, err_len, "at most %d stop strings, got %d", CB_MAX_STOP, q->n_stop); return CB_ERR_ARG; }
    int rc = validate_sampling(&q->sampling, n_vocab, err, err_len);
    if (rc) return rc;
    const cb_spec_params *sp = &q->spec;
    if (sp->sources & ~(CB_SPEC_GRAMMAR | CB_SPEC_LOOKUP | CB_SPEC_DRAFT | CB_SPEC_LAYERSKIP | CB_SPEC_XDRAFT)) { set_err(err, err_len, "unknown speculative source bits 0x%x", sp->sources); return CB_ERR_ARG; }
    if (sp->sources) {
        if (sp->k_max < 1 || sp->k_max > CB_SPEC_MAX_K) { set_err(err, err_len, "speculative k_max must be in [1, %d], got %d", CB_SPEC_MAX_K, sp->k_max); return CB_ERR_ARG; }
        if (sp->ngram_min < 1 || sp->ngram_max < sp->ngram_min || sp->ngram_max > 64) { set_err(err, err_len, "prompt lookup n-gram sizes must satisfy 1 <= ngram_min <= ngram_max <= 64"); return CB_ERR_ARG; }
        if ((sp->sources & CB_SPEC_DRAFT) && !e->params.draft_model) { set_err(err, err_len, "speculative source 'draft' needs an engine created with a draft model"); return CB_ERR_ARG; }
        if ((sp->sources & CB_SPEC_XDRAFT) && !e->params.xdraft_model) { set_err(err, err_len, "speculative source 'cross_vocab' needs an engine created with a cross-vocabulary draft model"); return CB_ERR_ARG; }
        if ((sp->sources & CB_SPEC_LAYERSKIP) && !e->params.layer_skip) { set_err(err, err_len, "speculative source 'layer_skip' needs an engine created with layer_skip enabled"); return CB_ERR_ARG; }
        if ((sp->sources & CB_SPEC_GRAMMAR) && !q->grammar) { set_err(err, err_len, "speculative source 'grammar' needs a grammar on the request"); return CB_ERR_ARG; }
        if ((sp->sources & CB_SPEC_GRAMMAR) && !e->bpe) { set_err(err, err_len, "speculative source 'grammar' needs a byte-level BPE vocabulary"); return CB_ERR_UNSUPPORTED; }
    }
    int idx = -1;
    for (int i = 0; i < CB_MAX_REQUESTS; i++) if (e->reqs[i].state == RQ_FREE) { idx = i; break; }
    if (idx < 0) { set_err(err, err_len, "request table full (%d requests pending)", CB_MAX_REQUESTS); return CB_ERR_FULL; }
    cb_request *r = &e->reqs[idx];
    memset(r, 0, sizeof *r);
    if ((rc = cb_stopstr_init(&r->stop, q->n_stop, q->stop, q->stop_len, err, err_len))) return rc;
    r->prompt = malloc((size_t)q->n_tokens * sizeof(int32_t));
    int nb = q->sampling.n_logit_bias;
    r->bias_tok = malloc((size_t)(nb ? nb : 1) * sizeof(int32_t));
    r->bias_val = malloc((size_t)(nb ? nb : 1) * sizeof(float));
    if (!r->prompt || !r->bias_tok || !r->bias_val) { req_release(r); set_err(err, err_len, "out of memory"); return CB_ERR_NOMEM; }
    if (q->grammar && (rc = cb_matcher_new(q->grammar, &r->matcher)) != CB_OK) {
        req_release(r);
        set_err(err, err_len, "could not create a grammar matcher (%s)", cb_status_str(rc));
        return rc;
    }
    int n_exp = 0, n_used = 0, n_ff_exp = 0;
    cb_model_moe_info(e->model, &n_exp, &n_used, &n_ff_exp);
    if (n_exp > 0) {
        r->expert_seen = calloc(((size_t)e->model->info.n_layer * n_exp + 63) / 64, sizeof(uint64_t));
        if (!r->expert_seen) { req_release(r); set_err(err, err_len, "out of memory"); return CB_ERR_NOMEM; }
    }
    memcpy(r->prompt, q->tokens, (size_t)q->n_tokens * sizeof(int32_t));
    if (nb) {
        memcpy(r->bias_tok, q->sampling.logit_bias_tokens, (size_t)nb * sizeof(int32_t));
        memcpy(r->bias_val, q->sampling.logit_bias_values, (size_t)nb * sizeof(float));
    }
    r->sp = q->sampling;
    r->sp.logit_bias_tokens = r->bias_tok;
    r->sp.logit_bias_values = r->bias_val;
    cb_rng_seed(&r->rng, q->sampling.seed);
    r->n_prompt = q->n_tokens;
    r->slot = q->slot;
    r->max_tokens = q->max_tokens;
    r->ignore_eos = q->ignore_eos;
    r->return_logits = q->return_logits;
    r->copy_prefix = q->copy_prefix;
    r->score = q->score != 0;
    r->spec = q->spec;
    cb_spec_req_init(&r->sq);
    r->id = e->next_id++;
    r->seq = e->next_seq++;
    r->t_submit = now_ms();
    r->state = RQ_QUEUED;
    *id_out = r->id;
    return CB_OK;
}

static cb_request *find_req(cb_engine *e, int64_t id) {
    for (int i = 0; i < CB_MAX_REQUESTS; i++)
        if (e->reqs[i].state != RQ_FREE && e->reqs[i].id == id) return &e->reqs[i];
    return NULL;
}

int cb_engine_cancel(cb_engine *e, int64_t id) {
    cb_request *r = find_req(e, id);
    if (!r) return CB_ERR_NOT_FOUND;
    r->cancelled = 1;
    return CB_OK;
}

int cb_engine_pending(const cb_engine *e) {
    int n = 0;
    for (int i = 0; i < CB_MAX_REQUESTS; i++) n += e->reqs[i].state != RQ_FREE;
    return n;
}

/* --------------------------------------------------------------- events */

static cb_event *push_event(cb_engine *e, int type, const cb_request *r) {
    /* capacity: in one step a running request (<= 256) emits at most a score,
     * a token and a done event, any other request at most an error */
    cb_event *ev = &e->events[(e->ev_head + e->ev_count) % e->ev_cap];
    e->ev_count++;
    memset(ev, 0, offsetof(cb_event, metrics));
    ev->type = type;
    ev->id = r->id;
    return ev;
}

static void order_remove(cb_engine *e, int idx) {
    for (int i = 0; i < e->n_order; i++)
        if (e->order[i] == idx) {
            memmove(e->order + i, e->order + i + 1, (size_t)(e->n_order - i - 1) * sizeof(int));
            e->n_order--;
            return;
        }
}

/* Finish request idx: DONE event with metrics, free its slot and entry. */
static void finish(cb_engine *e, int idx, int reason, int stop_offset) {
    cb_request *r = &e->reqs[idx];
    double t = now_ms();
    cb_event *ev = push_event(e, CB_EVENT_DONE, r);
    cb_request_metrics *M = &ev->metrics;
    memset(M, 0, sizeof *M);
    M->prompt_tokens = r->n_prompt;
    M->cached_tokens = r->cached;
    M->completion_tokens = r->n_gen;
    M->e2e_ms = t - r->t_submit;
    M->queue_ms = (r->t_admit > 0 ? r->t_admit : t) - r->t_submit;
    M->prefill_ms = r->t_prefill_done > 0 ? r->t_prefill_done - r->t_submit : 0;
    M->ttft_ms = r->t_first > 0 ? r->t_first - r->t_submit : 0;
    M->decode_ms = r->t_first > 0 ? t - r->t_first : 0;
    M->tpot_ms = r->n_gen > 1 ? M->decode_ms / (r->n_gen - 1) : 0;
    M->decode_tok_s = r->n_gen > 1 && M->decode_ms > 0 ? (r->n_gen - 1) * 1e3 / M->decode_ms : 0;
    M->slot = r->state == RQ_QUEUED ? -1 : r->slot;
    M->finish_reason = reason;
    M->stop_offset = stop_offset;
    M->grammar_mask_us = r->n_masks ? r->mask_us / r->n_masks : 0;
    M->experts_routed = r->experts_routed;
    if (r->expert_seen) {
        int n_exp = 0, n_used = 0, n_ff_exp = 0;
        cb_model_moe_info(e->model, &n_exp, &n_used, &n_ff_exp);
        size_t words = ((size_t)e->model->info.n_layer * n_exp + 63) / 64;
        for (size_t w = 0; w < words; w++) M->experts_unique += __builtin_popcountll(r->expert_seen[w]);
    }
    M->draft_n = r->spec_m.draft_n;
    M->draft_accepted = r->spec_m.draft_accepted;
    M->draft_steps = r->spec_m.draft_steps;
    memcpy(M->draft_n_source, r->spec_m.draft_n_source, sizeof M->draft_n_source);
    memcpy(M->draft_accepted_source, r->spec_m.draft_accepted_source, sizeof M->draft_accepted_source);
    memcpy(M->draft_n_pos, r->spec_m.draft_n_pos, sizeof M->draft_n_pos);
    memcpy(M->draft_accepted_pos, r->spec_m.draft_accepted_pos, sizeof M->draft_accepted_pos);
    M->draft_ms = r->draft_ms;
    if (r->state == RQ_PREFILL || r->state == RQ_DECODE) {
        cb_slot *s = &e->slots[r->slot];
        s->req = -1;
        s->last_used = ++e->lru_clock;
        order_remove(e, idx);
    }
    req_release(r);
}

static void error_event(cb_engine *e, int idx, int status, const char *fmt, ...) {
    cb_request *r = &e->reqs[idx];
    cb_event *ev = push_event(e, CB_EVENT_ERROR, r);
    ev->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ev->message, sizeof ev->message, fmt, ap);
    va_end(ap);
    if (r->state == RQ_PREFILL || r->state == RQ_DECODE) {
        e->slots[r->slot].req = -1;
        e->slots[r->slot].last_used = ++e->lru_clock;
        order_remove(e, idx);
    }
    req_release(r);
}

/* ------------------------------------------------------------ admission */

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

static void admit(cb_engine *e) {
    const cb_engine_params *P = &e->params;
    for (;;) {
        /* oldest queued request that can be placed now */
        int best = -1;
        for (int i = 0; i < CB_MAX_REQUESTS; i++) {
            cb_request *r = &e->reqs[i];
            if (r->state != RQ_QUEUED) continue;
            if (r->slot >= 0 && e->slots[r->slot].req >= 0) continue;  /* pinned slot busy: wait */
            if (best < 0 || r->seq < e->reqs[best].seq) best = i;
        }
        if (best < 0) return;
        cb_request *r = &e->reqs[best];
        if (r->n_prompt + r->max_tokens > P->n_ctx) {
            error_event(e, best, CB_ERR_CONTEXT,
                        "context_length_exceeded: %d prompt tokens + %d max_tokens > context of %d",
                        r->n_prompt, r->max_tokens, P->n_ctx);
            continue;
        }
        int s = r->slot, match = 0;
        if (s < 0) {
            int lru = -1;
            for (int i = 0; i < P->n_slots; i++) {
                cb_slot *sl = &e->slots[i];
                if (sl->req >= 0) continue;
                int m = P->prefix_reuse && !r->score ? common_prefix(sl->tokens, sl->n_past, r->prompt, r->n_prompt) : 0;
                if (s < 0 || m > match || (m == match && sl->last_used < e->slots[s].last_used)) { s = i; match = m; }
                if (lru < 0 || sl->last_used < e->slots[lru].last_used) lru = i;
            }
            /* A short match (a chat template's first tokens) is not worth
             * evicting another conversation's long history for: take the
             * least recently used free slot instead (empty slots first). */
            if (s >= 0 && match < CB_MIN_REUSE && match < r->n_prompt / 2) s = lru;
            if (s < 0) {
                /* no free slot: only requests pinned to a free slot may still go */
                int pinned = -1;
                for (int i = 0; i < CB_MAX_REQUESTS; i++) {
                    cb_request *q = &e->reqs[i];
                    if (q->state == RQ_QUEUED && q->slot >= 0 && e->slots[q->slot].req < 0 &&
                        (pinned < 0 || q->seq < e->reqs[pinned].seq)) pinned = i;
                }
                if (pinned < 0) return;
                best = pinned;
                r = &e->reqs[best];
                s = r->slot;
                if (r->n_prompt + r->max_tokens > P->n_ctx) continue;  /* refused next round */
            }
        }
        cb_slot *sl = &e->slots[s];
        /* a scoring request needs every position's row: it computes the whole prompt */
        match = P->prefix_reuse && !r->score ? common_prefix(sl->tokens, sl->n_past, r->prompt, r->n_prompt) : 0;
        if (match > r->n_prompt - 1) match = r->n_prompt - 1;  /* the last prompt token must run for logits */
        match = cb_kv_usable(&e->ctx, s, match);  /* a sliding window's ring may have moved on */
        if (P->prefix_reuse && r->copy_prefix && !r->score) {
            int src = -1, src_match = match;
            for (int i = 0; i < P->n_slots; i++) {
                if (i == s) continue;
                int m = common_prefix(e->slots[i].tokens, e->slots[i].n_past, r->prompt, r->n_prompt);
                if (m > r->n_prompt - 1) m = r->n_prompt - 1;
                m = cb_kv_usable(&e->ctx, i, m);
                if (m > src_match) { src = i; src_match = m; }
            }
            if (src >= 0) {
                /* positions < n_past of a running slot are never rewritten, so copying is safe */
                cb_kv_copy(&e->ctx, s, src, src_match);
                memcpy(sl->tokens, e->slots[src].tokens, (size_t)src_match * sizeof(int32_t));
                match = src_match;
            }
        }
        sl->n_past = match;
        cb_kv_keep(&e->ctx, s, match);
        sl->req = best;
        r->slot = s;
        r->cached = match;
        r->n_prompt_done = match;
        r->state = RQ_PREFILL;
        r->t_admit = now_ms();
        e->order[e->n_order++] = best;
    }
}

/* ----------------------------------------------------------------- step */

/* Copy queued events to the caller. */
static int drain(cb_engine *e, cb_event *out, int max_events) {
    int n = 0;
    while (n < max_events && e->ev_count > 0) {
        out[n++] = e->events[e->ev_head];
        e->ev_head = (e->ev_head + 1) % e->ev_cap;
        e->ev_count--;
    }
    return n;
}

/* Sample logits row `lr` for request idx with history = the slot's first
 * n_past tokens, and emit token / done events.  Returns the token, or -1 when
 * the request ended (finished or failed; its entry is then released). */
static int sample_row(cb_engine *e, int idx, int lr) {
    cb_request *r = &e->reqs[idx];
    cb_slot *sl = &e->slots[r->slot];
    const float *logits = e->ctx.logits + (size_t)lr * e->model->info.n_vocab;
    cb_sample_result res;
    const uint32_t *mask = NULL;
    if (r->matcher) {
        double tg = now_ms();
        /* budget: the output must stay completable within the tokens left
         * after this one, so a constrained output is complete at max_tokens */
        int allowed = cb_matcher_fill_mask_budget(r->matcher, e->mask, r->max_tokens - r->n_gen - 1);
        double dt = now_ms() - tg;
        r->mask_us += dt * 1e3;
        r->n_masks++;
        e->step_grammar_ms += dt;
        if (allowed < 0) {
            /* the grammar's input, not the engine, is at fault: an argument error */
            error_event(e, idx, allowed == CB_ERR_NOMEM ? allowed : CB_ERR_ARG,
                        "grammar too ambiguous to follow after %d tokens: its parse needs more stacks than the "
                        "matcher's bounds (%s); make the grammar less ambiguous", r->n_gen, cb_status_str(allowed));
            return -1;
        }
        if (allowed == 0) {
            error_event(e, idx, CB_ERR_ARG,
                        "grammar dead end: no token can continue the output (%d tokens generated)", r->n_gen);
            return -1;
        }
        mask = e->mask;
    }
    /* Plain greedy rows (no bias, penalties or logprobs) take the token the
     * LM head found as it wrote the row (cb_matmul_argmax): what cb_sample
     * would give, except where it must decide itself (a +inf maximum, or no
     * valid token).  Under a grammar too when the mask allows that token:
     * the lowest index of the maximum over all tokens is then also the
     * lowest index of the maximum over the allowed ones. */
    const cb_ctx *c = &e->ctx;
    int rc;
    int32_t head = (int32_t)c->head_idx[lr];
    if (cb_sample_is_argmax(&r->sp) && head >= 0 && c->head_max[lr] != INFINITY &&
        (!mask || (mask[head >> 5] >> (head & 31) & 1u))) {
        res.token = head;
        res.logprob = NAN;
        res.n_top = 0;
        rc = CB_OK;
    } else {
        rc = cb_sample(&r->sp, &r->rng, &e->sampler, logits, sl->tokens, sl->n_past, mask, &res);
    }
    if (rc != CB_OK) {
        error_event(e, idx, rc, mask ? "sampling failed: every token the grammar allows is banned by logit_bias"
                                     : "sampling failed: every token is banned by logit_bias");
        return -1;
    }
    double t = now_ms();
    if (r->n_gen == 0) r->t_first = t;
    int eog = cb_model_token_is_eog(e->model, res.token);
    if (eog && (!r->ignore_eos || r->matcher)) { finish(e, idx, CB_FINISH_STOP, -1); return -1; }
    if (r->matcher && cb_matcher_accept(r->matcher, res.token) != CB_OK) {
        error_event(e, idx, CB_ERR_ARG, "internal error: sampled token %d is not accepted by the grammar", res.token);
        return -1;
    }
    cb_event *ev = push_event(e, CB_EVENT_TOKEN, r);
    ev->token = res.token;
    ev->logprob = res.logprob;
    ev->n_top = res.n_top;
    memcpy(ev->top_tokens, res.top_tokens, sizeof ev->top_tokens);
    memcpy(ev->top_logprobs, res.top_logprobs, sizeof ev->top_logprobs);
    ev->logits = r->return_logits ? logits : NULL;
    r->n_gen++;
    size_t nbytes = 0;
    const uint8_t *bytes = cb_model_token_bytes(e->model, res.token, &nbytes);
    int64_t stop_at = bytes ? cb_stopstr_feed(&r->stop, bytes, nbytes) : -1;
    if (stop_at >= 0) { finish(e, idx, CB_FINISH_STOP, (int)stop_at); return -1; }
    if (r->n_gen >= r->max_tokens) {
        /* a grammar output the budget brought to an accepting state is complete: a stop, not a cut */
        finish(e, idx, r->matcher && cb_matcher_is_accepting(r->matcher) ? CB_FINISH_STOP : CB_FINISH_LENGTH, -1);
        return -1;
    }
    if (sl->n_past + 1 > e->params.n_ctx) { finish(e, idx, CB_FINISH_CONTEXT, -1); return -1; }
    r->pending = res.token;
    r->state = RQ_DECODE;
    return res.token;
}

/* ------------------------------------------------------------- drafting */

/* Grammar-forced draft: the bytes the grammar forces next, tokenized as the
 * tokenizer would.  Only the leading tokens that no following text can change
 * are kept (" wor" tokenizes as " w" "or" but " world" is one token). */
static int grammar_draft(cb_engine *e, cb_request *r, int k, int32_t *out) {
    uint8_t buf[CB_FORCED_MAX];
    int nb = cb_matcher_forced_bytes(r->matcher, buf, CB_FORCED_MAX);
    if (nb <= 0) return 0;
    int32_t ids[CB_FORCED_MAX];
    int stable = 0;
    int n = cb_bpe_tokenize_ex(e->bpe, buf, (size_t)nb, ids, CB_FORCED_MAX, e->bpe_scratch, e->bpe_scratch_size, &stable);
    if (n <= 0 || n > CB_FORCED_MAX) return 0;
    n = stable;  /* only tokens no following text could re-merge */
    if (n > k) n = k;
    memcpy(out, ids, (size_t)n * sizeof(int32_t));
    return n;
}

static cb_drafter *drafter_of(cb_engine *e, int bit) {
    if (bit == cb_spec_bit(CB_SPEC_DRAFT)) return &e->draft_model;
    if (bit == cb_spec_bit(CB_SPEC_LAYERSKIP)) return &e->layer_skip;
    if (bit == cb_spec_bit(CB_SPEC_XDRAFT)) return &e->xdraft.d;
    return NULL;
}

/* Choose the draft of one decoding request with speculation on, within
 * `room` extra rows.  Adaptive: every enabled source is priced for this
 * request (expected tokens per unit of measured step time, spec.c) and the
 * best one that pays drafts; a grammar-forced span is taken whenever there is
 * one (it is what the mask will allow anyway).  Not adaptive: the first
 * source in priority order that proposes something.  A grammar or lookup
 * draft is made here (returns its rows); a drafter's is queued for the
 * batched pass (pending_drafter counts its requests). */
static int choose_draft(cb_engine *e, cb_request *r, int base_rows, int room, int *pending_drafter) {
    static const int order[CB_SPEC_N_SOURCES] = { CB_SPEC_GRAMMAR, CB_SPEC_LOOKUP, CB_SPEC_DRAFT, CB_SPEC_XDRAFT,
                                                  CB_SPEC_LAYERSKIP };
    cb_slot *sl = &e->slots[r->slot];
    /* drafts are useless past max_tokens and impossible past the context */
    int cap = r->max_tokens - r->n_gen - 1;
    if (cap > e->params.n_ctx - sl->n_past - 1) cap = e->params.n_ctx - sl->n_past - 1;
    if (cap > room) cap = room;
    if (cap > CB_SPEC_MAX_K) cap = CB_SPEC_MAX_K;
    if (cap <= 0) return 0;
    r->draft_cap = cap;
    sl->tokens[sl->n_past] = r->pending;  /* history: the slot's tokens plus the pending one */
    int32_t ldraft[CB_SPEC_MAX_K];
    int best = -1, best_k = 0, best_cls = 0;
    double best_g = 1.0;
    for (int i = 0; i < CB_SPEC_N_SOURCES; i++) {
        int src = order[i];
        if (!(r->spec.sources & src)) continue;
        int bit = cb_spec_bit(src), k = 0, cls = 0;
        double g = 0, t = now_ms();
        if (src == CB_SPEC_GRAMMAR) {
            k = cb_spec_policy_k(&e->policy, bit, &r->spec, base_rows);
            if (k > cap) k = cap;
            if (k > 0 && r->matcher) k = grammar_draft(e, r, k, r->draft);
            if (k <= 0) continue;
            double dt = now_ms() - t;
            e->policy.draft_ms_tok[bit] = 0.9 * e->policy.draft_ms_tok[bit] + 0.1 * dt / k;
            r->draft_ms += dt;
            best = bit, best_k = k;
            break;
        } else if (src == CB_SPEC_LOOKUP) {
            /* a lookup draft costs next to nothing: find it first, then
             * price it by how long the match is (its acceptance class) */
            int avail = r->spec.k_max < cap ? r->spec.k_max : cap, mlen = 0;
            int got = cb_lookup_draft_ex(sl->tokens, sl->n_past + 1, r->spec.ngram_min, r->spec.ngram_max, avail,
                                         ldraft, &mlen);
            double dt = now_ms() - t;
            r->draft_ms += dt;
            if (got <= 0) continue;
            e->policy.draft_ms_tok[bit] = 0.9 * e->policy.draft_ms_tok[bit] + 0.1 * dt / got;
            cls = cb_lookup_class(mlen);
            k = cb_spec_policy_k_class_req(&e->policy, &r->sq, bit, cls, &r->spec, base_rows, got);
            if (k > got) k = got;
            g = e->policy.st[bit].expected_gain;
            if (k > 0 && g < 1.0) g = 1.0 + 1e-9;  /* a probe: only when nothing else pays */
            /* a lookup draft is found already and a shallow verify costs about a
             * decode step: a class still learning is tried before a drafter
             * whose learned estimate its prior could never beat (measured: on a
             * code edit the 0.5B draft model's 0.96 acceptance kept lookup from
             * ever being tried, 1.47x where lookup alone gave 2.25x) */
            if (k > 0 && r->spec.adaptive && cb_spec_policy_class_learning(&e->policy, bit, cls)) g = 1e9;
        } else {
            k = cb_spec_policy_plan(&e->policy, &r->sq, bit, &r->spec, base_rows, cap, &g);
        }
        if (k <= 0) continue;
        if (!r->spec.adaptive) { best = bit, best_k = k, best_cls = cls; break; }
        if (g > best_g) { best = bit, best_k = k, best_g = g, best_cls = cls; }
    }
    /* lookup's share of steps saved counts the steps it was there for and
     * nothing else drafted (a step another source drafts is not lookup's) */
    int lk = cb_spec_bit(CB_SPEC_LOOKUP);
    if ((r->spec.sources & CB_SPEC_LOOKUP) && (best < 0 || best == lk)) cb_spec_policy_consider(&e->policy, lk);
    if (best < 0) return 0;
    r->draft_cls = best_cls;
    r->n_draft_model = best_k;
    if (best == cb_spec_bit(CB_SPEC_GRAMMAR)) {
        r->n_draft = best_k;
        r->draft_src = best;
        return best_k;
    } else if (best == cb_spec_bit(CB_SPEC_LOOKUP)) {
        memcpy(r->draft, ldraft, (size_t)best_k * sizeof(int32_t));
        r->n_draft = best_k;
        r->draft_src = best;
        return best_k;
    }
    /* queue for the batched drafter pass */
    r->draft_src = 0x100 | best;  /* marker: waiting for drafter `best` */
    r->k_want = best_k;
    pending_drafter[best]++;
    return 0;
}

/* A drafter's draft continued by prompt lookup (cb_draft_extend_fn): once
 * the history and the tokens drafted so far end in a match whose lookup
 * class pays on top of the rows already drafted, the rest of the draft is
 * what followed the match, and the drafter stops.  Where an edit returns to
 * copied text this drafts the copy at no drafting cost. */
static int extend_by_lookup(void *ctx, int idx, const int32_t *drafted, int n, int32_t *ext, int want, int cap) {
    cb_engine *e = ctx;
    cb_request *r = &e->reqs[idx];
    cb_slot *sl = &e->slots[r->slot];
    int n_hist = sl->n_past + 1;  /* the slot's tokens and the pending one */
    if (n < 1 || cap < 1 || n_hist + n + cap > e->params.n_ctx) return 0;
    /* the drafts go where the verify batch will put them (batch_decode_rows) */
    memcpy(sl->tokens + n_hist, drafted, (size_t)n * sizeof(int32_t));
    int mlen = 0;
    int got = cb_lookup_draft_ex(sl->tokens, n_hist + n, r->spec.ngram_min, r->spec.ngram_max, cap, ext, &mlen);
    if (got <= 0) return 0;
    int cls = cb_lookup_class(mlen);
    int k = cb_spec_policy_k_ext(&e->policy, &r->sq, cb_spec_bit(CB_SPEC_LOOKUP), cls, &r->spec,
                                 e->plan_base_rows + n, got);
    if (k > got) k = got;
    if (k < want || k < 1) return 0;  /* shallower than the drafter would go: it drafts on */
    r->ext_cls = cls;
    return k;
}

/* One drafting pass of drafter `b` for every request queued for it, within
 * *room extra rows; its time is split over the requests by the tokens each got. */
static void run_drafter(cb_engine *e, int b, int *room) {
    cb_drafter *d = drafter_of(e, b);
    int nj = 0;
    for (int o = 0; o < e->n_order; o++) {
        int idx = e->order[o];
        cb_request *r = &e->reqs[idx];
        if (r->state != RQ_DECODE || r->draft_src != (0x100 | b)) continue;
        cb_slot *sl = &e->slots[r->slot];
        int k = r->k_want < *room ? r->k_want : *room;
        r->draft_src = b;
        if (k <= 0) continue;
        *room -= k;
        cb_draft_job *J = &e->jobs[nj];
        memset(J, 0, sizeof *J);
        J->slot = r->slot;
        J->hist = sl->tokens;
        J->n_hist = sl->n_past + 1;
        J->k = k;
        J->k_total = k;
        J->n_model = -1;
        J->out = r->draft;
        e->job_req[nj++] = idx;
    }
    /* a same-vocabulary drafter's draft may continue by prompt lookup, in
     * the rows left after every job's own (shared evenly) */
    if (b != cb_spec_bit(CB_SPEC_XDRAFT) && nj > 0) {
        int share = *room / nj;
        for (int j = 0; j < nj; j++) {
            cb_request *r = &e->reqs[e->job_req[j]];
            cb_draft_job *J = &e->jobs[j];
            if (!(r->spec.sources & CB_SPEC_LOOKUP)) continue;
            int total = r->draft_cap < J->k + share ? r->draft_cap : J->k + share;
            if (total > r->spec.k_max) total = r->spec.k_max;  /* k_max bounds the whole draft */
            if (total > CB_SPEC_MAX_K) total = CB_SPEC_MAX_K;
            if (total <= J->k) continue;
            J->k_total = total;
            J->extend = extend_by_lookup;
            J->extend_ctx = e;
            J->extend_arg = e->job_req[j];
            *room -= total - J->k;
        }
    }
    double t = now_ms();
    if (b == cb_spec_bit(CB_SPEC_XDRAFT)) cb_xdrafter_draft(&e->xdraft, e->jobs, nj);
    else cb_drafter_draft(d, e->jobs, nj);
    int made = 0;
    for (int j = 0; j < nj; j++) {
        cb_draft_job *J = &e->jobs[j];
        cb_request *r = &e->reqs[e->job_req[j]];
        int reserved = J->k_total > 0 ? J->k_total : 0;
        r->n_draft = J->n_out;
        r->n_draft_model = J->n_model >= 0 && J->n_model <= J->n_out ? J->n_model : J->n_out;
        made += r->n_draft_model;
        if (reserved > J->n_out) *room += reserved - J->n_out;  /* rows not used go back */
    }
    double total = now_ms() - t, spent = total - cb_drafter_last_catchup_ms(d);
    for (int j = 0; j < nj; j++)  /* the pass's time, split by the tokens each request got */
        e->reqs[e->job_req[j]].draft_ms += made > 0 ? total * e->reqs[e->job_req[j]].n_draft_model / made : total / nj;
    if (made > 0) e->policy.draft_ms_tok[b] = 0.9 * e->policy.draft_ms_tok[b] + 0.1 * spent / made;  /* per drafter token */
    else if (nj > 0) e->policy.draft_ms_tok[b] = 0.9 * e->policy.draft_ms_tok[b] + 0.1 * spent / nj;
}

/* Drafts for every decoding request with speculation on (choose_draft), then
 * one batched pass per drafter for all requests using it (run_drafter).
 * `room` bounds the extra rows (batch and logits capacity). */
static void make_drafts(cb_engine *e, int base_rows, int room) {
    int pending_drafter[CB_SPEC_N_SOURCES] = { 0 };
    double td = now_ms();
    e->plan_base_rows = base_rows;
    for (int o = 0; o < e->n_order; o++) {
        cb_request *r = &e->reqs[e->order[o]];
        r->n_draft = 0;
        r->n_draft_model = 0;
        r->draft_cls = 0;
        if (r->state != RQ_DECODE || !r->spec.sources) continue;
        room -= choose_draft(e, r, base_rows, room, pending_drafter);
    }
    for (int b = 0; b < CB_SPEC_N_SOURCES; b++)
        if (pending_drafter[b]) run_drafter(e, b, &room);
    e->step_draft_ms += now_ms() - td;
}



int cb_engine_spec_stats(const cb_engine *e, int source, cb_spec_stats *out) {
    int b = cb_spec_bit(source);
    if (!e || !out || b < 0) return CB_ERR_ARG;
    *out = e->policy.st[b];
    out->draft_ms = e->policy.draft_ms_tok[b] * (double)out->draft_tokens;
    return CB_OK;
}

/* ------------------------------------------------------------- the step
 *
 * cb_engine_step runs the phases below in order; each is one function.  A
 * step's rows are counted in a step_rows as the batch is built. */

typedef struct {
    int n;             /* batch rows */
    int n_logit;       /* logits rows */
    int rows_decode;   /* decode rows (with their drafts) */
    int rows_prefill;  /* prompt rows */
} step_rows;

/* The context's running counters when the step began: the step's profile is
 * their differences at its end. */
typedef struct {
    double t0, matmul, attention, lm_head, norm, rope, wait;
    double matmul_type[CB_N_TYPES];
    int64_t expert_runs, expert_routed;  /* MoE step stats */
} step_mark;

static void mark_step(cb_engine *e, step_mark *m) {
    cb_ctx *c = &e->ctx;
    m->t0 = now_ms();
    m->matmul = c->t_matmul, m->attention = c->t_attention, m->lm_head = c->t_lm_head;
    m->norm = c->t_norm, m->rope = c->t_rope, m->wait = cb_pool_wait_ms(e->pool);
    memcpy(m->matmul_type, c->t_matmul_type, sizeof m->matmul_type);
    m->expert_runs = c->n_expert_runs, m->expert_routed = c->n_expert_routed;
}

/* 1. cancellations */
static void finish_cancelled(cb_engine *e) {
    for (int i = 0; i < CB_MAX_REQUESTS; i++)
        if (e->reqs[i].state != RQ_FREE && e->reqs[i].cancelled) finish(e, i, CB_FINISH_CANCELLED, -1);
}

/* 3a. drafts for the decoding requests, within the rows the step has left */
static void plan_drafts(cb_engine *e, int n_decoding, int n_prefilling) {
    e->step_draft_ms = 0;
    /* drafts leave a logits row for each prefilling request, so that a
     * prompt's last row (and a scored chunk) always finds room */
    int room = e->ctx.n_logits - n_decoding - n_prefilling;
    if (room > e->params.n_batch - n_decoding) room = e->params.n_batch - n_decoding;
    for (int k = 0; k < e->n_order; k++) e->reqs[e->order[k]].draft_src = 0;
    if (room > 0) make_drafts(e, n_decoding, room);
}

/* 3b. a decode row for every running request, each followed by its drafts */
static void batch_decode_rows(cb_engine *e, step_rows *s) {
    for (int k = 0; k < e->n_order; k++) {
        cb_request *r = &e->reqs[e->order[k]];
        if (r->state != RQ_DECODE) continue;
        cb_slot *sl = &e->slots[r->slot];
        r->base_pos = sl->n_past;
        r->lrow0 = s->n_logit;
        for (int j = 0; j <= r->n_draft; j++) {
            int32_t tok = j == 0 ? r->pending : r->draft[j - 1];
            sl->tokens[r->base_pos + j] = tok;
            e->b_tokens[s->n] = tok;
            e->b_pos[s->n] = r->base_pos + j;
            e->b_slot[s->n] = r->slot;
            e->logit_req[s->n_logit] = e->order[k];
            e->b_logit[s->n++] = s->n_logit++;
            s->rows_decode++;
        }
    }
}

/* The prompt rows a step may take.  In a step in which requests decode,
 * n_chunk is the rows of the whole step (Sarathi-Serve's token budget): a
 * prompt row costs what a decode row costs (one row more through the same
 * matmuls), and past a few rows each one lengthens the step, so the decode
 * rows (with their drafts) count first and the prompts, all together in
 * admission order, share the rest -- at least a quarter of n_chunk, so that
 * prompts progress however many streams decode.  A step in which nothing
 * decodes stalls no stream: its prompts take every row the batch has (a lone
 * prompt is not spread over steps).
 *
 * The budget and the slack are a stream's share: when more prompts wait than
 * streams decode, both scale by prompts per stream (the budget rounded up).  A step's
 * extra time is paid once by each decoding stream, a prompt's wait once by
 * each waiting request; without the scaling a lone stream held seven prompts
 * that arrived just after it to a few rows a step between them, 86 steps
 * before all had a first token (qwen2.5-coder-1.5b, 8 closed-loop clients:
 * 1.7 decode rows a step and less throughput at 8 clients than at 4). */
static int prompt_budget(const cb_engine *e, int rows_decode, int n_decoding, int n_prefilling) {
    if (rows_decode == 0) return e->params.n_batch;
    const int n = e->params.n_chunk, least = (n + 3) / 4;
    const double share = n_decoding > 0 && n_prefilling > n_decoding ? (double)n_prefilling / n_decoding : 1.0;
    const int base = n - rows_decode > least ? n - rows_decode : least;
    const double scaled = ceil(base * share);
    const int budget = scaled < e->params.n_batch ? (int)scaled : e->params.n_batch;
    /* within that budget, the rows the measured step times allow: a stream's
     * token gap beside a prompt stays within share x prompt_slack of a
     * decode-only step (0: not measured yet, the budget stands) */
    const int k = cb_spec_prompt_rows(&e->policy, rows_decode, budget, e->params.prompt_slack * share);
    return k > 0 ? k : budget;
}

/* 3c. prefill chunks, in admission order, while the batch has room */
static void batch_prefill_chunks(cb_engine *e, step_rows *s, int n_decoding, int n_prefilling) {
    int later = n_prefilling;  /* prefilling requests from here on, each may need a row for its last token */
    int budget = prompt_budget(e, s->rows_decode, n_decoding, n_prefilling);
    for (int k = 0; k < e->n_order && s->n < e->params.n_batch && budget > 0; k++) {
        int idx = e->order[k];
        cb_request *r = &e->reqs[idx];
        if (r->state != RQ_PREFILL) continue;
        later--;
        int left = r->n_prompt - r->n_prompt_done;
        int chunk = left < budget ? left : budget;
        if (chunk > e->params.n_batch - s->n) chunk = e->params.n_batch - s->n;
        cb_slot *sl = &e->slots[r->slot];
        r->score_lr0 = s->n_logit;
        r->score_n = 0;
        r->score_pos = r->n_prompt_done;
        int j = 0;
        for (; j < chunk; j++) {
            int pos = r->n_prompt_done + j;
            int last = pos == r->n_prompt - 1;
            int wants = (last && r->max_tokens > 0) || (!last && r->score);
            /* no logits row left: the rest waits a step (scored rows leave
             * one for each later prefill, so a long score cannot hold back
             * another prompt's last token) */
            if (wants && s->n_logit >= e->ctx.n_logits - (last ? 0 : later)) break;
            sl->tokens[pos] = r->prompt[pos];
            e->b_tokens[s->n] = r->prompt[pos];
            e->b_pos[s->n] = pos;
            e->b_slot[s->n] = r->slot;
            e->b_logit[s->n] = -1;
            if (wants) {
                e->logit_req[s->n_logit] = last ? idx : -1;  /* scored rows are not sampled */
                if (!last) {
                    e->score_target[s->n_logit] = r->prompt[pos + 1];
                    r->score_n++;
                }
                e->b_logit[s->n] = s->n_logit++;
            }
            s->n++;
        }
        s->rows_prefill += j;
        budget -= j;
    }
}

/* MoE: attribute each row's routed experts to its request */
static void attribute_experts(cb_engine *e, int n) {
    cb_ctx *c = &e->ctx;
    int n_layer = e->model->info.n_layer;
    int32_t sel[64];
    for (int i = 0; i < n; i++) {
        cb_request *r = NULL;
        int ri = e->slots[e->b_slot[i]].req;
        if (ri >= 0) r = &e->reqs[ri];
        if (!r || !r->expert_seen) continue;
        for (int l = 0; l < n_layer; l++) {
            int k = cb_ctx_row_experts(c, i, l, sel);
            for (int j = 0; j < k && j < 64; j++) {
                size_t bit = (size_t)l * c->n_expert + (size_t)sel[j];
                r->expert_seen[bit / 64] |= 1ull << (bit % 64);
            }
            if (k > 0) r->experts_routed += k;
        }
    }
}

/* 4. one forward over the batch; the slots then hold KV for its rows */
static void run_forward(cb_engine *e, int n) {
    cb_ctx *c = &e->ctx;
    if (n > 0) {
        cb_batch b = { n, e->b_tokens, e->b_pos, e->b_slot, e->b_logit };
        c->trace_step = e->n_steps;
        cb_forward(c, &b);
    }
    if (n > 0 && c->n_expert > 0) attribute_experts(e, n);
    /* slots now hold KV for the rows just computed */
    for (int i = 0; i < n; i++) {
        cb_slot *sl = &e->slots[e->b_slot[i]];
        if (e->b_pos[i] + 1 > sl->n_past) sl->n_past = e->b_pos[i] + 1;
    }
}

/* A prompt the target finished prefilling in this step goes through the
 * drafters its request may draft with, in this step: the
 * drafter's prefill is part of the prompt's (it delays the first token, as
 * the target's own prefill does), and the first draft then has only the
 * pending token to catch up on. */
static void sync_drafters(cb_engine *e) {
    double t = now_ms();
    int ran = 0;
    for (int k = 0; k < e->n_order; k++) {
        cb_request *r = &e->reqs[e->order[k]];
        if (r->state != RQ_PREFILL || r->drafters_synced || r->max_tokens <= 0) continue;
        cb_slot *sl = &e->slots[r->slot];
        if (sl->n_past < r->n_prompt) continue;
        r->drafters_synced = 1;
        if ((r->spec.sources & CB_SPEC_DRAFT) && e->draft_model.model)
            ran += cb_drafter_sync(&e->draft_model, r->slot, sl->tokens, sl->n_past);
        if ((r->spec.sources & CB_SPEC_LAYERSKIP) && e->layer_skip.model)
            ran += cb_drafter_sync(&e->layer_skip, r->slot, sl->tokens, sl->n_past);
        if ((r->spec.sources & CB_SPEC_XDRAFT) && e->xdraft.target)
            ran += cb_xdrafter_sync(&e->xdraft, r->slot, sl->tokens, sl->n_past);
    }
    if (ran) e->step_draft_ms += now_ms() - t;  /* drafter work: kept out of the verify-cost record */
}

/* prompts' progress; `ts` is when a prompt that ended in this step was prefilled */
static void advance_prefills(cb_engine *e, double ts) {
    for (int k = 0; k < e->n_order; k++) {
        cb_request *r = &e->reqs[e->order[k]];
        if (r->state == RQ_PREFILL) {
            r->n_prompt_done = e->slots[r->slot].n_past;
            if (r->n_prompt_done >= r->n_prompt) r->t_prefill_done = ts;
        }
    }
}

/* scored prompt rows: one SCORE event per scoring request, before its
 * first token (a request whose prompt ends in this step samples next) */
static void emit_scores(cb_engine *e) {
    cb_ctx *c = &e->ctx;
    for (int k = 0; k < e->n_order; k++) {
        cb_request *r = &e->reqs[e->order[k]];
        if (r->state != RQ_PREFILL || !r->score || r->score_n == 0) continue;
        const int n_vocab = e->model->info.n_vocab, lr0 = r->score_lr0, nt = r->sp.n_logprobs;
        const float *rows = c->logits + (size_t)lr0 * n_vocab;
        int32_t *top = e->score_top + (size_t)lr0 * CB_MAX_LOGPROBS;
        float *top_lp = e->score_top_lp + (size_t)lr0 * CB_MAX_LOGPROBS;
        cb_score_batch(e->pool, rows, r->score_n, n_vocab, e->score_target + lr0, nt,
                       e->score_logprob + lr0, e->score_argmax + lr0, top, top_lp);
        cb_event *ev = push_event(e, CB_EVENT_SCORE, r);
        ev->score.pos = r->score_pos;
        ev->score.n = r->score_n;
        ev->score.n_top = nt;
        ev->score.logprob = e->score_logprob + lr0;
        ev->score.argmax = e->score_argmax + lr0;
        ev->score.top_tokens = top;
        ev->score.top_logprobs = top_lp;
        ev->score.logits = r->return_logits ? rows : NULL;
        r->score_n = 0;
    }
}

/* A decode row followed by drafts, from logits row `lr`: sample row j with the
 * KV of the pending token and drafts before it; keep going while what was
 * sampled equals the next draft.  Returns the logits rows it covered. */
static int verify_drafts(cb_engine *e, int idx, int lr) {
    cb_request *r = &e->reqs[idx];
    int n_draft = r->n_draft, src = r->draft_src, base = r->base_pos, acc = 0, r_cls = r->draft_cls;
    /* drafts [0, n_model) are the source's, the rest a lookup continuation of them */
    int n_model = r->n_draft_model > 0 && r->n_draft_model < n_draft ? r->n_draft_model : n_draft;
    const int lk = cb_spec_bit(CB_SPEC_LOOKUP), x_cls = r->ext_cls;
    cb_slot *sl = &e->slots[r->slot];
    cb_request_metrics *sm = &r->spec_m;
    int32_t draft[CB_SPEC_MAX_K];
    memcpy(draft, r->draft, sizeof draft);  /* r is released if the request ends mid-way */
    if (n_draft > 0) {  /* counted before sampling so a request that ends here reports them */
        sm->draft_n += n_draft;
        sm->draft_n_source[src] += n_model;
        sm->draft_n_source[lk] += n_draft - n_model;
        sm->draft_steps++;
    }
    for (int j = 0; j <= n_draft; j++) {
        sl->n_past = base + j + 1;  /* KV through row j is the sequence so far */
        if (j < n_draft) sm->draft_n_pos[j]++;
        int tok = sample_row(e, idx, lr + j);
        if (tok < 0 || j == n_draft || tok != draft[j]) break;
        /* the token just emitted was a draft that verified: flag its event */
        e->events[(e->ev_head + e->ev_count - 1) % e->ev_cap].drafted = 1;
        acc++;
        sm->draft_accepted++;
        sm->draft_accepted_source[j < n_model ? src : lk]++;
        sm->draft_accepted_pos[j]++;
    }
    if (n_draft > 0) {
        int alive = r->state != RQ_FREE;
        int a_model = acc < n_model ? acc : n_model;
        cb_spec_policy_record_class(&e->policy, src, r_cls, n_model, a_model);
        if (alive) {  /* still running */
            cb_spec_req_record(&r->sq, src, n_model, a_model);
            if (src == lk) cb_spec_req_record_class(&r->sq, r_cls, n_model, a_model);
        }
        if (n_draft > n_model && acc >= n_model) {  /* the continuation was reached: a lookup draft of its class */
            cb_spec_policy_record_class(&e->policy, lk, x_cls, n_draft - n_model, acc - n_model);
            if (alive) {
                cb_spec_req_record(&r->sq, lk, n_draft - n_model, acc - n_model);
                cb_spec_req_record_class(&r->sq, x_cls, n_draft - n_model, acc - n_model);
            }
        }
    }
    return n_draft + 1;
}

/* 5. sample, in logits-row order (a prompt's last row, or a decode row and
 *    its drafts) */
static void sample_rows(cb_engine *e, int n_logit) {
    for (int lr = 0; lr < n_logit;) {
        int idx = e->logit_req[lr];
        if (idx < 0) { lr++; continue; }  /* a scored prompt row */
        cb_request *r = &e->reqs[idx];
        if (r->state != RQ_DECODE) { sample_row(e, idx, lr); lr++; continue; }
        lr += verify_drafts(e, idx, lr);
    }
}

/* prefill-only requests (max_tokens == 0) finish once their prompt is in */
static void finish_prefill_only(cb_engine *e) {
    for (int k = 0; k < e->n_order; k++) {
        int idx = e->order[k];
        cb_request *r = &e->reqs[idx];
        if (r->state == RQ_PREFILL && r->max_tokens == 0 && r->n_prompt_done >= r->n_prompt) {
            finish(e, idx, CB_FINISH_LENGTH, -1);
            k--;
        }
    }
}

/* The step's profile: its phases partition step_ms.  Sampling (with the
 * grammar masks) ran from `ts` to `t1`; drafting, admission, the batch and
 * the forward before `ts`. */
static void record_step(cb_engine *e, const step_mark *m, const step_rows *s, double ts, double t1) {
    cb_ctx *c = &e->ctx;
    cb_step_stats *S = &e->last;
    S->step = e->n_steps++;
    S->rows_decode = s->rows_decode;
    S->rows_prefill = s->rows_prefill;
    S->n_running = e->n_order;
    S->step_ms = t1 - m->t0;
    S->matmul_ms = c->t_matmul - m->matmul;
    S->attention_ms = c->t_attention - m->attention;
    S->lm_head_ms = c->t_lm_head - m->lm_head;
    S->sampling_ms = t1 - ts - e->step_grammar_ms;
    S->grammar_ms = e->step_grammar_ms;
    S->draft_ms = e->step_draft_ms;
    /* the remainder, so the seven phases partition step_ms (drafting ran before ts) */
    S->other_ms = (ts - m->t0) - S->matmul_ms - S->attention_ms - S->lm_head_ms - S->draft_ms;
    S->norm_ms = c->t_norm - m->norm;
    S->rope_ms = c->t_rope - m->rope;
    S->sync_ms = cb_pool_wait_ms(e->pool) - m->wait;
    for (int ty = 0; ty < CB_N_TYPES; ty++) S->matmul_type_ms[ty] = c->t_matmul_type[ty] - m->matmul_type[ty];
    S->experts_unique = c->n_expert_runs - m->expert_runs;
    S->experts_routed = c->n_expert_routed - m->expert_routed;
}

int cb_engine_step(cb_engine *e, cb_event *events, int max_events) {
    if (!e || (max_events > 0 && !events)) return CB_ERR_ARG;
    /* the caller catches up first: computing now would overwrite the
     * logits and score rows that queued events point to */
    if (e->ev_count > 0) return drain(e, events, max_events);
    step_mark m;
    mark_step(e, &m);
    e->step_grammar_ms = 0;

    finish_cancelled(e);  /* 1 */
    admit(e);             /* 2 */
    /* 3. batch: decode rows (each with its drafts) first, then prefill
     *    chunks, in admission order */
    step_rows s = { 0, 0, 0, 0 };
    int n_decoding = 0, n_prefilling = 0;
    for (int k = 0; k < e->n_order; k++) {
        n_decoding += e->reqs[e->order[k]].state == RQ_DECODE;
        n_prefilling += e->reqs[e->order[k]].state == RQ_PREFILL;
    }
    plan_drafts(e, n_decoding, n_prefilling);
    batch_decode_rows(e, &s);
    batch_prefill_chunks(e, &s, n_decoding, n_prefilling);
    run_forward(e, s.n);  /* 4 */
    sync_drafters(e);
    double ts = now_ms();
    advance_prefills(e, ts);
    emit_scores(e);
    sample_rows(e, s.n_logit);  /* 5 */
    finish_prefill_only(e);
    double t1 = now_ms();
    /* the policy weighs what a verify row costs: forward and sampling */
    if (s.n > 0) cb_spec_policy_step(&e->policy, s.n, t1 - m.t0 - e->step_draft_ms);
    record_step(e, &m, &s, ts, t1);
    return drain(e, events, max_events);
}

void cb_engine_last_step(const cb_engine *e, cb_step_stats *s) { *s = e->last; }

int cb_engine_expert_counts(const cb_engine *e, int64_t *out, int64_t cap) {
    if (!e) return CB_ERR_ARG;
    return cb_ctx_expert_counts(&e->ctx, out, cap);
}

int cb_engine_route_trace(cb_engine *e, const char *path, char *err, size_t err_len) {
    if (err && err_len) err[0] = 0;
    if (!e) return CB_ERR_ARG;
    return cb_ctx_route_trace(&e->ctx, path, err, err_len);
}

int cb_engine_tokenize_bytes(const cb_engine *e, const uint8_t *bytes, size_t n, int32_t *out, int cap) {
    if (!e || (n > 0 && !bytes) || cap < 0 || (cap > 0 && !out)) return CB_ERR_ARG;
    if (!e->bpe) return CB_ERR_UNSUPPORTED;
    return cb_bpe_tokenize_alloc(e->bpe, bytes, n, out, cap);
}

/* ---------------------------------------------------------------- slots */

int cb_engine_slot_info(const cb_engine *e, int slot, int *n_past, int *busy) {
    if (slot < 0 || slot >= e->params.n_slots) return CB_ERR_ARG;
    if (n_past) *n_past = e->slots[slot].n_past;
    if (busy) *busy = e->slots[slot].req >= 0;
    return CB_OK;
}

int cb_engine_slot_tokens(const cb_engine *e, int slot, int32_t *out, int cap) {
    if (slot < 0 || slot >= e->params.n_slots || cap < 0 || (cap > 0 && !out)) return CB_ERR_ARG;
    int n = e->slots[slot].n_past < cap ? e->slots[slot].n_past : cap;
    memcpy(out, e->slots[slot].tokens, (size_t)n * sizeof(int32_t));
    return n;
}

size_t cb_engine_kv_bytes(const cb_engine *e) { return e ? e->ctx.kv_bytes : 0; }

int cb_engine_slot_clear(cb_engine *e, int slot) {
    if (slot < 0 || slot >= e->params.n_slots) return CB_ERR_ARG;
    if (e->slots[slot].req >= 0) return CB_ERR_BUSY;
    e->slots[slot].n_past = 0;
    cb_kv_keep(&e->ctx, slot, 0);
    return CB_OK;
}

/* A direct forward continues slot `slot` at pos: its history is cut there,
 * which a sliding window's ring allows only while it still holds the
 * window before pos (cb_kv_usable). */
static int restart_at(cb_engine *e, int slot, int pos, char *err, size_t err_len) {
    if (cb_kv_usable(&e->ctx, slot, pos) != pos) {
        set_err(err, err_len, "the sliding window before pos %d is no longer in the KV cache; run from pos 0", pos);
        return CB_ERR_ARG;
    }
    e->slots[slot].n_past = pos;
    cb_kv_keep(&e->ctx, slot, pos);
    return CB_OK;
}

/* What cb_engine_forward and cb_engine_forward_argmax check before they run
 * (slot, tokens, positions), then the restart at pos. */
static int forward_begin(cb_engine *e, int slot, const int32_t *tokens, int n, int pos, char *err, size_t err_len) {
    if (slot < 0 || slot >= e->params.n_slots) { set_err(err, err_len, "slot %d is out of range [0, %d)", slot, e->params.n_slots); return CB_ERR_ARG; }
    const cb_slot *sl = &e->slots[slot];
    if (sl->req >= 0) { set_err(err, err_len, "slot %d is busy with a request", slot); return CB_ERR_BUSY; }
    if (n < 1) { set_err(err, err_len, "forward needs at least one token"); return CB_ERR_ARG; }
    if (pos < 0 || pos > sl->n_past) { set_err(err, err_len, "pos %d must be in [0, %d] (positions before it need KV)", pos, sl->n_past); return CB_ERR_ARG; }
    if (pos + n > e->params.n_ctx) { set_err(err, err_len, "context_length_exceeded: %d + %d tokens > context of %d", pos, n, e->params.n_ctx); return CB_ERR_CONTEXT; }
    const int n_vocab = e->model->info.n_vocab;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= n_vocab) { set_err(err, err_len, "token %d at index %d is out of range [0, %d)", tokens[i], i, n_vocab); return CB_ERR_ARG; }
    return restart_at(e, slot, pos, err, err_len);
}

/* One forward step over tokens[done ..) (at most n_logits of them, every row
 * with its logits) at positions pos + done ..; returns how many it ran. */
static int forward_chunk(cb_engine *e, int slot, const int32_t *tokens, int n, int pos, int done) {
    cb_slot *sl = &e->slots[slot];
    const int chunk = n - done < e->ctx.n_logits ? n - done : e->ctx.n_logits;
    for (int j = 0; j < chunk; j++) {
        e->b_tokens[j] = tokens[done + j];
        e->b_pos[j] = pos + done + j;
        e->b_slot[j] = slot;
        e->b_logit[j] = j;
        sl->tokens[pos + done + j] = tokens[done + j];
    }
    cb_batch b = { chunk, e->b_tokens, e->b_pos, e->b_slot, e->b_logit };
    cb_forward(&e->ctx, &b);
    sl->n_past = pos + done + chunk;
    return chunk;
}

int cb_engine_forward(cb_engine *e, int slot, const int32_t *tokens, int n, int pos,
                      float *logits_out, char *err, size_t err_len) {
    if (err && err_len) err[0] = 0;
    if (!e || !tokens || !logits_out) return CB_ERR_ARG;
    int rc = forward_begin(e, slot, tokens, n, pos, err, err_len);
    if (rc) return rc;
    const int n_vocab = e->model->info.n_vocab;
    for (int done = 0; done < n;) {
        const int chunk = forward_chunk(e, slot, tokens, n, pos, done);
        memcpy(logits_out + (size_t)done * n_vocab, e->ctx.logits, (size_t)chunk * n_vocab * sizeof(float));
        done += chunk;
    }
    return CB_OK;
}

int cb_engine_forward_argmax(cb_engine *e, int slot, const int32_t *tokens, int n, int pos, const uint8_t *skip,
                             int32_t *argmax_out, char *err, size_t err_len) {
    if (err && err_len) err[0] = 0;
    if (!e || !tokens || !argmax_out) return CB_ERR_ARG;
    const int n_vocab = e->model->info.n_vocab, n_layer = e->model->info.n_layer;
    int kept = 0;
    for (int l = 0; l < n_layer; l++) kept += !(skip && skip[l]);
    if (kept == 0) { set_err(err, err_len, "cannot skip every layer"); return CB_ERR_ARG; }
    int rc = forward_begin(e, slot, tokens, n, pos, err, err_len);
    if (rc) return rc;
    e->ctx.skip_layer = skip;
    for (int done = 0; done < n;) {
        const int chunk = forward_chunk(e, slot, tokens, n, pos, done);
        for (int j = 0; j < chunk; j++) {
            int64_t t = e->ctx.head_idx[j];
            if (t < 0) {  /* the head found no maximum (NaN / -inf row): take it from the logits */
                const float *x = e->ctx.logits + (size_t)j * n_vocab;
                t = 0;
                for (int v = 1; v < n_vocab; v++) if (x[v] > x[t]) t = v;
            }
            argmax_out[done + j] = (int32_t)t;
        }
        done += chunk;
    }
    e->ctx.skip_layer = NULL;
    return CB_OK;
}
