/*
 * model.h — a loaded model: the validated GGUF mapping, hyperparameters, a
 * typed view of every weight, and the vocabulary's token bytes.
 */
#ifndef CB_MODEL_H
#define CB_MODEL_H

#include "colibri.h"
#include "gguf.h"
#include "kernels.h"

/* What distinguishes one llama-family architecture from another: a row of
 * the table in model.c, plus what the file's metadata switches on (experts). */
typedef struct {
    int rope_neox;     /* RoPE pairing: 0 adjacent pairs (llama), 1 half-split (NeoX) */
    int qkv_bias;      /* 1: attn_q/k/v have .bias vectors (qwen2, qwen2moe) */
    int qk_norm;       /* 0 none; 1 RMSNorm per head with a [head_dim] weight (qwen3,
                          qwen3moe); 2 RMSNorm over the whole q / k projection with a
                          [q_dim] / [kv_dim] weight (olmoe) — always before RoPE */
    int moe;           /* 1: the FFN is a mixture of experts (ffn_gate_inp + ffn_*_exps) */
    int moe_norm_topk; /* 1: the top-k softmax weights are renormalised to sum to 1 */
    int shared_expert; /* 1: an always-on shared expert ffn_*_shexp gated by
                          sigmoid(ffn_gate_inp_shexp . h) (qwen2moe) */
    int gemma;         /* 1: the gemma block (gemma3): embeddings scaled by sqrt(n_embd),
                          RMSNorm of the attention and FFN outputs before the residual add
                          (post_attention_norm, post_ffw_norm), GELU-tanh gated FFN, and,
                          when the file gives a sliding window, local layers (see cb_model) */
} cb_arch_cfg;

/* One transformer block's weights (all views into the mapping, except the
 * norms and biases which are converted to f32 at load). */
typedef struct {
    float    *attn_norm;   /* [n_embd] owned */
    float    *ffn_norm;    /* [n_embd] owned */
    cb_weight wq;          /* [n_head*head_dim x n_embd] */
    cb_weight wk;          /* [n_head_kv*head_dim x n_embd] */
    cb_weight wv;          /* [n_head_kv*head_dim x n_embd] */
    cb_weight wo;          /* [n_embd x n_head*head_dim] */
    float    *bq, *bk, *bv;/* [q_dim], [kv_dim], [kv_dim] owned; NULL unless cfg.qkv_bias */
    float    *q_norm;      /* owned; [head_dim] (qk_norm 1) or [q_dim] (qk_norm 2); NULL if none */
    float    *k_norm;      /* owned; [head_dim] (qk_norm 1) or [kv_dim] (qk_norm 2); NULL if none */
    float    *attn_post_norm; /* owned; [n_embd]: RMSNorm of the attention output (gemma); NULL if none */
    float    *ffn_post_norm;  /* owned; [n_embd]: RMSNorm of the FFN output (gemma); NULL if none */
    int       swa;         /* 1: a local layer: attends to the last n_swa positions only,
                              RoPE with the local base (gemma3: every layer but each 6th) */
    /* dense FFN (cfg.moe == 0) */
    cb_weight w_gate;      /* [n_ff x n_embd] */
    cb_weight w_up;        /* [n_ff x n_embd] */
    cb_weight w_down;      /* [n_embd x n_ff] */
    /* mixture of experts (cfg.moe == 1).  The *_exps tensors are GGUF 3-D
     * [n_in, n_out, n_expert]: expert e's matrix is rows [e*n_out, (e+1)*n_out)
     * of a 2-D view with n_expert*n_out rows (see cb_expert_view). */
    cb_weight gate_inp;    /* router [n_expert x n_embd] */
    cb_weight gate_exps;   /* [n_expert*n_ff_exp x n_embd] */
    cb_weight up_exps;     /* [n_expert*n_ff_exp x n_embd] */
    cb_weight down_exps;   /* [n_expert*n_embd x n_ff_exp] */
    /* shared expert (cfg.shared_expert == 1) */
    cb_weight gate_shexp;  /* [n_ff_shexp x n_embd] */
    cb_weight up_shexp;    /* [n_ff_shexp x n_embd] */
    cb_weight down_shexp;  /* [n_embd x n_ff_shexp] */
    float    *gate_inp_shexp; /* [n_embd] owned: the shared expert's scalar gate */
} cb_layer;

struct gvocab;
void gvocab_free(struct gvocab *v);  /* grammar_vocab.c */

struct cb_model {
    cb_gguf        gguf;         /* the mapping and its parsed header */
    cb_model_info  info;         /* hyperparameters */
    cb_weight      tok_embd;     /* [n_vocab x n_embd] */
    cb_weight      output;       /* [n_vocab x n_embd]; equals tok_embd when tied */
    float         *output_norm;  /* [n_embd] owned */
    cb_layer      *layers;       /* [n_layer] owned */
    cb_arch_cfg    cfg;          /* architecture switches (table row + metadata) */
    int            n_expert;     /* experts per MoE layer (0: dense) */
    int            n_expert_used;/* experts routed per token (top-k) */
    int            n_ff_exp;     /* hidden size of one expert */
    int            n_ff_shexp;   /* hidden size of the shared expert (0: none) */
    int            n_ff_max;     /* max(n_ff, n_ff_exp, n_ff_shexp): FFN scratch width */
    float          expert_weights_scale; /* multiplies the routing weights (1 = off) */
    float          attn_scale;   /* attention scores' scale: 1/sqrt(head_dim) (gemma3 27B:
                                    1/sqrt(n_embd / n_head), as llama.cpp) */
    float          embd_scale;   /* token embeddings are multiplied by it (gemma: sqrt(n_embd)); 1 = off */
    float          final_softcap;/* logits = c * tanh(logits / c) when > 0 (0 = off) */
    int            n_swa;        /* sliding window of the local layers in positions (0: none) */
    float          rope_freq_base_swa;  /* RoPE of the local layers (gemma3: 10000, scale 1) */
    float          rope_freq_scale_swa;
    /* vocabulary: token i's bytes are tok_bytes[tok_off[i] .. tok_off[i+1]) */
    uint8_t       *tok_bytes;    /* owned */
    uint32_t      *tok_off;      /* [n_vocab + 1] owned */
    uint8_t       *tok_type;     /* [n_vocab] GGUF token types (1 if absent) */
    uint8_t       *tok_eog;      /* [n_vocab] 1 = ends generation */
    struct gvocab *gvocab;       /* the vocabulary as grammars walk it: built on first use
                                  * (grammar_vocab.c), shared by every grammar; owned */
    /* Quantized matrices in the AVX-512 panel layout (kernels.h), one block
     * that every packed cb_weight points into; NULL without AVX-512. */
    void          *packed;       /* owned */
    size_t         packed_bytes;
};

/* Expert e's slice of a stacked expert tensor as a plain 2-D weight of
 * rows_per_expert rows (no copy). */
static inline cb_weight cb_expert_view(const cb_weight *stack, int64_t rows_per_expert, int e) {
    cb_weight w = *stack;
    w.n_out = rows_per_expert;
    w.data = (const uint8_t *)stack->data + (size_t)e * (size_t)rows_per_expert * stack->row_bytes;
    /* stacks are packed expert by expert (each padded to whole panels) */
    if (stack->packed)
        w.packed = (const uint8_t *)stack->packed +
                   (size_t)e * cb_pack_bytes(stack->type, stack->n_in, rows_per_expert);
    return w;
}

#endif
