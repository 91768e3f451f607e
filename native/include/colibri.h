/*
 * colibri.h — the only header the Python binding sees.
 *
 * Two opaque handles with symmetric lifecycles:
 *
 *   cb_model   a GGUF file mapped read-only and fully validated; immutable
 *              after load, so several engines may share one model.
 *   cb_engine  KV slots, scratch buffers and a thread pool over one model;
 *              requests are submitted, step() advances all of them by one
 *              batched forward and reports events.
 *
 * Conventions
 *   - Every fallible call returns a cb_status (0 = CB_OK, negative = error)
 *     and, where an `err` buffer is given, writes a NUL-terminated message
 *     naming what was wrong.  Nothing here calls exit() or abort().
 *   - Ownership: pointers returned by cb_model_* accessors point into the
 *     model and live as long as it does.  Pointers inside a cb_event live
 *     until the next cb_engine_step() or cb_engine_free() on that engine.
 *   - No global mutable state: two engines never share anything but a model.
 *   - Not thread-safe per handle: one thread drives an engine at a time (the
 *     Python scheduler owns it).  Different engines may run concurrently.
 */
#ifndef COLIBRI_H
#define COLIBRI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ status */

typedef enum {
    CB_OK               =  0,
    CB_ERR_IO           = -1,  /* file could not be opened / mapped */
    CB_ERR_FORMAT       = -2,  /* malformed GGUF, grammar, ... */
    CB_ERR_UNSUPPORTED  = -3,  /* well-formed but not supported (arch, tensor type) */
    CB_ERR_NOMEM        = -4,  /* allocation failed */
    CB_ERR_ARG          = -5,  /* bad argument (out of range, NULL, wrong slot) */
    CB_ERR_FULL         = -6,  /* no free slot / request table full */
    CB_ERR_CONTEXT      = -7,  /* request does not fit in the slot's context */
    CB_ERR_NOT_FOUND    = -8,  /* unknown request id / metadata key */
    CB_ERR_BUSY         = -9   /* slot in use by a running request */
} cb_status;

/* Human-readable name of a status code (static string). */
const char *cb_status_str(int status);

/* ------------------------------------------------------------------- SIMD */

typedef enum {
    CB_SIMD_AUTO   = -1,  /* best the CPU supports */
    CB_SIMD_SCALAR =  0,  /* portable C; always available, always tested */
    CB_SIMD_AVX2   =  1,  /* AVX2 + FMA + F16C */
    CB_SIMD_AVX512 =  2   /* AVX-512 F/BW/VL + VNNI */
} cb_simd;

/* Best SIMD level this CPU supports (never CB_SIMD_AUTO). */
int cb_simd_detect(void);
/* Static name: "scalar", "avx2", "avx512". */
const char *cb_simd_name(int simd);

/* AMX int8 tiles (Intel Sapphire Rapids and later) at CB_SIMD_AVX512: the
 * Q4_K / Q5_K / Q6_K matmuls of batches of 16 rows and more (prefill) run
 * 16-row tiles on them.  Their integer sums are the VNNI kernels', so every
 * result is bit-identical with AMX on or off.  cb_amx_active(): 1 if the CPU
 * has AMX-TILE and AMX-INT8, the OS grants the tile state (on Linux, asked
 * for on the first call), the compiler could build the kernel, and neither
 * COLIBRI_LAB_AMX=0 (read once) nor cb_amx_enable(0) turned it off.
 * cb_amx_enable(on): for the whole process, from the next matmul on (not
 * while one runs); returns cb_amx_active(). */
int cb_amx_active(void);
int cb_amx_enable(int on);

/* Software prefetch of the weight panels in the panel matmul kernels (every
 * quant type with a panel layout, both SIMD levels): while one panel of 16
 * outputs computes, the one two panels ahead is prefetched into L2.  Whether
 * that pays depends on the CPU's own prefetchers, so CB_PREFETCH_AUTO (the
 * default) decides by vendor: on Intel (and any CPU not known otherwise)
 * every type prefetches (its L2 streamer stops at 4 KB pages: Q6_K +15% from
 * DRAM); on AMD (Zen 4 measured) matmuls of one or two rows (decode) of
 * every type but Q4_K and Q5_K do not, nor one row of Q4_K on the 256-bit
 * kernel of cb_ymm_decode: there a core's L2 streamer follows
 * the panels by itself and software prefetches hold its miss buffers,
 * capping a core at ~23 GB/s where the same kernels without them read 30-33
 * (the rule and its figures: cb_prefetch_panels in kernels.c).
 * CB_PREFETCH_ON / CB_PREFETCH_OFF force every type on / off.
 * COLIBRI_LAB_PREFETCH=0 / 1 (read once) sets the mode at start.
 * cb_prefetch_set(mode): for the whole process, from the next matmul on (an
 * A/B switch; not while one runs); returns cb_prefetch_mode().  Results are
 * bit-identical in every mode; only the speed differs. */
enum { CB_PREFETCH_AUTO = -1, CB_PREFETCH_OFF = 0, CB_PREFETCH_ON = 1 };
int cb_prefetch_mode(void);
int cb_prefetch_set(int mode);

/* Decode's Q4_K matmuls (one or two activation rows) at CB_SIMD_AVX512 on a
 * 256-bit kernel (ymm registers, AVX-512VL VNNI) instead of the 512-bit one:
 * by default on CPUs that run each 512-bit operation as two halves (AMD Zen
 * 4, by CPUID family), where it streams its weights from DRAM at ~90% of a
 * plain read loop and the 512-bit kernel at ~73% (figures: kquants_avx512.c).
 * cb_ymm_decode(): 1 if they run it now.
 * cb_ymm_decode_set(mode): -1 by CPU, 0 never, 1 always, for the whole
 * process from the next matmul on (an A/B switch, and what lets the tests
 * run the kernel on any AVX-512 CPU); returns cb_ymm_decode().  Results are
 * bit-identical either way. */
int cb_ymm_decode(void);
int cb_ymm_decode_set(int mode);

/* ------------------------------------------------------------------ model */

typedef struct cb_model cb_model;

typedef struct {
    int validate_only;  /* 1: parse and validate, do not build the architecture view */
} cb_model_params;

cb_model_params cb_model_default_params(void);

/* Map and validate `path`.  On success *out owns the mapping; free it with
 * cb_model_free().  On failure *out is NULL and err says what is wrong. */
int  cb_model_load(const char *path, const cb_model_params *params,
                   cb_model **out, char *err, size_t err_len);
void cb_model_free(cb_model *model);  /* NULL is fine */

/* Hyperparameters (read from metadata at load). */
typedef struct {
    char     arch[32];       /* "llama", ... */
    int      n_vocab;        /* tokens in the vocabulary */
    int      n_ctx_train;    /* context length the model was trained with */
    int      n_embd;         /* hidden size */
    int      n_ff;           /* feed-forward size */
    int      n_layer;        /* transformer blocks */
    int      n_head;         /* query heads */
    int      n_head_kv;      /* key/value heads (GQA groups = n_head / n_head_kv) */
    int      head_dim;       /* n_embd / n_head unless given by metadata */
    int      n_rot;          /* rotary dims per head */
    int      rope_neox;      /* 1: NeoX (half-split) ordering, 0: interleaved pairs */
    float    rope_freq_base;
    float    rope_freq_scale;/* 1 / linear scaling factor */
    float    norm_eps;       /* RMSNorm epsilon */
    int      tied_output;    /* 1: LM head is token_embd */
    int      bos_id, eos_id; /* -1 if absent */
    int      add_bos;        /* tokenizer.ggml.add_bos_token */
    uint64_t n_params;       /* weights' element count */
    uint64_t weight_bytes;   /* bytes of tensor data */
    int      file_type;      /* general.file_type or -1 */
    int      n_swa;          /* sliding window of the local layers (0: every layer attends to all) */
} cb_model_info;

void cb_model_get_info(const cb_model *model, cb_model_info *info);

/* Metadata access, for the tokenizer and chat template on the Python side.
 * Value types follow GGUF: 0 u8 1 i8 2 u16 3 i16 4 u32 5 i32 6 f32 7 bool
 * 8 string 9 array 10 u64 11 i64 12 f64. */
int         cb_model_meta_count(const cb_model *model);
const char *cb_model_meta_key(const cb_model *model, int i, size_t *len);
int         cb_model_meta_type(const cb_model *model, int i);
/* Array element type and length (type 9 only; else -1 / 0). */
int         cb_model_meta_arr_type(const cb_model *model, int i);
uint64_t    cb_model_meta_arr_len(const cb_model *model, int i);
/* Scalar values: integers and bools as int64, floats as double. */
int         cb_model_meta_int(const cb_model *model, int i, int64_t *out);
int         cb_model_meta_float(const cb_model *model, int i, double *out);
/* String value (type 8) or j-th element of a string array. Not NUL-terminated. */
const char *cb_model_meta_str(const cb_model *model, int i, size_t *len);
const char *cb_model_meta_arr_str(const cb_model *model, int i, uint64_t j, size_t *len);
/* j-th element of a numeric array as int64 / double. */
int         cb_model_meta_arr_int(const cb_model *model, int i, uint64_t j, int64_t *out);
int         cb_model_meta_arr_float(const cb_model *model, int i, uint64_t j, double *out);
/* Index of `key` or -1. */
int         cb_model_meta_find(const cb_model *model, const char *key);

/* Tensor listing (name, GGML type, dims). */
int         cb_model_tensor_count(const cb_model *model);
const char *cb_model_tensor_name(const cb_model *model, int i, size_t *len); /* not NUL-terminated */
int         cb_model_tensor_type(const cb_model *model, int i);
int         cb_model_tensor_dims(const cb_model *model, int i, int64_t ne[4]);

/* Token -> raw bytes (byte-level BPE decoded; control tokens give their text).
 * Returns NULL for an out-of-range id. */
const uint8_t *cb_model_token_bytes(const cb_model *model, int token, size_t *len);
/* GGUF token_type: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte. */
int  cb_model_token_type(const cb_model *model, int token);
/* 1 if the token ends generation (eos, eot, <|im_end|>, ...). */
int  cb_model_token_is_eog(const cb_model *model, int token);

/* ----------------------------------------------------------------- engine */

typedef struct cb_engine cb_engine;

typedef struct {
    int n_slots;    /* independent sequences (KV slots)                        [1..256] */
    int n_ctx;      /* tokens of KV per slot; 0 = min(n_ctx_train, 4096)               */
    int n_threads;  /* worker threads including the caller; 0 = all online cores        */
    int n_batch;    /* max token rows in one step (decode + prefill chunks); 0 = 512    */
    int n_chunk;    /* rows of a step in which requests decode: decode rows first, prompts the rest
                       (at least n_chunk / 4, rounded up), times the prompts per decoding stream when
                       prompts outnumber the streams; 0 = 3 * n_threads, at most n_batch          */
    float prompt_slack; /* while requests decode, the prompt rows of a step are cut to the most whose measured
                           step time is within (1 + prompt_slack) x that of the decode rows alone (at least
                           the count that adds the least time per prompt row), within the n_chunk budget, so a
                           prompt lengthens the streams' token gaps by at most this fraction (times the
                           prompts per decoding stream when prompts outnumber the streams); until the step
                           times are measured, the n_chunk budget alone.  Default 0.25 (cb_engine_default_params;
                           a zeroed struct gives 0: no slack); < 0 = off, the n_chunk budget alone            */
    int simd;       /* cb_simd; CB_SIMD_AUTO picks the best the CPU has                 */
    int prefix_reuse; /* 1: reuse a slot's KV for a common prompt prefix (default 1)    */
    int kv_f16;       /* 1: KV cache in f16, half the memory and attention reads (default 1); 0: f32 */
    /* speculative decoding resources (allocated at cb_engine_new) */
    const cb_model *draft_model;  /* nullable: a second model with the same vocabulary (checked token by token),
                                     drafts with its own KV per slot */
    const cb_model *xdraft_model; /* nullable: a draft model with ANOTHER byte-level BPE vocabulary; drafts text
                                     that is re-tokenized into the target's (source CB_SPEC_XDRAFT) */
    int  layer_skip;              /* 1: allocate a self-speculative drafter that runs the target with layers skipped */
    const int32_t *skip_layers;   /* layers the layer-skip drafter skips (copied); NULL = every fourth block of the middle half */
    int  n_skip_layers;
} cb_engine_params;

cb_engine_params cb_engine_default_params(void);

int  cb_engine_new(const cb_model *model, const cb_engine_params *params,
                   cb_engine **out, char *err, size_t err_len);
void cb_engine_free(cb_engine *engine);  /* NULL is fine */

/* Effective parameters after defaults were resolved. */
void cb_engine_get_params(const cb_engine *engine, cb_engine_params *params);

/* --- grammars --- */

/* A GBNF grammar compiled against a model's vocabulary, shared by any number
 * of requests (and engines over that model), from any thread: its rules are
 * read-only; the one mutable part is a cache of computed masks that its
 * matchers share, guarded by a mutex inside the grammar.  The model builds
 * its vocabulary trie once, at the first compile, and every grammar over the
 * model uses it.  Compile once, reuse.  Syntax as llama.cpp's GBNF; the start
 * rule is `root`. */
typedef struct cb_grammar cb_grammar;

/* Compile `text` (len bytes, UTF-8).  Errors are CB_ERR_FORMAT with a message
 * naming line and column ("line 3, column 14: expected ']'"), or
 * CB_ERR_UNSUPPORTED.  The model must outlive the grammar. */
int  cb_grammar_compile(const cb_model *model, const char *text, size_t len,
                        cb_grammar **out, char *err, size_t err_len);
void cb_grammar_free(cb_grammar *grammar);  /* NULL is fine */

/* Per-request matcher state over a grammar (a pushdown automaton over bytes). */
typedef struct cb_matcher cb_matcher;

int  cb_matcher_new(const cb_grammar *grammar, cb_matcher **out);
void cb_matcher_free(cb_matcher *m);  /* NULL is fine */
/* Set bit t of mask (n_vocab bits, 32 per word) iff token t may come next.
 * End-of-generation tokens are allowed exactly when the grammar accepts;
 * control tokens never otherwise.  Returns the number of allowed tokens
 * (0 = dead end: the caller reports an error) or a negative status. */
int  cb_matcher_fill_mask(cb_matcher *m, uint32_t *mask);
/* Advance by one token; CB_ERR_ARG (state unchanged) if it is not allowed. */
int  cb_matcher_accept(cb_matcher *m, int token);
/* Undo the last n accepted tokens (speculative rollback); CB_ERR_ARG if n is
 * more than were accepted. */
int  cb_matcher_rollback(cb_matcher *m, int n);
/* 1 if the input so far is a complete sentence of the grammar. */
int  cb_matcher_is_accepting(const cb_matcher *m);
/* Bytes the grammar forces next (the unique continuation, up to a branch or
 * the end), at most cap; returns the length (0 = no forced bytes). */
int  cb_matcher_forced_bytes(const cb_matcher *m, uint8_t *out, int cap);
/* Like cb_matcher_fill_mask, but also forbid any token after which the
 * grammar could not be completed within `budget` more tokens (budget counts
 * the tokens after this one, each at least one byte).  With budget >= the
 * shortest completion of the current state this never empties the mask
 * (single-byte tokens can always follow a shortest completion: true of
 * byte-level BPE vocabularies, see grammar.c).  A budget below it keeps
 * only the tokens that shorten the shortest completion (the output cannot
 * be completed in time, but gets as close as it can; still never empty).
 * A negative budget means unlimited (same as cb_matcher_fill_mask), as does
 * one >= 2^30 - 1. */
int  cb_matcher_fill_mask_budget(cb_matcher *m, uint32_t *mask, int budget);
/* Bytes in the shortest completion of the current state (0 when accepting
 * or finished; saturates at 2^30 - 1), or -1 if m is NULL. */
int  cb_matcher_min_completion(const cb_matcher *m);

/* --- sampling --- */

#define CB_MAX_LOGPROBS 20
#define CB_MAX_STOP     8

typedef struct {
    float    temperature;       /* 0 = greedy (argmax)                                  */
    int      top_k;             /* 0 = off                                              */
    float    top_p;             /* 1 = off                                              */
    float    min_p;             /* 0 = off                                              */
    float    repeat_penalty;    /* 1 = off; divides positive / multiplies negative logits */
    int      repeat_last_n;     /* window for the penalties; -1 = whole context          */
    float    presence_penalty;  /* 0 = off; subtracted once per token seen              */
    float    frequency_penalty; /* 0 = off; subtracted per occurrence                   */
    uint64_t seed;              /* RNG seed; same seed + same inputs = same output       */
    int      n_logprobs;        /* top alternatives reported per token [0..CB_MAX_LOGPROBS] */
    int      n_logit_bias;      /* entries in the two arrays below                       */
    const int32_t *logit_bias_tokens; /* copied at submit                                */
    const float   *logit_bias_values; /* added to the logit; -INFINITY bans a token      */
} cb_sampling_params;

cb_sampling_params cb_sampling_default_params(void);

/* --- speculative decoding --- */

/* Draft sources, tried in this priority order when several are enabled. */
typedef enum {
    CB_SPEC_GRAMMAR    = 1,  /* bytes the grammar forces, tokenized */
    CB_SPEC_LOOKUP     = 2,  /* n-gram match in the prompt and output so far */
    CB_SPEC_DRAFT      = 4,  /* the engine's draft model (greedy) */
    CB_SPEC_LAYERSKIP  = 8,  /* the target with layers skipped (greedy) */
    CB_SPEC_XDRAFT     = 16  /* the cross-vocabulary draft model (greedy in its vocabulary) */
} cb_spec_source;

#define CB_SPEC_N_SOURCES 5
#define CB_SPEC_MAX_K     16

typedef struct {
    int sources;    /* bitmask of cb_spec_source; 0 = plain decoding                        */
    int k_max;      /* most draft tokens per step [1..CB_SPEC_MAX_K] (default 8)             */
    int adaptive;   /* 1: choose k from measured acceptance and verify cost, pause a source
                       whose expected gain is below 1 (default 1); 0: always draft k_max    */
    int ngram_max;  /* prompt lookup: longest suffix match compared when choosing among earlier
                       occurrences; the longest wins, a tie goes to the most recent (default 16) */
    int ngram_min;  /* prompt lookup: shortest (default 2)                                   */
} cb_spec_params;

cb_spec_params cb_spec_default_params(void);

/* Engine-wide record of one draft source (what the adaptive policy sees). */
typedef struct {
    int64_t drafts;                       /* steps that drafted with this source        */
    int64_t draft_tokens;                 /* tokens proposed                            */
    int64_t accepted_tokens;              /* tokens accepted                            */
    int64_t tried_pos[CB_SPEC_MAX_K];     /* proposals at draft position i              */
    int64_t accepted_pos[CB_SPEC_MAX_K];  /* acceptances at draft position i            */
    double  accept_rate_pos[CB_SPEC_MAX_K]; /* smoothed P(accept at i | accepted before) */
    int     k;                            /* depth the policy chose last                */
    double  expected_gain;                /* expected tokens per unit time vs. plain decoding at that k */
    int     paused;                       /* 1: the policy declines this source: most of its recent
                                             offers were not worth their verify rows (decline_rate > 0.5) */
    int64_t decisions;                    /* times the policy was asked about this source (adaptive) */
    int64_t declined;                     /* of those, answered "do not draft" */
    double  decline_rate;                 /* smoothed share of declined decisions (recent ones weigh most) */
    double  draft_ms;                     /* time spent producing drafts                */
} cb_spec_stats;

/* Stats of one source (a single cb_spec_source bit). */
int cb_engine_spec_stats(const cb_engine *engine, int source, cb_spec_stats *out);

typedef struct {
    const int32_t *tokens;       /* prompt token ids (copied at submit)                  */
    int      n_tokens;           /* >= 1                                                 */
    int      slot;               /* slot index, or -1 for "any free slot" (best prefix)   */
    int      max_tokens;         /* completion tokens to generate; 0 = prefill only      */
    int      ignore_eos;         /* 1: end-of-generation tokens do not stop              */
    int      n_stop;             /* stop strings (bytes), matched in C on the output     */
    const char *stop[CB_MAX_STOP];
    size_t   stop_len[CB_MAX_STOP];
    int      return_logits;      /* 1: token events carry the full logits row (score events: every scored row) */
    int      copy_prefix;        /* 1: may copy a longer matching prefix from another slot */
    int      score;              /* 1: teacher-forced scoring: SCORE events give log p(prompt[i+1] | prompt[..i])
                                    for every prompt position (see cb_score_rows below); needs >= 2 prompt tokens */
    const cb_grammar *grammar;   /* nullable; output constrained to it (not owned; must outlive the request) */
    cb_spec_params spec;         /* speculative decoding (sources = 0: off)                */
    cb_sampling_params sampling;
} cb_request_params;

cb_request_params cb_request_default_params(void);

typedef enum {
    CB_FINISH_NONE = 0,
    CB_FINISH_STOP,        /* end-of-generation token or stop string */
    CB_FINISH_LENGTH,      /* max_tokens reached */
    CB_FINISH_CANCELLED,   /* cb_engine_cancel() */
    CB_FINISH_CONTEXT,     /* slot context full */
    CB_FINISH_ERROR
} cb_finish;

const char *cb_finish_str(int finish);  /* "stop", "length", ... */

/* Per-request metrics (colibri_lab/metrics.py names every field; Python adds its own queue
 * wait to the times measured from submit). */
typedef struct {
    int    prompt_tokens;
    int    cached_tokens;        /* prompt tokens served from KV prefix reuse */
    int    completion_tokens;
    double queue_ms;             /* submit -> admitted to a slot              */
    double ttft_ms;              /* submit -> first token event               */
    double prefill_ms;           /* submit -> end of prefill                  */
    double decode_ms;            /* first token -> done                       */
    double e2e_ms;               /* submit -> done                            */
    double tpot_ms;              /* decode_ms / (completion_tokens - 1)       */
    double decode_tok_s;
    int    draft_n;              /* draft tokens proposed                     */
    int    draft_accepted;       /* of those, accepted                        */
    int    draft_steps;          /* steps that verified at least one draft    */
    int    draft_n_source[CB_SPEC_N_SOURCES];        /* by source (bit index) */
    int    draft_accepted_source[CB_SPEC_N_SOURCES];
    int    draft_n_pos[CB_SPEC_MAX_K];               /* drafts verification reached at position i
                                                        (all earlier ones accepted): rates are conditional */
    int    draft_accepted_pos[CB_SPEC_MAX_K];        /* of those, accepted */
    double draft_ms;             /* time spent drafting for this request (a drafter pass shared by
                                    several requests is split by the tokens each got) */
    int64_t experts_routed;      /* MoE: (token, layer, expert) routings of this request's rows */
    int    experts_unique;       /* MoE: distinct (layer, expert) pairs this request touched */
    double grammar_mask_us;      /* mean time per grammar mask (0 without a grammar) */
    int    slot;
    int    finish_reason;        /* cb_finish */
    int    stop_offset;          /* STOP by string: byte offset in the output where the stop string starts; else -1 */
} cb_request_metrics;

typedef enum {
    CB_EVENT_TOKEN = 1,   /* one generated token */
    CB_EVENT_DONE  = 2,   /* request finished; metrics valid */
    CB_EVENT_ERROR = 3,   /* request refused or failed; status + message valid */
    CB_EVENT_SCORE = 4    /* scored prompt positions of a `score` request; score valid */
} cb_event_type;

/* Scoring (a request with `score` set).  The prompt is prefilled as usual,
 * in the same batched steps as every other request, but every position's
 * logits row is kept: row i of the whole prompt is the row a decode of
 * prompt[0..i] would sample from (bit for bit, batch invariance), scored
 * against prompt[i+1] as the sampler's logprobs are (log-softmax of the raw
 * logits at temperature 1).  The rows of one step come as one SCORE event;
 * a long prompt takes several steps, since the rows that produce logits in
 * one step are bounded when the engine is created (cb_engine_new).  A score
 * request never reuses a cached prefix (each position needs its row), and
 * with max_tokens > 0 it goes on to generate after the prompt as usual. */
typedef struct {
    int            pos;          /* prompt position of row 0: row j scores prompt[pos + j + 1] */
    int            n;            /* rows in this event; over all events pos runs 0 .. n_tokens - 2 */
    int            n_top;        /* alternatives per row: the request's sampling.n_logprobs */
    const float   *logprob;      /* [n] log p(prompt[pos + j + 1] | prompt[0 .. pos + j]) */
    const int32_t *argmax;       /* [n] most probable token (first index of the maximum; -1: row all -inf / NaN) */
    const int32_t *top_tokens;   /* [n * n_top] best first, lower id first on equal logits (-1: none left) */
    const float   *top_logprobs; /* [n * n_top] their log-probabilities */
    const float   *logits;       /* [n * n_vocab] raw logits if return_logits, else NULL */
} cb_score_rows;

typedef struct {
    int      type;          /* cb_event_type */
    int64_t  id;            /* request id from cb_engine_submit */
    /* TOKEN */
    int32_t  token;
    float    logprob;       /* log-softmax of the chosen token (after penalties, before temperature);
                               NaN for greedy requests that asked for no logprobs (not computed) */
    int      n_top;
    int32_t  top_tokens[CB_MAX_LOGPROBS];
    float    top_logprobs[CB_MAX_LOGPROBS];
    const float *logits;    /* n_vocab raw logits if return_logits, else NULL; valid until next step */
    int      drafted;       /* 1: this token was proposed by a draft source and verified */
    /* SCORE */
    cb_score_rows score;    /* pointers into the engine, valid until the next cb_engine_step() */
    /* DONE */
    cb_request_metrics metrics;
    /* ERROR */
    int      status;
    char     message[160];
} cb_event;

/* Queue a request.  Returns CB_OK and the request id, or an error without
 * side effects (bad params).  A request that cannot fit its slot's context is
 * accepted and then refused by an ERROR event at the next step, so that the
 * caller sees every outcome through events. */
int cb_engine_submit(cb_engine *engine, const cb_request_params *req,
                     int64_t *id_out, char *err, size_t err_len);

/* Cancel a queued or running request: it finishes with CB_FINISH_CANCELLED at
 * the next step and its slot becomes free.  CB_ERR_NOT_FOUND if unknown. */
int cb_engine_cancel(cb_engine *engine, int64_t id);

/* Run one scheduling step: admit waiting requests to slots, then one batched
 * forward over every running request's decode row plus prefill chunks, then
 * sample.  Writes up to max_events events; returns how many were written, or a
 * negative cb_status.  Events that do not fit stay queued for the next call
 * (call again with max_events > 0; a step with nothing to compute only drains). */
int cb_engine_step(cb_engine *engine, cb_event *events, int max_events);

/* Requests not yet finished (queued + running). */
int cb_engine_pending(const cb_engine *engine);

/* Tokenize raw bytes with the engine's canonical byte-level BPE: the ids the
 * model's tokenizer gives for that text, without special-token parsing (the
 * tokenization grammar-forced drafts use).  Returns the count, which may
 * exceed cap (call again with more room), or a negative status
 * (CB_ERR_UNSUPPORTED when the vocabulary is not byte-level BPE). */
int cb_engine_tokenize_bytes(const cb_engine *engine, const uint8_t *bytes, size_t n, int32_t *out, int cap);

/* Per-step profile of the last step. */
typedef struct {
    int64_t step;
    int     rows_decode;     /* decode rows (one per running request) */
    int     rows_prefill;    /* prompt rows computed */
    int     n_running;
    double  step_ms;         /* = the sum of the seven phases below (a partition) */
    double  matmul_ms, attention_ms, lm_head_ms, sampling_ms, grammar_ms, draft_ms, other_ms;
    /* MoE models (0 for dense ones): */
    int64_t experts_unique;  /* expert FFNs computed: unique (layer, expert) pairs routed by the step's rows */
    int64_t experts_routed;  /* (row, layer, expert) routings = rows * layers * experts_used */
    /* finer profile: parts of other_ms, synchronisation, matmul by weight type */
    double  norm_ms;         /* RMSNorms (part of other_ms) */
    double  rope_ms;         /* RoPE and KV stores run on their own (part of other_ms); a decode
                              * step with >= 2 rows per thread runs them in attention_ms */
    double  sync_ms;         /* caller waiting for pool workers after its own share (spread over phases) */
    double  matmul_type_ms[32]; /* matmul time by weight type (GGML type id), LM head excluded */
} cb_step_stats;

void cb_engine_last_step(const cb_engine *engine, cb_step_stats *stats);

/* Slot state: tokens held in KV and whether a request is using it. */
int cb_engine_slot_info(const cb_engine *engine, int slot, int *n_past, int *busy);
/* Copy of the slot's token history (up to cap); returns the count. */
int cb_engine_slot_tokens(const cb_engine *engine, int slot, int32_t *out, int cap);
/* Forget a slot's KV (it must not be busy). */
int cb_engine_slot_clear(cb_engine *engine, int slot);
/* Bytes of the KV cache (keys and values, all slots): local (sliding-window)
 * layers hold a ring of the window, so this grows with the window, not n_ctx. */
size_t cb_engine_kv_bytes(const cb_engine *engine);

/* Direct forward for tests and tools: run `tokens` on an idle slot at
 * positions [pos, pos+n) and write logits for every row to
 * logits_out[n * n_vocab].  Positions < pos keep their KV; the slot's
 * history is truncated to pos and extended by tokens. */
int cb_engine_forward(cb_engine *engine, int slot, const int32_t *tokens, int n,
                      int pos, float *logits_out, char *err, size_t err_len);

/* Teacher-forced greedy tokens with layers skipped (layer-skip calibration):
 * like cb_engine_forward, but with the blocks where skip[l] != 0 left out
 * (skip: n_layer bytes, NULL = none), writing each row's argmax token to
 * argmax_out[n] instead of its logits.  The slot's KV of skipped blocks is
 * left as it was, so clear or overwrite the slot before decoding on it. */
int cb_engine_forward_argmax(cb_engine *engine, int slot, const int32_t *tokens, int n, int pos,
                             const uint8_t *skip, int32_t *argmax_out, char *err, size_t err_len);

/* ------------------------------------------------- experts (MoE models) */
/* Experts per MoE layer, experts routed per token, hidden size of one
 * expert (all 0 for a dense model). */
void cb_model_moe_info(const cb_model *model, int *n_expert, int *n_expert_used, int *n_ff_exp);

/* Expert heat over the engine's life: rows routed to (layer, expert), written
 * layer-major to out[n_layer * n_expert] (up to cap entries).  Returns
 * n_layer * n_expert (0 for a dense model) or a negative status. */
int cb_engine_expert_counts(const cb_engine *engine, int64_t *out, int64_t cap);

/* Append every routing decision to a CSV file at `path`, one line per
 * (row, layer, rank): step,forward,row,slot,pos,layer,rank,expert,weight
 * (header written when the file is empty).  NULL or "" stops tracing.
 * CB_ERR_IO if the file cannot be opened; CB_ERR_UNSUPPORTED for a dense model. */
int cb_engine_route_trace(cb_engine *engine, const char *path, char *err, size_t err_len);

/* ---------------------------------------------------------------- kernels */

/* Test hook: y[r][o] = sum_i w[o][i] * x[r][i] with w given as raw GGUF
 * blocks of `type` (row-major, n_out rows of n_in), through the same kernel
 * the engine uses at SIMD level `simd`.  CB_ERR_UNSUPPORTED if the CPU lacks it. */
int cb_kernel_matmul(int type, const void *w, int n_out, int n_in,
                     const float *x, int n_rows, float *y, int simd, int n_threads);

/* Byte size of n elements of GGML type `type` (n a multiple of the block), or 0 if unknown. */
size_t cb_type_size(int type, int64_t n);
const char *cb_type_name(int type);

#ifdef __cplusplus
}
#endif

#endif /* COLIBRI_H */
