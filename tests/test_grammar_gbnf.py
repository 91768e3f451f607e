"""Grammar-constrained decoding through the binding, on SmolLM2's real vocabulary.

- Random grammars come from a small generator that builds a GBNF grammar and
  an equivalent Python regex together (literals, classes with negation,
  alternation, repetition with bounds, nested rules).  For each, random walks
  pick random allowed tokens from the mask until EOG (or a length cap); a walk
  that ends with EOG must spell a string the regex matches in full.  Along the
  way: EOG is allowed iff the matcher accepts, control tokens never are, the
  mask is never empty (a dead end would be a bug: the vocabulary has every
  byte), rollback restores the mask.
- Every token of a tokenized valid JSON document is allowed by a JSON grammar
  at its step; mask timing over that walk is printed (p50 / p99), not asserted.
- Invalid grammars raise GrammarError (an InvalidRequestError) naming a line.

Needs the binding's Grammar / Matcher classes (colibri_lab._engine).
"""
from __future__ import annotations

import random
import re
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.smollm2

# --------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def model(smollm2_path):
    from colibri_lab import _engine

    return _engine.Model(smollm2_path)


@pytest.fixture(scope="module")
def vocab(model):
    """(token bytes list, eog id set, control id set)."""
    n = model.n_vocab
    toks = [bytes(model.token_bytes(i)) for i in range(n)]
    eog = {i for i in range(n) if model.token_is_eog(i)}
    control = {i for i in range(n) if model.token_type(i) == 3 and i not in eog}
    return toks, eog, control


def grammar(model, text):
    from colibri_lab._engine import Grammar

    return Grammar(model, text)


# --------------------------------------------------------------- generator

# Characters used by literals and classes: ASCII that needs escaping in
# GBNF or regex, a space, a newline, and multi-byte UTF-8.
ALPHABET = ["a", "b", "x", "1", "{", "}", '"', " ", "-", "]", "\\", "\n", "é", "日"]


def gbnf_lit_char(c: str) -> str:
    return {'"': '\\"', "\\": "\\\\", "\n": "\\n"}.get(c, c)


def gbnf_class_char(c: str) -> str:
    return {"]": "\\]", "\\": "\\\\", "-": "\\-", "[": "\\[", "^": "\\^", "\n": "\\n"}.get(c, c)


def _leaf(draw):
    kind = draw(st.sampled_from(["lit", "lit", "class", "any"]))
    if kind == "lit":
        s = "".join(draw(st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=4)))
        return '"' + "".join(gbnf_lit_char(c) for c in s) + '"', re.escape(s)
    if kind == "any":
        return ".", "."
    chars = sorted(set(draw(st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=4))))
    neg = draw(st.booleans())
    body_g = "".join(gbnf_class_char(c) for c in chars)
    body_r = "".join(re.escape(c) for c in chars)
    if not neg and draw(st.booleans()):
        body_g += "0-9"  # a range
        body_r += "0-9"
    return ("[^" if neg else "[") + body_g + "]", ("[^" if neg else "[") + body_r + "]"


@st.composite
def expr(draw, depth=0, rules=None):
    """(gbnf expression, regex) built together; `rules` collects named rules."""
    if depth >= 3 or draw(st.integers(0, 9)) < 4:
        return _leaf(draw)
    kind = draw(st.sampled_from(["seq", "alt", "rep", "rule"]))
    if kind == "seq":
        parts = [draw(expr(depth + 1, rules)) for _ in range(draw(st.integers(2, 3)))]
        return " ".join(g for g, _ in parts), "".join(f"(?:{r})" for _, r in parts)
    if kind == "alt":
        parts = [draw(expr(depth + 1, rules)) for _ in range(draw(st.integers(2, 3)))]
        return "(" + " | ".join(g for g, _ in parts) + ")", "(?:" + "|".join(f"(?:{r})" for _, r in parts) + ")"
    if kind == "rep":
        g, r = draw(expr(depth + 1, rules))
        op = draw(st.sampled_from(["*", "+", "?", "{m}", "{m,}", "{m,n}"]))
        m = draw(st.integers(0, 3))
        n = m + draw(st.integers(0, 3))
        gop = {"{m}": f"{{{m}}}", "{m,}": f"{{{m},}}", "{m,n}": f"{{{m},{n}}}"}.get(op, op)
        return f"({g}){gop}", f"(?:{r}){gop}"
    g, r = draw(expr(depth + 1, rules))
    name = f"r{len(rules)}-x_{len(rules)}"
    rules.append(f"{name} ::= {g}")
    return name, f"(?:{r})"


@st.composite
def grammar_and_regex(draw):
    rules: list[str] = []
    g, r = draw(expr(0, rules))
    # rules after root, a comment, and a continuation line for good measure
    text = f"# generated\nroot ::= {g}\n" + "".join(f"{x}\n" for x in rules)
    return text, r


# --------------------------------------------------------------- helpers


def bit_positions(mask: np.ndarray) -> np.ndarray:
    assert mask.dtype == np.bool_
    return np.flatnonzero(mask)


def random_walk(m, vocab, rng: random.Random, cap: int):
    """Random allowed tokens until EOG or cap; returns (tokens, ended_with_eog)."""
    toks, eog, control = vocab
    out = []
    for _ in range(cap):
        mask = m.fill_mask()
        allowed = bit_positions(mask)
        assert len(allowed) > 0, "dead end: the grammar admits no continuation"
        acc = m.is_accepting
        assert all(bool(mask[e]) == acc for e in eog), "EOG allowed iff accepting"
        assert not any(mask[c] for c in control), "control token allowed"
        if acc and rng.random() < 0.4:
            t = min(eog)
        else:
            text_ids = [int(a) for a in allowed if int(a) not in eog]
            if not text_ids:
                t = min(eog)
            else:
                t = rng.choice(text_ids)
        if rng.random() < 0.2 and out:
            # rollback restores the mask exactly
            m.accept(t)
            m.rollback(1)
            assert np.array_equal(m.fill_mask(), mask)
        m.accept(t)
        if t in eog:
            return out, True
        out.append(t)
    return out, False


# --------------------------------------------------------------- tests


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gr=grammar_and_regex(), seed=st.integers(0, 2**32 - 1))
def test_random_grammars_walks_in_language(model, vocab, gr, seed):
    text, regex = gr
    g = grammar(model, text)
    rng = random.Random(seed)
    toks = vocab[0]
    for _ in range(3):
        m = g.matcher()
        ids, finished = random_walk(m, vocab, rng, cap=30)
        if not finished:
            continue
        data = b"".join(toks[t] for t in ids)
        s = data.decode("utf-8")  # accepting => complete code points
        assert re.fullmatch(regex, s, flags=re.DOTALL), (text, regex, s)


def test_literal_grammar_forced_and_accepting(model, vocab):
    toks, eog, _ = vocab
    g = grammar(model, 'root ::= "{\\"name\\": \\"" [a-z]+ "\\"}"')
    m = g.matcher()
    assert m.forced_bytes() == b'{"name": "'
    assert not m.is_accepting
    mask = m.fill_mask()
    assert mask.shape == (model.n_vocab,) and mask.dtype == np.bool_
    assert not any(mask[e] for e in eog)
    # every allowed token is a prefix-consistent piece of the forced span or beyond
    for t in bit_positions(mask)[:2000]:
        b = toks[t]
        k = min(len(b), 10)
        assert b[:k] == b'{"name": "'[:k]
    # a disallowed token raises and leaves the state alone
    bad = next(i for i in range(model.n_vocab) if not mask[i])
    from colibri_lab.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError):
        m.accept(bad)
    assert np.array_equal(m.fill_mask(), mask)
    with pytest.raises(InvalidRequestError):
        m.rollback(1)  # nothing accepted yet


@pytest.mark.parametrize(
    "text",
    [
        "",
        "root ::= foo",
        'root ::= "abc',
        "root ::= [a-z",
        'root ::= "\\q"',
        'a ::= "x"',
        'root ::= "a"{3,2}',
        'root ::= root "a" | "a"',
        'root ::= ("a"',
        "root ::= " + "(" * 600 + '"a"' + ")" * 600,
    ],
)
def test_invalid_grammars(model, text):
    from colibri_lab.errors import GrammarError, InvalidRequestError

    with pytest.raises(GrammarError, match=r"line \d+, column \d+") as ei:
        grammar(model, text)
    assert isinstance(ei.value, InvalidRequestError)


JSON_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws
array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws
string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
"""

JSON_DOCS = [
    '{"name": "Alice Smith", "age": 34, "email": "alice@example.com", "tags": ["admin", "dev"], "active": true}',
    '{"id": 12345, "items": [{"sku": "A-1", "qty": 2, "price": 9.99}], "total": 140.48, "note": null}',
    '{"title": "Café 日本", "rating": 4.5, "nested": {"a": [1, 2, {"b": "c\\n\\"q\\""}]}}',
]


def test_json_walk_every_token_allowed_and_timing(model, vocab):
    from colibri_lab.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(model.metadata())
    g = grammar(model, JSON_GBNF)
    eog = vocab[1]
    times = []
    for doc in JSON_DOCS:
        m = g.matcher()
        ids = tok.encode(doc, add_special=False, parse_special=False)
        for t in ids:
            t0 = time.perf_counter()
            mask = m.fill_mask()
            times.append(time.perf_counter() - t0)
            assert mask[t], f"token {t} ({vocab[0][t]!r}) refused in {doc!r}"
            m.accept(t)
        assert m.is_accepting
        mask = m.fill_mask()
        assert all(mask[e] for e in eog)
    us = np.array(times) * 1e6
    print(f"\njson mask (binding incl.): n={len(us)} p50={np.percentile(us, 50):.1f}us "
          f"p99={np.percentile(us, 99):.1f}us max={us.max():.1f}us")
