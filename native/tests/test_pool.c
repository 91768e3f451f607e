/*
 * test_pool.c — the thread pool runs every ith in [0, n) exactly once per
 * run, passes the right nth and ctx, survives many back-to-back runs, runs
 * after workers have gone to sleep, and frees cleanly (new/free cycles).
 */
#include "kernels.h"
#include "testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#define MAX_T 8

typedef struct {
    atomic_int hits[MAX_T];  /* times each ith ran in this run */
    atomic_int bad_nth;      /* calls that saw a wrong nth */
    int        expect_nth;   /* pool size */
    long       payload[MAX_T];/* written by ith, read by the caller after the run */
    long       run;          /* run number, written by the caller before the run */
    int        busy;         /* iterations of busy work per call (0: none) */
    pthread_t  caller;       /* thread that calls cb_pool_run */
    atomic_int off_caller;   /* calls executed on a thread other than the caller */
} job;

static void job_fn(void *ctx, int ith, int nth) {
    job *j = ctx;
    if (nth != j->expect_nth || ith < 0 || ith >= MAX_T) { atomic_fetch_add(&j->bad_nth, 1); return; }
    atomic_fetch_add(&j->hits[ith], 1);
    volatile long sink = 0;
    for (int i = 0; i < j->busy; i++) sink += i;
    j->payload[ith] = j->run * 100 + ith + 0 * sink;  /* plain write: run must publish it */
    if (!pthread_equal(pthread_self(), j->caller)) atomic_fetch_add(&j->off_caller, 1);
}

static void reset(job *j) {
    for (int i = 0; i < MAX_T; i++) { atomic_store(&j->hits[i], 0); j->payload[i] = -1; }
}

static int check_run(job *j, int n) {
    int ok = atomic_load(&j->bad_nth) == 0;
    for (int i = 0; i < MAX_T; i++) {
        const int want = i < n ? 1 : 0;
        if (atomic_load(&j->hits[i]) != want) ok = 0;
        if (i < n && j->payload[i] != j->run * 100 + i) ok = 0;
    }
    return ok;
}

static void sleep_ms(int ms) {
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

int main(void) {
    for (int n = 1; n <= 4; n++) {
        cb_pool *p = cb_pool_new(n);
        CHECK(p != NULL);
        if (!p) continue;
        CHECK(cb_pool_size(p) == n);
        job j;
        memset(&j, 0, sizeof(j));
        atomic_init(&j.bad_nth, 0);
        atomic_init(&j.off_caller, 0);
        j.caller = pthread_self();
        j.expect_nth = n;
        int bad = 0;
        /* many tiny runs: the decode pattern (fewer when the pool has more
         * threads than this 2-core machine has cores: each run then waits
         * for the scheduler) */
        const long n_runs = n <= 2 ? 20000 : 1000;
        for (long r = 0; r < n_runs; r++) {
            reset(&j);
            j.run = r;
            cb_pool_run(p, job_fn, &j);
            if (!check_run(&j, n)) bad++;
        }
        CHECK_MSG(bad == 0, "n=%d: %d runs with a missing or repeated ith", n, bad);
        /* with some work per share the workers must really take part (the
         * caller runs unclaimed shares itself, so this is not automatic) */
        j.busy = 20000;
        j.caller = pthread_self();
        atomic_store(&j.off_caller, 0);
        bad = 0;
        /* at least 300 runs, and up to ~2 s more until a worker has taken
         * part (on a loaded 2-core machine a worker can wait for a core) */
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (long r = 0; r < 300 || (n > 1 && atomic_load(&j.off_caller) == 0); r++) {
            clock_gettime(CLOCK_MONOTONIC, &t1);
            if (r >= 300 && (t1.tv_sec - t0.tv_sec) > 2) break;
            reset(&j);
            j.run = r;
            cb_pool_run(p, job_fn, &j);
            if (!check_run(&j, n)) bad++;
        }
        CHECK_MSG(bad == 0, "n=%d: busy runs with a missing or repeated ith", n);
        if (n > 1) CHECK_MSG(atomic_load(&j.off_caller) > 0, "n=%d: workers never ran a share", n);
        else CHECK(atomic_load(&j.off_caller) == 0);
        j.busy = 0;
        /* let workers fall asleep (spin limit is a few ms), then run again */
        sleep_ms(30);
        bad = 0;
        for (long r = 0; r < 5; r++) {
            reset(&j);
            j.run = 1000000 + r;
            cb_pool_run(p, job_fn, &j);
            if (!check_run(&j, n)) bad++;
            sleep_ms(8);
        }
        CHECK_MSG(bad == 0, "n=%d: runs after sleeping went wrong", n);
        cb_pool_free(p);
    }
    /* new/free cycles, including freeing a pool that never ran */
    int bad = 0;
    for (int c = 0; c < 50; c++) {
        const int n = 1 + c % 4;
        cb_pool *p = cb_pool_new(n);
        if (!p) { bad++; continue; }
        if (c % 3) {
            job j;
            memset(&j, 0, sizeof(j));
            atomic_init(&j.bad_nth, 0);
            j.expect_nth = n;
            reset(&j);
            j.run = c;
            cb_pool_run(p, job_fn, &j);
            if (!check_run(&j, n)) bad++;
        }
        cb_pool_free(p);
    }
    CHECK(bad == 0);
    cb_pool_free(NULL);
    CHECK(cb_pool_size(NULL) == 1);
    /* a non-positive size gives a single-threaded pool */
    cb_pool *p0 = cb_pool_new(0);
    CHECK(p0 != NULL && cb_pool_size(p0) == 1);
    cb_pool_free(p0);
    return cb_test_report("test_pool");
}
