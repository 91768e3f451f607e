"""JSON Schema -> GBNF (llama.cpp dialect) converter, pure Python.

`schema_to_gbnf(schema)` returns grammar text whose start rule is `root`; the C
grammar engine compiles it and masks tokens so that the output is a JSON text
that validates against the schema.  The contract is SOUNDNESS: every string the
grammar accepts parses as JSON and validates.  Completeness is best effort; the
grammar accepts a canonical subset of the valid JSON texts, which is what a
model needs in order to produce valid output.  The known places where the
grammar is narrower than the schema (all documented here so a caller is not
surprised):

* Object members appear in the order the schema declares them; any subset of
  the optional ones may be omitted.  Additional properties (allowed by default,
  as the spec says, when `additionalProperties` is absent) come only after the
  declared ones, and their names never equal a declared name.
* Whitespace between tokens is bounded: nothing, one space, or a newline and up
  to 20 spaces/tabs (`space` rule).  So generation cannot loop on whitespace,
  and `json.dumps(x, indent=2)` output is accepted up to 10 nesting levels.
* Numbers have at most 16 integer digits, 16 fraction digits, 3 exponent digits;
  bounded numbers (minimum/maximum...) have no exponent and a fraction short
  enough that decimal->double rounding can never land on an exclusive bound.
  Integers are written without fraction or exponent.
* String constants (enum/const, pattern literals) are accepted in the form
  `json.dumps(..., ensure_ascii=False)` writes them, not in every escaped form.
* `pattern` is implicitly anchored at both ends (the grammar generates full
  matches, which also `re.search`-match); \\d \\w \\s are ASCII.
* `oneOf` is an alternation: exclusivity is NOT enforced, so overlapping
  branches may produce an instance that matches two of them.
* `format` values other than date, time, date-time, uuid, email, ipv4, ipv6,
  uri are annotations and are ignored (as jsonschema does by default).
* A `string` minLength/maxLength counts code points; a raw astral character is
  one, a `\\uD83D\\uDE00` escape pair counts two (it is one for the validator),
  so the bound holds for every raw-UTF-8 output.

Everything the converter does not support raises `SchemaError` naming the
keyword and its JSON pointer, e.g. "unsupported JSON Schema keyword 'if' at
#/properties/a"; a schema that admits no value at all is an error too.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Optional

from .errors import InvalidRequestError, SchemaError  # noqa: F401  (SchemaError re-exported)

__all__ = ["SchemaError", "schema_to_gbnf", "json_object_gbnf", "json_value_gbnf",
           "SPACE_RULE"]




# Whitespace between tokens: bounded so generation cannot loop on it.
SPACE_RULE = '| " " | "\\n" [ \\t]{0,20}'

# Bounded JSON number pieces (see module docstring).
INT_DIGITS = 16
FRAC_DIGITS = 16

PRIMITIVES = {
    "space": SPACE_RULE,
    "char": '[^"\\\\\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4})',
    "string": '"\\"" char* "\\"" space',
    "integral-part": '"0" | [1-9] [0-9]{0,%d}' % (INT_DIGITS - 1),
    "decimal-part": "[0-9]{1,%d}" % FRAC_DIGITS,
    "number": '"-"? integral-part ("." decimal-part)? ([eE] [-+]? [0-9]{1,3})? space',
    "integer": '"-"? integral-part space',
    "boolean": '("true" | "false") space',
    "null": '"null" space',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" space (string ":" space value ("," space string ":" space value)*)? "}" space',
    "array": '"[" space (value ("," space value)*)? "]" space',
}
PRIMITIVE_DEPS = {
    "string": ["char", "space"],
    "integral-part": [],
    "decimal-part": [],
    "number": ["integral-part", "decimal-part", "space"],
    "integer": ["integral-part", "space"],
    "boolean": ["space"],
    "null": ["space"],
    "value": ["object", "array", "string", "number", "boolean", "null"],
    "object": ["space", "string", "value"],
    "array": ["space", "value"],
    "char": [],
    "space": [],
}

# Format grammars.  Each is the body of a rule matching the string CONTENT
# (without quotes); every one accepts only characters that need no JSON escape.
FORMATS = {
    "date": (
        '[0-9]{4} "-" ( ("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01])'
        ' | ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30")'
        ' | "02" "-" ("0" [1-9] | "1" [0-9] | "2" [0-8]) )'
    ),
    "time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,9})?'
             ' ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])'),
    "uuid": ('[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4}'
             ' "-" [0-9a-fA-F]{12}'),
    "email": ('[a-zA-Z0-9!#$%&\'*+/=?^_`{|}~-]+ ("." [a-zA-Z0-9!#$%&\'*+/=?^_`{|}~-]+)* "@"'
              ' [a-zA-Z0-9] ([a-zA-Z0-9-]{0,61} [a-zA-Z0-9])?'
              ' ("." [a-zA-Z0-9] ([a-zA-Z0-9-]{0,61} [a-zA-Z0-9])?)+'),
    "ipv4": None,  # filled below
    "ipv6": None,
    "uri": None,  # filled below (needs ipv6)
}
FORMATS["date-time"] = "(" + FORMATS["date"] + ') "T" (' + FORMATS["time"] + ")"
_OCTET = '("25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9])'
FORMATS["ipv4"] = " ".join([_OCTET, '"."', _OCTET, '"."', _OCTET, '"."', _OCTET])


def _ipv6() -> str:
    h16 = "[0-9a-fA-F]{1,4}"
    ls32 = '(%s ":" %s | %s)' % (h16, h16, FORMATS["ipv4"])

    def rep(n):  # n times (h16 ":")
        return ('(%s ":"){%d}' % (h16, n)) if n else ""

    def head(k):  # [ *k(h16 ":") h16 ]
        return '(%s ":"){0,%d} %s' % (h16, k, h16) if k else h16

    alts = [rep(6) + " " + ls32, '"::" ' + rep(5) + " " + ls32]
    tails = [rep(4) + " " + ls32, rep(3) + " " + ls32, rep(2) + " " + ls32,
             h16 + ' ":" ' + ls32, ls32, h16, '""']
    for k, tail in enumerate(tails):
        alts.append('(%s)? "::" %s' % (head(k), tail))
    return " | ".join("(" + a.strip() + ")" for a in alts)


FORMATS["ipv6"] = _ipv6()
_PCT = '"%" [0-9a-fA-F] [0-9a-fA-F]'
_PCHAR = "([a-zA-Z0-9._~!$&'()*+,;=:@-] | %s)" % _PCT
_SEGMENTS = '("/" %s*)*' % _PCHAR
# RFC 3986: scheme ":" ("//" authority path-abempty | path-absolute |
# path-rootless | path-empty) ["?" query] ["#" fragment]; hosts are an
# IPv6 literal or a reg-name (IPvFuture is left out).
FORMATS["uri"] = (
    '[a-zA-Z] [a-zA-Z0-9+.-]* ":"'
    " ( \"//\" (([a-zA-Z0-9._~!$&'()*+,;=:-] | %s)* \"@\")?"
    " (\"[\" (%s) \"]\" | ([a-zA-Z0-9._~!$&'()*+,;=-] | %s)*) (\":\" [0-9]*)? %s"
    " | \"/\" (%s+ %s)?"
    " | %s+ %s )?"
    " (\"?\" ([a-zA-Z0-9._~!$&'()*+,;=:@/?-] | %s)*)?"
    " (\"#\" ([a-zA-Z0-9._~!$&'()*+,;=:@/?-] | %s)*)?"
) % (_PCT, FORMATS["ipv6"], _PCT, _SEGMENTS, _PCHAR, _SEGMENTS, _PCHAR, _SEGMENTS, _PCT, _PCT)
FORMAT_LENGTHS = {"date": (10, 10), "uuid": (36, 36), "time": (9, None),
                  "date-time": (20, None), "ipv4": (7, 15), "ipv6": (2, 45)}

ANNOTATIONS = {"title", "description", "examples", "default", "$schema", "$id",
               "$comment", "deprecated", "readOnly", "writeOnly", "$defs",
               "definitions", "discriminator", "contentMediaType", "contentEncoding",
               "$anchor"}
SUPPORTED = {"type", "properties", "required", "additionalProperties", "items",
             "prefixItems", "additionalItems", "minItems", "maxItems", "enum", "const",
             "anyOf", "oneOf", "allOf", "$ref", "minLength", "maxLength", "pattern",
             "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
ALL_TYPES = ("string", "number", "integer", "boolean", "null", "object", "array")


def _ptr_escape(s: str) -> str:
    return s.replace("~", "~0").replace("/", "~1")


def _lit(text: str) -> str:
    """A GBNF literal matching `text` exactly."""
    out = ['"']
    for ch in text:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif o < 0x20 or o == 0x7F:
            out.append("\\x%02X" % o)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _class_char(o: int) -> str:
    """One code point written for use inside a GBNF [...] class."""
    # only the escapes llama.cpp knows: \x \u \U \t \r \n \\ \" \[ \]
    ch = chr(o)
    if ch in "]\\[\"":
        return "\\" + ch
    if o < 0x20 or o >= 0x7F or ch in "-^":
        return "\\x%02X" % o if o <= 0xFF else (
            "\\u%04X" % o if o <= 0xFFFF else "\\U%08X" % o)
    return ch


def _json_dumps(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


# ----------------------------------------------------------------------------
# Integer ranges as digit grammars.

def _digit_class(a: int, b: int) -> str:
    return '"%d"' % a if a == b else "[%d-%d]" % (a, b)


def _same_len(x: str, y: str) -> list:
    """Alternatives (GBNF sequences) for decimal strings of equal length in [x, y]."""
    n = len(x)
    if n == 0:
        return [""]
    if x == y:
        return ['"%s"' % x]
    if n == 1:
        return [_digit_class(int(x), int(y))]
    if x[0] == y[0]:
        return ['"%s" %s' % (x[0], _group(_same_len(x[1:], y[1:])))]
    rest = n - 1
    alts = []
    lo_d, hi_d = int(x[0]), int(y[0])
    if x[1:] != "0" * rest:
        alts.append('"%s" %s' % (x[0], _group(_same_len(x[1:], "9" * rest))))
        lo_d += 1
    hi_full = y[1:] == "9" * rest
    mid_hi = hi_d if hi_full else hi_d - 1
    if lo_d <= mid_hi:
        alts.append("%s [0-9]{%d}" % (_digit_class(lo_d, mid_hi), rest))
    if not hi_full:
        alts.append('"%s" %s' % (y[0], _group(_same_len("0" * rest, y[1:]))))
    return alts


def _group(alts: list) -> str:
    alts = [a if a else '""' for a in alts]
    if len(alts) == 1:
        a = alts[0]
        return a if (" " not in a or a.startswith("(") and _balanced_outer(a)) else "(" + a + ")"
    return "(" + " | ".join(alts) + ")"


def _balanced_outer(a: str) -> bool:
    # true when `a` is a single parenthesised group "( ... )"
    if not (a.startswith("(") and a.endswith(")")):
        return False
    depth = 0
    in_str = in_cls = False
    i = 0
    while i < len(a):
        c = a[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif in_cls:
            if c == "\\":
                i += 1
            elif c == "]":
                in_cls = False
        elif c == '"':
            in_str = True
        elif c == "[":
            in_cls = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0 and i != len(a) - 1:
                return False
        i += 1
    return True


def _nonneg_range(lo: int, hi: Optional[int]) -> list:
    """Alternatives for canonical decimals of n with lo <= n <= hi (hi None: up to
    INT_DIGITS digits, or the digits of lo if more)."""
    assert lo >= 0
    alts = []
    if hi is not None and hi < lo:
        return alts
    dl = len(str(lo))
    dh = len(str(hi)) if hi is not None else max(dl, INT_DIGITS)
    for d in range(dl, dh + 1):
        a = max(lo, 10 ** (d - 1) if d > 1 else 0)
        b = 10 ** d - 1
        if hi is not None:
            b = min(b, hi)
        if hi is None and d > dl and a == 10 ** (d - 1):
            # every longer length is unconstrained: one alternative for them all
            alts.append("[1-9] [0-9]{%d,%d}" % (d - 1, dh - 1) if dh > d else
                        "[1-9] [0-9]{%d}" % (d - 1))
            break
        if a <= b:
            alts.extend(_same_len(str(a), str(b)))
    return alts


def int_range_expr(lo: Optional[int], hi: Optional[int]) -> Optional[str]:
    """GBNF expression for the JSON integers in [lo, hi] (None = unbounded);
    None when empty."""
    alts = []
    # negative part: magnitudes in [max(1, -hi), -lo]
    if lo is None or lo < 0:
        mlo = 1 if hi is None or hi >= 0 else -hi
        mhi = None if lo is None else -lo
        if mhi is None or mhi >= mlo:
            neg = _nonneg_range(mlo, mhi)
            if neg:
                alts.append('"-" ' + _group(neg))
    if hi is None or hi >= 0:
        pos = _nonneg_range(max(lo, 0) if lo is not None else 0, hi)
        alts.extend(pos)
    if not alts:
        return None
    return _group(alts)


# ----------------------------------------------------------------------------
# Regex (pattern) subset -> GBNF over the JSON-encoded string content.

_ESC_JSON = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r",
             "\b": "\\b", "\f": "\\f"}
_MAXCP = 0x10FFFF
_ASCII_DIGIT = [(48, 57)]
_ASCII_WORD = [(48, 57), (65, 90), (95, 95), (97, 122)]
_ASCII_SPACE = [(9, 13), (32, 32)]
# What Python's \s matches in a str pattern (tests check this list).
UNICODE_SPACE = [(0x9, 0xD), (0x1C, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680),
                 (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F),
                 (0x3000, 0x3000)]


def _norm(ranges):
    rs = sorted(ranges)
    out = []
    for a, b in rs:
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _complement(ranges, within=(0, _MAXCP)):
    out = []
    cur = within[0]
    for a, b in _norm(ranges):
        if b < within[0] or a > within[1]:
            continue
        if a > cur:
            out.append((cur, a - 1))
        cur = max(cur, b + 1)
    if cur <= within[1]:
        out.append((cur, within[1]))
    return out


def _intersect(r1, r2):
    out = []
    for a, b in _norm(r1):
        for c, d in _norm(r2):
            lo, hi = max(a, c), min(b, d)
            if lo <= hi:
                out.append((lo, hi))
    return _norm(out)


def charset_expr(ranges) -> Optional[str]:
    """GBNF for one character from the code point set `ranges`, JSON-encoded as
    json.dumps(ensure_ascii=False) would: raw unless it needs an escape."""
    ranges = _norm(ranges)
    # surrogates cannot appear in UTF-8 text
    ranges = _intersect(ranges, [(0, 0xD7FF), (0xE000, _MAXCP)])
    special = [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]
    raw = _intersect(ranges, _complement(special))
    alts = []
    if raw:
        if len(raw) == 1 and raw[0][0] == raw[0][1]:
            alts.append(_lit(chr(raw[0][0])))
        else:
            # use a negated class when that is shorter
            comp = _complement(raw)
            if len(comp) < len(raw):
                alts.append("[^" + "".join(_class_range(a, b) for a, b in comp) + "]")
            else:
                alts.append("[" + "".join(_class_range(a, b) for a, b in raw) + "]")
    esc = []
    if _intersect(ranges, [(0, 0x1F)]) == [(0, 0x1F)]:
        # every control character: any of their escapes decodes into the set
        esc.append('[bfnrt] | "u00" [01] [0-9a-fA-F]')
        ctl = []
    else:
        ctl = _intersect(ranges, [(0, 0x1F)])
    for a, b in ctl:
        for o in range(a, b + 1):
            e = _ESC_JSON.get(chr(o), "\\u%04x" % o)
            esc.append(_lit(e[1:]))
    for o in (0x22, 0x5C):
        if _intersect(ranges, [(o, o)]):
            esc.append(_lit(chr(o)))
    if esc:
        if len(esc) == 1 and _LIT_RE.fullmatch(esc[0]):
            alts.append('"\\\\' + esc[0][1:])
        else:
            alts.append('"\\\\" ' + ("(" + " | ".join(esc) + ")" if len(esc) > 1 else esc[0]))
    if not alts:
        return None
    if len(alts) == 1 and (" " not in alts[0] or _LIT_RE.fullmatch(alts[0])
                           or re.fullmatch(r"\[(?:[^\]\\]|\\.)*\]", alts[0])
                           or _balanced_outer(alts[0])):
        return alts[0]
    return "(" + " | ".join(alts) + ")"


def _class_range(a, b):
    if a == b:
        return _class_char(a)
    return _class_char(a) + "-" + _class_char(b)


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

    def parse(self):
        alts = []
        while True:
            alts.append(self.parse_seq(top=True))
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
                self.i += 1
                start = self.i
                continue
            if c == "$":
                self.i += 1
                if not (top and (self.i == len(self.p) or self.p[self.i] == "|")):
                    self.err("'$' (anchor) not at the end")
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


_LIT_RE = re.compile(r'"(?:[^"\\]|\\.)*"')


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


# ----------------------------------------------------------------------------

def _type_of(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    raise SchemaError("unsupported constant %r" % (v,))


def _type_matches(v, types) -> bool:
    t = _type_of(v)
    return t in types or (t == "integer" and "number" in types)


def _json_eq(a, b) -> bool:
    """JSON equality as the validator sees it: 1 == 1.0, but True != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_eq(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_eq(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


class _Converter:
    def __init__(self, root):
        self.root = root
        self.rules: dict = {}          # name -> body, in emission order
        self.bodies: dict = {}         # body -> name, to share identical rules
        self.ref_names: dict = {}      # JSON pointer -> rule name (recursion)
        self.prim_used: set = set()

    # -- rule bookkeeping
    def add_rule(self, name: str, body: str) -> str:
        name = re.sub(r"[^a-zA-Z0-9-]+", "-", name).strip("-") or "r"
        if body in self.bodies and name != "root":
            return self.bodies[body]
        if name in PRIMITIVES and name != "root":
            name = name + "-r"
        key = name
        i = 0
        while key in self.rules and self.rules[key] != body:
            i += 1
            key = "%s-%d" % (name, i)
        self.rules[key] = body
        self.bodies.setdefault(body, key)
        return key

    def prim(self, name: str) -> str:
        todo = [name]
        while todo:
            n = todo.pop()
            if n not in self.prim_used:
                self.prim_used.add(n)
                todo.extend(PRIMITIVE_DEPS[n])
        return name

    # -- entry
    def convert(self) -> str:
        # reserved, so that no other rule (e.g. one for a property whose name
        # sanitizes to nothing) can take the name
        self.rules["root"] = "<pending>"
        e = self.visit(self.root, "#", "root")
        if e is None:
            raise SchemaError("schema admits no value at #")
        self.rules["root"] = e
        out = ["root ::= " + self.rules["root"]]
        for k, v in self.rules.items():
            if k != "root":
                out.append("%s ::= %s" % (k, v))
        for k in PRIMITIVES:
            if k in self.prim_used:
                out.append("%s ::= %s" % (k, PRIMITIVES[k]))
        return "\n".join(out) + "\n"

    # -- $ref
    def resolve(self, ref: str, path: str):
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError("unsupported JSON Schema keyword '$ref' (only local "
                              "'#/...' references) at %s" % path)
        node = self.root
        frag = ref[1:]
        if frag and not frag.startswith("/"):
            raise SchemaError("unsupported JSON Schema keyword '$ref' (anchor %r) at %s"
                              % (ref, path))
        for part in frag.split("/")[1:] if frag else []:
            part = part.replace("~1", "/").replace("~0", "~")
            from urllib.parse import unquote
            part = unquote(part)
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise SchemaError("unresolvable '$ref' %r at %s" % (ref, path))
        return node

    # -- main dispatch: returns a GBNF expression (a rule name or a small
    # expression, every value alternative ending in `space`), None = no value.
    def visit(self, s, path: str, name: str) -> Optional[str]:
        if s is True or s == {}:
            return self.prim("value")
        if s is False:
            return None
        if not isinstance(s, dict):
            raise SchemaError("schema must be an object or a boolean at %s" % path)
        for k in s:
            if k in ANNOTATIONS or k in SUPPORTED or k.startswith("x-"):
                continue
            raise SchemaError("unsupported JSON Schema keyword %r at %s" % (k, path))
        if "$ref" in s:
            rest = {k: v for k, v in s.items() if k != "$ref" and k not in ANNOTATIONS}
            if rest:
                return self.visit({"allOf": [{"$ref": s["$ref"]}, rest]}, path, name)
            ref = s["$ref"]
            target = self.resolve(ref, path)
            if ref in self.ref_names:
                return self.ref_names[ref]
            rname = ref.split("/")[-1] if ref != "#" else "root-ref"
            rname = re.sub(r"[^a-zA-Z0-9-]+", "-", rname).strip("-") or "ref"
            if rname in PRIMITIVES or rname == "root":
                rname += "-ref"
            base, i = rname, 0
            while rname in self.rules or rname in self.ref_names.values():
                i += 1
                rname = "%s-%d" % (base, i)
            self.ref_names[ref] = rname
            self.rules[rname] = "<pending>"
            body = self.visit(target, ref, rname)
            if body is None:
                raise SchemaError("'$ref' %r admits no value at %s" % (ref, path))
            self.rules[rname] = body
            return rname
        if "allOf" in s:
            return self.visit(self.merge_allof(s, path), path, name)
        for kw in ("anyOf", "oneOf"):
            if kw in s:
                branches = s[kw]
                if not isinstance(branches, list) or not branches:
                    raise SchemaError("'%s' must be a non-empty array at %s" % (kw, path))
                rest = {k: v for k, v in s.items() if k != kw and k not in ANNOTATIONS}
                alts = []
                for i, b in enumerate(branches):
                    bp = "%s/%s/%d" % (path, kw, i)
                    if rest:
                        b = self.merge([rest, b], bp)
                    e = self.visit(b, bp, "%s-%d" % (name, i))
                    if e is not None and e not in alts:
                        alts.append(e)
                if not alts:
                    return None
                if len(alts) == 1:
                    return alts[0]
                return self.add_rule(name, " | ".join(alts))
        types = s.get("type", list(ALL_TYPES))
        if isinstance(types, str):
            types = [types]
        if not isinstance(types, list) or any(t not in ALL_TYPES for t in types):
            raise SchemaError("unsupported 'type' %r at %s" % (s.get("type"), path))
        if "integer" in types and "number" in types:
            types = [t for t in types if t != "integer"]
        if "enum" in s or "const" in s:
            return self.visit_enum(s, types, path, name)
        alts = []
        for t in types:
            e = getattr(self, "visit_" + t)(s, path, name if len(types) == 1 else name + "-" + t)
            if e is not None:
                alts.append(e)
        if not alts:
            return None
        if len(alts) == 1:
            return alts[0]
        return self.add_rule(name, " | ".join(alts))

    # -- allOf merging
    def merge_allof(self, s, path):
        parts = s["allOf"]
        if not isinstance(parts, list) or not parts:
            raise SchemaError("'allOf' must be a non-empty array at %s" % path)
        rest = {k: v for k, v in s.items() if k != "allOf" and k not in ANNOTATIONS}
        return self.merge(list(parts) + ([rest] if rest else []), path + "/allOf")

    def merge(self, parts, path):
        out: dict = {}
        for i, p in enumerate(parts):
            seen = 0
            while isinstance(p, dict) and "$ref" in p:
                seen += 1
                if seen > 32:
                    raise SchemaError("'$ref' cycle inside 'allOf' at %s" % path)
                extra = {k: v for k, v in p.items() if k != "$ref" and k not in ANNOTATIONS}
                tgt = self.resolve(p["$ref"], path)
                if extra:
                    p = self.merge([tgt, extra], path)
                else:
                    p = tgt
            if p is True:
                continue
            if p is False:
                return False
            if not isinstance(p, dict):
                raise SchemaError("schema must be an object or a boolean at %s/%d" % (path, i))
            if "allOf" in p:
                p = self.merge_allof(p, path)
                if p is False:
                    return False
            out = self.merge2(out, p, "%s/%d" % (path, i))
            if out is False:
                return False
        return out

    def merge2(self, a: dict, b: dict, path):
        out = dict(a)
        for k, v in b.items():
            if k in ANNOTATIONS:
                continue
            if k not in SUPPORTED and not k.startswith("x-"):
                raise SchemaError("unsupported JSON Schema keyword %r at %s" % (k, path))
            if k not in out:
                out[k] = v
                continue
            u = out[k]
            if k == "type":
                ta = [u] if isinstance(u, str) else list(u)
                tb = [v] if isinstance(v, str) else list(v)
                inter = [t for t in ta if t in tb or (t == "integer" and "number" in tb)]
                inter += [t for t in tb if t == "integer" and "number" in ta and t not in inter]
                if not inter:
                    return False
                out[k] = inter
            elif k == "required":
                out[k] = list(u) + [x for x in v if x not in u]
            elif k in ("minItems", "minLength", "minimum", "exclusiveMinimum"):
                if isinstance(u, bool) or isinstance(v, bool):
                    raise SchemaError("unsupported boolean %r in 'allOf' at %s" % (k, path))
                out[k] = max(u, v)
            elif k in ("maxItems", "maxLength", "maximum", "exclusiveMaximum"):
                if isinstance(u, bool) or isinstance(v, bool):
                    raise SchemaError("unsupported boolean %r in 'allOf' at %s" % (k, path))
                out[k] = min(u, v)
            elif k == "enum":
                out[k] = [x for x in u if any(_json_eq(x, y) for y in v)]
            elif k == "const":
                if not _json_eq(u, v):
                    return False
            elif k in ("items", "additionalItems"):
                out[k] = {"allOf": [u, v]}
            elif k == "properties":
                props = dict(u)
                for pk, pv in v.items():
                    props[pk] = {"allOf": [props[pk], pv]} if pk in props else pv
                out[k] = props
            elif k in ("anyOf", "oneOf"):
                # (A1|A2) & (B1|B2): the cross product, when small
                if len(u) * len(v) > 16:
                    raise SchemaError("unsupported JSON Schema keyword %r (two large "
                                      "'%s' in 'allOf') at %s" % (k, k, path))
                out[k] = [{"allOf": [x, y]} for x in u for y in v]
            elif k == "prefixItems":
                pass  # merged below, with the items of both sides
            elif k in ("pattern", "format", "additionalProperties", "$ref"):
                if u != v:
                    raise SchemaError("unsupported JSON Schema keyword %r (two different "
                                      "values in 'allOf') at %s" % (k, path))
            else:
                raise SchemaError("unsupported JSON Schema keyword %r in 'allOf' at %s" % (k, path))
        # items of one side applies to the other side's prefixItems positions
        if "prefixItems" in a or "prefixItems" in b:
            if isinstance(a.get("items"), list) or isinstance(b.get("items"), list):
                raise SchemaError("unsupported JSON Schema keyword 'items' (array form) "
                                  "in 'allOf' at %s" % path)
            xa, xb = a.get("prefixItems", []), b.get("prefixItems", [])
            ia, ib = a.get("items", True), b.get("items", True)
            pre = []
            for i in range(max(len(xa), len(xb))):
                sa = xa[i] if i < len(xa) else ia
                sb = xb[i] if i < len(xb) else ib
                pre.append({"allOf": [sa, sb]})
            out["prefixItems"] = pre
            out["items"] = {"allOf": [ia, ib]}
        # additionalProperties of one side restricts the other side's properties
        if "properties" in a or "properties" in b or "additionalProperties" in a \
                or "additionalProperties" in b:
            pa, pb = a.get("properties", {}), b.get("properties", {})
            aa, ab = a.get("additionalProperties", True), b.get("additionalProperties", True)
            props = {}
            for pk in list(pa) + [x for x in pb if x not in pa]:
                sa = pa.get(pk, aa)
                sb = pb.get(pk, ab)
                if sa is False or sb is False:
                    props[pk] = False
                elif sa is True or sa == {}:
                    props[pk] = sb
                elif sb is True or sb == {}:
                    props[pk] = sa
                else:
                    props[pk] = {"allOf": [sa, sb]}
            if props:
                out["properties"] = props
            if aa is False or ab is False:
                out["additionalProperties"] = False
            elif aa is True or aa == {}:
                if ab is not True:
                    out["additionalProperties"] = ab
            elif ab is True or ab == {}:
                out["additionalProperties"] = aa
            else:
                out["additionalProperties"] = {"allOf": [aa, ab]}
        return out

    # -- enum / const
    def visit_enum(self, s, types, path, name):
        values = None
        if "enum" in s:
            if not isinstance(s["enum"], list):
                raise SchemaError("'enum' must be an array at %s" % path)
            values = list(s["enum"])
        if "const" in s:
            c = s["const"]
            values = [c] if values is None else [v for v in values if _json_eq(v, c)]
        others = [k for k in s if k not in ANNOTATIONS and k not in ("enum", "const", "type")]
        if others:
            raise SchemaError("unsupported JSON Schema keyword %r together with 'enum'/'const' "
                              "at %s" % (others[0], path))
        alts = []
        for v in values:
            if not _type_matches(v, types):
                continue
            e = self.const_expr(v, path)
            if e not in alts:
                alts.append(e)
        if not alts:
            return None
        return self.add_rule(name, " | ".join(alts) if len(alts) > 1 else alts[0]) \
            if len(alts) > 1 or " " in alts[0] else alts[0]

    def const_expr(self, v, path) -> str:
        sp = self.prim("space")
        if isinstance(v, dict):
            if not v:
                return '"{" %s "}" %s' % (sp, sp)
            members = ['%s %s ":" %s %s' % (_lit(_json_dumps(str(k))), sp, sp,
                                            self.const_expr(x, path)) for k, x in v.items()]
            return '"{" %s %s "}" %s' % (sp, (' "," %s ' % sp).join(members), sp)
        if isinstance(v, list):
            if not v:
                return '"[" %s "]" %s' % (sp, sp)
            items = [self.const_expr(x, path) for x in v]
            return '"[" %s %s "]" %s' % (sp, (' "," %s ' % sp).join(items), sp)
        if isinstance(v, float) and not math.isfinite(v):
            raise SchemaError("non-finite number in 'enum'/'const' at %s" % path)
        return "%s %s" % (_lit(_json_dumps(v)), sp)

    # -- scalar types
    def visit_null(self, s, path, name):
        return self.prim("null")

    def visit_boolean(self, s, path, name):
        return self.prim("boolean")

    def _bound(self, s, k, path):
        v = s.get(k)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise SchemaError("unsupported value of JSON Schema keyword %r at %s" % (k, path))
        return v

    def _bounds(self, s, path):
        """(lo, lo_exclusive, hi, hi_exclusive), handling draft-4 boolean exclusives."""
        lo = self._bound(s, "minimum", path)
        hi = self._bound(s, "maximum", path)
        lo_x = hi_x = False
        em, eM = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
        if isinstance(em, bool):
            lo_x = em and lo is not None
        elif em is not None:
            v = self._bound(s, "exclusiveMinimum", path)
            if lo is None or v >= lo:
                lo, lo_x = v, True
        if isinstance(eM, bool):
            hi_x = eM and hi is not None
        elif eM is not None:
            v = self._bound(s, "exclusiveMaximum", path)
            if hi is None or v <= hi:
                hi, hi_x = v, True
        return lo, lo_x, hi, hi_x

    def visit_integer(self, s, path, name):
        lo, lo_x, hi, hi_x = self._bounds(s, path)
        if lo is None and hi is None:
            return self.prim("integer")
        ilo = ilhi = None
        if lo is not None:
            ilo = math.floor(lo) + 1 if lo_x and float(lo).is_integer() else math.ceil(lo)
            if lo_x and not float(lo).is_integer():
                ilo = math.ceil(lo)
        if hi is not None:
            ilhi = math.ceil(hi) - 1 if hi_x and float(hi).is_integer() else math.floor(hi)
        e = int_range_expr(ilo, ilhi)
        if e is None:
            return None
        return self.add_rule(name, e + " " + self.prim("space"))

    def visit_number(self, s, path, name):
        lo, lo_x, hi, hi_x = self._bounds(s, path)
        if lo is None and hi is None:
            return self.prim("number")
        for k, v in (("minimum" if not lo_x else "exclusiveMinimum", lo),
                     ("maximum" if not hi_x else "exclusiveMaximum", hi)):
            if v is not None and (not float(v).is_integer() or abs(v) >= 2 ** 53):
                raise SchemaError("unsupported JSON Schema keyword %r (a number bound must "
                                  "be an integer below 2**53) at %s" % (k, path))
        lo = None if lo is None else int(lo)
        hi = None if hi is None else int(hi)
        digits = max(len(str(abs(v))) for v in (lo, hi) if v is not None)
        k = min(FRAC_DIGITS, 15 - digits)  # fraction digits: see module docstring
        alts = []
        # non-negative part: magnitudes m = x
        if hi is None or hi > 0 or (hi == 0 and not hi_x):
            if lo is None or lo < 0:
                a, ax = 0, False
            else:
                a, ax = lo, lo_x
            alts += self._magnitude(a, ax, hi, hi_x, k)
        # negative part: x = -m, m > 0
        if lo is None or lo < 0:
            if hi is None or hi >= 0:
                a, ax = 0, True
            else:
                a, ax = -hi, hi_x
            b, bx = (None, False) if lo is None else (-lo, lo_x)
            neg = self._magnitude(a, ax, b, bx, k)
            if neg:
                alts.append('"-" ' + _group(neg))
        if not alts:
            return None
        return self.add_rule(name, _group(alts) + " " + self.prim("space"))

    @staticmethod
    def _magnitude(a, ax, b, bx, k):
        """Alternatives for decimal magnitudes m (no exponent) with a <(=) m <(=) b,
        integer bounds; fractions have at most k digits."""
        any_f = '("." [0-9]{1,%d})?' % k if k >= 1 else ""
        zero_f = '("." "0"{1,%d})?' % k if k >= 1 else ""
        nz_f = '"." "0"{0,%d} [1-9] [0-9]{0,%d}' % (k - 1, k - 1) if k >= 1 else None
        alts = []
        if b is not None and (b < a or (b == a and (ax or bx))):
            return alts
        if b is not None and b == a:
            return [_join(_group(_nonneg_range(a, a)), zero_f)]
        # integer part strictly inside (a, b)
        mid = _nonneg_range(a + 1, None if b is None else b - 1)
        if mid:
            alts.append(_join(_group(mid), any_f))
        ia = _group(_nonneg_range(a, a))
        if ax:
            if nz_f:
                alts.append(ia + " " + nz_f)
        else:
            alts.append(_join(ia, any_f))
        if b is not None and not bx:
            alts.append(_join(_group(_nonneg_range(b, b)), zero_f))
        return alts

    def visit_string(self, s, path, name):
        lo = s.get("minLength", 0)
        hi = s.get("maxLength")
        for kw, v in (("minLength", lo), ("maxLength", hi)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise SchemaError("bad value of JSON Schema keyword %r at %s" % (kw, path))
        if hi is not None and hi < lo:
            return None
        fmt = s.get("format")
        if fmt is not None and fmt not in FORMATS:
            fmt = None  # an annotation (see module docstring)
        pat = s.get("pattern")
        if pat is not None and fmt is not None:
            raise SchemaError("unsupported JSON Schema keyword 'pattern' together with "
                              "'format' at %s" % path)
        sp = self.prim("space")
        if pat is not None or fmt is not None:
            if pat is not None:
                if not isinstance(pat, str):
                    raise SchemaError("bad value of JSON Schema keyword 'pattern' at %s" % path)
                try:
                    re.compile(pat)
                except re.error as exc:
                    raise SchemaError("invalid regex in 'pattern' at %s: %s" % (path, exc))
                ast = _RegexParser(pat, path + "/pattern").parse()
                plo, phi = _regex_len(ast)
                body = _regex_to_gbnf(ast)
                if body is None:
                    return None
                kw = "pattern"
            else:
                plo, phi = FORMAT_LENGTHS.get(fmt, (1, None))
                body = FORMATS[fmt]
                kw = "format"
            if lo > plo or (hi is not None and (phi is None or phi > hi)):
                if hi is not None and hi < plo or (phi is not None and lo > phi):
                    return None
                bad = "minLength" if lo > plo else "maxLength"
                raise SchemaError("unsupported JSON Schema keyword %r together with %r "
                                  "(not implied by it) at %s" % (bad, kw, path))
            inner = self.add_rule(name + ("-" + fmt if fmt else "-pattern"), body)
            return self.add_rule(name, '"\\"" %s "\\"" %s' % (inner, sp))
        if lo == 0 and hi is None:
            return self.prim("string")
        ch = self.prim("char")
        if hi is None:
            rep = "%s{%d,}" % (ch, lo)
        elif lo == hi:
            rep = "%s{%d}" % (ch, lo)
        else:
            rep = "%s{%d,%d}" % (ch, lo, hi)
        return self.add_rule(name, '"\\"" %s "\\"" %s' % (rep, sp))

    # -- arrays
    def visit_array(self, s, path, name):
        lo = s.get("minItems", 0)
        hi = s.get("maxItems")
        for kw, v in (("minItems", lo), ("maxItems", hi)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise SchemaError("bad value of JSON Schema keyword %r at %s" % (kw, path))
        items = s.get("items", True)
        prefix = s.get("prefixItems", [])
        if isinstance(items, list):  # draft 4-7 tuple form
            prefix, items = items, s.get("additionalItems", True)
            ip = path + "/additionalItems"
        else:
            if "additionalItems" in s:
                raise SchemaError("unsupported JSON Schema keyword 'additionalItems' "
                                  "without array 'items' at %s" % path)
            ip = path + "/items"
        if not isinstance(prefix, list):
            raise SchemaError("'prefixItems' must be an array at %s" % path)
        pre = []
        for i, p in enumerate(prefix):
            e = self.visit(p, "%s/prefixItems/%d" % (path, i), "%s-%d" % (name, i))
            if e is None:  # positions from i on can't exist
                hi = i if hi is None else min(hi, i)
                break
            pre.append(e)
        it = self.visit(items, ip, name + "-item")
        if it is None:
            hi = len(pre) if hi is None else min(hi, len(pre))
        if hi is not None and hi < lo:
            return None
        sp = self.prim("space")

        def elems(i):
            """Elements from index i on, `i` already written; "" = nothing more."""
            if hi is not None and i >= hi:
                return ""
            sep = "" if i == 0 else '"," %s ' % sp
            if i < len(pre):
                tail = elems(i + 1)
                e = sep + pre[i] + (" " + tail if tail else "")
                return e if i < lo else "(" + e + ")?"
            if it is None:
                return ""
            rlo = max(0, lo - i)
            rhi = None if hi is None else hi - i
            if i == 0:
                more = _rep('"," %s %s' % (sp, it), max(0, rlo - 1),
                            None if rhi is None else rhi - 1)
                e = it + (" " + more if more else "")
                return e if rlo >= 1 else "(" + e + ")?"
            return _rep('"," %s %s' % (sp, it), rlo, rhi)

        body = elems(0)
        return self.add_rule(name, '"[" %s %s"]" %s' % (sp, body + " " if body else "", sp))

    # -- objects
    def visit_object(self, s, path, name):
        props = s.get("properties", {})
        if not isinstance(props, dict):
            raise SchemaError("'properties' must be an object at %s" % path)
        required = s.get("required", [])
        if not isinstance(required, list):
            raise SchemaError("'required' must be an array at %s" % path)
        addl = s.get("additionalProperties", True)
        sp = self.prim("space")
        if not props and not required and (addl is True or addl == {}):
            return self.prim("object")
        addl_e = self.visit(addl, path + "/additionalProperties", name + "-additional")
        # (key literal, value expr, required)
        members = []
        declared = list(props)
        for k, v in props.items():
            e = self.visit(v, "%s/properties/%s" % (path, _ptr_escape(k)),
                           "%s-%s" % (name, k))
            if e is None:
                if k in required:
                    return None
                continue
            members.append((k, e, k in required))
        for k in required:
            if k not in props:
                if addl_e is None:
                    return None
                members.append((k, addl_e, True))
                declared.append(k)
        kvs = []
        for k, e, req in members:
            kv = "%s %s \":\" %s %s" % (_lit(_json_dumps(k)), sp, sp, e)
            kvs.append((kv, req))
        extra = None
        if addl_e is not None:
            key = self.add_rule(name + "-additional-key",
                                self.not_strings_rule(declared, name + "-additional-key"))
            extra = self.add_rule(name + "-additional-kv",
                                  '%s %s ":" %s %s' % (key, sp, sp, addl_e))
        n = len(kvs)
        # tail(j): members j.. after something was written (each with a comma)
        tails = {}

        def tail(j):
            if j in tails:
                return tails[j]
            if j == n:
                r = '("," %s %s)*' % (sp, extra) if extra else ""
            else:
                kv, req = kvs[j]
                nxt = tail(j + 1)
                piece = '"," %s %s' % (sp, kv)
                piece = piece if req else "(" + piece + ")?"
                body = (piece + " " + nxt).strip()
                r = self.add_rule("%s-tail-%d" % (name, j), body) if j < n - 1 else body
            tails[j] = r
            return r

        def head(i):
            """members i.. with nothing written yet."""
            if i == n:
                return "(" + extra + ' ("," %s %s)*)?' % (sp, extra) if extra else ""
            kv, req = kvs[i]
            t = tail(i + 1)
            first = kv + (" " + t if t else "")
            if req:
                return first
            h = head(i + 1)
            if not h:
                return "(" + first + ")?"
            # h can be empty exactly when no later member is required
            return self.add_rule("%s-head-%d" % (name, i), first + " | " + h)

        body = head(0)
        return self.add_rule(name, '"{" %s %s"}" %s' % (sp, body + " " if body else "", sp))

    def not_strings_rule(self, words, name) -> str:
        """A JSON string (with quotes, without trailing space) whose value is none of
        `words`."""
        ch = self.prim("char")
        if not words:
            return '"\\"" %s* "\\""' % ch
        trie: dict = {}
        for w in words:
            node = trie
            for c in w:
                node = node.setdefault(c, {})
            node[None] = True
        counter = [0]

        # every continuation must end with a closing quote
        def close(node):
            kids = sorted(c for c in node if c is not None)
            alts = []
            for c in kids:
                alts.append("%s %s" % (_lit(_json_dumps(c)[1:-1]), close(node[c])))
            ex = [(ord(c), ord(c)) for c in kids]
            div = charset_expr(_complement(ex + [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]))
            alts.append('%s %s* "\\""' % (div, ch))
            if None not in node:
                alts.append('"\\""')
            counter[0] += 1
            return self.add_rule("%s-%d" % (name, counter[0]), " | ".join(alts))

        return '"\\"" ' + close(trie)


def _join(a: str, b: str) -> str:
    return a + (" " + b if b else "")


def _rep(e: str, lo: int, hi: Optional[int]) -> str:
    if hi is not None and hi <= 0:
        return ""
    g = "(" + e + ")"
    if hi is None:
        return g + ("*" if lo == 0 else "+" if lo == 1 else "{%d,}" % lo)
    if lo == hi:
        return g if lo == 1 else g + "{%d}" % lo
    if (lo, hi) == (0, 1):
        return g + "?"
    return g + "{%d,%d}" % (lo, hi)


def schema_to_gbnf(schema) -> str:
    """Convert a JSON Schema (dict, bool, or JSON text) to GBNF text with a
    `root` rule.  Raises SchemaError for what it cannot express."""
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise SchemaError("JSON Schema is not valid JSON: %s" % exc) from None
    if not isinstance(schema, (dict, bool)):
        raise SchemaError("JSON Schema must be an object or a boolean, got %s"
                          % type(schema).__name__)
    try:
        return _Converter(schema).convert()
    except RecursionError:
        raise SchemaError("JSON Schema nests too deeply") from None


def json_value_gbnf() -> str:
    """Any JSON value (bounded whitespace, bounded number digits)."""
    return schema_to_gbnf(True)


def json_object_gbnf() -> str:
    """Any JSON object: OpenAI's response_format {"type": "json_object"}."""
    return schema_to_gbnf({"type": "object"})
