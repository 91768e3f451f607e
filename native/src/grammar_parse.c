/*
 * grammar_parse.c — GBNF text (llama.cpp's dialect) into checked, flattened
 * rule tables: rules of elements (llama.cpp's shape: CHAR, CLASS, REF, ALT,
 * END), repetitions expanded into generated rules; then productive and
 * nullable rules, left recursion rejected, and one element array with
 * per-rule alternative starts (grammar_parse_into).  Every error names line
 * and column.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>

#include "grammar_impl.h"

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


int grammar_parse_into(cb_grammar *g, const char *text, size_t len, char *err, size_t err_len) {
    parser P;
    memset(&P, 0, sizeof P);
    P.src = text ? text : "";
    P.len = len;
    P.err = err;
    P.err_len = err_len;
    P.any_cls = UINT32_MAX;
    int rc = CB_OK;
    uint8_t *prod = NULL, *nullable = NULL;
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

    /* flatten (whatever g receives is freed by the caller, also on failure) */
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
    parser_free(&P);
    free(prod); free(nullable);
    return CB_OK;
fail:
    if (!err[0]) snprintf(err, err_len, "grammar compilation failed (status %d)", rc);
    parser_free(&P);
    free(prod); free(nullable);
    return rc;
}
