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
                    int n_slots, int n_ctx, int n_batch, const int32_t *skip_layers, int n_skip,
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
    int rc = cb_ctx_init(&d->ctx, model, k, pool, n_slots, n_ctx, n_batch, n_logits, err, err_len);
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
    memset(d, 0, sizeof *d);
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

void cb_drafter_draft(cb_drafter *d, cb_draft_job *jobs, int n_jobs) {
    const int n_ctx = d->ctx.n_ctx, n_batch = d->ctx.n_batch, n_vocab = d->model->info.n_vocab;
    int next[256];  /* per job: next history index to feed (catch-up) */
    if (n_jobs > 256) n_jobs = 256;
    for (int j = 0; j < n_jobs; j++) {
        cb_draft_job *J = &jobs[j];
        J->n_out = 0;
        const int32_t *have = d->tokens + (size_t)J->slot * n_ctx;
        int lcp = 0, lim = d->n_past[J->slot] < J->n_hist - 1 ? d->n_past[J->slot] : J->n_hist - 1;
        while (lcp < lim && have[lcp] == J->hist[lcp]) lcp++;
        d->n_past[J->slot] = lcp;
        next[j] = lcp;
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
            while (next[j] < J->n_hist && n < n_batch) {
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
            cb_draft_job *J = &jobs[d->row_req[r]];
            J->out[J->n_out++] = argmax(d->ctx.logits + (size_t)r * n_vocab, n_vocab);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &ts1);
    /* rows beyond one per job were history, not drafting */
    double t_catch = (ts1.tv_sec - ts0.tv_sec) * 1e3 + (ts1.tv_nsec - ts0.tv_nsec) * 1e-6;
    d->catchup_ms = caught_up_rows > n_jobs ? t_catch * (caught_up_rows - n_jobs) / caught_up_rows : 0;
    /* draft the rest one position at a time, all jobs in one forward */
    for (int step = 1; step < CB_SPEC_MAX_K; step++) {
        int n = 0;
        for (int j = 0; j < n_jobs; j++) {
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
        drafter_forward(d, n);
        for (int r = 0; r < n; r++) {
            cb_draft_job *J = &jobs[d->row_req[r]];
            J->out[J->n_out++] = argmax(d->ctx.logits + (size_t)r * n_vocab, n_vocab);
        }
    }
}

double cb_drafter_last_catchup_ms(const cb_drafter *d) { return d->catchup_ms; }

/* ---------------------------------------------------------- prompt lookup */

int cb_lookup_draft(const int32_t *hist, int n, int ngram_min, int ngram_max, int k, int32_t *out) {
    if (ngram_min < 1) ngram_min = 1;
    for (int ng = ngram_max; ng >= ngram_min; ng--) {
        if (ng >= n) continue;
        const int32_t *pat = hist + n - ng;
        /* most recent earlier occurrence: its continuation is the best guess */
        for (int i = n - ng - 1; i >= 0; i--) {
            if (hist[i] != pat[0] || memcmp(hist + i, pat, (size_t)ng * sizeof(int32_t)) != 0) continue;
            int m = 0;
            while (m < k && i + ng + m < n) { out[m] = hist[i + ng + m]; m++; }
            if (m > 0) return m;
        }
    }
    return 0;
}

/* ----------------------------------------------------------------- policy */

#define CB_SPEC_WARMUP 8    /* verified drafts before the policy trusts a source's acceptance */
#define CB_SPEC_ALPHA  0.25 /* weight of the newest verification in the acceptance estimate */

int cb_spec_bit(int source) {
    for (int b = 0; b < CB_SPEC_N_SOURCES; b++) if (source == (1 << b)) return b;
    return -1;
}

void cb_spec_policy_init(cb_spec_policy *p) {
    memset(p, 0, sizeof *p);
    for (int b = 0; b < CB_SPEC_N_SOURCES; b++) {
        for (int i = 0; i < CB_SPEC_MAX_K; i++) p->st[b].accept_rate_pos[i] = 0.5;  /* optimistic prior: try it */
        p->pause_len[b] = 16;
    }
}

void cb_spec_policy_step(cb_spec_policy *p, int rows, double ms) {
    if (rows < 1 || !(ms > 0)) return;
    if (rows > CB_COST_BUCKETS) rows = CB_COST_BUCKETS;
    double *t = &p->step_ms[rows];
    *t = *t > 0 ? 0.9 * *t + 0.1 * ms : ms;
}

/* Smoothed step time for `rows` rows, interpolated between measured sizes;
 * 0 when nothing is known yet. */
static double step_time(const cb_spec_policy *p, int rows) {
    if (rows < 1) rows = 1;
    if (rows > CB_COST_BUCKETS) rows = CB_COST_BUCKETS;
    if (p->step_ms[rows] > 0) return p->step_ms[rows];
    int lo = rows - 1, hi = rows + 1;
    while (lo >= 1 && p->step_ms[lo] <= 0) lo--;
    while (hi <= CB_COST_BUCKETS && p->step_ms[hi] <= 0) hi++;
    if (lo >= 1 && hi <= CB_COST_BUCKETS)
        return p->step_ms[lo] + (p->step_ms[hi] - p->step_ms[lo]) * (rows - lo) / (hi - lo);
    /* one-sided: a memory-bound step grows slowly with rows (weights read once) */
    if (lo >= 1) return p->step_ms[lo] * (1.0 + 0.03 * (rows - lo));
    if (hi <= CB_COST_BUCKETS) return p->step_ms[hi] / (1.0 + 0.03 * (hi - rows));
    return 0;
}

int cb_spec_policy_k(cb_spec_policy *p, int b, const cb_spec_params *sp, int base_rows) {
    cb_spec_stats *st = &p->st[b];
    int k_max = sp->k_max < 1 ? 1 : sp->k_max > CB_SPEC_MAX_K ? CB_SPEC_MAX_K : sp->k_max;
    if (!sp->adaptive) { st->k = k_max; st->paused = 0; return k_max; }
    if (st->paused) {
        if (--p->pause_left[b] > 0) return 0;
        /* probe: draft shallowly once so the acceptance estimate sees fresh
         * data; the next call decides again from it */
        st->paused = 0;
        st->k = k_max < 2 ? k_max : 2;
        return st->k;
    }
    double t0 = step_time(p, base_rows);
    double best_gain = 0, e = 1, prod = 1;
    int best_k = 0;
    for (int k = 1; k <= k_max; k++) {
        prod *= st->accept_rate_pos[k - 1];
        e += prod;                                   /* expected tokens from this step */
        double tk = step_time(p, base_rows + k);
        double cost = (t0 > 0 && tk > 0) ? tk / t0 : 1.0 + 0.03 * k;
        if (t0 > 0) cost += k * p->draft_ms_tok[b] / t0;
        double gain = e / cost;
        if (gain > best_gain) { best_gain = gain; best_k = k; }
    }
    /* warm-up: until a source has a few verified drafts its acceptance is a
     * prior, so it must not buy deep drafts with it */
    if (st->drafts < CB_SPEC_WARMUP && best_k > 2) best_k = 2;
    st->expected_gain = best_gain;
    if (best_gain < 1.0) {
        st->paused = 1;
        st->k = 0;
        p->pause_left[b] = p->pause_len[b];
        if (p->pause_len[b] < 512) p->pause_len[b] *= 2;
        return 0;
    }
    p->pause_len[b] = 16;
    st->k = best_k;
    return best_k;
}

void cb_spec_policy_record(cb_spec_policy *p, int b, int n, int a) {
    cb_spec_stats *st = &p->st[b];
    st->drafts++;
    st->draft_tokens += n;
    st->accepted_tokens += a;
    /* position i was tried only if every earlier draft was accepted, so the
     * rate at i is conditional on reaching it */
    for (int i = 0; i < n && i < CB_SPEC_MAX_K; i++) {
        if (i > a) break;
        int ok = i < a;
        st->tried_pos[i]++;
        st->accepted_pos[i] += ok;
        /* fast-moving: acceptance changes with the content (copying vs free text) */
        st->accept_rate_pos[i] = (1.0 - CB_SPEC_ALPHA) * st->accept_rate_pos[i] + CB_SPEC_ALPHA * ok;
    }
}
