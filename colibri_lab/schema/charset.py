"""A small algebra over sets of Unicode code points (sorted, disjoint
inclusive ranges), and one character of such a set written as GBNF over the
JSON-encoded string content."""
from __future__ import annotations

import re
from typing import Optional

from .gbnf import _LIT_RE, _balanced_outer, _class_char, _lit

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

