/*
 * model.h — a loaded model: the validated GGUF mapping, hyperparameters, a
 * typed view of every weight, and the vocabulary's token bytes.
 */
#ifndef CB_MODEL_H
#define CB_MODEL_H

#include "colibri.h"
#include "gguf.h"
#include "kernels.h"

/* One transformer block's weights (all views into the mapping, except the
 * norms which are converted to f32 at load). */
typedef struct {
    float    *attn_norm;   /* [n_embd] owned */
    float    *ffn_norm;    /* [n_embd] owned */
    cb_weight wq;          /* [n_head*head_dim x n_embd] */
    cb_weight wk;          /* [n_head_kv*head_dim x n_embd] */
    cb_weight wv;          /* [n_head_kv*head_dim x n_embd] */
    cb_weight wo;          /* [n_embd x n_head*head_dim] */
    cb_weight w_gate;      /* [n_ff x n_embd] */
    cb_weight w_up;        /* [n_ff x n_embd] */
    cb_weight w_down;      /* [n_embd x n_ff] */
} cb_layer;

struct cb_model {
    cb_gguf        gguf;         /* the mapping and its parsed header */
    cb_model_info  info;         /* hyperparameters */
    cb_weight      tok_embd;     /* [n_vocab x n_embd] */
    cb_weight      output;       /* [n_vocab x n_embd]; equals tok_embd when tied */
    float         *output_norm;  /* [n_embd] owned */
    cb_layer      *layers;       /* [n_layer] owned */
    /* vocabulary: token i's bytes are tok_bytes[tok_off[i] .. tok_off[i+1]) */
    uint8_t       *tok_bytes;    /* owned */
    uint32_t      *tok_off;      /* [n_vocab + 1] owned */
    uint8_t       *tok_type;     /* [n_vocab] GGUF token types (1 if absent) */
    uint8_t       *tok_eog;      /* [n_vocab] 1 = ends generation */
};

#endif
