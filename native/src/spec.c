/*
 * spec.c — draft sources (drafter models, prompt lookup) and the adaptive
 * policy: draft depth k maximises expected accepted tokens per unit of
 * measured step time, and a source whose best expected gain is below 1 is
 * paused, then probed again after a pause that doubles while it stays
 * unprofitable.
 */
#include "spec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- drafter */

int cb_drafter_init(cb_drafter *d, const cb_model *model, const cb_kernels *k, cb_pool *pool,
                    int n_slots, int n_ctx, int n_batch, int kv_f16, const int32_t *skip_layers, int n_skip,
                    int default_skip, char *err, size_t err_len) {
    memset(d, 0, sizeof *d);
    d->model = model;
    int n_layer = model->info.n_layer;
    if (skip_layers || default_skip) {
        d->skip = calloc((size_t)n_layer, 1);
        if (!d->skip) { snprintf(err, err_len, "out of memory"); return CB_ERR_NOMEM; }
        if (skip_layers) {
            for (int i = 0; i < n_skip; i++) {
                if (skip_layers[i] < 0 || skip_layers[i] >= n_layer) {
                    snprintf(err, err_len, "skip layer %d is out of range [0, %d)", skip_layers[i], n_layer);
                    cb_drafter_free(d);
                    return CB_ERR_ARG;
                }
                d->skip[skip_layers[i]] = 1;
            }
        } else {
            /* every fourth block of the middle half: the first and last
             * quarters matter most (measured on SmolLM2: skipping every other
             * block drafts garbage, ~2% acceptance; four middle blocks ~30%) */
            for (int l = n_layer / 4; l < 3 * n_layer / 4; l += 4) d->skip[l] = 1;
        }
        int kept = 0;
        for (int l = 0; l < n_layer; l++) kept += !d->skip[l];
        if (kept == 0) { snprintf(err, err_len, "layer skip would skip every layer"); cb_drafter_free(d); return CB_ERR_ARG; }
    }
    int n_logits = n_slots;
    int rc = cb_ctx_init(&d->ctx, model, k, pool, n_slots, n_ctx, n_batch, n_logits, kv_f16, err, err_len);
    if (rc) { cb_drafter_free(d); return rc; }
    d->ctx.skip_layer = d->skip;
    d->tokens = calloc((size_t)n_slots * n_ctx, sizeof(int32_t));
    d->n_past = calloc((size_t)n_slots, sizeof(int));
    d->b_tokens = calloc((size_t)n_batch, sizeof(int32_t));
    d->b_pos = calloc((size_t)n_batch, sizeof(int32_t));
    d->b_slot = calloc((size_t)n_batch, sizeof(int32_t));
    d->b_logit = calloc((size_t)n_batch, sizeof(int32_t));
    d->row_req = calloc((size_t)n_logits, sizeof(int));
    if (!d->tokens || !d->n_past || !d->b_tokens || !d->b_pos || !d->b_slot || !d->b_logit || !d->row_req) {
        snprintf(err, err_len, "out of memory");
        cb_drafter_free(d);
        return CB_ERR_NOMEM;
    }
    return CB_OK;
}

void cb_drafter_free(cb_drafter *d) {
    if (d->ctx.model) cb_ctx_free(&d->ctx);
    free(d->skip); free(d->tokens); free(d->n_past); free(d->b_tokens); free(d->b_pos);
    free(d->b_slot); free(d->b_logit); free(d->row_req);
    free(d->xseen); free(d->xtok); free(d->n_xtok); free(d->xrow);
    memset(d, 0, sizeof *d);
}

int cb_drafter_narrow_head(cb_drafter *d, int64_t rows) {
    if (!d || !d->model) return CB_ERR_ARG;
    const int64_t n_vocab = d->model->info.n_vocab;
    if (rows <= 0 || rows >= n_vocab || rows % CB_PANEL != 0) return CB_ERR_ARG;
    if (!d->xseen) {
        d->xseen = calloc((size_t)n_vocab, 1);
        d->xtok = calloc((size_t)d->ctx.n_slots * CB_DRAFT_XTOK, sizeof(int32_t));
        d->n_xtok = calloc((size_t)d->ctx.n_slots, sizeof(int));
        d->xrow = calloc((size_t)d->model->info.n_embd, sizeof(float));
        if (!d->xseen || !d->xtok || !d->n_xtok || !d->xrow) {
            free(d->xseen); free(d->xtok); free(d->n_xtok); free(d->xrow);
            d->xseen = NULL, d->xtok = NULL, d->n_xtok = NULL, d->xrow = NULL;
            return CB_ERR_NOMEM;
        }
    }
    d->ctx.head_rows = rows;
    return CB_OK;
}

/* Job j's history tokens the narrowed head does not score, each once (up to CB_DRAFT_XTOK). */
static void collect_xtok(cb_drafter *d, int j, const int32_t *hist, int n_hist) {
    const int64_t lim = d->ctx.head_rows, n_vocab = d->model->info.n_vocab;
    int32_t *x = d->xtok + (size_t)j * CB_DRAFT_XTOK;
    int n = 0;
    for (int i = 0; i < n_hist && n < CB_DRAFT_XTOK; i++) {
        int32_t t = hist[i];
        if (t < lim || t >= n_vocab || d->xseen[t]) continue;
        d->xseen[t] = 1;
        x[n++] = t;
    }
    for (int i = 0; i < n; i++) d->xseen[x[i]] = 0;
    d->n_xtok[j] = n;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

/* Run the batch built in d->b_* (n rows, n_logit logits rows) and record
 * the KV it wrote. */
static void drafter_forward(cb_drafter *d, int n) {
    cb_batch b = { n, d->b_tokens, d->b_pos, d->b_slot, d->b_logit };
    cb_forward(&d->ctx, &b);
    int n_ctx = d->ctx.n_ctx;
    for (int i = 0; i < n; i++) {
        int s = d->b_slot[i], p = d->b_pos[i];
        d->tokens[(size_t)s * n_ctx + p] = d->b_tokens[i];
        if (p + 1 > d->n_past[s]) d->n_past[s] = p + 1;
    }
}

/* The drafted token for job J from logits row x: the argmax, or while the
 * job's prefix is not yet spelled, the most likely token that spells the next bytes of it
 * with what is left of it (ordinary text tokens only).  -1: none agrees. */
static int pick(const cb_drafter *d, const cb_draft_job *J, int j, int *pfx_done, int row) {
    const int n_vocab = d->model->info.n_vocab;
    const int64_t hr = d->ctx.head_rows;
    const int n_head = hr > 0 && hr < n_vocab ? (int)hr : n_vocab;  /* logits per row */
    const float *x = d->ctx.logits + (size_t)row * n_head;
    if (!J->prefix || *pfx_done >= J->n_prefix) {
        /* the LM head found the row's first maximum as it wrote it */
        int64_t h = d->ctx.head_idx[row];
        int best = h >= 0 && h < n_head ? (int)h : argmax(x, n_head);
        if (n_head < n_vocab && d->n_xtok && j < d->ctx.n_slots) {
            /* the history's tokens past the narrowed head, scored one by one */
            const int D = d->model->info.n_embd;
            const float *xl = d->ctx.xl + (size_t)row * D;
            float best_l = x[best];
            const int32_t *xt = d->xtok + (size_t)j * CB_DRAFT_XTOK;
            for (int i = 0; i < d->n_xtok[j]; i++) {
                cb_weight_row_f32(&d->model->output, xt[i], d->xrow);
                float l = 0;
                for (int e = 0; e < D; e++) l += d->xrow[e] * xl[e];
                if (l > best_l) { best_l = l; best = xt[i]; }
            }
        }
        return best;
    }
    const uint8_t *rest = J->prefix + *pfx_done;
    const size_t n_rest = (size_t)(J->n_prefix - *pfx_done);
    int best = -1;
    size_t best_len = 0;
    for (int i = 0; i < n_head; i++) {
        if (best >= 0 && !(x[i] > x[best])) continue;
        size_t len = 0;
        const uint8_t *tb = cb_model_token_bytes(d->model, i, &len);
        if (!tb || len == 0) continue;
        int ty = cb_model_token_type(d->model, i);
        if (ty != 1 && ty != 6) continue;  /* normal and byte tokens spell text; control tokens do not */
        /* within the prefix: the target's last token ended where the prefix
         * does, and its tokens are canonical, so the word most likely ends
         * there too (a drafter token running past it, "La" -> "Ladies",
         * drafts a word the target did not start) */
        if (len > n_rest || memcmp(tb, rest, len) != 0) continue;
        best = i;
        best_len = len;
    }
    if (best >= 0) *pfx_done += (int)best_len;
    return best;
}

/* Common prefix of the slot's drafter KV and hist[0..lim), cut to what the
 * KV can still serve; the slot's record is trimmed to it. */
static int drafter_keep(cb_drafter *d, int slot, const int32_t *hist, int lim) {
    const int32_t *have = d->tokens + (size_t)slot * d->ctx.n_ctx;
    int lcp = 0;
    if (lim > d->n_past[slot]) lim = d->n_past[slot];
    while (lcp < lim && have[lcp] == hist[lcp]) lcp++;
    lcp = cb_kv_usable(&d->ctx, slot, lcp);  /* a sliding window's ring may have moved on */
    cb_kv_keep(&d->ctx, slot, lcp);
    d->n_past[slot] = lcp;
    return lcp;
}

int cb_drafter_sync(cb_drafter *d, int slot, const int32_t *hist, int n_hist) {
    if (!d || !d->model || !hist || slot < 0 || slot >= d->ctx.n_slots || n_hist < 1 || n_hist > d->ctx.n_ctx)
        return 0;
    int p = drafter_keep(d, slot, hist, n_hist), rows = 0;
    while (p < n_hist) {
        int n = 0;
        while (p < n_hist && n < d->ctx.n_batch) {
            d->b_tokens[n] = hist[p];
            d->b_pos[n] = p;
            d->b_slot[n] = slot;
            d->b_logit[n] = -1;  /* no logits: nothing is drafted from here */
            n++, p++;
        }
        drafter_forward(d, n);
        rows += n;
    }
    return rows;
}

/* Token t drafted for job J: append it, then offer the draft to J's
 * extension; a continuation ends the job.  Returns 0 when J drafts on. */
static int append_draft(cb_draft_job *J, int32_t t) {
    J->out[J->n_out++] = t;
    int total = J->k_total > J->k ? J->k_total : J->k;
    if (!J->extend || J->n_out >= total) return 0;
    int want = J->k > J->n_out ? J->k - J->n_out : 1;
    int got = J->extend(J->extend_ctx, J->extend_arg, J->out, J->n_out, J->out + J->n_out, want, total - J->n_out);
    if (got < want) return 0;
    if (got > total - J->n_out) got = total - J->n_out;
    J->n_model = J->n_out;
    J->n_out += got;
    J->k = J->n_out;  /* done: the step loop drafts only for jobs with n_out == step < k */
    return 1;
}

void cb_drafter_draft(cb_drafter *d, cb_draft_job *jobs, int n_jobs) {
    const int n_ctx = d->ctx.n_ctx, n_batch = d->ctx.n_batch;
    int next[256];   /* per job: next history index to feed (catch-up) */
    int pdone[256];  /* per job: prefix bytes spelled so far */
    if (n_jobs > 256) n_jobs = 256;
    for (int j = 0; j < n_jobs; j++) {
        cb_draft_job *J = &jobs[j];
        J->n_out = 0;
        J->n_model = -1;
        pdone[j] = 0;
        if (J->n_hist < 1 || J->n_hist > n_ctx) { J->k = 0; continue; }
        next[j] = drafter_keep(d, J->slot, J->hist, J->n_hist - 1);
        if (d->ctx.head_rows > 0 && d->xseen && j < d->ctx.n_slots) collect_xtok(d, j, J->hist, J->n_hist);
    }
    /* catch up: feed each job's history; the last history row gives the first draft */
    struct timespec ts0, ts1;
    clock_gettime(CLOCK_MONOTONIC, &ts0);
    int caught_up_rows = 0;
    for (;;) {
        int n = 0, n_logit = 0, any = 0;
        for (int j = 0; j < n_jobs && n < n_batch; j++) {
            cb_draft_job *J = &jobs[j];
            if (J->k <= 0) continue;
            while (next[j] < J->n_hist && n < n_batch && n_logit < d->ctx.n_logits) {
                int p = next[j]++;
                d->b_tokens[n] = J->hist[p];
                d->b_pos[n] = p;
                d->b_slot[n] = J->slot;
                d->b_logit[n] = -1;
                if (p == J->n_hist - 1) { d->row_req[n_logit] = j; d->b_logit[n] = n_logit++; }
                n++;
                any = 1;
            }
        }
        if (!any) break;
        caught_up_rows += n;
        drafter_forward(d, n);
        for (int r = 0; r < n_logit; r++) {
            int j = d->row_req[r];
            cb_draft_job *J = &jobs[j];
            int t = pick(d, J, j, &pdone[j], r);
            if (t < 0) { J->k = 0; continue; }
            append_draft(J, t);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &ts1);
    double t_catch = (ts1.tv_sec - ts0.tv_sec) * 1e3 + (ts1.tv_nsec - ts0.tv_nsec) * 1e-6;
    /* draft the rest one position at a time, all jobs in one forward */
    double t_steps = 0;
    int n_steps = 0;
    for (int step = 1;; step++) {
        int n = 0;
        for (int j = 0; j < n_jobs && n < d->ctx.n_logits && n < n_batch; j++) {
            cb_draft_job *J = &jobs[j];
            if (J->n_out != step || J->n_out >= J->k) continue;
            int pos = J->n_hist - 1 + step;
            if (pos >= n_ctx) continue;
            d->b_tokens[n] = J->out[step - 1];
            d->b_pos[n] = pos;
            d->b_slot[n] = J->slot;
            d->row_req[n] = j;
            d->b_logit[n] = n;
            n++;
        }
        if (n == 0) break;
        clock_gettime(CLOCK_MONOTONIC, &ts0);
        drafter_forward(d, n);
        clock_gettime(CLOCK_MONOTONIC, &ts1);
        t_steps += (ts1.tv_sec - ts0.tv_sec) * 1e3 + (ts1.tv_nsec - ts0.tv_nsec) * 1e-6;
        n_steps++;
        for (int r = 0; r < n; r++) {
            int j = d->row_req[r];
            cb_draft_job *J = &jobs[j];
            int t = pick(d, J, j, &pdone[j], r);
            if (t < 0) { J->k = J->n_out; continue; }
            append_draft(J, t);
        }
    }
    for (int j = 0; j < n_jobs; j++)
        if (jobs[j].n_model < 0) jobs[j].n_model = jobs[j].n_out;
    /* What of the catch-up was history rather than drafting: all but the
     * time of one drafting forward.  The catch-up forward also drafts the
     * first token, and a few extra rows (the tokens accepted since the last
     * draft) cost the memory-bound drafter next to nothing, so it is a
     * drafting forward at full price; only a long history (a new prompt) is
     * a one-off.  (Booking it by rows, 3 rows as 2/3 history, made the 0.5B
     * draft model's token look 35-50 % cheaper than it was: measured 10.4 vs
     * 15.7 ms a drafted token on translation, where it kept drafting at a loss.) */
    if (n_steps > 0) d->step_ms = d->step_ms > 0 ? 0.8 * d->step_ms + 0.2 * t_steps / n_steps : t_steps / n_steps;
    if (d->step_ms > 0) d->catchup_ms = t_catch > d->step_ms ? t_catch - d->step_ms : 0;
    else d->catchup_ms = caught_up_rows > n_jobs ? t_catch * (caught_up_rows - n_jobs) / caught_up_rows : 0;
}

double cb_drafter_last_catchup_ms(const cb_drafter *d) { return d->catchup_ms; }

/* ------------------------------------------------------ vocabulary check */

/* Token t of m as a short quoted, escaped string (or "no token"). */
static void describe_token(const cb_model *m, int t, char *out, size_t cap) {
    size_t len = 0;
    const uint8_t *b = t < m->info.n_vocab ? cb_model_token_bytes(m, t, &len) : NULL;
    if (!b) { snprintf(out, cap, "no token"); return; }
    size_t o = 0;
    out[o++] = '\'';
    for (size_t i = 0; i < len && o + 6 < cap; i++) {
        if (i == 24) { o += (size_t)snprintf(out + o, cap - o, "..."); break; }
        uint8_t c = b[i];
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') out[o++] = (char)c;
        else o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    if (o + 2 <= cap) out[o++] = '\'';
    out[o < cap ? o : cap - 1] = 0;
}

int cb_vocab_check(const cb_model *target, const cb_model *draft, char *err, size_t err_len) {
    const int nt = target->info.n_vocab, nd = draft->info.n_vocab;
    if (draft->info.n_layer == 0) { snprintf(err, err_len, "the draft model is validate-only"); return CB_ERR_ARG; }
    int n = nt < nd ? nt : nd, i = 0;
    for (; i < n; i++) {
        size_t la = 0, lb = 0;
        const uint8_t *a = cb_model_token_bytes(target, i, &la), *b = cb_model_token_bytes(draft, i, &lb);
        if (!a || !b || la != lb || memcmp(a, b, la) != 0) break;
        if (cb_model_token_type(target, i) != cb_model_token_type(draft, i)) break;
    }
    if (i == n && nt == nd) return CB_OK;
    char da[96], ta[96];
    describe_token(draft, i, da, sizeof da);
    describe_token(target, i, ta, sizeof ta);
    snprintf(err, err_len, "the draft model's vocabulary (%d tokens) differs from the target's (%d tokens): "
             "first difference at token %d, %s in the draft vs %s in the target; a draft model must share the "
             "target's vocabulary (a model with another tokenizer drafts as a cross-vocabulary draft)",
             nd, nt, i, da, ta);
    return CB_ERR_ARG;
}

/* ------------------------------------------- cross-vocabulary drafter */

static int is_special(const cb_model *m, int t) {
    int ty = cb_model_token_type(m, t);
    return ty == 3 || ty == 4;  /* control, user-defined: whole tokens, never spelled by BPE */
}

/* For every special token of `from`, the special token of `to` with the same
 * text (or -1). */
static void map_specials(const cb_model *from, const cb_model *to, int32_t *map) {
    int nf = from->info.n_vocab, nt = to->info.n_vocab;
    for (int i = 0; i < nf; i++) map[i] = -1;
    for (int i = 0; i < nf; i++) {
        if (!is_special(from, i)) continue;
        size_t la = 0;
        const uint8_t *a = cb_model_token_bytes(from, i, &la);
        for (int j = 0; a && j < nt; j++) {
            if (!is_special(to, j)) continue;
            size_t lb = 0;
            const uint8_t *b = cb_model_token_bytes(to, j, &lb);
            if (b && la == lb && memcmp(a, b, la) == 0) { map[i] = j; break; }
        }
    }
}

int cb_xdrafter_init(cb_xdrafter *x, const cb_model *target, const cb_model *draft, const cb_kernels *k,
                     cb_pool *pool, int n_slots, int n_ctx, int n_ctx_d, int n_batch, int kv_f16,
                     char *err, size_t err_len) {
    memset(x, 0, sizeof *x);
    x->target = target;
    x->n_slots = n_slots;
    x->n_ctx = n_ctx;
    char e2[160] = "";
    int rc = cb_bpe_build(draft, &x->bpe_d, e2, sizeof e2);
    if (rc) { snprintf(err, err_len, "the cross-vocabulary draft model's tokenizer: %s", e2); cb_xdrafter_free(x); return rc; }
    if ((rc = cb_bpe_build(target, &x->bpe_t, e2, sizeof e2))) {
        snprintf(err, err_len, "a cross-vocabulary draft needs the target's tokenizer in C: %s", e2);
        cb_xdrafter_free(x);
        return rc;
    }
    if ((rc = cb_drafter_init(&x->d, draft, k, pool, n_slots, n_ctx_d, n_batch, kv_f16, NULL, 0, 0, err, err_len))) {
        cb_xdrafter_free(x);
        return rc;
    }
    x->scratch_size = cb_bpe_scratch_size(CB_XTAIL + CB_XDRAFT_MAX * 64);
    x->scratch = malloc(x->scratch_size);
    x->t2d_special = malloc((size_t)target->info.n_vocab * sizeof(int32_t));
    x->d2t_special = malloc((size_t)draft->info.n_vocab * sizeof(int32_t));
    x->slots = calloc((size_t)n_slots, sizeof(cb_xslot));
    x->djobs = calloc((size_t)n_slots, sizeof(cb_draft_job));
    x->dout = calloc((size_t)n_slots * CB_XDRAFT_MAX, sizeof(int32_t));
    x->tail_ids = malloc((size_t)CB_XTAIL * sizeof(int32_t));
    if (!x->scratch || !x->t2d_special || !x->d2t_special || !x->slots || !x->djobs || !x->dout || !x->tail_ids) {
        snprintf(err, err_len, "out of memory");
        cb_xdrafter_free(x);
        return CB_ERR_NOMEM;
    }
    for (int s = 0; s < n_slots; s++) {
        x->slots[s].tgt = malloc((size_t)n_ctx * sizeof(int32_t));
        x->slots[s].dtok = malloc((size_t)n_ctx_d * sizeof(int32_t));
        if (!x->slots[s].tgt || !x->slots[s].dtok) { snprintf(err, err_len, "out of memory"); cb_xdrafter_free(x); return CB_ERR_NOMEM; }
    }
    map_specials(target, draft, x->t2d_special);
    map_specials(draft, target, x->d2t_special);
    return CB_OK;
}

void cb_xdrafter_free(cb_xdrafter *x) {
    if (x->d.model) cb_drafter_free(&x->d);
    cb_bpe_free(x->bpe_d);
    cb_bpe_free(x->bpe_t);
    if (x->slots)
        for (int s = 0; s < x->n_slots; s++) { free(x->slots[s].tgt); free(x->slots[s].dtok); }
    free(x->slots); free(x->scratch); free(x->t2d_special); free(x->d2t_special); free(x->djobs); free(x->dout);
    free(x->tail_ids);
    memset(x, 0, sizeof *x);
}

/* Tokenize the slot's tail in the drafter's vocabulary and commit its stable
 * ids (all of them with `all`: a special token follows, nothing can merge
 * across it). */
static void xslot_commit(cb_xdrafter *x, cb_xslot *S, int all) {
    if (S->broken || S->n_tail == 0) return;
    int32_t ids[CB_XTAIL];
    int stable = 0;
    int n = cb_bpe_tokenize_ex(x->bpe_d, S->tail, (size_t)S->n_tail, ids, CB_XTAIL, x->scratch, x->scratch_size,
                               &stable);
    if (n < 0 || n > CB_XTAIL) { S->broken = 1; return; }  /* a byte the drafter has no token for */
    int keep = all ? n : stable;
    if (S->n_dtok + keep > x->d.ctx.n_ctx) { S->broken = 1; return; }
    size_t used = 0;
    for (int i = 0; i < keep; i++) {
        size_t len = 0;
        cb_model_token_bytes(x->d.model, ids[i], &len);
        used += len;
        S->dtok[S->n_dtok++] = ids[i];
    }
    if (used > (size_t)S->n_tail) used = (size_t)S->n_tail;  /* cannot happen: the ids spell the tail */
    memmove(S->tail, S->tail + used, (size_t)S->n_tail - used);
    S->n_tail -= (int)used;
}

/* Bring slot s's text up to the target history hist[0..n). */
static void xslot_sync(cb_xdrafter *x, int s, const int32_t *hist, int n) {
    cb_xslot *S = &x->slots[s];
    if (n > x->n_ctx) n = x->n_ctx;
    if (S->n_tgt > n || memcmp(S->tgt, hist, (size_t)S->n_tgt * sizeof(int32_t)) != 0) {
        /* another history (a new request on the slot): start over; the
         * drafter's KV is still reused as far as its tokens agree */
        S->n_tgt = S->n_dtok = S->n_tail = S->broken = 0;
    }
    for (; S->n_tgt < n; S->n_tgt++) {
        int t = hist[S->n_tgt];
        S->tgt[S->n_tgt] = t;
        if (S->broken) continue;
        size_t len = 0;
        const uint8_t *b = cb_model_token_bytes(x->target, t, &len);
        if (!b) { S->broken = 1; continue; }
        if (is_special(x->target, t) && x->t2d_special[t] >= 0) {
            xslot_commit(x, S, 1);
            if (S->broken || S->n_tail > 0) { S->broken = 1; continue; }
            if (S->n_dtok + 1 > x->d.ctx.n_ctx) { S->broken = 1; continue; }
            S->dtok[S->n_dtok++] = x->t2d_special[t];
            continue;
        }
        if (S->n_tail + (int)len > CB_XTAIL) xslot_commit(x, S, 0);
        if (S->n_tail + (int)len > CB_XTAIL) xslot_commit(x, S, 1);  /* one pre-token longer than the tail */
        if (S->broken || S->n_tail + (int)len > CB_XTAIL) { S->broken = 1; continue; }
        memcpy(S->tail + S->n_tail, b, len);
        S->n_tail += (int)len;
    }
    xslot_commit(x, S, 0);
}

int cb_xdrafter_sync(cb_xdrafter *x, int slot, const int32_t *hist, int n_hist) {
    if (!x || !x->slots || !hist || slot < 0 || slot >= x->n_slots || n_hist < 1) return 0;
    xslot_sync(x, slot, hist, n_hist);
    cb_xslot *S = &x->slots[slot];
    if (S->broken || S->n_dtok < 1) return 0;
    return cb_drafter_sync(&x->d, slot, S->dtok, S->n_dtok);
}

void cb_xdrafter_draft(cb_xdrafter *x, cb_draft_job *jobs, int n_jobs) {
    if (n_jobs > x->n_slots) n_jobs = x->n_slots;
    for (int j = 0; j < n_jobs; j++) {
        cb_draft_job *J = &jobs[j], *D = &x->djobs[j];
        J->n_out = 0;
        memset(D, 0, sizeof *D);
        D->slot = J->slot;
        D->out = x->dout + (size_t)j * CB_XDRAFT_MAX;
        if (J->k <= 0 || J->slot < 0 || J->slot >= x->n_slots) continue;
        xslot_sync(x, J->slot, J->hist, J->n_hist);
        cb_xslot *S = &x->slots[J->slot];
        if (S->broken || S->n_dtok < 1) continue;
        D->hist = S->dtok;
        D->n_hist = S->n_dtok;
        D->prefix = NULL;
        D->n_prefix = 0;
        /* The tail (the text after the committed tokens, mostly one word) goes
         * into the catch-up batch as its canonical drafter tokens, held past
         * n_dtok and not committed: they ride in the one batched forward that
         * feeds the accepted tokens, where re-spelling the tail by constrained
         * picks took one sequential drafter forward per tail token (measured
         * on qwen2.5-coder-1.5b / smollm2, Zen 4: ~20 ms a cross-vocabulary
         * draft of ~1.2 target tokens against ~5 ms a smollm2 row).  The
         * drafted text then starts right after the tail.  Then k target
         * tokens (about one drafter token each in English; the last target
         * token is dropped as unstable, hence one more). */
        if (S->n_tail > 0) {
            int n = cb_bpe_tokenize_ex(x->bpe_d, S->tail, (size_t)S->n_tail, x->tail_ids, CB_XTAIL, x->scratch,
                                       x->scratch_size, NULL);
            if (n < 1 || n > CB_XTAIL || S->n_dtok + n + CB_XDRAFT_MAX > x->d.ctx.n_ctx) continue;
            memcpy(S->dtok + S->n_dtok, x->tail_ids, (size_t)n * sizeof(int32_t));
            D->n_hist += n;
        }
        int kd = J->k + 1;
        D->k = kd < CB_XDRAFT_MAX ? kd : CB_XDRAFT_MAX;
    }
    cb_drafter_draft(&x->d, x->djobs, n_jobs);
    uint8_t text[CB_XDRAFT_MAX * 64];
    int32_t ids[CB_XDRAFT_MAX * 64];
    for (int j = 0; j < n_jobs; j++) {
        cb_draft_job *J = &jobs[j], *D = &x->djobs[j];
        if (J->k <= 0 || D->n_out == 0) continue;
        /* the drafted text after the tail, up to a special token (which ends the text) */
        size_t nt = 0, skip = (size_t)D->n_prefix;
        int special = -1, ended = 0;
        for (int i = 0; i < D->n_out; i++) {
            int t = D->out[i];
            if (is_special(x->d.model, t)) { ended = 1; special = x->d2t_special[t]; break; }
            size_t len = 0;
            const uint8_t *b = cb_model_token_bytes(x->d.model, t, &len);
            if (!b) break;
            size_t cut = skip < len ? skip : len;  /* bytes of this token that re-spell the tail */
            skip -= cut;
            if (nt + len - cut > sizeof text) break;
            memcpy(text + nt, b + cut, len - cut);
            nt += len - cut;
        }
        if (skip > 0) continue;  /* the drafter never got past the tail */
        int stable = 0, n = 0;
        if (nt > 0) {
            n = cb_bpe_tokenize_ex(x->bpe_t, text, nt, ids, (int)(sizeof ids / sizeof ids[0]), x->scratch,
                                   x->scratch_size, &stable);
            if (n < 0 || n > (int)(sizeof ids / sizeof ids[0])) continue;
        }
        /* a special token closes the text: every id before it is final */
        int keep = ended ? n : stable;
        for (int i = 0; i < keep && J->n_out < J->k; i++) J->out[J->n_out++] = ids[i];
        if (special >= 0 && keep == n && J->n_out < J->k) J->out[J->n_out++] = special;
    }
}

/* ---------------------------------------------------------- prompt lookup */

int cb_lookup_class(int match_len) {
    return match_len <= 2 ? 0 : match_len == 3 ? 1 : match_len < 8 ? 2 : match_len < 16 ? 3 : 4;
}

int cb_lookup_draft_ex(const int32_t *hist, int n, int ngram_min, int ngram_max, int k, int32_t *out,
                       int *match_len) {
    if (match_len) *match_len = 0;
    if (!hist || !out || n < 2 || k < 1) return 0;
    if (ngram_min < 1) ngram_min = 1;
    if (ngram_max < ngram_min) ngram_max = ngram_min;
    const int cap = ngram_max > CB_LOOKUP_MATCH_CAP ? ngram_max : CB_LOOKUP_MATCH_CAP;
    const int32_t last = hist[n - 1];
    int best_j = -1, best_cmp = 0, best_len = 0;
    /* j: where an earlier occurrence ends (aligned with hist[n - 1]); newest first */
    for (int j = n - 2; j >= 0; j--) {
        if (hist[j] != last) continue;
        int len = 1;
        while (len < cap && j - len >= 0 && hist[j - len] == hist[n - 1 - len]) len++;
        if (len < ngram_min) continue;
        int cmp = len < ngram_max ? len : ngram_max;
        if (cmp > best_cmp) {  /* strictly longer: a tie keeps the more recent one */
            best_cmp = cmp;
            best_len = len;
            best_j = j;
            if (cmp == ngram_max) break;  /* nothing older can beat it */
        }
    }
    if (best_j < 0) return 0;
    if (match_len) *match_len = best_len;
    /* what followed the occurrence; past the end of the history it reads the
     * draft itself (idx - n < m), so a repeating span drafts its next period */
    const int s = best_j + 1;
    for (int m = 0; m < k; m++) {
        int idx = s + m;
        out[m] = idx < n ? hist[idx] : out[idx - n];
    }
    return k;
}

/* ----------------------------------------------------------------- policy */

#define CB_SPEC_WARMUP  4    /* verified drafts of a class before it may draft deeper than 2 */
#define CB_SPEC_ALPHA   0.25 /* weight of the newest verification in the acceptance estimate */
#define CB_SPEC_EXPLORE 8    /* every 8th decision of a class drafts one deeper than the best depth */
#define CB_SPEC_PROBE   16   /* every 16th skipped lookup draft of a class is verified at depth 1 */
#define CB_SPEC_PRIOR   0.5  /* acceptance at position 0 of a class nothing is known about */
/* A free source (lookup) whose accepted drafts saved less than this share of
 * the decode steps it was available for, over the last ~CB_SPEC_SAVE_WINDOW
 * of them, is paused whatever its drafts are priced at.  Why: its price is
 * the forward-and-sampling time of a verify row, which on a 1.5B model is
 * ~1% of a step, so a lookup draft with 18% acceptance prices at 1.17 per
 * offer; offers on open chat are rare, and what the drafts then buy
 * (measured: 1.7% of the steps on qwen2.5-coder-1.5b, Zen 5) is below what
 * step timing resolves (the step-time estimates move by several % with the
 * machine's load) while each verify adds a row every other stream of the
 * batch waits for.  Paused, a probe of depth 1 every CB_SPEC_PROBE offers
 * keeps the share measured, so copy-heavy text brings it back (there a
 * probe accepts ~0.9: 0.9 / 16 > 3%). */
#define CB_SPEC_MIN_SAVED   0.03
#define CB_SPEC_SAVE_WINDOW 128

int cb_spec_bit(int source) {
    for (int b = 0; b < CB_SPEC_N_SOURCES; b++) if (source == (1 << b)) return b;
    return -1;
}

void cb_spec_policy_init(cb_spec_policy *p) {
    memset(p, 0, sizeof *p);
    for (int b = 0; b < CB_SPEC_N_SOURCES; b++) {
        for (int i = 0; i < CB_SPEC_MAX_K; i++) p->st[b].accept_rate_pos[i] = CB_SPEC_PRIOR;
        for (int c = 0; c < CB_SPEC_N_CLASS; c++)
            for (int i = 0; i < CB_SPEC_MAX_K; i++) p->cls[b][c].rate[i] = CB_SPEC_PRIOR;
        p->pause_len[b] = 16;
    }
}

/* Step time is right-skewed (other work on the machine only ever adds), so
 * the first few samples of a size keep their minimum and later ones are
 * capped at twice the estimate before smoothing: one slow step cannot make a
 * verify size look too dear to be tried again. */
void cb_spec_policy_step(cb_spec_policy *p, int rows, double ms) {
    if (rows < 1 || !(ms > 0)) return;
    if (rows > CB_COST_BUCKETS) rows = CB_COST_BUCKETS;
    double *t = &p->step_ms[rows];
    int *n = &p->step_n[rows];
    if (*n == 0) *t = ms;
    else if (*n < 3) *t = ms < *t ? ms : *t;
    else *t = 0.9 * *t + 0.1 * (ms < 2 * *t ? ms : 2 * *t);
    if (*n < 1000000) (*n)++;
}

/* Step time for `rows` rows from the sizes measured at least min_n times
 * (rows itself excluded): interpolated between the nearest below and above,
 * above the largest extrapolated along the slope of the two largest below it
 * (with one point below: +3% a row, optimistic so that a larger size gets
 * tried and measured); 0 when nothing is known. */
static double step_time_near(const cb_spec_policy *p, int rows, int min_n) {
    int lo = rows - 1, hi = rows + 1;
    while (lo >= 1 && p->step_n[lo] < min_n) lo--;
    while (hi <= CB_COST_BUCKETS && p->step_n[hi] < min_n) hi++;
    if (lo >= 1 && hi <= CB_COST_BUCKETS)
        return p->step_ms[lo] + (p->step_ms[hi] - p->step_ms[lo]) * (rows - lo) / (hi - lo);
    if (lo >= 1) {
        int lo2 = lo - 1;
        while (lo2 >= 1 && p->step_n[lo2] < min_n) lo2--;
        double floor_slope = 0.03 * p->step_ms[lo] / lo;
        double slope = lo2 >= 1 ? (p->step_ms[lo] - p->step_ms[lo2]) / (lo - lo2) : floor_slope;
        if (slope < floor_slope) slope = floor_slope;
        return p->step_ms[lo] + slope * (rows - lo);
    }
    if (hi <= CB_COST_BUCKETS) return p->step_ms[hi] / (1.0 + 0.03 * (hi - rows));
    return 0;
}

#define CB_COST_TRUSTED 3  /* samples after which a size's own estimate stands alone */

/* Step time for `rows` rows.  A size measured fewer than CB_COST_TRUSTED
 * times gets the lower of its own estimate and what the well-measured sizes
 * around it suggest: one step slowed by other work on the machine must not
 * rule a verify size out, and trying it again measures it properly. */
static double step_time_raw(const cb_spec_policy *p, int rows) {
    if (rows < 1) rows = 1;
    if (rows > CB_COST_BUCKETS) rows = CB_COST_BUCKETS;
    if (p->step_n[rows] >= CB_COST_TRUSTED) return p->step_ms[rows];
    double guess = step_time_near(p, rows, CB_COST_TRUSTED);
    if (!(guess > 0)) guess = step_time_near(p, rows, 1);
    if (p->step_n[rows] > 0 && !(guess > 0 && guess < p->step_ms[rows])) return p->step_ms[rows];
    return guess;
}

/* Step times for base_rows + 0..k_max rows into t[0..k_max], each at most
 * the one before plus a one-row step (it could be split in two).  A step may
 * cost LESS than one with fewer rows, and that is kept: the matmul kernels
 * run a batch in row tiles of 8, 4, 2 and 1, each tile unpacking every
 * weight once, so 4 rows are one tile and 3 rows two (measured on
 * qwen2.5-coder-1.5b, AMD EPYC Zen 4, 2 threads: 3 rows 1.48x a 1-row step,
 * 4 rows 1.31x; 7 rows 2.45x, 8 rows 2.04x).  Lifting t to be monotone made
 * the cheap sizes look as dear as the size before them, so a verify of 3 or
 * 7 drafts was priced as one of 2 or 6. */
static void step_times(const cb_spec_policy *p, int base_rows, int k_max, double *t) {
    double one = step_time_raw(p, 1);
    t[0] = step_time_raw(p, base_rows);
    for (int k = 1; k <= k_max; k++) {
        double v = step_time_raw(p, base_rows + k);
        if (one > 0 && t[k - 1] > 0 && v > t[k - 1] + one) v = t[k - 1] + one;
        t[k] = v;
    }
}

int cb_spec_prompt_rows(const cb_spec_policy *p, int rows_decode, int max_rows, double slack) {
    if (!p || max_rows < 1 || !(slack >= 0) || rows_decode < 1 || rows_decode >= CB_COST_BUCKETS) return 0;
    if (p->step_n[rows_decode] == 0) return 0;
    int top = rows_decode + max_rows < CB_COST_BUCKETS ? max_rows : CB_COST_BUCKETS - rows_decode;
    int larger = 0;
    for (int r = rows_decode + 1; r <= CB_COST_BUCKETS && !larger; r++) larger = p->step_n[r] > 0;
    if (!larger) return 0;
    /* sizes not measured yet take what the measured ones around them
     * suggest (step_time_raw), so a count is tried, then known */
    double base = step_time_raw(p, rows_decode), limit = (1.0 + slack) * base;
    int fit = 0, cheapest = 0;
    double best = 0;
    for (int k = 1; k <= top; k++) {
        double t = step_time_raw(p, rows_decode + k);
        if (!(t > 0)) continue;
        if (t <= limit) fit = k;
        double per_row = (t - base) / k;
        if (cheapest == 0 || per_row < best) { cheapest = k; best = per_row; }
    }
    return fit > 0 ? fit : cheapest;
}

/* Acceptance estimates of a class by position: a position no verification
 * has reached yet takes the estimate of the one before it (a copy that held
 * so far is likely to hold on), position 0 the prior. */
static void class_rates(const cb_spec_class *c, int k_max, double *r) {
    for (int i = 0; i < k_max; i++)
        r[i] = c->tried[i] > 0 ? c->rate[i] : i == 0 ? CB_SPEC_PRIOR : r[i - 1];
}

/* The acceptance estimates of lookup class `cls` (by match length) of
 * source b.  A class not verified yet starts from the nearest shorter-match
 * class that has been, where that is above the prior: a longer match copies
 * at least as faithfully, so a code edit's first long matches draft as deep
 * as its short ones have earned instead of relearning from the prior. */
static void lookup_class_rates(const cb_spec_policy *p, int b, int cls, int k_max, double *r) {
    const cb_spec_class *c = &p->cls[b][cls];
    class_rates(c, k_max, r);
    if (c->tried[0] > 0) return;
    for (int s = cls - 1; s >= 0; s--) {
        const cb_spec_class *sh = &p->cls[b][s];
        if (sh->tried[0] == 0) continue;
        double rs[CB_SPEC_MAX_K];
        class_rates(sh, k_max, rs);
        for (int i = 0; i < k_max; i++) r[i] = rs[i] > r[i] ? rs[i] : r[i];
        return;
    }
}

#define CB_SPEC_REQ_PRIOR 4.0  /* the engine-wide estimate weighs as much as this many of a request's verifications */

/* Rates r[0..k_max) blended with request q's record of lookup class cls
 * (positions it has not reached keep the engine-wide rate). */
static void blend_req_class(const cb_spec_req *q, int cls, int k_max, double *r) {
    if (!q) return;
    for (int i = 0; i < k_max; i++)
        r[i] = (q->cls_accepted[cls][i] + CB_SPEC_REQ_PRIOR * r[i]) / (q->cls_tried[cls][i] + CB_SPEC_REQ_PRIOR);
}

/* Verified drafts behind a class's estimates (its own, or the class it starts from). */
static int64_t lookup_class_drafts(const cb_spec_policy *p, int b, int cls) {
    for (int s = cls; s >= 0; s--)
        if (p->cls[b][s].tried[0] > 0) return p->cls[b][s].drafts;
    return 0;
}

static int clamp_k(const cb_spec_params *sp);

int cb_spec_policy_k_ext(const cb_spec_policy *p, const cb_spec_req *q, int b, int cls, const cb_spec_params *sp,
                         int base_rows, int n_avail) {
    if (!p || b < 0 || b >= CB_SPEC_N_SOURCES || cls < 0 || cls >= CB_SPEC_N_CLASS || n_avail < 1) return 0;
    int k_max = clamp_k(sp);
    if (k_max > n_avail) k_max = n_avail;
    if (!sp->adaptive) return k_max;
    double r[CB_SPEC_MAX_K], t[CB_SPEC_MAX_K + 1];
    lookup_class_rates(p, b, cls, k_max, r);
    blend_req_class(q, cls, k_max, r);
    step_times(p, base_rows, k_max, t);
    double one = step_time_raw(p, 1);
    if (!(one > 0) || !(t[0] > 0)) return 0;  /* nothing measured yet: no extension */
    /* expected accepted tokens of the extension less its rows' extra verify
     * time, in decode steps (one step buys one token) */
    double best = 0, e = 0, prod = 1;
    int best_k = 0;
    for (int k = 1; k <= k_max; k++) {
        prod *= r[k - 1];
        e += prod;
        double net = e - (t[k] - t[0]) / one;
        if (net > best) { best = net; best_k = k; }
    }
    if (lookup_class_drafts(p, b, cls) < CB_SPEC_WARMUP && best_k > 2) best_k = 2;
    return best_k;
}

int cb_spec_policy_class_learning(const cb_spec_policy *p, int b, int cls) {
    if (b < 0 || b >= CB_SPEC_N_SOURCES || cls < 0 || cls >= CB_SPEC_N_CLASS) return 0;
    return lookup_class_drafts(p, b, cls) < CB_SPEC_WARMUP;
}

/* Depth 1..k_max maximising expected tokens per unit of step time relative to
 * a plain step, for acceptance rates r[0..k_max); *gain gets that ratio. */
static int depth_for_rates(const cb_spec_policy *p, int b, const double *r, int base_rows, int k_max,
                           double *gain) {
    double t[CB_SPEC_MAX_K + 1];
    if (k_max > CB_SPEC_MAX_K) k_max = CB_SPEC_MAX_K;
    step_times(p, base_rows, k_max, t);
    double best_gain = 0, e = 1, prod = 1;
    int best_k = 0;
    for (int k = 1; k <= k_max; k++) {
        prod *= r[k - 1];
        e += prod;  /* expected tokens from this step */
        double cost = (t[0] > 0 && t[k] > 0) ? t[k] / t[0] : 1.0 + 0.03 * k;
        if (t[0] > 0) cost += k * p->draft_ms_tok[b] / t[0];
        double g = e / cost;
        if (g > best_gain) { best_gain = g; best_k = k; }
    }
    *gain = best_gain;
    return best_k;
}

static int best_depth(const cb_spec_policy *p, int b, const cb_spec_class *c, int base_rows, int k_max,
                      double *gain) {
    double r[CB_SPEC_MAX_K];
    if (k_max > CB_SPEC_MAX_K) k_max = CB_SPEC_MAX_K;
    class_rates(c, k_max, r);
    return depth_for_rates(p, b, r, base_rows, k_max, gain);
}

static int clamp_k(const cb_spec_params *sp) {
    return sp->k_max < 1 ? 1 : sp->k_max > CB_SPEC_MAX_K ? CB_SPEC_MAX_K : sp->k_max;
}

int cb_spec_policy_k(cb_spec_policy *p, int b, const cb_spec_params *sp, int base_rows) {
    if (b < 0 || b >= CB_SPEC_N_SOURCES) return 0;
    cb_spec_stats *st = &p->st[b];
    int k_max = clamp_k(sp);
    if (!sp->adaptive) { st->k = k_max; st->paused = 0; return k_max; }
    if (st->paused) {
        if (--p->pause_left[b] > 0) return 0;
        /* probe: draft shallowly once so the acceptance estimate sees fresh
         * data; the next call decides again from it */
        st->paused = 0;
        st->k = k_max < 2 ? k_max : 2;
        return st->k;
    }
    cb_spec_class *c = &p->cls[b][0];
    double gain;
    int best_k = best_depth(p, b, c, base_rows, k_max, &gain);
    /* warm-up: until a source has a few verified drafts its acceptance is a
     * prior, so it must not buy deep drafts with it */
    if (c->drafts < CB_SPEC_WARMUP && best_k > 2) best_k = 2;
    st->expected_gain = gain;
    if (gain < 1.0) {
        st->paused = 1;
        st->k = 0;
        p->pause_left[b] = p->pause_len[b];
        if (p->pause_len[b] < 512) p->pause_len[b] *= 2;
        return 0;
    }
    p->pause_len[b] = 16;
    if (++c->decisions % CB_SPEC_EXPLORE == 0 && best_k < k_max) best_k++;
    st->k = best_k;
    return best_k;
}

/* Count one decision about a source; `paused` says the policy declines most
 * of what the source offers lately (a source whose drafts are found rarely,
 * like lookup on open chat, is judged by the offers it made). */
static void note_decision(cb_spec_stats *st, int drafted) {
    st->decisions++;
    st->declined += !drafted;
    st->decline_rate = (st->decisions == 1 ? 0.0 : 0.9 * st->decline_rate) + (st->decisions == 1 ? 1.0 : 0.1) * !drafted;
    st->paused = st->decline_rate > 0.5;
}

void cb_spec_req_init(cb_spec_req *q) {
    memset(q, 0, sizeof *q);
    for (int b = 0; b < CB_SPEC_N_SOURCES; b++) q->backoff[b] = 8;
}

int cb_spec_policy_plan(cb_spec_policy *p, cb_spec_req *q, int b, const cb_spec_params *sp, int base_rows,
                        int n_avail, double *gain) {
    *gain = 0;
    if (b < 0 || b >= CB_SPEC_N_SOURCES || n_avail < 1) return 0;
    cb_spec_stats *st = &p->st[b];
    int k_max = clamp_k(sp);
    if (k_max > n_avail) k_max = n_avail;
    if (!sp->adaptive) { st->k = k_max; st->paused = 0; *gain = 1; return k_max; }
    if (q->wait[b] > 0) {
        if (--q->wait[b] > 0) { note_decision(st, 0); return 0; }
        note_decision(st, 1);
        /* probe: a shallow draft refreshes the estimate, taken only if nothing pays more */
        *gain = 1.0 + 1e-9;
        return k_max < 2 ? k_max : 2;
    }
    cb_spec_class *c = &p->cls[b][0];
    double r[CB_SPEC_MAX_K];
    class_rates(c, k_max, r);
    for (int i = 0; i < k_max; i++)  /* positions this request has not reached keep the engine-wide rate */
        r[i] = (q->accepted[b][i] + CB_SPEC_REQ_PRIOR * r[i]) / (q->tried[b][i] + CB_SPEC_REQ_PRIOR);
    double g;
    int best_k = depth_for_rates(p, b, r, base_rows, k_max, &g);
    if (c->drafts < CB_SPEC_WARMUP && best_k > 2) best_k = 2;
    st->expected_gain = g;
    *gain = g;
    note_decision(st, g >= 1.0);
    if (g < 1.0) {
        st->k = 0;
        q->wait[b] = q->backoff[b];
        if (q->backoff[b] < 256) q->backoff[b] *= 2;
        return 0;
    }
    q->backoff[b] = 8;
    if (++c->decisions % CB_SPEC_EXPLORE == 0 && best_k < k_max) best_k++;
    st->k = best_k;
    return best_k;
}

void cb_spec_req_record_class(cb_spec_req *q, int cls, int n, int a) {
    if (!q || cls < 0 || cls >= CB_SPEC_N_CLASS) return;
    if (n > CB_SPEC_MAX_K) n = CB_SPEC_MAX_K;
    for (int i = 0; i < n && i <= a; i++) {
        q->cls_tried[cls][i]++;
        q->cls_accepted[cls][i] += i < a;
    }
}

void cb_spec_req_record(cb_spec_req *q, int b, int n, int a) {
    if (b < 0 || b >= CB_SPEC_N_SOURCES) return;
    if (n > CB_SPEC_MAX_K) n = CB_SPEC_MAX_K;
    for (int i = 0; i < n && i <= a; i++) {
        q->tried[b][i]++;
        q->accepted[b][i] += i < a;
    }
}

int cb_spec_policy_k_class(cb_spec_policy *p, int b, int cls, const cb_spec_params *sp, int base_rows,
                           int n_avail) {
    return cb_spec_policy_k_class_req(p, NULL, b, cls, sp, base_rows, n_avail);
}

void cb_spec_policy_consider(cb_spec_policy *p, int b) {
    if (!p || b < 0 || b >= CB_SPEC_N_SOURCES) return;
    const double keep = 1.0 - 1.0 / CB_SPEC_SAVE_WINDOW;
    p->save_steps[b] = keep * p->save_steps[b] + 1.0;
    p->save_tokens[b] *= keep;
    if (p->save_n[b] < INT64_MAX) p->save_n[b]++;
}

double cb_spec_policy_saved(const cb_spec_policy *p, int b) {
    if (!p || b < 0 || b >= CB_SPEC_N_SOURCES || p->save_n[b] < CB_SPEC_SAVE_WINDOW || !(p->save_steps[b] > 0))
        return -1;
    return p->save_tokens[b] / p->save_steps[b];
}

int cb_spec_policy_k_class_req(cb_spec_policy *p, const cb_spec_req *q, int b, int cls, const cb_spec_params *sp,
                               int base_rows, int n_avail) {
    if (b < 0 || b >= CB_SPEC_N_SOURCES || cls < 0 || cls >= CB_SPEC_N_CLASS || n_avail < 1) return 0;
    cb_spec_stats *st = &p->st[b];
    int k_max = clamp_k(sp);
    if (k_max > n_avail) k_max = n_avail;
    if (!sp->adaptive) { st->k = k_max; st->paused = 0; return k_max; }
    cb_spec_class *c = &p->cls[b][cls];
    double gain, r[CB_SPEC_MAX_K];
    lookup_class_rates(p, b, cls, k_max, r);
    blend_req_class(q, cls, k_max, r);
    int best_k = depth_for_rates(p, b, r, base_rows, k_max, &gain);
    if (lookup_class_drafts(p, b, cls) < CB_SPEC_WARMUP && best_k > 2) best_k = 2;
    c->decisions++;
    st->expected_gain = gain;
    double saved = cb_spec_policy_saved(p, b);
    if (gain < 1.0 || (saved >= 0 && saved < CB_SPEC_MIN_SAVED)) {
        /* not worth a verify row: skip, but verify one token now and then so
         * the estimate follows the content */
        best_k = ++c->skipped % CB_SPEC_PROBE == 0 ? 1 : 0;
    } else if (c->decisions % CB_SPEC_EXPLORE == 0 && best_k < k_max) {
        best_k++;  /* learn the acceptance one position deeper */
    }
    note_decision(st, best_k > 0);
    st->k = best_k;
    return best_k;
}

void cb_spec_policy_record_class(cb_spec_policy *p, int b, int cls, int n, int a) {
    if (b < 0 || b >= CB_SPEC_N_SOURCES || cls < 0 || cls >= CB_SPEC_N_CLASS || n < 1) return;
    cb_spec_stats *st = &p->st[b];
    cb_spec_class *c = &p->cls[b][cls];
    double r[CB_SPEC_MAX_K];
    if (n > CB_SPEC_MAX_K) n = CB_SPEC_MAX_K;
    if (a > n) a = n;
    lookup_class_rates(p, b, cls, n, r);  /* (the same as class_rates for a drafter's class 0) */
    st->drafts++;
    st->draft_tokens += n;
    st->accepted_tokens += a;
    if (a > 0) p->save_tokens[b] += a;
    c->drafts++;
    /* position i was tried only if every earlier draft was accepted, so the
     * rate at i is conditional on reaching it */
    for (int i = 0; i < n; i++) {
        if (i > a) break;
        int ok = i < a;
        st->tried_pos[i]++;
        st->accepted_pos[i] += ok;
        /* fast-moving: acceptance changes with the content (copying vs free text) */
        st->accept_rate_pos[i] = (1.0 - CB_SPEC_ALPHA) * st->accept_rate_pos[i] + CB_SPEC_ALPHA * ok;
        if (c->tried[i] == 0) c->rate[i] = r[i];  /* start from the carried-forward estimate */
        c->rate[i] = (1.0 - CB_SPEC_ALPHA) * c->rate[i] + CB_SPEC_ALPHA * ok;
        c->tried[i]++;
    }
}

void cb_spec_policy_record(cb_spec_policy *p, int b, int n, int a) {
    cb_spec_policy_record_class(p, b, 0, n, a);
}
