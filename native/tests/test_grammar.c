/*
 * test_grammar.c — GBNF parser, byte-level matcher and token masks
 * (native/src/grammar*.c), over a small synthetic vocabulary.
 *
 *   - ~25 malformed grammars: CB_ERR_FORMAT with "line L, column C" and the
 *     right line and a word naming the problem;
 *   - languages: strings in / out of the language of literals, classes,
 *     negation, `.`, repetition bounds, nesting, recursion, comments,
 *     escapes, UTF-8 ranges, multi-line rules;
 *   - masks equal a brute-force reference (accept each token, roll back) at
 *     every step of seeded random walks; EOG allowed iff accepting; rollback
 *     restores masks exactly; forced bytes; dead end = 0; bounded blow-ups;
 *   - a grammar with thousands of states forces state-pool collections;
 *   - budgets: cb_matcher_min_completion equals a breadth-first search over
 *     bytes at every step of random walks; budgeted masks equal a brute-force
 *     reference (accept, read the shortest completion, roll back), are a
 *     subset of the unbudgeted mask and equal it for a huge budget; an
 *     adversary that always takes the token leaving the longest completion
 *     still ends accepting within the budget (JSON, unbounded arrays,
 *     recursive objects, multibyte literals); saturation on huge grammars.
 *
 * Built alone (src/grammar*.c only): add -DCB_GRAMMAR_STANDALONE.  With the full
 * library, CB_GRAMMAR_BENCH_GGUF=model.gguf also runs a mask benchmark over
 * the model's vocabulary (see bench()).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"
#include "grammar.h"
#include "testutil.h"

/* ------------------------------------------------------------ vocabulary */

#define MAXTOK 400
static uint8_t  vb[8192];
static uint32_t voff[MAXTOK + 1];
static uint8_t  vtype[MAXTOK], veog[MAXTOK];
static int      nv;
static int      tok_ctrl = -1, tok_eog = -1, tok_empty = -1;

static int add_tok(const void *b, size_t n, int type, int eog) {
    memcpy(vb + voff[nv], b, n);
    voff[nv + 1] = voff[nv] + (uint32_t)n;
    vtype[nv] = (uint8_t)type;
    veog[nv] = (uint8_t)eog;
    return nv++;
}
static int add_str(const char *s) { return add_tok(s, strlen(s), 1, 0); }

static void make_vocab(void) {
    nv = 0;
    voff[0] = 0;
    for (int b = 0; b < 256; b++) { uint8_t c = (uint8_t)b; add_tok(&c, 1, 6, 0); }
    const char *multi[] = {
        "ab", "abc", "aa", "{\"", "\"}", "\": ", "()", "((", "))", "true", "null", " ", ", ",
        "[1", "x y", "name", "\"name\"", "\xc3\xa9" /* é */, "\xe6\x97" /* 日, first 2 bytes */,
        "\xe6\x97\xa5" /* 日 */, "\xe6\x97\xa5\xe6\x9c\xac" /* 日本 */, "\xa5" "a", "\x97\xa5",
        "a\xc3", "12", "-1", "0.5", "\n", "\\n", "\\\"", "abab", "ba", "zz", "\xf0\x9f",
        "\xf0\x9f\x98\x80" /* 😀 */, "# ", "a)", "(a", "\"a",
        "/a", "a/", "a/b", "//", "nam", "na", "me", "\xc3\xa9/", "a\xc3\xa9", "b!", "a!", "ame", "e\"",
        "a@", "a@b", "b.c", ".ab", "a-b", "ab.c", "ba@",
    };
    for (size_t i = 0; i < sizeof multi / sizeof *multi; i++) add_str(multi[i]);
    add_str("ab");  /* a duplicate entry: both ids must get the same answer */
    tok_ctrl = add_tok("<|im_start|>", 12, 3, 0);
    tok_eog = add_tok("<|im_end|>", 10, 3, 1);
    tok_empty = add_tok("", 0, 1, 0);
}

static cb_vocab_view vocab(void) {
    cb_vocab_view v = { nv, vb, voff, vtype, veog };
    return v;
}

static cb_grammar *compile(const char *text, int *rc, char *err, size_t err_len) {
    cb_vocab_view v = vocab();
    cb_grammar *g = NULL;
    *rc = cb_grammar_compile_vocab(&v, text, strlen(text), &g, err, err_len);
    return g;
}

static cb_grammar *compile_ok(const char *text) {
    char err[256];
    int rc;
    cb_grammar *g = compile(text, &rc, err, sizeof err);
    CHECK_MSG(rc == CB_OK && g, "compile failed (%d): %s\n  grammar: %s", rc, err, text);
    return g;
}

/* ------------------------------------------------------------ parse errors */

static void test_errors(void) {
    struct { const char *text; int line; const char *what; } bad[] = {
        {"", 1, "empty"},
        {"   \n# only a comment\n", 3, "empty"},
        {"root ::= foo", 1, "undefined rule 'foo'"},
        {"root ::= \"a\"\n\nx ::= y", 3, "undefined rule 'y'"},
        {"root ::= \"abc", 1, "unterminated literal"},
        {"root ::= [a-z", 1, "unterminated character class"},
        {"root ::= \"\\q\"", 1, "bad escape"},
        {"root ::= \"\\x4\"", 1, "hex digits"},
        {"root ::= \"\\U00110000\"", 1, "beyond U+10FFFF"},
        {"a ::= \"x\"", 1, "root"},
        {"root ::= \"a\"{3,2}", 1, "minimum exceeds maximum"},
        {"root ::= \"a\"{99999}", 1, "too large"},
        {"root ::= \"a\"{x}", 1, "number"},
        {"root ::= \"a\"{2", 1, "'}'"},
        {"root ::= root \"a\" | \"a\"", 1, "left-recursive"},
        {"root ::= a\na ::= b \"x\" | \"y\"\nb ::= \"\" | a", 2, "left-recursive"},
        {"root ::= (\"a\"", 1, "')'"},
        {"root ::= \"a\")", 1, "unexpected ')'"},
        {"root ::= * \"a\"", 1, "without an item"},
        {"root ::= \"a\"\nroot ::= \"b\"", 2, "defined twice"},
        {"root \"a\"", 1, "'::='"},
        {"root ::= [z-a]", 1, "invalid range"},
        {"root ::= \"a\"\n  ::= \"b\"", 2, "unexpected ':'"},
        {"root ::= [^\\x00-\\U0010FFFF]", 1, "no finite string"},
        {"root ::= \"a\" root", 1, "no finite string"},
        {"root ::= \"\xff\"", 1, "UTF-8"},
        {"root ::= \"a\"\n\n   x ::= \"\\", 3, "escape"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char err[256] = "";
        int rc;
        cb_grammar *g = compile(bad[i].text, &rc, err, sizeof err);
        CHECK_MSG(rc == CB_ERR_FORMAT && !g, "case %zu: rc %d for: %s", i, rc, bad[i].text);
        char want[32];
        snprintf(want, sizeof want, "line %d, column ", bad[i].line);
        CHECK_MSG(strncmp(err, want, strlen(want)) == 0, "case %zu: want '%s...', got '%s'", i, want, err);
        CHECK_MSG(strstr(err, bad[i].what) != NULL, "case %zu: want '%s' in '%s'", i, bad[i].what, err);
        cb_grammar_free(g);
    }
    /* column is exact for an undefined reference */
    char err[256];
    int rc;
    cb_grammar *g = compile("root ::= \"a\" \n  | \"b\" missing", &rc, err, sizeof err);
    CHECK(rc == CB_ERR_FORMAT && !g);
    CHECK_MSG(strncmp(err, "line 2, column 9:", 17) == 0, "got '%s'", err);
    /* nesting deeper than the limit is an error, not a stack overflow */
    char deep[2000];
    int k = snprintf(deep, sizeof deep, "root ::= ");
    for (int i = 0; i < 600; i++) deep[k++] = '(';
    deep[k++] = '"'; deep[k++] = 'a'; deep[k++] = '"';
    for (int i = 0; i < 600; i++) deep[k++] = ')';
    deep[k] = 0;
    g = compile(deep, &rc, err, sizeof err);
    CHECK_MSG(rc == CB_ERR_FORMAT && strstr(err, "nested too deeply"), "rc %d: %s", rc, err);
    cb_grammar_free(g);
    /* an embedded NUL */
    cb_vocab_view v = vocab();
    g = NULL;
    rc = cb_grammar_compile_vocab(&v, "root ::= \"a\"\0", 13, &g, err, sizeof err);
    CHECK(rc == CB_ERR_FORMAT && !g && strstr(err, "NUL"));
    /* bad arguments */
    CHECK(cb_grammar_compile_vocab(&v, "root ::= \"a\"", 12, NULL, err, sizeof err) == CB_ERR_ARG);
    CHECK(cb_grammar_compile_vocab(NULL, "root ::= \"a\"", 12, &g, err, sizeof err) == CB_ERR_ARG);
    cb_grammar_free(NULL);
    cb_matcher_free(NULL);
}

/* ------------------------------------------------------------ languages */

/* 1 iff s is a complete sentence; fed as one chunk and again byte by byte
 * (both ways must agree). */
static int in_lang(const cb_grammar *g, const char *s, size_t n) {
    cb_matcher *m;
    if (cb_matcher_new(g, &m) != CB_OK) return -1;
    int whole = cb_matcher_accept_bytes(m, (const uint8_t *)s, n) == CB_OK && cb_matcher_is_accepting(m);
    cb_matcher_free(m);
    if (cb_matcher_new(g, &m) != CB_OK) return -1;
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) ok = cb_matcher_accept_bytes(m, (const uint8_t *)s + i, 1) == CB_OK;
    int bytewise = ok && cb_matcher_is_accepting(m);
    cb_matcher_free(m);
    return whole == bytewise ? whole : -2;
}

static void lang(const char *grammar, const char *const *yes, const char *const *no) {
    cb_grammar *g = compile_ok(grammar);
    if (!g) return;
    for (; *yes; yes++) CHECK_MSG(in_lang(g, *yes, strlen(*yes)) == 1, "'%s' should match: %s", *yes, grammar);
    for (; *no; no++) CHECK_MSG(in_lang(g, *no, strlen(*no)) == 0, "'%s' should not match: %s", *no, grammar);
    cb_grammar_free(g);
}

#define L(...) (const char *const[]){__VA_ARGS__, NULL}

static void test_languages(void) {
    lang("root ::= \"abc\"", L("abc"), L("", "ab", "abcd", "abd"));
    lang("root ::= \"a\" | \"bc\" | \"\"", L("a", "bc", ""), L("b", "abc", "aa"));
    lang("root ::= [a-c] [^a-c] [xyz0-9]", L("ad0", "a\xc3\xa9" "5", "c z"), L("aaz", "d1x", "ab", "adq"));
    lang("root ::= . . .", L("abc", "\xe6\x97\xa5\xc3\xa9x", "a\nb"), L("ab", "abcd"));
    lang("root ::= \"a\"* \"b\"+ \"c\"?", L("b", "aab", "abbbc", "bc"), L("", "a", "c", "abcc", "ba"));
    lang("root ::= \"ab\"{2} \"c\"{1,3} \"d\"{2,}", L("ababcdd", "ababcccddddd"), L("abcdd", "ababdd", "ababccccdd", "ababcd"));
    lang("root ::= [0-9]{0,3}", L("", "1", "12", "123"), L("1234", "a"));
    lang("root ::= (\"x\" (\"y\" | \"z\")+ )* \"!\"", L("!", "xy!", "xyzzxz!"), L("x!", "xyx!", "xy"));
    lang("root ::= p\np ::= \"(\" p \")\" p | \"\"", L("", "()", "(())()", "((()())())"), L("(", ")", "(()", "())("));
    lang("# leading comment\nroot ::= a # trailing\n  b   # between\n\na ::= \"a\"\nb ::=\n  \"b\"\n  | \"B\"\n",
         L("ab", "aB"), L("a", "b", "abB"));
    lang("root ::= \"\\x41\\u00e9\\U0001F600\\t\\r\\n\\\\\\\"\\[\\]\"",
         L("A\xc3\xa9\xf0\x9f\x98\x80\t\r\n\\\"[]"), L("A"));
    lang("root ::= [\\]\\[\\-a] [\\x30-\\x32]", L("]0", "[1", "-2", "a0"), L("b0", "]3"));
    lang("root ::= [\xe4\xb8\x80-\xe9\xbe\xa5]+", L("\xe6\x97\xa5", "\xe6\x97\xa5\xe6\x9c\xac"), L("a", "\xc3\xa9", "\xe6\x97"));
    lang("root ::= [^\"\\\\]* \"\\\"\"", L("\"", "abc\"", "\xe6\x97\xa5\""), L("a\\\"", "\"\""));
    lang("root ::= (\"a\"?)* \"b\"", L("b", "ab", "aaab"), L("", "a", "bb"));
    lang("root ::= \"a\"? \"a\"? \"a\"? \"a\"? \"b\"", L("b", "ab", "aaaab"), L("aaaaab", "a"));
    /* the first line's rule continues while lines do not start a new rule */
    lang("root ::= \"a\"\n  \"b\"\n  | \"c\"\nx ::= \"x\"", L("ab", "c"), L("a", "abc", "x"));
    /* invalid UTF-8 / overlong / surrogates never match `.` */
    lang("root ::= .", L("a", "\xc3\xa9", "\xf0\x9f\x98\x80"), L("\xc0\x81", "\xe0\x80\x81", "\xed\xa0\x80", "\x80", "\xf8"));
    lang("root ::= [^a]", L("\xc3\xa9", "b"), L("a", "\xc1\xa1"));
    /* JSON-ish object with a string value */
    lang("root ::= \"{\" ws \"\\\"name\\\"\" ws \":\" ws str ws \"}\"\nstr ::= \"\\\"\" [^\"]* \"\\\"\"\nws ::= [ \\t\\n]*",
         L("{\"name\":\"x\"}", "{ \"name\" : \"a b\" \n}"), L("{\"name\":x}", "{\"nam\":\"x\"}"));
}

/* ------------------------------------------------------------ masks */

static uint64_t rng_state = 0x1234567887654321ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

static int bit(const uint32_t *mask, int t) { return (mask[t >> 5] >> (t & 31)) & 1u; }

/* Brute force: token t is allowed iff accepting it succeeds (then undone). */
static int reference_mask(cb_matcher *m, uint32_t *ref) {
    int words = (nv + 31) / 32, count = 0;
    memset(ref, 0, (size_t)words * 4);
    for (int t = 0; t < nv; t++) {
        if (cb_matcher_accept(m, t) == CB_OK) {
            ref[t >> 5] |= 1u << (t & 31);
            count++;
            if (cb_matcher_rollback(m, 1) != CB_OK) return -1;
        }
    }
    return count;
}

static void walk_check(const char *grammar, int n_walks, int max_len) {
    cb_grammar *g = compile_ok(grammar);
    if (!g) return;
    CHECK(cb_grammar_n_vocab(g) == nv);
    int words = (nv + 31) / 32;
    uint32_t mask[(MAXTOK + 31) / 32], ref[(MAXTOK + 31) / 32], again[(MAXTOK + 31) / 32];
    int mismatches = 0, steps = 0, eog_seen = 0;
    for (int w = 0; w < n_walks; w++) {
        cb_matcher *m;
        CHECK(cb_matcher_new(g, &m) == CB_OK);
        for (int len = 0; len < max_len; len++) {
            int count = cb_matcher_fill_mask(m, mask);
            int rcount = reference_mask(m, ref);
            steps++;
            if (count != rcount || memcmp(mask, ref, (size_t)words * 4) != 0) {
                mismatches++;
                for (int t = 0; t < nv && mismatches < 4; t++)
                    if (bit(mask, t) != bit(ref, t)) fprintf(stderr, "  token %d: mask %d ref %d\n", t, bit(mask, t), bit(ref, t));
            }
            CHECK(bit(mask, tok_eog) == cb_matcher_is_accepting(m));
            CHECK(!bit(mask, tok_ctrl) && !bit(mask, tok_empty));
            CHECK(bit(mask, 256) == bit(mask, nv - 4));  /* the duplicate "ab" */
            if (count <= 0) break;
            /* pick a random allowed token; prefer to keep going early on */
            int pick = -1, k = (int)(rnd() % (uint32_t)count);
            for (int t = 0; t < nv; t++) if (bit(mask, t) && k-- == 0) { pick = t; break; }
            if (pick == tok_eog && len < max_len / 2 && count > 1) { len--; continue; }
            CHECK(cb_matcher_accept(m, pick) == CB_OK);
            /* rollback restores the mask exactly, then re-accept */
            CHECK(cb_matcher_rollback(m, 1) == CB_OK);
            CHECK(cb_matcher_fill_mask(m, again) == count && memcmp(again, mask, (size_t)words * 4) == 0);
            CHECK(cb_matcher_accept(m, pick) == CB_OK);
            if (pick == tok_eog) {
                eog_seen++;
                CHECK(cb_matcher_fill_mask(m, again) == 0);
                CHECK(cb_matcher_accept(m, 'a') == CB_ERR_ARG);
                break;
            }
        }
        cb_matcher_free(m);
    }
    CHECK_MSG(mismatches == 0, "%d of %d masks differ from the reference: %s", mismatches, steps, grammar);
    (void)eog_seen;
    cb_grammar_free(g);
}

static const char *JSON_GBNF =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "            string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "array  ::=\n"
    "  \"[\" ws (\n"
    "            value\n"
    "    (\",\" ws value)*\n"
    "  )? \"]\" ws\n"
    "string ::=\n"
    "  \"\\\"\" (\n"
    "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
    "    \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
    "  )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

/* Grammars for the plain-token fast path.  0-2: every stack top admits all
 * of P or none of it (one atom); 3-5: all of P but a few ASCII code points
 * ({b, !}, '/', the letters of a declared property name); 6-7: ASCII-only
 * atoms (an e-mail address; letters next to all of P above 0x7F, which
 * stays alive outside the atom): the fast path applies with the other
 * atoms left to the walk; 8-9: a class with part of P above 0x7F, a class
 * with no ASCII code point at all: it must not apply. */
#define N_PLAIN 10
static const char *PLAIN_GRAMMARS[N_PLAIN] = {
    "root ::= \"\\\"\" char* \"\\\"\" (\",\" \" \"? root)?\n"
    "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n",
    "root ::= \"\\\"\" [^\"\\\\\\x00-\\x1F]{0,5} \"\\\"\" \"x\"?",
    "root ::= \"\\\"\" ([^\"\\\\\\x00-\\x1F] | \"\\\\n\"){2,} \"\\\"\" | \"ab\"+",
    "root ::= [^\"\\\\\\x00-\\x1Fb]* \"!\"",
    "root ::= \"\\\"\" (\"/\" [^/\"\\\\\\x00-\\x1F]{1,4})+ \"/\"? \"\\\"\"",
    "root ::= \"{\" (kv (\",\" kv)*)? \"}\"\n"
    "kv ::= \"\\\"\" k4 \":1\"\n"
    "k1 ::= [ -!#-\\[\\]-\\uD7FF\\uE000-\\U0010FFFF] char* \"\\\"\"\n"
    "k2 ::= \"e\" k1 | [ -!#-\\[\\]-df-\\uD7FF\\uE000-\\U0010FFFF] char* \"\\\"\" | \"\\\"\"\n"
    "k3 ::= \"m\" k2 | [ -!#-\\[\\]-ln-\\uD7FF\\uE000-\\U0010FFFF] char* \"\\\"\" | \"\\\"\"\n"
    "k4 ::= \"n\" \"a\" k3 | [ -!#-\\[\\]-mo-\\uD7FF\\uE000-\\U0010FFFF] char* \"\\\"\" | \"n\\\"\"\n"
    "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n",
    "root ::= \"\\\"\" [a-z0-9._-]+ \"@\" [a-z]+ (\".\" [a-z]+)* \"\\\"\"",
    "root ::= \"\\\"\" ([a-z] | [\\u0080-\\U0010FFFF])+ \"\\\"\"",
    "root ::= \"\\\"\" [a-z\xc3\xa9]* \"\\\"\"",
    "root ::= \"\\\"\" [\\u0080-\\U0010FFFF]* \"\\\"\"",
};

static void test_masks(void) {
    walk_check("root ::= \"abc\" | \"ab\" \"d\"*", 6, 12);
    walk_check("root ::= [a-c]+ \"(\" ([^()]* | \"(\" \")\")* \")\"", 6, 20);
    walk_check("root ::= p\np ::= \"(\" p \")\" p | \"a\" | \"\"", 8, 24);
    walk_check("root ::= (\"\xe6\x97\xa5\" | \"\xc3\xa9\" | [\xf0\x9f\x98\x80-\xf0\x9f\x98\x8f] | \"a\")+ \"!\"", 8, 20);
    walk_check("root ::= .{0,6} \"\\n\"", 6, 12);
    walk_check(JSON_GBNF, 10, 40);
    walk_check("root ::= \"a\"? \"a\"? \"a\"? \"b\"{2,5} \"x y\"?", 6, 12);
    /* the plain-token fast path (every stack top admits all of P or none of
     * it): JSON strings as the schema converter writes them, unbounded and
     * with a length bound (a chain of distinct states that dies), and a
     * class that admits only part of P (the fast path must not apply) */
    for (int k = 0; k < N_PLAIN; k++) walk_check(PLAIN_GRAMMARS[k], 10, 30);
    cb_grammar *g = compile_ok(PLAIN_GRAMMARS[0]);
    if (g) {
        cb_matcher *m;
        uint32_t mask[(MAXTOK + 31) / 32];
        CHECK(cb_matcher_new(g, &m) == CB_OK);
        CHECK(cb_matcher_accept(m, '"') == CB_OK);
        CHECK(cb_matcher_fill_mask(m, mask) > 0);
        cb_matcher_stats st;
        cb_matcher_get_stats(m, &st);
        CHECK_MSG(st.plain_masks == 1, "fast path not taken inside a JSON string (%llu)", (unsigned long long)st.plain_masks);
        cb_matcher_free(m);
        cb_grammar_free(g);
    }
    /* where the fast path applies (first mask after the opening byte, or at
     * the start for grammar 3) and where it must not */
    for (int k = 3; k < N_PLAIN; k++) {
        g = compile_ok(PLAIN_GRAMMARS[k]);
        if (!g) continue;
        cb_matcher *m;
        uint32_t mask[(MAXTOK + 31) / 32];
        CHECK(cb_matcher_new(g, &m) == CB_OK);
        const char *start = k == 3 ? "" : k == 4 ? "\"/" : k == 5 ? "{\"" : "\"";
        CHECK(cb_matcher_accept_bytes(m, (const uint8_t *)start, strlen(start)) == CB_OK);
        CHECK(cb_matcher_fill_mask(m, mask) > 0);
        cb_matcher_stats st;
        cb_matcher_get_stats(m, &st);
        CHECK_MSG(st.plain_masks == (k < 8), "grammar %d: %llu fast-path masks", k, (unsigned long long)st.plain_masks);
        cb_matcher_free(m);
        cb_grammar_free(g);
    }
}

/* ------------------------------------------------------------ rollback, forced, dead ends */

/* A vocabulary without byte tokens that lacks the lead byte of 'é' (0xC3):
 * a grammar every way through which needs 'é' is refused at compile time,
 * naming it; one with another way keeps only that way, so no mask is ever
 * empty (no dead end mid-generation). */
static void test_unwritable_terminals(void) {
    static const char *toks[] = {"a", "b", "ab", "x", "\xe6\x97\xa5" /* 日 */};
    uint8_t bytes[64];
    uint32_t off[6] = {0};
    int n = 5;
    for (int i = 0; i < n; i++) {
        size_t k = strlen(toks[i]);
        memcpy(bytes + off[i], toks[i], k);
        off[i + 1] = off[i] + (uint32_t)k;
    }
    cb_vocab_view v = { n, bytes, off, NULL, NULL };
    cb_grammar *g = NULL;
    char err[256];
    const char *need = "root ::= \"a\" \"\xc3\xa9\"";
    int rc = cb_grammar_compile_vocab(&v, need, strlen(need), &g, err, sizeof err);
    CHECK_MSG(rc == CB_ERR_FORMAT && !g && strstr(err, "U+00E9"), "rc %d: %s", rc, err);
    const char *either = "root ::= \"a\" (\"\xc3\xa9\" | \"b\" | [\xc3\xa0-\xc3\xbf]) \"x\"*";
    rc = cb_grammar_compile_vocab(&v, either, strlen(either), &g, err, sizeof err);
    CHECK_MSG(rc == CB_OK && g, "rc %d: %s", rc, err);
    if (!g) return;
    cb_matcher *m;
    uint32_t mask[1];
    CHECK(cb_matcher_new(g, &m) == CB_OK);
    CHECK(cb_matcher_fill_mask(m, mask) == 2 && mask[0] == (1u << 0 | 1u << 2));  /* "a", "ab" */
    CHECK(cb_matcher_accept(m, 0) == CB_OK);
    CHECK(cb_matcher_fill_mask(m, mask) == 1 && mask[0] == 1u << 1);            /* "b" only */
    CHECK(cb_matcher_accept(m, 1) == CB_OK && cb_matcher_is_accepting(m));
    cb_matcher_free(m);
    cb_grammar_free(g);
    /* a vocabulary with every lead byte (the byte-level ones) is not touched:
     * the main vocabulary has all 256 bytes, and 'é' grammars compile there (test_masks) */
}

static void test_rollback_forced(void) {
    cb_grammar *g = compile_ok("root ::= \"{\\\"name\\\": \\\"\" [a-z]+ \"\\\"}\"");
    if (!g) return;
    cb_matcher *m;
    CHECK(cb_matcher_new(g, &m) == CB_OK);
    uint8_t fb[64];
    int n = cb_matcher_forced_bytes(m, fb, sizeof fb);
    CHECK_MSG(n == 10 && memcmp(fb, "{\"name\": \"", 10) == 0, "forced %d bytes: %.*s", n, n, fb);
    CHECK(cb_matcher_forced_bytes(m, fb, 3) == 3 && memcmp(fb, "{\"n", 3) == 0);
    CHECK(cb_matcher_forced_bytes(m, fb, 0) == 0);
    CHECK(cb_matcher_accept_bytes(m, (const uint8_t *)"{\"name\": \"ab", 12) == CB_OK);
    CHECK(cb_matcher_forced_bytes(m, fb, sizeof fb) == 0);  /* [a-z] or '"' */
    CHECK(!cb_matcher_is_accepting(m));
    CHECK(cb_matcher_accept(m, tok_eog) == CB_ERR_ARG);
    CHECK(cb_matcher_accept(m, '"') == CB_OK);
    n = cb_matcher_forced_bytes(m, fb, sizeof fb);
    CHECK(n == 1 && fb[0] == '}');
    CHECK(cb_matcher_accept(m, '}') == CB_OK);
    CHECK(cb_matcher_is_accepting(m));
    CHECK(cb_matcher_forced_bytes(m, fb, sizeof fb) == 0);  /* accepting: nothing forced */
    CHECK(cb_matcher_accept(m, 'x') == CB_ERR_ARG);
    CHECK(cb_matcher_is_accepting(m));  /* state unchanged by the refusal */
    CHECK(cb_matcher_accept(m, tok_eog) == CB_OK);
    CHECK(cb_matcher_accept(m, tok_eog) == CB_ERR_ARG);
    /* history: 4 entries (prefix, quote, brace, eog) */
    CHECK(cb_matcher_rollback(m, 5) == CB_ERR_ARG);
    CHECK(cb_matcher_rollback(m, -1) == CB_ERR_ARG);
    CHECK(cb_matcher_rollback(m, 0) == CB_OK);
    CHECK(cb_matcher_rollback(m, 1) == CB_OK);   /* un-finish */
    CHECK(cb_matcher_is_accepting(m));
    CHECK(cb_matcher_rollback(m, 2) == CB_OK);   /* back inside the name */
    CHECK(!cb_matcher_is_accepting(m));
    CHECK(cb_matcher_accept(m, 'z') == CB_OK);
    CHECK(cb_matcher_accept(m, tok_ctrl) == CB_ERR_ARG);
    CHECK(cb_matcher_accept(m, -1) == CB_ERR_ARG && cb_matcher_accept(m, nv) == CB_ERR_ARG);
    cb_matcher_free(m);
    cb_grammar_free(g);

    /* forced bytes cross code point boundaries */
    g = compile_ok("root ::= \"\xe6\x97\xa5\xe6\x9c\xac\" (\"x\" | \"y\")");
    CHECK(cb_matcher_new(g, &m) == CB_OK);
    n = cb_matcher_forced_bytes(m, fb, sizeof fb);
    CHECK(n == 6 && memcmp(fb, "\xe6\x97\xa5\xe6\x9c\xac", 6) == 0);
    /* a token that ends inside 日 is allowed, one inconsistent with it is not */
    CHECK(cb_matcher_accept_bytes(m, (const uint8_t *)"\xe6\x97", 2) == CB_OK);
    CHECK(!cb_matcher_is_accepting(m));
    CHECK(cb_matcher_accept_bytes(m, (const uint8_t *)"\xa6", 1) == CB_ERR_ARG);
    n = cb_matcher_forced_bytes(m, fb, sizeof fb);
    CHECK(n == 4 && memcmp(fb, "\xa5\xe6\x9c\xac", 4) == 0);
    cb_matcher_free(m);
    cb_grammar_free(g);

    /* rollback beyond the kept history */
    g = compile_ok("root ::= \"a\"*");
    CHECK(cb_matcher_new(g, &m) == CB_OK);
    for (int i = 0; i < 100; i++) CHECK(cb_matcher_accept(m, 'a') == CB_OK);
    CHECK(cb_matcher_rollback(m, 65) == CB_ERR_ARG);
    CHECK(cb_matcher_rollback(m, 64) == CB_OK);
    CHECK(cb_matcher_rollback(m, 1) == CB_ERR_ARG);
    CHECK(cb_matcher_accept(m, 'a') == CB_OK);
    CHECK(cb_matcher_rollback(m, 1) == CB_OK);
    cb_matcher_free(m);
    cb_grammar_free(g);

    /* dead ends from the vocabulary: a byte the grammar needs that no token
     * starts is found at compile time; one no token continues is found when
     * the mask comes out empty (0: the engine ends the request with an error
     * naming the dead end) */
    {
        static uint8_t b2[] = "ab<e>";
        static uint32_t o2[] = {0, 1, 2, 5};
        static uint8_t t2[] = {1, 1, 3}, e2[] = {0, 0, 1};
        cb_vocab_view v = {3, b2, o2, t2, e2};
        char err[128];
        cb_grammar *g2 = NULL;
        CHECK(cb_grammar_compile_vocab(&v, "root ::= \"a\" \"z\"", 16, &g2, err, sizeof err) == CB_ERR_FORMAT);
        CHECK(!g2 && strstr(err, "U+007A"));
        static uint8_t b3[] = "a\xc3<e>";
        static uint32_t o3[] = {0, 1, 2, 5};
        cb_vocab_view v3 = {3, b3, o3, t2, e2};
        const char *ae = "root ::= \"a\" \"\xc3\xa9\"";
        CHECK(cb_grammar_compile_vocab(&v3, ae, strlen(ae), &g2, err, sizeof err) == CB_OK);
        CHECK(cb_matcher_new(g2, &m) == CB_OK);
        uint32_t mask[1];
        CHECK(cb_matcher_fill_mask(m, mask) == 1 && mask[0] == 1u);
        CHECK(cb_matcher_accept(m, 0) == CB_OK);
        CHECK(cb_matcher_fill_mask(m, mask) == 1 && mask[0] == 2u);  /* the lead byte: it may continue */
        CHECK(cb_matcher_accept(m, 1) == CB_OK);
        CHECK(cb_matcher_fill_mask(m, mask) == 0 && mask[0] == 0);   /* nothing writes 0xA9 */
        CHECK(cb_matcher_accept(m, 2) == CB_ERR_ARG);
        cb_matcher_free(m);
        cb_grammar_free(g2);
    }
}

/* ------------------------------------------------------------ bounds */

static void test_bounds(void) {
    /* x{0,1000}: linear expansion, and a long walk through it */
    cb_grammar *g = compile_ok("root ::= \"ab\"{0,1000} \"c\"");
    cb_matcher *m;
    if (g) {
        CHECK(cb_matcher_new(g, &m) == CB_OK);
        int ok = 1;
        for (int i = 0; i < 1000 && ok; i++) ok = cb_matcher_accept(m, 256) == CB_OK;  /* "ab" */
        CHECK(ok);
        CHECK(cb_matcher_accept(m, 256) == CB_ERR_ARG);
        CHECK(cb_matcher_accept(m, 'c') == CB_OK && cb_matcher_is_accepting(m));
        cb_matcher_free(m);
        cb_grammar_free(g);
    }
    /* a 1500-long chain of optionals: many stacks, still within bounds */
    {
        size_t cap = 1500 * 6 + 64;
        char *t = malloc(cap);
        int k = snprintf(t, cap, "root ::=");
        for (int i = 0; i < 1500; i++) k += snprintf(t + k, cap - (size_t)k, " \"a\"?");
        snprintf(t + k, cap - (size_t)k, " \"b\"");
        char err[256];
        int rc;
        g = compile(t, &rc, err, sizeof err);
        if (rc == CB_OK) {
            int rcm = cb_matcher_new(g, &m);
            if (rcm == CB_OK) {
                int r1 = cb_matcher_accept_bytes(m, (const uint8_t *)"aaab", 4);
                CHECK(r1 == CB_OK || r1 == CB_ERR_UNSUPPORTED);
                cb_matcher_free(m);
            } else CHECK(rcm == CB_ERR_UNSUPPORTED);
        } else CHECK(rc == CB_ERR_FORMAT);
        cb_grammar_free(g);
        free(t);
    }
    /* nesting deeper than a stack can hold: an error, not a crash */
    g = compile_ok("root ::= p\np ::= \"(\" p \")\" | \"\"");
    if (g) {
        CHECK(cb_matcher_new(g, &m) == CB_OK);
        int rc = CB_OK, i;
        for (i = 0; i < 5000 && rc == CB_OK; i++) rc = cb_matcher_accept(m, '(');
        CHECK_MSG(rc == CB_ERR_UNSUPPORTED && i > 1000, "rc %d after %d", rc, i);
        cb_matcher_free(m);
        cb_grammar_free(g);
    }
    /* thousands of distinct states: the state pool is collected and the
     * walk stays correct (history and masks survive) */
    g = compile_ok("root ::= [a-b]{0,6000} \"!\"");
    if (g) {
        CHECK(cb_matcher_new(g, &m) == CB_OK);
        uint32_t mask[(MAXTOK + 31) / 32], ref[(MAXTOK + 31) / 32];
        int ok = 1;
        for (int i = 0; i < 5000 && ok; i++) {
            ok = cb_matcher_accept(m, (i % 3) ? 'a' : 'b') == CB_OK;
            if (i % 997 == 0) {
                int c = cb_matcher_fill_mask(m, mask);
                CHECK(c == reference_mask(m, ref) && memcmp(mask, ref, (size_t)((nv + 31) / 32) * 4) == 0);
            }
        }
        CHECK(ok);
        cb_matcher_stats st;
        cb_matcher_get_stats(m, &st);
        CHECK_MSG(st.gcs > 0, "expected state-pool collections, got %llu", (unsigned long long)st.gcs);
        CHECK(cb_matcher_rollback(m, 64) == CB_OK);
        CHECK(cb_matcher_accept(m, '!') == CB_OK && cb_matcher_is_accepting(m));
        cb_matcher_free(m);
        cb_grammar_free(g);
    }
}


/* ------------------------------------------------------------ budgets */

/* Shortest completion by breadth-first search over single bytes from the
 * matcher's current state, states deduplicated by their key.  Returns the
 * byte count, -1 if no completion exists, -2 if the search hit its limits
 * (inconclusive).  Independent of the min-length analysis: it only uses
 * the matcher's transitions. */
#define BFS_MAXN 3000
#define BFS_MAXD 48
#define BFS_KEYW (1 << 19)
static uint8_t  bfs_pre[BFS_MAXN][BFS_MAXD];
static int      bfs_len[BFS_MAXN];
static uint32_t bfs_keys[BFS_KEYW];
static uint32_t bfs_koff[BFS_MAXN + 1];
static int32_t  bfs_ht[1 << 13];

static uint32_t key_hash(const uint32_t *k, int n) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++) { h ^= k[i]; h *= 16777619u; }
    return h;
}

/* Add the matcher's current state as node n (prefix p, len l) unless seen;
 * returns 1 added, 0 seen, -1 out of room. */
static int bfs_add(cb_matcher *m, int n, const uint8_t *p, int l) {
    uint32_t *k = bfs_keys + bfs_koff[n];
    int kn = cb_matcher_state_key(m, k, (int)(BFS_KEYW - bfs_koff[n]));
    if (kn < 0) return -1;
    uint32_t h = key_hash(k, kn) & ((1u << 13) - 1);
    for (;; h = (h + 1) & ((1u << 13) - 1)) {
        int32_t j = bfs_ht[h];
        if (j < 0) break;
        if ((int)(bfs_koff[j + 1] - bfs_koff[j]) == kn && memcmp(bfs_keys + bfs_koff[j], k, (size_t)kn * 4) == 0) return 0;
    }
    bfs_ht[h] = n;
    bfs_koff[n + 1] = bfs_koff[n] + (uint32_t)kn;
    memcpy(bfs_pre[n], p, (size_t)l);
    bfs_len[n] = l;
    return 1;
}

static int bfs_min_completion(cb_matcher *m) {
    if (cb_matcher_is_accepting(m)) return 0;
    memset(bfs_ht, 0xFF, sizeof bfs_ht);
    bfs_koff[0] = 0;
    uint8_t p[BFS_MAXD];
    int n = 0;
    if (bfs_add(m, 0, p, 0) != 1) return -2;
    n = 1;
    for (int head = 0; head < n; head++) {
        int l = bfs_len[head];
        if (l + 1 >= BFS_MAXD) return -2;
        memcpy(p, bfs_pre[head], (size_t)l);
        for (int b = 0; b < 256; b++) {
            p[l] = (uint8_t)b;
            if (cb_matcher_accept_bytes(m, p, (size_t)l + 1) != CB_OK) continue;
            int acc = cb_matcher_is_accepting(m), r = 0;
            if (!acc) {
                if (n >= BFS_MAXN) r = -1;
                else { r = bfs_add(m, n, p, l + 1); if (r == 1) n++; }
            }
            if (cb_matcher_rollback(m, 1) != CB_OK) return -3;
            if (acc) return l + 1;  /* levels are expanded in order: the first hit is shortest */
            if (r < 0) return -2;
        }
    }
    return -1;
}

static int popcount_words(const uint32_t *m, int words) {
    int c = 0;
    for (int i = 0; i < words; i++) c += __builtin_popcount(m[i]);
    return c;
}

/* Brute-force budgeted mask: token t allowed iff accepted and the state
 * after it has a shortest completion <= budget (EOG: iff accepting).  Also
 * returns each token's completion after it in after[] (-1 = refused). */
static int reference_budget_mask(cb_matcher *m, int budget, uint32_t *ref, int *after) {
    int words = (nv + 31) / 32, count = 0;
    memset(ref, 0, (size_t)words * 4);
    for (int t = 0; t < nv; t++) {
        after[t] = -1;
        if (cb_matcher_accept(m, t) != CB_OK) continue;
        after[t] = cb_matcher_min_completion(m);
        if (cb_matcher_rollback(m, 1) != CB_OK) return -1;
        if (after[t] <= budget) { ref[t >> 5] |= 1u << (t & 31); count++; }
    }
    return count;
}

/* Where the BFS is too wide: check the Bellman equation f(s) = 1 + min
 * over bytes b of f(s after b) (f = min_completion, 0 iff accepting) at s
 * and along the chain of minimizing bytes down to an accepting state.  The
 * chain is a completion of exactly f(s) bytes, so the true shortest
 * completion is <= f(s) (the direction the budget guarantee rests on); the
 * equation at each state bounds it from the other side locally.  Returns 0
 * if consistent, else the chain step that broke. */
static int chain_check(cb_matcher *m) {
    int k = 0, bad = 0;
    while (k < 60) {
        int f = cb_matcher_min_completion(m);
        if (cb_matcher_is_accepting(m)) { bad = f != 0 ? k + 1 : 0; break; }
        int best = -1, arg = -1;
        for (int b = 0; b < 256; b++) {
            uint8_t c = (uint8_t)b;
            if (cb_matcher_accept_bytes(m, &c, 1) != CB_OK) continue;
            int fb = cb_matcher_min_completion(m);
            cb_matcher_rollback(m, 1);
            if (best < 0 || fb < best) { best = fb; arg = b; }
        }
        if (best < 0 || f != best + 1) { bad = k + 1; break; }
        uint8_t c = (uint8_t)arg;
        if (cb_matcher_accept_bytes(m, &c, 1) != CB_OK) { bad = k + 1; break; }
        k++;
    }
    cb_matcher_rollback(m, k);
    return bad;
}

/* min_completion against the BFS along random token walks (tokens that end
 * inside a code point included); the Bellman chain where the BFS gives up. */
static void mc_bfs_check(const char *grammar, int n_walks, int max_len) {
    cb_grammar *g = compile_ok(grammar);
    if (!g) return;
    uint32_t mask[(MAXTOK + 31) / 32];
    int compared = 0, mismatches = 0, inconclusive = 0;
    for (int w = 0; w < n_walks; w++) {
        cb_matcher *m;
        CHECK(cb_matcher_new(g, &m) == CB_OK);
        for (int len = 0; len <= max_len; len++) {
            int mc = cb_matcher_min_completion(m), want = bfs_min_completion(m);
            if (want == -2) {
                inconclusive++;
                int bad = chain_check(m);
                if (bad && mismatches++ < 4) fprintf(stderr, "  walk %d step %d: min_completion %d inconsistent at chain step %d\n", w, len, mc, bad);
            } else {
                compared++;
                if (mc != want) {
                    if (mismatches++ < 4) fprintf(stderr, "  walk %d step %d: min_completion %d, BFS %d\n", w, len, mc, want);
                }
            }
            CHECK((mc == 0) == cb_matcher_is_accepting(m));
            int count = cb_matcher_fill_mask(m, mask);
            if (count <= 0) break;
            int pick = -1, k = (int)(rnd() % (uint32_t)count);
            for (int t = 0; t < nv; t++) if (bit(mask, t) && k-- == 0) { pick = t; break; }
            if (pick == tok_eog) {
                CHECK(cb_matcher_accept(m, pick) == CB_OK);
                CHECK(cb_matcher_min_completion(m) == 0);
                break;
            }
            CHECK(cb_matcher_accept(m, pick) == CB_OK);
        }
        cb_matcher_free(m);
    }
    CHECK_MSG(mismatches == 0, "%d of %d shortest completions differ from the BFS: %s", mismatches, compared, grammar);
    CHECK_MSG(compared > 0, "BFS always inconclusive (%d times): %s", inconclusive, grammar);
    cb_grammar_free(g);
}

static const char *UNBOUNDED_ARRAYS =
    "root ::= arr\n"
    "arr  ::= \"[\" ws (v (\",\" ws v)*)? \"]\"\n"
    "v    ::= arr | [0-9]+ | \"\\\"\" [^\"]* \"\\\"\" | \"null\"\n"
    "ws   ::= \" \"?\n";

static const char *RECURSIVE_OBJECTS =
    "root ::= obj\n"
    "obj  ::= \"{\\\"name\\\": \\\"\" [a-z]* \"\\\", \\\"children\\\": [\" (obj (\", \" obj)*)? \"]}\"\n";

static const char *MULTIBYTE =
    "root ::= (\"\xe6\x97\xa5\xe6\x9c\xac\" | \"\xc3\xa9\" \"x\"{2} | [\xf0\x9f\x98\x80-\xf0\x9f\x98\x8f] \"!\" | [\xc3\xa9-\xc3\xaa]{2})+ \"\xe6\x97\xa5\"\n";

static void test_min_completion(void) {
    mc_bfs_check("root ::= \"\xe6\x97\xa5\xe6\x9c\xac\" | \"\xc3\xa9\" \"x\"{3}", 6, 8);
    mc_bfs_check("root ::= [\xc3\xa9-\xc3\xaa]{2} [\xe4\xb8\x80-\xe9\xbe\xa5] | [\xf0\x9f\x98\x80-\xf0\x9f\x98\x8f] \"!\"", 6, 8);
    mc_bfs_check("root ::= p\np ::= \"(\" p \")\" | \"<\" [a-z]{3} \">\"", 8, 16);
    mc_bfs_check("root ::= \"a\"{2,4} (\"b\" | [^a-z]) rest\nrest ::= \"x\" rest | \"yz\"", 8, 12);
    mc_bfs_check("root ::= \"a\"? b* c\nb ::= \"bb\"\nc ::= \"\" | \"c\"", 6, 8);
    mc_bfs_check("root ::= (\"ab\" [0-9]{2}){3} (\"x y\" | \"\\n\")", 6, 14);
    mc_bfs_check(MULTIBYTE, 8, 12);
    mc_bfs_check(UNBOUNDED_ARRAYS, 8, 16);
    mc_bfs_check(RECURSIVE_OBJECTS, 6, 16);
    mc_bfs_check(JSON_GBNF, 8, 16);
    mc_bfs_check("root ::= object\n"
                 "value ::= object | array | string | number | \"true\" | \"null\"\n"
                 "object ::= \"{\" (string \":\" value (\",\" string \":\" value)*)? \"}\"\n"
                 "array ::= \"[\" (value (\",\" value)*)? \"]\"\n"
                 "string ::= \"\\\"\" ([^\"\\\\] | \"\\\\\" [\"\\\\n])* \"\\\"\"\n"
                 "number ::= \"-\"? [0-9]+ (\".\" [0-9]+)?\n", 8, 16);

    /* saturation: a shortest completion beyond 2^30 bytes */
    cb_grammar *g = compile_ok("root ::= (((\"a\"{2000}){2000}){2000}) | \"b\"{3}");
    if (g) {
        cb_matcher *m;
        /* zeroed: the matcher writes only its vocabulary's words, and the
         * memcmp below reads all of them */
        uint32_t mask[(MAXTOK + 31) / 32] = {0};
        CHECK(cb_matcher_new(g, &m) == CB_OK);
        CHECK(cb_matcher_min_completion(m) == 3);
        CHECK(cb_matcher_accept(m, 'a') == CB_OK);
        CHECK_MSG(cb_matcher_min_completion(m) == 0x3FFFFFFF, "got %d", cb_matcher_min_completion(m));
        /* nothing finishes within a million, and a saturated length gives no
         * measure of progress: the budget is ignored */
        uint32_t um[(MAXTOK + 31) / 32] = {0};
        int cu = cb_matcher_fill_mask(m, um);
        CHECK(cu > 0 && bit(um, 'a'));
        CHECK(cb_matcher_fill_mask_budget(m, mask, 1000000) == cu && memcmp(mask, um, sizeof um) == 0);
        CHECK(cb_matcher_rollback(m, 1) == CB_OK);
        CHECK(cb_matcher_fill_mask_budget(m, mask, 2) == 1 && bit(mask, 'b'));  /* 'a' leads to a saturated state */
        CHECK(cb_matcher_fill_mask_budget(m, mask, 0) == 1 && bit(mask, 'b'));  /* below: 'b' still shortens it */
        cb_matcher_free(m);
        cb_grammar_free(g);
    }
    CHECK(cb_matcher_min_completion(NULL) == -1);
    CHECK(cb_matcher_fill_mask_budget(NULL, NULL, 3) == CB_ERR_ARG);
}

/* Walks where the chosen token is always (or, in every other walk, mostly)
 * the allowed one leaving the longest shortest completion, under a budget
 * of B tokens: at step n the budget is B - n - 1 (tokens after this one).
 * Every budgeted mask must equal the brute-force reference and be a
 * non-empty subset of the unbudgeted mask, and after at most B tokens the
 * state must be accepting with EOG allowed. */
static void budget_walks(const char *grammar, int n_walks, int max_slack) {
    cb_grammar *g = compile_ok(grammar);
    if (!g) return;
    int words = (nv + 31) / 32;
    uint32_t um[(MAXTOK + 31) / 32], bm[(MAXTOK + 31) / 32], ref[(MAXTOK + 31) / 32], again[(MAXTOK + 31) / 32];
    int after[MAXTOK];
    int mismatches = 0, steps = 0, cut = 0, unfinished = 0, max_mc = 0;
    cb_matcher_stats st = {0};
    for (int w = 0; w < n_walks; w++) {
        cb_matcher *m;
        CHECK(cb_matcher_new(g, &m) == CB_OK);
        int mc0 = cb_matcher_min_completion(m);
        int B = mc0 + (int)(rnd() % (uint32_t)(max_slack + 1));
        int n = 0, ended = 0;
        while (n < B && !ended) {
            int budget = B - n - 1;
            int cu = cb_matcher_fill_mask(m, um);
            int cb = cb_matcher_fill_mask_budget(m, bm, budget);
            int cr = reference_budget_mask(m, budget, ref, after);
            steps++;
            if (cb != cr || memcmp(bm, ref, (size_t)words * 4) != 0) {
                if (mismatches++ < 4)
                    for (int t = 0; t < nv; t++)
                        if (bit(bm, t) != bit(ref, t)) { fprintf(stderr, "  budget %d token %d: mask %d ref %d (after %d)\n", budget, t, bit(bm, t), bit(ref, t), after[t]); break; }
            }
            CHECK_MSG(cb > 0, "budgeted mask empty at step %d of %d (min completion %d): %s", n, B, cb_matcher_min_completion(m), grammar);
            CHECK(cb == popcount_words(bm, words));
            int sub = 1;
            for (int i = 0; i < words; i++) if (bm[i] & ~um[i]) sub = 0;
            CHECK(sub);
            if (cb < cu) cut++;
            /* a budget below the shortest completion keeps the tokens that shorten it */
            int mcn = cb_matcher_min_completion(m);
            if (mcn > 0) {
                int low = (int)(rnd() % (uint32_t)mcn), cl = cb_matcher_fill_mask_budget(m, again, low), rl = 0, same = 1;
                for (int t = 0; t < nv; t++) {
                    int want = after[t] >= 0 && after[t] <= mcn - 1;
                    rl += want;
                    if (bit(again, t) != want) same = 0;
                }
                CHECK_MSG(cl == rl && same && cl > 0, "budget %d below completion %d: %d tokens, want %d", low, mcn, cl, rl);
            }
            /* the cached budgeted mask comes back unchanged; a huge budget is no budget */
            CHECK(cb_matcher_fill_mask_budget(m, again, budget) == cb && memcmp(again, bm, (size_t)words * 4) == 0);
            CHECK(cb_matcher_fill_mask_budget(m, again, 1 << 20) == cu && memcmp(again, um, (size_t)words * 4) == 0);
            if (cb <= 0) break;
            /* adversary: the longest completion after the token; ties random; EOG last */
            int random_pick = (w & 1) && rnd() % 3 == 0;
            int pick = -1, best = -1, nbest = 0;
            for (int t = 0; t < nv; t++) {
                if (!bit(bm, t) || t == tok_eog) continue;
                int v = random_pick ? 0 : after[t];
                if (v > best) { best = v; pick = t; nbest = 1; }
                else if (v == best && rnd() % (uint32_t)(++nbest) == 0) pick = t;
            }
            if (pick < 0) pick = tok_eog;
            CHECK(cb_matcher_accept(m, pick) == CB_OK);
            if (pick == tok_eog) { ended = 1; break; }
            n++;
            int mc = cb_matcher_min_completion(m);
            if (mc > max_mc) max_mc = mc;
            CHECK_MSG(mc <= B - n, "completion %d after %d of %d tokens", mc, n, B);
        }
        if (!ended) {
            /* out of tokens: the text must be complete and EOG allowed */
            if (!cb_matcher_is_accepting(m)) unfinished++;
            CHECK(cb_matcher_fill_mask_budget(m, bm, 0) > 0 && bit(bm, tok_eog));
            CHECK(cb_matcher_accept(m, tok_eog) == CB_OK);
        }
        cb_matcher_stats s1;
        cb_matcher_get_stats(m, &s1);
        st.budget_walks += s1.budget_walks;
        cb_matcher_free(m);
    }
    CHECK_MSG(mismatches == 0, "%d of %d budgeted masks differ from the reference: %s", mismatches, steps, grammar);
    CHECK_MSG(unfinished == 0, "%d of %d walks ran out of budget unfinished: %s", unfinished, n_walks, grammar);
    /* the walks did exercise the budget (else this test proves nothing) */
    CHECK_MSG(cut > 0 && st.budget_walks > 0, "no mask was cut by the budget (%d cut, %llu walks): %s",
              cut, (unsigned long long)st.budget_walks, grammar);
    (void)max_mc;
    cb_grammar_free(g);
}

static void test_budgets(void) {
    budget_walks(JSON_GBNF, 12, 30);
    budget_walks(UNBOUNDED_ARRAYS, 12, 30);
    budget_walks(RECURSIVE_OBJECTS, 8, 40);
    budget_walks(MULTIBYTE, 12, 20);
    budget_walks("root ::= p\np ::= \"(\" p \")\" p | \"a\" | \"\"", 12, 25);
    budget_walks("root ::= [a-b]{0,6000} \"!\"", 4, 3);
    for (int k = 0; k < N_PLAIN; k++) budget_walks(PLAIN_GRAMMARS[k], 10, 25);

    /* budgets across a state-pool collection: reference masks stay equal */
    cb_grammar *g = compile_ok("root ::= [a-b]{0,6000} (\"!\" | \"\xe6\x97\xa5\xe6\x9c\xac\")");
    if (g) {
        cb_matcher *m;
        CHECK(cb_matcher_new(g, &m) == CB_OK);
        uint32_t bm[(MAXTOK + 31) / 32], ref[(MAXTOK + 31) / 32];
        int after[MAXTOK], ok = 1, bad = 0;
        for (int i = 0; i < 5000 && ok; i++) {
            ok = cb_matcher_accept(m, (i % 3) ? 'a' : 'b') == CB_OK;
            int budget = i % 4;
            int c = cb_matcher_fill_mask_budget(m, bm, budget);
            if (i % 499 == 0) {
                int cr = reference_budget_mask(m, budget, ref, after);
                if (c != cr || memcmp(bm, ref, (size_t)((nv + 31) / 32) * 4) != 0) bad++;
            }
        }
        CHECK(ok && bad == 0);
        cb_matcher_stats st;
        cb_matcher_get_stats(m, &st);
        CHECK_MSG(st.gcs > 0, "expected state-pool collections, got %llu", (unsigned long long)st.gcs);
        cb_matcher_free(m);
        cb_grammar_free(g);
    }
}

/* ------------------------------------------------------------ benchmark */
#ifndef CB_GRAMMAR_STANDALONE  /* standalone builds (grammar.c only) skip the model bench */

/* Optional: CB_GRAMMAR_BENCH_GGUF=/path/model.gguf test_grammar
 * walks JSON documents through the JSON grammar over the model's real
 * vocabulary (at each step: time fill_mask, then take the longest allowed
 * token that is a prefix of the rest of the document) and prints
 * p50 / p90 / p99 / max microseconds per mask.  Checks that the walk
 * completes and ends accepting.  Three passes: no budget; a loose budget
 * (4096 - tokens so far: what a max_tokens of 4096 gives, served from the
 * unbudgeted mask); a tight one (shortest completion + 2: the budget binds
 * at every step, the pruned walk runs unless the state repeats). */
#include <time.h>

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int dcmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void bench(const char *path) {
    cb_model_params mp = cb_model_default_params();
    mp.validate_only = 0;
    cb_model *model = NULL;
    char err[256];
    int rc = cb_model_load(path, &mp, &model, err, sizeof err);
    CHECK_MSG(rc == CB_OK, "load %s: %s", path, err);
    if (rc) return;
    cb_model_info info;
    cb_model_get_info(model, &info);
    static const char *docs[] = {
        "{\"name\": \"Alice Smith\", \"age\": 34, \"email\": \"alice@example.com\", \"tags\": [\"admin\", \"dev\"], \"active\": true}",
        "{\"id\": 12345, \"items\": [{\"sku\": \"A-1\", \"qty\": 2, \"price\": 9.99}, {\"sku\": \"B-22\", \"qty\": 1, \"price\": 120.5}], \"total\": 140.48}",
        "{\"query\": \"weather in Paris\", \"results\": [], \"error\": null, \"meta\": {\"took_ms\": 12, \"cached\": false}}",
        "{\"list\": [1, 2, 3, {\"a\": \"b\\n\\\"c\\\"\"}, [true, false, null], -0.5e+7]}",
        "{\"title\": \"Caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\", \"description\": \"A long description with several words, punctuation; and numbers 42.\", \"rating\": 4.5}",
    };
    cb_grammar *g = NULL;
    double t0 = now_us();
    rc = cb_grammar_compile(model, JSON_GBNF, strlen(JSON_GBNF), &g, err, sizeof err);
    double tc = now_us() - t0;
    CHECK_MSG(rc == CB_OK, "compile: %s", err);
    if (rc) { cb_model_free(model); return; }
    int nvoc = info.n_vocab, words = (nvoc + 31) / 32;
    uint32_t *mask = malloc((size_t)words * 4), *bmask = malloc((size_t)words * 4);
    double *times = malloc(100000 * sizeof *times);
    static const char *mode_name[3] = {"no budget", "loose budget", "tight budget"};
    for (int mode = 0; mode < 3; mode++) {
    int nt = 0, total_allowed = 0, total_bud = 0;
    unsigned long long walks = 0;
    cb_matcher *m = NULL;
    for (int rep = 0; rep < 3; rep++)
    for (size_t d = 0; d < sizeof docs / sizeof *docs; d++) {
        CHECK(cb_matcher_new(g, &m) == CB_OK);
        const char *doc = docs[d];
        size_t pos = 0, n = strlen(doc);
        int ok = 1, steps = 0;
        while (pos < n && ok) {
            int budget = mode == 1 ? 4096 - steps : cb_matcher_min_completion(m) + 2;
            double a = now_us();
            int c = mode == 0 ? cb_matcher_fill_mask(m, mask) : cb_matcher_fill_mask_budget(m, bmask, budget);
            double b = now_us();
            if (nt < 100000) times[nt++] = b - a;
            if (mode) {
                CHECK(c > 0);
                total_bud += c;
                c = cb_matcher_fill_mask(m, mask);  /* the document's token may be out of a tight budget: choose from all */
            }
            total_allowed += c;
            steps++;
            int best = -1;
            size_t best_len = 0;
            for (int t = 0; t < nvoc; t++) {
                if (!((mask[t >> 5] >> (t & 31)) & 1)) continue;
                size_t len;
                const uint8_t *tb = cb_model_token_bytes(model, t, &len);
                if (len > best_len && len <= n - pos && memcmp(tb, doc + pos, len) == 0) { best = t; best_len = len; }
            }
            if (best < 0) { ok = 0; break; }
            ok = cb_matcher_accept(m, best) == CB_OK;
            pos += best_len;
        }
        CHECK_MSG(ok && cb_matcher_is_accepting(m), "doc %zu stuck at byte %zu", d, pos);
        cb_matcher_stats st;
        cb_matcher_get_stats(m, &st);
        walks += st.budget_walks;
        if (rep == 0 && d == 0 && mode == 0) {
            printf("bench: trie nodes %u, first doc: %llu masks, %llu cache hits, %llu nodes walked, %llu transitions\n",
                   st.trie_size, (unsigned long long)st.mask_calls, (unsigned long long)st.mask_cache_hits,
                   (unsigned long long)st.trie_nodes, (unsigned long long)st.transitions);
        }
        cb_matcher_free(m);
        m = NULL;
    }
    qsort(times, (size_t)nt, sizeof *times, dcmp);
    if (nt)
        printf("bench [%s]: vocab %d, compile %.1f ms, %d masks: p50 %.2f us, p90 %.2f us, p99 %.2f us, max %.1f us, mean allowed %d",
               mode_name[mode], nvoc, tc / 1e3, nt, times[nt / 2], times[nt * 9 / 10], times[nt * 99 / 100], times[nt - 1], total_allowed / nt);
    if (nt && mode) printf(", within budget %d, pruned walks %llu", total_bud / nt, walks);
    if (nt) printf("\n");
    }
    free(bmask);
    free(mask);
    free(times);
    cb_grammar_free(g);
    cb_model_free(model);
}
#endif

/* Only UTF-8 gets through: surrogates and overlong forms are refused even by
 * a class that admits every code point; a partial code point that every
 * completion of which the grammar accepts is one state, whatever its bytes. */
static void test_utf8_validity(void) {
    cb_grammar *g = compile_ok("root ::= [\\x00-\\U0010FFFF]+");
    if (!g) return;
    const char *bad[] = {"\xED\xA0\x80", "\xED\xBF\xBF", "\xC0\xAF", "\xE0\x80\xAF", "\xF4\x90\x80\x80", "\xF8"};
    const char *good[] = {"\xED\x9F\xBF", "\xEE\x80\x80", "\xF4\x8F\xBF\xBF", "\xC2\x80", "a"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cb_matcher *m;
        CHECK(cb_matcher_new(g, &m) == CB_OK);
        CHECK_MSG(cb_matcher_accept_bytes(m, (const uint8_t *)bad[i], strlen(bad[i])) == CB_ERR_ARG, "accepted bad UTF-8 #%zu", i);
        cb_matcher_free(m);
    }
    uint32_t k1[64], k2[64];
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        cb_matcher *m;
        CHECK(cb_matcher_new(g, &m) == CB_OK);
        CHECK_MSG(cb_matcher_accept_bytes(m, (const uint8_t *)good[i], strlen(good[i])) == CB_OK, "refused UTF-8 #%zu", i);
        CHECK(cb_matcher_is_accepting(m));
        cb_matcher_free(m);
    }
    /* two different 3-byte prefixes under a class admitting all completions: one state */
    cb_matcher *a, *b;
    CHECK(cb_matcher_new(g, &a) == CB_OK && cb_matcher_new(g, &b) == CB_OK);
    CHECK(cb_matcher_accept_bytes(a, (const uint8_t *)"\xE6\x97", 2) == CB_OK);
    CHECK(cb_matcher_accept_bytes(b, (const uint8_t *)"\xE4\xB8", 2) == CB_OK);
    int n1 = cb_matcher_state_key(a, k1, 64), n2 = cb_matcher_state_key(b, k2, 64);
    CHECK(n1 > 0 && n1 == n2 && memcmp(k1, k2, (size_t)n1 * 4) == 0);
    cb_matcher_free(a);
    cb_matcher_free(b);
    cb_grammar_free(g);
}

int main(void) {
    make_vocab();
    test_utf8_validity();
    test_errors();
    test_languages();
    test_masks();
    test_rollback_forced();
    test_unwritable_terminals();
    test_bounds();
    test_min_completion();
    test_budgets();
#ifndef CB_GRAMMAR_STANDALONE
    const char *bp = getenv("CB_GRAMMAR_BENCH_GGUF");
    if (bp && *bp) bench(bp);
#endif
    return cb_test_report("test_grammar");
}
