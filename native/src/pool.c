/*
 * pool.c — persistent worker threads for cb_pool_run.
 *
 * Decode issues a few hundred runs per token, so a run must cost about a
 * microsecond: the caller publishes (fn, ctx) and bumps an atomic generation
 * counter that idle workers spin on; each worker claims its share ith with an
 * atomic exchange, runs it and decrements an atomic pending counter, and the
 * caller spins until pending reaches zero.  After its own share the caller
 * claims and runs every share no worker has claimed yet, so a run never waits
 * for a thread that is asleep or preempted (the machine's 2 cores are shared).
 * A worker that has spun for CB_POOL_SPIN_NS without a new generation goes to
 * sleep on a condition variable (so an idle engine burns no CPU); the caller
 * wakes sleepers only when some are registered, which keeps the hot path free
 * of syscalls.
 */
#include "kernels.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ volatile("yield" ::: "memory")
#else
#define cpu_relax() ((void)0)
#endif

/* How long an idle worker spins before sleeping. */
#define CB_POOL_SPIN_NS 2000000LL
/* Pause-spins before a waiting thread starts yielding the CPU between polls
 * (a thread we wait for may have been preempted: 2 cores are shared). */
#define CB_POOL_PAUSE_SPINS 4000

struct cb_pool;

typedef struct {
    struct cb_pool *pool;  /* owner */
    int             ith;   /* this worker's index in [1, n) */
    atomic_int      taken; /* 0: this run's share ith is unclaimed; 1: claimed (by the worker or the caller) */
    char            pad[64 - sizeof(void *) - 2 * sizeof(int)];  /* one cache line per worker */
} cb_worker;

struct cb_pool {
    int          n;          /* threads including the caller */
    pthread_t   *threads;    /* n - 1 workers */
    cb_worker   *workers;    /* n - 1 worker descriptors */
    int          started;    /* workers successfully created */
    cb_pool_fn   fn;         /* current job; written before gen is bumped */
    void        *ctx;        /* current job's argument */
    atomic_uint  gen;        /* bumped once per run (and once at shutdown) */
    atomic_int   pending;    /* workers that have not finished the current run */
    atomic_int   sleeping;   /* workers blocked (or about to block) on cv */
    atomic_int   stop;       /* 1: workers exit */
    pthread_mutex_t mu;      /* guards the sleep / wake handshake */
    pthread_cond_t  cv;      /* signalled when gen moves while workers sleep */
    int64_t      wait_ns;    /* caller time spent waiting for workers after its own share (sync cost) */
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Wait until gen differs from `seen`; returns the new generation. */
static unsigned wait_gen(struct cb_pool *p, unsigned seen) {
    int64_t t0 = 0;
    for (unsigned spins = 0;; spins++) {
        const unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen) return g;
        /* pause first (lowest latency); then also yield, so that when the
         * machine is oversubscribed the thread we wait for can run */
        if (spins < CB_POOL_PAUSE_SPINS) cpu_relax();
        else sched_yield();
        if ((spins & 255) == 255) {
            const int64_t t = now_ns();
            if (t0 == 0) t0 = t;
            else if (t - t0 > CB_POOL_SPIN_NS) break;
        }
    }
    /* Sleep.  sleeping is raised before gen is re-read (both seq_cst), and
     * the caller bumps gen before reading sleeping, so one of the two sees
     * the other: no lost wake-up. */
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleeping, 1);
    unsigned g;
    while ((g = atomic_load(&p->gen)) == seen) pthread_cond_wait(&p->cv, &p->mu);
    atomic_fetch_sub(&p->sleeping, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker_main(void *arg) {
    cb_worker *w = arg;
    struct cb_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        seen = wait_gen(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        /* The caller may already have run our share (we were late); the
         * exchange decides who runs it, exactly once. */
        if (atomic_exchange(&w->taken, 1) == 0) {
            p->fn(p->ctx, w->ith, p->n);
            atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
        }
    }
    return NULL;
}

static void bump_and_wake(struct cb_pool *p) {
    atomic_fetch_add(&p->gen, 1);  /* seq_cst, pairs with wait_gen */
    if (atomic_load(&p->sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

cb_pool *cb_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    struct cb_pool *p = calloc(1, sizeof(*p));
    if (!p) return NULL;
    p->n = n_threads;
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->sleeping, 0);
    atomic_init(&p->stop, 0);
    if (n_threads == 1) return p;  /* runs inline, no threads */
    if (pthread_mutex_init(&p->mu, NULL) != 0) { free(p); return NULL; }
    if (pthread_cond_init(&p->cv, NULL) != 0) {
        pthread_mutex_destroy(&p->mu); free(p); return NULL;
    }
    p->threads = calloc((size_t)(n_threads - 1), sizeof(pthread_t));
    p->workers = calloc((size_t)(n_threads - 1), sizeof(cb_worker));
    if (!p->threads || !p->workers) { cb_pool_free(p); return NULL; }
    for (int i = 0; i < n_threads - 1; i++) {
        p->workers[i].pool = p;
        p->workers[i].ith = i + 1;
        atomic_init(&p->workers[i].taken, 1);
        if (pthread_create(&p->threads[i], NULL, worker_main, &p->workers[i]) != 0) {
            cb_pool_free(p);
            return NULL;
        }
        p->started++;
    }
    return p;
}

void cb_pool_free(cb_pool *p) {
    if (!p) return;
    if (p->n > 1) {
        atomic_store(&p->stop, 1);
        bump_and_wake(p);
        for (int i = 0; i < p->started; i++) pthread_join(p->threads[i], NULL);
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
    }
    free(p->threads);
    free(p->workers);
    free(p);
}

int cb_pool_size(const cb_pool *p) { return p ? p->n : 1; }

void cb_pool_run(cb_pool *p, cb_pool_fn fn, void *ctx) {
    if (!p || p->n == 1) { fn(ctx, 0, 1); return; }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    for (int i = 0; i < p->n - 1; i++) atomic_store(&p->workers[i].taken, 0);
    bump_and_wake(p);  /* releases fn, ctx, pending and taken to the workers */
    fn(ctx, 0, p->n);
    /* Shares no worker has claimed yet (asleep, or preempted on a busy
     * machine) are run here rather than waited for: with work handed out in
     * chunks they are usually empty, and waiting for a descheduled thread
     * costs a scheduler tick. */
    for (int i = 0; i < p->n - 1; i++) {
        if (atomic_exchange(&p->workers[i].taken, 1) == 0) {
            fn(ctx, i + 1, p->n);
            atomic_fetch_sub_explicit(&p->pending, 1, memory_order_relaxed);
        }
    }
    if (atomic_load_explicit(&p->pending, memory_order_acquire) != 0) {
        int64_t t0 = now_ns();
        for (unsigned spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) != 0; spins++) {
            if (spins < CB_POOL_PAUSE_SPINS) cpu_relax();
            else sched_yield();
        }
        p->wait_ns += now_ns() - t0;
    }
}

double cb_pool_wait_ms(const cb_pool *p) { return p ? (double)p->wait_ns * 1e-6 : 0.0; }
