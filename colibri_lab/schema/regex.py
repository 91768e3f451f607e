"""The supported regex subset (JSON Schema `pattern`) parsed into a small AST
and written as GBNF over the JSON-encoded string content."""
from __future__ import annotations

import re
from typing import Optional

from ..errors import SchemaError
from .charset import (_ASCII_DIGIT, _ASCII_SPACE, _ASCII_WORD, _MAXCP, UNICODE_SPACE,
                      _complement, _norm, charset_expr)
from .gbnf import _LIT_RE

class _RegexParser:
    """Recursive-descent parser of the supported regex subset into a small AST:
    ("seq", [..]) ("alt", [..]) ("set", ranges) ("rep", node, min, max)."""

    def __init__(self, pattern: str, path: str):
        self.p = pattern
        self.i = 0
        self.path = path

    def err(self, what: str):
        raise SchemaError("unsupported regex construct %s in pattern %r at %s"
                          % (what, self.p, self.path))

    def parse(self, search: bool = False):
        """The AST of the whole pattern.  search=False: implicitly anchored at
        both ends (full matches); search=True: re.search semantics, i.e. an
        alternative without '^' may be preceded, and one without '$' followed,
        by any text (what JSON Schema's `pattern` means)."""
        alts = []
        anyrep = ("rep", ("set", [(0, _MAXCP)]), 0, None)
        while True:
            self._start = self._end = False
            seq = self.parse_seq(top=True)
            if search and not (self._start and self._end):
                seq = ("seq", ([] if self._start else [anyrep]) + [seq] + ([] if self._end else [anyrep]))
            alts.append(seq)
            if self.i < len(self.p) and self.p[self.i] == "|":
                self.i += 1
                continue
            break
        if self.i != len(self.p):
            self.err("unbalanced ')'")
        return ("alt", alts) if len(alts) > 1 else alts[0]

    def parse_seq(self, top=False):
        items = []
        start = self.i
        while self.i < len(self.p) and self.p[self.i] not in "|)":
            c = self.p[self.i]
            if c == "^":
                if not (top and self.i == start):
                    self.err("'^' (anchor) not at the start")
                self._start = True
                self.i += 1
                start = self.i
                continue
            if c == "$":
                self.i += 1
                if not (top and (self.i == len(self.p) or self.p[self.i] == "|")):
                    self.err("'$' (anchor) not at the end")
                self._end = True
                continue
            atom = self.parse_atom()
            atom = self.parse_quant(atom)
            items.append(atom)
        return ("seq", items)

    def parse_quant(self, atom):
        while self.i < len(self.p):
            c = self.p[self.i]
            if c in "*+?":
                self.i += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            elif c == "{":
                m = re.match(r"\{(\d*)(,(\d*))?\}", self.p[self.i:])
                if not m or (m.group(1) == "" and m.group(2) is None):
                    # Python treats a non-quantifier "{" as a literal
                    return atom
                lo = int(m.group(1) or 0)
                hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
                if hi is not None and hi < lo:
                    self.err("bad repetition bounds")
                self.i += m.end()
            else:
                return atom
            if self.i < len(self.p) and self.p[self.i] == "?":
                self.i += 1  # lazy: same language
            elif self.i < len(self.p) and self.p[self.i] == "+":
                self.err("possessive quantifier")
            if atom[0] == "rep":
                self.err("nested quantifier")
            atom = ("rep", atom, lo, hi)
        return atom

    def parse_atom(self):
        c = self.p[self.i]
        if c == "(":
            self.i += 1
            if self.p.startswith("?:", self.i):
                self.i += 2
            elif self.p.startswith("?P<", self.i) or (
                    self.p.startswith("?<", self.i) and not self.p.startswith("?<=", self.i)
                    and not self.p.startswith("?<!", self.i)):
                j = self.p.find(">", self.i)
                if j < 0:
                    self.err("bad group name")
                self.i = j + 1
            elif self.p.startswith("?", self.i):
                kind = {"?=": "lookahead", "?!": "negative lookahead",
                        "?<=": "lookbehind", "?<!": "negative lookbehind",
                        "?P=": "backreference", "?#": "comment", "?(": "conditional"}
                for k, v in kind.items():
                    if self.p.startswith(k, self.i):
                        self.err("'(%s' (%s)" % (k, v))
                self.err("'(?' (inline flags)")
            alts = []
            while True:
                alts.append(self.parse_seq())
                if self.i < len(self.p) and self.p[self.i] == "|":
                    self.i += 1
                    continue
                break
            if self.i >= len(self.p) or self.p[self.i] != ")":
                self.err("unbalanced '('")
            self.i += 1
            return ("alt", alts) if len(alts) > 1 else alts[0]
        if c == "[":
            return ("set", self.parse_class())
        if c == ".":
            self.i += 1
            return ("set", _complement([(10, 10)]))
        if c in "*+?":
            self.err("quantifier %r with nothing before it" % c)
        if c == "\\":
            return ("set", self.parse_escape(in_class=False))
        self.i += 1
        return ("set", [(ord(c), ord(c))])

    def parse_escape(self, in_class):
        self.i += 1
        if self.i >= len(self.p):
            self.err("trailing backslash")
        c = self.p[self.i]
        self.i += 1
        if c == "d":
            return list(_ASCII_DIGIT)
        if c == "w":
            return list(_ASCII_WORD)
        if c == "s":
            return list(_ASCII_SPACE)
        # Python's \D \W \S exclude non-ASCII digits/word chars too: stay within
        # ASCII so the grammar is never wider than the validator's regex.
        if c == "D":
            return _complement(_ASCII_DIGIT, (0, 127))
        if c == "W":
            return _complement(_ASCII_WORD, (0, 127))
        if c == "S":
            return _complement(UNICODE_SPACE)
        simple = {"n": 10, "t": 9, "r": 13, "f": 12, "v": 11, "0": 0, "a": 7}
        if c in simple:
            return [(simple[c], simple[c])]
        if c == "x":
            h = self.p[self.i:self.i + 2]
            if not re.fullmatch(r"[0-9a-fA-F]{2}", h):
                self.err("bad \\x escape")
            self.i += 2
            return [(int(h, 16),) * 2]
        if c == "u":
            h = self.p[self.i:self.i + 4]
            if not re.fullmatch(r"[0-9a-fA-F]{4}", h):
                self.err("bad \\u escape")
            self.i += 4
            return [(int(h, 16),) * 2]
        if c == "b" and in_class:
            return [(8, 8)]
        if c.isdigit():
            self.err("'\\%s' (backreference)" % c)
        if c.isalnum():
            self.err("'\\%s'" % c)
        return [(ord(c), ord(c))]

    def parse_class(self):
        self.i += 1
        neg = False
        if self.i < len(self.p) and self.p[self.i] == "^":
            neg = True
            self.i += 1
        ranges = []
        shorthand = False  # a \d or \w inside: Unicode-wide in Python
        first = True
        while True:
            if self.i >= len(self.p):
                self.err("unterminated '['")
            c = self.p[self.i]
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            if c == "[" and self.p.startswith("[:", self.i):
                self.err("POSIX class")
            if c == "\\":
                if self.i + 1 < len(self.p) and self.p[self.i + 1] in "dwDW":
                    shorthand = True
                if self.p[self.i + 1:self.i + 2] == "s":
                    # [^\s]: exclude all of Python's Unicode whitespace
                    ranges.extend(UNICODE_SPACE)
                lo_set = self.parse_escape(in_class=True)
            else:
                self.i += 1
                lo_set = [(ord(c), ord(c))]
            if (len(lo_set) == 1 and lo_set[0][0] == lo_set[0][1] and
                    self.i + 1 < len(self.p) and self.p[self.i] == "-" and self.p[self.i + 1] != "]"):
                self.i += 1
                if self.p[self.i] == "\\":
                    hi_set = self.parse_escape(in_class=True)
                else:
                    hi_set = [(ord(self.p[self.i]),) * 2]
                    self.i += 1
                if len(hi_set) != 1 or hi_set[0][0] != hi_set[0][1] or hi_set[0][0] < lo_set[0][0]:
                    self.err("bad class range")
                ranges.append((lo_set[0][0], hi_set[0][0]))
            else:
                ranges.extend(lo_set)
        if neg:
            # Python's [^\d] also excludes non-ASCII digits (and [^\w] non-ASCII
            # letters): stay within ASCII then.
            return _complement(ranges, (0, 127) if shorthand else (0, _MAXCP))
        return _norm(ranges)


def _regex_len(node):
    """(min, max) length in code points of the strings `node` matches; max None = unbounded."""
    kind = node[0]
    if kind == "set":
        return (1, 1)
    if kind == "seq":
        lo, hi = 0, 0
        for n in node[1]:
            a, b = _regex_len(n)
            lo += a
            hi = None if hi is None or b is None else hi + b
        return (lo, hi)
    if kind == "alt":
        ls = [_regex_len(n) for n in node[1]]
        return (min(a for a, _ in ls),
                None if any(b is None for _, b in ls) else max(b for _, b in ls))
    if kind == "rep":
        a, b = _regex_len(node[1])
        hi = None if node[3] is None or b is None else b * node[3]
        return (a * node[2], hi)
    raise AssertionError(kind)



def _regex_to_gbnf(node) -> Optional[str]:
    kind = node[0]
    if kind == "set":
        return charset_expr(node[1])
    if kind == "seq":
        parts = []
        for n in node[1]:
            e = _regex_to_gbnf(n)
            if e is None:
                return None
            parts.append(e)
        if not parts:
            return '""'
        merged = []
        for e in parts:  # "a" "b" -> "ab"
            if merged and _LIT_RE.fullmatch(e) and _LIT_RE.fullmatch(merged[-1]):
                merged[-1] = merged[-1][:-1] + e[1:]
            else:
                merged.append(e)
        return merged[0] if len(merged) == 1 else "(" + " ".join(merged) + ")"
    if kind == "alt":
        alts = [e for e in (_regex_to_gbnf(n) for n in node[1]) if e is not None]
        if not alts:
            return None
        return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"
    if kind == "rep":
        e = _regex_to_gbnf(node[1])
        lo, hi = node[2], node[3]
        if e is None:
            return '""' if lo == 0 else None
        if (lo, hi) == (0, None):
            return e + "*"
        if (lo, hi) == (1, None):
            return e + "+"
        if (lo, hi) == (0, 1):
            return e + "?"
        if hi is None:
            return "%s{%d,}" % (e, lo)
        if lo == hi:
            return "%s{%d}" % (e, lo)
        return "%s{%d,%d}" % (e, lo, hi)
    raise AssertionError(kind)


