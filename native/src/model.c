/*
 * model.c — cb_model_load: map and validate a GGUF file, read the
 * architecture's hyperparameters from metadata, check every weight's shape
 * against them, and decode the vocabulary to raw bytes.
 *
 * Architectures come from a table; a new llama-family architecture is a new
 * row, not new code, as long as it shares the block structure.
 */
#include "model.h"
#include "util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------- architectures */

typedef struct {
    const char *name;     /* general.architecture */
    cb_arch_cfg cfg;      /* see model.h; moe here = "experts required" */
    int         moe_opt;  /* 1: experts if <arch>.expert_count > 0 (llama: Mixtral) */
} cb_arch;

/*                 rope_neox qkv_bias qk_norm moe norm_topk shexp gemma   moe_opt
 * Conventions as llama.cpp's llama-model.cpp: Mixtral is "llama" with
 * experts and renormalised top-k; qwen3moe renormalises, olmoe and qwen2moe
 * do not; olmoe normalises the whole q / k projection; gemma3 normalises q
 * and k per head and has the gemma block (model.h). */
static const cb_arch ARCHES[] = {
    { "llama",    { 0, 0, 0, 0, 1, 0, 0 }, 1 },
    { "qwen2",    { 1, 1, 0, 0, 0, 0, 0 }, 0 },
    { "qwen3",    { 1, 0, 1, 0, 0, 0, 0 }, 0 },
    { "qwen3moe", { 1, 0, 1, 1, 1, 0, 0 }, 0 },
    { "olmoe",    { 1, 0, 2, 1, 0, 0, 0 }, 0 },
    { "qwen2moe", { 1, 1, 0, 1, 0, 1, 0 }, 0 },
    { "gemma3",   { 1, 0, 1, 0, 0, 0, 1 }, 0 },
};
#define ARCH_NAMES "llama, qwen2, qwen3, qwen3moe, olmoe, qwen2moe, gemma3"

static const cb_arch *arch_find(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof(ARCHES) / sizeof(ARCHES[0]); i++)
        if (strlen(ARCHES[i].name) == len && memcmp(ARCHES[i].name, name, len) == 0) return &ARCHES[i];
    return NULL;
}

/* ------------------------------------------------------------- metadata */

/* Integer hyperparameter "<arch>.<suffix>" in [lo, hi]; CB_ERR_NOT_FOUND if
 * absent and not required. */
static int hp_int(const cb_gguf *g, const char *arch, const char *suffix, int required,
                  int64_t lo, int64_t hi, int64_t *out, char *err, size_t err_len) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = cb_gguf_get_int(g, key, out, err, err_len);
    if (rc == CB_ERR_NOT_FOUND) {
        if (required) set_err(err, err_len, "missing metadata key '%s'", key);
        return required ? CB_ERR_FORMAT : CB_ERR_NOT_FOUND;
    }
    if (rc != CB_OK) return rc;
    if (*out < lo || *out > hi) {
        set_err(err, err_len, "metadata '%s' = %lld is out of range [%lld, %lld]", key,
                (long long)*out, (long long)lo, (long long)hi);
        return CB_ERR_FORMAT;
    }
    return CB_OK;
}

static int hp_float(const cb_gguf *g, const char *arch, const char *suffix, double def,
                    double lo, double hi, double *out, char *err, size_t err_len) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = cb_gguf_get_float(g, key, out, err, err_len);
    if (rc == CB_ERR_NOT_FOUND) { *out = def; return CB_OK; }
    if (rc != CB_OK) return rc;
    if (!(*out >= lo && *out <= hi)) {  /* also rejects NaN */
        set_err(err, err_len, "metadata '%s' = %g is out of range [%g, %g]", key, *out, lo, hi);
        return CB_ERR_FORMAT;
    }
    return CB_OK;
}

/* ---------------------------------------------------------------- weights */

/* Find tensor `name` and check it is 2-D [n_in, n_out] (GGUF order) of a
 * supported type; fill a cb_weight view. */
static int get_weight(const cb_model *m, const char *name, int64_t n_in, int64_t n_out,
                      int required, cb_weight *w, char *err, size_t err_len) {
    const cb_gguf_tensor *t = cb_gguf_find_tensor(&m->gguf, name);
    memset(w, 0, sizeof *w);
    if (!t) {
        if (required) set_err(err, err_len, "missing tensor '%s'", name);
        return required ? CB_ERR_FORMAT : CB_ERR_NOT_FOUND;
    }
    if (t->n_dims > 2 || t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != 1 || t->ne[3] != 1) {
        set_err(err, err_len, "tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld] from the model's hyperparameters",
                name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                (long long)n_in, (long long)n_out);
        return CB_ERR_FORMAT;
    }
    if (!cb_type_supported((int)t->type)) {
        set_err(err, err_len, "tensor '%s' has type %s, which the engine does not support yet",
                name, cb_type_name((int)t->type));
        return CB_ERR_UNSUPPORTED;
    }
    w->type = (int)t->type;
    w->n_in = n_in;
    w->n_out = n_out;
    w->data = t->data;
    w->row_bytes = cb_type_size((int)t->type, n_in);
    return CB_OK;
}

/* A 1-D norm weight of length n converted to an owned f32 array. */
static int get_norm(const cb_model *m, const char *name, int64_t n, float **out,
                    char *err, size_t err_len) {
    const cb_gguf_tensor *t = cb_gguf_find_tensor(&m->gguf, name);
    *out = NULL;
    if (!t) { set_err(err, err_len, "missing tensor '%s'", name); return CB_ERR_FORMAT; }
    if (t->n_dims != 1 || t->ne[0] != n) {
        set_err(err, err_len, "tensor '%s' has %u dims and length %lld, expected a vector of %lld",
                name, t->n_dims, (long long)t->ne[0], (long long)n);
        return CB_ERR_FORMAT;
    }
    if (t->type != CB_TYPE_F32 && t->type != CB_TYPE_F16 && t->type != CB_TYPE_BF16) {
        set_err(err, err_len, "norm tensor '%s' has type %s; expected F32, F16 or BF16",
                name, cb_type_name((int)t->type));
        return CB_ERR_UNSUPPORTED;
    }
    float *v = malloc((size_t)n * sizeof(float));
    if (!v) { set_err(err, err_len, "out of memory"); return CB_ERR_NOMEM; }
    cb_weight w = { (int)t->type, n, 1, t->data, cb_type_size((int)t->type, n), NULL };
    cb_weight_row_f32(&w, 0, v);
    *out = v;
    return CB_OK;
}

/* A stacked expert tensor: GGUF 3-D [n_in, n_out, n_expert] of a supported
 * type, viewed as 2-D with n_expert*n_out rows (rows of one expert are
 * contiguous because ne[1] varies faster than ne[2]). */
static int get_experts(const cb_model *m, const char *name, int64_t n_in, int64_t n_out, int64_t n_expert,
                       cb_weight *w, char *err, size_t err_len) {
    const cb_gguf_tensor *t = cb_gguf_find_tensor(&m->gguf, name);
    memset(w, 0, sizeof *w);
    if (!t) { set_err(err, err_len, "missing tensor '%s'", name); return CB_ERR_FORMAT; }
    if (t->n_dims != 3 || t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != n_expert || t->ne[3] != 1) {
        set_err(err, err_len, "tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld] from the model's hyperparameters",
                name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                (long long)n_in, (long long)n_out, (long long)n_expert);
        return CB_ERR_FORMAT;
    }
    if (!cb_type_supported((int)t->type)) {
        set_err(err, err_len, "tensor '%s' has type %s, which the engine does not support yet",
                name, cb_type_name((int)t->type));
        return CB_ERR_UNSUPPORTED;
    }
    w->type = (int)t->type;
    w->n_in = n_in;
    w->n_out = n_out * n_expert;
    w->data = t->data;
    w->row_bytes = cb_type_size((int)t->type, n_in);
    return CB_OK;
}

/* Like get_norm, but CB_ERR_NOT_FOUND (no message) when absent and optional. */
static int get_vec(const cb_model *m, const char *name, int64_t n, int required, float **out,
                   char *err, size_t err_len) {
    *out = NULL;
    if (!cb_gguf_find_tensor(&m->gguf, name) && !required) return CB_ERR_NOT_FOUND;
    return get_norm(m, name, n, out, err, err_len);
}

/* ------------------------------------------------------------- vocabulary */

/* GPT-2 byte-level BPE stores byte b as a printable code point; invert it. */
static int gpt2_unicode_to_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
    if (cp >= 256 && cp < 256 + 68) {
        /* the n-th byte that is not printable, in increasing order */
        int n = (int)(cp - 256);
        for (int b = 0; b < 256; b++) {
            int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
            if (!printable && n-- == 0) return b;
        }
    }
    return -1;
}

/* Decode one UTF-8 code point from s[0..n); returns its length or 0 if invalid. */
static int utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    uint8_t c = s[0];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || (size_t)len > n) return 0;
    uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    *cp = v;
    return len;
}

static int is_hex(int c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f'); }
static int hex_val(int c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

/* Append token text `s` decoded to raw bytes.  gpt2: byte-level mapping;
 * llama (SentencePiece): U+2581 -> space and <0xXX> byte tokens. Control and
 * user-defined tokens keep their text. Returns bytes written. */
static size_t decode_token(int spm, int type, const uint8_t *s, size_t n, uint8_t *out) {
    size_t o = 0;
    if (type == 3 || type == 4) { memcpy(out, s, n); return n; }
    if (spm) {
        if (type == 6 && n == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && is_hex(s[3]) && is_hex(s[4]) && s[5] == '>') {
            out[0] = (uint8_t)(hex_val(s[3]) * 16 + hex_val(s[4]));
            return 1;
        }
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && s[i] == 0xe2 && s[i + 1] == 0x96 && s[i + 2] == 0x81) { out[o++] = ' '; i += 3; }
            else out[o++] = s[i++];
        }
        return o;
    }
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int len = utf8_decode(s + i, n - i, &cp);
        if (len == 0) { out[o++] = s[i++]; continue; }  /* invalid UTF-8: keep the byte */
        int b = gpt2_unicode_to_byte(cp);
        if (b >= 0) out[o++] = (uint8_t)b;
        else { memcpy(out + o, s + i, (size_t)len); o += (size_t)len; }
        i += (size_t)len;
    }
    return o;
}

static int str_eq(cb_gguf_str s, const char *lit) {
    return s.len == strlen(lit) && memcmp(s.ptr, lit, s.len) == 0;
}

static int load_vocab(cb_model *m, char *err, size_t err_len) {
    const cb_gguf *g = &m->gguf;
    int n_vocab = m->info.n_vocab;
    int64_t ki = cb_gguf_find_key(g, "tokenizer.ggml.tokens");
    m->tok_off = calloc((size_t)n_vocab + 1, sizeof(uint32_t));
    m->tok_type = malloc((size_t)n_vocab);
    m->tok_eog = calloc((size_t)n_vocab, 1);
    if (!m->tok_off || !m->tok_type || !m->tok_eog) { set_err(err, err_len, "out of memory"); return CB_ERR_NOMEM; }
    memset(m->tok_type, 1, (size_t)n_vocab);
    if (ki < 0) {  /* no vocabulary: tokens have no bytes (engine still runs on ids) */
        m->tok_bytes = malloc(1);
        return m->tok_bytes ? CB_OK : CB_ERR_NOMEM;
    }
    const cb_gguf_kv *tok = &g->kv[ki];
    if (tok->type != GGUF_T_ARR || tok->arr_type != GGUF_T_STR) {
        set_err(err, err_len, "'tokenizer.ggml.tokens' must be an array of strings");
        return CB_ERR_FORMAT;
    }
    if (tok->arr_len != (uint64_t)n_vocab) {
        set_err(err, err_len, "'tokenizer.ggml.tokens' has %llu entries but the model's vocabulary has %d",
                (unsigned long long)tok->arr_len, n_vocab);
        return CB_ERR_FORMAT;
    }
    int64_t ti = cb_gguf_find_key(g, "tokenizer.ggml.token_type");
    if (ti >= 0) {
        const cb_gguf_kv *tt = &g->kv[ti];
        if (tt->type != GGUF_T_ARR || tt->arr_len != (uint64_t)n_vocab || tt->arr_type == GGUF_T_STR) {
            set_err(err, err_len, "'tokenizer.ggml.token_type' must be a numeric array of %d entries", n_vocab);
            return CB_ERR_FORMAT;
        }
        for (int i = 0; i < n_vocab; i++) {
            int64_t v;
            if (cb_gguf_arr_int(tt, (uint64_t)i, &v) != CB_OK || v < 0 || v > 6) {
                set_err(err, err_len, "'tokenizer.ggml.token_type'[%d] is not a token type (0..6)", i);
                return CB_ERR_FORMAT;
            }
            m->tok_type[i] = (uint8_t)v;
        }
    }
    cb_gguf_str model_name = { "gpt2", 4 };
    cb_gguf_get_str(g, "tokenizer.ggml.model", &model_name, NULL, 0);
    int spm = str_eq(model_name, "llama");
    uint64_t total = 0;
    for (int i = 0; i < n_vocab; i++) total += tok->arr_str[i].len;
    if (total > UINT32_MAX) { set_err(err, err_len, "vocabulary text too large"); return CB_ERR_FORMAT; }
    m->tok_bytes = malloc(total ? total : 1);  /* decoding never grows a token */
    if (!m->tok_bytes) { set_err(err, err_len, "out of memory"); return CB_ERR_NOMEM; }
    uint32_t off = 0;
    /* End of generation as llama.cpp's llama_vocab::load decides it (and
     * colibri_lab/tokenizer.py, tested equal on the real files): any token
     * with one of these texts, whatever its type; the eos / eot / eom ids;
     * and the fill-in-the-middle pad, repo and file-separator tokens, by
     * metadata key or else by the first of their texts found. */
    static const char *eog_text[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
        "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
        "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
        "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>" /* DeepSeek, U+FF5C / U+2581 */, "[e~[" };
    static const char *fim_key[3] = { "tokenizer.ggml.fim_pad_token_id", "tokenizer.ggml.fim_rep_token_id",
                                      "tokenizer.ggml.fim_sep_token_id" };
    static const char *fim_text[3][5] = {
        { "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", NULL },
        { "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>" },
        { "<|file_sep|>", NULL, NULL, NULL, NULL } };
    int fim_found[3][5];
    for (int f = 0; f < 3; f++)
        for (int t = 0; t < 5; t++) fim_found[f][t] = -1;
    for (int i = 0; i < n_vocab; i++) {
        cb_gguf_str s = tok->arr_str[i];
        m->tok_off[i] = off;
        off += (uint32_t)decode_token(spm, m->tok_type[i], (const uint8_t *)s.ptr, s.len, m->tok_bytes + off);
        for (size_t k = 0; k < sizeof eog_text / sizeof eog_text[0]; k++)
            if (str_eq(s, eog_text[k])) m->tok_eog[i] = 1;
        for (int f = 0; f < 3; f++)
            for (int t = 0; t < 5; t++)
                if (fim_text[f][t] && fim_found[f][t] < 0 && str_eq(s, fim_text[f][t])) fim_found[f][t] = i;
    }
    m->tok_off[n_vocab] = off;
    static const char *eog_keys[] = { "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                      "tokenizer.ggml.eom_token_id" };
    for (size_t k = 0; k < sizeof eog_keys / sizeof eog_keys[0]; k++) {
        int64_t id;
        if (cb_gguf_get_int(g, eog_keys[k], &id, NULL, 0) == CB_OK && id >= 0 && id < n_vocab) m->tok_eog[id] = 1;
    }
    for (int f = 0; f < 3; f++) {
        int64_t id;
        if (cb_gguf_get_int(g, fim_key[f], &id, NULL, 0) == CB_OK) {
            if (id >= 0 && id < n_vocab) m->tok_eog[id] = 1;
            continue;
        }
        for (int t = 0; t < 5; t++)
            if (fim_found[f][t] >= 0) { m->tok_eog[fim_found[f][t]] = 1; break; }
    }
    return CB_OK;
}

/* -------------------------------------------------------------- load/free */

cb_model_params cb_model_default_params(void) {
    cb_model_params p = { 0 };
    return p;
}

/* Feed-forward widths and, for mixture-of-experts models, the experts. */
static int read_ffn_hparams(cb_model *m, const cb_arch *arch, const char *an, char *err, size_t err_len) {
    const cb_gguf *g = &m->gguf;
    cb_model_info *I = &m->info;
    const int64_t BIG = 1 << 20;
    int64_t v;
    int rc;
    /* Experts: required by the MoE families, optional for llama (Mixtral). */
    rc = hp_int(g, an, "expert_count", 0, 0, 4096, &v, err, err_len);
    if (rc == CB_ERR_NOT_FOUND) v = 0; else if (rc) return rc;
    m->n_expert = (int)v;
    if (arch->moe_opt && m->n_expert > 0) m->cfg.moe = 1;
    if (m->cfg.moe) {
        if (m->n_expert < 1) { set_err(err, err_len, "%s.expert_count must be >= 1 for architecture '%s'", an, an); return CB_ERR_FORMAT; }
        if ((rc = hp_int(g, an, "expert_used_count", 1, 1, m->n_expert, &v, err, err_len))) return rc;
        m->n_expert_used = (int)v;
    } else {
        m->n_expert = 0;  /* a dense architecture ignores a stray expert_count */
    }
    /* Dense FFN width; for MoE models it may be absent (experts have their own). */
    rc = hp_int(g, an, "feed_forward_length", !m->cfg.moe, 1, BIG, &v, err, err_len);
    if (rc == CB_ERR_NOT_FOUND) v = 0; else if (rc) return rc;
    I->n_ff = (int)v;
    if (m->cfg.moe) {
        rc = hp_int(g, an, "expert_feed_forward_length", 0, 1, BIG, &v, err, err_len);
        if (rc == CB_ERR_NOT_FOUND) {
            if (I->n_ff <= 0) { set_err(err, err_len, "missing metadata key '%s.expert_feed_forward_length' (and no feed_forward_length)", an); return CB_ERR_FORMAT; }
            v = I->n_ff;  /* llama (Mixtral), olmoe: experts use feed_forward_length */
        } else if (rc) return rc;
        m->n_ff_exp = (int)v;
        if (I->n_ff <= 0) I->n_ff = m->n_ff_exp;
        if (m->cfg.shared_expert) {
            rc = hp_int(g, an, "expert_shared_feed_forward_length", 0, 1, BIG, &v, err, err_len);
            if (rc == CB_ERR_NOT_FOUND) v = I->n_ff; else if (rc) return rc;
            m->n_ff_shexp = (int)v;
        }
        double sc;
        if ((rc = hp_float(g, an, "expert_weights_scale", 1.0, 0.0, 1e6, &sc, err, err_len))) return rc;
        m->expert_weights_scale = sc == 0.0 ? 1.0f : (float)sc;  /* llama.cpp: 0 = off */
    }
    m->n_ff_max = I->n_ff;
    if (m->n_ff_exp > m->n_ff_max) m->n_ff_max = m->n_ff_exp;
    if (m->n_ff_shexp > m->n_ff_max) m->n_ff_max = m->n_ff_shexp;
    return CB_OK;
}

/* Blocks, heads, head size and training context. */
static int read_attn_hparams(cb_model *m, const char *an, char *err, size_t err_len) {
    const cb_gguf *g = &m->gguf;
    cb_model_info *I = &m->info;
    int64_t v;
    int rc;
    if ((rc = hp_int(g, an, "block_count", 1, 1, 4096, &v, err, err_len))) return rc;
    I->n_layer = (int)v;
    if ((rc = hp_int(g, an, "attention.head_count", 1, 1, 4096, &v, err, err_len))) return rc;
    I->n_head = (int)v;
    rc = hp_int(g, an, "attention.head_count_kv", 0, 1, 4096, &v, err, err_len);
    if (rc == CB_ERR_NOT_FOUND) v = I->n_head; else if (rc) return rc;
    I->n_head_kv = (int)v;
    rc = hp_int(g, an, "context_length", 0, 1, 1 << 24, &v, err, err_len);
    if (rc == CB_ERR_NOT_FOUND) v = 2048; else if (rc) return rc;
    I->n_ctx_train = (int)v;
    if (I->n_head % I->n_head_kv) {
        set_err(err, err_len, "head_count %d is not a multiple of head_count_kv %d", I->n_head, I->n_head_kv);
        return CB_ERR_FORMAT;
    }
    /* Head size: attention.key_length when given (qwen3, gemma3: q_dim may
     * differ from n_embd), else n_embd / n_head. */
    rc = hp_int(g, an, "attention.key_length", 0, 2, 4096, &v, err, err_len);
    if (rc == CB_ERR_NOT_FOUND) {
        if (I->n_embd % I->n_head) {
            set_err(err, err_len, "embedding_length %d is not a multiple of head_count %d", I->n_embd, I->n_head);
            return CB_ERR_FORMAT;
        }
        v = I->n_embd / I->n_head;
    } else if (rc) return rc;
    I->head_dim = (int)v;
    {   /* values must have the same head size: the engine's KV rows share it */
        int64_t vl;
        rc = hp_int(g, an, "attention.value_length", 0, 2, 4096, &vl, err, err_len);
        if (rc == CB_OK && vl != I->head_dim) {
            set_err(err, err_len, "attention.value_length %lld differs from key_length %d (not supported)", (long long)vl, I->head_dim);
            return CB_ERR_UNSUPPORTED;
        }
        if (rc != CB_OK && rc != CB_ERR_NOT_FOUND) return rc;
    }
    if (I->head_dim % 2) { set_err(err, err_len, "head dimension %d is odd", I->head_dim); return CB_ERR_FORMAT; }
    if (I->head_dim > CB_MAX_HEAD_DIM) {
        set_err(err, err_len, "head dimension %d is larger than the %d supported", I->head_dim, CB_MAX_HEAD_DIM);
        return CB_ERR_UNSUPPORTED;
    }
    m->attn_scale = 1.0f / sqrtf((float)I->head_dim);
    double d;
    if ((rc = hp_float(g, an, "attention.layer_norm_rms_epsilon", 1e-5, 0.0, 1.0, &d, err, err_len))) return rc;
    I->norm_eps = (float)d;
    return CB_OK;
}

/* RoPE: rotated dimensions, base and linear scaling (others change the
 * math and are refused). */
static int read_rope_hparams(cb_model *m, const cb_arch *arch, const char *an, char *err, size_t err_len) {
    const cb_gguf *g = &m->gguf;
    cb_model_info *I = &m->info;
    int64_t v;
    int rc;
    rc = hp_int(g, an, "rope.dimension_count", 0, 2, I->head_dim, &v, err, err_len);
    if (rc == CB_ERR_NOT_FOUND) v = I->head_dim; else if (rc) return rc;
    if (v % 2) { set_err(err, err_len, "rope.dimension_count %lld is odd", (long long)v); return CB_ERR_FORMAT; }
    I->n_rot = (int)v;
    I->rope_neox = arch->cfg.rope_neox;
    double d;
    if ((rc = hp_float(g, an, "rope.freq_base", 10000.0, 1e-3, 1e12, &d, err, err_len))) return rc;
    I->rope_freq_base = (float)d;
    I->rope_freq_scale = 1.0f;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", an);
    cb_gguf_str st;
    int has_type = cb_gguf_get_str(g, key, &st, NULL, 0) == CB_OK;
    if (has_type && !str_eq(st, "none") && !str_eq(st, "linear")) {
        set_err(err, err_len, "RoPE scaling type '%.*s' is not supported (only none and linear)", (int)st.len, st.ptr);
        return CB_ERR_UNSUPPORTED;
    }
    if (!has_type || str_eq(st, "linear")) {
        double factor = 0;
        if ((rc = hp_float(g, an, "rope.scaling.factor", 0.0, 0.0, 1e6, &factor, err, err_len))) return rc;
        if (factor == 0) { if ((rc = hp_float(g, an, "rope.scale_linear", 0.0, 0.0, 1e6, &factor, err, err_len))) return rc; }
        if (factor > 0) I->rope_freq_scale = (float)(1.0 / factor);
    }
    return CB_OK;
}

/* The gemma block's hyperparameters, as llama.cpp's loader sets them for
 * gemma3 (llama-model.cpp): with attention.sliding_window > 0, every layer
 * but each 6th (il % 6 < 5) is local, and local layers rotate with base
 * 10000 and no scaling whatever the file says (the global layers take
 * rope.freq_base and the scaling); queries are scaled by 1/sqrt(key_length),
 * except for the 27B model (62 blocks), which uses 1/sqrt(n_embd / n_head);
 * embeddings are multiplied by sqrt(n_embd).  llama.cpp's converter stores
 * gemma's RMSNorm weights as (1 + w), so the norms here are plain ones. */
static int read_gemma_hparams(cb_model *m, const char *an, char *err, size_t err_len) {
    const cb_gguf *g = &m->gguf;
    cb_model_info *I = &m->info;
    int64_t v;
    int rc;
    rc = hp_int(g, an, "attention.sliding_window", 0, 0, 1 << 24, &v, err, err_len);
    if (rc == CB_ERR_NOT_FOUND) v = 0; else if (rc) return rc;
    m->n_swa = (int)v;
    I->n_swa = m->n_swa;
    m->rope_freq_base_swa = 10000.0f;
    m->rope_freq_scale_swa = 1.0f;
    m->embd_scale = sqrtf((float)I->n_embd);
    if (I->n_layer == 62) m->attn_scale = 1.0f / sqrtf((float)(I->n_embd / I->n_head));
    double d;
    if ((rc = hp_float(g, an, "final_logit_softcapping", 0.0, 0.0, 1e6, &d, err, err_len))) return rc;
    m->final_softcap = (float)d;
    return CB_OK;
}

/* Vocabulary size: metadata, else the tokens array, else the embedding. */
static int read_vocab_size(cb_model *m, const char *an, char *err, size_t err_len) {
    const cb_gguf *g = &m->gguf;
    int64_t v;
    const cb_gguf_tensor *te = cb_gguf_find_tensor(g, "token_embd.weight");
    if (!te) { set_err(err, err_len, "missing tensor 'token_embd.weight'"); return CB_ERR_FORMAT; }
    int rc = hp_int(g, an, "vocab_size", 0, 1, 1 << 24, &v, err, err_len);
    if (rc == CB_ERR_NOT_FOUND) {
        int64_t ki = cb_gguf_find_key(g, "tokenizer.ggml.tokens");
        v = ki >= 0 && g->kv[ki].type == GGUF_T_ARR ? (int64_t)g->kv[ki].arr_len : te->ne[1];
    } else if (rc) return rc;
    if (v < 1 || v > (1 << 24)) { set_err(err, err_len, "vocabulary size %lld is out of range", (long long)v); return CB_ERR_FORMAT; }
    m->info.n_vocab = (int)v;
    return CB_OK;
}

/* The shared expert (qwen2moe): three matrices and a scalar gate that
 * llama.cpp stores as a [n_embd] or [n_embd, 1] tensor. */
static int load_shared_expert(cb_model *m, int l, char *err, size_t err_len) {
    cb_layer *L = &m->layers[l];
    const int64_t D = m->info.n_embd, F = m->n_ff_shexp;
    char name[96];
    int rc;
    snprintf(name, sizeof name, "blk.%d.ffn_gate_shexp.weight", l);
    if ((rc = get_weight(m, name, D, F, 1, &L->gate_shexp, err, err_len))) return rc;
    snprintf(name, sizeof name, "blk.%d.ffn_up_shexp.weight", l);
    if ((rc = get_weight(m, name, D, F, 1, &L->up_shexp, err, err_len))) return rc;
    snprintf(name, sizeof name, "blk.%d.ffn_down_shexp.weight", l);
    if ((rc = get_weight(m, name, F, D, 1, &L->down_shexp, err, err_len))) return rc;
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp_shexp.weight", l);
    const cb_gguf_tensor *gt = cb_gguf_find_tensor(&m->gguf, name);
    if (!gt) { set_err(err, err_len, "missing tensor '%s'", name); return CB_ERR_FORMAT; }
    if (gt->n_dims == 2 && gt->ne[1] == 1 && gt->ne[0] == D) {
        cb_weight gw;
        if ((rc = get_weight(m, name, D, 1, 1, &gw, err, err_len))) return rc;
        L->gate_inp_shexp = malloc((size_t)D * sizeof(float));
        if (!L->gate_inp_shexp) { set_err(err, err_len, "out of memory"); return CB_ERR_NOMEM; }
        cb_weight_row_f32(&gw, 0, L->gate_inp_shexp);
        return CB_OK;
    }
    return get_norm(m, name, D, &L->gate_inp_shexp, err, err_len);
}

/* Block l's weights, checked against the hyperparameters. */
static int load_layer(cb_model *m, int l, char *err, size_t err_len) {
    const cb_model_info *I = &m->info;
    cb_layer *L = &m->layers[l];
    const int64_t qdim = (int64_t)I->n_head * I->head_dim, kvdim = (int64_t)I->n_head_kv * I->head_dim;
    char name[96];
    int rc;
#define W(field, suffix, nin, nout) \
    snprintf(name, sizeof name, "blk.%d." suffix ".weight", l); \
    if ((rc = get_weight(m, name, nin, nout, 1, &L->field, err, err_len))) return rc;
#define V(field, suffix, n) \
    snprintf(name, sizeof name, "blk.%d." suffix, l); \
    if ((rc = get_vec(m, name, n, 1, &L->field, err, err_len))) return rc;
    W(wq, "attn_q", I->n_embd, qdim)
    W(wk, "attn_k", I->n_embd, kvdim)
    W(wv, "attn_v", I->n_embd, kvdim)
    W(wo, "attn_output", qdim, I->n_embd)
    if (m->cfg.qkv_bias) {
        V(bq, "attn_q.bias", qdim)
        V(bk, "attn_k.bias", kvdim)
        V(bv, "attn_v.bias", kvdim)
    }
    if (m->cfg.qk_norm) {
        const int whole = m->cfg.qk_norm == 2;
        V(q_norm, "attn_q_norm.weight", whole ? qdim : I->head_dim)
        V(k_norm, "attn_k_norm.weight", whole ? kvdim : I->head_dim)
    }
    if (m->cfg.gemma) {
        V(attn_post_norm, "post_attention_norm.weight", I->n_embd)
        V(ffn_post_norm, "post_ffw_norm.weight", I->n_embd)
        L->swa = m->n_swa > 0 && l % 6 < 5;
    }
    if (!m->cfg.moe) {
        W(w_gate, "ffn_gate", I->n_embd, I->n_ff)
        W(w_up, "ffn_up", I->n_embd, I->n_ff)
        W(w_down, "ffn_down", I->n_ff, I->n_embd)
    } else {
        W(gate_inp, "ffn_gate_inp", I->n_embd, m->n_expert)
#define X(field, suffix, nin, nout) \
        snprintf(name, sizeof name, "blk.%d." suffix ".weight", l); \
        if ((rc = get_experts(m, name, nin, nout, m->n_expert, &L->field, err, err_len))) return rc;
        X(gate_exps, "ffn_gate_exps", I->n_embd, m->n_ff_exp)
        X(up_exps, "ffn_up_exps", I->n_embd, m->n_ff_exp)
        X(down_exps, "ffn_down_exps", m->n_ff_exp, I->n_embd)
#undef X
        if (m->cfg.shared_expert && (rc = load_shared_expert(m, l, err, err_len))) return rc;
    }
    V(attn_norm, "attn_norm.weight", I->n_embd)
    V(ffn_norm, "ffn_norm.weight", I->n_embd)
#undef V
#undef W
    return CB_OK;
}

/* The llama-family model: hyperparameters, then every weight. */
static int build_llama(cb_model *m, const cb_arch *arch, const char *an, char *err, size_t err_len) {
    cb_model_info *I = &m->info;
    int64_t v;
    int rc;
    if ((rc = hp_int(&m->gguf, an, "embedding_length", 1, 1, 1 << 20, &v, err, err_len))) return rc;
    I->n_embd = (int)v;
    m->cfg = arch->cfg;
    m->embd_scale = 1.0f;
    if ((rc = read_ffn_hparams(m, arch, an, err, err_len))) return rc;
    if ((rc = read_attn_hparams(m, an, err, err_len))) return rc;
    if ((rc = read_rope_hparams(m, arch, an, err, err_len))) return rc;
    if (m->cfg.gemma && (rc = read_gemma_hparams(m, an, err, err_len))) return rc;
    if ((rc = read_vocab_size(m, an, err, err_len))) return rc;

    if ((rc = get_weight(m, "token_embd.weight", I->n_embd, I->n_vocab, 1, &m->tok_embd, err, err_len))) return rc;
    rc = get_weight(m, "output.weight", I->n_embd, I->n_vocab, 0, &m->output, err, err_len);
    if (rc == CB_ERR_NOT_FOUND) { m->output = m->tok_embd; I->tied_output = 1; }
    else if (rc) return rc;
    if ((rc = get_norm(m, "output_norm.weight", I->n_embd, &m->output_norm, err, err_len))) return rc;
    m->layers = calloc((size_t)I->n_layer, sizeof(cb_layer));
    if (!m->layers) { set_err(err, err_len, "out of memory"); return CB_ERR_NOMEM; }
    for (int l = 0; l < I->n_layer; l++)
        if ((rc = load_layer(m, l, err, err_len))) return rc;
    return CB_OK;
}

/* ---------------------------------------------------------------- packing */

/* One matrix to pack: w, packed in groups of `rows` rows (an expert stack is
 * packed expert by expert so that cb_expert_view finds whole panels). */
typedef struct { cb_weight *w; int64_t rows; } pack_item;

/* The model's quantized matrices (output last; tied output is tok_embd's
 * data, whose file layout stays for embedding lookups).  Returns the count;
 * items may be NULL to count only. */
static int pack_list(cb_model *m, int simd, pack_item *items) {
    int n = 0;
#define P(W, R) do { if ((W).data && cb_pack_wanted(simd, (W).type) && cb_pack_bytes((W).type, (W).n_in, (R))) { \
        if (items) { items[n].w = &(W); items[n].rows = (R); } n++; } } while (0)
    for (int l = 0; l < m->info.n_layer; l++) {
        cb_layer *L = &m->layers[l];
        P(L->wq, L->wq.n_out); P(L->wk, L->wk.n_out); P(L->wv, L->wv.n_out); P(L->wo, L->wo.n_out);
        P(L->w_gate, L->w_gate.n_out); P(L->w_up, L->w_up.n_out); P(L->w_down, L->w_down.n_out);
        P(L->gate_inp, L->gate_inp.n_out);
        P(L->gate_exps, m->n_ff_exp); P(L->up_exps, m->n_ff_exp); P(L->down_exps, m->info.n_embd);
        P(L->gate_shexp, L->gate_shexp.n_out); P(L->up_shexp, L->up_shexp.n_out);
        P(L->down_shexp, L->down_shexp.n_out);
    }
    P(m->output, m->output.n_out);
#undef P
    return n;
}

/* Build the panel layout of every quantized matrix when this CPU runs the
 * AVX-512 kernels, of the K-quant matrices when it runs AVX2 ones
 * (cb_pack_wanted; engines at other levels and other types keep reading the
 * file layout through the mapping).  Afterwards the file pages of the packed
 * ranges are dropped from this process (they fault back in from the page
 * cache when a scalar / AVX2 engine or an embedding lookup of a tied output
 * reads them), so resident memory stays about one copy of the weights. */
static int pack_weights(cb_model *m, char *err, size_t err_len) {
    const int simd = cb_kernels_get(CB_SIMD_AVX512) ? CB_SIMD_AVX512 : cb_kernels_get(CB_SIMD_AVX2) ? CB_SIMD_AVX2 : 0;
    if (!simd) return CB_OK;
    const int n = pack_list(m, simd, NULL);
    if (n == 0) return CB_OK;
    pack_item *items = malloc((size_t)n * sizeof *items);
    if (!items) { set_err(err, err_len, "out of memory"); return CB_ERR_NOMEM; }
    pack_list(m, simd, items);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const cb_weight *w = items[i].w;
        const int64_t groups = w->n_out / items[i].rows;
        total += (size_t)groups * cb_pack_bytes(w->type, w->n_in, items[i].rows);
    }
    m->packed = cb_big_alloc(total);
    if (!m->packed) { free(items); set_err(err, err_len, "out of memory packing %zu bytes of weights", total); return CB_ERR_NOMEM; }
    m->packed_bytes = total;
    uint8_t *dst = m->packed;
    for (int i = 0; i < n; i++) {
        cb_weight *w = items[i].w;
        const int64_t rows = items[i].rows, groups = w->n_out / rows;
        const size_t gbytes = cb_pack_bytes(w->type, w->n_in, rows);
        for (int64_t e = 0; e < groups; e++) {
            cb_weight g = *w;
            g.n_out = rows;
            g.data = (const uint8_t *)w->data + (size_t)e * (size_t)rows * w->row_bytes;
            cb_pack_weight(&g, dst + (size_t)e * gbytes);
        }
        w->packed = dst;
        dst += (size_t)groups * gbytes;
    }
    for (int i = 0; i < n; i++)
        cb_gguf_drop_pages(&m->gguf, items[i].w->data, (size_t)items[i].w->n_out * items[i].w->row_bytes);
    free(items);
    return CB_OK;
}

int cb_model_load(const char *path, const cb_model_params *params, cb_model **out,
                  char *err, size_t err_len) {
    if (err && err_len) err[0] = 0;
    if (!out) return CB_ERR_ARG;
    *out = NULL;
    if (!path) { set_err(err, err_len, "no model path given"); return CB_ERR_ARG; }
    cb_model_params defaults = cb_model_default_params();
    if (!params) params = &defaults;
    cb_model *m = calloc(1, sizeof *m);
    if (!m) { set_err(err, err_len, "out of memory"); return CB_ERR_NOMEM; }
    int rc = cb_gguf_open(&m->gguf, path, err, err_len);
    if (rc) { free(m); return rc; }
    m->info.bos_id = m->info.eos_id = -1;
    m->info.file_type = -1;
    if (params->validate_only) { *out = m; return CB_OK; }

    cb_gguf_str an;
    rc = cb_gguf_get_str(&m->gguf, "general.architecture", &an, err, err_len);
    if (rc == CB_ERR_NOT_FOUND) { set_err(err, err_len, "missing metadata key 'general.architecture'"); rc = CB_ERR_FORMAT; }
    if (rc) goto fail;
    const cb_arch *arch = arch_find(an.ptr, an.len);
    if (!arch) {
        set_err(err, err_len, "unsupported architecture '%.*s' (supported: " ARCH_NAMES ")", (int)(an.len > 64 ? 64 : an.len), an.ptr);
        rc = CB_ERR_UNSUPPORTED;
        goto fail;
    }
    snprintf(m->info.arch, sizeof m->info.arch, "%s", arch->name);
    if ((rc = build_llama(m, arch, arch->name, err, err_len))) goto fail;
    if ((rc = load_vocab(m, err, err_len))) goto fail;
    if ((rc = pack_weights(m, err, err_len))) goto fail;

    int64_t v;
    if (cb_gguf_get_int(&m->gguf, "tokenizer.ggml.bos_token_id", &v, NULL, 0) == CB_OK && v >= 0 && v < m->info.n_vocab) m->info.bos_id = (int)v;
    if (cb_gguf_get_int(&m->gguf, "tokenizer.ggml.eos_token_id", &v, NULL, 0) == CB_OK && v >= 0 && v < m->info.n_vocab) m->info.eos_id = (int)v;
    if (cb_gguf_get_int(&m->gguf, "tokenizer.ggml.add_bos_token", &v, NULL, 0) == CB_OK) m->info.add_bos = v != 0;
    if (cb_gguf_get_int(&m->gguf, "general.file_type", &v, NULL, 0) == CB_OK) m->info.file_type = (int)v;
    for (uint64_t i = 0; i < m->gguf.n_tensors; i++) {
        const cb_gguf_tensor *t = &m->gguf.tensors[i];
        m->info.n_params += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
        m->info.weight_bytes += t->nbytes;
    }
    *out = m;
    return CB_OK;
fail:
    cb_model_free(m);
    return rc;
}

void cb_model_free(cb_model *m) {
    if (!m) return;
    if (m->layers) {
        for (int l = 0; l < m->info.n_layer; l++) {
            cb_layer *L = &m->layers[l];
            free(L->attn_norm); free(L->ffn_norm); free(L->bq); free(L->bk); free(L->bv);
            free(L->q_norm); free(L->k_norm); free(L->gate_inp_shexp);
            free(L->attn_post_norm); free(L->ffn_post_norm);
        }
        free(m->layers);
    }
    free(m->output_norm);
    free(m->tok_bytes);
    free(m->tok_off);
    free(m->tok_type);
    free(m->tok_eog);
    gvocab_free(m->gvocab);
    free(m->packed);
    cb_gguf_close(&m->gguf);
    free(m);
}

/* ------------------------------------------------------------- accessors */

void cb_model_get_info(const cb_model *m, cb_model_info *info) { *info = m->info; }

void cb_model_moe_info(const cb_model *m, int *n_expert, int *n_expert_used, int *n_ff_exp) {
    if (n_expert) *n_expert = m->n_expert;
    if (n_expert_used) *n_expert_used = m->n_expert_used;
    if (n_ff_exp) *n_ff_exp = m->n_ff_exp;
}

int cb_model_meta_count(const cb_model *m) { return (int)m->gguf.n_kv; }

static const cb_gguf_kv *meta_at(const cb_model *m, int i) {
    return (i >= 0 && (uint64_t)i < m->gguf.n_kv) ? &m->gguf.kv[i] : NULL;
}

const char *cb_model_meta_key(const cb_model *m, int i, size_t *len) {
    const cb_gguf_kv *kv = meta_at(m, i);
    if (!kv) return NULL;
    *len = (size_t)kv->key.len;
    return kv->key.ptr;
}

int cb_model_meta_type(const cb_model *m, int i) {
    const cb_gguf_kv *kv = meta_at(m, i);
    return kv ? (int)kv->type : -1;
}

int cb_model_meta_arr_type(const cb_model *m, int i) {
    const cb_gguf_kv *kv = meta_at(m, i);
    return kv && kv->type == GGUF_T_ARR ? (int)kv->arr_type : -1;
}

uint64_t cb_model_meta_arr_len(const cb_model *m, int i) {
    const cb_gguf_kv *kv = meta_at(m, i);
    return kv && kv->type == GGUF_T_ARR ? kv->arr_len : 0;
}

static int is_int_type(uint32_t t) {
    return t == GGUF_T_U8 || t == GGUF_T_I8 || t == GGUF_T_U16 || t == GGUF_T_I16 || t == GGUF_T_U32 ||
           t == GGUF_T_I32 || t == GGUF_T_BOOL || t == GGUF_T_U64 || t == GGUF_T_I64;
}

int cb_model_meta_int(const cb_model *m, int i, int64_t *out) {
    const cb_gguf_kv *kv = meta_at(m, i);
    if (!kv || !is_int_type(kv->type)) return CB_ERR_ARG;
    *out = kv->num.i;
    return CB_OK;
}

int cb_model_meta_float(const cb_model *m, int i, double *out) {
    const cb_gguf_kv *kv = meta_at(m, i);
    if (!kv || (kv->type != GGUF_T_F32 && kv->type != GGUF_T_F64)) return CB_ERR_ARG;
    *out = kv->num.f;
    return CB_OK;
}

const char *cb_model_meta_str(const cb_model *m, int i, size_t *len) {
    const cb_gguf_kv *kv = meta_at(m, i);
    if (!kv || kv->type != GGUF_T_STR) return NULL;
    *len = (size_t)kv->str.len;
    return kv->str.ptr;
}

const char *cb_model_meta_arr_str(const cb_model *m, int i, uint64_t j, size_t *len) {
    const cb_gguf_kv *kv = meta_at(m, i);
    if (!kv || kv->type != GGUF_T_ARR || kv->arr_type != GGUF_T_STR || j >= kv->arr_len) return NULL;
    *len = (size_t)kv->arr_str[j].len;
    return kv->arr_str[j].ptr;
}

int cb_model_meta_arr_int(const cb_model *m, int i, uint64_t j, int64_t *out) {
    const cb_gguf_kv *kv = meta_at(m, i);
    if (!kv || kv->type != GGUF_T_ARR || j >= kv->arr_len) return CB_ERR_ARG;
    return cb_gguf_arr_int(kv, j, out);
}

int cb_model_meta_arr_float(const cb_model *m, int i, uint64_t j, double *out) {
    const cb_gguf_kv *kv = meta_at(m, i);
    if (!kv || kv->type != GGUF_T_ARR || j >= kv->arr_len) return CB_ERR_ARG;
    return cb_gguf_arr_float(kv, j, out);
}

int cb_model_meta_find(const cb_model *m, const char *key) {
    return (int)cb_gguf_find_key(&m->gguf, key);
}

int cb_model_tensor_count(const cb_model *m) { return (int)m->gguf.n_tensors; }

static const cb_gguf_tensor *tensor_at(const cb_model *m, int i) {
    return (i >= 0 && (uint64_t)i < m->gguf.n_tensors) ? &m->gguf.tensors[i] : NULL;
}

const char *cb_model_tensor_name(const cb_model *m, int i, size_t *len) {
    const cb_gguf_tensor *t = tensor_at(m, i);
    if (!t) return NULL;
    *len = (size_t)t->name.len;
    return t->name.ptr;
}

int cb_model_tensor_type(const cb_model *m, int i) {
    const cb_gguf_tensor *t = tensor_at(m, i);
    return t ? (int)t->type : -1;
}

int cb_model_tensor_dims(const cb_model *m, int i, int64_t ne[4]) {
    const cb_gguf_tensor *t = tensor_at(m, i);
    if (!t) return -1;
    for (int k = 0; k < 4; k++) ne[k] = t->ne[k];
    return (int)t->n_dims;
}

const uint8_t *cb_model_token_bytes(const cb_model *m, int token, size_t *len) {
    if (token < 0 || token >= m->info.n_vocab || !m->tok_off) return NULL;
    *len = m->tok_off[token + 1] - m->tok_off[token];
    return m->tok_bytes + m->tok_off[token];
}

int cb_model_token_type(const cb_model *m, int token) {
    if (token < 0 || token >= m->info.n_vocab || !m->tok_type) return -1;
    return m->tok_type[token];
}

int cb_model_token_is_eog(const cb_model *m, int token) {
    if (token < 0 || token >= m->info.n_vocab || !m->tok_eog) return 0;
    return m->tok_eog[token];
}
