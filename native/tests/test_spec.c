/*
 * test_spec.c — prompt-lookup drafting and the adaptive speculation policy
 * (native/src/spec.c).
 *
 * Lookup: hand-made cases for match selection (longest match, ties to the
 * most recent, ngram_min / ngram_max), the reported match length and the
 * continuation that runs on into the draft; a randomized comparison with a
 * naive reference.  Policy: the depth it chooses follows the measured cost
 * per verify size (a cheaper verify buys a deeper draft), one slow step does
 * not rule a size out, unprofitable classes are skipped but probed, and an
 * accepted copy drafts deeper than it has been verified so far.  Prompt rows
 * beside decode rows: the most whose measured step stays within the slack of
 * a decode-only step, else the count that adds the least time per prompt row.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec.h"
#include "testutil.h"

static int draft(const int32_t *h, int n, int nmin, int nmax, int k, int32_t *out, int *len) {
    return cb_lookup_draft_ex(h, n, nmin, nmax, k, out, len);
}

static void test_lookup_cases(void) {
    int32_t out[CB_SPEC_MAX_K];
    int len = -1;
    /* no earlier occurrence of the last two tokens */
    const int32_t a[] = {1, 2, 3, 4, 5};
    CHECK(draft(a, 5, 2, 16, 4, out, &len) == 0 && len == 0);
    /* one-token history: nothing to match */
    CHECK(draft(a, 1, 1, 16, 4, out, &len) == 0);
    /* a 1-token match is ignored at ngram_min 2, used at 1 */
    const int32_t b[] = {7, 9, 8, 9};
    CHECK(draft(b, 4, 2, 16, 2, out, &len) == 0);
    CHECK(draft(b, 4, 1, 16, 2, out, &len) == 2 && len == 1 && out[0] == 8 && out[1] == 9);
    /* longest wins over more recent: [1 2 3] -> 10 (old, 3 long), [2 3] -> 20 (recent, 2 long) */
    const int32_t c[] = {1, 2, 3, 10, 11, 5, 2, 3, 20, 21, 6, 1, 2, 3};
    int n = (int)(sizeof c / sizeof c[0]);
    CHECK(draft(c, n, 2, 16, 2, out, &len) == 2 && out[0] == 10 && out[1] == 11 && len == 3);
    /* with ngram_max 2 both are "2 long": the most recent wins, and the match length is still measured */
    CHECK(draft(c, n, 2, 2, 2, out, &len) == 2 && out[0] == 20 && out[1] == 21 && len == 2);
    /* equal lengths: the most recent occurrence */
    const int32_t d[] = {4, 5, 1, 4, 5, 2, 4, 5};
    CHECK(draft(d, 8, 2, 16, 1, out, &len) == 1 && out[0] == 2 && len == 2);
    /* the continuation runs on into the draft: a repeating span drafts further periods */
    const int32_t e[] = {9, 1, 2, 3, 1, 2, 3, 1, 2};
    CHECK(draft(e, 9, 2, 16, 7, out, &len) == 7);
    const int32_t want[] = {3, 1, 2, 3, 1, 2, 3};
    CHECK(memcmp(out, want, sizeof want) == 0);
    CHECK(len == 5);  /* the occurrence ending at index 5 matches five tokens: 1 2 3 1 2 */
    /* the match length is counted up to CB_LOOKUP_MATCH_CAP */
    int32_t f[200];
    for (int i = 0; i < 200; i++) f[i] = i % 50;
    CHECK(draft(f, 200, 2, 16, 3, out, &len) == 3 && len == CB_LOOKUP_MATCH_CAP && out[0] == 0);
    CHECK(cb_lookup_class(2) == 0 && cb_lookup_class(3) == 1 && cb_lookup_class(7) == 2 &&
          cb_lookup_class(8) == 3 && cb_lookup_class(CB_LOOKUP_MATCH_CAP) == CB_SPEC_N_CLASS - 1);
    /* bad arguments */
    CHECK(draft(NULL, 5, 2, 16, 4, out, &len) == 0);
    CHECK(draft(a, 5, 2, 16, 0, out, &len) == 0);
}

/* naive reference: every end j, match length capped at ngram_max for the choice */
static int ref_draft(const int32_t *h, int n, int nmin, int nmax, int k, int32_t *out, int *len_out) {
    int best = -1, bestc = 0, bestlen = 0;
    int cap = nmax > CB_LOOKUP_MATCH_CAP ? nmax : CB_LOOKUP_MATCH_CAP;
    for (int j = n - 2; j >= 0; j--) {
        int len = 0;
        while (len < cap && j - len >= 0 && h[j - len] == h[n - 1 - len]) len++;
        if (len < nmin || len == 0) continue;
        int c = len < nmax ? len : nmax;
        if (c > bestc) { bestc = c; best = j; bestlen = len; }
    }
    *len_out = best < 0 ? 0 : bestlen;
    if (best < 0) return 0;
    int32_t seq[4096];
    memcpy(seq, h, (size_t)n * sizeof *h);
    for (int m = 0; m < k; m++) seq[n + m] = seq[best + 1 + m];
    memcpy(out, seq + n, (size_t)k * sizeof *out);
    return k;
}

static void test_lookup_random(void) {
    srand(12345);
    int32_t h[600], o1[CB_SPEC_MAX_K], o2[CB_SPEC_MAX_K];
    int bad = 0;
    for (int it = 0; it < 3000; it++) {
        int n = 2 + rand() % 500, alpha = 2 + rand() % 6;
        /* random text with copied spans so long matches occur */
        for (int i = 0; i < n; i++) {
            if (i > 20 && rand() % 40 == 0) {
                int src = rand() % (i - 10), l = 5 + rand() % 40;
                for (int j = 0; j < l && i < n; j++, i++) h[i] = h[src + j];
                i--;
            } else h[i] = rand() % alpha;
        }
        int nmin = 1 + rand() % 3, nmax = nmin + rand() % 20, k = 1 + rand() % CB_SPEC_MAX_K;
        int l1, l2;
        int r1 = draft(h, n, nmin, nmax, k, o1, &l1), r2 = ref_draft(h, n, nmin, nmax, k, o2, &l2);
        if (r1 != r2 || l1 != l2 || (r1 > 0 && memcmp(o1, o2, (size_t)r1 * sizeof *o1) != 0)) bad++;
    }
    CHECK_MSG(bad == 0, "%d of 3000 random histories differ from the reference", bad);
}

/* feed a policy `reps` step times per size: ms(rows) = base + per_row * (rows - 1) */
static void feed_costs(cb_spec_policy *p, double base, double per_row, int max_rows) {
    for (int rep = 0; rep < 5; rep++)
        for (int r = 1; r <= max_rows; r++) cb_spec_policy_step(p, r, base + per_row * (r - 1));
}

/* a source that accepts each position with probability `rate` (fixed seed): record 60 drafts of depth k */
static void feed_accept(cb_spec_policy *p, int b, int cls, int k, double rate) {
    srand(7);
    for (int i = 0; i < 60; i++) {
        int a = 0;
        while (a < k && rand() < rate * RAND_MAX) a++;
        cb_spec_policy_record_class(p, b, cls, k, a);
    }
}

static void test_policy_cost(void) {
    cb_spec_params sp = { CB_SPEC_LOOKUP, 16, 1, 16, 2 };
    int b = cb_spec_bit(CB_SPEC_LOOKUP), cls = 4;
    /* the same acceptance (0.8 a position), measured cost steep vs cheap */
    cb_spec_policy steep, cheap;
    cb_spec_policy_init(&steep);
    cb_spec_policy_init(&cheap);
    feed_costs(&steep, 5.0, 1.5, 20);   /* today's int8 kernel: ~+30% per verify row */
    feed_costs(&cheap, 5.0, 0.1, 20);   /* a verify row at 2% of a step */
    feed_accept(&steep, b, cls, 16, 0.8);
    feed_accept(&cheap, b, cls, 16, 0.8);
    int ks = cb_spec_policy_k_class(&steep, b, cls, &sp, 1, 16);
    int kc = cb_spec_policy_k_class(&cheap, b, cls, &sp, 1, 16);
    CHECK_MSG(ks >= 1 && kc > ks, "steep cost k %d, cheap cost k %d", ks, kc);
    CHECK_MSG(kc >= 6, "cheap verify should draft deep, got %d", kc);
    /* the draft available bounds the depth; adaptive off takes all of it up to k_max */
    CHECK(cb_spec_policy_k_class(&cheap, b, cls, &sp, 1, 3) <= 3);
    cb_spec_params fixed = sp;
    fixed.adaptive = 0;
    fixed.k_max = 5;
    CHECK(cb_spec_policy_k_class(&steep, b, 0, &fixed, 1, 16) == 5);
    CHECK(cb_spec_policy_k_class(&steep, b, 0, &fixed, 1, 2) == 2);
    /* out-of-range arguments decline */
    CHECK(cb_spec_policy_k_class(&steep, b, CB_SPEC_N_CLASS, &sp, 1, 4) == 0);
    CHECK(cb_spec_policy_k_class(&steep, -1, 0, &sp, 1, 4) == 0);
}

/* Step times of row-tiled kernels (tiles of 8, 4, 2, 1 rows): 4 rows cost less than 3, 8 less than 7.  The
 * policy prices a depth by its own measured size: 3 drafts (4 rows) beat 1 or 2 here; a cost lifted to be
 * monotone priced 4 rows as 3 and chose depth 1. */
static void test_policy_tiled_cost(void) {
    cb_spec_params sp = { CB_SPEC_LOOKUP, 16, 1, 16, 2 };
    int b = cb_spec_bit(CB_SPEC_LOOKUP), cls = 4;
    static const double ms[] = { 0, 10, 10.5, 15, 11, 20, 22, 25, 16, 30, 32, 34, 36, 38, 40, 42, 44, 46 };
    cb_spec_policy p;
    cb_spec_policy_init(&p);
    for (int rep = 0; rep < 5; rep++)
        for (int r = 1; r <= 17; r++) cb_spec_policy_step(&p, r, ms[r]);
    feed_accept(&p, b, cls, 16, 0.6);
    int k = cb_spec_policy_k_class(&p, b, cls, &sp, 1, 16);
    CHECK_MSG(k == 3, "tiled cost: depth %d, want 3 (4 rows, priced at 1.1 steps)", k);
}

static void test_policy_outlier(void) {
    cb_spec_params sp = { CB_SPEC_LOOKUP, 16, 1, 16, 2 };
    int b = cb_spec_bit(CB_SPEC_LOOKUP), cls = 4;
    cb_spec_policy p;
    cb_spec_policy_init(&p);
    feed_accept(&p, b, cls, 16, 0.95);
    feed_costs(&p, 5.0, 0.1, 4);   /* sizes 1..4 well measured */
    cb_spec_policy_step(&p, 5, 60.0);  /* one step of 5 rows while the machine was busy */
    int k = cb_spec_policy_k_class(&p, b, cls, &sp, 1, 16);
    CHECK_MSG(k > 4, "one slow 5-row step must not cap the depth at 4 rows: k %d", k);
    /* its estimate falls back once it is seen at its usual cost */
    cb_spec_policy_step(&p, 5, 5.4);
    cb_spec_policy_step(&p, 5, 5.4);
    CHECK(p.step_ms[5] < 6.0);
    /* a later spike moves the estimate by at most twice the estimate's weight */
    cb_spec_policy_step(&p, 5, 5.4);
    cb_spec_policy_step(&p, 5, 1000.0);
    CHECK(p.step_ms[5] < 6.0);
}

static void test_policy_skip_and_probe(void) {
    cb_spec_params sp = { CB_SPEC_LOOKUP, 8, 1, 16, 2 };
    int b = cb_spec_bit(CB_SPEC_LOOKUP);
    cb_spec_policy p;
    cb_spec_policy_init(&p);
    feed_costs(&p, 5.0, 1.5, 10);
    /* short matches that are never accepted */
    for (int i = 0; i < 40; i++) cb_spec_policy_record_class(&p, b, 0, 2, 0);
    int drafted = 0, calls = 160;
    for (int i = 0; i < calls; i++) drafted += cb_spec_policy_k_class(&p, b, 0, &sp, 1, 8) > 0;
    CHECK_MSG(drafted > 0 && drafted <= calls / 8, "drafted %d of %d", drafted, calls);
    CHECK(p.st[b].paused == 1 || drafted > 0);
    /* a different class (long matches) is not held back by class 0 */
    for (int i = 0; i < 40; i++) cb_spec_policy_record_class(&p, b, 4, 4, 4);
    CHECK(cb_spec_policy_k_class(&p, b, 4, &sp, 1, 8) >= 2);
}

static void test_policy_carry_forward(void) {
    /* verified only at depth 2 so far, always fully: positions 3+ have no
     * data, yet deeper drafts must be chosen when verify is cheap */
    cb_spec_params sp = { CB_SPEC_LOOKUP, 16, 1, 16, 2 };
    int b = cb_spec_bit(CB_SPEC_LOOKUP);
    cb_spec_policy p;
    cb_spec_policy_init(&p);
    feed_costs(&p, 5.0, 0.1, 20);
    for (int i = 0; i < 20; i++) cb_spec_policy_record_class(&p, b, 3, 2, 2);
    int k = cb_spec_policy_k_class(&p, b, 3, &sp, 1, 16);
    CHECK_MSG(k > 2, "k %d", k);
    /* drafter sources (class 0 API) still pause when unprofitable */
    int ls = cb_spec_bit(CB_SPEC_LAYERSKIP);
    cb_spec_params sl = { CB_SPEC_LAYERSKIP, 4, 1, 16, 2 };
    p.draft_ms_tok[ls] = 3.0;
    for (int i = 0; i < 30; i++) cb_spec_policy_record(&p, ls, 2, 0);
    CHECK(cb_spec_policy_k(&p, ls, &sl, 1) == 0 && p.st[ls].paused == 1);
    CHECK(cb_spec_policy_k(&p, ls, &sl, 1) == 0);
}

static void test_policy_longer_match_inherits(void) {
    /* short matches (class 1) copied faithfully so far: the first long match
     * (class 3, never verified) drafts deep at once; a class below any data
     * keeps the prior and the warm-up depth */
    cb_spec_params sp = { CB_SPEC_LOOKUP, 16, 1, 16, 2 };
    int b = cb_spec_bit(CB_SPEC_LOOKUP);
    cb_spec_policy p;
    cb_spec_policy_init(&p);
    feed_costs(&p, 5.0, 0.1, 20);
    CHECK(cb_spec_policy_k_class(&p, b, 3, &sp, 1, 16) <= 2);
    feed_accept(&p, b, 1, 8, 0.95);
    int k3 = cb_spec_policy_k_class(&p, b, 3, &sp, 1, 16);
    CHECK_MSG(k3 > 4, "k %d", k3);
    CHECK(p.cls[b][3].tried[0] == 0);
    CHECK(cb_spec_policy_k_class(&p, b, 0, &sp, 1, 16) <= 2);
    /* a shorter class that fails does not hold a longer one below the prior */
    cb_spec_policy q;
    cb_spec_policy_init(&q);
    feed_costs(&q, 5.0, 0.1, 20);
    for (int i = 0; i < 40; i++) cb_spec_policy_record_class(&q, b, 0, 2, 0);
    CHECK(cb_spec_policy_k_class(&q, b, 2, &sp, 1, 16) >= 1);
}

/* Per-request planning for drafter sources: the request's own acceptance
 * moves the choice away from the engine-wide estimate; the measured cost
 * per drafted token counts; a source that does not pay waits (doubling) and
 * is then probed shallowly with a gain just above 1. */
static void test_policy_plan_per_request(void) {
    cb_spec_params sp = { CB_SPEC_DRAFT, 8, 1, 16, 2 };
    int b = cb_spec_bit(CB_SPEC_DRAFT);
    cb_spec_policy p;
    cb_spec_policy_init(&p);
    feed_costs(&p, 40.0, 0.5, 12);      /* a 1.5B target: a verify row costs ~1% of a step */
    feed_accept(&p, b, 0, 8, 0.7);      /* engine-wide: 0.7 a position */
    p.draft_ms_tok[b] = 4.0;            /* the drafter: 10% of a target step per token */
    cb_spec_req good, bad;
    cb_spec_req_init(&good);
    cb_spec_req_init(&bad);
    double g = 0;
    int k = cb_spec_policy_plan(&p, &good, b, &sp, 1, 8, &g);
    CHECK_MSG(k >= 2 && g > 1.2, "k %d gain %.3f", k, g);
    /* a request whose drafts are always rejected: its own record overrides the engine's */
    for (int i = 0; i < 40; i++) cb_spec_req_record(&bad, b, 4, 0);  /* 0 of 40: blended P(accept) 2.8 / 44 */
    double gb = 0;
    CHECK(cb_spec_policy_plan(&p, &bad, b, &sp, 1, 8, &gb) == 0 && gb < 1.0);
    CHECK(bad.wait[b] == 8 && bad.backoff[b] == 16);
    int waited = 0;
    while (cb_spec_policy_plan(&p, &bad, b, &sp, 1, 8, &gb) == 0 && waited < 100) waited++;
    CHECK_MSG(waited == 7, "waited %d", waited);           /* the 8th call probes */
    CHECK(gb > 1.0 && gb < 1.0 + 1e-6);
    CHECK(cb_spec_policy_plan(&p, &bad, b, &sp, 1, 8, &gb) == 0 && bad.wait[b] == 16);  /* still bad: longer wait */
    /* the same acceptance with a drafter as dear as the target does not pay */
    p.draft_ms_tok[b] = 40.0;
    cb_spec_req fresh;
    cb_spec_req_init(&fresh);
    CHECK(cb_spec_policy_plan(&p, &fresh, b, &sp, 1, 8, &g) == 0 && g < 1.0);
    /* not adaptive: always k_max (bounded by what is available) */
    cb_spec_params fixed = sp;
    fixed.adaptive = 0;
    CHECK(cb_spec_policy_plan(&p, &fresh, b, &fixed, 1, 5, &g) == 5);
    CHECK(cb_spec_policy_plan(&p, &fresh, -1, &sp, 1, 5, &g) == 0);
    cb_spec_stats *st = &p.st[b];
    CHECK(st->decisions > 0 && st->declined > 0 && st->decline_rate > 0 && st->decline_rate <= 1);
}

/* A lookup continuation of a drafter's draft is priced at the marginal
 * cost of its rows, pays only with enough acceptance, and pricing changes
 * nothing in the policy. */
static void test_policy_extension(void) {
    cb_spec_params sp = { CB_SPEC_LOOKUP | CB_SPEC_DRAFT, 16, 1, 16, 2 };
    int b = cb_spec_bit(CB_SPEC_LOOKUP), cls = 3;
    cb_spec_policy p;
    cb_spec_policy_init(&p);
    CHECK(cb_spec_policy_k_ext(&p, NULL, b, cls, &sp, 3, 8) == 0);  /* no step measured yet: no extension */
    feed_costs(&p, 5.0, 0.25, 20);
    feed_accept(&p, b, cls, 16, 0.9);
    cb_spec_policy before = p;
    int k = cb_spec_policy_k_ext(&p, NULL, b, cls, &sp, 3, 12);
    CHECK_MSG(k >= 4 && k <= 12, "a copy accepted at 0.9 with cheap rows should extend deep, got %d", k);
    CHECK_MSG(memcmp(&before, &p, sizeof p) == 0, "pricing an extension changed the policy");
    CHECK(cb_spec_policy_k_ext(&p, NULL, b, cls, &sp, 3, 2) <= 2);           /* bounded by what lookup found */
    /* rows that cost more each buy a shallower extension */
    cb_spec_policy steep;
    cb_spec_policy_init(&steep);
    feed_costs(&steep, 5.0, 2.5, 20);
    feed_accept(&steep, b, cls, 16, 0.9);
    int ks = cb_spec_policy_k_ext(&steep, NULL, b, cls, &sp, 3, 12);
    CHECK_MSG(ks < k, "steep rows %d vs cheap rows %d", ks, k);
    /* a class that is rarely accepted does not pay as an extension */
    cb_spec_policy poor;
    cb_spec_policy_init(&poor);
    feed_costs(&poor, 5.0, 1.0, 20);
    feed_accept(&poor, b, 0, 16, 0.1);
    CHECK_MSG(cb_spec_policy_k_ext(&poor, NULL, b, 0, &sp, 3, 12) == 0, "acceptance 0.1 extended");
    /* adaptive off: what lookup found up to k_max; bad arguments decline */
    cb_spec_params fixed = sp;
    fixed.adaptive = 0;
    fixed.k_max = 5;
    CHECK(cb_spec_policy_k_ext(&poor, NULL, b, 0, &fixed, 3, 12) == 5);
    CHECK(cb_spec_policy_k_ext(&poor, NULL, b, 0, &fixed, 3, 2) == 2);
    CHECK(cb_spec_policy_k_ext(&p, NULL, b, CB_SPEC_N_CLASS, &sp, 3, 4) == 0);
    CHECK(cb_spec_policy_k_ext(&p, NULL, -1, 0, &sp, 3, 4) == 0);
    CHECK(cb_spec_policy_k_ext(&p, NULL, b, 0, &sp, 3, 0) == 0);
    CHECK(cb_spec_policy_k_ext(NULL, NULL, b, 0, &sp, 3, 4) == 0);
}

/* A request's own record of a lookup class moves the engine-wide estimate:
 * a request whose short matches keep failing (a docstring) stops verifying
 * them while the class still pays elsewhere; one whose matches hold drafts
 * at least as deep. */
static void test_policy_class_per_request(void) {
    cb_spec_params sp = { CB_SPEC_LOOKUP | CB_SPEC_DRAFT, 16, 1, 16, 2 };
    int b = cb_spec_bit(CB_SPEC_LOOKUP), cls = 1;
    cb_spec_policy p;
    cb_spec_policy_init(&p);
    feed_costs(&p, 5.0, 1.5, 20);   /* a verify row at 30% of a step */
    feed_accept(&p, b, cls, 16, 0.7);
    cb_spec_req bad, good;
    cb_spec_req_init(&bad);
    cb_spec_req_init(&good);
    for (int i = 0; i < 12; i++) {
        cb_spec_req_record_class(&bad, cls, 4, 0);
        cb_spec_req_record_class(&good, cls, 8, 8);
    }
    cb_spec_policy q1 = p, q2 = p, q3 = p;
    int k0 = cb_spec_policy_k_class_req(&q1, NULL, b, cls, &sp, 1, 16);
    int kb = cb_spec_policy_k_class_req(&q2, &bad, b, cls, &sp, 1, 16);
    int kg = cb_spec_policy_k_class_req(&q3, &good, b, cls, &sp, 1, 16);
    CHECK_MSG(k0 >= 1, "the class pays engine-wide (k %d)", k0);
    CHECK_MSG(kb == 0 && q2.st[b].expected_gain < 1.0, "a request whose matches fail still verifies k %d", kb);
    CHECK_MSG(kg >= k0, "a request whose matches hold drafts shallower: %d < %d", kg, k0);
    /* the extension price follows the request too */
    CHECK(cb_spec_policy_k_ext(&p, &bad, b, cls, &sp, 3, 12) == 0);
    CHECK(cb_spec_policy_k_ext(&p, &good, b, cls, &sp, 3, 12) >= cb_spec_policy_k_ext(&p, NULL, b, cls, &sp, 3, 12));
    /* out of range classes are ignored */
    cb_spec_req_record_class(&bad, CB_SPEC_N_CLASS, 4, 1);
    cb_spec_req_record_class(&bad, -1, 4, 1);
    cb_spec_req_record_class(NULL, 0, 4, 1);
    CHECK(bad.cls_tried[0][0] == 0);
}

static void feed_steps(cb_spec_policy *p, const double *ms, int n_rows) {
    for (int rep = 0; rep < 5; rep++)
        for (int r = 1; r <= n_rows; r++)
            if (ms[r] > 0) cb_spec_policy_step(p, r, ms[r]);
}

/* Prompt rows for a step that has decode rows, from synthetic step times. */
static void test_prompt_rows(void) {
    cb_spec_policy p;
    cb_spec_policy_init(&p);
    /* nothing measured, or only the decode rows' size: the caller's budget stands */
    CHECK(cb_spec_prompt_rows(&p, 1, 5, 0.25) == 0);
    cb_spec_policy_step(&p, 1, 10.0);
    CHECK(cb_spec_prompt_rows(&p, 1, 5, 0.25) == 0);
    cb_spec_policy_step(&p, 6, 20.0);
    CHECK(cb_spec_prompt_rows(&p, 1, 5, 0.25) > 0);

    /* streaming up to 4 rows, then each row dearer: within 25% of the 1-row step up to 4 rows (3 prompt rows) */
    static const double flat[] = { 0, 10, 10.5, 11, 11.5, 12.8, 14, 16, 18, 20, 22, 24, 26 };
    cb_spec_policy_init(&p);
    feed_steps(&p, flat, 12);
    CHECK_MSG(cb_spec_prompt_rows(&p, 1, 5, 0.25) == 3, "got %d", cb_spec_prompt_rows(&p, 1, 5, 0.25));
    CHECK(cb_spec_prompt_rows(&p, 1, 5, 0.10) == 2);   /* 3 rows: 11 ms <= 1.1 x 10 */
    CHECK(cb_spec_prompt_rows(&p, 1, 2, 0.25) == 2);   /* at most max_rows */
    CHECK(cb_spec_prompt_rows(&p, 1, 5, 1.0) == 5);    /* 6 rows: 14 ms <= 2 x 10 */
    CHECK(cb_spec_prompt_rows(&p, 4, 8, 0.25) == 2);   /* 4 rows 11.5: up to 14.375, 6 rows */
    /* once a row fits, a larger slack never gives fewer rows */
    for (int d = 1; d <= 6; d++)
        for (int i = 0; i < 20; i++)
            if (flat[d + 1] <= (1 + 0.05 * i) * flat[d])
                CHECK(cb_spec_prompt_rows(&p, d, 6, 0.05 * (i + 1)) >= cb_spec_prompt_rows(&p, d, 6, 0.05 * i));
    /* 4 decode rows, slack 5%: not one row fits (12.8 > 12.075); 2 rows add 1.25 ms a row, 1 row 1.3 */
    CHECK(cb_spec_prompt_rows(&p, 4, 6, 0.05) == 2);

    /* row tiles: 3 rows dearer than 4; the largest count that fits, past one that does not */
    static const double tiled[] = { 0, 10, 10.5, 15, 11, 20, 22, 25, 16 };
    cb_spec_policy_init(&p);
    feed_steps(&p, tiled, 8);
    CHECK(cb_spec_prompt_rows(&p, 1, 6, 0.25) == 3);

    /* no prompt row fits: the count that adds the least per prompt row (+10, +9, +7.7, +6.5, +7 ms a row) */
    static const double steep[] = { 0, 10, 20, 28, 33, 36, 45 };
    cb_spec_policy_init(&p);
    feed_steps(&p, steep, 6);
    CHECK_MSG(cb_spec_prompt_rows(&p, 1, 5, 0.25) == 4, "got %d", cb_spec_prompt_rows(&p, 1, 5, 0.25));
    CHECK(cb_spec_prompt_rows(&p, 1, 3, 0.25) == 3);
    /* linear cost, every count alike per row: the fewest rows */
    static const double linear[] = { 0, 10, 20, 30, 40, 50, 60 };
    cb_spec_policy_init(&p);
    feed_steps(&p, linear, 6);
    CHECK(cb_spec_prompt_rows(&p, 1, 5, 0.25) == 1);
    CHECK(cb_spec_prompt_rows(&p, 1, 5, 1.0) == 1);   /* 2 rows: 20 ms <= 2 x 10 */
    CHECK(cb_spec_prompt_rows(&p, 1, 5, 2.0) == 2);

    /* sizes not measured take the interpolation of the measured ones: 1 and 9 rows measured, 10 -> 18 ms */
    cb_spec_policy_init(&p);
    for (int rep = 0; rep < 5; rep++) { cb_spec_policy_step(&p, 1, 10.0); cb_spec_policy_step(&p, 9, 18.0); }
    CHECK(cb_spec_prompt_rows(&p, 1, 8, 0.25) == 2);   /* 3 rows ~12 ms, 4 rows ~13 ms */

    /* off or out of range: 0 */
    CHECK(cb_spec_prompt_rows(&p, 1, 8, -1.0) == 0);
    CHECK(cb_spec_prompt_rows(&p, 1, 8, 0.0 / 0.0) == 0);
    CHECK(cb_spec_prompt_rows(&p, 0, 8, 0.25) == 0);
    CHECK(cb_spec_prompt_rows(&p, 1, 0, 0.25) == 0);
    CHECK(cb_spec_prompt_rows(&p, CB_COST_BUCKETS, 8, 0.25) == 0);
    CHECK(cb_spec_prompt_rows(NULL, 1, 8, 0.25) == 0);
}

/* A free source whose drafts price above 1 per offer but whose offers are
 * rare (lookup on open chat) is paused once the share of steps it saved
 * over the window is below the floor, and comes back when its probes start
 * saving steps (copy-heavy text). */
static void test_policy_saving_floor(void) {
    cb_spec_params sp = { CB_SPEC_LOOKUP, 8, 1, 16, 2 };
    int b = cb_spec_bit(CB_SPEC_LOOKUP), cls = 1;
    cb_spec_policy p;
    cb_spec_policy_init(&p);
    feed_costs(&p, 40.0, 0.4, 12);     /* a verify row costs 1% of a step */
    feed_accept(&p, b, cls, 1, 0.18);  /* 18% acceptance at position 0 */
    CHECK(cb_spec_policy_saved(&p, b) < 0);  /* nothing counted yet */
    CHECK(cb_spec_policy_k_class_req(&p, NULL, b, cls, &sp, 1, 4) >= 1);  /* priced: it pays per offer */
    CHECK_MSG(p.st[b].expected_gain > 1.0, "gain %.3f", p.st[b].expected_gain);
    /* 400 decode steps, an offer every 20th, verified at depth 1 and accepted every 4th time */
    int offers = 0;
    for (int step = 0; step < 400; step++) {
        cb_spec_policy_consider(&p, b);
        if (step % 20) continue;
        offers++;
        int k = cb_spec_policy_k_class_req(&p, NULL, b, cls, &sp, 1, 4);
        if (k > 0) cb_spec_policy_record_class(&p, b, cls, 1, offers % 4 == 0);
    }
    double saved = cb_spec_policy_saved(&p, b);
    CHECK_MSG(saved >= 0 && saved < 0.03, "saved %.4f", saved);
    /* the gain per offer still prices above 1, yet the offers are declined */
    int k_rare = 0, n_rare = 32;
    for (int i = 0; i < n_rare; i++) k_rare += cb_spec_policy_k_class_req(&p, NULL, b, cls, &sp, 1, 4) > 0;
    CHECK(p.st[b].expected_gain > 1.0);
    CHECK_MSG(k_rare <= n_rare / 16 + 1, "%d of %d offers verified", k_rare, n_rare);
    CHECK(p.st[b].paused);
    /* copy-heavy text: an offer every step, each probe accepted */
    int late = 0;
    for (int step = 0; step < 1000; step++) {
        cb_spec_policy_consider(&p, b);
        int k = cb_spec_policy_k_class_req(&p, NULL, b, cls, &sp, 1, 4);
        if (k > 0) cb_spec_policy_record_class(&p, b, cls, k, k);
        if (step >= 900) late += k > 0;
    }
    CHECK_MSG(cb_spec_policy_saved(&p, b) > 0.03, "saved %.4f", cb_spec_policy_saved(&p, b));
    CHECK_MSG(late > 90, "%d of the last 100 offers verified", late);
    CHECK(!p.st[b].paused);
    /* not adaptive: the floor does not apply */
    cb_spec_policy q;
    cb_spec_policy_init(&q);
    cb_spec_params fixed = sp;
    fixed.adaptive = 0;
    for (int step = 0; step < 400; step++) cb_spec_policy_consider(&q, b);
    CHECK(cb_spec_policy_saved(&q, b) == 0.0);
    CHECK(cb_spec_policy_k_class_req(&q, NULL, b, cls, &fixed, 1, 4) == 4);
    CHECK(cb_spec_policy_saved(&q, -1) < 0);
    cb_spec_policy_consider(&q, 99);  /* out of range: ignored */
}

int main(void) {
    test_lookup_cases();
    test_lookup_random();
    test_policy_cost();
    test_policy_tiled_cost();
    test_policy_outlier();
    test_policy_skip_and_probe();
    test_policy_carry_forward();
    test_policy_longer_match_inherits();
    test_policy_plan_per_request();
    test_policy_extension();
    test_policy_saving_floor();
    test_policy_class_per_request();
    test_prompt_rows();
    return cb_test_report("test_spec");
}
