/*
 * grammar_match.c — the matcher: a parse state is a set of stacks of element
 * positions, interned; transitions on a byte are memoized per state (a
 * lazily built DFA); masks walk the vocabulary trie (see grammar.c for the
 * overview, grammar_impl.h for the plain-token fast path).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include "grammar_impl.h"

/* ------------------------------------------------------------ matcher */

/* An interned parse state.  Its stacks live in the pool's arena as
 * [len, pos_0 .. pos_len-1] per stack (bottom first, top last), sorted so
 * that equal sets have equal encodings. */
typedef struct {
    uint32_t off;       /* first word in the arena */
    uint32_t nwords;    /* words of stack data */
    uint32_t nstacks;   /* stacks (0 = dead) */
    uint32_t hash;      /* over data + partial fields */
    uint32_t pval;      /* partial code point: bits decoded so far */
    uint8_t  prem;      /* continuation bytes still expected (0 = at a code point boundary) */
    uint8_t  plen;      /* total bytes of the partial code point's encoding */
    uint8_t  accepting; /* 1: prem == 0 and some stack is empty */
} mstate;

/* One of the two state pools (the copying collector moves live states from
 * one to the other). */
typedef struct {
    mstate   *st;       /* [M_MAX_STATES] */
    uint32_t *arena;    /* [M_ARENA_WORDS] */
    uint32_t *mc;       /* [M_MAX_STATES] per state: bytes in its shortest completion (0 iff accepting;
                         * G_MC_INF for the dead state or when saturated).  Apart from mstate so the
                         * mask walk's per-node lookup stays in an 8 KiB array (L1). */
    uint32_t  n_st;     /* states in use (id 0 = dead) */
    uint32_t  n_words;  /* arena words in use */
} mpool;

struct cb_matcher {
    const cb_grammar *g;
    mpool     pool[2];     /* pool[cur_pool] is live */
    int       cur_pool;
    int32_t  *ht;          /* [2 * M_MAX_STATES] state hash table: id or -1 */
    uint16_t *trans;       /* [M_MAX_STATES * 256] next state per byte, M_UNKNOWN = not computed */
    uint16_t *remap;       /* [M_MAX_STATES] collector scratch */
    /* transition builder (scratch, reused) */
    uint32_t *bw;          /* [M_BUILD_WORDS] stack words */
    uint32_t  bw_n;
    uint32_t *bs_off;      /* [M_BUILD_STACKS] stack i = bw[bs_off[i]] .. + bs_len[i] */
    uint32_t *bs_len;
    uint32_t  bs_n;
    int32_t  *vis;         /* [2 * M_BUILD_STACKS] dedupe table of builder stacks: index, valid iff vis_gen matches */
    uint32_t *vis_gen;     /* [2 * M_BUILD_STACKS] generation that wrote the slot (no clearing per transition) */
    uint32_t  gen;         /* current builder generation */
    uint32_t *todo;        /* [M_BUILD_STACKS] */
    uint32_t *res;         /* [M_BUILD_STACKS] result stacks */
    uint32_t *out;         /* [M_BUILD_WORDS] encoded result */
    /* parse position */
    uint16_t  cur;         /* current state id */
    uint8_t   finished;    /* 1: an end-of-generation token was accepted */
    uint16_t  hist_st[M_HIST];  /* ring: state before each of the last accepted tokens */
    uint8_t   hist_fin[M_HIST]; /* ... and its finished flag */
    int       hist_head;   /* next ring slot to write */
    int       hist_n;      /* valid entries (<= M_HIST) */
    /* in-flight walk: states per trie depth (collector roots while walking) */
    uint16_t *walk;        /* [max_depth + 2] */
    int       walk_n;      /* live entries of walk */
    /* mask cache (LRU over state ids) */
    uint32_t  n_words;     /* mask words */
    uint32_t *mc_mask;     /* [M_MASK_CACHE * n_words] */
    uint32_t *xbuf;        /* [n_words] plain_mask scratch */
    int32_t   mc_key[M_MASK_CACHE];   /* state id or -1 */
    int32_t   mc_count[M_MASK_CACHE]; /* allowed tokens */
    uint32_t  mc_budget[M_MASK_CACHE];/* budget the mask was computed for (G_MC_UNLIMITED = none) */
    uint32_t  mc_maxmc[M_MASK_CACHE]; /* unbudgeted entries: largest shortest-completion over the allowed tokens' end states */
    uint64_t  mc_used[M_MASK_CACHE];  /* last use tick */
    uint64_t  tick;
    cb_matcher_stats stats;
};

/* Does terminal e match some code point in [lo, hi]?  Class ranges are
 * sorted and disjoint: binary search for the first range ending >= lo. */
static int term_overlaps(const cb_grammar *g, const gelem *e, uint32_t lo, uint32_t hi) {
    if (e->type == GE_CHAR) return e->value >= lo && e->value <= hi;
    uint32_t a = g->cls_off[e->value], b = g->cls_off[e->value + 1];
    uint32_t i = a, j = b;
    while (i < j) {
        uint32_t mid = i + (j - i) / 2;
        if (g->rng[2 * mid + 1] < lo) i = mid + 1; else j = mid;
    }
    return i < b && g->rng[2 * i] <= hi;
}

/* Does terminal e match every code point of [lo, hi]?  (Ranges sorted and
 * disjoint; adjacent ranges may be split, which only makes this say no.) */
static int term_covers(const cb_grammar *g, const gelem *e, uint32_t lo, uint32_t hi) {
    if (e->type == GE_CHAR) return e->value == lo && lo == hi;
    uint32_t a = g->cls_off[e->value], b = g->cls_off[e->value + 1];
    uint32_t i = a, j = b;
    while (i < j) {
        uint32_t mid = i + (j - i) / 2;
        if (g->rng[2 * mid + 1] < lo) i = mid + 1; else j = mid;
    }
    return i < b && g->rng[2 * i] <= lo && g->rng[2 * i + 1] >= hi;
}

static uint32_t hash_words(const uint32_t *w, uint32_t n, uint32_t seed) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ seed;
    for (uint32_t i = 0; i < n; i++) { h ^= w[i]; h *= 0x100000001B3ull; h ^= h >> 29; }
    return (uint32_t)(h ^ (h >> 32));
}

static void ht_clear(cb_matcher *m) { memset(m->ht, 0xFF, 2 * M_MAX_STATES * sizeof *m->ht); }

/* Intern (words, partial) in the live pool.  Returns the id, or ERR_FULL. */
static int intern(cb_matcher *m, const uint32_t *w, uint32_t nw, uint32_t ns,
                  uint32_t pval, uint8_t prem, uint8_t plen) {
    mpool *P = &m->pool[m->cur_pool];
    uint32_t h = hash_words(w, nw, pval * 31u + prem * 7u + plen);
    uint32_t mask = 2 * M_MAX_STATES - 1, slot = h & mask;
    for (;; slot = (slot + 1) & mask) {
        int32_t id = m->ht[slot];
        if (id < 0) break;
        const mstate *s = &P->st[id];
        if (s->hash == h && s->nwords == nw && s->nstacks == ns && s->pval == pval && s->prem == prem &&
            s->plen == plen && (nw == 0 || memcmp(P->arena + s->off, w, nw * sizeof *w) == 0))
            return id;
    }
    if (P->n_st >= M_MAX_STATES || P->n_words + nw > M_ARENA_WORDS) return ERR_FULL;
    uint32_t id = P->n_st++;
    mstate *s = &P->st[id];
    s->off = P->n_words;
    s->nwords = nw;
    s->nstacks = ns;
    s->hash = h;
    s->pval = pval; s->prem = prem; s->plen = plen;
    s->accepting = 0;
    if (prem == 0)
        for (uint32_t i = 0; i < nw; i += 1 + w[i]) if (w[i] == 0) { s->accepting = 1; break; }
    /* Shortest completion: min over stacks of the sum of rem over the stack
     * (each position is where its frame continues).  Inside a code point the
     * top terminal is being matched: its rest costs the prem bytes still
     * expected, then the rest of its alternative from top + 1 (stacks whose
     * top cannot match these bytes were already dropped). */
    uint32_t best = G_MC_INF;
    const uint32_t *rem = m->g->rem;
    for (uint32_t i = 0; i < nw && best; i += 1 + w[i]) {
        uint32_t len = w[i], c = 0;
        if (len) {
            uint32_t top = w[i + len];
            c = prem ? mc_add(prem, rem[top + 1]) : rem[top];
            for (uint32_t j = 1; j < len && c < best; j++) c = mc_add(c, rem[w[i + j]]);
        }
        if (c < best) best = c;
    }
    P->mc[id] = best;
    if (nw) memcpy(P->arena + P->n_words, w, nw * sizeof *w);
    P->n_words += nw;
    m->ht[slot] = (int32_t)id;
    memset(m->trans + (size_t)id * 256, 0xFF, 256 * sizeof *m->trans);
    return (int)id;
}

static void mask_cache_clear(cb_matcher *m) {
    for (int i = 0; i < M_MASK_CACHE; i++) { m->mc_key[i] = -1; m->mc_used[i] = 0; }
}

/* Copying collection: move the states reachable from the roots (current,
 * history, in-flight walk, *extra) into the other pool, renumber them, and
 * drop every cached transition and mask.  A first pass sizes the live set,
 * so a collection either completes or changes nothing (CB_ERR_UNSUPPORTED:
 * the live states alone do not fit a pool). */
static int collect(cb_matcher *m, uint16_t *extra) {
    mpool *from = &m->pool[m->cur_pool];
    int extra_in_walk = extra && extra >= m->walk && extra < m->walk + m->walk_n;
    if (extra_in_walk) extra = NULL;  /* do not renumber it twice */
    /* pass 1: size the live set (remap used as a seen-mark) */
    for (uint32_t i = 0; i < from->n_st; i++) m->remap[i] = M_UNKNOWN;
    uint64_t words = 0;
    uint32_t states = 1;
#define SIZE(id) do { uint16_t id_ = (id); \
        if (id_ && m->remap[id_] == M_UNKNOWN) { m->remap[id_] = 0; states++; words += from->st[id_].nwords; } } while (0)
    SIZE(m->cur);
    for (int i = 0; i < m->hist_n; i++) SIZE(m->hist_st[(m->hist_head - 1 - i + 2 * M_HIST) % M_HIST]);
    for (int i = 0; i < m->walk_n; i++) SIZE(m->walk[i]);
    if (extra) SIZE(*extra);
#undef SIZE
    if (states > M_MAX_STATES / 2 || words > M_ARENA_WORDS / 2) return CB_ERR_UNSUPPORTED;
    /* pass 2: move */
    m->cur_pool ^= 1;
    mpool *to = &m->pool[m->cur_pool];
    to->n_st = 0;
    to->n_words = 0;
    ht_clear(m);
    for (uint32_t i = 0; i < from->n_st; i++) m->remap[i] = M_UNKNOWN;
    m->stats.gcs++;
    intern(m, NULL, 0, 0, 0, 0, 0);  /* the dead state keeps id 0 */
    m->remap[0] = 0;
#define MOVE(ref) do { \
        uint16_t old_ = (ref); \
        if (m->remap[old_] == M_UNKNOWN) { \
            const mstate *s_ = &from->st[old_]; \
            m->remap[old_] = (uint16_t)intern(m, from->arena + s_->off, s_->nwords, s_->nstacks, s_->pval, s_->prem, s_->plen); \
        } \
        (ref) = m->remap[old_]; \
    } while (0)
    MOVE(m->cur);
    for (int i = 0; i < m->hist_n; i++) MOVE(m->hist_st[(m->hist_head - 1 - i + 2 * M_HIST) % M_HIST]);
    for (int i = 0; i < m->walk_n; i++) MOVE(m->walk[i]);
    if (extra) MOVE(*extra);
#undef MOVE
    mask_cache_clear(m);
    return CB_OK;
}

/* --- the transition builder --- */

static void build_reset(cb_matcher *m) {
    m->bw_n = 0;
    m->bs_n = 0;
    if (++m->gen == 0) {  /* wrapped: really clear once */
        memset(m->vis_gen, 0, 2 * M_BUILD_STACKS * sizeof *m->vis_gen);
        m->gen = 1;
    }
}

/* Add the stack base[0..nb) + (x if hx) + (y if hy) to the builder unless an
 * identical one was seen in this transition.  Returns its index, -1 if seen,
 * or a negative status (bounds). */
static int build_push(cb_matcher *m, const uint32_t *base, uint32_t nb, uint32_t x, int hx, uint32_t y, int hy) {
    uint32_t len = nb + (hx ? 1 : 0) + (hy ? 1 : 0);
    if (len > M_MAX_DEPTH) return CB_ERR_UNSUPPORTED;
    if (m->bs_n >= M_BUILD_STACKS || m->bw_n + len > M_BUILD_WORDS) return CB_ERR_UNSUPPORTED;
    uint32_t *w = m->bw + m->bw_n;
    if (nb) memmove(w, base, nb * sizeof *w);  /* base may lie in bw */
    uint32_t k = nb;
    if (hx) w[k++] = x;
    if (hy) w[k++] = y;
    uint32_t h = hash_words(w, len, len), mask = 2 * M_BUILD_STACKS - 1;
    for (uint32_t slot = h & mask;; slot = (slot + 1) & mask) {
        if (m->vis_gen[slot] != m->gen) { m->vis_gen[slot] = m->gen; m->vis[slot] = (int32_t)m->bs_n; break; }
        int32_t j = m->vis[slot];
        if (m->bs_len[j] == len && memcmp(m->bw + m->bs_off[j], w, len * sizeof *w) == 0) return -1;
    }
    m->bs_off[m->bs_n] = m->bw_n;
    m->bs_len[m->bs_n] = len;
    m->bw_n += len;
    return (int)m->bs_n++;
}

/* Expand the pending stacks (todo[0..nt)) until every top is a terminal
 * (or the stack is empty), collecting those into res.  Iterative, with the
 * visited set stopping cycles of tail references. */
static int build_close(cb_matcher *m, uint32_t nt, uint32_t *n_res) {
    const cb_grammar *g = m->g;
    uint32_t nr = 0;
    while (nt) {
        uint32_t i = m->todo[--nt];
        uint32_t len = m->bs_len[i];
        const uint32_t *w = m->bw + m->bs_off[i];
        if (len == 0 || g->el[w[len - 1]].type != GE_REF) {
            if (nr >= M_MAX_RESULT) return CB_ERR_UNSUPPORTED;
            m->res[nr++] = i;
            continue;
        }
        uint32_t top = w[len - 1];
        uint32_t r = g->el[top].value;
        int hc = !is_eos(&g->el[top + 1]);
        for (uint32_t a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) {
            uint32_t pos = g->alt_pos[a];
            int j = build_push(m, m->bw + m->bs_off[i], len - 1, top + 1, hc, pos, !is_eos(&g->el[pos]));
            if (j < -1) return j;
            if (j >= 0) {
                if (nt >= M_BUILD_STACKS) return CB_ERR_UNSUPPORTED;
                m->todo[nt++] = (uint32_t)j;
            }
        }
    }
    *n_res = nr;
    return CB_OK;
}

/* Encode res (sorted for a canonical form) into m->out; returns words. */
static int res_cmp(const cb_matcher *m, uint32_t a, uint32_t b) {
    uint32_t la = m->bs_len[a], lb = m->bs_len[b];
    if (la != lb) return la < lb ? -1 : 1;
    return memcmp(m->bw + m->bs_off[a], m->bw + m->bs_off[b], la * sizeof(uint32_t));
}

static uint32_t build_encode(cb_matcher *m, uint32_t nr) {
    for (uint32_t i = 1; i < nr; i++) {  /* insertion sort: sets are small */
        uint32_t x = m->res[i], j = i;
        while (j > 0 && res_cmp(m, m->res[j - 1], x) > 0) { m->res[j] = m->res[j - 1]; j--; }
        m->res[j] = x;
    }
    uint32_t n = 0;
    for (uint32_t i = 0; i < nr; i++) {
        uint32_t s = m->res[i];
        m->out[n++] = m->bs_len[s];
        memcpy(m->out + n, m->bw + m->bs_off[s], m->bs_len[s] * sizeof(uint32_t));
        n += m->bs_len[s];
    }
    return n;
}

/* Compute the state after `byte` from state `sid` (slow path). */
static int compute_trans(cb_matcher *m, uint16_t *sid, uint8_t byte) {
    static const uint32_t minv[5] = {0, 0, 0x80, 0x800, 0x10000};
    const cb_grammar *g = m->g;
    const mpool *P = &m->pool[m->cur_pool];
    const mstate *s = &P->st[*sid];
    m->stats.transitions++;
    uint32_t pval = s->pval;
    uint8_t prem = s->prem, plen = s->plen;
    int full = 0, any = pval == M_PV_ANY;
    if (prem == 0) {
        if (byte < 0x80) { pval = byte; full = 1; }
        else if ((byte & 0xE0) == 0xC0) { pval = byte & 0x1F; prem = 1; plen = 2; }
        else if ((byte & 0xF0) == 0xE0) { pval = byte & 0x0F; prem = 2; plen = 3; }
        else if ((byte & 0xF8) == 0xF0) { pval = byte & 0x07; prem = 3; plen = 4; }
        else return 0;
    } else {
        if ((byte & 0xC0) != 0x80) return 0;
        if (!any) pval = (pval << 6) | (byte & 0x3F);
        prem--;
        if (prem == 0) {
            full = 1;
            /* overlong forms and surrogates are not UTF-8 */
            if (!any && (pval < minv[plen] || (pval >= 0xD800 && pval <= 0xDFFF))) return 0;
        }
    }
    const uint32_t *sw = P->arena + s->off;
    uint32_t snw = s->nwords;
    uint32_t nw = 0, ns = 0;
    if (!full && any) {
        /* every stack's top admits every completion (see below): same stacks */
        memcpy(m->out, sw, snw * sizeof *sw);
        nw = snw;
        ns = s->nstacks;
    } else if (!full) {
        /* keep the stacks whose top can still match a code point starting
         * with these bytes: [lo, hi], clipped to what the length can encode */
        uint32_t lo0 = pval << (6 * prem), hi0 = lo0 | ((1u << (6 * prem)) - 1);
        uint32_t lo = lo0 < minv[plen] ? minv[plen] : lo0, hi = hi0 > G_MAX_CP ? G_MAX_CP : hi0;
        if (lo > hi) return 0;
        int covered = lo == lo0 && hi == hi0 && (hi < 0xD800 || lo > 0xDFFF);
        for (uint32_t i = 0; i < snw; i += 1 + sw[i]) {
            uint32_t len = sw[i];
            if (len == 0 || !term_overlaps(g, &g->el[sw[i + len]], lo, hi)) continue;
            if (covered && !term_covers(g, &g->el[sw[i + len]], lo, hi)) covered = 0;
            memcpy(m->out + nw, sw + i, (1 + len) * sizeof *sw);
            nw += 1 + len;
            ns++;
        }
        if (!ns) return 0;
        /* Every completion of these bytes is valid UTF-8 and matches every
         * kept top: what follows cannot depend on which code point it is,
         * so all such prefixes share one state (M_PV_ANY) instead of one per
         * prefix (thousands on a CJK-rich vocabulary: the walk's slow part). */
        if (covered) pval = M_PV_ANY;
    } else {
        uint32_t cp = pval;
        build_reset(m);
        uint32_t nt = 0;
        for (uint32_t i = 0; i < snw; i += 1 + sw[i]) {
            uint32_t len = sw[i];
            if (len == 0) continue;
            uint32_t top = sw[i + len];
            if (!any && !term_overlaps(g, &g->el[top], cp, cp)) continue;
            int j = build_push(m, sw + i + 1, len - 1, top + 1, !is_eos(&g->el[top + 1]), 0, 0);
            if (j < -1) return j;
            if (j >= 0) m->todo[nt++] = (uint32_t)j;
        }
        if (!nt) return 0;
        uint32_t nr;
        int rc = build_close(m, nt, &nr);
        if (rc) return rc;
        if (!nr) return 0;
        nw = build_encode(m, nr);
        ns = nr;
        pval = 0; prem = 0; plen = 0;
    }
    int id = intern(m, m->out, nw, ns, pval, prem, plen);
    if (id == ERR_FULL) {
        int rc = collect(m, sid);
        if (rc) return rc;
        id = intern(m, m->out, nw, ns, pval, prem, plen);
        if (id == ERR_FULL) return CB_ERR_UNSUPPORTED;  /* live states + this one exceed a pool */
    }
    return id;
}

/* Next state from *sid on byte (cached).  *sid may be renumbered by a
 * collection, as may every registered root. */
static inline int step(cb_matcher *m, uint16_t *sid, uint8_t byte) {
    uint16_t t = m->trans[(size_t)*sid * 256 + byte];
    if (t != M_UNKNOWN) return t;
    int id = compute_trans(m, sid, byte);
    if (id < 0) return id;
    m->trans[(size_t)*sid * 256 + byte] = (uint16_t)id;
    return id;
}

static int initial_state(cb_matcher *m) {
    const cb_grammar *g = m->g;
    build_reset(m);
    uint32_t nt = 0;
    for (uint32_t a = g->alt_off[g->root]; a < g->alt_off[g->root + 1]; a++) {
        uint32_t pos = g->alt_pos[a];
        int j = build_push(m, NULL, 0, pos, !is_eos(&g->el[pos]), 0, 0);
        if (j < -1) return j;
        if (j >= 0) m->todo[nt++] = (uint32_t)j;
    }
    uint32_t nr;
    int rc = build_close(m, nt, &nr);
    if (rc) return rc;
    uint32_t nw = build_encode(m, nr);
    return intern(m, m->out, nw, nr, 0, 0, 0);
}

void cb_matcher_free(cb_matcher *m) {
    if (!m) return;
    for (int i = 0; i < 2; i++) { free(m->pool[i].st); free(m->pool[i].arena); free(m->pool[i].mc); }
    free(m->ht); free(m->trans); free(m->remap);
    free(m->bw); free(m->bs_off); free(m->bs_len); free(m->vis); free(m->vis_gen); free(m->todo); free(m->res); free(m->out);
    free(m->walk); free(m->mc_mask); free(m->xbuf);
    free(m);
}

/* Memory: two pools (2 x (2048 x (24 + 4) B + 1 MiB)), the transition table
 * (2048 x 256 x 2 B = 1 MiB), builder scratch (~0.6 MiB) and the mask cache
 * (16 masks): about 4 MiB per matcher. */
int cb_matcher_new(const cb_grammar *g, cb_matcher **out) {
    if (!out) return CB_ERR_ARG;
    *out = NULL;
    if (!g) return CB_ERR_ARG;
    cb_matcher *m = calloc(1, sizeof *m);
    if (!m) return CB_ERR_NOMEM;
    m->g = g;
    for (int i = 0; i < 2; i++) {
        m->pool[i].st = malloc(M_MAX_STATES * sizeof(mstate));
        m->pool[i].mc = malloc(M_MAX_STATES * sizeof *m->pool[i].mc);
        m->pool[i].arena = malloc(M_ARENA_WORDS * sizeof(uint32_t));
    }
    m->ht = malloc(2 * M_MAX_STATES * sizeof *m->ht);
    m->trans = malloc((size_t)M_MAX_STATES * 256 * sizeof *m->trans);
    m->remap = malloc(M_MAX_STATES * sizeof *m->remap);
    m->bw = malloc(M_BUILD_WORDS * sizeof *m->bw);
    m->bs_off = malloc(M_BUILD_STACKS * sizeof *m->bs_off);
    m->bs_len = malloc(M_BUILD_STACKS * sizeof *m->bs_len);
    m->vis = malloc(2 * M_BUILD_STACKS * sizeof *m->vis);
    m->vis_gen = calloc(2 * M_BUILD_STACKS, sizeof *m->vis_gen);
    m->todo = malloc(M_BUILD_STACKS * sizeof *m->todo);
    m->res = malloc(M_BUILD_STACKS * sizeof *m->res);
    m->out = malloc(M_BUILD_WORDS * sizeof *m->out);
    m->walk = malloc(((size_t)g->v->max_depth + 2) * sizeof *m->walk);
    m->n_words = ((uint32_t)g->n_vocab + 31) / 32;
    m->mc_mask = malloc((size_t)M_MASK_CACHE * (m->n_words ? m->n_words : 1) * sizeof *m->mc_mask);
    m->xbuf = malloc((m->n_words ? m->n_words : 1) * sizeof *m->xbuf);
    if (!m->pool[0].st || !m->pool[0].arena || !m->pool[0].mc || !m->pool[1].st || !m->pool[1].arena || !m->pool[1].mc || !m->ht || !m->trans ||
        !m->remap || !m->bw || !m->bs_off || !m->bs_len || !m->vis || !m->vis_gen || !m->todo || !m->res || !m->out ||
        !m->walk || !m->mc_mask || !m->xbuf) {
        cb_matcher_free(m);
        return CB_ERR_NOMEM;
    }
    ht_clear(m);
    mask_cache_clear(m);
    if (intern(m, NULL, 0, 0, 0, 0, 0) != 0) { cb_matcher_free(m); return CB_ERR_NOMEM; }
    int id = initial_state(m);
    if (id <= 0) { cb_matcher_free(m); return id < 0 && id != ERR_FULL ? id : CB_ERR_UNSUPPORTED; }
    m->cur = (uint16_t)id;
    *out = m;
    return CB_OK;
}

int cb_matcher_is_accepting(const cb_matcher *m) {
    if (!m) return 0;
    return m->pool[m->cur_pool].st[m->cur].accepting;
}

static void hist_push(cb_matcher *m) {
    m->hist_st[m->hist_head] = m->cur;
    m->hist_fin[m->hist_head] = m->finished;
    m->hist_head = (m->hist_head + 1) % M_HIST;
    if (m->hist_n < M_HIST) m->hist_n++;
}

/* Run bytes from the current state; the result (or 0 = dead) in *res.
 * walk[0] holds the running state so a collection renumbers it. */
static int run_bytes(cb_matcher *m, const uint8_t *b, size_t n, uint16_t *res) {
    m->walk[0] = m->cur;
    m->walk_n = 1;
    for (size_t i = 0; i < n; i++) {
        int s = step(m, &m->walk[0], b[i]);
        if (s < 0) { m->walk_n = 0; return s; }
        m->walk[0] = (uint16_t)s;
        if (s == 0) break;
    }
    *res = m->walk[0];
    m->walk_n = 0;
    return CB_OK;
}

int cb_matcher_accept_bytes(cb_matcher *m, const uint8_t *bytes, size_t n) {
    if (!m || (!bytes && n) || m->finished) return CB_ERR_ARG;
    uint16_t s;
    int rc = run_bytes(m, bytes, n, &s);
    if (rc) return rc;
    if (s == 0) return CB_ERR_ARG;
    hist_push(m);
    m->cur = s;
    return CB_OK;
}

int cb_matcher_accept(cb_matcher *m, int token) {
    if (!m) return CB_ERR_ARG;
    const cb_grammar *g = m->g;
    if (token < 0 || token >= g->n_vocab || m->finished) return CB_ERR_ARG;
    if (g->v->tok_kind[token] == 2) {
        if (!cb_matcher_is_accepting(m)) return CB_ERR_ARG;
        hist_push(m);
        m->finished = 1;
        return CB_OK;
    }
    if (g->v->tok_kind[token] != 0) return CB_ERR_ARG;
    return cb_matcher_accept_bytes(m, g->v->tok_bytes + g->v->tok_off[token], g->v->tok_off[token + 1] - g->v->tok_off[token]);
}

int cb_matcher_rollback(cb_matcher *m, int n) {
    if (!m || n < 0 || n > m->hist_n) return CB_ERR_ARG;
    if (n == 0) return CB_OK;
    int k = (m->hist_head - n + M_HIST) % M_HIST;
    m->cur = m->hist_st[k];
    m->finished = m->hist_fin[k];
    m->hist_head = k;
    m->hist_n -= n;
    return CB_OK;
}

/* The grammar's shared mask cache (see struct cb_grammar).  The lock is
 * held only to compare keys and copy one mask. */
static int shared_lookup(cb_matcher *m, uint32_t *mask, uint32_t *maxmc) {
    cb_grammar *g = (cb_grammar *)m->g;  /* only the synchronized cache is written */
    const mstate *s = &m->pool[m->cur_pool].st[m->cur];
    if (s->nwords > G_SC_KEY) return -1;
    const uint32_t *key = m->pool[m->cur_pool].arena + s->off;
    uint32_t part = s->pval | (uint32_t)s->prem << 24 | (uint32_t)s->plen << 28;
    int count = -1;
    pthread_mutex_lock(&g->sc.lock);
    for (int i = 0; i < G_SC_N; i++)
        if (g->sc.nkey[i] == s->nwords && g->sc.hash[i] == s->hash && g->sc.part[i] == part &&
            memcmp(g->sc.key + (size_t)i * G_SC_KEY, key, s->nwords * sizeof *key) == 0) {
            memcpy(mask, g->sc.mask + (size_t)i * g->sc.words, g->sc.words * sizeof *mask);
            g->sc.used[i] = ++g->sc.tick;
            count = g->sc.count[i];
            *maxmc = g->sc.maxmc[i];
            break;
        }
    pthread_mutex_unlock(&g->sc.lock);
    if (count >= 0) m->stats.shared_hits++;
    return count;
}

static void shared_store(cb_matcher *m, const uint32_t *mask, int count, uint32_t maxmc) {
    cb_grammar *g = (cb_grammar *)m->g;
    const mstate *s = &m->pool[m->cur_pool].st[m->cur];
    if (s->nwords > G_SC_KEY) return;
    const uint32_t *key = m->pool[m->cur_pool].arena + s->off;
    pthread_mutex_lock(&g->sc.lock);
    int lru = 0;
    for (int i = 1; i < G_SC_N; i++) if (g->sc.used[i] < g->sc.used[lru]) lru = i;
    g->sc.nkey[lru] = s->nwords;
    g->sc.hash[lru] = s->hash;
    g->sc.part[lru] = s->pval | (uint32_t)s->prem << 24 | (uint32_t)s->plen << 28;
    g->sc.count[lru] = count;
    g->sc.maxmc[lru] = maxmc;
    g->sc.used[lru] = ++g->sc.tick;
    if (s->nwords) memcpy(g->sc.key + (size_t)lru * G_SC_KEY, key, s->nwords * sizeof *key);
    memcpy(g->sc.mask + (size_t)lru * g->sc.words, mask, g->sc.words * sizeof *mask);
    pthread_mutex_unlock(&g->sc.lock);
}

/* What plain_mask set by length, for the walk to skip (see plain_mask):
 * the plain tokens whose first code point is in U_1 (first, first_high)
 * and which hold nothing of rest_out (gtrie.sub bits) after it. */
typedef struct {
    int      on;
    uint64_t first[2];
    int      first_high;
    uint64_t rest_out[2];
} pskip;

/* The mask walk: preorder over the trie, one cached transition per node,
 * a dead state skips the node's whole subtree; with skip (from
 * plain_mask), so does a subtree whose plain tokens plain_mask set by
 * length (its other tokens are in the `rest` trie, walked too).  With a
 * budget (anything below G_MC_UNLIMITED) a token is set only if its end
 * state's shortest completion is within the budget; since one byte lowers
 * the shortest completion by at most one, a node whose state needs more
 * than budget + (bytes still below it in the trie) skips its subtree too.
 * *maxmc gets the largest shortest completion over the set tokens' end
 * states. */
static int walk_trie(cb_matcher *m, const gtrie *tr, const pskip *skip, uint32_t *mask, uint32_t budget,
                     uint32_t *maxmc) {
    const uint64_t *sub = skip ? tr->sub : NULL;
    const uint64_t s0 = skip ? skip->rest_out[0] : 0, s1 = skip ? skip->rest_out[1] : 0;
    int first_ok = 0;  /* the plain tokens under the current depth-1 node start in U_1 */
    const uint8_t *byte = tr->byte;
    const uint16_t *depth = tr->depth, *maxd = tr->maxd;
    const uint32_t *end = tr->end, *toff = tr->tok_off;
    const int32_t *tok = tr->tok;
    uint16_t *st = m->walk;
    const uint16_t *trans = m->trans;
    const uint32_t *mcs = m->pool[m->cur_pool].mc;
    uint32_t n = tr->n_nodes, i = 0, visited = 0, hi = 0;
    int count = 0;
    st[0] = m->cur;
    m->walk_n = 1;
    while (i < n) {
        uint32_t d = depth[i];
        visited++;
        if (sub) {
            if (d == 1) {
                uint8_t c = byte[i];  /* below 0x20, '"', '\\', 0x80..0xBF: no plain token starts so */
                first_ok = c < 0x80 ? !(G_P_ASCII[c >> 6] >> (c & 63) & 1) || (skip->first[c >> 6] >> (c & 63) & 1)
                         : c < 0xC0 || skip->first_high;
            }
            if (first_ok && !(sub[2 * i] & s0) && !(sub[2 * i + 1] & s1)) { i = end[i]; continue; }  /* set by length */
        }
        uint16_t t = trans[(size_t)st[d - 1] * 256 + byte[i]];
        if (t == M_UNKNOWN) {
            m->walk_n = (int)d;  /* st[0..d) are live */
            int s = step(m, &st[d - 1], byte[i]);
            if (s < 0) { m->walk_n = 0; return s; }
            t = (uint16_t)s;
            trans = m->trans;
            mcs = m->pool[m->cur_pool].mc;  /* a collection switches pools */
        }
        if (t == 0) { i = end[i]; continue; }
        uint32_t mc = mcs[t];
        if (mc > budget) {
            if (mc > budget + (uint32_t)(maxd[i] - d)) { i = end[i]; continue; }
        } else if (toff[i] < toff[i + 1]) {
            if (mc > hi) hi = mc;
            for (uint32_t k = toff[i]; k < toff[i + 1]; k++) {
                int32_t id = tok[k];
                uint32_t b = 1u << (id & 31);
                if (!(mask[id >> 5] & b)) { mask[id >> 5] |= b; count++; }  /* plain ones may be set already */
            }
        }
        st[d] = t;
        i++;
    }
    m->walk_n = 0;
    m->stats.trie_nodes += visited;
    *maxmc = hi;
    return count;
}

/* An atom of a state: code points of P on which it steps the same way,
 * the ASCII ones in a (bit c of word c >> 6) and, if high, all of P above
 * 0x7F. */
typedef struct { uint64_t a[2]; int high; } patom;

static int atom_has(const patom *u, int c) { return (int)(u->a[c >> 6] >> (c & 63) & 1); }
static int atom_size(const patom *u) { return __builtin_popcountll(u->a[0]) + __builtin_popcountll(u->a[1]); }

/* The candidate atoms of state sid, best first (see plain_mask): the one
 * holding P above 0x7F when some stack top admits it and an ASCII code
 * point is in it too, then the largest ASCII-only ones.  Each comes with a
 * representative ASCII code point (rep).  Returns how many (<= cap), 0 when
 * a partial code point is pending or a top admits only part of P above
 * 0x7F (no atom spans it: the state is not split this way), or -1 when no
 * top admits any code point of P (P is one atom, and it dies). */
static int state_atoms(const cb_matcher *m, uint16_t sid, patom *out, int *rep, int cap) {
    const cb_grammar *g = m->g;
    const mpool *P = &m->pool[m->cur_pool];
    const mstate *s = &P->st[sid];
    if (s->prem) return 0;
    const uint32_t *w = P->arena + s->off;
    patom hi = { { G_P_ASCII[0], G_P_ASCII[1] }, 1 };
    int any_high = 0, any_p = 0;
    for (uint32_t i = 0; i < s->nwords; i += 1 + w[i]) {
        if (!w[i]) continue;
        uint64_t a[2];
        int h = term_p(g, &g->el[w[i + w[i]]], a);
        if (h == GP_PART) return 0;
        if (h == GP_ALL || a[0] || a[1]) any_p = 1;
        if (h == GP_ALL) any_high = 1;
        else { a[0] = ~a[0]; a[1] = ~a[1]; }
        hi.a[0] &= a[0];
        hi.a[1] &= a[1];
    }
    if (!any_p) return -1;
    int n = 0;
    uint64_t left[2] = { G_P_ASCII[0], G_P_ASCII[1] };
    if (any_high && (hi.a[0] | hi.a[1])) {
        out[n] = hi;
        rep[n++] = atom_has(&hi, 'a') ? 'a' : hi.a[0] ? __builtin_ctzll(hi.a[0]) : 64 + __builtin_ctzll(hi.a[1]);
    }
    left[0] &= ~hi.a[0];
    left[1] &= ~hi.a[1];
    /* the ASCII-only atoms: split what is left by each top's membership */
    patom best[4];
    int brep[4], nb = 0;
    while (left[0] | left[1]) {
        int r = left[0] ? __builtin_ctzll(left[0]) : 64 + __builtin_ctzll(left[1]);
        patom u = { { left[0], left[1] }, 0 };
        for (uint32_t i = 0; i < s->nwords; i += 1 + w[i]) {
            if (!w[i]) continue;
            uint64_t a[2];
            term_p(g, &g->el[w[i + w[i]]], a);
            if (!(a[r >> 6] >> (r & 63) & 1)) { a[0] = ~a[0]; a[1] = ~a[1]; }
            u.a[0] &= a[0];
            u.a[1] &= a[1];
        }
        left[0] &= ~u.a[0];
        left[1] &= ~u.a[1];
        /* keep the largest few, by insertion */
        if (nb == 4 && atom_size(&best[3]) >= atom_size(&u)) continue;
        int k = nb < 4 ? nb++ : 3;
        while (k > 0 && atom_size(&best[k - 1]) < atom_size(&u)) { best[k] = best[k - 1]; brep[k] = brep[k - 1]; k--; }
        best[k] = u;
        brep[k] = r;
    }
    for (int k = 0; k < nb && n < cap; k++) { out[n] = best[k]; rep[n++] = brep[k]; }
    return n;
}

/* Fewest tokens the fast path must cover to be taken (a sixteenth of the
 * plain ones): below that, a walk whose dead first bytes prune the trie is
 * cheaper than building the rows. */
#define G_PLAIN_MIN_COVER(v) ((v)->n_plain / 16)

/* The plain-token fast path.  From the current state S = S_0, step a chain
 * S_0 -> S_1 -> ... : S_l+1 is S_l's successor on any code point of an
 * atom U_l+1 of S_l (state_atoms; the first candidate whose successor is
 * alive, stepped on its representative).  A plain token of L code points,
 * the first in U_1 and the others in U_rest (the intersection of the later
 * atoms), ends in S_L, so such tokens are allowed by length alone.  The
 * tokens that are not plain are the vocabulary's `rest` trie; unless U_1 =
 * U_rest = P, the other plain tokens are found by a walk of the whole trie
 * that skips the subtrees whose plain tokens were all set here (*skip).
 * Returns 1 and sets the plain tokens into mask (count and *hi updated)
 * when it applies, 0 when it does not (S_0 is not split into atoms, its
 * chosen atom dies, covers few tokens, or the chain dies after S_1), or a
 * negative status. */
static int plain_mask(cb_matcher *m, uint32_t *mask, uint32_t budget, uint32_t *hi, int *count, pskip *skip) {
    const gvocab *v = m->g->v;
    if (!v->n_plain) return 0;
    int lmax = v->max_depth < G_PLAIN_MAX ? v->max_depth : G_PLAIN_MAX;
    uint16_t *ch = m->walk;  /* chain states; collection roots while stepping */
    ch[0] = m->cur;
    int alive = 0;  /* chain states 1..alive are live */
    patom u1 = { { 0, 0 }, 0 }, ur = { { G_P_ASCII[0], G_P_ASCII[1] }, 1 };
    for (int l = 1; l <= lmax; l++) {
        patom cand[3];
        int rep[3];
        int nc = state_atoms(m, ch[l - 1], cand, rep, 3);
        if (nc < 0) {  /* dead on all of P: what is longer than l - 1 dies */
            if (l == 1) { m->walk_n = 0; return 0; }
            ch[l] = 0;
            break;
        }
        if (!nc) {
            if (l == 1) { m->walk_n = 0; return 0; }
            /* tokens longer than l - 1 are left to the walk: treat S_l as
             * reached by no code point (U_rest empty of P: nothing longer is set or skipped) */
            ur.a[0] = ur.a[1] = 0;
            ur.high = 0;
            break;
        }
        int k = 0, s = 0;
        m->walk_n = l;
        for (; k < nc; k++) {
            s = step(m, &ch[l - 1], (uint8_t)rep[k]);
            if (s < 0) { m->walk_n = 0; return s; }
            if (s) break;
        }
        if (k == nc) k = 0;  /* every candidate dies: tokens in the first one die at S_l */
        if (l == 1) {
            u1 = cand[k];
            uint32_t cover = u1.high ? v->n_first[G_PROW_HIGH] : 0;
            for (int c = 0x20; c < 0x80; c++) if (atom_has(&u1, c)) cover += v->n_first[c - 0x20];
            if (!s || cover < G_PLAIN_MIN_COVER(v)) { m->walk_n = 0; return 0; }
        } else {
            ur.a[0] &= cand[k].a[0];
            ur.a[1] &= cand[k].a[1];
            ur.high &= cand[k].high;
        }
        ch[l] = (uint16_t)s;
        if (s == 0) break;  /* longer plain tokens die here too */
        alive = l;
    }
    m->walk_n = 0;
    /* A chain that dies after one code point sets only one-code-point tokens:
     * the walk finds them as cheaply (the state dies a byte later), while the
     * rows cost a pass over the whole mask. */
    if (alive < 2) return 0;
    const uint32_t *mcs = m->pool[m->cur_pool].mc;
    uint32_t nw = v->n_words;
    int all_in = 1;
    for (int l = 1; l <= alive; l++) if (mcs[ch[l]] > budget) all_in = 0;
    for (int l = 1; l <= alive; l++) {  /* a length may have lost all its tokens to the atoms: *hi may be high, which is safe */
        uint32_t mc = mcs[ch[l]];
        if (mc <= budget && v->n_plain_len[l] && mc > *hi) *hi = mc;
    }
    m->stats.plain_masks++;
    int whole = u1.high && ur.high && u1.a[0] == G_P_ASCII[0] && u1.a[1] == G_P_ASCII[1] &&
                ur.a[0] == G_P_ASCII[0] && ur.a[1] == G_P_ASCII[1];
    skip->on = !whole;
    skip->first[0] = u1.a[0];
    skip->first[1] = u1.a[1];
    skip->first_high = u1.high;
    skip->rest_out[0] = (G_P_ASCII[0] & ~ur.a[0]) | (ur.high ? 0 : G_SUB_HIGH);
    skip->rest_out[1] = G_P_ASCII[1] & ~ur.a[1];
    if (whole) {
        if (all_in) {
            const uint32_t *u = v->plain_upto + (size_t)(alive - 1) * nw;
            for (uint32_t j = 0; j < nw; j++) mask[j] |= u[j];
        }
        for (int l = 1; l <= alive; l++) {
            if (mcs[ch[l]] > budget || !v->n_plain_len[l]) continue;
            if (!all_in) {
                const uint32_t *w = v->plain + (size_t)(l - 1) * nw;
                for (uint32_t j = 0; j < nw; j++) mask[j] |= w[j];
            }
            *count += (int)v->n_plain_len[l];
        }
        return 1;
    }
    /* keep = plain tokens starting in U_1 (from the rows in U_1 or from
     * those outside it, whichever are fewer) with nothing outside U_rest
     * after that */
    uint32_t *keep = m->xbuf;
    int n_in = atom_size(&u1) + u1.high, inside = n_in <= G_PROWS - 2 - n_in;  /* P: 94 ASCII rows + 1 high */
    memset(keep, inside ? 0 : 0xFF, nw * sizeof *keep);
    for (int row = 0; row < G_PROWS; row++) {
        int c = row + 0x20, in = row == G_PROW_HIGH ? u1.high : atom_has(&u1, c);
        if ((row != G_PROW_HIGH && !(G_P_ASCII[c >> 6] >> (c & 63) & 1)) || in != inside) continue;
        const uint32_t *h = v->plain_first + (size_t)row * nw;
        if (inside) for (uint32_t j = 0; j < nw; j++) keep[j] |= h[j];
        else for (uint32_t j = 0; j < nw; j++) keep[j] &= ~h[j];
    }
    for (int row = 0; row < G_PROWS; row++) {
        int c = row + 0x20, out = row == G_PROW_HIGH ? !ur.high : (G_P_ASCII[c >> 6] >> (c & 63) & 1) && !atom_has(&ur, c);
        if (!out) continue;
        const uint32_t *h = v->plain_rest + (size_t)row * nw;
        for (uint32_t j = 0; j < nw; j++) keep[j] &= ~h[j];
    }
    int n = 0;
    for (int l = all_in ? alive : 1; l <= alive; l++) {  /* all in the budget: the cumulative row once */
        if (!all_in && (mcs[ch[l]] > budget || !v->n_plain_len[l])) continue;
        const uint32_t *u = (all_in ? v->plain_upto : v->plain) + (size_t)(l - 1) * nw;
        for (uint32_t j = 0; j < nw; j++) { uint32_t w = u[j] & keep[j]; mask[j] |= w; n += __builtin_popcount(w); }
    }
    *count += n;
    return 1;
}

/* Every text token the current state allows within the budget: the plain
 * fast path and a walk of the rest, or a walk of the whole trie. */
static int walk_vocab(cb_matcher *m, uint32_t *mask, uint32_t budget, uint32_t *maxmc) {
    uint32_t hi = 0;
    int count = 0;
    pskip skip;
    int fast = plain_mask(m, mask, budget, &hi, &count, &skip);
    if (fast < 0) return fast;
    uint32_t h2 = 0, h3 = 0;
    int c2 = walk_trie(m, fast ? &m->g->v->rest : &m->g->v->all, NULL, mask, budget, &h2);
    if (c2 < 0) return c2;
    if (fast && skip.on) {
        int c3 = walk_trie(m, &m->g->v->all, &skip, mask, budget, &h3);
        if (c3 < 0) return c3;
        c2 += c3;
        if (h3 > h2) h2 = h3;
    }
    *maxmc = h2 > hi ? h2 : hi;
    return count + c2;
}

static void mask_cache_put(cb_matcher *m, const uint32_t *mask, int count, uint32_t budget, uint32_t maxmc) {
    int lru = 0;
    for (int i = 1; i < M_MASK_CACHE; i++) if (m->mc_used[i] < m->mc_used[lru]) lru = i;
    m->mc_key[lru] = m->cur;
    m->mc_count[lru] = count;
    m->mc_budget[lru] = budget;
    m->mc_maxmc[lru] = maxmc;
    m->mc_used[lru] = m->tick;
    memcpy(m->mc_mask + (size_t)lru * m->n_words, mask, m->n_words * sizeof *mask);
}

static int mask_cache_get(cb_matcher *m, uint32_t *mask, uint32_t budget, uint32_t *maxmc) {
    for (int i = 0; i < M_MASK_CACHE; i++)
        if (m->mc_key[i] == m->cur && m->mc_budget[i] == budget) {
            memcpy(mask, m->mc_mask + (size_t)i * m->n_words, m->n_words * sizeof *mask);
            m->mc_used[i] = m->tick;
            m->stats.mask_cache_hits++;
            *maxmc = m->mc_maxmc[i];
            return m->mc_count[i];
        }
    return -1;
}

static void add_eog(const cb_matcher *m, uint32_t *mask, int *count) {
    const cb_grammar *g = m->g;
    if (!cb_matcher_is_accepting(m)) return;
    for (int i = 0; i < g->v->n_eog; i++) { int id = g->v->eog_ids[i]; mask[id >> 5] |= 1u << (id & 31); (*count)++; }
}

/* The unbudgeted mask of the current state (not finished): matcher cache,
 * shared cache, or a walk; *maxmc as in walk_trie. */
static int mask_unbudgeted(cb_matcher *m, uint32_t *mask, uint32_t *maxmc) {
    int count = mask_cache_get(m, mask, G_MC_UNLIMITED, maxmc);
    if (count >= 0) return count;
    count = shared_lookup(m, mask, maxmc);
    if (count < 0) {
        memset(mask, 0, m->n_words * sizeof *mask);
        count = walk_vocab(m, mask, G_MC_UNLIMITED, maxmc);
        if (count < 0) return count;
        add_eog(m, mask, &count);  /* EOG ends in a finished state: shortest completion 0, maxmc unchanged */
        shared_store(m, mask, count, *maxmc);
    }
    mask_cache_put(m, mask, count, G_MC_UNLIMITED, *maxmc);
    return count;
}

int cb_matcher_fill_mask(cb_matcher *m, uint32_t *mask) {
    return cb_matcher_fill_mask_budget(m, mask, -1);
}

/* Budgeted masks.  The unbudgeted mask of a state is cached with the
 * largest shortest completion among its tokens' end states (maxmc); a
 * budget >= maxmc changes nothing and is served from it, which is the
 * common case (budgets are usually far above what the output still needs).
 * Below maxmc a pruned walk computes the mask, cached under (state, budget)
 * in the matcher's LRU only (not shared: budgets rarely repeat across
 * requests).
 *
 * Why this guarantees completion (the caller passes budget = tokens it may
 * still emit after this one): every token set here leads to a state whose
 * shortest completion c <= budget.  If that state has shortest completion
 * c > 0 its first byte b is the start of a shortest completion; the
 * single-byte token for b leads to a state needing c - 1 <= budget - 1, so
 * it is allowed on the next call, and so on down to c = 0 (accepting), where
 * an end-of-generation token is allowed.  This needs a single-byte token for
 * every byte a shortest completion can contain: byte-level BPE vocabularies
 * (GPT-2 style, SmolLM2, Llama 3, Qwen) have one for each of the 256 bytes
 * except, in some, bytes that never occur in valid UTF-8 (0xC0, 0xC1,
 * 0xF5..0xFF), which no completion contains since the matcher only follows
 * valid UTF-8.  A vocabulary without them (SentencePiece without byte
 * fallback) can still empty the mask; the caller reports it as a dead end. */
int cb_matcher_fill_mask_budget(cb_matcher *m, uint32_t *mask, int budget) {
    if (!m || !mask) return CB_ERR_ARG;
    m->stats.mask_calls++;
    if (m->finished) { memset(mask, 0, m->n_words * sizeof *mask); return 0; }
    m->tick++;
    uint32_t b = budget < 0 || (uint32_t)budget >= G_MC_INF ? G_MC_UNLIMITED : (uint32_t)budget;
    /* A budget below the current shortest completion cannot be met in bytes
     * (tokens of several bytes may still make it): keep only tokens that
     * shorten the completion, never an empty mask, so the output gets as
     * close to complete as the budget allows.  A saturated completion gives
     * no measure of progress: no budget then. */
    uint32_t cur_mc = m->pool[m->cur_pool].mc[m->cur];
    if (b < cur_mc) b = cur_mc >= G_MC_INF ? G_MC_UNLIMITED : cur_mc - 1;
    uint32_t maxmc;
    int count = mask_unbudgeted(m, mask, &maxmc);
    if (count < 0 || b >= maxmc) return count;
    count = mask_cache_get(m, mask, b, &maxmc);
    if (count >= 0) return count;
    m->stats.budget_walks++;
    memset(mask, 0, m->n_words * sizeof *mask);
    count = walk_vocab(m, mask, b, &maxmc);
    if (count < 0) return count;
    add_eog(m, mask, &count);  /* accepting: EOG needs no further token */
    mask_cache_put(m, mask, count, b, maxmc);
    return count;
}

int cb_matcher_min_completion(const cb_matcher *m) {
    if (!m) return -1;
    if (m->finished) return 0;
    uint32_t mc = m->pool[m->cur_pool].mc[m->cur];
    return (int)mc;  /* G_MC_INF (2^30 - 1) = saturated: at least that many */
}

int cb_matcher_state_key(const cb_matcher *m, uint32_t *out, int cap) {
    if (!m || !out || cap < 5) return -1;
    const mstate *s = &m->pool[m->cur_pool].st[m->cur];
    if ((uint64_t)s->nwords + 5 > (uint64_t)cap) return -1;
    out[0] = m->finished;
    out[1] = s->pval;
    out[2] = s->prem;
    out[3] = s->plen;
    out[4] = s->nwords;
    if (s->nwords) memcpy(out + 5, m->pool[m->cur_pool].arena + s->off, s->nwords * sizeof *out);
    return (int)s->nwords + 5;
}

int cb_matcher_forced_bytes(const cb_matcher *cm, uint8_t *out, int cap) {
    if (!cm || (!out && cap > 0)) return 0;
    /* logically const: only the caches (interned states, transitions) change */
    cb_matcher *m = (cb_matcher *)cm;
    if (m->finished) return 0;
    int n = 0;
    m->walk[0] = m->cur;
    m->walk_n = 1;
    while (n < cap) {
        const mstate *s = &m->pool[m->cur_pool].st[m->walk[0]];
        if (s->accepting) break;
        int only = -1, nalive = 0;
        for (int b = 0; b < 256 && nalive < 2; b++) {
            int t = step(m, &m->walk[0], (uint8_t)b);
            if (t < 0) { nalive = 2; break; }
            if (t) { nalive++; only = b; }
        }
        if (nalive != 1) break;
        /* step again: a collection during the scan may have renumbered states */
        int t = step(m, &m->walk[0], (uint8_t)only);
        if (t <= 0) break;
        out[n++] = (uint8_t)only;
        m->walk[0] = (uint16_t)t;
    }
    m->walk_n = 0;
    return n;
}

void cb_matcher_get_stats(const cb_matcher *m, cb_matcher_stats *out) {
    if (!m || !out) return;
    *out = m->stats;
    out->n_states = m->pool[m->cur_pool].n_st;
    out->trie_size = m->g->v->all.n_nodes;
}
