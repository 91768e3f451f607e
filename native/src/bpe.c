/*
 * bpe.c — byte-level BPE tokenizer (see bpe.h for the contract).
 *
 * Build: two open-addressing hash tables over copies of the vocabulary:
 *   token text (byte-level form, as stored in the GGUF) -> id
 *   (left id, right id) -> (merge rank, merged id)
 * plus the id of every single-byte token.
 *
 * Tokenize: pre-tokens are found one at a time by a hand-written matcher of
 * the model's split regex (leftmost-first alternation, as Oniguruma runs it;
 * each alternative's backtracking is worked out by hand in the comments), then
 * each pre-token is merged with a binary min-heap of (rank, position) — the
 * same order HF tokenizers and llama.cpp use: lowest rank first, leftmost on
 * ties.  Everything per call lives in the caller's scratch.
 */
#include "bpe.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe_unicode.h"
#include "gguf.h"
#include "model.h"
#include "util.h"

/* How a pre-tokenizer splits text (groups of tokenizer.ggml.pre names). */
typedef enum {
    PRE_GPT2 = 0,     /* GPT-2 regex */
    PRE_DIGITS_GPT2,  /* every numeric character alone, then GPT-2 regex on the rest */
    PRE_LLAMA3,       /* llama3 regex (\p{N}{1,3}); whole pre-tokens in the vocab skip merging */
    PRE_QWEN2         /* llama3 regex with single \p{N} */
} pre_kind;

typedef struct {
    const char *name;  /* tokenizer.ggml.pre value */
    pre_kind    kind;
} pre_name;

/* Same grouping as colibri_lab/tokenizer.py PRE_TOKENIZERS (from llama.cpp). */
static const pre_name PRE_NAMES[] = {
    { "smollm", PRE_DIGITS_GPT2 }, { "starcoder", PRE_DIGITS_GPT2 }, { "refact", PRE_DIGITS_GPT2 },
    { "codeshell", PRE_DIGITS_GPT2 }, { "exaone", PRE_DIGITS_GPT2 }, { "minerva-7b", PRE_DIGITS_GPT2 },
    { "gpt-2", PRE_GPT2 }, { "phi-2", PRE_GPT2 }, { "jina-es", PRE_GPT2 }, { "jina-de", PRE_GPT2 },
    { "gigachat", PRE_GPT2 }, { "jina-v1-en", PRE_GPT2 }, { "jina-v2-es", PRE_GPT2 },
    { "jina-v2-de", PRE_GPT2 }, { "jina-v2-code", PRE_GPT2 }, { "roberta-bpe", PRE_GPT2 },
    { "llama3", PRE_LLAMA3 }, { "llama-v3", PRE_LLAMA3 }, { "llama-bpe", PRE_LLAMA3 },
    { "falcon3", PRE_LLAMA3 }, { "pixtral", PRE_LLAMA3 },
    { "qwen2", PRE_QWEN2 }, { "deepseek-r1-qwen", PRE_QWEN2 }, { "megrez", PRE_QWEN2 },
};

/* One (left, right) merge in the pair table. */
typedef struct {
    uint64_t key;     /* (left id << 32) | right id; PAIR_EMPTY for a free slot */
    uint32_t rank;    /* position in tokenizer.ggml.merges: lower merges first */
    int32_t  merged;  /* id of the token left+right */
} pair_slot;

#define PAIR_EMPTY UINT64_MAX
/* Longest input one call takes: keeps positions in int32 and scratch finite. */
#define MAX_INPUT ((size_t)1 << 30)

struct cb_bpe {
    int        n_vocab;        /* tokens */
    pre_kind   pre;            /* how text is split before merging */
    int32_t    byte_tok[256];  /* id of the token that is exactly byte b, -1 if the vocabulary has none */
    uint8_t    byte_chr[256][2]; /* UTF-8 of byte b's byte-level character (GPT-2 bytes_to_unicode) */
    uint8_t    byte_chr_len[256];/* its length: 1 or 2 */
    uint8_t    cls_lo[256];    /* CB_UNI_* class bits of code points < 256 (fast path) */
    char      *text;           /* every token's text, concatenated (owned) */
    uint64_t  *text_off;       /* [n_vocab + 1]: token i is text[text_off[i] .. text_off[i+1]) */
    int32_t   *vocab;          /* [vocab_mask + 1] open addressing: token id or -1 */
    uint64_t   vocab_mask;     /* table size - 1 (a power of two >= 2 * n_vocab) */
    pair_slot *pairs;          /* [pair_mask + 1] open addressing */
    uint64_t   pair_mask;      /* table size - 1 */
};

/* ------------------------------------------------------------- hashing */

static uint64_t hash_bytes(const uint8_t *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;  /* FNV-1a, then a final mix */
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t key) {
    key *= 0x9e3779b97f4a7c15ull;
    return key ^ (key >> 31);
}

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* Id of the token whose stored text is s[0..n), or -1. */
static int32_t vocab_find(const cb_bpe *b, const uint8_t *s, size_t n) {
    for (uint64_t i = hash_bytes(s, n) & b->vocab_mask;; i = (i + 1) & b->vocab_mask) {
        int32_t id = b->vocab[i];
        if (id < 0) return -1;
        uint64_t off = b->text_off[id], len = b->text_off[id + 1] - off;
        if (len == n && memcmp(b->text + off, s, n) == 0) return id;
    }
}

/* Merge of (left, right): rank and merged id, or 0 if there is none. */
static inline int pair_find(const cb_bpe *b, int32_t left, int32_t right, uint32_t *rank, int32_t *merged) {
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    for (uint64_t i = hash_pair(key) & b->pair_mask;; i = (i + 1) & b->pair_mask) {
        const pair_slot *p = &b->pairs[i];
        if (p->key == key) { *rank = p->rank; *merged = p->merged; return 1; }
        if (p->key == PAIR_EMPTY) return 0;
    }
}

/* ------------------------------------------------------------- unicode */

/* Class bits of code point cp (binary search over the generated ranges). */
static int uni_class_search(uint32_t cp) {
    int lo = 0, hi = CB_UNI_N_RANGES - 1;  /* find the last range starting <= cp */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if ((CB_UNI_RANGES[mid] >> 4) <= cp) lo = mid;
        else hi = mid - 1;
    }
    return (int)(CB_UNI_RANGES[lo] & 15);
}

/* One character of the input: a valid UTF-8 scalar value, or a lone byte of
 * invalid UTF-8 (which no regex class but "other" matches). */
typedef struct {
    uint32_t cp;   /* code point; INVALID_CP for an invalid byte */
    int      len;  /* bytes: 1..4 */
    int      cls;  /* CB_UNI_* bits (0 = other) */
} uchar;

#define INVALID_CP 0xFFFFFFFFu

/* Decode the character at s[p], p < e; strict UTF-8 (no overlongs, no
 * surrogates, nothing above U+10FFFF): anything else is a 1-byte invalid char. */
static inline uchar get_char(const cb_bpe *b, const uint8_t *s, size_t p, size_t e) {
    uchar u;
    uint8_t c = s[p];
    if (c < 0x80) { u.cp = c; u.len = 1; u.cls = b->cls_lo[c]; return u; }
    int len = 0;
    uint32_t cp = 0;
    uint8_t lo = 0x80, hi = 0xBF;  /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    if (len == 0 || (size_t)len > e - p || s[p + 1] < lo || s[p + 1] > hi) goto invalid;
    for (int i = 1; i < len; i++) {
        if ((s[p + i] & 0xC0) != 0x80) goto invalid;
        cp = (cp << 6) | (s[p + i] & 0x3F);
    }
    u.cp = cp; u.len = len;
    u.cls = cp < 256 ? b->cls_lo[cp] : uni_class_search(cp);
    return u;
invalid:
    u.cp = INVALID_CP; u.len = 1; u.cls = 0;
    return u;
}

#define CLS_LNS (CB_UNI_L | CB_UNI_N | CB_UNI_S)

/* End of the run of characters from p (< e) whose class satisfies the test:
 * want != 0: cls & want; want == 0: "other" (no L, N or S bit). */
static size_t run_of(const cb_bpe *b, const uint8_t *s, size_t p, size_t e, int want) {
    while (p < e) {
        uchar u = get_char(b, s, p, e);
        if (want ? !(u.cls & want) : (u.cls & CLS_LNS)) break;
        p += (size_t)u.len;
    }
    return p;
}

/* Shared tail of both regexes: `\s+(?!\S)|\s+` at p, where s[p] is whitespace.
 * \s+ runs to r; (?!\S) holds at r only if r is the segment end; otherwise
 * backtracking gives back the last whitespace character, after which the next
 * char is whitespace, so the lookahead holds — if at least one char remains.
 * A single whitespace char before \S falls through to plain \s+. */
static size_t match_space_tail(const cb_bpe *b, const uint8_t *s, size_t p, size_t e) {
    size_t r = p, last = p;
    int k = 0;
    while (r < e) {
        uchar u = get_char(b, s, r, e);
        if (!(u.cls & CB_UNI_S)) break;
        last = r;
        r += (size_t)u.len;
        k++;
    }
    if (r == e || k < 2) return r;
    return last;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * Returns the end of the match starting at p (< e); always > p. */
static size_t match_gpt2(const cb_bpe *b, const uint8_t *s, size_t p, size_t e) {
    if (s[p] == '\'' && p + 1 < e) {  /* contractions are disjoint: order is irrelevant */
        uint8_t a = s[p + 1];
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return p + 2;
        if (p + 2 < e) {
            uint8_t c = s[p + 2];
            if ((a == 'r' && c == 'e') || (a == 'v' && c == 'e') || (a == 'l' && c == 'l')) return p + 3;
        }
    }
    /* L, N, other and \s are disjoint, so the first character after the
     * optional space decides which of the three ` ?X+` alternatives matches;
     * a space followed by whitespace (or nothing) matches none of them. */
    size_t start = (s[p] == ' ' && p + 1 < e) ? p + 1 : p;
    uchar u = get_char(b, s, start, e);
    if (u.cls & CB_UNI_L) return run_of(b, s, start, e, CB_UNI_L);
    if (u.cls & CB_UNI_N) return run_of(b, s, start, e, CB_UNI_N);
    if (!(u.cls & CLS_LNS)) return run_of(b, s, start, e, 0);
    return match_space_tail(b, s, p, e);
}

/* ASCII lower case. */
static inline uint8_t lower(uint8_t c) { return (c >= 'A' && c <= 'Z') ? (uint8_t)(c + 32) : c; }

/* llama3 / qwen2:
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_n}
 *   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+                        */
static size_t match_llama3(const cb_bpe *b, const uint8_t *s, size_t p, size_t e, int max_n) {
    if (s[p] == '\'' && p + 1 < e) {
        uint8_t a = lower(s[p + 1]);
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return p + 2;
        /* Oniguruma's case folding also maps U+017F LATIN SMALL LETTER LONG S to 's' */
        if (p + 2 < e && s[p + 1] == 0xC5 && s[p + 2] == 0xBF) return p + 3;
        if (p + 2 < e) {
            uint8_t c = lower(s[p + 2]);
            if ((a == 'r' && c == 'e') || (a == 'v' && c == 'e') || (a == 'l' && c == 'l')) return p + 3;
        }
    }
    uchar u = get_char(b, s, p, e);
    /* [^\r\n\p{L}\p{N}]?\p{L}+ : greedy optional prefix first */
    if (u.cls & CB_UNI_L) return run_of(b, s, p, e, CB_UNI_L);
    if (!(u.cls & CB_UNI_N) && u.cp != '\r' && u.cp != '\n' && p + (size_t)u.len < e) {
        uchar v = get_char(b, s, p + (size_t)u.len, e);
        if (v.cls & CB_UNI_L) return run_of(b, s, p + (size_t)u.len, e, CB_UNI_L);
    }
    /* \p{N}{1,max_n} */
    if (u.cls & CB_UNI_N) {
        size_t q = p;
        for (int k = 0; k < max_n && q < e; k++) {
            uchar v = get_char(b, s, q, e);
            if (!(v.cls & CB_UNI_N)) break;
            q += (size_t)v.len;
        }
        return q;
    }
    /* ` ?[^\s\p{L}\p{N}]+[\r\n]*` */
    size_t start = (s[p] == ' ' && p + 1 < e) ? p + 1 : p;
    uchar w = get_char(b, s, start, e);
    if (!(w.cls & CLS_LNS)) {
        size_t q = run_of(b, s, start, e, 0);
        while (q < e && (s[q] == '\r' || s[q] == '\n')) q++;
        return q;
    }
    /* here s[p] is whitespace.  \s*[\r\n]+ : greedy \s* gives back characters
     * until a \r or \n follows; [\r\n]+ then takes that one (the next char, if
     * any, is neither: it is past the last \r\n of the run).  So the match
     * ends after the last \r or \n of the whitespace run, if there is one. */
    size_t q = p, end_nl = 0;
    while (q < e) {
        uchar v = get_char(b, s, q, e);
        if (!(v.cls & CB_UNI_S)) break;
        q += (size_t)v.len;
        if (v.cp == '\r' || v.cp == '\n') end_nl = q;
    }
    if (end_nl) return end_nl;
    return match_space_tail(b, s, p, e);
}

/* ------------------------------------------------------------ merging */

/* Per-call working memory carved from the caller's scratch. */
typedef struct {
    uint64_t *heap;   /* [3n] (rank << 32) | position of a candidate merge; min-heap */
    int32_t  *sym;    /* [n] token id of the symbol starting at byte i; -1 once merged away */
    int32_t  *next;   /* [n] next live symbol, -1 at the end */
    int32_t  *prev;   /* [n] previous live symbol, -1 at the start */
    uint8_t  *text;   /* [2n] byte-level text of a pre-token (ignore_merges lookup) */
} work;

static void heap_push(uint64_t *h, int *n, uint64_t v) {
    int i = (*n)++;
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (h[parent] <= v) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, int *n) {
    uint64_t top = h[0], v = h[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (v <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = v;
    return top;
}

/* Queue the merge of the symbols at i and next[i], if there is one. */
static inline void push_pair(const cb_bpe *b, work *w, int *hn, int32_t i) {
    if (i < 0 || w->next[i] < 0) return;
    uint32_t rank;
    int32_t merged;
    if (pair_find(b, w->sym[i], w->sym[w->next[i]], &rank, &merged))
        heap_push(w->heap, hn, ((uint64_t)rank << 32) | (uint32_t)i);
}

static inline void emit(int32_t *out, int cap, int *count, int32_t id) {
    if (*count < cap) out[*count] = id;
    (*count)++;
}

/* BPE of one pre-token s[0..n), n >= 1; appends its ids. */
static void bpe_word(const cb_bpe *b, work *w, const uint8_t *s, size_t n, int32_t *out, int cap, int *count) {
    if (n == 1) { emit(out, cap, count, b->byte_tok[s[0]]); return; }
    if (b->pre == PRE_LLAMA3) {  /* ignore_merges: a whole pre-token in the vocabulary is one token */
        size_t t = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(w->text + t, b->byte_chr[s[i]], b->byte_chr_len[s[i]]);
            t += b->byte_chr_len[s[i]];
        }
        int32_t id = vocab_find(b, w->text, t);
        if (id >= 0) { emit(out, cap, count, id); return; }
    }
    int32_t m = (int32_t)n;
    for (int32_t i = 0; i < m; i++) {
        w->sym[i] = b->byte_tok[s[i]];
        w->prev[i] = i - 1;
        w->next[i] = i + 1 < m ? i + 1 : -1;
    }
    int hn = 0;
    for (int32_t i = 0; i + 1 < m; i++) push_pair(b, w, &hn, i);
    while (hn > 0) {
        uint64_t top = heap_pop(w->heap, &hn);
        int32_t i = (int32_t)(uint32_t)top;
        uint32_t want = (uint32_t)(top >> 32), rank;
        int32_t j, merged;
        /* stale entries: the left symbol was merged away, or its right
         * neighbour changed (ranks are unique per pair, so equal rank = same pair) */
        if (w->sym[i] < 0 || (j = w->next[i]) < 0) continue;
        if (!pair_find(b, w->sym[i], w->sym[j], &rank, &merged) || rank != want) continue;
        w->sym[i] = merged;
        w->sym[j] = -1;
        w->next[i] = w->next[j];
        if (w->next[j] >= 0) w->prev[w->next[j]] = i;
        push_pair(b, w, &hn, w->prev[i]);
        push_pair(b, w, &hn, i);
    }
    for (int32_t i = 0; i >= 0; i = w->next[i]) emit(out, cap, count, w->sym[i]);
}

/* ----------------------------------------------------------- tokenize */

size_t cb_bpe_scratch_size(size_t n) {
    if (n > MAX_INPUT) return SIZE_MAX;
    if (n == 0) n = 1;
    /* heap 3n u64 + sym/next/prev 3n i32 + text 2n bytes, plus alignment slack */
    return n * (3 * sizeof(uint64_t) + 3 * sizeof(int32_t) + 2) + 16;
}

/* 1 if s[0..n) is all whitespace and ends with \r or \n (a `\s*[\r\n]+` match). */
static int ws_newline(const cb_bpe *b, const uint8_t *s, size_t n) {
    if (n == 0 || (s[n - 1] != '\r' && s[n - 1] != '\n')) return 0;
    return run_of(b, s, 0, n, CB_UNI_S) == n;
}

/* Bytes at the end of s[0..n) that are a valid but incomplete UTF-8
 * sequence (0 if none): more input may complete them into any character. */
static size_t incomplete_tail(const uint8_t *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        uint8_t c = s[n - k];
        if ((c & 0xC0) == 0x80) continue;  /* continuation: look further back */
        size_t need = (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (need <= k) return 0;  /* ASCII, invalid lead, or complete */
        if (k >= 2) {  /* the second byte's range depends on the lead */
            uint8_t c1 = s[n - k + 1];
            uint8_t lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
            if (c1 < lo || c1 > hi) return 0;
        }
        return k;
    }
    return 0;
}

int cb_bpe_tokenize(const cb_bpe *b, const uint8_t *s, size_t n, int32_t *out, int cap,
                    void *scratch, size_t scratch_size) {
    return cb_bpe_tokenize_ex(b, s, n, out, cap, scratch, scratch_size, NULL);
}

int cb_bpe_tokenize_ex(const cb_bpe *b, const uint8_t *s, size_t n, int32_t *out, int cap,
                       void *scratch, size_t scratch_size, int *n_stable) {
    if (n_stable) *n_stable = 0;
    if (!b || (n && !s) || cap < 0 || (cap > 0 && !out) || n > MAX_INPUT) return CB_ERR_ARG;
    if (n == 0) return 0;
    if (!scratch || scratch_size < cb_bpe_scratch_size(n)) return CB_ERR_ARG;
    /* A byte without a token cannot be produced by any id sequence.  The
     * reference silently drops it (HF BPE without unk, llama.cpp alike) and
     * merges across the gap; a caller that needs the exact bytes back (jump-
     * forward, drafts) must know instead, so this refuses the whole input. */
    for (size_t i = 0; i < n; i++)
        if (b->byte_tok[s[i]] < 0) return CB_ERR_UNSUPPORTED;
    work w;
    uintptr_t base = ((uintptr_t)scratch + 7) & ~(uintptr_t)7;  /* caller scratch may be unaligned */
    w.heap = (uint64_t *)base;
    w.sym = (int32_t *)(w.heap + 3 * n);
    w.next = w.sym + n;
    w.prev = w.next + n;
    w.text = (uint8_t *)(w.prev + n);
    int count = 0;
    /* for n_stable: where the last two pre-tokens start (bytes and ids) */
    size_t last_p = 0, prev_p = 0;
    int last_count = 0, prev_count = 0;
    size_t p = 0;
    while (p < n) {
        size_t e = n;  /* end of the segment the regex sees */
        if (b->pre == PRE_DIGITS_GPT2) {
            /* numeric characters are pre-tokens of their own, and the regex
             * runs on the text between them separately (its lookahead stops there) */
            uchar u = get_char(b, s, p, n);
            if (u.cls & CB_UNI_D) {
                prev_p = last_p; prev_count = last_count; last_p = p; last_count = count;
                bpe_word(b, &w, s + p, (size_t)u.len, out, cap, &count);
                p += (size_t)u.len;
                continue;
            }
            e = p;
            while (e < n) {
                uchar v = get_char(b, s, e, n);
                if (v.cls & CB_UNI_D) break;
                e += (size_t)v.len;
            }
        }
        while (p < e) {
            size_t q = b->pre == PRE_LLAMA3 ? match_llama3(b, s, p, e, 3)
                     : b->pre == PRE_QWEN2  ? match_llama3(b, s, p, e, 1)
                                            : match_gpt2(b, s, p, e);
            prev_p = last_p; prev_count = last_count; last_p = p; last_count = count;
            bpe_word(b, &w, s + p, q - p, out, cap, &count);
            p = q;
        }
    }
    if (n_stable && incomplete_tail(s, n)) {
        /* a cut character may complete into a letter and join the pre-token
         * before it: what is stable is what is stable without it (the same
         * leading ids, by the argument below) */
        int rc = cb_bpe_tokenize_ex(b, s, n - incomplete_tail(s, n), NULL, 0, scratch, scratch_size, n_stable);
        if (rc < 0) *n_stable = 0;
    } else if (n_stable) {
        /* Every match but the last ended where the regex decided on characters
         * inside the input (a run stopped at a char of another class, a
         * lookahead saw whitespace), so more text cannot change it.  Exception,
         * llama3/qwen2 only: `\s*[\r\n]+` followed by trailing whitespace
         * ("\n  ") — another "\n" would join all of it into one match. */
        *n_stable = last_count;
        if ((b->pre == PRE_LLAMA3 || b->pre == PRE_QWEN2) && last_p > prev_p &&
            run_of(b, s, last_p, n, CB_UNI_S) == n && ws_newline(b, s + prev_p, last_p - prev_p))
            *n_stable = prev_count;
    }
    return count;
}

int cb_bpe_tokenize_alloc(const cb_bpe *b, const uint8_t *s, size_t n, int32_t *out, int cap) {
    size_t need = cb_bpe_scratch_size(n);
    if (need == SIZE_MAX) return CB_ERR_ARG;
    void *scratch = malloc(need);
    if (!scratch) return CB_ERR_NOMEM;
    int rc = cb_bpe_tokenize(b, s, n, out, cap, scratch, need);
    free(scratch);
    return rc;
}

int cb_bpe_n_vocab(const cb_bpe *b) { return b ? b->n_vocab : 0; }

int cb_bpe_byte_token(const cb_bpe *b, uint8_t byte) { return b ? b->byte_tok[byte] : -1; }

/* --------------------------------------------------------------- build */

void cb_bpe_free(cb_bpe *b) {
    if (!b) return;
    free(b->text);
    free(b->text_off);
    free(b->vocab);
    free(b->pairs);
    free(b);
}

/* Length of the UTF-8 character starting with byte c (1 for invalid bytes). */
static size_t utf8_len(uint8_t c) {
    return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF8 ? 4 : 1;
}

static int build(const cb_gguf_str *tokens, int n_tokens, const cb_gguf_str *merges, int n_merges,
                 const char *pre, size_t pre_len, cb_bpe **out, char *err, size_t err_len) {
    *out = NULL;
    int kind = -1;
    for (size_t i = 0; i < sizeof PRE_NAMES / sizeof PRE_NAMES[0]; i++)
        if (strlen(PRE_NAMES[i].name) == pre_len && memcmp(PRE_NAMES[i].name, pre, pre_len) == 0)
            kind = (int)PRE_NAMES[i].kind;
    if (kind < 0) {
        set_err(err, err_len, "unsupported tokenizer.ggml.pre '%.*s' for the C tokenizer", (int)(pre_len > 64 ? 64 : pre_len), pre);
        return CB_ERR_UNSUPPORTED;
    }
    if (n_tokens < 256 || n_tokens > (1 << 24) || n_merges < 0) {
        set_err(err, err_len, "vocabulary of %d tokens / %d merges is out of range", n_tokens, n_merges);
        return CB_ERR_FORMAT;
    }
    cb_bpe *b = calloc(1, sizeof *b);
    if (!b) { set_err(err, err_len, "out of memory"); return CB_ERR_NOMEM; }
    b->n_vocab = n_tokens;
    b->pre = (pre_kind)kind;
    int rc = CB_ERR_NOMEM;
    uint64_t total = 0, max_merge = 0;
    for (int i = 0; i < n_tokens; i++) total += tokens[i].len;
    for (int k = 0; k < n_merges; k++) if (merges[k].len > max_merge) max_merge = merges[k].len;
    b->text = malloc(total ? total : 1);
    b->text_off = malloc(((size_t)n_tokens + 1) * sizeof *b->text_off);
    b->vocab_mask = pow2_at_least(2 * (uint64_t)n_tokens) - 1;
    b->vocab = malloc((b->vocab_mask + 1) * sizeof *b->vocab);
    b->pair_mask = pow2_at_least(2 * (uint64_t)n_merges) - 1;
    b->pairs = malloc((b->pair_mask + 1) * sizeof *b->pairs);
    char *cat = malloc(max_merge ? max_merge : 1);  /* left+right of one merge */
    if (!b->text || !b->text_off || !b->vocab || !b->pairs || !cat) { set_err(err, err_len, "out of memory"); goto fail; }
    memset(b->vocab, 0xff, (b->vocab_mask + 1) * sizeof *b->vocab);
    for (uint64_t i = 0; i <= b->pair_mask; i++) b->pairs[i].key = PAIR_EMPTY;

    /* text -> id; a repeated text maps to its last id (as a Python dict built in order) */
    uint64_t off = 0;
    for (int id = 0; id < n_tokens; id++) {
        b->text_off[id] = off;
        if (tokens[id].len) memcpy(b->text + off, tokens[id].ptr, tokens[id].len);
        off += tokens[id].len;
        b->text_off[id + 1] = off;
        const uint8_t *t = (const uint8_t *)b->text + b->text_off[id];
        uint64_t i = hash_bytes(t, tokens[id].len) & b->vocab_mask;
        for (;; i = (i + 1) & b->vocab_mask) {
            int32_t o = b->vocab[i];
            if (o < 0) break;
            uint64_t ooff = b->text_off[o], olen = b->text_off[o + 1] - ooff;
            if (olen == tokens[id].len && memcmp(b->text + ooff, t, olen) == 0) break;
        }
        b->vocab[i] = id;
    }

    /* GPT-2 bytes_to_unicode: printable bytes stand for themselves, the other
     * 68 become U+0100.. in increasing byte order. */
    int n_other = 0;
    for (int c = 0; c < 256; c++) {
        int printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255);
        uint32_t cp = printable ? (uint32_t)c : 256u + (uint32_t)n_other++;
        if (cp < 0x80) { b->byte_chr[c][0] = (uint8_t)cp; b->byte_chr_len[c] = 1; }
        else {
            b->byte_chr[c][0] = (uint8_t)(0xC0 | (cp >> 6));
            b->byte_chr[c][1] = (uint8_t)(0x80 | (cp & 0x3F));
            b->byte_chr_len[c] = 2;
        }
        /* real vocabularies lack some: SmolLM2 has no token for 21 bytes
         * (0x04, 0x06, ..., 0xC0, 0xC1, 0xF1, 0xF2, 0xF5..0xFF) */
        b->byte_tok[c] = vocab_find(b, b->byte_chr[c], b->byte_chr_len[c]);
        b->cls_lo[c] = (uint8_t)uni_class_search((uint32_t)c);
    }
    for (int c = 33; c <= 126; c++)
        if (b->byte_tok[c] < 0) {
            set_err(err, err_len, "'%c' has no single-byte token: not a byte-level BPE vocabulary", c);
            rc = CB_ERR_UNSUPPORTED;
            goto fail;
        }

    /* merges "left right": split at the first space after the first character
     * (as llama.cpp and the Python side do: a part is never empty).  A merge
     * whose parts or result are not tokens can never apply: skipped. */
    for (int k = 0; k < n_merges; k++) {
        const char *m = merges[k].ptr;
        size_t len = merges[k].len, first = len ? utf8_len((uint8_t)m[0]) : 0, sp = first;
        while (sp < len && m[sp] != ' ') sp++;
        if (len == 0 || sp >= len) {
            set_err(err, err_len, "tokenizer.ggml.merges[%d] is not 'left right'", k);
            rc = CB_ERR_FORMAT;
            goto fail;
        }
        int32_t left = vocab_find(b, (const uint8_t *)m, sp);
        int32_t right = vocab_find(b, (const uint8_t *)m + sp + 1, len - sp - 1);
        if (left < 0 || right < 0) continue;
        memcpy(cat, m, sp);
        memcpy(cat + sp, m + sp + 1, len - sp - 1);
        int32_t merged = vocab_find(b, (const uint8_t *)cat, len - 1);
        if (merged < 0) continue;
        uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
        uint64_t i = hash_pair(key) & b->pair_mask;
        while (b->pairs[i].key != PAIR_EMPTY && b->pairs[i].key != key) i = (i + 1) & b->pair_mask;
        /* a repeated pair keeps its last rank, as HF tokenizers' merge map does */
        b->pairs[i].key = key;
        b->pairs[i].rank = (uint32_t)k;
        b->pairs[i].merged = merged;
    }
    free(cat);
    *out = b;
    return CB_OK;
fail:
    free(cat);
    cb_bpe_free(b);
    return rc;
}

int cb_bpe_build_arrays(const char *const *tokens, const size_t *tok_len, int n_tokens,
                        const char *const *merges, const size_t *merge_len, int n_merges,
                        const char *pre, cb_bpe **out, char *err, size_t err_len) {
    if (!out) return CB_ERR_ARG;
    *out = NULL;
    if (!tokens || !tok_len || n_tokens <= 0 || n_merges < 0 || (n_merges && (!merges || !merge_len)) || !pre) {
        set_err(err, err_len, "bad arguments");
        return CB_ERR_ARG;
    }
    cb_gguf_str *t = malloc((size_t)n_tokens * sizeof *t);
    cb_gguf_str *m = malloc(((size_t)n_merges + 1) * sizeof *m);
    if (!t || !m) { free(t); free(m); set_err(err, err_len, "out of memory"); return CB_ERR_NOMEM; }
    for (int i = 0; i < n_tokens; i++) { t[i].ptr = tokens[i]; t[i].len = tok_len[i]; }
    for (int k = 0; k < n_merges; k++) { m[k].ptr = merges[k]; m[k].len = merge_len[k]; }
    int rc = build(t, n_tokens, m, n_merges, pre, strlen(pre), out, err, err_len);
    free(t);
    free(m);
    return rc;
}

/* The string array under `key`, or NULL with err set. */
static const cb_gguf_kv *str_array(const cb_gguf *g, const char *key, char *err, size_t err_len) {
    int64_t i = cb_gguf_find_key(g, key);
    if (i < 0) { set_err(err, err_len, "no '%s' in the model: cannot build the BPE tokenizer", key); return NULL; }
    const cb_gguf_kv *kv = &g->kv[i];
    if (kv->type != GGUF_T_ARR || kv->arr_type != GGUF_T_STR || kv->arr_len > (1u << 24)) {
        set_err(err, err_len, "'%s' must be an array of at most 2^24 strings", key);
        return NULL;
    }
    return kv;
}

int cb_bpe_build(const cb_model *model, cb_bpe **out, char *err, size_t err_len) {
    if (!out) return CB_ERR_ARG;
    *out = NULL;
    if (!model) { set_err(err, err_len, "no model"); return CB_ERR_ARG; }
    const cb_gguf *g = &model->gguf;
    cb_gguf_str name, pre;
    if (cb_gguf_get_str(g, "tokenizer.ggml.model", &name, NULL, 0) != CB_OK || name.len != 4 || memcmp(name.ptr, "gpt2", 4) != 0) {
        set_err(err, err_len, "the C tokenizer needs tokenizer.ggml.model = 'gpt2' (byte-level BPE)");
        return CB_ERR_UNSUPPORTED;
    }
    if (cb_gguf_get_str(g, "tokenizer.ggml.pre", &pre, NULL, 0) != CB_OK) {
        set_err(err, err_len, "no tokenizer.ggml.pre string: the pre-tokenizer is unknown");
        return CB_ERR_UNSUPPORTED;
    }
    const cb_gguf_kv *tok = str_array(g, "tokenizer.ggml.tokens", err, err_len);
    if (!tok) return CB_ERR_UNSUPPORTED;
    const cb_gguf_kv *mer = str_array(g, "tokenizer.ggml.merges", err, err_len);
    if (!mer) return CB_ERR_UNSUPPORTED;
    if (tok->arr_len != (uint64_t)model->info.n_vocab) {
        set_err(err, err_len, "tokenizer.ggml.tokens has %llu entries, the model %d",
                (unsigned long long)tok->arr_len, model->info.n_vocab);
        return CB_ERR_FORMAT;
    }
    return build(tok->arr_str, (int)tok->arr_len, mer->arr_str, (int)mer->arr_len,
                 pre.ptr, pre.len, out, err, err_len);
}
