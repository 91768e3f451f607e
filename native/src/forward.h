/*
 * forward.h — the llama-family forward pass over a batch of token rows.
 *
 * A batch mixes rows of different sequences (KV slots) and positions: decode
 * rows of running requests and prefill chunks.  Weights are read once per
 * matmul for all rows; attention is per row over its own slot's KV.  Every
 * buffer is allocated in cb_ctx_init; cb_forward allocates nothing.
 */
#ifndef CB_FORWARD_H
#define CB_FORWARD_H

#include "model.h"

#define CB_N_TYPES 32  /* GGML type ids tracked for the per-type matmul profile */

#include <stdio.h>

typedef struct {
    const cb_model   *model;
    const cb_kernels *k;          /* SIMD level's kernel table */
    cb_pool          *pool;       /* shared with the engine (not owned) */
    int n_slots;                  /* KV slots */
    int n_ctx;                    /* positions per slot */
    int n_batch;                  /* max rows per forward */
    int n_logits;                 /* max rows that produce logits per forward */
    int kv_dim;                   /* n_head_kv * head_dim */
    /* KV cache: per layer [n_slots][n_head_kv][kv_rows[layer]][head_dim] of f16 (kv_f16)
     * or f32, layer l starting kv_off[l] rows in.  A global layer holds every
     * position (kv_rows = n_ctx, row = position).  A local (sliding-window)
     * layer keeps a ring of kv_ring rows, position p in row p % kv_ring, and
     * rows [0, n_swa - 1) mirrored after the ring, so that any window of
     * n_swa positions is one contiguous run of rows (kv_rows = kv_ring +
     * n_swa - 1).  kv_ring = n_swa + n_batch - 1: a forward stores at most
     * n_batch rows of a slot before its attention reads back n_swa - 1
     * positions, so nothing a row reads is overwritten in its own forward,
     * nor by drafts that were rejected.  kv_ring = 0: no ring (no local
     * layers, or n_ctx no larger than the ring would be). */
    void  *k_cache, *v_cache;
    size_t *kv_off;               /* [n_layer] first row of each layer */
    int   *kv_rows;               /* [n_layer] rows per (slot, KV head) */
    int    kv_ring;               /* ring length of the local layers (0: none) */
    int   *kv_hi;                 /* [n_slots] highest position stored in the rings since the
                                     slot was last emptied (-1: none): position q < n_past is
                                     still held iff q > kv_hi - kv_ring (see cb_kv_usable) */
    size_t kv_bytes;              /* K + V cache bytes */
    int    kv_f16;                /* 1: f16 elements (half the memory and attention reads) */
    size_t kv_elt;                /* bytes per element: 2 or 4 */
    /* activations, row-major [n_batch x dim] */
    float *x;                     /* residual stream            [n_batch x n_embd] */
    float *xb;                    /* normed input / attn output [n_batch x max(n_embd, q_dim)] */
    float *q;                     /* queries                    [n_batch x q_dim] */
    float *kx, *vx;               /* new keys / values          [n_batch x kv_dim] */
    float *hb, *hb2;              /* FFN gate / up              [n_batch x n_ff] */
    float *tmp;                   /* projection output          [n_batch x n_embd] */
    float *rope;                  /* cos/sin per row            [n_batch x n_rot] (cos, sin interleaved) */
    double *rope_freq;            /* base^(-2i / n_rot)         [n_rot / 2] */
    float *rope_swa;              /* the same for the local layers' base and scale (NULL: none) */
    double *rope_freq_swa;
    float *scores;                /* attention scores per thread [n_threads x GQA group x n_ctx] */
    float *xl;                    /* rows gathered for the head [n_logits x n_embd] */
    float *logits;                /* output                     [n_logits x n_vocab] */
    int64_t *head_idx;            /* first index of each logits row's maximum (-1: all -inf / NaN) [n_logits] */
    float *head_max;              /* that maximum               [n_logits] */
    float *head_pmax;             /* per-thread partials of both [n_threads x n_logits] */
    int64_t *head_pidx;
    void  *mm_scratch;            /* quantized activations for cb_matmul */
    void  *act_q;                 /* a matmul's input rows quantized by the task that made them
                                     (norm, attention, SwiGLU; cb_quantize_rows' layout) */
    const uint8_t *skip_layer;    /* [n_layer] 1 = skip this block (self-speculative drafts); NULL = run all */
    int64_t head_rows;            /* > 0: the LM head scores only tokens [0, head_rows) (a multiple of
                                     CB_PANEL), logits rows then hold head_rows floats; 0 = every token */
    /* mixture of experts (all NULL / 0 for a dense model) */
    int    n_expert, n_used;      /* experts per layer, experts routed per row (top-k) */
    float *router;                /* router logits -> probabilities [n_batch x n_expert] */
    int32_t *sel;                 /* last forward's routing [n_layer x n_batch x n_used]:
                                     expert ids in rank order (-1: layer skipped) */
    float *sel_w;                 /* their gate weights       [n_layer x n_batch x n_used] */
    int32_t *e_off;               /* row lists per expert: offsets [n_expert + 1] */
    int32_t *e_items;             /* (row * n_used + rank) grouped by expert [n_batch x n_used] */
    float *xg;                    /* rows gathered for one expert [n_batch x n_embd] */
    float *og;                    /* one expert's output rows     [n_batch x n_embd] */
    float *eo;                    /* per (row, rank) expert outputs [n_batch x n_used x n_embd] */
    float *sh;                    /* shared expert output         [n_batch x n_embd] (qwen2moe) */
    int64_t *expert_counts;       /* rows routed to (layer, expert) over the ctx's life [n_layer x n_expert] */
    int64_t n_expert_runs;        /* expert FFNs computed (one per unique (layer, expert) per forward), ever */
    int64_t n_expert_routed;      /* (row, layer, expert) routings, ever */
    int64_t n_forward;            /* forwards run, ever (trace column) */
    int64_t trace_step;           /* engine step written in the route trace (set by the engine; -1 unknown) */
    FILE  *trace;                 /* route trace (CSV) or NULL; owned */
    /* time accumulated by phase since the last reset (ms) */
    double t_matmul, t_attention, t_lm_head;
    double t_norm, t_rope;        /* RMSNorms; RoPE + KV stores (parts of the step's other_ms, or of t_attention) */
    double t_matmul_type[CB_N_TYPES]; /* matmul time by weight type (GGML id), excluding the LM head */
} cb_ctx;

/* One forward's rows.  Rows of one slot must have increasing, distinct
 * positions; every position below a row's pos must already hold KV (from an
 * earlier forward or an earlier row of this one). */
typedef struct {
    int            n;          /* rows, <= n_batch */
    const int32_t *tokens;     /* [n] token ids (checked < n_vocab by the caller) */
    const int32_t *pos;        /* [n] position in the slot, < n_ctx */
    const int32_t *slot;       /* [n] KV slot */
    const int32_t *logit_row;  /* [n] row of ctx->logits to fill, or -1 */
} cb_batch;

int  cb_ctx_init(cb_ctx *ctx, const cb_model *model, const cb_kernels *k, cb_pool *pool,
                 int n_slots, int n_ctx, int n_batch, int n_logits, int kv_f16, char *err, size_t err_len);
void cb_ctx_free(cb_ctx *ctx);

void cb_forward(cb_ctx *ctx, const cb_batch *batch);

/* Copy positions [0, n) of every layer's KV from slot src to slot dst
 * (check cb_kv_usable(ctx, src, n) first). */
void cb_kv_copy(cb_ctx *ctx, int dst, int src, int n);

/* How many of a slot's first n positions can be kept to continue the
 * sequence at position n: n when the local layers' rings still hold the
 * window before position n (always, without rings), else 0 (the ring has
 * moved past it: prefill again from the start). */
int  cb_kv_usable(const cb_ctx *ctx, int slot, int n);

/* The slot's history is cut to its first n positions (n from cb_kv_usable);
 * n == 0 empties it, which forgets what the rings held. */
void cb_kv_keep(cb_ctx *ctx, int slot, int n);

/* --- expert statistics (MoE models; the engine exposes these) --- */

/* Copy the (layer, expert) routing counts, n_layer * n_expert int64s in
 * layer-major order, to out (up to cap).  Returns n_layer * n_expert (0 for
 * a dense model) or CB_ERR_ARG. */
int cb_ctx_expert_counts(const cb_ctx *ctx, int64_t *out, int64_t cap);

/* Start appending the route trace to `path` (CSV with a header line:
 * step,forward,row,slot,pos,layer,rank,expert,weight), replacing any trace
 * in progress; NULL or "" stops tracing.  CB_ERR_IO if it cannot be opened,
 * CB_ERR_UNSUPPORTED for a dense model. */
int cb_ctx_route_trace(cb_ctx *ctx, const char *path, char *err, size_t err_len);

/* Experts row `row` of the last forward was routed to in `layer`: writes
 * n_used ids (rank order; -1 if the layer was skipped) and returns n_used,
 * or CB_ERR_ARG.  For per-request unique-expert accounting in the engine. */
int cb_ctx_row_experts(const cb_ctx *ctx, int row, int layer, int32_t *out);

#endif
