"""GBNF text pieces the schema converter writes: literals, class characters,
groups and repetitions, and the JSON primitives (bounded whitespace, bounded
numbers, strings) every converted grammar shares."""
from __future__ import annotations

import json
import re
from typing import Any, Optional

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


_LIT_RE = re.compile(r'"(?:[^"\\]|\\.)*"')


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

