/*
 * grammar.c — GBNF grammars compiled against a vocabulary: the rule tables
 * (grammar_parse.c), shortest completions, how each terminal meets the
 * plain JSON-string characters, the shared vocabulary (grammar_vocab.c);
 * the matcher is grammar_match.c.  The overview of the whole pipeline:
 *
 * Pipeline
 *   text ──parse──▶ rules of elements (llama.cpp's shape: CHAR, CLASS, REF,
 *   ALT, END), repetitions expanded into generated rules ──analyse──▶
 *   productive / nullable rules, left recursion rejected ──flatten──▶ one
 *   element array + per-rule alternative starts.  The vocabulary is a byte
 *   trie stored in preorder (each node knows where its subtree ends), built
 *   once per model and shared by its grammars (grammar_vocab.c).
 *
 * Matcher
 *   A parse state is a set of stacks of element positions (top = the next
 *   terminal to match; an empty stack = accepted), plus a partial UTF-8 code
 *   point (tokens may end inside a code point).  States are interned, and
 *   transitions on a byte are memoized per state (a lazily built DFA over
 *   the PDA's reachable configurations), so the mask walk over the trie
 *   costs one table lookup per visited node and prunes a whole subtree as
 *   soon as the state is dead.  Masks are memoized per state id in a small
 *   LRU (a mask is a pure function of the state), and in a small cache
 *   the grammar shares across its matchers (keyed by state encoding, under a
 *   mutex: the one mutable part of a compiled grammar, so a grammar may be
 *   shared across threads); every other cache lives in the matcher and all
 *   its buffers are allocated in cb_matcher_new.  When the state pool fills
 *   up, live states (current, history, in-flight walk) are copied into a
 *   second pool and the caches are dropped (a copying collection).
 *
 * Token budgets
 *   At compile time every element position gets the fewest bytes that
 *   finish its alternative (compute_min_lengths); an interned state stores
 *   its shortest completion (min over stacks of the sum over frames).
 *   cb_matcher_fill_mask_budget drops tokens whose end state needs more
 *   than the budget, so an output capped at max_tokens still ends in a
 *   complete sentence (the argument is at cb_matcher_fill_mask_budget).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include "grammar_impl.h"
#include "model.h"

/* ------------------------------------------------------------ shortest completions */


static uint32_t utf8_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

/* Fewest bytes a terminal can match: a literal code point's UTF-8 length; a
 * class's smallest code point's (ranges are sorted, so the first lo), i.e. 1
 * for any class admitting an ASCII character. */
static uint32_t term_min_bytes(const cb_grammar *g, const gelem *e) {
    if (e->type == GE_CHAR) return utf8_len(e->value);
    uint32_t a = g->cls_off[e->value];
    return a < g->cls_off[e->value + 1] ? utf8_len(g->rng[2 * a]) : G_MC_INF;
}

/* Shortest string (in bytes) each rule derives, then g->rem.  A rule's
 * length is the min over its productive alternatives of the sum of their
 * elements' lengths: a least fixpoint of min/+ equations with non-negative
 * terms, solved exactly by Knuth's generalization of Dijkstra (1977): an
 * alternative's length is final once every rule it references is final;
 * the smallest tentative rule length is then final too.  O(E log A),
 * whatever the rule order or recursion (iterating sweeps to a fixpoint
 * could take one sweep per rule of a long repetition chain). */
static int compute_min_lengths(cb_grammar *g) {
    uint32_t R = g->n_rules, A = g->alt_off[R];
    int rc = CB_ERR_NOMEM;
    uint32_t *len = malloc(((size_t)R + 1) * sizeof *len);        /* final rule lengths */
    uint8_t  *done = calloc((size_t)R + 1, 1);
    uint32_t *base = malloc(((size_t)A + 1) * sizeof *base);      /* alternative: sum of its known parts */
    uint32_t *pend = calloc((size_t)A + 1, sizeof *pend);         /* alternative: references not yet final */
    uint32_t *owner = malloc(((size_t)A + 1) * sizeof *owner);    /* alternative -> its rule */
    uint32_t *occ_off = calloc((size_t)R + 2, sizeof *occ_off);   /* rule -> its occurrences (CSR) */
    uint32_t *occ = NULL;                                         /* alternatives referencing each rule, per occurrence */
    uint32_t *hv = malloc(((size_t)A + 1) * sizeof *hv), *hr = malloc(((size_t)A + 1) * sizeof *hr);  /* min-heap (length, rule) */
    g->rem = malloc(((size_t)g->n_el + 1) * sizeof *g->rem);
    if (!len || !done || !base || !pend || !owner || !occ_off || !hv || !hr || !g->rem) goto out;
    size_t n_occ = 0;
    for (uint32_t r = 0; r < R; r++)
        for (uint32_t a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) {
            owner[a] = r;
            base[a] = 0;
            for (uint32_t p = g->alt_pos[a]; !is_eos(&g->el[p]); p++) {
                const gelem *e = &g->el[p];
                if (e->type == GE_REF) { pend[a]++; occ_off[e->value + 1]++; n_occ++; }
                else base[a] = mc_add(base[a], term_min_bytes(g, e));
            }
        }
    for (uint32_t r = 0; r < R; r++) occ_off[r + 1] += occ_off[r];
    occ = malloc((n_occ ? n_occ : 1) * sizeof *occ);
    if (!occ) goto out;
    for (uint32_t r = 0; r < R; r++) len[r] = occ_off[r];  /* fill cursors (len reused) */
    for (uint32_t a = 0; a < A; a++)
        for (uint32_t p = g->alt_pos[a]; !is_eos(&g->el[p]); p++)
            if (g->el[p].type == GE_REF) occ[len[g->el[p].value]++] = a;
    uint32_t hn = 0;
#define HPUSH(v_, r_) do {         uint32_t i_ = hn++;         while (i_ && hv[(i_ - 1) / 2] > (v_)) { hv[i_] = hv[(i_ - 1) / 2]; hr[i_] = hr[(i_ - 1) / 2]; i_ = (i_ - 1) / 2; }         hv[i_] = (v_); hr[i_] = (r_);     } while (0)
    for (uint32_t a = 0; a < A; a++) if (!pend[a]) HPUSH(base[a], owner[a]);
    for (uint32_t r = 0; r < R; r++) len[r] = G_MC_INF;
    while (hn) {
        uint32_t v = hv[0], r = hr[0];
        /* pop: move the last entry down from the root */
        uint32_t lv = hv[--hn], lr = hr[hn], i = 0;
        for (;;) {
            uint32_t c = 2 * i + 1;
            if (c >= hn) break;
            if (c + 1 < hn && hv[c + 1] < hv[c]) c++;
            if (hv[c] >= lv) break;
            hv[i] = hv[c]; hr[i] = hr[c]; i = c;
        }
        hv[i] = lv; hr[i] = lr;
        if (done[r]) continue;
        done[r] = 1;
        len[r] = v;
        for (uint32_t k = occ_off[r]; k < occ_off[r + 1]; k++) {
            uint32_t a = occ[k];
            base[a] = mc_add(base[a], v);
            if (--pend[a] == 0) HPUSH(base[a], owner[a]);  /* each alternative is pushed once: hn <= A */
        }
    }
#undef HPUSH
    /* rem, backwards along each productive alternative */
    for (uint32_t p = 0; p < g->n_el; p++) g->rem[p] = is_eos(&g->el[p]) ? 0 : G_MC_INF;
    for (uint32_t a = 0; a < A; a++) {
        uint32_t q = g->alt_pos[a];
        while (!is_eos(&g->el[q])) q++;
        for (uint32_t p = q; p-- > g->alt_pos[a]; ) {
            const gelem *e = &g->el[p];
            g->rem[p] = mc_add(e->type == GE_REF ? len[e->value] : term_min_bytes(g, e), g->rem[p + 1]);
        }
    }
    rc = CB_OK;
out:
    free(len); free(done); free(base); free(pend); free(owner); free(occ_off); free(occ); free(hv); free(hr);
    return rc;
}

/* How each class meets P = [0x20, 0x10FFFF] minus '"', '\\', surrogates:
 * which of its ASCII code points it admits (cls_ascii), and whether it
 * admits all, none or part of the rest (cls_high).  Ranges are sorted and
 * disjoint, so count the code points of P above 0x7F each range covers. */
static int classify_classes(cb_grammar *g) {
    static const uint32_t PH[2][2] = {{0x80, 0xD7FF}, {0xE000, G_MAX_CP}};
    uint64_t p_size = 0;
    for (int k = 0; k < 2; k++) p_size += PH[k][1] - PH[k][0] + 1;
    g->cls_ascii = calloc(2 * (size_t)(g->n_cls ? g->n_cls : 1), sizeof *g->cls_ascii);
    g->cls_high = malloc(g->n_cls ? g->n_cls : 1);
    if (!g->cls_ascii || !g->cls_high) return CB_ERR_NOMEM;
    for (uint32_t c = 0; c < g->n_cls; c++) {
        uint64_t in = 0, *a = g->cls_ascii + 2 * c;
        for (uint32_t r = g->cls_off[c]; r < g->cls_off[c + 1]; r++) {
            uint32_t lo = g->rng[2 * r], hi = g->rng[2 * r + 1];
            for (uint32_t x = lo; x <= hi && x < 0x80; x++) a[x >> 6] |= 1ull << (x & 63);
            for (int k = 0; k < 2; k++) {
                uint32_t u = lo > PH[k][0] ? lo : PH[k][0], v = hi < PH[k][1] ? hi : PH[k][1];
                if (u <= v) in += v - u + 1;
            }
        }
        a[0] &= G_P_ASCII[0];
        a[1] &= G_P_ASCII[1];
        g->cls_high[c] = in == 0 ? GP_NONE : in == p_size ? GP_ALL : GP_PART;
    }
    return CB_OK;
}

/* Can some text token of the vocabulary begin a code point terminal e
 * admits?  lead[b]: some token starts with byte b.  A lead byte stands for
 * the code points whose UTF-8 form starts with it. */
static int term_writable(const cb_grammar *g, const gelem *e, const uint8_t *lead) {
    if (e->type == GE_CHAR) {
        uint32_t c = e->value;
        uint8_t b = c < 0x80 ? (uint8_t)c : c < 0x800 ? (uint8_t)(0xC0 | c >> 6) : c < 0x10000 ? (uint8_t)(0xE0 | c >> 12)
                  : (uint8_t)(0xF0 | c >> 18);
        return lead[b];
    }
    for (uint32_t r = g->cls_off[e->value]; r < g->cls_off[e->value + 1]; r++) {
        uint32_t lo = g->rng[2 * r], hi = g->rng[2 * r + 1];
        for (int b = 0; b < 0xF5; b++) {
            if (!lead[b] || (b >= 0x80 && b < 0xC2)) continue;
            uint32_t a = b < 0x80 ? (uint32_t)b : b < 0xE0 ? (uint32_t)(b & 0x1F) << 6 : b < 0xF0 ? (uint32_t)(b & 0x0F) << 12
                       : (uint32_t)(b & 0x07) << 18;
            uint32_t z = b < 0x80 ? a : b < 0xE0 ? a | 0x3F : b < 0xF0 ? a | 0xFFF : a | 0x3FFFF;
            if (a <= hi && z >= lo) return 1;
        }
    }
    return 0;
}

/* Dead ends the vocabulary would cause: a terminal no token can begin
 * (a vocabulary without byte tokens lacks some lead bytes; byte-level BPE
 * vocabularies have all, and skip this).  Such alternatives are dropped as
 * the parser drops unproductive ones, with the same fixpoint, so the
 * matcher never enters them; a root left with none is an error naming a
 * terminal that cannot be written. */
static int prune_unwritable(cb_grammar *g, char *err, size_t err_len) {
    uint8_t lead[256] = {0};
    const gtrie *tr = &g->v->all;
    for (uint32_t i = 0; i < tr->n_nodes; i = tr->end[i]) lead[tr->byte[i]] = 1;
    int all = 1;
    for (int b = 0; b < 0xF5; b++) if (!(b >= 0x80 && b < 0xC2) && !lead[b]) all = 0;
    if (all) return CB_OK;
    uint32_t R = g->n_rules, A = g->alt_off[R];
    uint8_t *prod = calloc((size_t)R + 1, 1), *alt_ok = calloc((size_t)A + 1, 1);
    if (!prod || !alt_ok) { free(prod); free(alt_ok); snprintf(err, err_len, "out of memory compiling the grammar"); return CB_ERR_NOMEM; }
    uint32_t bad_cp = UINT32_MAX;
    for (int changed = 1; changed; ) {
        changed = 0;
        for (uint32_t r = 0; r < R; r++)
            for (uint32_t a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) {
                if (alt_ok[a]) continue;
                int ok = 1;
                for (uint32_t p = g->alt_pos[a]; ok && !is_eos(&g->el[p]); p++) {
                    const gelem *e = &g->el[p];
                    if (e->type == GE_REF) ok = prod[e->value];
                    else if (!term_writable(g, e, lead)) {
                        ok = 0;
                        if (bad_cp == UINT32_MAX) bad_cp = e->type == GE_CHAR ? e->value : g->rng[2 * g->cls_off[e->value]];
                    }
                }
                if (ok) { alt_ok[a] = 1; changed |= !prod[r]; prod[r] = 1; }
            }
    }
    int rc = CB_OK;
    if (!prod[g->root]) {
        snprintf(err, err_len, "no output of this vocabulary matches the grammar: no token can begin U+%04X, "
                 "which every way through 'root' needs", bad_cp == UINT32_MAX ? 0 : bad_cp);
        rc = CB_ERR_FORMAT;
    } else {
        uint32_t n = 0;  /* keep the writable alternatives, in place */
        for (uint32_t r = 0; r < R; r++) {
            uint32_t a0 = g->alt_off[r], a1 = g->alt_off[r + 1];
            g->alt_off[r] = n;
            for (uint32_t a = a0; a < a1; a++) if (alt_ok[a]) g->alt_pos[n++] = g->alt_pos[a];
        }
        g->alt_off[R] = n;
    }
    free(prod);
    free(alt_ok);
    return rc;
}

void cb_grammar_free(cb_grammar *g) {
    if (!g) return;
    free(g->el); free(g->alt_off); free(g->alt_pos); free(g->rng); free(g->cls_off); free(g->cls_ascii); free(g->cls_high);
    free(g->rem);
    gvocab_free(g->own_v);
    if (g->sc.ready) pthread_mutex_destroy(&g->sc.lock);
    free(g->sc.mask); free(g->sc.key);
    free(g);
}

int cb_grammar_n_vocab(const cb_grammar *g) { return g ? g->n_vocab : 0; }

/* Compile text against a built vocabulary; own: the grammar takes it. */
static int compile(const gvocab *v, gvocab *own, const char *text, size_t len,
                   cb_grammar **out, char *err, size_t err_len) {
    cb_grammar *g = calloc(1, sizeof *g);
    if (!g) { gvocab_free(own); snprintf(err, err_len, "out of memory"); return CB_ERR_NOMEM; }
    g->v = v;
    g->own_v = own;
    g->n_vocab = v->n_vocab;
    int rc = grammar_parse_into(g, text, len, err, err_len);
    if (rc) goto fail;
    rc = prune_unwritable(g, err, err_len);
    if (rc) goto fail;
    rc = compute_min_lengths(g);
    if (!rc) rc = classify_classes(g);
    if (rc) { snprintf(err, err_len, "out of memory compiling the grammar"); goto fail; }
    g->sc.words = v->n_words;
    g->sc.mask = malloc((size_t)G_SC_N * (g->sc.words ? g->sc.words : 1) * sizeof *g->sc.mask);
    g->sc.key = malloc((size_t)G_SC_N * G_SC_KEY * sizeof *g->sc.key);
    if (!g->sc.mask || !g->sc.key || pthread_mutex_init(&g->sc.lock, NULL) != 0) {
        snprintf(err, err_len, "out of memory compiling the grammar");
        rc = CB_ERR_NOMEM;
        goto fail;
    }
    g->sc.ready = 1;
    for (int i = 0; i < G_SC_N; i++) { g->sc.nkey[i] = UINT32_MAX; g->sc.used[i] = 0; }
    *out = g;
    return CB_OK;
fail:
    cb_grammar_free(g);
    return rc;
}

int cb_grammar_compile_vocab(const cb_vocab_view *vocab, const char *text, size_t len,
                             cb_grammar **out, char *err, size_t err_len) {
    char dummy[8];
    if (!err || !err_len) { err = dummy; err_len = sizeof dummy; }
    err[0] = 0;
    if (!out) { snprintf(err, err_len, "out is NULL"); return CB_ERR_ARG; }
    *out = NULL;
    if (!vocab || (!text && len)) { snprintf(err, err_len, "NULL vocabulary or text"); return CB_ERR_ARG; }
    gvocab *v;
    int rc = gvocab_build(vocab, &v, err, err_len);
    if (rc) return rc;
    return compile(v, v, text, len, out, err, err_len);
}

int cb_grammar_compile(const cb_model *model, const char *text, size_t len,
                       cb_grammar **out, char *err, size_t err_len) {
    char dummy[8];
    if (!err || !err_len) { err = dummy; err_len = sizeof dummy; }
    err[0] = 0;
    if (out) *out = NULL;
    if (!model || !model->tok_off) { snprintf(err, err_len, "model has no vocabulary"); return CB_ERR_ARG; }
    if (!out) { snprintf(err, err_len, "out is NULL"); return CB_ERR_ARG; }
    if (!text && len) { snprintf(err, err_len, "NULL text"); return CB_ERR_ARG; }
    const gvocab *v;
    int rc = cb_model_gvocab(model, &v, err, err_len);
    if (rc) return rc;
    return compile(v, NULL, text, len, out, err, err_len);
}
