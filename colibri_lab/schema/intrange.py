"""Integer ranges as digit grammars: the canonical decimals of the integers
in [lo, hi] as a GBNF expression (for minimum / maximum on integers)."""
from __future__ import annotations

from typing import Optional

from .gbnf import INT_DIGITS, _group

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

