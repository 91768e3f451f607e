/*
 * grammar.h — internal interface of the GBNF grammar compiler and matcher
 * (grammar.c).  The public API is cb_grammar_* / cb_matcher_* in colibri.h;
 * this header adds a constructor over a plain vocabulary (so C tests need no
 * GGUF file) and a few hooks for tests and benchmarks.
 */
#ifndef CB_GRAMMAR_H
#define CB_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"

/* A vocabulary as the grammar compiler needs it.  Token i's bytes are
 * bytes[off[i] .. off[i+1]).  The compiler copies what it keeps, so the view
 * only has to live through the call. */
typedef struct {
    int            n_vocab;  /* tokens, >= 0 */
    const uint8_t *bytes;    /* concatenated token bytes */
    const uint32_t *off;     /* [n_vocab + 1] offsets into bytes, non-decreasing */
    const uint8_t *type;     /* [n_vocab] GGUF token types (3 = control), or NULL (all normal) */
    const uint8_t *eog;      /* [n_vocab] 1 = ends generation, or NULL (none) */
} cb_vocab_view;

/* cb_grammar_compile over a plain vocabulary (what cb_grammar_compile calls
 * with the model's vocabulary). */
int cb_grammar_compile_vocab(const cb_vocab_view *vocab, const char *text, size_t len,
                             cb_grammar **out, char *err, size_t err_len);

/* Vocabulary size the grammar was compiled for (mask has (n+31)/32 words). */
int cb_grammar_n_vocab(const cb_grammar *g);

/* Advance the matcher through raw bytes as if they were one token (for
 * language tests: no vocabulary involved).  CB_ERR_ARG, state unchanged, if
 * the bytes leave the language; counts as one entry for rollback. */
int cb_matcher_accept_bytes(cb_matcher *m, const uint8_t *bytes, size_t n);

/* Counters for tests and benchmarks. */
typedef struct {
    uint64_t mask_calls;      /* cb_matcher_fill_mask calls */
    uint64_t mask_cache_hits; /* of which answered from the per-matcher mask cache */
    uint64_t shared_hits;     /* of which answered from the grammar's shared mask cache */
    uint64_t trie_nodes;      /* trie nodes visited by walks (cache misses) */
    uint64_t transitions;     /* DFA transitions computed (slow path) */
    uint64_t gcs;             /* state-pool compactions */
    uint64_t budget_walks;    /* cb_matcher_fill_mask_budget calls whose budget cut the mask (a pruned walk) */
    uint64_t plain_masks;     /* masks whose plain tokens were set by length (the fast path; see grammar_impl.h) */
    uint32_t n_states;        /* interned states now */
    uint32_t trie_size;       /* nodes in the grammar's vocabulary trie */
} cb_matcher_stats;

void cb_matcher_get_stats(const cb_matcher *m, cb_matcher_stats *out);

/* The current parse state's identity, for tests (e.g. a breadth-first
 * search over bytes that must not revisit states): writes [finished, pval,
 * prem, plen, nwords, stack words...] and returns the word count, or -1 if
 * cap is too small.  Equal keys = equal states. */
int cb_matcher_state_key(const cb_matcher *m, uint32_t *out, int cap);

#endif
