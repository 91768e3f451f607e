/*
 * test_grammar.c — GBNF parser, byte-level matcher and token masks
 * (native/src/grammar.c), over a small synthetic vocabulary.
 *
 *   - ~25 malformed grammars: CB_ERR_FORMAT with "line L, column C" and the
 *     right line and a word naming the problem;
 *   - languages: strings in / out of the language of literals, classes,
 *     negation, `.`, repetition bounds, nesting, recursion, comments,
 *     escapes, UTF-8 ranges, multi-line rules;
 *   - masks equal a brute-force reference (accept each token, roll back) at
 *     every step of seeded random walks; EOG allowed iff accepting; rollback
 *     restores masks exactly; forced bytes; dead end = 0; bounded blow-ups;
 *   - a grammar with thousands of states forces state-pool collections.
 *
 * Built alone (grammar.c only): add -DCB_GRAMMAR_STANDALONE.  With the full
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

static void test_masks(void) {
    walk_check("root ::= \"abc\" | \"ab\" \"d\"*", 6, 12);
    walk_check("root ::= [a-c]+ \"(\" ([^()]* | \"(\" \")\")* \")\"", 6, 20);
    walk_check("root ::= p\np ::= \"(\" p \")\" p | \"a\" | \"\"", 8, 24);
    walk_check("root ::= (\"\xe6\x97\xa5\" | \"\xc3\xa9\" | [\xf0\x9f\x98\x80-\xf0\x9f\x98\x8f] | \"a\")+ \"!\"", 8, 20);
    walk_check("root ::= .{0,6} \"\\n\"", 6, 12);
    walk_check(JSON_GBNF, 10, 40);
    walk_check("root ::= \"a\"? \"a\"? \"a\"? \"b\"{2,5} \"x y\"?", 6, 12);
}

/* ------------------------------------------------------------ rollback, forced, dead ends */

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

    /* dead end: a vocabulary without the byte the grammar needs */
    {
        static uint8_t b2[] = "ab<e>";
        static uint32_t o2[] = {0, 1, 2, 5};
        static uint8_t t2[] = {1, 1, 3}, e2[] = {0, 0, 1};
        cb_vocab_view v = {3, b2, o2, t2, e2};
        char err[128];
        cb_grammar *g2 = NULL;
        CHECK(cb_grammar_compile_vocab(&v, "root ::= \"a\" \"z\"", 16, &g2, err, sizeof err) == CB_OK);
        CHECK(cb_matcher_new(g2, &m) == CB_OK);
        uint32_t mask[1];
        CHECK(cb_matcher_fill_mask(m, mask) == 1 && mask[0] == 1u);
        CHECK(cb_matcher_accept(m, 0) == CB_OK);
        CHECK(cb_matcher_fill_mask(m, mask) == 0 && mask[0] == 0);
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

/* ------------------------------------------------------------ benchmark */
#ifndef CB_GRAMMAR_STANDALONE  /* standalone builds (grammar.c only) skip the model bench */

/* Optional: CB_GRAMMAR_BENCH_GGUF=/path/model.gguf test_grammar
 * walks JSON documents through the JSON grammar over the model's real
 * vocabulary (at each step: time fill_mask, then take the longest allowed
 * token that is a prefix of the rest of the document) and prints
 * p50 / p90 / p99 / max microseconds per mask.  Checks that the walk
 * completes and ends accepting. */
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
    uint32_t *mask = malloc((size_t)words * 4);
    double *times = malloc(100000 * sizeof *times);
    int nt = 0, total_allowed = 0;
    cb_matcher *m = NULL;
    for (int rep = 0; rep < 3; rep++)
    for (size_t d = 0; d < sizeof docs / sizeof *docs; d++) {
        CHECK(cb_matcher_new(g, &m) == CB_OK);
        const char *doc = docs[d];
        size_t pos = 0, n = strlen(doc);
        int ok = 1;
        while (pos < n && ok) {
            double a = now_us();
            int c = cb_matcher_fill_mask(m, mask);
            double b = now_us();
            if (nt < 100000) times[nt++] = b - a;
            total_allowed += c;
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
        if (rep == 0 && d == 0) {
            cb_matcher_stats st;
            cb_matcher_get_stats(m, &st);
            printf("bench: trie nodes %u, first doc: %llu masks, %llu cache hits, %llu nodes walked, %llu transitions\n",
                   st.trie_size, (unsigned long long)st.mask_calls, (unsigned long long)st.mask_cache_hits,
                   (unsigned long long)st.trie_nodes, (unsigned long long)st.transitions);
        }
        cb_matcher_free(m);
        m = NULL;
    }
    qsort(times, (size_t)nt, sizeof *times, dcmp);
    if (nt)
        printf("bench: vocab %d, compile %.1f ms, %d masks: p50 %.2f us, p90 %.2f us, p99 %.2f us, max %.1f us, mean allowed %d\n",
               nvoc, tc / 1e3, nt, times[nt / 2], times[nt * 9 / 10], times[nt * 99 / 100], times[nt - 1], total_allowed / nt);
    free(mask);
    free(times);
    cb_grammar_free(g);
    cb_model_free(model);
}
#endif

int main(void) {
    make_vocab();
    test_errors();
    test_languages();
    test_masks();
    test_rollback_forced();
    test_bounds();
#ifndef CB_GRAMMAR_STANDALONE
    const char *bp = getenv("CB_GRAMMAR_BENCH_GGUF");
    if (bp && *bp) bench(bp);
#endif
    return cb_test_report("test_grammar");
}
