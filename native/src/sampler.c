/*
 * sampler.c — one row of logits -> one token (see sampler.h for the order).
 *
 * Working copy.  The row is copied into scratch->logits (the model's row is
 * never written).  Everything after that works on the copy:
 *
 *   copy + grammar mask            one pass over the vocabulary
 *   logit bias, penalties          sparse: only the listed / recent tokens
 *   max, argmax, valid count       one pass (this is all greedy needs)
 *   log-sum-exp                    one pass (double accumulator)
 *   top-N alternatives             one pass with a tiny insertion list
 *   sampling                       top-k by quickselect, then only as much
 *                                  sorting as top-p needs
 *
 * Banned tokens (mask bit clear, bias -INFINITY, NaN) are -INFINITY in the
 * copy and are never candidates; when nothing is left the call fails with
 * CB_ERR_ARG instead of picking one.  +INFINITY (e.g. a +inf bias) is clamped
 * to FLT_MAX so that the softmax stays finite: several such tokens share the
 * mass equally and greedy takes the lowest id among them.
 *
 * Determinism: every ordering uses the strict total order "higher logit
 * first, lower id on ties", so quickselect and sorts give the same result for
 * the same input; a sampled call consumes exactly one cb_rng_uniform() draw
 * and a greedy call none, so the RNG stream position only depends on how many
 * sampled tokens came before.
 */
#include "sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------- RNG */

/* splitmix64 (Vigna): expands one 64-bit seed into well-mixed words; the
 * xoshiro authors recommend it for seeding because an all-zero state would
 * be a fixed point of xoshiro. */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void cb_rng_seed(cb_rng *rng, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&x);
}

/* xoshiro256** 1.0, reference algorithm. */
uint64_t cb_rng_next(cb_rng *rng) {
    uint64_t *s = rng->s;
    const uint64_t result = rotl64(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* Top 53 bits as a double in [0, 1): every value is exactly representable. */
double cb_rng_uniform(cb_rng *rng) {
    return (double)(cb_rng_next(rng) >> 11) * 0x1.0p-53;
}

/* --------------------------------------------------------------- scratch */

int cb_sampler_scratch_init(cb_sampler_scratch *s, int n_vocab) {
    if (!s) return CB_ERR_ARG;
    memset(s, 0, sizeof *s);
    if (n_vocab <= 0) return CB_ERR_ARG;
    s->logits = malloc((size_t)n_vocab * sizeof *s->logits);
    s->idx    = malloc((size_t)n_vocab * sizeof *s->idx);
    s->probs  = malloc((size_t)n_vocab * sizeof *s->probs);
    if (!s->logits || !s->idx || !s->probs) {
        cb_sampler_scratch_free(s);
        return CB_ERR_NOMEM;
    }
    s->n_vocab = n_vocab;
    return CB_OK;
}

void cb_sampler_scratch_free(cb_sampler_scratch *s) {
    if (!s) return;
    free(s->logits);
    free(s->idx);
    free(s->probs);
    memset(s, 0, sizeof *s);
}

/* ------------------------------------------------- ordering and selection */

/* Strict total order on token ids: a before b if its logit is higher, or
 * equal with a lower id.  Banned tokens never reach these routines. */
static inline int before(const float *l, int a, int b) {
    return l[a] > l[b] || (l[a] == l[b] && a < b);
}

static inline void swap_int(int *a, int *b) { int t = *a; *a = *b; *b = t; }

/* Median of three positions (by `before`), moved to position lo: gives
 * quickselect / quicksort a good pivot on already-ordered input. */
static void pivot_to_front(const float *l, int *v, int lo, int hi) {
    int mid = lo + (hi - lo) / 2;
    if (before(l, v[mid], v[lo])) swap_int(&v[mid], &v[lo]);
    if (before(l, v[hi], v[lo])) swap_int(&v[hi], &v[lo]);
    if (before(l, v[hi], v[mid])) swap_int(&v[hi], &v[mid]);
    /* now v[lo] <= v[mid] <= v[hi] in `before` order; take the median */
    swap_int(&v[lo], &v[mid]);
}

/* Partition v[lo..hi] around the pivot v[lo] (Lomuto); returns its final
 * position p: v[lo..p) before pivot, v(p..hi] after it.  The order is strict
 * and total, so there are no equal keys to degrade on. */
static int partition(const float *l, int *v, int lo, int hi) {
    int pv = v[lo];
    int store = lo + 1;
    for (int i = lo + 1; i <= hi; i++)
        if (before(l, v[i], pv)) swap_int(&v[i], &v[store++]);
    swap_int(&v[lo], &v[store - 1]);
    return store - 1;
}

/* Rearrange v[0..n) so that its first k entries are the k best (unordered).
 * Expected O(n). */
static void select_top(const float *l, int *v, int n, int k) {
    if (k <= 0 || k >= n) return;
    int lo = 0, hi = n - 1;
    while (hi > lo) {
        pivot_to_front(l, v, lo, hi);
        int p = partition(l, v, lo, hi);
        if (p == k || p == k - 1) return;   /* v[0..k) are exactly the best k */
        if (p < k) lo = p + 1; else hi = p - 1;
    }
}

/* Restore the heap property below position i of a heap whose root is the
 * WORST entry (by `before`), so the root is the one to evict. */
static void sift_down_worst(const float *l, int *h, int k, int i) {
    for (;;) {
        int c = 2 * i + 1;
        if (c >= k) return;
        if (c + 1 < k && before(l, h[c], h[c + 1])) c++;   /* the worse child */
        if (!before(l, h[i], h[c])) return;
        swap_int(&h[i], &h[c]);
        i = c;
    }
}

/* Same contract as select_top, for small k: a bounded heap of the k best
 * built in place over v[0..k), then one pass over the rest where most
 * entries are rejected by a single compare with the heap's worst entry.
 * O(n + k log k log n)-ish and branch-predictable; quickselect's swaps over
 * 49152 ids cost several times more when k is a typical 40. */
static void select_top_heap(const float *l, int *v, int n, int k) {
    for (int i = k / 2 - 1; i >= 0; i--) sift_down_worst(l, v, k, i);
    for (int j = k; j < n; j++) {
        if (before(l, v[j], v[0])) {
            swap_int(&v[j], &v[0]);
            sift_down_worst(l, v, k, 0);
        }
    }
}

#define CB_HEAP_SELECT_MAX 512  /* k up to this uses the heap, beyond it quickselect */

static void insertion_sort(const float *l, int *v, int lo, int hi) {
    for (int i = lo + 1; i <= hi; i++) {
        int x = v[i], j = i - 1;
        while (j >= lo && before(l, x, v[j])) { v[j + 1] = v[j]; j--; }
        v[j + 1] = x;
    }
}

/* Sort v[0..n) by `before`.  Quicksort recursing on the smaller side (stack
 * O(log n)) with an insertion sort below 16 elements. */
static void sort_range(const float *l, int *v, int lo, int hi) {
    while (hi - lo >= 16) {
        pivot_to_front(l, v, lo, hi);
        int p = partition(l, v, lo, hi);
        if (p - lo < hi - p) { sort_range(l, v, lo, p - 1); lo = p + 1; }
        else                 { sort_range(l, v, p + 1, hi); hi = p - 1; }
    }
    insertion_sort(l, v, lo, hi);
}

/* --------------------------------------------------------------- helpers */

/* Working-copy hygiene: NaN means "cannot be scored" and is banned; +inf is
 * clamped so exp(x - max) never sees inf - inf.  Written without branches so
 * the whole-vocabulary copy vectorizes. */
static inline float sanitize(float x) {
    x = x != x ? -INFINITY : x;
    return x == INFINITY ? FLT_MAX : x;
}

/* dst = sanitized src, -inf where the mask bit is clear (mask may be NULL). */
static void copy_logits(float *restrict dst, const float *restrict src, const uint32_t *restrict mask, int n) {
    if (!mask) {
        for (int i = 0; i < n; i++) dst[i] = sanitize(src[i]);
        return;
    }
    for (int i = 0; i < n; i++) {
        const float x = sanitize(src[i]);
        dst[i] = ((mask[i >> 5] >> (i & 31)) & 1u) ? x : -INFINITY;
    }
}

/* Lowest index of the maximum of l[0..n) (NaN entries never win), -1 if every
 * entry is -inf or NaN; *max gets the maximum.  The maximum first, over 16 independent lanes
 * (vectorizable, where one running compare-and-index is a serial chain),
 * then the first index holding it: the same answer as a strict-> scan. */
static int first_max(const float *l, int n, float *max) {
    enum { LANES = 16 };
    float mx[LANES];
    for (int j = 0; j < LANES; j++) mx[j] = -INFINITY;
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) mx[j] = l[i + j] > mx[j] ? l[i + j] : mx[j];
    float m = -INFINITY;
    for (int j = 0; j < LANES; j++) m = mx[j] > m ? mx[j] : m;
    for (; i < n; i++) m = l[i] > m ? l[i] : m;
    *max = m;
    if (m == -INFINITY) return -1;
    for (i = 0; i + LANES <= n; i += LANES) {  /* find its block without branching per entry */
        int hit = 0;
        for (int j = 0; j < LANES; j++) hit |= l[i + j] == m;
        if (hit) break;
    }
    for (; i < n; i++)
        if (l[i] == m) return i;
    return -1;
}

static int penalties_on(const cb_sampling_params *p) {
    return (p->repeat_penalty > 0.0f && p->repeat_penalty != 1.0f) ||   /* <= 0 / NaN: off */
           (p->frequency_penalty != 0.0f && p->frequency_penalty == p->frequency_penalty) ||
           (p->presence_penalty != 0.0f && p->presence_penalty == p->presence_penalty);
}

int cb_sample_is_argmax(const cb_sampling_params *p) {
    return !(p->temperature > 0.0f) && p->n_logit_bias == 0 && p->n_logprobs <= 0 && !penalties_on(p);
}

/* Logit bias: added in list order (a token listed twice gets both).  Tokens
 * already at -inf (masked, or -inf from the model) stay banned: a +inf bias
 * must not resurrect a grammar-forbidden token.  Out-of-range ids are
 * ignored (submit validates them; the sampler just never indexes with them). */
static void apply_bias(const cb_sampling_params *p, float *l, int n_vocab) {
    for (int i = 0; i < p->n_logit_bias; i++) {
        int32_t t = p->logit_bias_tokens[i];
        if (t < 0 || t >= n_vocab) continue;
        if (l[t] == -INFINITY) continue;
        l[t] = sanitize(l[t] + p->logit_bias_values[i]);
    }
}

/* Penalties over the last `repeat_last_n` tokens of history, llama.cpp
 * semantics: for each distinct token with count c > 0 in the window,
 *   x = x > 0 ? x / repeat : x * repeat;  x -= c * freq + presence.
 * Counting borrows scratch->probs (indexed by token id) as a counter, touching
 * only the entries of the window tokens, so the cost is O(window), not
 * O(vocab), and nothing is allocated.  Counts are exact in float up to 2^24. */

static void apply_penalties(const cb_sampling_params *p, float *l, float *cnt, int n_vocab,
                            const int32_t *hist, int n_hist) {
    int use_rep = p->repeat_penalty > 0.0f && p->repeat_penalty != 1.0f; /* <= 0 / NaN: off */
    int use_freq = p->frequency_penalty != 0.0f && p->frequency_penalty == p->frequency_penalty;
    int use_pres = p->presence_penalty != 0.0f && p->presence_penalty == p->presence_penalty;
    if (!use_rep && !use_freq && !use_pres) return;
    if (!hist || n_hist <= 0 || p->repeat_last_n == 0) return;
    int win = p->repeat_last_n < 0 ? n_hist : (p->repeat_last_n < n_hist ? p->repeat_last_n : n_hist);
    const int32_t *w = hist + (n_hist - win);

    for (int i = 0; i < win; i++)
        if (w[i] >= 0 && w[i] < n_vocab) cnt[w[i]] = 0.0f;
    for (int i = 0; i < win; i++)
        if (w[i] >= 0 && w[i] < n_vocab) cnt[w[i]] += 1.0f;
    for (int i = 0; i < win; i++) {
        int32_t t = w[i];
        if (t < 0 || t >= n_vocab || cnt[t] == 0.0f) continue;
        float c = cnt[t];
        cnt[t] = 0.0f;                      /* later copies of t: already done */
        float x = l[t];
        if (x == -INFINITY) continue;       /* banned stays banned */
        if (use_rep) x = x > 0.0f ? x / p->repeat_penalty : x * p->repeat_penalty;
        if (use_freq) x -= c * p->frequency_penalty;
        if (use_pres) x -= p->presence_penalty;
        /* A finite logit pushed to -inf by overflow is still a legal token:
         * keep it the least likely finite value rather than banning it. */
        x = sanitize(x);
        if (x == -INFINITY) x = -FLT_MAX;
        l[t] = x;
    }
}

/* ----------------------------------------------------------------- sample */

/* 5. log(sum_t exp(x_t - m)) at temperature 1, double accumulator.  x - m <= 0,
 *    so expf never overflows; -inf entries add exactly 0.  With fill_probs
 *    (sampling at temperature 1) the same exponentials of the n_valid ids in
 *    idx are kept in pr as the unnormalised probabilities. */
static double log_sum_exp(const float *l, int n_vocab, const int *idx, int n_valid, float m, float *pr,
                          int fill_probs) {
    double sum = 0.0;
    if (fill_probs) {
        for (int j = 0; j < n_valid; j++) {
            int t = idx[j];
            float e = expf(l[t] - m);
            pr[t] = e;
            sum += e;
        }
    } else {
        for (int i = 0; i < n_vocab; i++) sum += expf(l[i] - m);
    }
    return log(sum);
}

/* 6. the n_lp best alternatives and their logprobs: insertion into a sorted
 *    list of <= 20 entries; an entry not beating the current last is rejected
 *    with one compare.  logprob(t) = (x_t - m) - log_sum: subtracting m first
 *    keeps it exact-ish even when m is huge (m + log_sum would lose log_sum
 *    entirely next to a max of FLT_MAX).  Returns how many were written. */
static int top_alternatives(const float *l, int n_vocab, int n_lp, float m, double log_sum,
                            int32_t *tt, float *tlp) {
    int n_top = 0;
    if (n_lp <= 0) return 0;
    for (int i = 0; i < n_vocab; i++) {
        if (l[i] == -INFINITY) continue;
        if (n_top == n_lp && !before(l, i, tt[n_top - 1])) continue;
        int j = n_top < n_lp ? n_top++ : n_lp - 1;
        while (j > 0 && before(l, i, tt[j - 1])) { tt[j] = tt[j - 1]; j--; }
        tt[j] = i;
    }
    for (int j = 0; j < n_top; j++) tlp[j] = (float)(((double)l[tt[j]] - (double)m) - log_sum);
    return n_top;
}

/* 9. top-p: the smallest prefix of the candidates sorted best first with
 *    mass >= top_p * total (at least one).  Sorted lazily: select the best
 *    `chunk` of the unsorted rest, sort just those, and grow the chunk only
 *    if the mass is not reached yet, so a peaked distribution costs one O(n)
 *    select plus a sort of 256 ids.  Returns the candidates kept. */
static int keep_top_p(const float *l, int *idx, const float *pr, int n, double total, float top_p) {
    const double thr = (double)top_p * total;
    double cum = 0.0;
    int sorted = 0, chunk = 256, keep = n;
    while (sorted < n) {
        int end = n - sorted > chunk ? sorted + chunk : n;
        if (end < n) select_top(l, idx + sorted, n - sorted, end - sorted);
        sort_range(l, idx, sorted, end - 1);
        for (int j = sorted; j < end; j++) {
            cum += pr[idx[j]];
            if (cum >= thr) { keep = j + 1; break; }
        }
        if (keep < n || end == n) break;
        sorted = end;
        chunk = chunk > (1 << 26) ? chunk : chunk * 4;
    }
    return keep;
}

/* 10. min-p: drop p < min_p * p_max (p_max measured, not assumed); the best
 *     candidate (arg) always stays.  Returns the candidates kept. */
static int keep_min_p(int *idx, const float *pr, int n, float min_p, int arg) {
    float pmax = 0.0f;
    for (int j = 0; j < n; j++) if (pr[idx[j]] > pmax) pmax = pr[idx[j]];
    const float cut = min_p * pmax;
    int w = 0;
    for (int j = 0; j < n; j++) {
        int t = idx[j];
        if (pr[t] >= cut || t == arg) idx[w++] = t;
    }
    return w;
}

/* 7-11. Draw a token from the n_valid candidates in idx (their exponentials
 *       already in pr at temperature 1): top-k, temperature, top-p, min-p,
 *       then the inverse CDF over what is left. */
static int draw(const cb_sampling_params *p, cb_rng *rng, const float *l, int *idx, float *pr, int n_valid,
                float m, int arg) {
    const float temp = p->temperature;
    /* 7. top-k: the k best by quickselect (unordered). */
    int n = n_valid;
    if (p->top_k > 0 && p->top_k < n) {
        if (p->top_k <= CB_HEAP_SELECT_MAX) select_top_heap(l, idx, n, p->top_k);
        else select_top(l, idx, n, p->top_k);
        n = p->top_k;
    }
    /* 8. temperature + softmax (unnormalised: the max has weight 1, the
     *    argmax always survives top-k).  Total in double. */
    double total = 0.0;
    if (temp == 1.0f) {
        for (int j = 0; j < n; j++) total += pr[idx[j]];
    } else {
        /* divide rather than multiply by 1/temp: a tiny temperature makes
         * 1/temp inf and 0 * inf would be NaN for the max */
        for (int j = 0; j < n; j++) {
            int t = idx[j];
            float e = expf((l[t] - m) / temp);
            pr[t] = e;
            total += e;
        }
    }
    if (p->top_p < 1.0f && n > 1) n = keep_top_p(l, idx, pr, n, total, p->top_p);
    if (p->min_p > 0.0f && n > 1) n = keep_min_p(idx, pr, n, p->min_p, arg);
    /* 11. renormalise and draw (inverse CDF over the kept candidates). */
    total = 0.0;
    for (int j = 0; j < n; j++) total += pr[idx[j]];
    const double u = cb_rng_uniform(rng) * total;
    double acc = 0.0;
    int last_pos = arg;     /* rounding fallback (u may round up to the total):
                             * the last candidate with weight > 0 */
    for (int j = 0; j < n; j++) {
        float w = pr[idx[j]];
        if (w <= 0.0f) continue;        /* underflowed: never drawn */
        last_pos = idx[j];
        acc += w;
        if (u < acc) return idx[j];
    }
    return last_pos;
}

int cb_sample(const cb_sampling_params *p, cb_rng *rng, cb_sampler_scratch *s,
              const float *logits, const int32_t *history, int n_history,
              const uint32_t *mask, cb_sample_result *out) {
    if (out) { out->token = -1; out->logprob = -INFINITY; out->n_top = 0; }
    if (!p || !s || !s->logits || !s->idx || !s->probs || s->n_vocab <= 0 || !logits || !out)
        return CB_ERR_ARG;
    if (n_history < 0 || (n_history > 0 && !history)) return CB_ERR_ARG;
    if (p->n_logit_bias < 0 ||
        (p->n_logit_bias > 0 && (!p->logit_bias_tokens || !p->logit_bias_values)))
        return CB_ERR_ARG;
    const float temp = p->temperature;
    const int greedy = !(temp > 0.0f);      /* also catches NaN */
    if (!greedy && !rng) return CB_ERR_ARG;

    const int n_vocab = s->n_vocab;
    float *l = s->logits;
    int *idx = s->idx;
    float *pr = s->probs;

    /* 0. greedy with nothing to apply: the argmax of the raw logits (NaN
     *    never wins; a +inf maximum takes the general path, where sanitize
     *    ties it with FLT_MAX).  Speculative verification and batched
     *    decode sample many rows per step, and the copy below is most of a
     *    greedy call's cost. */
    if (!mask && cb_sample_is_argmax(p)) {
        float m;
        const int arg = first_max(logits, n_vocab, &m);
        if (arg < 0) return CB_ERR_ARG;     /* every token -inf / NaN */
        if (m != INFINITY) {
            out->token = arg;
            out->logprob = NAN;
            out->n_top = 0;
            return CB_OK;
        }
    }

    /* 1. copy + grammar mask (bit clear = forbidden) */
    copy_logits(l, logits, mask, n_vocab);

    /* 2. bias, 3. penalties (sparse) */
    apply_bias(p, l, n_vocab);
    apply_penalties(p, l, pr, n_vocab, history, n_history);

    /* 4. max / argmax (lowest id on ties: strict >) / valid count.  When
     *    sampling, also compact the valid ids into idx (id order). */
    float m = -INFINITY;
    int arg = -1, n_valid = 0;
    if (greedy) {
        arg = first_max(l, n_vocab, &m);
        n_valid = arg >= 0;     /* only "any valid?" matters for greedy */
    } else {
        for (int i = 0; i < n_vocab; i++) {
            float x = l[i];
            if (x == -INFINITY) continue;
            idx[n_valid++] = i;
            if (x > m) { m = x; arg = i; }
        }
    }
    if (arg < 0) return CB_ERR_ARG;         /* every token forbidden */

    /* Greedy without logprobs needs nothing more than the argmax: skip the
     * pass of expf over the whole vocabulary (it is most of a greedy call's
     * cost, and speculative verification samples many rows per step). */
    if (greedy && p->n_logprobs <= 0) {
        out->token = arg;
        out->logprob = NAN;
        out->n_top = 0;
        return CB_OK;
    }

    const double log_sum = log_sum_exp(l, n_vocab, idx, n_valid, m, pr, !greedy && temp == 1.0f);
    int n_lp = p->n_logprobs < 0 ? 0 : (p->n_logprobs > CB_MAX_LOGPROBS ? CB_MAX_LOGPROBS : p->n_logprobs);
    out->n_top = top_alternatives(l, n_vocab, n_lp, m, log_sum, out->top_tokens, out->top_logprobs);
    const int chosen = greedy ? arg : draw(p, rng, l, idx, pr, n_valid, m, arg);
    out->token = chosen;
    out->logprob = (float)(((double)l[chosen] - (double)m) - log_sum);
    return CB_OK;
}
