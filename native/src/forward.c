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
 * Architecture switches (model.h cb_arch_cfg): q/k/v biases added after the
 * projections (qwen2); RMSNorm of q and k per head or over the whole
 * projection before RoPE (qwen3, olmoe); and a mixture-of-experts FFN:
 *
 *   p = softmax(Wr h) ; E = top-k(p) ; w_e = p_e (/ sum_E p if renormalised)
 *   x += sum_{e in E, rank order} w_e * Wd_e (silu(Wg_e h) * Wu_e h)
 *        (+ sigmoid(g . h) * shared expert(h), qwen2moe)
 *
 * Experts are computed batch-union: every expert routed by any row of the
 * forward runs once, over exactly the rows routed to it (gathered), so its
 * weights are read once per layer per forward.  A row's result is still
 * independent of the batch: the matmul kernels are row-independent, and a
 * row sums its own experts' outputs in its own rank order.
 *
 * Every per-row operation reads only its own row (and its own slot's KV), in
 * a fixed order, so a row's result does not depend on the batch around it.
 */
#include "forward.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int cb_ctx_init(cb_ctx *c, const cb_model *m, const cb_kernels *k, cb_pool *pool,
                int n_slots, int n_ctx, int n_batch, int n_logits, int kv_f16, char *err, size_t err_len) {
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
    c->kv_f16 = kv_f16 != 0;
    c->kv_elt = c->kv_f16 ? sizeof(uint16_t) : sizeof(float);
    size_t qdim = (size_t)I->n_head * I->head_dim;
    size_t wide = qdim > (size_t)I->n_embd ? qdim : (size_t)I->n_embd;
    size_t B = (size_t)n_batch;
    /* KV layout (forward.h): rings for the local layers when they are
     * smaller than the context. */
    int any_swa = 0;
    for (int l = 0; l < I->n_layer; l++) any_swa |= m->layers[l].swa;
    const int64_t W = m->n_swa, ring = W + n_batch - 1;
    c->kv_ring = any_swa && ring + W - 1 < n_ctx ? (int)ring : 0;
    c->kv_off = malloc((size_t)I->n_layer * sizeof(size_t));
    c->kv_rows = malloc((size_t)I->n_layer * sizeof(int));
    c->kv_hi = malloc((size_t)n_slots * sizeof(int));
    size_t rows = 0;
    if (c->kv_off && c->kv_rows && c->kv_hi) {
        for (int l = 0; l < I->n_layer; l++) {
            c->kv_rows[l] = m->layers[l].swa && c->kv_ring ? c->kv_ring + (int)W - 1 : n_ctx;
            c->kv_off[l] = rows;
            rows += (size_t)n_slots * I->n_head_kv * c->kv_rows[l];
        }
        for (int s = 0; s < n_slots; s++) c->kv_hi[s] = -1;
    }
    size_t kv = rows * I->head_dim * c->kv_elt;
    c->kv_bytes = 2 * kv;
    c->k_cache = kv ? cb_big_alloc(kv) : NULL;
    c->v_cache = kv ? cb_big_alloc(kv) : NULL;
    c->x = cb_big_alloc(B * I->n_embd * sizeof(float));
    c->xb = cb_big_alloc(B * wide * sizeof(float));
    c->q = cb_big_alloc(B * qdim * sizeof(float));
    c->kx = cb_big_alloc(B * c->kv_dim * sizeof(float));
    c->vx = cb_big_alloc(B * c->kv_dim * sizeof(float));
    const size_t ffw = (size_t)m->n_ff_max;
    c->hb = cb_big_alloc(B * ffw * sizeof(float));
    c->hb2 = cb_big_alloc(B * ffw * sizeof(float));
    c->tmp = cb_big_alloc(B * I->n_embd * sizeof(float));
    c->rope = cb_big_alloc(B * I->n_rot * sizeof(float));
    c->rope_freq = cb_big_alloc((size_t)(I->n_rot / 2 + 1) * sizeof(double));
    if (c->rope_freq)
        for (int i = 0; i < I->n_rot / 2; i++) c->rope_freq[i] = pow((double)I->rope_freq_base, -2.0 * i / I->n_rot);
    if (any_swa) {  /* the local layers' own RoPE base */
        c->rope_swa = cb_big_alloc(B * I->n_rot * sizeof(float));
        c->rope_freq_swa = cb_big_alloc((size_t)(I->n_rot / 2 + 1) * sizeof(double));
        if (c->rope_freq_swa)
            for (int i = 0; i < I->n_rot / 2; i++)
                c->rope_freq_swa[i] = pow((double)m->rope_freq_base_swa, -2.0 * i / I->n_rot);
    }
    c->scores = cb_big_alloc((size_t)cb_pool_size(pool) * (size_t)(I->n_head / I->n_head_kv) * n_ctx * sizeof(float));
    c->xl = cb_big_alloc((size_t)n_logits * I->n_embd * sizeof(float));
    c->logits = cb_big_alloc((size_t)n_logits * I->n_vocab * sizeof(float));
    c->head_idx = cb_big_alloc((size_t)n_logits * sizeof(int64_t));
    c->head_max = cb_big_alloc((size_t)n_logits * sizeof(float));
    c->head_pidx = cb_big_alloc((size_t)cb_pool_size(pool) * n_logits * sizeof(int64_t));
    c->head_pmax = cb_big_alloc((size_t)cb_pool_size(pool) * n_logits * sizeof(float));
    size_t s = cb_matmul_scratch(wide, n_batch);
    size_t s2 = cb_matmul_scratch(m->n_ff_max, n_batch);
    c->mm_scratch = cb_big_alloc(s > s2 ? s : s2);
    c->act_q = cb_big_alloc(s > s2 ? s : s2);
    c->trace_step = -1;
    int moe_ok = 1;
    if (m->cfg.moe) {
        const size_t K = (size_t)m->n_expert_used, E = (size_t)m->n_expert, NL = (size_t)I->n_layer;
        c->n_expert = m->n_expert;
        c->n_used = m->n_expert_used;
        c->router = cb_big_alloc(B * E * sizeof(float));
        c->sel = cb_big_alloc(NL * B * K * sizeof(int32_t));
        c->sel_w = cb_big_alloc(NL * B * K * sizeof(float));
        c->e_off = cb_big_alloc((E + 1) * sizeof(int32_t));
        c->e_items = cb_big_alloc(B * K * sizeof(int32_t));
        c->xg = cb_big_alloc(B * I->n_embd * sizeof(float));
        c->og = cb_big_alloc(B * I->n_embd * sizeof(float));
        c->eo = cb_big_alloc(B * K * I->n_embd * sizeof(float));
        c->sh = m->cfg.shared_expert ? cb_big_alloc(B * I->n_embd * sizeof(float)) : NULL;
        c->expert_counts = cb_big_alloc(NL * E * sizeof(int64_t));
        moe_ok = c->router && c->sel && c->sel_w && c->e_off && c->e_items && c->xg && c->og && c->eo &&
                 (c->sh || !m->cfg.shared_expert) && c->expert_counts;
        if (moe_ok) for (size_t i = 0; i < NL * B * K; i++) c->sel[i] = -1;
    }
    if (!c->k_cache || !c->v_cache || !c->x || !c->xb || !c->q || !c->kx || !c->vx || !c->hb ||
        !c->hb2 || !c->tmp || !c->rope || !c->rope_freq || !c->scores || !c->xl || !c->logits || !c->head_idx || !c->head_max || !c->head_pidx || !c->head_pmax ||
        !c->mm_scratch || !c->act_q || !moe_ok || !c->kv_off || !c->kv_rows || !c->kv_hi ||
        (any_swa && (!c->rope_swa || !c->rope_freq_swa))) {
        snprintf(err, err_len, "out of memory allocating the KV cache (%.1f MiB) and buffers",
                 2.0 * kv / (1024.0 * 1024.0));
        cb_ctx_free(c);
        return CB_ERR_NOMEM;
    }
    return CB_OK;
}

void cb_ctx_free(cb_ctx *c) {
    free(c->k_cache); free(c->v_cache); free(c->kv_off); free(c->kv_rows); free(c->kv_hi);
    free(c->rope_swa); free(c->rope_freq_swa); free(c->x); free(c->xb); free(c->q); free(c->kx);
    free(c->vx); free(c->hb); free(c->hb2); free(c->tmp); free(c->rope); free(c->rope_freq); free(c->scores);
    free(c->xl); free(c->logits); free(c->head_idx); free(c->head_max); free(c->head_pidx); free(c->head_pmax);
    free(c->mm_scratch); free(c->act_q);
    free(c->router); free(c->sel); free(c->sel_w); free(c->e_off); free(c->e_items);
    free(c->xg); free(c->og); free(c->eo); free(c->sh); free(c->expert_counts);
    if (c->trace) fclose(c->trace);
    memset(c, 0, sizeof *c);
}

/* Address of row `row` of (layer, slot, KV head) in a KV cache, laid out
 * per layer [slot][kv head][row][head_dim] (elements of c->kv_elt bytes;
 * forward.h says which row holds which position): the rows one attention
 * call reads (one KV head of one slot) are one contiguous run, which the
 * hardware prefetcher streams. */
static inline void *kv_at(const cb_ctx *c, void *cache, int layer, int slot, int kh, int row) {
    const cb_model_info *I = &c->model->info;
    return (uint8_t *)cache +
           (c->kv_off[layer] + ((size_t)slot * I->n_head_kv + kh) * c->kv_rows[layer] + row) * I->head_dim * c->kv_elt;
}

/* Ring length of layer l (0: row = position). */
static inline int kv_ring_of(const cb_ctx *c, int layer) {
    return c->model->layers[layer].swa ? c->kv_ring : 0;
}

/* The positions a row at `pos` attends to in `layer` (all before it, or the
 * last n_swa on a local layer): returns their count and sets *row0 to the
 * cache row of the first; they are rows [*row0, *row0 + count). */
static inline int kv_window(const cb_ctx *c, int layer, int pos, int *row0) {
    const int W = c->model->n_swa, ring = kv_ring_of(c, layer);
    const int start = c->model->layers[layer].swa && pos >= W ? pos - W + 1 : 0;
    *row0 = ring ? start % ring : start;
    return pos - start + 1;
}

void cb_kv_copy(cb_ctx *c, int dst, int src, int n) {
    if (dst == src || n <= 0) return;
    const cb_model_info *I = &c->model->info;
    const size_t row_bytes = (size_t)I->head_dim * c->kv_elt;
    for (int l = 0; l < I->n_layer; l++) {
        const int ring = kv_ring_of(c, l), W = c->model->n_swa;
        /* [r0, r1) and the mirror [m0, m1): positions [0, n) while the ring
         * has not wrapped, else the whole ring (then every row may hold a
         * position the source still needs) */
        int r0 = 0, r1 = n, m0 = 0, m1 = 0;
        if (ring && c->kv_hi[src] < ring) {
            r1 = n < ring ? n : ring;
            m0 = ring;
            m1 = ring + (n < W - 1 ? n : W - 1);
        } else if (ring) {
            r1 = c->kv_rows[l];
        }
        for (int kh = 0; kh < I->n_head_kv; kh++)
            for (int part = 0; part < 2; part++) {
                const int a = part ? m0 : r0, b = part ? m1 : r1;
                if (b <= a) continue;
                memcpy(kv_at(c, c->k_cache, l, dst, kh, a), kv_at(c, c->k_cache, l, src, kh, a), (size_t)(b - a) * row_bytes);
                memcpy(kv_at(c, c->v_cache, l, dst, kh, a), kv_at(c, c->v_cache, l, src, kh, a), (size_t)(b - a) * row_bytes);
            }
    }
    c->kv_hi[dst] = c->kv_hi[src];
}

int cb_kv_usable(const cb_ctx *c, int slot, int n) {
    if (n <= 0) return 0;
    if (!c->kv_ring) return n;
    /* continuing at n reads positions [n - W + 1, n); the lowest must not
     * have been overwritten by a later position in the same ring row */
    const int W = c->model->n_swa, lo = n > W - 1 ? n - W + 1 : 0;
    return lo > c->kv_hi[slot] - c->kv_ring ? n : 0;
}

void cb_kv_keep(cb_ctx *c, int slot, int n) {
    if (n <= 0) c->kv_hi[slot] = -1;
}

/* ------------------------------------------------------------ row tasks */

/* Elementwise work split by rows across the pool (rows are independent). */
typedef struct {
    cb_ctx        *c;
    const cb_batch *b;
    int            layer;
    const float   *norm_w;   /* rmsnorm weight */
    float         *in;       /* rmsnorm input rows (the residual stream) */
    float         *add;      /* rmsnorm: rows added into `in` first (a pending residual), or NULL */
    const float   *add_norm_w; /* gemma: the pending rows are RMSNormed with this weight (in
                                  place) before they are added; NULL: added as they are */
    float         *out;      /* rmsnorm output rows */
    int            n;        /* rows */
    int            dim;      /* row length */
    int            rope_in_attn; /* 1: task_attention runs RoPE and the KV store of its rows first */
    void          *q_out;    /* rmsnorm / attention / swiglu: their output rows quantized here for
                                the next matmul (each thread its own rows, once), or NULL */
    int            q_fmt;    /* ... in the formats that matmul's weights read (cb_act_formats) */
} row_task;

static void rows_range(int n, int ith, int nth, int *r0, int *r1) {
    int per = (n + nth - 1) / nth;
    *r0 = ith * per;
    *r1 = *r0 + per < n ? *r0 + per : n;
}

static void add_rows(float *x, const float *d, size_t n);

static void task_rmsnorm(void *arg, int ith, int nth) {
    row_task *t = arg;
    int r0, r1;
    rows_range(t->n, ith, nth, &r0, &r1);
    float eps = t->c->model->info.norm_eps;
    for (int r = r0; r < r1; r++) {
        float *in = t->in + (size_t)r * t->dim;
        if (t->add) {
            float *a = t->add + (size_t)r * t->dim;
            if (t->add_norm_w) t->c->k->rmsnorm(a, t->add_norm_w, a, t->dim, eps);
            add_rows(in, a, (size_t)t->dim);
        }
        t->c->k->rmsnorm(in, t->norm_w, t->out + (size_t)r * t->dim, t->dim, eps);
    }
    if (t->q_out) cb_quantize_rows(t->c->k, t->out, t->q_out, t->dim, t->n, r0, r1, t->q_fmt);
}

/* Run a row task on the pool when there is enough work, else inline. */
static void run_rows(cb_ctx *c, cb_pool_fn fn, row_task *t) {
    if (t->n >= 4 && cb_pool_size(c->pool) > 1) cb_pool_run(c->pool, fn, t);
    else fn(t, 0, 1);
}

/* One KV head's key and value rows into cache row `row`. */
static void store_kv(cb_ctx *c, int layer, int slot, int kh, int row, const float *kr, const float *vr) {
    const int hd = c->model->info.head_dim;
    if (c->kv_f16) {
        c->k->to_f16(kr, kv_at(c, c->k_cache, layer, slot, kh, row), hd);
        c->k->to_f16(vr, kv_at(c, c->v_cache, layer, slot, kh, row), hd);
    } else {
        memcpy(kv_at(c, c->k_cache, layer, slot, kh, row), kr, (size_t)hd * sizeof(float));
        memcpy(kv_at(c, c->v_cache, layer, slot, kh, row), vr, (size_t)hd * sizeof(float));
    }
}

/* RoPE on q and k of rows [r0, r1), then store k, v into their slots' cache. */
static void rope_store_rows(row_task *t, int r0, int r1) {
    cb_ctx *c = t->c;
    const cb_model_info *I = &c->model->info;
    const cb_layer *L = &c->model->layers[t->layer];
    const int qk_norm = c->model->cfg.qk_norm, hd = I->head_dim;
    size_t qdim = (size_t)I->n_head * I->head_dim;
    for (int r = r0; r < r1; r++) {
        float *q = c->q + r * qdim, *k = c->kx + (size_t)r * c->kv_dim, *v = c->vx + (size_t)r * c->kv_dim;
        if (L->bq) {  /* qwen2: projection biases */
            for (size_t i = 0; i < qdim; i++) q[i] += L->bq[i];
            for (int i = 0; i < c->kv_dim; i++) { k[i] += L->bk[i]; v[i] += L->bv[i]; }
        }
        if (qk_norm == 1) {  /* qwen3: RMSNorm of each head, in place */
            for (int h = 0; h < I->n_head; h++) c->k->rmsnorm(q + (size_t)h * hd, L->q_norm, q + (size_t)h * hd, hd, I->norm_eps);
            for (int h = 0; h < I->n_head_kv; h++) c->k->rmsnorm(k + (size_t)h * hd, L->k_norm, k + (size_t)h * hd, hd, I->norm_eps);
        } else if (qk_norm == 2) {  /* olmoe: RMSNorm of the whole projection */
            c->k->rmsnorm(q, L->q_norm, q, (int)qdim, I->norm_eps);
            c->k->rmsnorm(k, L->k_norm, k, c->kv_dim, I->norm_eps);
        }
        const float *cs = (L->swa ? c->rope_swa : c->rope) + (size_t)r * I->n_rot;
        c->k->rope(c->q + r * qdim, cs, I->n_head, I->head_dim, I->n_rot, I->rope_neox);
        c->k->rope(c->kx + (size_t)r * c->kv_dim, cs, I->n_head_kv, I->head_dim, I->n_rot, I->rope_neox);
        /* the position's cache row, and its mirror after a local layer's ring */
        const int slot = t->b->slot[r], pos = t->b->pos[r], ring = kv_ring_of(c, t->layer);
        const int row = ring ? pos % ring : pos;
        const int mirror = ring && row < c->model->n_swa - 1 ? row + ring : -1;
        for (int kh = 0; kh < I->n_head_kv; kh++) {
            const float *kr = c->kx + (size_t)r * c->kv_dim + (size_t)kh * hd;
            const float *vr = c->vx + (size_t)r * c->kv_dim + (size_t)kh * hd;
            store_kv(c, t->layer, slot, kh, row, kr, vr);
            if (mirror >= 0) store_kv(c, t->layer, slot, kh, mirror, kr, vr);
        }
    }
}

static void task_rope_store(void *arg, int ith, int nth) {
    int r0, r1;
    rows_range(((row_task *)arg)->n, ith, nth, &r0, &r1);
    rope_store_rows(arg, r0, r1);
}

/* Prefetch (into L2) the first 16 K rows of attention item `it`: the kernel
 * prefetches each next block itself, so only a call's first block would
 * start cold (measured at 8 streams: attention 0.48-0.54 -> 0.44-0.47 ms per
 * step; the whole K and V of the next item instead: no gain). */
static void prefetch_item_k(const row_task *t, int it, int parts) {
    const cb_ctx *c = t->c;
    const cb_model_info *I = &c->model->info;
    const int r = it / (I->n_head_kv * parts), kh = it / parts % I->n_head_kv;
    int row0;
    const int n_pos = kv_window(c, t->layer, t->b->pos[r], &row0);
    const char *K = kv_at(c, c->k_cache, t->layer, t->b->slot[r], kh, row0);
    const int np = n_pos < 16 ? n_pos : 16;
    for (size_t o = 0; o < (size_t)np * I->head_dim * c->kv_elt; o += 64) __builtin_prefetch(K + o, 0, 2);
}

/* Whole rows [r0, r1) of thread ith for attention: contiguous ranges of
 * about equal work (the positions each row attends to, plus a fixed cost
 * per row), not of equal row counts: in a causal prefill the last rows
 * attend to the most positions (512 rows split in halves gave the second
 * thread 3/4 of the work).  Every thread computes the same split. */
static void attn_rows_range(const row_task *t, int ith, int nth, int *r0, int *r1) {
    const cb_ctx *c = t->c;
    int64_t total = 0;
    for (int r = 0; r < t->n; r++) {
        int row0;
        total += kv_window(c, t->layer, t->b->pos[r], &row0) + 32;
    }
    const int64_t lo = total * ith / nth, hi = total * (ith + 1) / nth;
    int64_t acc = 0;
    *r0 = *r1 = t->n;
    for (int r = 0, found = 0; r < t->n; r++) {
        if (!found && acc >= lo) { *r0 = r; found = 1; }
        if (acc >= hi) { *r1 = r; break; }
        int row0;
        acc += kv_window(c, t->layer, t->b->pos[r], &row0) + 32;
    }
    if (ith == nth - 1) *r1 = t->n;
    if (*r1 < *r0) *r1 = *r0;
}

/* Causal attention: one kernel call per (row, KV head) runs the query heads
 * that share that KV head (GQA), so K and V rows are read once per group.
 * Work items are whole rows (ranges of equal work, attn_rows_range) when
 * there are at least 2 per thread (a row's KV heads share cache lines: one
 * thread reads them once), else (row, KV
 * head) pairs, and with fewer of those than 2 per thread (a decode step of
 * one or two rows) single query heads, so every thread has work.  Heads are
 * independent, so the split never changes a result. */
static void task_attention(void *arg, int ith, int nth) {
    row_task *t = arg;
    cb_ctx *c = t->c;
    const cb_model_info *I = &c->model->info;
    const int hd = I->head_dim, group = I->n_head / I->n_head_kv;
    const int parts = t->n * I->n_head_kv >= 2 * nth ? 1 : group, per = group / parts;
    const int n_items = t->n * I->n_head_kv * parts;
    int i0, i1, q_rows[2] = { 0, 0 };  /* rows this thread owns whole: quantized for the next matmul */
    if (t->n >= 2 * nth) {  /* whole rows: items of one row are consecutive */
        int r0, r1;
        attn_rows_range(t, ith, nth, &r0, &r1);
        i0 = r0 * I->n_head_kv;
        i1 = r1 * I->n_head_kv;
        if (i1 < i0) i1 = i0;
        if (i0 < i1) prefetch_item_k(t, i0, parts);  /* while RoPE runs */
        if (t->rope_in_attn) rope_store_rows(t, r0, r1);
        q_rows[0] = r0; q_rows[1] = r1;
    } else {
        rows_range(n_items, ith, nth, &i0, &i1);
    }
    float *scores = c->scores + (size_t)ith * group * c->n_ctx;
    const float scale = c->model->attn_scale;
    const size_t qdim = (size_t)I->n_head * hd;
    for (int it = i0; it < i1; it++) {
        const int r = it / (I->n_head_kv * parts), kh = it / parts % I->n_head_kv;
        const int h = kh * group + it % parts * per;  /* first query head of the item */
        const int slot = t->b->slot[r];
        int row0;
        const int n_pos = kv_window(c, t->layer, t->b->pos[r], &row0);
        const void *K = kv_at(c, c->k_cache, t->layer, slot, kh, row0);
        const void *V = kv_at(c, c->v_cache, t->layer, slot, kh, row0);
        if (it + 1 < i1) prefetch_item_k(t, it + 1, parts);
        c->k->attn(c->q + r * qdim + (size_t)h * hd, per, hd, K, V, (size_t)hd, c->kv_f16, n_pos, scale,
                   scores, c->xb + r * qdim + (size_t)h * hd);
    }
    if (t->q_out) cb_quantize_rows(c->k, c->xb, t->q_out, (int64_t)qdim, t->n, q_rows[0], q_rows[1], t->q_fmt);
}

/* hb = act(hb) * hb2 over rows of width t->dim (packed): SiLU (SwiGLU), or
 * GELU-tanh for the gemma block (GEGLU). */
static void task_swiglu(void *arg, int ith, int nth) {
    row_task *t = arg;
    cb_ctx *c = t->c;
    int n_ff = t->dim;
    int r0, r1;
    rows_range(t->n, ith, nth, &r0, &r1);
    const int gelu = c->model->cfg.gemma;
    for (int r = r0; r < r1; r++) {
        float *g = c->hb + (size_t)r * n_ff, *u = c->hb2 + (size_t)r * n_ff;
        if (gelu) c->k->geglu(g, u, n_ff);
        else c->k->swiglu(g, u, n_ff);
    }
    if (t->q_out) cb_quantize_rows(c->k, c->hb, t->q_out, n_ff, t->n, r0, r1, t->q_fmt);
}

/* ---------------------------------------------------------------- forward */

/* x += d over n floats (the residual stream, on the calling thread while the
 * pool waits: 4 at a time, which -O2 does not do by itself). */
static void add_rows(float *x, const float *d, size_t n) {
    size_t i = 0;
#if defined(__GNUC__) || defined(__clang__)
    typedef float v4 __attribute__((vector_size(16), aligned(4), may_alias));
    for (; i + 4 <= n; i += 4) *(v4 *)(x + i) += *(const v4 *)(d + i);
#endif
    for (; i < n; i++) x[i] += d[i];
}

/* Several matmuls over the same input rows as one pool run sharing one
 * activation quantization (bit-identical to separate matmul() calls); xq:
 * the rows already quantized by the task that made them, or NULL. */
static void matmul_q(cb_ctx *c, const cb_weight *const *w, int n_w, const float *x, const void *xq,
                     int n, float *const *y) {
    double t0 = now_ms();
    cb_matmul_multi(c->pool, c->k, w, n_w, x, xq, n, y, c->mm_scratch);
    double dt = now_ms() - t0;
    c->t_matmul += dt;
    if (w[0]->type >= 0 && w[0]->type < CB_N_TYPES) c->t_matmul_type[w[0]->type] += dt;  /* fused weights share a type */
}

static void matmul_n(cb_ctx *c, const cb_weight *const *w, int n_w, const float *x, int n, float *const *y) {
    matmul_q(c, w, n_w, x, NULL, n, y);
}

static void matmul(cb_ctx *c, const cb_weight *w, const float *x, int n, float *y) {
    matmul_q(c, &w, 1, x, NULL, n, &y);
}

/* ------------------------------------------------------ mixture of experts */

/* Softmax over the router logits, then top-k: k passes each taking the
 * highest remaining probability (lowest expert id on ties).  Per row, in a
 * fixed order, so routing never depends on the batch. */
static void route_row(const cb_model *m, const float *logits, float *prob, int32_t *sel, float *w) {
    const int E = m->n_expert, K = m->n_expert_used;
    float mx = logits[0];
    for (int e = 1; e < E; e++) if (logits[e] > mx) mx = logits[e];
    double sum = 0;
    for (int e = 0; e < E; e++) { prob[e] = expf(logits[e] - mx); sum += prob[e]; }
    const float inv = (float)(1.0 / sum);
    for (int e = 0; e < E; e++) prob[e] *= inv;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= sel[j] == e;
            if (!taken && (best < 0 || prob[e] > prob[best])) best = e;
        }
        sel[k] = best;
        w[k] = prob[best];
    }
    if (m->cfg.moe_norm_topk) {
        double s = 0;
        for (int k = 0; k < K; k++) s += w[k];
        for (int k = 0; k < K; k++) w[k] = (float)(w[k] / s);
    }
    if (m->expert_weights_scale != 1.0f)
        for (int k = 0; k < K; k++) w[k] *= m->expert_weights_scale;
}

/* The MoE FFN of layer l over c->xb (normed rows); result in c->tmp. */
static void moe_ffn(cb_ctx *c, int l, const cb_batch *b, row_task *t) {
    const cb_model *m = c->model;
    const cb_layer *L = &m->layers[l];
    const int n = b->n, D = m->info.n_embd, E = m->n_expert, K = m->n_expert_used, F = m->n_ff_exp;
    int32_t *sel = c->sel + (size_t)l * c->n_batch * K;
    float *sw = c->sel_w + (size_t)l * c->n_batch * K;

    /* 1. route every row */
    matmul(c, &L->gate_inp, c->xb, n, c->router);
    for (int r = 0; r < n; r++)
        route_row(m, c->router + (size_t)r * E, c->router + (size_t)r * E, sel + (size_t)r * K, sw + (size_t)r * K);

    /* 2. group (row, rank) items by expert: counting sort, rows ascending */
    int32_t *off = c->e_off;
    memset(off, 0, (size_t)(E + 1) * sizeof(int32_t));
    for (int i = 0; i < n * K; i++) off[sel[i] + 1]++;
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
    for (int i = 0; i < n * K; i++) c->e_items[off[sel[i]]++] = i;   /* off[e] now = end of e */
    for (int e = E; e > 0; e--) off[e] = off[e - 1];
    off[0] = 0;

    /* 3. each routed expert once, over its gathered rows */
    for (int e = 0; e < E; e++) {
        const int m_rows = off[e + 1] - off[e];
        if (m_rows == 0) continue;
        const int32_t *items = c->e_items + off[e];
        for (int j = 0; j < m_rows; j++)
            memcpy(c->xg + (size_t)j * D, c->xb + (size_t)(items[j] / K) * D, (size_t)D * sizeof(float));
        cb_weight wg = cb_expert_view(&L->gate_exps, F, e);
        cb_weight wu = cb_expert_view(&L->up_exps, F, e);
        cb_weight wd = cb_expert_view(&L->down_exps, D, e);
        const cb_weight *wgu[2] = { &wg, &wu };
        float *const ygu[2] = { c->hb, c->hb2 };
        matmul_n(c, wgu, 2, c->xg, m_rows, ygu);
        row_task ts = *t;
        ts.n = m_rows;
        ts.dim = F;
        run_rows(c, task_swiglu, &ts);
        matmul(c, &wd, c->hb, m_rows, c->og);
        for (int j = 0; j < m_rows; j++)
            memcpy(c->eo + (size_t)items[j] * D, c->og + (size_t)j * D, (size_t)D * sizeof(float));
        c->expert_counts[(size_t)l * E + e] += m_rows;
        c->n_expert_runs++;
    }
    c->n_expert_routed += (int64_t)n * K;

    /* 4. per row: weighted sum of its experts in rank order */
    for (int r = 0; r < n; r++) {
        float *o = c->tmp + (size_t)r * D;
        memset(o, 0, (size_t)D * sizeof(float));
        for (int k = 0; k < K; k++) {
            const float w = sw[(size_t)r * K + k];
            const float *src = c->eo + ((size_t)r * K + k) * D;
            for (int i = 0; i < D; i++) o[i] += w * src[i];
        }
    }

    /* 5. shared expert (qwen2moe): o += sigmoid(g . h) * FFN_sh(h) */
    if (m->cfg.shared_expert) {
        const cb_weight *wgu[2] = { &L->gate_shexp, &L->up_shexp };
        float *const ygu[2] = { c->hb, c->hb2 };
        matmul_n(c, wgu, 2, c->xb, n, ygu);
        row_task ts = *t;
        ts.n = n;
        ts.dim = m->n_ff_shexp;
        run_rows(c, task_swiglu, &ts);
        matmul(c, &L->down_shexp, c->hb, n, c->sh);
        for (int r = 0; r < n; r++) {
            const float *h = c->xb + (size_t)r * D;
            double gd = 0;
            for (int i = 0; i < D; i++) gd += (double)L->gate_inp_shexp[i] * h[i];
            const float g = (float)(1.0 / (1.0 + exp(-gd)));
            float *o = c->tmp + (size_t)r * D;
            const float *src = c->sh + (size_t)r * D;
            for (int i = 0; i < D; i++) o[i] += g * src[i];
        }
    }

    /* 6. optional route trace (outside the arithmetic: never changes results) */
    if (c->trace) {
        for (int r = 0; r < n; r++)
            for (int k = 0; k < K; k++)
                fprintf(c->trace, "%lld,%lld,%d,%d,%d,%d,%d,%d,%.9g\n", (long long)c->trace_step,
                        (long long)c->n_forward, r, b->slot[r], b->pos[r], l, k,
                        sel[(size_t)r * K + k], (double)sw[(size_t)r * K + k]);
    }
}

int cb_ctx_expert_counts(const cb_ctx *c, int64_t *out, int64_t cap) {
    if (!c || cap < 0 || (cap > 0 && !out)) return CB_ERR_ARG;
    const int64_t total = (int64_t)c->model->info.n_layer * c->n_expert;
    if (c->n_expert == 0) return 0;
    memcpy(out, c->expert_counts, (size_t)(cap < total ? cap : total) * sizeof(int64_t));
    return (int)total;
}

int cb_ctx_route_trace(cb_ctx *c, const char *path, char *err, size_t err_len) {
    if (!c) return CB_ERR_ARG;
    if (c->trace) { fclose(c->trace); c->trace = NULL; }
    if (!path || !path[0]) return CB_OK;
    if (c->n_expert == 0) {
        if (err && err_len) snprintf(err, err_len, "the model has no experts to trace");
        return CB_ERR_UNSUPPORTED;
    }
    c->trace = fopen(path, "a");
    if (!c->trace) {
        if (err && err_len) snprintf(err, err_len, "cannot open route trace '%s' for appending", path);
        return CB_ERR_IO;
    }
    if (ftell(c->trace) == 0) fprintf(c->trace, "step,forward,row,slot,pos,layer,rank,expert,weight\n");
    return CB_OK;
}

int cb_ctx_row_experts(const cb_ctx *c, int row, int layer, int32_t *out) {
    if (!c || !out || c->n_expert == 0 || row < 0 || row >= c->n_batch || layer < 0 ||
        layer >= c->model->info.n_layer)
        return CB_ERR_ARG;
    memcpy(out, c->sel + ((size_t)layer * c->n_batch + row) * c->n_used, (size_t)c->n_used * sizeof(int32_t));
    return c->n_used;
}

/* cos, sin of pos * scale * freq[i] for the n_rot / 2 pairs. */
static void rope_angles(float *cs, int pos, float scale, const double *freq, int n_rot) {
    for (int i = 0; i < n_rot / 2; i++) {
        double theta = (double)pos * scale * freq[i];
        cs[2 * i] = (float)cos(theta);
        cs[2 * i + 1] = (float)sin(theta);
    }
}

/* logits = cap * tanh(logits / cap) over the head's rows (gemma's final
 * soft cap), then each row's argmax again (tanh may merge near maxima). */
static void softcap_logits(cb_ctx *c, int n_out, int64_t V) {
    const float cap = c->model->final_softcap, inv = 1.0f / cap;
    for (int r = 0; r < n_out; r++) {
        float *l = c->logits + (size_t)r * V;
        for (int64_t i = 0; i < V; i++) l[i] = cap * tanhf(l[i] * inv);
        c->head_max[r] = -INFINITY;
        c->head_idx[r] = -1;
        c->k->argmax(l, V, 0, &c->head_max[r], &c->head_idx[r]);
    }
}

void cb_forward(cb_ctx *c, const cb_batch *b) {
    const cb_model *m = c->model;
    const cb_model_info *I = &m->info;
    const int n = b->n, D = I->n_embd;

    /* embeddings and RoPE angles (shared by all layers of a kind) */
    for (int r = 0; r < n; r++) {
        float *x = c->x + (size_t)r * D;
        cb_weight_row_f32(&m->tok_embd, b->tokens[r], x);
        if (m->embd_scale != 1.0f)
            for (int i = 0; i < D; i++) x[i] *= m->embd_scale;
        rope_angles(c->rope + (size_t)r * I->n_rot, b->pos[r], I->rope_freq_scale, c->rope_freq, I->n_rot);
        if (c->rope_swa)
            rope_angles(c->rope_swa + (size_t)r * I->n_rot, b->pos[r], m->rope_freq_scale_swa, c->rope_freq_swa, I->n_rot);
        if (b->pos[r] > c->kv_hi[b->slot[r]]) c->kv_hi[b->slot[r]] = b->pos[r];
    }

    /* With whole rows per thread and every row on its own slot (a decode
     * step), a row's attention reads only the KV its own thread stores, so
     * RoPE and the store ride in the attention run: one pool run less per
     * layer, and q, k stay in the core that rotated them. */
    const int nth = cb_pool_size(c->pool);
    int own_slots = nth > 1 && n >= 2 * nth;
    for (int i = 0; i < n && own_slots; i++)
        for (int j = 0; j < i; j++)
            if (b->slot[j] == b->slot[i]) { own_slots = 0; break; }
    row_task t = { .c = c, .b = b, .n = n, .dim = D, .rope_in_attn = own_slots };
    /* Attention gives each thread whole rows when there are >= 2 per thread;
     * then it quantizes its rows for the output projection. */
    const int attn_nth = nth > 1 && n * I->n_head >= 2 ? nth : 1;
    const int attn_rows = n >= 2 * attn_nth;
    float *residual = NULL;        /* a projection output not yet added to x: the next norm adds it */
    const float *residual_norm = NULL; /* and the post-norm it takes first (gemma), or NULL */
    for (int l = 0; l < I->n_layer; l++) {
        const cb_layer *L = &m->layers[l];
        if (c->skip_layer && c->skip_layer[l]) {  /* residual passes through unchanged */
            if (c->sel) for (size_t i = 0; i < (size_t)c->n_batch * c->n_used; i++) c->sel[(size_t)l * c->n_batch * c->n_used + i] = -1;
            continue;
        }
        t.layer = l;
        /* attention */
        t.norm_w = L->attn_norm; t.in = c->x; t.add = residual; t.add_norm_w = residual_norm; t.out = c->xb;
        const cb_weight *wqkv[3] = { &L->wq, &L->wk, &L->wv };
        t.q_fmt = cb_act_formats(wqkv, 3);
        t.q_out = t.q_fmt ? c->act_q : NULL;
        { double tn = now_ms(); run_rows(c, task_rmsnorm, &t); c->t_norm += now_ms() - tn; }
        {
            float *const yqkv[3] = { c->q, c->kx, c->vx };
            matmul_q(c, wqkv, 3, c->xb, t.q_out, n, yqkv);
        }
        if (!t.rope_in_attn) { double tr = now_ms(); run_rows(c, task_rope_store, &t); c->t_rope += now_ms() - tr; }
        t.q_fmt = cb_type_act(L->wo.type);
        t.q_out = attn_rows && t.q_fmt ? c->act_q : NULL;
        double ta = now_ms();
        if (attn_nth > 1) cb_pool_run(c->pool, task_attention, &t);
        else task_attention(&t, 0, 1);
        c->t_attention += now_ms() - ta;
        {
            const cb_weight *wo = &L->wo;
            matmul_q(c, &wo, 1, c->xb, t.q_out, n, &c->tmp);
        }
        /* feed-forward */
        t.norm_w = L->ffn_norm; t.in = c->x; t.add = c->tmp; t.add_norm_w = L->attn_post_norm; t.out = c->xb;
        const cb_weight *wgu[2] = { &L->w_gate, &L->w_up }, *wd = &L->w_down;
        t.q_fmt = m->cfg.moe ? 0 : cb_act_formats(wgu, 2);
        t.q_out = t.q_fmt ? c->act_q : NULL;
        { double tn = now_ms(); run_rows(c, task_rmsnorm, &t); c->t_norm += now_ms() - tn; }
        if (m->cfg.moe) {
            moe_ffn(c, l, b, &t);
        } else {
            float *const ygu[2] = { c->hb, c->hb2 };
            matmul_q(c, wgu, 2, c->xb, t.q_out, n, ygu);
            t.dim = I->n_ff;
            t.q_fmt = cb_type_act(L->w_down.type);
            t.q_out = t.q_fmt ? c->act_q : NULL;
            run_rows(c, task_swiglu, &t);
            t.dim = D;
            matmul_q(c, &wd, 1, c->hb, t.q_out, n, &c->tmp);
        }
        residual = c->tmp;
        residual_norm = L->ffn_post_norm;
    }
    if (residual && residual_norm)
        for (int r = 0; r < n; r++) {
            float *a = residual + (size_t)r * D;
            c->k->rmsnorm(a, residual_norm, a, D, I->norm_eps);
        }
    if (residual) add_rows(c->x, residual, (size_t)n * D);

    /* LM head over the rows that want logits, gathered in logit_row order */
    int n_out = 0;
    for (int r = 0; r < n; r++) {
        int lr = b->logit_row[r];
        if (lr < 0) continue;
        c->k->rmsnorm(c->x + (size_t)r * D, m->output_norm, c->xl + (size_t)lr * D, D, I->norm_eps);
        if (lr + 1 > n_out) n_out = lr + 1;
    }
    if (n_out > 0) {
        double th = now_ms();
        /* a head over the first head_rows tokens is a prefix of the matrix in
         * both layouts (the panel layout stores panels of CB_PANEL rows in order) */
        cb_weight head = m->output;
        if (c->head_rows > 0 && c->head_rows < head.n_out && c->head_rows % CB_PANEL == 0) head.n_out = c->head_rows;
        cb_matmul_argmax(c->pool, c->k, &head, c->xl, n_out, c->logits, c->mm_scratch,
                         c->head_pmax, c->head_pidx, c->head_max, c->head_idx);
        if (m->final_softcap > 0) softcap_logits(c, n_out, head.n_out);
        c->t_lm_head += now_ms() - th;
    }
    c->n_forward++;
    if (c->trace) fflush(c->trace);  /* readable while the engine runs */
}
