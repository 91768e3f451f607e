/*
 * grammar_vocab.c — the vocabulary as the grammar matcher walks it: token
 * kinds, a byte trie of every text token, the plain tokens by length and a
 * second trie of the rest (see gvocab in grammar_impl.h).  Built once per
 * vocabulary: a model keeps its own (cb_model_gvocab), so compiling a
 * grammar does not sort 152k tokens again.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"
#include "model.h"

typedef struct { const uint8_t *b; uint32_t n; int32_t id; } tokref;

static int tokref_cmp(const void *a, const void *b) {
    const tokref *x = a, *y = b;
    uint32_t n = x->n < y->n ? x->n : y->n;
    int c = n ? memcmp(x->b, y->b, n) : 0;
    if (c) return c;
    if (x->n != y->n) return x->n < y->n ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static void trie_free(gtrie *t) {
    free(t->byte); free(t->depth); free(t->end); free(t->tok_off); free(t->tok); free(t->maxd); free(t->sub);
    memset(t, 0, sizeof *t);
}

/* The trie of n sorted tokens (at most one node per byte of text), nodes in
 * preorder.  max_len bounds a token's length.  tsub (NULL: no gtrie.sub):
 * each token's own sub bits, [2 * n] in the order of t. */
static int trie_build(gtrie *g, const tokref *t, uint32_t n, size_t text_bytes, int max_len, const uint64_t *tsub) {
    size_t cap = text_bytes ? text_bytes : 1;
    g->byte = malloc(cap);
    g->depth = malloc(cap * sizeof *g->depth);
    g->end = malloc(cap * sizeof *g->end);
    g->tok_off = malloc((cap + 1) * sizeof *g->tok_off);
    g->tok = malloc((n ? n : 1) * sizeof *g->tok);
    g->maxd = malloc(cap * sizeof *g->maxd);
    uint32_t *path = malloc(((size_t)max_len + 1) * sizeof *path);  /* open node at each depth */
    if (tsub) g->sub = calloc(2 * cap, sizeof *g->sub);
    if (!g->byte || !g->depth || !g->end || !g->tok_off || !g->tok || !g->maxd || !path || (tsub && !g->sub)) {
        free(path);
        return CB_ERR_NOMEM;
    }
    uint32_t nn = 0, plen = 0, ntok = 0;
    const tokref *prev = NULL;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t lcp = 0;
        if (prev) {
            uint32_t m = prev->n < t[i].n ? prev->n : t[i].n;
            while (lcp < m && prev->b[lcp] == t[i].b[lcp]) lcp++;
        }
        while (plen > lcp) g->end[path[--plen]] = nn;  /* close nodes off the shared prefix */
        for (uint32_t d = lcp; d < t[i].n; d++) {
            g->byte[nn] = t[i].b[d];
            g->depth[nn] = (uint16_t)(d + 1);
            g->tok_off[nn] = ntok;
            path[plen++] = nn++;
        }
        /* sorted order: the token's node is the last one created.  Nodes
         * created without tokens keep tok_off non-decreasing (set to the
         * running count at creation): a node's tokens are those added before
         * the next node was created. */
        g->tok[ntok++] = t[i].id;
        if (tsub && t[i].n) {
            g->sub[2 * (nn - 1)] |= tsub[2 * i];
            g->sub[2 * (nn - 1) + 1] |= tsub[2 * i + 1];
        }
        prev = &t[i];
    }
    while (plen) g->end[path[--plen]] = nn;
    g->tok_off[nn] = ntok;
    /* deepest node per subtree: children lie after their parent in preorder
     * (first child i+1, next sibling at the child's end), so one backward pass */
    for (uint32_t i = nn; i-- > 0; ) {
        uint16_t md = g->depth[i];
        for (uint32_t c = i + 1; c < g->end[i]; c = g->end[c]) {
            if (g->maxd[c] > md) md = g->maxd[c];
            if (tsub) { g->sub[2 * i] |= g->sub[2 * c]; g->sub[2 * i + 1] |= g->sub[2 * c + 1]; }
        }
        g->maxd[i] = md;
    }
    g->n_nodes = nn;
    free(path);
    return CB_OK;
}

/* Code points in P if the bytes are 1..G_PLAIN_MAX complete, shortest-form
 * UTF-8 code points of P (see gvocab), else 0. */
static int plain_len(const uint8_t *b, uint32_t n) {
    int cps = 0;
    for (uint32_t i = 0; i < n; ) {
        uint8_t c = b[i];
        uint32_t cp, k;
        if (c < 0x80) { cp = c; k = 1; }
        else if ((c & 0xE0) == 0xC0) { cp = c & 0x1F; k = 2; }
        else if ((c & 0xF0) == 0xE0) { cp = c & 0x0F; k = 3; }
        else if ((c & 0xF8) == 0xF0) { cp = c & 0x07; k = 4; }
        else return 0;
        if (i + k > n) return 0;  /* ends inside a code point */
        for (uint32_t j = 1; j < k; j++) {
            if ((b[i + j] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (b[i + j] & 0x3F);
        }
        static const uint32_t minv[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < minv[k] || cp > G_MAX_CP || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        if (cp < 0x20 || cp == 0x22 || cp == 0x5C) return 0;
        if (++cps > G_PLAIN_MAX) return 0;
        i += k;
    }
    return cps;
}

/* Bytes of the UTF-8 code point a lead byte starts (1 for anything else). */
static uint32_t first_cp_len(uint8_t c) { return c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1; }

void gvocab_free(gvocab *v) {
    if (!v) return;
    free(v->tok_bytes); free(v->tok_off); free(v->tok_kind); free(v->eog_ids);
    trie_free(&v->all);
    trie_free(&v->rest);
    free(v->plain);
    free(v->plain_upto);
    free(v->plain_first);
    free(v->plain_rest);
    free(v);
}

int gvocab_build(const cb_vocab_view *vv, gvocab **out, char *err, size_t err_len) {
    *out = NULL;
    int n = vv->n_vocab;
    if (n < 0 || (n > 0 && (!vv->off || !vv->bytes))) { snprintf(err, err_len, "bad vocabulary"); return CB_ERR_ARG; }
    for (int i = 0; i < n; i++)
        if (vv->off[i + 1] < vv->off[i]) { snprintf(err, err_len, "bad vocabulary offsets at token %d", i); return CB_ERR_ARG; }
    gvocab *v = calloc(1, sizeof *v);
    if (!v) goto oom;
    uint32_t total = n ? vv->off[n] - vv->off[0] : 0;
    v->n_vocab = n;
    v->n_words = ((uint32_t)n + 31) / 32;
    v->tok_bytes = malloc(total ? total : 1);
    v->tok_off = malloc(((size_t)n + 1) * sizeof *v->tok_off);
    v->tok_kind = malloc(n ? (size_t)n : 1);
    v->eog_ids = malloc((n ? (size_t)n : 1) * sizeof *v->eog_ids);
    v->plain = calloc((size_t)G_PLAIN_MAX * (v->n_words ? v->n_words : 1), sizeof *v->plain);
    v->plain_upto = calloc((size_t)G_PLAIN_MAX * (v->n_words ? v->n_words : 1), sizeof *v->plain_upto);
    v->plain_first = calloc((size_t)G_PROWS * (v->n_words ? v->n_words : 1), sizeof *v->plain_first);
    v->plain_rest = calloc((size_t)G_PROWS * (v->n_words ? v->n_words : 1), sizeof *v->plain_rest);
    if (!v->tok_bytes || !v->tok_off || !v->tok_kind || !v->eog_ids || !v->plain || !v->plain_upto || !v->plain_first ||
        !v->plain_rest)
        goto oom;
    if (total) memcpy(v->tok_bytes, vv->bytes + vv->off[0], total);
    uint32_t n_text = 0;
    size_t text_bytes = 0, rest_bytes = 0;
    int max_len = 0;
    for (int i = 0; i <= n; i++) v->tok_off[i] = n ? vv->off[i] - vv->off[0] : 0;
    for (int i = 0; i < n; i++) {
        uint32_t len = v->tok_off[i + 1] - v->tok_off[i];
        if (vv->eog && vv->eog[i]) { v->tok_kind[i] = 2; v->eog_ids[v->n_eog++] = i; }
        else if ((vv->type && vv->type[i] == 3) || len == 0 || len > 65535) v->tok_kind[i] = 1;
        else { v->tok_kind[i] = 0; n_text++; text_bytes += len; if ((int)len > max_len) max_len = (int)len; }
    }
    v->max_depth = max_len;
    tokref *t = malloc((n_text ? n_text : 1) * sizeof *t);
    if (!t) goto oom;
    uint32_t k = 0;
    for (int i = 0; i < n; i++)
        if (v->tok_kind[i] == 0) { t[k].b = v->tok_bytes + v->tok_off[i]; t[k].n = v->tok_off[i + 1] - v->tok_off[i]; t[k].id = i; k++; }
    qsort(t, n_text, sizeof *t, tokref_cmp);
    /* each plain token's sub bits (see gtrie) */
    uint64_t *tsub = calloc(2 * (size_t)(n_text ? n_text : 1), sizeof *tsub);
    if (!tsub) { free(t); goto oom; }
    for (uint32_t i = 0; i < n_text; i++)
        if (plain_len(t[i].b, t[i].n) > 0)
            for (uint32_t j = first_cp_len(t[i].b[0]); j < t[i].n; j++) {
                uint8_t c = t[i].b[j];
                if (c < 0x80) tsub[2 * i + (c >> 6)] |= 1ull << (c & 63);
                else tsub[2 * i] |= G_SUB_HIGH;
            }
    int rc = trie_build(&v->all, t, n_text, text_bytes, max_len, tsub);
    free(tsub);
    if (rc) { free(t); goto oom; }
    /* plain tokens by length, by their first code point and by the ASCII
     * code points after it; the rest keep their sorted order */
    uint32_t nr = 0;
    for (uint32_t i = 0; i < n_text; i++) {
        int L = plain_len(t[i].b, t[i].n);
        if (L > 0) {
            uint32_t *w = v->plain + (size_t)(L - 1) * v->n_words;
            w[t[i].id >> 5] |= 1u << (t[i].id & 31);
            size_t wi = t[i].id >> 5;
            uint32_t bi = 1u << (t[i].id & 31);
            uint8_t c0 = t[i].b[0];
            int row = c0 < 0x80 ? c0 - 0x20 : G_PROW_HIGH;  /* >= 0x20: plain */
            v->plain_first[(size_t)row * v->n_words + wi] |= bi;
            v->n_first[row]++;
            for (uint32_t j = first_cp_len(c0); j < t[i].n; j++) {
                uint8_t c = t[i].b[j];
                v->plain_rest[(size_t)(c < 0x80 ? c - 0x20 : G_PROW_HIGH) * v->n_words + wi] |= bi;
            }
            v->n_plain_len[L]++;
            v->n_plain++;
        } else {
            rest_bytes += t[i].n;
            t[nr++] = t[i];
        }
    }
    for (int L = 1; L <= G_PLAIN_MAX; L++) {
        uint32_t *u = v->plain_upto + (size_t)(L - 1) * v->n_words;
        const uint32_t *w = v->plain + (size_t)(L - 1) * v->n_words;
        const uint32_t *prev = L > 1 ? u - v->n_words : NULL;
        for (uint32_t j = 0; j < v->n_words; j++) u[j] = w[j] | (prev ? prev[j] : 0);
    }
    rc = trie_build(&v->rest, t, nr, rest_bytes, max_len, NULL);
    free(t);
    if (rc) goto oom;
    *out = v;
    return CB_OK;
oom:
    gvocab_free(v);
    snprintf(err, err_len, "out of memory building the vocabulary trie");
    return CB_ERR_NOMEM;
}

/* Built at most once per model: the first caller builds and publishes it
 * with a compare-and-swap; a caller that loses the race frees its copy. */
int cb_model_gvocab(const cb_model *model, const gvocab **out, char *err, size_t err_len) {
    cb_model *m = (cb_model *)model;  /* only the once-published cache is written */
    gvocab *v = __atomic_load_n(&m->gvocab, __ATOMIC_ACQUIRE);
    if (!v) {
        cb_vocab_view vv = { m->info.n_vocab, m->tok_bytes, m->tok_off, m->tok_type, m->tok_eog };
        int rc = gvocab_build(&vv, &v, err, err_len);
        if (rc) return rc;
        gvocab *expected = NULL;
        if (!__atomic_compare_exchange_n(&m->gvocab, &expected, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            gvocab_free(v);
            v = expected;
        }
    }
    *out = v;
    return CB_OK;
}
