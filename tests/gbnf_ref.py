"""An independent GBNF (llama.cpp dialect) reference: parser, Earley recognizer
and random derivation walker, for tests.

Written from the GBNF description, not from colibri_lab.schema, so the tests
check the LANGUAGE of a grammar without trusting the converter.  Slow (pure
Python Earley), fine for test-sized strings.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field


class GrammarSyntaxError(ValueError):
    pass


# ---------------------------------------------------------------------------
# Parsing into an AST:  ("alt", [seq...]) ("seq", [..]) ("lit", str)
# ("cls", neg, [(lo, hi)...]) ("ref", name) ("rep", node, min, max|None)

_NAME = re.compile(r"[a-zA-Z0-9_-]+")


class _P:
    def __init__(self, text):
        self.s = text
        self.i = 0

    def err(self, msg):
        line = self.s.count("\n", 0, self.i) + 1
        raise GrammarSyntaxError("%s at line %d: %r" % (msg, line, self.s[self.i:self.i + 30]))

    def ws(self, newlines):
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t" or (newlines and c in "\r\n"):
                self.i += 1
            elif c == "#":
                while self.i < len(self.s) and self.s[self.i] not in "\r\n":
                    self.i += 1
            else:
                break

    def grammar(self):
        rules = {}
        while True:
            self.ws(True)
            if self.i >= len(self.s):
                break
            m = _NAME.match(self.s, self.i)
            if not m:
                self.err("expected rule name")
            name = m.group(0)
            self.i = m.end()
            self.ws(False)
            if not self.s.startswith("::=", self.i):
                self.err("expected ::=")
            self.i += 3
            body = self.alternates(nested=False)
            if name in rules:
                self.err("duplicate rule %s" % name)
            rules[name] = body
        return rules

    def alternates(self, nested):
        alts = [self.sequence(nested)]
        while True:
            self.ws(nested)
            if self.i < len(self.s) and self.s[self.i] == "|":
                self.i += 1
                self.ws(True)
                alts.append(self.sequence(nested))
            else:
                break
        return ("alt", alts)

    def char(self, in_class):
        c = self.s[self.i]
        if c == "\\":
            self.i += 1
            e = self.s[self.i]
            self.i += 1
            n = {"x": 2, "u": 4, "U": 8}.get(e)
            if n:
                h = self.s[self.i:self.i + n]
                if not re.fullmatch("[0-9a-fA-F]{%d}" % n, h):
                    self.err("bad \\%s escape" % e)
                self.i += n
                return int(h, 16)
            simple = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93}
            if e not in simple:
                self.err("unknown escape \\%s" % e)
            return simple[e]
        self.i += 1
        return ord(c)

    def sequence(self, nested):
        items = []
        while True:
            self.ws(nested)
            if self.i >= len(self.s):
                break
            c = self.s[self.i]
            if c == '"':
                self.i += 1
                cps = []
                while True:
                    if self.i >= len(self.s) or self.s[self.i] in "\r\n":
                        self.err("unterminated literal")
                    if self.s[self.i] == '"':
                        self.i += 1
                        break
                    cps.append(self.char(False))
                atom = ("lit", "".join(map(chr, cps)))
            elif c == "[":
                self.i += 1
                neg = False
                if self.s[self.i:self.i + 1] == "^":
                    neg = True
                    self.i += 1
                ranges = []
                while True:
                    if self.i >= len(self.s):
                        self.err("unterminated class")
                    if self.s[self.i] == "]":
                        self.i += 1
                        break
                    lo = self.char(True)
                    if self.s[self.i] == "-" and self.s[self.i + 1] != "]":
                        self.i += 1
                        hi = self.char(True)
                        if hi < lo:
                            self.err("reversed range")
                        ranges.append((lo, hi))
                    else:
                        ranges.append((lo, lo))
                atom = ("cls", neg, ranges)
            elif c == ".":
                self.i += 1
                atom = ("cls", True, [])
            elif c == "(":
                self.i += 1
                atom = self.alternates(nested=True)
                self.ws(True)
                if self.s[self.i:self.i + 1] != ")":
                    self.err("expected )")
                self.i += 1
            else:
                m = _NAME.match(self.s, self.i)
                if not m:
                    break
                # a name followed by ::= starts the next rule
                j = m.end()
                k = j
                while k < len(self.s) and self.s[k] in " \t":
                    k += 1
                if self.s.startswith("::=", k):
                    break
                self.i = j
                atom = ("ref", m.group(0))
            # quantifiers
            while self.i < len(self.s) and self.s[self.i] in "*+?{":
                q = self.s[self.i]
                if q == "{":
                    m = re.compile(r"\{\s*(\d+)\s*(,\s*(\d*)\s*)?\}").match(self.s, self.i)
                    if not m:
                        self.err("bad {m,n}")
                    lo = int(m.group(1))
                    hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
                    self.i = m.end()
                else:
                    self.i += 1
                    lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[q]
                atom = ("rep", atom, lo, hi)
            items.append(atom)
        return ("seq", items)


def parse_gbnf(text: str) -> dict:
    rules = _P(text).grammar()
    if "root" not in rules:
        raise GrammarSyntaxError("no root rule")
    for name, body in rules.items():
        for ref in _refs(body):
            if ref not in rules:
                raise GrammarSyntaxError("rule %s references undefined %s" % (name, ref))
    return rules


def _refs(node):
    k = node[0]
    if k == "ref":
        yield node[1]
    elif k in ("alt", "seq"):
        for n in node[1]:
            yield from _refs(n)
    elif k == "rep":
        yield from _refs(node[1])


# ---------------------------------------------------------------------------
# Lowering to plain BNF: nonterminal -> list of alternatives (tuples of
# symbols); a symbol is a str (nonterminal) or a Term (one code point test).

@dataclass(frozen=True)
class Term:
    neg: bool
    ranges: tuple

    def match(self, cp: int) -> bool:
        inside = any(lo <= cp <= hi for lo, hi in self.ranges)
        return inside != self.neg


@dataclass
class Grammar:
    prods: dict = field(default_factory=dict)
    start: str = "root"

    def __post_init__(self):
        self._n = 0

    def fresh(self, hint):
        self._n += 1
        return "%s~%d" % (hint, self._n)


def lower(rules: dict) -> Grammar:
    g = Grammar()
    for name in rules:
        g.prods[name] = []
    for name, body in rules.items():
        g.prods[name] = [tuple(a) for a in _lower_alts(g, body, name)]
    _finish(g)
    return g


def _lower_alts(g, node, hint):
    if node[0] == "alt":
        return [_lower_seq(g, s, hint) for s in node[1]]
    return [_lower_seq(g, node, hint)]


def _lower_seq(g, node, hint):
    if node[0] != "seq":
        return [_lower_atom(g, node, hint)] if node[0] != "lit" else _lower_atom_list(g, node, hint)
    out = []
    for a in node[1]:
        if a[0] == "lit":
            out.extend(_lower_atom_list(g, a, hint))
        else:
            out.append(_lower_atom(g, a, hint))
    return out


def _lower_atom_list(g, node, hint):
    return [Term(False, ((ord(c), ord(c)),)) for c in node[1]]


def _sym_for(g, node, hint):
    """One symbol for `node` (a new nonterminal when it is not a single symbol)."""
    if node[0] == "ref":
        return node[1]
    if node[0] == "cls":
        return Term(node[1], tuple(node[2]))
    if node[0] == "lit" and len(node[1]) == 1:
        return Term(False, ((ord(node[1]), ord(node[1])),))
    nt = g.fresh(hint)
    g.prods[nt] = [tuple(a) for a in _lower_alts(g, node, hint)]
    return nt


def _lower_atom(g, node, hint):
    if node[0] != "rep":
        return _sym_for(g, node, hint)
    x = _sym_for(g, node[1], hint)
    lo, hi = node[2], node[3]
    nt = g.fresh(hint)
    if hi is None:
        star = g.fresh(hint)
        g.prods[star] = [(), (x, star)]
        g.prods[nt] = [tuple([x] * lo + [star])]
    else:
        # chain of optionals: opt_k ::= "" | x opt_{k-1}
        prev = None
        for _ in range(hi - lo):
            o = g.fresh(hint)
            g.prods[o] = [(), (x,) + ((prev,) if prev else ())]
            prev = o
        g.prods[nt] = [tuple([x] * lo + ([prev] if prev else []))]
    return nt


def _finish(g):
    # nullable set
    nullable = set()
    changed = True
    while changed:
        changed = False
        for nt, alts in g.prods.items():
            if nt in nullable:
                continue
            for a in alts:
                if all(isinstance(s, str) and s in nullable for s in a):
                    nullable.add(nt)
                    changed = True
                    break
    g.nullable = nullable
    # minimal derivation length and the alternative achieving it
    INF = float("inf")
    cost = {nt: INF for nt in g.prods}
    best = {}
    changed = True
    while changed:
        changed = False
        for nt, alts in g.prods.items():
            for i, a in enumerate(alts):
                c = sum(1 if isinstance(s, Term) else cost[s] for s in a)
                if c < cost[nt]:
                    cost[nt] = c
                    best[nt] = i
                    changed = True
    unproductive = [nt for nt, c in cost.items() if c == INF]
    g.cost = cost
    g.best = best
    g.unproductive = unproductive


def compile_gbnf(text: str) -> Grammar:
    return lower(parse_gbnf(text))


# ---------------------------------------------------------------------------
# Earley recognizer (with the Aycock-Horspool nullable fix).

def accepts(g: Grammar, text: str) -> bool:
    cps = [ord(c) for c in text]
    n = len(cps)
    START = "<start>"
    prods = g.prods
    chart = [set() for _ in range(n + 1)]
    waiting = [dict() for _ in range(n + 1)]  # pos -> nt -> [items waiting for nt]
    start_item = (START, ("root",), 0, 0)

    def rhs_of(item):
        return item[1]

    for i in range(n + 1):
        agenda = list(chart[i]) if i else [start_item]
        if not i:
            chart[0].add(start_item)
        if not agenda and i:
            return False
        while agenda:
            item = agenda.pop()
            lhs, rhs, dot, origin = item
            if dot < len(rhs):
                sym = rhs[dot]
                if isinstance(sym, Term):
                    if i < n and sym.match(cps[i]):
                        nxt = (lhs, rhs, dot + 1, origin)
                        chart[i + 1].add(nxt)
                    continue
                w = waiting[i].setdefault(sym, [])
                w.append(item)
                if len(w) == 1:
                    for alt in prods[sym]:
                        new = (sym, alt, 0, i)
                        if new not in chart[i]:
                            chart[i].add(new)
                            agenda.append(new)
                if sym in g.nullable:
                    new = (lhs, rhs, dot + 1, origin)
                    if new not in chart[i]:
                        chart[i].add(new)
                        agenda.append(new)
            else:
                for w in list(waiting[origin].get(lhs, ())):
                    new = (w[0], w[1], w[2] + 1, w[3])
                    if new not in chart[i]:
                        chart[i].add(new)
                        agenda.append(new)
    return (START, ("root",), 1, 0) in chart[n]


# ---------------------------------------------------------------------------
# Random derivation walk.

POOL = ([chr(c) for c in range(32, 127)] + ["\t", "\n", "\r", "\x01", "\x7f",
        "é", "ß", "中", "€", "😀", "\u00a0", "\u2028"])


def _pick_char(rng: random.Random, t: Term) -> str:
    cands = [c for c in POOL if t.match(ord(c))]
    if cands:
        return rng.choice(cands)
    for lo, hi in t.ranges if not t.neg else ():
        if not (0xD800 <= lo <= 0xDFFF):
            return chr(rng.randint(lo, min(hi, lo + 50)) if hi < 0xD800 or lo > 0xDFFF else lo)
    raise ValueError("cannot pick a character for %r" % (t,))


def generate(g: Grammar, rng: random.Random, max_depth: int = 12, p_stop: float = 0.45) -> str:
    """A random string of the grammar's language.  Above max_depth every
    nonterminal takes its shortest alternative, so the walk terminates."""
    out = []
    # explicit stack of (symbol, depth)
    stack = [("root", 0)]
    steps = 0
    while stack:
        steps += 1
        if steps > 200000:
            raise RuntimeError("derivation too long")
        sym, depth = stack.pop()
        if isinstance(sym, Term):
            out.append(_pick_char(rng, sym))
            continue
        alts = g.prods[sym]
        finite = [i for i, a in enumerate(alts)
                  if all(isinstance(s, Term) or g.cost[s] != float("inf") for s in a)]
        if depth >= max_depth:
            i = g.best[sym]
        elif len(alts) == 2 and alts[0] == () and len(finite) == 2:
            # optional / repetition chain: stop with probability p_stop
            i = 0 if rng.random() < p_stop else 1
        else:
            i = rng.choice(finite)
        for s in reversed(alts[i]):
            # depth counts named rules only: synthetic ones (a~n) inherit it
            stack.append((s, depth + 1 if isinstance(s, str) and "~" not in s else depth))
    return "".join(out)
