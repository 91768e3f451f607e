/*
 * forward.c — the llama block, batched over rows:
 *
 *   x = embed(token)
 *   per layer:  h = rmsnorm(x) ; q,k,v = h Wq, h Wk, h Wv ; rope(q, k)
 *               store k, v at (slot, pos) ; a = attention(q, K[slot][0..pos], V..)
 *               x += a Wo
 *               h = rmsnorm(x) ; x += (silu(h Wg) * h Wu) Wd
 *   logits = rmsnorm(x) Wout    (only rows that asked for logits)
 *
 * Every per-row operation reads only its own row (and its own slot's KV), in
 * a fixed order, so a row's result does not depend on the batch around it.
 */
#include "forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static void *alloc64(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 64;
    if (posix_memalign(&p, 64, (bytes + 63) & ~(size_t)63)) return NULL;
    memset(p, 0, bytes);
    return p;
}

int cb_ctx_init(cb_ctx *c, const cb_model *m, const cb_kernels *k, cb_pool *pool,
                int n_slots, int n_ctx, int n_batch, int n_logits, char *err, size_t err_len) {
    memset(c, 0, sizeof *c);
    const cb_model_info *I = &m->info;
    c->model = m;
    c->k = k;
    c->pool = pool;
    c->n_slots = n_slots;
    c->n_ctx = n_ctx;
    c->n_batch = n_batch;
    c->n_logits = n_logits;
    c->kv_dim = I->n_head_kv * I->head_dim;
    size_t qdim = (size_t)I->n_head * I->head_dim;
    size_t wide = qdim > (size_t)I->n_embd ? qdim : (size_t)I->n_embd;
    size_t B = (size_t)n_batch;
    size_t kv = (size_t)I->n_layer * n_slots * n_ctx * c->kv_dim * sizeof(float);
    c->k_cache = alloc64(kv);
    c->v_cache = alloc64(kv);
    c->x = alloc64(B * I->n_embd * sizeof(float));
    c->xb = alloc64(B * wide * sizeof(float));
    c->q = alloc64(B * qdim * sizeof(float));
    c->kx = alloc64(B * c->kv_dim * sizeof(float));
    c->vx = alloc64(B * c->kv_dim * sizeof(float));
    c->hb = alloc64(B * I->n_ff * sizeof(float));
    c->hb2 = alloc64(B * I->n_ff * sizeof(float));
    c->tmp = alloc64(B * I->n_embd * sizeof(float));
    c->rope = alloc64(B * I->n_rot * sizeof(float));
    c->scores = alloc64((size_t)cb_pool_size(pool) * n_ctx * sizeof(float));
    c->xl = alloc64((size_t)n_logits * I->n_embd * sizeof(float));
    c->logits = alloc64((size_t)n_logits * I->n_vocab * sizeof(float));
    size_t s = cb_matmul_scratch(wide, n_batch);
    size_t s2 = cb_matmul_scratch(I->n_ff, n_batch);
    c->mm_scratch = alloc64(s > s2 ? s : s2);
    if (!c->k_cache || !c->v_cache || !c->x || !c->xb || !c->q || !c->kx || !c->vx || !c->hb ||
        !c->hb2 || !c->tmp || !c->rope || !c->scores || !c->xl || !c->logits || !c->mm_scratch) {
        snprintf(err, err_len, "out of memory allocating the KV cache (%.1f MiB) and buffers",
                 2.0 * kv / (1024.0 * 1024.0));
        cb_ctx_free(c);
        return CB_ERR_NOMEM;
    }
    return CB_OK;
}

void cb_ctx_free(cb_ctx *c) {
    free(c->k_cache); free(c->v_cache); free(c->x); free(c->xb); free(c->q); free(c->kx);
    free(c->vx); free(c->hb); free(c->hb2); free(c->tmp); free(c->rope); free(c->scores);
    free(c->xl); free(c->logits); free(c->mm_scratch);
    memset(c, 0, sizeof *c);
}

static inline float *kv_at(const cb_ctx *c, float *cache, int layer, int slot, int pos) {
    return cache + (((size_t)layer * c->n_slots + slot) * c->n_ctx + pos) * c->kv_dim;
}

void cb_kv_copy(cb_ctx *c, int dst, int src, int n) {
    if (dst == src || n <= 0) return;
    size_t bytes = (size_t)n * c->kv_dim * sizeof(float);
    for (int l = 0; l < c->model->info.n_layer; l++) {
        memcpy(kv_at(c, c->k_cache, l, dst, 0), kv_at(c, c->k_cache, l, src, 0), bytes);
        memcpy(kv_at(c, c->v_cache, l, dst, 0), kv_at(c, c->v_cache, l, src, 0), bytes);
    }
}

/* ------------------------------------------------------------ row tasks */

/* Elementwise work split by rows across the pool (rows are independent). */
typedef struct {
    cb_ctx        *c;
    const cb_batch *b;
    int            layer;
    const float   *norm_w;   /* rmsnorm weight */
    const float   *in;       /* rmsnorm input rows  */
    float         *out;      /* rmsnorm output rows */
    int            n;        /* rows */
    int            dim;      /* row length */
} row_task;

static void rows_range(int n, int ith, int nth, int *r0, int *r1) {
    int per = (n + nth - 1) / nth;
    *r0 = ith * per;
    *r1 = *r0 + per < n ? *r0 + per : n;
}

static void rmsnorm_row(const float *x, const float *w, float *o, int n, float eps) {
    /* sum of squares in double, fixed order: deterministic and accurate */
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) o[i] = x[i] * scale * w[i];
}

static void task_rmsnorm(void *arg, int ith, int nth) {
    row_task *t = arg;
    int r0, r1;
    rows_range(t->n, ith, nth, &r0, &r1);
    float eps = t->c->model->info.norm_eps;
    for (int r = r0; r < r1; r++)
        rmsnorm_row(t->in + (size_t)r * t->dim, t->norm_w, t->out + (size_t)r * t->dim, t->dim, eps);
}

/* Run a row task on the pool when there is enough work, else inline. */
static void run_rows(cb_ctx *c, cb_pool_fn fn, row_task *t) {
    if (t->n >= 4 && cb_pool_size(c->pool) > 1) cb_pool_run(c->pool, fn, t);
    else fn(t, 0, 1);
}

static void rope_apply(float *v, const float *cs, int n_heads, int head_dim, int n_rot, int neox) {
    int half = n_rot / 2;
    for (int h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            float x0 = x[a], x1 = x[b];
            x[a] = x0 * c - x1 * s;
            x[b] = x0 * s + x1 * c;
        }
    }
}

/* RoPE on q and k, then store k, v into the slot's cache. */
static void task_rope_store(void *arg, int ith, int nth) {
    row_task *t = arg;
    cb_ctx *c = t->c;
    const cb_model_info *I = &c->model->info;
    int r0, r1;
    rows_range(t->n, ith, nth, &r0, &r1);
    size_t qdim = (size_t)I->n_head * I->head_dim;
    for (int r = r0; r < r1; r++) {
        const float *cs = c->rope + (size_t)r * I->n_rot;
        rope_apply(c->q + r * qdim, cs, I->n_head, I->head_dim, I->n_rot, I->rope_neox);
        rope_apply(c->kx + (size_t)r * c->kv_dim, cs, I->n_head_kv, I->head_dim, I->n_rot, I->rope_neox);
        int slot = t->b->slot[r], pos = t->b->pos[r];
        memcpy(kv_at(c, c->k_cache, t->layer, slot, pos), c->kx + (size_t)r * c->kv_dim, c->kv_dim * sizeof(float));
        memcpy(kv_at(c, c->v_cache, t->layer, slot, pos), c->vx + (size_t)r * c->kv_dim, c->kv_dim * sizeof(float));
    }
}

/* Causal attention: work items are (row, head) pairs split across threads. */
static void task_attention(void *arg, int ith, int nth) {
    row_task *t = arg;
    cb_ctx *c = t->c;
    const cb_model_info *I = &c->model->info;
    const cb_kernels *k = c->k;
    int hd = I->head_dim, group = I->n_head / I->n_head_kv;
    int n_items = t->n * I->n_head;
    int i0, i1;
    rows_range(n_items, ith, nth, &i0, &i1);
    float *scores = c->scores + (size_t)ith * c->n_ctx;
    float scale = 1.0f / sqrtf((float)hd);
    size_t qdim = (size_t)I->n_head * hd;
    for (int it = i0; it < i1; it++) {
        int r = it / I->n_head, h = it % I->n_head, kh = h / group;
        int slot = t->b->slot[r], n_pos = t->b->pos[r] + 1;
        const float *q = c->q + r * qdim + (size_t)h * hd;
        float *out = c->xb + r * qdim + (size_t)h * hd;
        const float *K = kv_at(c, c->k_cache, t->layer, slot, 0) + (size_t)kh * hd;
        const float *V = kv_at(c, c->v_cache, t->layer, slot, 0) + (size_t)kh * hd;
        float mx = -INFINITY;
        for (int p = 0; p < n_pos; p++) {
            float s = k->dot_f32(q, K + (size_t)p * c->kv_dim, hd) * scale;
            scores[p] = s;
            if (s > mx) mx = s;
        }
        float sum = 0;
        for (int p = 0; p < n_pos; p++) { scores[p] = expf(scores[p] - mx); sum += scores[p]; }
        float inv = 1.0f / sum;
        memset(out, 0, (size_t)hd * sizeof(float));
        for (int p = 0; p < n_pos; p++) k->axpy_f32(out, scores[p] * inv, V + (size_t)p * c->kv_dim, hd);
    }
}

static void task_swiglu(void *arg, int ith, int nth) {
    row_task *t = arg;
    cb_ctx *c = t->c;
    int n_ff = c->model->info.n_ff;
    int r0, r1;
    rows_range(t->n, ith, nth, &r0, &r1);
    for (int r = r0; r < r1; r++) {
        float *g = c->hb + (size_t)r * n_ff, *u = c->hb2 + (size_t)r * n_ff;
        for (int i = 0; i < n_ff; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* ---------------------------------------------------------------- forward */

static void matmul(cb_ctx *c, const cb_weight *w, const float *x, int n, float *y) {
    double t0 = now_ms();
    cb_matmul(c->pool, c->k, w, x, n, y, c->mm_scratch);
    c->t_matmul += now_ms() - t0;
}

void cb_forward(cb_ctx *c, const cb_batch *b) {
    const cb_model *m = c->model;
    const cb_model_info *I = &m->info;
    const int n = b->n, D = I->n_embd;
    double t0 = now_ms(), tm0 = c->t_matmul, ta0 = c->t_attention, th0 = c->t_lm_head;

    /* embeddings and RoPE angles (shared by all layers) */
    for (int r = 0; r < n; r++) {
        cb_weight_row_f32(&m->tok_embd, b->tokens[r], c->x + (size_t)r * D);
        float *cs = c->rope + (size_t)r * I->n_rot;
        for (int i = 0; i < I->n_rot / 2; i++) {
            double theta = (double)b->pos[r] * I->rope_freq_scale *
                           pow((double)I->rope_freq_base, -2.0 * i / I->n_rot);
            cs[2 * i] = (float)cos(theta);
            cs[2 * i + 1] = (float)sin(theta);
        }
    }

    row_task t = { .c = c, .b = b, .n = n, .dim = D };
    for (int l = 0; l < I->n_layer; l++) {
        const cb_layer *L = &m->layers[l];
        if (c->skip_layer && c->skip_layer[l]) continue;  /* residual passes through unchanged */
        t.layer = l;
        /* attention */
        t.norm_w = L->attn_norm; t.in = c->x; t.out = c->xb;
        run_rows(c, task_rmsnorm, &t);
        matmul(c, &L->wq, c->xb, n, c->q);
        matmul(c, &L->wk, c->xb, n, c->kx);
        matmul(c, &L->wv, c->xb, n, c->vx);
        double ta = now_ms();
        run_rows(c, task_rope_store, &t);
        if (cb_pool_size(c->pool) > 1 && n * I->n_head >= 2) cb_pool_run(c->pool, task_attention, &t);
        else task_attention(&t, 0, 1);
        c->t_attention += now_ms() - ta;
        matmul(c, &L->wo, c->xb, n, c->tmp);
        for (size_t i = 0; i < (size_t)n * D; i++) c->x[i] += c->tmp[i];
        /* feed-forward */
        t.norm_w = L->ffn_norm; t.in = c->x; t.out = c->xb;
        run_rows(c, task_rmsnorm, &t);
        matmul(c, &L->w_gate, c->xb, n, c->hb);
        matmul(c, &L->w_up, c->xb, n, c->hb2);
        run_rows(c, task_swiglu, &t);
        matmul(c, &L->w_down, c->hb, n, c->tmp);
        for (size_t i = 0; i < (size_t)n * D; i++) c->x[i] += c->tmp[i];
    }

    /* LM head over the rows that want logits, gathered in logit_row order */
    int n_out = 0;
    for (int r = 0; r < n; r++) {
        int lr = b->logit_row[r];
        if (lr < 0) continue;
        rmsnorm_row(c->x + (size_t)r * D, m->output_norm, c->xl + (size_t)lr * D, D, I->norm_eps);
        if (lr + 1 > n_out) n_out = lr + 1;
    }
    if (n_out > 0) {
        double th = now_ms();
        cb_matmul(c->pool, c->k, &m->output, c->xl, n_out, c->logits, c->mm_scratch);
        c->t_lm_head += now_ms() - th;
    }
    c->t_other += (now_ms() - t0) - (c->t_matmul - tm0) - (c->t_attention - ta0) - (c->t_lm_head - th0);
}
