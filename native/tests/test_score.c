/*
 * test_score.c — scoring rows (native/src/score.c): log-probability of a
 * target, argmax and top-n against naive reference code (double-precision
 * log-softmax, a full sort), ties, NaN / infinities, short rows, and the
 * threaded batch giving the same bits as one thread.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "score.h"
#include "testutil.h"

static uint64_t lcg = 0x9e3779b97f4a7c15ULL;
static double uniform(void) {
    lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(lcg >> 11) * (1.0 / 9007199254740992.0);
}

static const float *sort_l;
/* descending logit, ascending id on ties */
static int cmp_ids(const void *pa, const void *pb) {
    int a = *(const int *)pa, b = *(const int *)pb;
    if (sort_l[a] > sort_l[b]) return -1;
    if (sort_l[a] < sort_l[b]) return 1;
    return a < b ? -1 : a > b;
}

/* Reference over finite rows: double log-softmax and full sort. */
static void check_row(const float *l, int n, int target, int n_top) {
    double m = -INFINITY;
    for (int i = 0; i < n; i++) if (l[i] > m) m = l[i];
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)l[i] - m);
    double lse = m + log(s);
    int *ids = malloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) ids[i] = i;
    sort_l = l;
    qsort(ids, (size_t)n, sizeof(int), cmp_ids);
    float lp; int32_t am; int32_t tt[CB_MAX_LOGPROBS]; float tl[CB_MAX_LOGPROBS];
    cb_score_row(l, n, target, n_top, &lp, &am, tt, tl);
    CHECK_MSG(fabs(lp - ((double)l[target] - lse)) < 2e-5 * (1 + fabs(lp)), "logprob %g vs %g", lp, (double)l[target] - lse);
    CHECK_MSG(am == ids[0], "argmax %d vs %d", am, ids[0]);
    int ok = 1;
    for (int j = 0; j < n_top && j < n; j++) {
        ok &= tt[j] == ids[j];
        ok &= fabs(tl[j] - ((double)l[ids[j]] - lse)) < 2e-5 * (1 + fabs(tl[j]));
    }
    CHECK_MSG(ok, "top-%d differs from the sorted reference (n=%d)", n_top, n);
    free(ids);
}

static void test_random_rows(void) {
    enum { N = 49152 };
    float *l = malloc(N * sizeof(float));
    for (int t = 0; t < 4; t++) {
        for (int i = 0; i < N; i++) l[i] = (float)(8.0 * uniform() - 4.0) * (float)(t + 1);
        check_row(l, N, (int)(uniform() * N), t == 0 ? 0 : t == 1 ? 1 : t == 2 ? 5 : CB_MAX_LOGPROBS);
    }
    free(l);
}

static void test_ties(void) {
    /* every logit equal: uniform distribution, ids in ascending order */
    float l[50];
    for (int i = 0; i < 50; i++) l[i] = 1.5f;
    float lp; int32_t am; int32_t tt[CB_MAX_LOGPROBS]; float tl[CB_MAX_LOGPROBS];
    cb_score_row(l, 50, 37, 10, &lp, &am, tt, tl);
    CHECK(am == 0);
    CHECK(fabsf(lp - (float)-log(50.0)) < 1e-6f);
    int asc = 1;
    for (int j = 0; j < 10; j++) asc &= tt[j] == j && fabsf(tl[j] - lp) < 1e-7f;
    CHECK(asc);
    /* ties among the best: 7 and 3 share the max, 9 and 1 the second value */
    float r[12] = { 0, 2, 0, 5, 0, 0, 0, 5, 0, 2, 0, 0 };
    cb_score_row(r, 12, 9, 4, &lp, &am, tt, tl);
    CHECK(am == 3);
    CHECK(tt[0] == 3 && tt[1] == 7 && tt[2] == 1 && tt[3] == 9);
    CHECK(tl[0] == tl[1] && tl[2] == tl[3] && tl[0] > tl[2]);
    CHECK(lp == tl[3]);
    check_row(r, 12, 9, 4);
}

static void test_special_values(void) {
    float lp; int32_t am; int32_t tt[CB_MAX_LOGPROBS]; float tl[CB_MAX_LOGPROBS];
    /* NaN never wins and scores -inf; -inf entries are skipped in the top list */
    float l[6] = { NAN, 1.0f, -INFINITY, 3.0f, NAN, 2.0f };
    cb_score_row(l, 6, 0, 5, &lp, &am, tt, tl);
    CHECK(am == 3);
    CHECK(lp == -INFINITY);
    CHECK(tt[0] == 3 && tt[1] == 5 && tt[2] == 1);
    CHECK(tt[3] == -1 && tt[4] == -1 && tl[3] == -INFINITY);  /* only 3 scorable tokens */
    double lse = 3.0 + log(1.0 + exp(-1.0) + exp(-2.0));
    CHECK(fabs(tl[0] - (3.0 - lse)) < 1e-6);
    cb_score_row(l, 6, 2, 0, &lp, &am, tt, tl);
    CHECK(lp == -INFINITY && am == 3);
    /* every entry -inf or NaN: nothing can be scored */
    float d[3] = { -INFINITY, NAN, -INFINITY };
    cb_score_row(d, 3, 1, 2, &lp, &am, tt, tl);
    CHECK(am == -1 && lp == -INFINITY && tt[0] == -1 && tt[1] == -1);
    /* +inf is clamped to FLT_MAX (finite results, no inf - inf) */
    float p[3] = { INFINITY, 0.0f, 1.0f };
    cb_score_row(p, 3, 0, 2, &lp, &am, tt, tl);
    CHECK(am == 0 && lp == 0.0f && tt[1] == 2 && tl[1] == -FLT_MAX);
    /* n_top out of range is clamped */
    float q[30];
    for (int i = 0; i < 30; i++) q[i] = (float)i;
    cb_score_row(q, 30, 0, 1000, &lp, &am, tt, tl);
    CHECK(am == 29 && tt[CB_MAX_LOGPROBS - 1] == 29 - (CB_MAX_LOGPROBS - 1));
}

static void test_batch_threads(void) {
    enum { N = 3000, R = 37, K = 7 };
    float *rows = malloc((size_t)R * N * sizeof(float));
    int32_t tgt[R];
    for (int i = 0; i < R * N; i++) rows[i] = (float)(10.0 * uniform() - 5.0);
    for (int r = 0; r < R; r++) tgt[r] = (int32_t)(uniform() * N);
    float lp1[R], lp3[R], tl1[R * K], tl3[R * K];
    int32_t am1[R], am3[R], tt1[R * K], tt3[R * K];
    cb_score_batch(NULL, rows, R, N, tgt, K, lp1, am1, tt1, tl1);
    cb_pool *pool = cb_pool_new(3);
    CHECK(pool != NULL);
    cb_score_batch(pool, rows, R, N, tgt, K, lp3, am3, tt3, tl3);
    cb_pool_free(pool);
    CHECK(memcmp(lp1, lp3, sizeof lp1) == 0 && memcmp(am1, am3, sizeof am1) == 0);
    CHECK(memcmp(tt1, tt3, sizeof tt1) == 0 && memcmp(tl1, tl3, sizeof tl1) == 0);
    /* row r of the batch is cb_score_row of row r */
    float lp; int32_t am; int32_t tt[CB_MAX_LOGPROBS]; float tl[CB_MAX_LOGPROBS];
    cb_score_row(rows + (size_t)17 * N, N, tgt[17], K, &lp, &am, tt, tl);
    CHECK(lp == lp1[17] && am == am1[17] && memcmp(tt, tt1 + 17 * K, K * sizeof(int32_t)) == 0);
    check_row(rows + (size_t)5 * N, N, tgt[5], K);
    free(rows);
}

int main(void) {
    test_random_rows();
    test_ties();
    test_special_values();
    test_batch_threads();
    return cb_test_report("test_score");
}
