/*
 * grammar_impl.h — what the grammar modules share, and nothing else
 * includes:
 *   grammar_parse.c  GBNF text -> checked, flattened rule tables
 *   grammar.c        compilation: shortest completions, terminal coverage, cb_grammar
 *   grammar_vocab.c  the vocabulary as the matcher walks it (byte tries, plain tokens),
 *                    built once per vocabulary and shared by every grammar over it
 *   grammar_match.c  the pushdown matcher, token masks, budgets
 * The public API is in colibri.h, test hooks in grammar.h.
 */
#ifndef CB_GRAMMAR_IMPL_H
#define CB_GRAMMAR_IMPL_H

#include <stdint.h>
#include <stddef.h>
#include <pthread.h>

#include "colibri.h"
#include "grammar.h"

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
#define M_PV_ANY        0xFFFFFFFFu /* partial code point whose every completion every kept stack accepts */

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

static inline int is_eos(const gelem *e) { return e->type == GE_END || e->type == GE_ALT; }

#define G_PLAIN_MAX     16         /* longest plain token (code points) the plain fast path covers */

/* ------------------------------------------------------------ vocabulary */

/* A byte trie of tokens, nodes in preorder (depth >= 1): each node knows
 * where its subtree ends, so a dead state skips the subtree in one jump. */
typedef struct {
    uint32_t  n_nodes;
    uint8_t  *byte;       /* [n_nodes] byte on the edge into the node */
    uint16_t *depth;      /* [n_nodes] 1 = child of the root */
    uint32_t *end;        /* [n_nodes] index just past the node's subtree */
    uint32_t *tok_off;    /* [n_nodes + 1] tokens ending at node i: tok[tok_off[i]..tok_off[i+1]) */
    int32_t  *tok;        /* token ids in trie order */
    uint16_t *maxd;       /* [n_nodes] deepest depth in the node's subtree (itself included) */
    uint64_t *sub;        /* [2 * n_nodes] or NULL: which ASCII code points the subtree's plain
                           * tokens hold after their first code point (bit c of word c >> 6),
                           * and bit 0 (G_SUB_HIGH): some hold one above 0x7F there */
} gtrie;

#define G_SUB_HIGH      1ull       /* gtrie.sub word 0, bit 0 (no ASCII code point of P is below 0x20) */

/* The vocabulary as the matcher needs it.  Immutable once built; shared by
 * every grammar compiled against the same model (cb_model_gvocab).
 *
 * Plain tokens: the bytes are 1..G_PLAIN_MAX complete UTF-8 code points,
 * each in P = [0x20, 0x10FFFF] minus '"', '\\' and the surrogates: exactly
 * what a JSON string holds unescaped.  Inside a JSON string most of a
 * vocabulary is plain (145,034 of Qwen2.5's 151,936 tokens), and a state
 * whose every stack top either admits all of P or none of it steps the same
 * way on every code point of P: such tokens are allowed by length alone
 * (grammar_match.c), and only the `rest` trie needs a walk.
 *
 * More generally a state steps the same way on every code point of an
 * atom U of P, when its stack tops admit all of P above 0x7F or none of
 * it: U = P minus a few ASCII code points (a string under a `pattern` such
 * as [^/]+; an additional property's name, whose first character must not
 * start a declared name), or U = ASCII code points only (an e-mail's local
 * part, a [a-z0-9-]+ slug).  Then the plain tokens whose first code point
 * is in U_1 and whose others are in U_rest are allowed by length
 * (plain_first and plain_rest select them); the `rest` trie is walked, and
 * the whole trie too, skipping every subtree whose plain tokens are all
 * such (gtrie.sub). */
typedef struct gvocab {
    int       n_vocab;
    uint8_t  *tok_bytes;  /* concatenated bytes */
    uint32_t *tok_off;    /* [n_vocab + 1] */
    uint8_t  *tok_kind;   /* [n_vocab] 0 text token (in the trie), 1 never allowed (control / empty), 2 end of generation */
    int32_t  *eog_ids;    /* [n_eog] */
    int       n_eog;
    int       max_depth;  /* longest text token in bytes */
    uint32_t  n_words;    /* mask words: (n_vocab + 31) / 32 */
    gtrie     all;        /* every text token */
    gtrie     rest;       /* text tokens that are not plain */
    uint32_t *plain;      /* [G_PLAIN_MAX * n_words] plain tokens with exactly L code points at (L - 1) * n_words */
    uint32_t *plain_upto; /* [G_PLAIN_MAX * n_words] ... with 1..L code points */
    uint32_t  n_plain_len[G_PLAIN_MAX + 1]; /* [L] plain tokens with exactly L code points */
    uint32_t  n_plain;    /* plain tokens */
    uint32_t *plain_first;/* [G_PROWS * n_words] plain tokens whose first code point is ASCII c, at (c - 0x20) * n_words;
                           * row G_PROW_HIGH: ... is above 0x7F */
    uint32_t *plain_rest; /* [G_PROWS * n_words] plain tokens holding ASCII c after their first code point; row
                           * G_PROW_HIGH: holding one above 0x7F there */
    uint32_t  n_first[97];/* [G_PROWS] tokens in each plain_first row */
} gvocab;

#define G_PROWS         97         /* code points 0x20..0x7F (the ASCII part of P; the '"' and '\\' rows stay empty) + "above 0x7F" */
#define G_PROW_HIGH     96

int  gvocab_build(const cb_vocab_view *v, gvocab **out, char *err, size_t err_len);
void gvocab_free(gvocab *v);
/* The model's vocabulary, built on first use and kept by the model (thread-safe). */
int  cb_model_gvocab(const cb_model *model, const gvocab **out, char *err, size_t err_len);

/* ------------------------------------------------------------ grammar */

/* How a terminal's code points meet P (see gvocab): the ASCII part bit by
 * bit, the rest (P above 0x7F) all, none or part of it. */
enum { GP_NONE = 0, GP_ALL = 1, GP_PART = 2 };

/* Shared mask cache: masks are a pure function of the parse state, so
 * matchers of the same grammar (other requests, other engines) share the
 * masks they computed.  Entries are keyed by the state's encoding (not by
 * ids, which are per matcher).  The one mutable part of a grammar, guarded
 * by its lock. */
typedef struct {
    pthread_mutex_t lock;
    int       ready;      /* 1: lock initialized and buffers allocated */
    uint32_t  words;      /* mask words per entry */
    uint32_t *mask;       /* [G_SC_N * words] */
    uint32_t *key;        /* [G_SC_N * G_SC_KEY] state encodings */
    uint32_t  nkey[G_SC_N];   /* words of key (UINT32_MAX = empty slot) */
    uint32_t  hash[G_SC_N];   /* state hash (includes the partial code point) */
    uint32_t  part[G_SC_N];   /* pval | prem << 24 | plen << 28 */
    int32_t   count[G_SC_N];  /* allowed tokens */
    uint32_t  maxmc[G_SC_N];  /* largest shortest-completion over the allowed tokens' end states */
    uint64_t  used[G_SC_N];   /* LRU tick */
    uint64_t  tick;
} gmask_cache;

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
    uint64_t *cls_ascii;  /* [2 * n_cls] the ASCII code points of P class c admits (bit c of word c >> 6) */
    uint8_t  *cls_high;   /* [n_cls] GP_*: how class c meets P above 0x7F */
    /* Shortest completions (bytes), from the min-length analysis
     * (compute_min_lengths): rem[p] = fewest bytes that finish the
     * alternative holding element p, starting at p (0 at its ALT/END;
     * G_MC_INF in unproductive alternatives, which the matcher never enters).
     * A stack's shortest completion is the sum of rem over its positions. */
    uint32_t *rem;        /* [n_el] */
    const gvocab *v;      /* the vocabulary (the model's, shared; or own) */
    gvocab   *own_v;      /* set when the grammar owns it (cb_grammar_compile_vocab) */
    int       n_vocab;
    gmask_cache sc;
};

/* grammar_parse.c: parse and check `text`, then fill g's rule tables (el,
 * n_el, n_rules, alt_off, alt_pos, root, rng, cls_off, n_cls).  Errors name
 * line and column. */
int grammar_parse_into(cb_grammar *g, const char *text, size_t len, char *err, size_t err_len);

/* Sum of shortest-completion lengths, saturating at G_MC_INF (a, b <= G_MC_INF: no overflow). */
static inline uint32_t mc_add(uint32_t a, uint32_t b) {
    uint32_t s = a + b;
    return s >= G_MC_INF ? G_MC_INF : s;
}

/* The ASCII code points of P (0x20..0x7F without '"' and '\\'), as a sub / E mask. */
static const uint64_t G_P_ASCII[2] = { 0xFFFFFFFB00000000ull, 0xFFFFFFFFEFFFFFFFull };

/* How terminal e meets P: the ASCII code points of P it admits into a,
 * and how it meets P above 0x7F (GP_ALL, GP_NONE, GP_PART) as the result. */
static inline int term_p(const cb_grammar *g, const gelem *e, uint64_t a[2]) {
    if (e->type == GE_CHAR) {
        uint32_t c = e->value;
        a[0] = a[1] = 0;
        if (c >= 0x80) return GP_PART;  /* one code point above 0x7F: part of them */
        a[c >> 6] = (1ull << (c & 63)) & G_P_ASCII[c >> 6];
        return GP_NONE;
    }
    a[0] = g->cls_ascii[2 * e->value];
    a[1] = g->cls_ascii[2 * e->value + 1];
    return g->cls_high[e->value];
}

#endif
