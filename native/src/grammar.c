/*
 * grammar.c — GBNF grammars: parser, compiled rule table, a byte-level
 * pushdown matcher and the allowed-token mask over a vocabulary.
 *
 * Pipeline
 *   text ──parse──▶ rules of elements (llama.cpp's shape: CHAR, CLASS, REF,
 *   ALT, END), repetitions expanded into generated rules ──analyse──▶
 *   productive / nullable rules, left recursion rejected ──flatten──▶ one
 *   element array + per-rule alternative starts.  The vocabulary goes into a
 *   byte trie stored in preorder (each node knows where its subtree ends).
 *
 * Matcher
 *   A parse state is a set of stacks of element positions (top = the next
 *   terminal to match; an empty stack = accepted), plus a partial UTF-8 code
 *   point (tokens may end inside a code point).  States are interned, and
 *   transitions on a byte are memoized per state (a lazily built DFA over
 *   the PDA's reachable configurations), so the mask walk over the trie
 *   costs one table lookup per visited node and prunes a whole subtree as
 *   soon as the state is dead.  Masks are memoized per state id in a small
 *   LRU (a mask is a pure function of the state).  Everything cached lives in
 *   the matcher (the grammar is immutable and may be shared across threads);
 *   all buffers are allocated in cb_matcher_new.  When the state pool fills
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
#include <stdarg.h>
#include <pthread.h>

#include "colibri.h"
#include "grammar.h"
#include "model.h"

/* ------------------------------------------------------------ limits */

#define G_MAX_NEST      256        /* parenthesis nesting in the text */
#define G_MAX_REP       10000      /* largest m or n in {m,n} */
#define G_MAX_ELEMS     (1u << 20) /* elements over all rules (after expansion) */
#define G_MAX_RULES     (1u << 18) /* rules, named + generated */
#define G_MAX_CP        0x10FFFFu
#define G_SC_N          64         /* masks in the grammar's shared cache */
#define G_SC_KEY        512        /* largest state encoding (words) the shared cache keeps */
#define G_MC_INF        0x3FFFFFFFu /* "no finite / too long" completion length; sums saturate here */
#define G_MC_UNLIMITED  0x7FFFFFFFu /* budget meaning "no budget" (> G_MC_INF, and + 65535 fits uint32) */

/* matcher bounds (per matcher; see cb_matcher_new for the memory they cost) */
#define M_MAX_STATES    2048       /* interned DFA states in one pool (uint16 ids, 0xFFFF = unknown) */
#define M_ARENA_WORDS   (1u << 18) /* words of stack data in one pool */
#define M_BUILD_STACKS  4096       /* stacks one transition may visit (incl. intermediate) */
#define M_BUILD_WORDS   (1u << 16) /* words of stack data one transition may build */
#define M_MAX_RESULT    1024       /* stacks in one state */
#define M_MAX_DEPTH     2048       /* positions in one stack */
#define M_HIST          64         /* accepted tokens that can be rolled back */
#define M_MASK_CACHE    16         /* memoized masks */
#define M_UNKNOWN       0xFFFFu

#define ERR_FULL        (-100)     /* internal: state pool full, collect and retry */

/* ------------------------------------------------------------ elements */

enum {
    GE_END = 0,   /* end of a rule */
    GE_ALT,       /* start of another alternative */
    GE_REF,       /* value = rule id */
    GE_CHAR,      /* value = code point */
    GE_CLASS      /* value = class id (sorted disjoint ranges, negation already applied) */
};

typedef struct {
    uint32_t type;   /* GE_* */
    uint32_t value;  /* see GE_* */
} gelem;

static int is_eos(const gelem *e) { return e->type == GE_END || e->type == GE_ALT; }

/* ------------------------------------------------------------ grammar */

struct cb_grammar {
    gelem    *el;         /* [n_el] every rule's elements, alternatives separated by ALT, END-terminated */
    uint32_t  n_el;
    uint32_t  n_rules;
    uint32_t *alt_off;    /* [n_rules + 1] rule r's productive alternatives are alt_pos[alt_off[r]..alt_off[r+1]) */
    uint32_t *alt_pos;    /* element index where each alternative starts (may be its ALT/END: empty) */
    uint32_t  root;       /* rule id of `root` */
    uint32_t *rng;        /* [2 * n_ranges] (lo, hi) inclusive code point ranges */
    uint32_t *cls_off;    /* [n_cls + 1] class c's ranges are rng pairs cls_off[c]..cls_off[c+1] */
    uint32_t  n_cls;
    /* Shortest completions (bytes), from the min-length analysis
     * (compute_min_lengths): rem[p] = fewest bytes that finish the
     * alternative holding element p, starting at p (0 at its ALT/END;
     * G_MC_INF in unproductive alternatives, which the matcher never enters).
     * A stack's shortest completion is the sum of rem over its positions. */
    uint32_t *rem;        /* [n_el] */
    /* vocabulary (copied) */
    int       n_vocab;
    uint8_t  *tok_bytes;  /* concatenated bytes */
    uint32_t *tok_off;    /* [n_vocab + 1] */
    uint8_t  *tok_kind;   /* [n_vocab] 0 text token (in the trie), 1 never allowed (control / empty), 2 end of generation */
    int32_t  *eog_ids;    /* [n_eog] */
    int       n_eog;
    /* trie of text tokens' bytes, nodes in preorder (depth >= 1) */
    uint32_t  n_nodes;
    uint8_t  *tn_byte;    /* [n_nodes] byte on the edge into the node */
    uint16_t *tn_depth;   /* [n_nodes] 1 = child of the root */
    uint32_t *tn_end;     /* [n_nodes] index just past the node's subtree */
    uint32_t *tn_tok_off; /* [n_nodes + 1] tokens ending at node i: tn_tok[tn_tok_off[i]..tn_tok_off[i+1]) */
    int32_t  *tn_tok;     /* token ids in trie order */
    uint16_t *tn_maxd;    /* [n_nodes] deepest depth in the node's subtree (itself included): budgeted walks prune with it */
    int       max_depth;  /* longest text token in bytes */
    /* Shared mask cache: masks are a pure function of the parse state, so
     * matchers of the same grammar (other requests, other engines) share the
     * masks they computed.  The only mutable part of a grammar; guarded by
     * sc_lock.  Entries are keyed by the state's encoding (not by ids, which
     * are per matcher). */
    pthread_mutex_t sc_lock;
    int       sc_ready;   /* 1: sc_lock initialized and buffers allocated */
    uint32_t  sc_words;   /* mask words per entry */
    uint32_t *sc_mask;    /* [G_SC_N * sc_words] */
    uint32_t *sc_key;     /* [G_SC_N * G_SC_KEY] state encodings */
    uint32_t  sc_nkey[G_SC_N];   /* words of key (UINT32_MAX = empty slot) */
    uint32_t  sc_hash[G_SC_N];   /* state hash (includes the partial code point) */
    uint32_t  sc_part[G_SC_N];   /* pval | prem << 24 | plen << 28 */
    int32_t   sc_count[G_SC_N];  /* allowed tokens */
    uint32_t  sc_maxmc[G_SC_N];  /* largest shortest-completion over the allowed tokens' end states */
    uint64_t  sc_used[G_SC_N];   /* LRU tick */
    uint64_t  sc_tick;
};

/* ------------------------------------------------------------ parser */

typedef struct {
    gelem   *e;          /* elements being built (END included once finished) */
    uint32_t n, cap;
    int32_t  origin;     /* named rule this one was generated for (itself if named); for messages */
    uint32_t name_off, name_len; /* named rules: the name in the source text */
    uint8_t  named;      /* 1: written by the user */
    uint8_t  defined;    /* 1: has a definition (generated rules always) */
    size_t   def_pos;    /* source offset of the definition (named) */
    size_t   ref_pos;    /* source offset of the first reference (named, for "undefined") */
} prule;

typedef struct {
    const char *src;     /* grammar text */
    size_t      len;
    size_t      pos;     /* cursor */
    prule      *rules;
    uint32_t    n_rules, cap_rules;
    int32_t    *bucket;  /* [PB] head of the name hash chain (rule id or -1) */
    int32_t    *chain;   /* [cap_rules] next rule id in the chain */
    uint32_t   *rng;     /* class ranges (pairs) */
    uint32_t    n_rng, cap_rng;
    uint32_t   *cls_off; /* [n_cls + 1] */
    uint32_t    n_cls, cap_cls;
    uint32_t    any_cls; /* class id of `.`, or UINT32_MAX until first use */
    size_t      n_elems; /* elements over all rules, for the size cap */
    int         depth;   /* current parenthesis nesting */
    char       *err;
    size_t      err_len;
    int         failed;
} parser;

#define PB 1024

static void line_col(const char *src, size_t len, size_t pos, int *line, int *col) {
    int l = 1, c = 1;
    if (pos > len) pos = len;
    for (size_t i = 0; i < pos; i++) {
        if (src[i] == '\n') { l++; c = 1; } else c++;
    }
    *line = l; *col = c;
}

static int perr(parser *p, size_t pos, const char *fmt, ...) {
    if (p->failed) return CB_ERR_FORMAT;
    p->failed = 1;
    if (p->err && p->err_len) {
        int line, col;
        line_col(p->src, p->len, pos, &line, &col);
        int k = snprintf(p->err, p->err_len, "line %d, column %d: ", line, col);
        if (k >= 0 && (size_t)k < p->err_len) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(p->err + k, p->err_len - (size_t)k, fmt, ap);
            va_end(ap);
        }
    }
    return CB_ERR_FORMAT;
}

static int nomem(parser *p) {
    if (!p->failed && p->err && p->err_len) snprintf(p->err, p->err_len, "out of memory compiling the grammar");
    p->failed = 1;
    return CB_ERR_NOMEM;
}

static int peek(const parser *p, size_t at) { return at < p->len ? (unsigned char)p->src[at] : -1; }

static int is_word(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

/* Printable description of the character at `at` for messages. */
static const char *desc(const parser *p, size_t at, char buf[16]) {
    int c = peek(p, at);
    if (c < 0) return "end of input";
    if (c == '\n' || c == '\r') return "end of line";
    if (c >= 0x20 && c < 0x7f) { snprintf(buf, 16, "'%c'", c); return buf; }
    snprintf(buf, 16, "byte 0x%02x", c);
    return buf;
}

static int new_rule(parser *p, int32_t origin, uint32_t *out) {
    if (p->n_rules >= G_MAX_RULES) return perr(p, p->pos, "grammar too large (more than %u rules after expansion)", G_MAX_RULES);
    if (p->n_rules == p->cap_rules) {
        uint32_t cap = p->cap_rules ? p->cap_rules * 2 : 64;
        prule *r = realloc(p->rules, cap * sizeof *r);
        if (!r) return nomem(p);
        p->rules = r;
        int32_t *ch = realloc(p->chain, cap * sizeof *ch);
        if (!ch) return nomem(p);
        p->chain = ch;
        p->cap_rules = cap;
    }
    uint32_t id = p->n_rules++;
    memset(&p->rules[id], 0, sizeof p->rules[id]);
    p->rules[id].origin = origin < 0 ? (int32_t)id : origin;
    p->chain[id] = -1;
    *out = id;
    return CB_OK;
}

static int push_el(parser *p, uint32_t rule, uint32_t type, uint32_t value) {
    prule *r = &p->rules[rule];
    if (p->n_elems >= G_MAX_ELEMS) return perr(p, p->pos, "grammar too large (more than %u elements after expanding repetitions)", G_MAX_ELEMS);
    if (r->n == r->cap) {
        uint32_t cap = r->cap ? r->cap * 2 : 8;
        gelem *e = realloc(r->e, cap * sizeof *e);
        if (!e) return nomem(p);
        r->e = e;
        r->cap = cap;
    }
    r->e[r->n].type = type;
    r->e[r->n].value = value;
    r->n++;
    p->n_elems++;
    return CB_OK;
}

static uint32_t name_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) { h ^= (unsigned char)s[i]; h *= 16777619u; }
    return h;
}

/* Rule id for the name src[off..off+n), created (undefined) on first use. */
static int named_rule(parser *p, size_t off, size_t n, uint32_t *out) {
    uint32_t b = name_hash(p->src + off, n) & (PB - 1);
    for (int32_t i = p->bucket[b]; i >= 0; i = p->chain[i]) {
        prule *r = &p->rules[i];
        if (r->name_len == n && memcmp(p->src + r->name_off, p->src + off, n) == 0) { *out = (uint32_t)i; return CB_OK; }
    }
    uint32_t id;
    int rc = new_rule(p, -1, &id);
    if (rc) return rc;
    prule *r = &p->rules[id];
    r->named = 1;
    r->name_off = (uint32_t)off;
    r->name_len = (uint32_t)n;
    r->ref_pos = (size_t)-1;
    p->chain[id] = p->bucket[b];
    p->bucket[b] = (int32_t)id;
    *out = id;
    return CB_OK;
}

/* Skip blanks and comments.  Newlines are skipped inside parentheses; at the
 * top level of a rule they are skipped only when the next non-blank line
 * continues the rule (it does not start a new `name ::=` and input remains):
 * a rule ends where the next definition begins. */
static int rule_starts_at(const parser *p, size_t q) {
    size_t i = q;
    while (is_word(peek(p, i))) i++;
    if (i == q) return 0;
    while (peek(p, i) == ' ' || peek(p, i) == '\t') i++;
    return peek(p, i) == ':' && peek(p, i + 1) == ':' && peek(p, i + 2) == '=';
}

static size_t skip_all(const parser *p, size_t pos) {
    for (;;) {
        int c = peek(p, pos);
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n') pos++;
        else if (c == '#') { while (peek(p, pos) >= 0 && peek(p, pos) != '\n') pos++; }
        else return pos;
    }
}

static size_t skip_space(const parser *p, size_t pos, int nested) {
    for (;;) {
        int c = peek(p, pos);
        if (c == ' ' || c == '\t') pos++;
        else if (c == '#') { while (peek(p, pos) >= 0 && peek(p, pos) != '\n') pos++; }
        else if (c == '\r' || c == '\n') {
            if (nested) { pos++; continue; }
            size_t q = skip_all(p, pos);
            if (q >= p->len || rule_starts_at(p, q)) return pos;
            pos = q;
        } else return pos;
    }
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class: an escape or one UTF-8 code point. */
static int parse_char(parser *p, uint32_t *cp) {
    size_t start = p->pos;
    int c = peek(p, p->pos);
    if (c < 0) return perr(p, start, "unexpected end of input");
    if (c == '\\') {
        int e = peek(p, p->pos + 1);
        int nhex = 0;
        switch (e) {
        case 'x': nhex = 2; break;
        case 'u': nhex = 4; break;
        case 'U': nhex = 8; break;
        case 't': *cp = '\t'; p->pos += 2; return CB_OK;
        case 'r': *cp = '\r'; p->pos += 2; return CB_OK;
        case 'n': *cp = '\n'; p->pos += 2; return CB_OK;
        case '\\': case '"': case '[': case ']': case '-':
            *cp = (uint32_t)e; p->pos += 2; return CB_OK;
        default: {
            char b[16];
            if (e < 0) return perr(p, start, "unterminated escape at end of input");
            return perr(p, start, "bad escape '\\%s'", (e >= 0x20 && e < 0x7f) ? (snprintf(b, sizeof b, "%c", e), b) : "?");
        }
        }
        uint32_t v = 0;
        for (int i = 0; i < nhex; i++) {
            int h = hexval(peek(p, p->pos + 2 + (size_t)i));
            if (h < 0) return perr(p, start, "bad escape '\\%c': expected %d hex digits", e, nhex);
            v = v * 16 + (uint32_t)h;
        }
        if (v > G_MAX_CP) return perr(p, start, "escape '\\%c' gives code point 0x%X beyond U+10FFFF", e, v);
        *cp = v;
        p->pos += 2 + (size_t)nhex;
        return CB_OK;
    }
    /* raw UTF-8 */
    unsigned b0 = (unsigned)c;
    int n;
    uint32_t v;
    if (b0 < 0x80) { n = 0; v = b0; }
    else if ((b0 & 0xE0) == 0xC0) { n = 1; v = b0 & 0x1F; }
    else if ((b0 & 0xF0) == 0xE0) { n = 2; v = b0 & 0x0F; }
    else if ((b0 & 0xF8) == 0xF0) { n = 3; v = b0 & 0x07; }
    else return perr(p, start, "invalid UTF-8 in grammar text");
    for (int i = 1; i <= n; i++) {
        int cb = peek(p, p->pos + (size_t)i);
        if (cb < 0 || (cb & 0xC0) != 0x80) return perr(p, start, "invalid UTF-8 in grammar text");
        v = (v << 6) | ((unsigned)cb & 0x3F);
    }
    static const uint32_t minv[4] = {0, 0x80, 0x800, 0x10000};
    if (v < minv[n] || v > G_MAX_CP || (v >= 0xD800 && v <= 0xDFFF)) return perr(p, start, "invalid UTF-8 in grammar text");
    *cp = v;
    p->pos += (size_t)n + 1;
    return CB_OK;
}

static int push_range(parser *p, uint32_t lo, uint32_t hi) {
    if (p->n_rng + 1 > p->cap_rng) {
        uint32_t cap = p->cap_rng ? p->cap_rng * 2 : 64;
        uint32_t *r = realloc(p->rng, (size_t)cap * 2 * sizeof *r);
        if (!r) return nomem(p);
        p->rng = r;
        p->cap_rng = cap;
    }
    p->rng[2 * p->n_rng] = lo;
    p->rng[2 * p->n_rng + 1] = hi;
    p->n_rng++;
    return CB_OK;
}

/* Normalize the ranges from index `first` on into a class: sort, merge
 * overlapping and adjacent ranges, complement if negated, remove the
 * surrogates (never produced by valid UTF-8).  Disjoint, non-adjacent
 * ranges make "is [lo,hi] inside the class's complement" a single-range test. */
static int finish_class(parser *p, uint32_t first, int negated, uint32_t *out_id) {
    uint32_t n = p->n_rng - first;
    uint32_t *r = p->rng + 2 * first;
    /* insertion sort by lo (classes are short) */
    for (uint32_t i = 1; i < n; i++) {
        uint32_t lo = r[2 * i], hi = r[2 * i + 1], j = i;
        while (j > 0 && r[2 * (j - 1)] > lo) { r[2 * j] = r[2 * (j - 1)]; r[2 * j + 1] = r[2 * (j - 1) + 1]; j--; }
        r[2 * j] = lo; r[2 * j + 1] = hi;
    }
    uint32_t m = 0;  /* merge overlapping and adjacent */
    for (uint32_t i = 0; i < n; i++) {
        if (m && r[2 * i] <= r[2 * (m - 1) + 1] + 1) {
            if (r[2 * i + 1] > r[2 * (m - 1) + 1]) r[2 * (m - 1) + 1] = r[2 * i + 1];
        } else { r[2 * m] = r[2 * i]; r[2 * m + 1] = r[2 * i + 1]; m++; }
    }
    /* t = (complement of) the merged ranges, then the surrogates cut out */
    uint32_t *t = malloc(((size_t)m + 2) * 2 * sizeof *t);
    if (!t) return nomem(p);
    uint32_t nt = 0;
    if (negated) {
        uint32_t next = 0;
        for (uint32_t i = 0; i < m; i++) {
            if (r[2 * i] > next) { t[2 * nt] = next; t[2 * nt + 1] = r[2 * i] - 1; nt++; }
            next = r[2 * i + 1] + 1;
        }
        if (next <= G_MAX_CP) { t[2 * nt] = next; t[2 * nt + 1] = G_MAX_CP; nt++; }
    } else {
        if (m) memcpy(t, r, (size_t)m * 2 * sizeof *t);
        nt = m;
    }
    p->n_rng = first;
    int rc = CB_OK;
    for (uint32_t i = 0; i < nt && !rc; i++) {
        uint32_t lo = t[2 * i], hi = t[2 * i + 1];
        if (lo < 0xD800 && !rc) rc = push_range(p, lo, hi < 0xD800 ? hi : 0xD7FF);
        if (hi > 0xDFFF && !rc) rc = push_range(p, lo > 0xE000 ? lo : 0xE000, hi);
    }
    free(t);
    if (rc) return rc;
    if (p->n_cls + 2 > p->cap_cls) {
        uint32_t cap = p->cap_cls ? p->cap_cls * 2 : 32;
        uint32_t *c = realloc(p->cls_off, (size_t)cap * sizeof *c);
        if (!c) return nomem(p);
        p->cls_off = c;
        p->cap_cls = cap;
    }
    p->cls_off[p->n_cls] = first;
    p->cls_off[p->n_cls + 1] = p->n_rng;
    *out_id = p->n_cls++;
    return CB_OK;
}

static int parse_class(parser *p, uint32_t *out_id) {
    size_t open = p->pos;
    p->pos++;  /* '[' */
    int negated = 0;
    if (peek(p, p->pos) == '^') { negated = 1; p->pos++; }
    /* class ranges must be contiguous in p->rng: earlier classes are finished */
    uint32_t first = p->n_rng;
    for (;;) {
        int c = peek(p, p->pos);
        if (c < 0) return perr(p, open, "unterminated character class");
        if (c == ']') break;
        uint32_t lo, hi;
        int rc = parse_char(p, &lo);
        if (rc) return rc;
        hi = lo;
        if (peek(p, p->pos) == '-' && peek(p, p->pos + 1) >= 0 && peek(p, p->pos + 1) != ']') {
            size_t dash = p->pos;
            p->pos++;
            rc = parse_char(p, &hi);
            if (rc) return rc;
            if (hi < lo) return perr(p, dash, "invalid range in character class: end U+%04X before start U+%04X", hi, lo);
        }
        rc = push_range(p, lo, hi);
        if (rc) return rc;
    }
    p->pos++;  /* ']' */
    return finish_class(p, first, negated, out_id);
}

/* Replace the item rules[rule].e[start..n) by its repetition {min,max}
 * (max < 0: unbounded), the way llama.cpp expands it:
 *   x{m,n} = x..x (m times) opt_1,  opt_i ::= x opt_{i+1} | ε, ..., opt_{n-m} ::= x | ε
 *   x{m,}  = x..x (m times) rec,    rec   ::= x rec | ε
 * opt chains are tail calls, so matching never grows a stack for them. */
static int repeat_item(parser *p, uint32_t rule, uint32_t start, long min, long max) {
    prule *r = &p->rules[rule];
    uint32_t k = r->n - start;
    gelem *item = NULL;
    if (k) {
        item = malloc(k * sizeof *item);
        if (!item) return nomem(p);
        memcpy(item, r->e + start, k * sizeof *item);
    }
    p->n_elems -= k;
    r->n = start;
    int rc = CB_OK;
    int32_t origin = p->rules[rule].origin;
    for (long i = 0; i < min && !rc; i++)
        for (uint32_t j = 0; j < k && !rc; j++) rc = push_el(p, rule, item[j].type, item[j].value);
    if (!rc && (max < 0 || max > min)) {
        long n_opt = max < 0 ? 1 : max - min;
        uint32_t first = p->n_rules;
        for (long i = 0; i < n_opt && !rc; i++) {
            uint32_t id;
            rc = new_rule(p, origin, &id);
            if (rc) break;
            p->rules[id].defined = 1;
            for (uint32_t j = 0; j < k && !rc; j++) rc = push_el(p, id, item[j].type, item[j].value);
            if (!rc && max < 0) rc = push_el(p, id, GE_REF, id);
            else if (!rc && i + 1 < n_opt) rc = push_el(p, id, GE_REF, id + 1);
            if (!rc) rc = push_el(p, id, GE_ALT, 0);
            if (!rc) rc = push_el(p, id, GE_END, 0);
        }
        if (!rc) rc = push_el(p, rule, GE_REF, first);
    }
    free(item);
    return rc;
}

static int parse_alternates(parser *p, uint32_t rule, int nested);

static int parse_count(parser *p, long *out) {
    size_t s = p->pos;
    long v = 0;
    while (peek(p, p->pos) >= '0' && peek(p, p->pos) <= '9') {
        v = v * 10 + (peek(p, p->pos) - '0');
        if (v > G_MAX_REP) return perr(p, s, "repetition bound too large (max %d)", G_MAX_REP);
        p->pos++;
    }
    if (p->pos == s) return 1;  /* no digits */
    *out = v;
    return CB_OK;
}

static int parse_sequence(parser *p, uint32_t rule, int nested) {
    uint32_t last = UINT32_MAX;  /* start of the last item, for repetition operators */
    for (;;) {
        int c = peek(p, p->pos);
        int rc = CB_OK;
        if (c == '"') {
            size_t open = p->pos;
            p->pos++;
            last = p->rules[rule].n;
            for (;;) {
                int d = peek(p, p->pos);
                if (d < 0) return perr(p, open, "unterminated literal");
                if (d == '"') break;
                uint32_t cp;
                rc = parse_char(p, &cp);
                if (rc) return rc;
                rc = push_el(p, rule, GE_CHAR, cp);
                if (rc) return rc;
            }
            p->pos++;
        } else if (c == '[') {
            uint32_t id;
            last = p->rules[rule].n;
            rc = parse_class(p, &id);
            if (!rc) rc = push_el(p, rule, GE_CLASS, id);
        } else if (c == '.') {
            last = p->rules[rule].n;
            if (p->any_cls == UINT32_MAX) {
                uint32_t first = p->n_rng;
                rc = push_range(p, 0, G_MAX_CP);
                if (!rc) rc = finish_class(p, first, 0, &p->any_cls);
            }
            p->pos++;
            if (!rc) rc = push_el(p, rule, GE_CLASS, p->any_cls);
        } else if (is_word(c)) {
            size_t s = p->pos;
            while (is_word(peek(p, p->pos))) p->pos++;
            uint32_t id;
            rc = named_rule(p, s, p->pos - s, &id);
            if (rc) return rc;
            if (p->rules[id].ref_pos == (size_t)-1) p->rules[id].ref_pos = s;
            last = p->rules[rule].n;
            rc = push_el(p, rule, GE_REF, id);
        } else if (c == '(') {
            size_t open = p->pos;
            if (p->depth >= G_MAX_NEST) return perr(p, open, "parentheses nested too deeply (max %d)", G_MAX_NEST);
            uint32_t id;
            rc = new_rule(p, p->rules[rule].origin, &id);
            if (rc) return rc;
            p->rules[id].defined = 1;
            p->depth++;
            p->pos = skip_space(p, p->pos + 1, 1);
            rc = parse_alternates(p, id, 1);
            p->depth--;
            if (rc) return rc;
            if (peek(p, p->pos) != ')') { char b[16]; return perr(p, p->pos, "expected ')' to close the '(' opened at offset %zu, found %s", open, desc(p, p->pos, b)); }
            p->pos++;
            last = p->rules[rule].n;
            rc = push_el(p, rule, GE_REF, id);
        } else if (c == '*' || c == '+' || c == '?') {
            if (last == UINT32_MAX) return perr(p, p->pos, "'%c' without an item before it", c);
            p->pos++;
            rc = repeat_item(p, rule, last, c == '+' ? 1 : 0, c == '?' ? 1 : -1);
        } else if (c == '{') {
            size_t open = p->pos;
            if (last == UINT32_MAX) return perr(p, open, "'{' without an item before it");
            p->pos = skip_space(p, p->pos + 1, 1);
            long mn = 0, mx = 0;
            rc = parse_count(p, &mn);
            if (rc == 1) return perr(p, p->pos, "expected a number after '{'");
            if (rc) return rc;
            p->pos = skip_space(p, p->pos, 1);
            if (peek(p, p->pos) == ',') {
                p->pos = skip_space(p, p->pos + 1, 1);
                rc = parse_count(p, &mx);
                if (rc == 1) mx = -1;
                else if (rc) return rc;
                p->pos = skip_space(p, p->pos, 1);
            } else mx = mn;
            if (peek(p, p->pos) != '}') { char b[16]; return perr(p, p->pos, "expected '}' in repetition, found %s", desc(p, p->pos, b)); }
            p->pos++;
            if (mx >= 0 && mn > mx) return perr(p, open, "repetition bounds {%ld,%ld}: minimum exceeds maximum", mn, mx);
            rc = repeat_item(p, rule, last, mn, mx);
            if (p->rules[rule].n == last) last = UINT32_MAX;  /* x{0} removed the item */
        } else {
            return CB_OK;
        }
        if (rc) return rc;
        p->pos = skip_space(p, p->pos, nested);
    }
}

static int parse_alternates(parser *p, uint32_t rule, int nested) {
    int rc = parse_sequence(p, rule, nested);
    if (rc) return rc;
    while (peek(p, p->pos) == '|') {
        rc = push_el(p, rule, GE_ALT, 0);
        if (rc) return rc;
        p->pos = skip_space(p, p->pos + 1, nested);
        rc = parse_sequence(p, rule, nested);
        if (rc) return rc;
    }
    return push_el(p, rule, GE_END, 0);
}

static int parse_grammar(parser *p) {
    p->pos = skip_all(p, 0);
    if (p->pos >= p->len) return perr(p, p->pos, "empty grammar (no rules)");
    while (p->pos < p->len) {
        size_t s = p->pos;
        while (is_word(peek(p, p->pos))) p->pos++;
        if (p->pos == s) { char b[16]; return perr(p, s, "expected a rule name, found %s", desc(p, s, b)); }
        uint32_t id;
        int rc = named_rule(p, s, p->pos - s, &id);
        if (rc) return rc;
        if (p->rules[id].defined) return perr(p, s, "rule '%.*s' defined twice", (int)(p->pos - s), p->src + s);
        p->rules[id].defined = 1;
        p->rules[id].def_pos = s;
        p->rules[id].name_off = (uint32_t)s;
        while (peek(p, p->pos) == ' ' || peek(p, p->pos) == '\t') p->pos++;
        if (!(peek(p, p->pos) == ':' && peek(p, p->pos + 1) == ':' && peek(p, p->pos + 2) == '=')) {
            char b[16];
            return perr(p, p->pos, "expected '::=' after rule name '%.*s', found %s", (int)(p->pos - s) > 64 ? 64 : (int)(p->pos - s), p->src + s, desc(p, p->pos, b));
        }
        /* after ::= the body may start on the next line */
        p->pos = skip_all(p, p->pos + 3);
        rc = parse_alternates(p, id, 0);
        if (rc) return rc;
        int c = peek(p, p->pos);
        if (c >= 0 && c != '\n' && c != '\r') {
            char b[16];
            return perr(p, p->pos, "unexpected %s in rule '%.*s'", desc(p, p->pos, b), (int)p->rules[id].name_len > 64 ? 64 : (int)p->rules[id].name_len, p->src + p->rules[id].name_off);
        }
        p->pos = skip_all(p, p->pos);
    }
    return CB_OK;
}

/* ------------------------------------------------------------ analysis */

static void parser_free(parser *p) {
    for (uint32_t i = 0; i < p->n_rules; i++) free(p->rules[i].e);
    free(p->rules);
    free(p->chain);
    free(p->bucket);
    free(p->rng);
    free(p->cls_off);
}

/* A terminal can match at least one valid code point. */
static int terminal_ok(const parser *p, const gelem *e) {
    if (e->type == GE_CHAR) return e->value <= G_MAX_CP && !(e->value >= 0xD800 && e->value <= 0xDFFF);
    return p->cls_off[e->value + 1] > p->cls_off[e->value];
}

/* Rule name for messages (the named rule a generated one came from). */
static void rule_name(const parser *p, uint32_t r, const char **s, int *n) {
    const prule *o = &p->rules[p->rules[r].origin];
    *s = p->src + o->name_off;
    *n = (int)(o->name_len > 64 ? 64 : o->name_len);
}

/* Productive rules (derive some finite string) and nullable rules (derive
 * the empty string), by fixpoint.  An alternative is productive when every
 * element is a satisfiable terminal or a reference to a productive rule;
 * unproductive alternatives are dropped later, so the matcher never enters a
 * path that cannot finish (no dead ends from the grammar itself). */
static int alt_productive(const parser *p, const gelem *e, const uint8_t *prod) {
    for (; !is_eos(e); e++) {
        if (e->type == GE_REF) { if (!prod[e->value]) return 0; }
        else if (!terminal_ok(p, e)) return 0;
    }
    return 1;
}

static void analyse(const parser *p, uint8_t *prod, uint8_t *nullable) {
    int changed = 1;
    while (changed) {
        changed = 0;
        for (uint32_t r = 0; r < p->n_rules; r++) {
            const prule *ru = &p->rules[r];
            const gelem *e = ru->e;
            int pr = 0, nu = 0;
            for (uint32_t i = 0; i < ru->n; ) {
                if (alt_productive(p, e + i, prod)) {
                    pr = 1;
                    int all = 1;
                    for (uint32_t j = i; !is_eos(&e[j]); j++)
                        if (e[j].type != GE_REF || !nullable[e[j].value]) { all = 0; break; }
                    if (all) nu = 1;
                }
                while (!is_eos(&e[i])) i++;
                i++;  /* past ALT / END */
            }
            if (pr && !prod[r]) { prod[r] = 1; changed = 1; }
            if (nu && !nullable[r]) { nullable[r] = 1; changed = 1; }
        }
    }
}

/* Left recursion: edge A -> B when B is referenced in a productive
 * alternative of A after only nullable references (B can start A's
 * expansion without consuming input).  An edge is "tail" when the reference
 * is the last element: expanding it pushes no continuation, so a cycle of
 * tail edges revisits identical stacks (the matcher's dedupe stops it,
 * e.g. rec ::= x? rec | ε).  Any cycle holding a non-tail edge would grow a
 * stack forever without consuming input, so it is rejected.  Cycles are
 * found as strongly connected components (iterative Tarjan). */
static int check_left_recursion(parser *p, const uint8_t *prod, const uint8_t *nullable) {
    uint32_t R = p->n_rules;
    uint32_t *off = calloc((size_t)R + 1, sizeof *off);
    if (!off) return nomem(p);
    /* count, then fill */
    uint32_t *to = NULL;
    uint8_t *tail = NULL;
    uint32_t ne = 0;
    for (int pass = 0; pass < 2; pass++) {
        ne = 0;
        for (uint32_t r = 0; r < R; r++) {
            if (pass == 0) off[r] = ne;
            const prule *ru = &p->rules[r];
            const gelem *e = ru->e;
            for (uint32_t i = 0; i < ru->n; ) {
                int prod_alt = alt_productive(p, e + i, prod);
                uint32_t j = i;
                for (; !is_eos(&e[j]); j++) {
                    if (!prod_alt) continue;
                    if (e[j].type != GE_REF) { prod_alt = 0; continue; }
                    if (pass) { to[ne] = e[j].value; tail[ne] = is_eos(&e[j + 1]); }
                    ne++;
                    if (!nullable[e[j].value]) prod_alt = 0;
                }
                i = j + 1;
            }
        }
        if (pass == 0) {
            off[R] = ne;
            to = malloc(((size_t)ne + 1) * sizeof *to);
            tail = malloc((size_t)ne + 1);
            if (!to || !tail) { free(off); free(to); free(tail); return nomem(p); }
        }
    }
    uint32_t *idx = malloc((size_t)R * sizeof *idx), *low = malloc((size_t)R * sizeof *low);
    uint32_t *comp = malloc((size_t)R * sizeof *comp), *st = malloc((size_t)R * sizeof *st);
    uint32_t *cv = malloc((size_t)R * sizeof *cv), *ce = malloc((size_t)R * sizeof *ce);
    uint8_t *on = calloc(R ? R : 1, 1);
    int rc = CB_OK;
    if (!idx || !low || !comp || !st || !cv || !ce || !on) { rc = nomem(p); goto done; }
    for (uint32_t i = 0; i < R; i++) idx[i] = UINT32_MAX;
    uint32_t counter = 0, sp = 0, ncomp = 0;
    for (uint32_t s = 0; s < R; s++) {
        if (idx[s] != UINT32_MAX) continue;
        uint32_t cs = 0;
        cv[cs] = s; ce[cs] = off[s]; cs++;
        idx[s] = low[s] = counter++; st[sp++] = s; on[s] = 1;
        while (cs) {
            uint32_t v = cv[cs - 1];
            if (ce[cs - 1] < off[v + 1]) {
                uint32_t w = to[ce[cs - 1]++];
                if (idx[w] == UINT32_MAX) {
                    idx[w] = low[w] = counter++; st[sp++] = w; on[w] = 1;
                    cv[cs] = w; ce[cs] = off[w]; cs++;
                } else if (on[w] && idx[w] < low[v]) low[v] = idx[w];
            } else {
                cs--;
                if (low[v] == idx[v]) {
                    uint32_t w;
                    do { w = st[--sp]; on[w] = 0; comp[w] = ncomp; } while (w != v);
                    ncomp++;
                }
                if (cs) { uint32_t u = cv[cs - 1]; if (low[v] < low[u]) low[u] = low[v]; }
            }
        }
    }
    for (uint32_t r = 0; r < R && !rc; r++)
        for (uint32_t k = off[r]; k < off[r + 1]; k++)
            if (!tail[k] && comp[to[k]] == comp[r]) {
                const char *s; int n;
                rule_name(p, r, &s, &n);
                const prule *o = &p->rules[p->rules[r].origin];
                rc = perr(p, o->def_pos, "rule '%.*s' is left-recursive (it can reach itself without consuming input)", n, s);
                break;
            }
done:
    free(off); free(to); free(tail); free(idx); free(low); free(comp); free(st); free(cv); free(ce); free(on);
    return rc;
}

/* ------------------------------------------------------------ vocabulary trie */

typedef struct { const uint8_t *b; uint32_t n; int32_t id; } tokref;

static int tokref_cmp(const void *a, const void *b) {
    const tokref *x = a, *y = b;
    uint32_t n = x->n < y->n ? x->n : y->n;
    int c = n ? memcmp(x->b, y->b, n) : 0;
    if (c) return c;
    if (x->n != y->n) return x->n < y->n ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int build_vocab(cb_grammar *g, const cb_vocab_view *v, char *err, size_t err_len) {
    int n = v->n_vocab;
    if (n < 0 || (n > 0 && (!v->off || !v->bytes))) { snprintf(err, err_len, "bad vocabulary"); return CB_ERR_ARG; }
    for (int i = 0; i < n; i++)
        if (v->off[i + 1] < v->off[i]) { snprintf(err, err_len, "bad vocabulary offsets at token %d", i); return CB_ERR_ARG; }
    uint32_t total = n ? v->off[n] - v->off[0] : 0;
    g->n_vocab = n;
    g->tok_bytes = malloc(total ? total : 1);
    g->tok_off = malloc(((size_t)n + 1) * sizeof *g->tok_off);
    g->tok_kind = malloc(n ? (size_t)n : 1);
    g->eog_ids = malloc((n ? (size_t)n : 1) * sizeof *g->eog_ids);
    if (!g->tok_bytes || !g->tok_off || !g->tok_kind || !g->eog_ids) goto oom;
    if (total) memcpy(g->tok_bytes, v->bytes + v->off[0], total);
    uint32_t n_text = 0, text_bytes = 0;
    int max_len = 0;
    for (int i = 0; i <= n; i++) g->tok_off[i] = n ? v->off[i] - v->off[0] : 0;
    for (int i = 0; i < n; i++) {
        uint32_t len = g->tok_off[i + 1] - g->tok_off[i];
        if (v->eog && v->eog[i]) { g->tok_kind[i] = 2; g->eog_ids[g->n_eog++] = i; }
        else if ((v->type && v->type[i] == 3) || len == 0 || len > 65535) g->tok_kind[i] = 1;
        else { g->tok_kind[i] = 0; n_text++; text_bytes += len; if ((int)len > max_len) max_len = (int)len; }
    }
    g->max_depth = max_len;
    tokref *t = malloc((n_text ? n_text : 1) * sizeof *t);
    if (!t) goto oom;
    uint32_t k = 0;
    for (int i = 0; i < n; i++)
        if (g->tok_kind[i] == 0) { t[k].b = g->tok_bytes + g->tok_off[i]; t[k].n = g->tok_off[i + 1] - g->tok_off[i]; t[k].id = i; k++; }
    qsort(t, n_text, sizeof *t, tokref_cmp);
    /* at most one node per byte of text */
    size_t cap = text_bytes ? text_bytes : 1;
    g->tn_byte = malloc(cap);
    g->tn_depth = malloc(cap * sizeof *g->tn_depth);
    g->tn_end = malloc(cap * sizeof *g->tn_end);
    g->tn_tok_off = malloc((cap + 1) * sizeof *g->tn_tok_off);
    g->tn_tok = malloc((n_text ? n_text : 1) * sizeof *g->tn_tok);
    uint32_t *path = malloc(((size_t)max_len + 1) * sizeof *path);  /* open node at each depth */
    if (!g->tn_byte || !g->tn_depth || !g->tn_end || !g->tn_tok_off || !g->tn_tok || !path) { free(t); free(path); goto oom; }
    uint32_t nn = 0, plen = 0, ntok = 0;
    const tokref *prev = NULL;
    for (uint32_t i = 0; i < n_text; i++) {
        uint32_t lcp = 0;
        if (prev) {
            uint32_t m = prev->n < t[i].n ? prev->n : t[i].n;
            while (lcp < m && prev->b[lcp] == t[i].b[lcp]) lcp++;
        }
        while (plen > lcp) g->tn_end[path[--plen]] = nn;  /* close nodes off the shared prefix */
        for (uint32_t d = lcp; d < t[i].n; d++) {
            g->tn_byte[nn] = t[i].b[d];
            g->tn_depth[nn] = (uint16_t)(d + 1);
            g->tn_tok_off[nn] = ntok;
            path[plen++] = nn++;
        }
        /* sorted order: the token's node is the last one created */
        g->tn_tok[ntok++] = t[i].id;
        prev = &t[i];
    }
    while (plen) g->tn_end[path[--plen]] = nn;
    g->tn_tok_off[nn] = ntok;
    /* deepest node per subtree: children lie after their parent in preorder
     * (first child i+1, next sibling at the child's end), so one backward pass */
    g->tn_maxd = malloc(cap * sizeof *g->tn_maxd);
    if (!g->tn_maxd) { free(t); free(path); goto oom; }
    for (uint32_t i = nn; i-- > 0; ) {
        uint16_t md = g->tn_depth[i];
        for (uint32_t c = i + 1; c < g->tn_end[i]; c = g->tn_end[c]) if (g->tn_maxd[c] > md) md = g->tn_maxd[c];
        g->tn_maxd[i] = md;
    }
    /* nodes created without tokens: tn_tok_off must be non-decreasing, which
     * it is (set to the running count at creation); a node's tokens are those
     * added before the next node was created. */
    g->n_nodes = nn;
    free(t);
    free(path);
    return CB_OK;
oom:
    snprintf(err, err_len, "out of memory building the vocabulary trie");
    return CB_ERR_NOMEM;
}

/* ------------------------------------------------------------ shortest completions */

static uint32_t mc_add(uint32_t a, uint32_t b) {  /* a, b <= G_MC_INF: no overflow */
    uint32_t s = a + b;
    return s >= G_MC_INF ? G_MC_INF : s;
}

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

void cb_grammar_free(cb_grammar *g) {
    if (!g) return;
    free(g->el); free(g->alt_off); free(g->alt_pos); free(g->rng); free(g->cls_off);
    free(g->tok_bytes); free(g->tok_off); free(g->tok_kind); free(g->eog_ids);
    free(g->tn_byte); free(g->tn_depth); free(g->tn_end); free(g->tn_tok_off); free(g->tn_tok); free(g->tn_maxd);
    free(g->rem);
    if (g->sc_ready) pthread_mutex_destroy(&g->sc_lock);
    free(g->sc_mask); free(g->sc_key);
    free(g);
}

int cb_grammar_n_vocab(const cb_grammar *g) { return g ? g->n_vocab : 0; }

int cb_grammar_compile_vocab(const cb_vocab_view *vocab, const char *text, size_t len,
                             cb_grammar **out, char *err, size_t err_len) {
    char dummy[8];
    if (!err || !err_len) { err = dummy; err_len = sizeof dummy; }
    err[0] = 0;
    if (!out) { snprintf(err, err_len, "out is NULL"); return CB_ERR_ARG; }
    *out = NULL;
    if (!vocab || (!text && len)) { snprintf(err, err_len, "NULL vocabulary or text"); return CB_ERR_ARG; }
    parser P;
    memset(&P, 0, sizeof P);
    P.src = text ? text : "";
    P.len = len;
    P.err = err;
    P.err_len = err_len;
    P.any_cls = UINT32_MAX;
    int rc = CB_OK;
    uint8_t *prod = NULL, *nullable = NULL;
    cb_grammar *g = NULL;
    P.bucket = malloc(PB * sizeof *P.bucket);
    if (!P.bucket) { rc = nomem(&P); goto fail; }
    for (int i = 0; i < PB; i++) P.bucket[i] = -1;
    const char *nul = len ? memchr(P.src, 0, len) : NULL;
    if (nul) { rc = perr(&P, (size_t)(nul - P.src), "NUL byte in grammar text"); goto fail; }
    rc = parse_grammar(&P);
    if (rc) goto fail;
    /* every referenced name must be defined; root must exist */
    uint32_t root = UINT32_MAX;
    for (uint32_t r = 0; r < P.n_rules; r++) {
        prule *ru = &P.rules[r];
        if (!ru->named) continue;
        if (!ru->defined) {
            rc = perr(&P, ru->ref_pos, "undefined rule '%.*s'", (int)(ru->name_len > 64 ? 64 : ru->name_len), P.src + ru->name_off);
            goto fail;
        }
        if (ru->name_len == 4 && memcmp(P.src + ru->name_off, "root", 4) == 0) root = r;
    }
    if (root == UINT32_MAX) { rc = perr(&P, 0, "no 'root' rule (the start rule must be named root)"); goto fail; }
    prod = calloc(P.n_rules, 1);
    nullable = calloc(P.n_rules, 1);
    if (!prod || !nullable) { rc = nomem(&P); goto fail; }
    analyse(&P, prod, nullable);
    if (!prod[root]) { rc = perr(&P, P.rules[root].def_pos, "rule 'root' matches no finite string (empty classes or recursion without a base case)"); goto fail; }
    rc = check_left_recursion(&P, prod, nullable);
    if (rc) goto fail;

    /* flatten */
    g = calloc(1, sizeof *g);
    if (!g) { rc = nomem(&P); goto fail; }
    g->n_rules = P.n_rules;
    g->root = root;
    g->el = malloc((P.n_elems ? P.n_elems : 1) * sizeof *g->el);
    g->alt_off = malloc(((size_t)P.n_rules + 1) * sizeof *g->alt_off);
    size_t n_alts = 0;
    for (uint32_t r = 0; r < P.n_rules; r++)
        for (uint32_t i = 0; i < P.rules[r].n; i++) if (is_eos(&P.rules[r].e[i])) n_alts++;
    g->alt_pos = malloc((n_alts ? n_alts : 1) * sizeof *g->alt_pos);
    if (!g->el || !g->alt_off || !g->alt_pos) { rc = nomem(&P); goto fail; }
    uint32_t *start = malloc(((size_t)P.n_rules + 1) * sizeof *start);
    if (!start) { rc = nomem(&P); goto fail; }
    uint32_t ne = 0;
    for (uint32_t r = 0; r < P.n_rules; r++) {
        start[r] = ne;
        memcpy(g->el + ne, P.rules[r].e, P.rules[r].n * sizeof *g->el);
        ne += P.rules[r].n;
    }
    g->n_el = ne;
    uint32_t na = 0;
    for (uint32_t r = 0; r < P.n_rules; r++) {
        g->alt_off[r] = na;
        const gelem *e = P.rules[r].e;
        for (uint32_t i = 0; i < P.rules[r].n; ) {
            if (prod[r] && alt_productive(&P, e + i, prod)) g->alt_pos[na++] = start[r] + i;
            while (!is_eos(&e[i])) i++;
            i++;
        }
    }
    g->alt_off[P.n_rules] = na;
    free(start);
    g->n_cls = P.n_cls;
    g->rng = P.rng; P.rng = NULL;
    g->cls_off = P.cls_off; P.cls_off = NULL;
    if (!g->cls_off) { g->cls_off = calloc(1, sizeof *g->cls_off); if (!g->cls_off) { rc = nomem(&P); goto fail; } }
    rc = compute_min_lengths(g);
    if (rc) { nomem(&P); goto fail; }
    rc = build_vocab(g, vocab, err, err_len);
    if (rc) goto fail;
    g->sc_words = ((uint32_t)g->n_vocab + 31) / 32;
    g->sc_mask = malloc((size_t)G_SC_N * (g->sc_words ? g->sc_words : 1) * sizeof *g->sc_mask);
    g->sc_key = malloc((size_t)G_SC_N * G_SC_KEY * sizeof *g->sc_key);
    if (!g->sc_mask || !g->sc_key || pthread_mutex_init(&g->sc_lock, NULL) != 0) { rc = nomem(&P); goto fail; }
    g->sc_ready = 1;
    for (int i = 0; i < G_SC_N; i++) { g->sc_nkey[i] = UINT32_MAX; g->sc_used[i] = 0; }
    parser_free(&P);
    free(prod); free(nullable);
    *out = g;
    return CB_OK;
fail:
    if (!err[0]) snprintf(err, err_len, "grammar compilation failed (status %d)", rc);
    parser_free(&P);
    free(prod); free(nullable);
    cb_grammar_free(g);
    return rc;
}

int cb_grammar_compile(const cb_model *model, const char *text, size_t len,
                       cb_grammar **out, char *err, size_t err_len) {
    if (out) *out = NULL;
    if (!model || !model->tok_off) {
        if (err && err_len) snprintf(err, err_len, "model has no vocabulary");
        return CB_ERR_ARG;
    }
    cb_vocab_view v = { model->info.n_vocab, model->tok_bytes, model->tok_off, model->tok_type, model->tok_eog };
    return cb_grammar_compile_vocab(&v, text, len, out, err, err_len);
}

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
    int full = 0;
    if (prem == 0) {
        if (byte < 0x80) { pval = byte; full = 1; }
        else if ((byte & 0xE0) == 0xC0) { pval = byte & 0x1F; prem = 1; plen = 2; }
        else if ((byte & 0xF0) == 0xE0) { pval = byte & 0x0F; prem = 2; plen = 3; }
        else if ((byte & 0xF8) == 0xF0) { pval = byte & 0x07; prem = 3; plen = 4; }
        else return 0;
    } else {
        if ((byte & 0xC0) != 0x80) return 0;
        pval = (pval << 6) | (byte & 0x3F);
        prem--;
        if (prem == 0) { full = 1; if (pval < minv[plen]) return 0; }
    }
    const uint32_t *sw = P->arena + s->off;
    uint32_t snw = s->nwords;
    uint32_t nw = 0, ns = 0;
    if (!full) {
        /* keep the stacks whose top can still match a code point starting
         * with these bytes: [lo, hi], clipped to what the length can encode */
        uint32_t lo = pval << (6 * prem), hi = lo | ((1u << (6 * prem)) - 1);
        if (lo < minv[plen]) lo = minv[plen];
        if (hi > G_MAX_CP) hi = G_MAX_CP;
        if (lo > hi) return 0;
        for (uint32_t i = 0; i < snw; i += 1 + sw[i]) {
            uint32_t len = sw[i];
            if (len == 0 || !term_overlaps(g, &g->el[sw[i + len]], lo, hi)) continue;
            memcpy(m->out + nw, sw + i, (1 + len) * sizeof *sw);
            nw += 1 + len;
            ns++;
        }
        if (!ns) return 0;
    } else {
        uint32_t cp = pval;
        build_reset(m);
        uint32_t nt = 0;
        for (uint32_t i = 0; i < snw; i += 1 + sw[i]) {
            uint32_t len = sw[i];
            if (len == 0) continue;
            uint32_t top = sw[i + len];
            if (!term_overlaps(g, &g->el[top], cp, cp)) continue;
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
    free(m->walk); free(m->mc_mask);
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
    m->walk = malloc(((size_t)g->max_depth + 2) * sizeof *m->walk);
    m->n_words = ((uint32_t)g->n_vocab + 31) / 32;
    m->mc_mask = malloc((size_t)M_MASK_CACHE * (m->n_words ? m->n_words : 1) * sizeof *m->mc_mask);
    if (!m->pool[0].st || !m->pool[0].arena || !m->pool[0].mc || !m->pool[1].st || !m->pool[1].arena || !m->pool[1].mc || !m->ht || !m->trans ||
        !m->remap || !m->bw || !m->bs_off || !m->bs_len || !m->vis || !m->vis_gen || !m->todo || !m->res || !m->out ||
        !m->walk || !m->mc_mask) {
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
    if (g->tok_kind[token] == 2) {
        if (!cb_matcher_is_accepting(m)) return CB_ERR_ARG;
        hist_push(m);
        m->finished = 1;
        return CB_OK;
    }
    if (g->tok_kind[token] != 0) return CB_ERR_ARG;
    return cb_matcher_accept_bytes(m, g->tok_bytes + g->tok_off[token], g->tok_off[token + 1] - g->tok_off[token]);
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
    pthread_mutex_lock(&g->sc_lock);
    for (int i = 0; i < G_SC_N; i++)
        if (g->sc_nkey[i] == s->nwords && g->sc_hash[i] == s->hash && g->sc_part[i] == part &&
            memcmp(g->sc_key + (size_t)i * G_SC_KEY, key, s->nwords * sizeof *key) == 0) {
            memcpy(mask, g->sc_mask + (size_t)i * g->sc_words, g->sc_words * sizeof *mask);
            g->sc_used[i] = ++g->sc_tick;
            count = g->sc_count[i];
            *maxmc = g->sc_maxmc[i];
            break;
        }
    pthread_mutex_unlock(&g->sc_lock);
    if (count >= 0) m->stats.shared_hits++;
    return count;
}

static void shared_store(cb_matcher *m, const uint32_t *mask, int count, uint32_t maxmc) {
    cb_grammar *g = (cb_grammar *)m->g;
    const mstate *s = &m->pool[m->cur_pool].st[m->cur];
    if (s->nwords > G_SC_KEY) return;
    const uint32_t *key = m->pool[m->cur_pool].arena + s->off;
    pthread_mutex_lock(&g->sc_lock);
    int lru = 0;
    for (int i = 1; i < G_SC_N; i++) if (g->sc_used[i] < g->sc_used[lru]) lru = i;
    g->sc_nkey[lru] = s->nwords;
    g->sc_hash[lru] = s->hash;
    g->sc_part[lru] = s->pval | (uint32_t)s->prem << 24 | (uint32_t)s->plen << 28;
    g->sc_count[lru] = count;
    g->sc_maxmc[lru] = maxmc;
    g->sc_used[lru] = ++g->sc_tick;
    if (s->nwords) memcpy(g->sc_key + (size_t)lru * G_SC_KEY, key, s->nwords * sizeof *key);
    memcpy(g->sc_mask + (size_t)lru * g->sc_words, mask, g->sc_words * sizeof *mask);
    pthread_mutex_unlock(&g->sc_lock);
}

/* The mask walk: preorder over the trie, one cached transition per node,
 * a dead state skips the node's whole subtree.  With a budget (anything
 * below G_MC_UNLIMITED) a token is set only if its end state's shortest
 * completion is within the budget; since one byte lowers the shortest
 * completion by at most one, a node whose state needs more than budget +
 * (bytes still below it in the trie) skips its subtree too.  *maxmc gets
 * the largest shortest completion over the set tokens' end states. */
static int walk_trie(cb_matcher *m, uint32_t *mask, uint32_t budget, uint32_t *maxmc) {
    const cb_grammar *g = m->g;
    const uint8_t *byte = g->tn_byte;
    const uint16_t *depth = g->tn_depth, *maxd = g->tn_maxd;
    const uint32_t *end = g->tn_end, *toff = g->tn_tok_off;
    const int32_t *tok = g->tn_tok;
    uint16_t *st = m->walk;
    const uint16_t *trans = m->trans;
    const uint32_t *mcs = m->pool[m->cur_pool].mc;
    uint32_t n = g->n_nodes, i = 0, visited = 0, hi = 0;
    int count = 0;
    st[0] = m->cur;
    m->walk_n = 1;
    while (i < n) {
        uint32_t d = depth[i];
        visited++;
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
                mask[id >> 5] |= 1u << (id & 31);
                count++;
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
    for (int i = 0; i < g->n_eog; i++) { int id = g->eog_ids[i]; mask[id >> 5] |= 1u << (id & 31); (*count)++; }
}

/* The unbudgeted mask of the current state (not finished): matcher cache,
 * shared cache, or a walk; *maxmc as in walk_trie. */
static int mask_unbudgeted(cb_matcher *m, uint32_t *mask, uint32_t *maxmc) {
    int count = mask_cache_get(m, mask, G_MC_UNLIMITED, maxmc);
    if (count >= 0) return count;
    count = shared_lookup(m, mask, maxmc);
    if (count < 0) {
        memset(mask, 0, m->n_words * sizeof *mask);
        count = walk_trie(m, mask, G_MC_UNLIMITED, maxmc);
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
    count = walk_trie(m, mask, b, &maxmc);
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
    out->trie_size = m->g->n_nodes;
}
