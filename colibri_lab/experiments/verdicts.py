"""Claims a notebook makes, computed from its results.

A notebook's conclusion must not be prose written before the run: the
verdict cell renders the claims from the results, and the cell that asserts
them uses the very same objects, so what is printed and what is checked are
one statement.

    c = Claim.from_comparison("Prefix reuse shortens TTFT on requests with a reusable prefix",
                              compare(df, "ttft_ms", "reuse-off", "reuse-on"))
    claims = [c, Claim("Outputs are identical with and without reuse", eq["all_equal"],
                       f"{eq['n_equal']}/{eq['n_pairs']} pairs equal")]
    check(claims)          # the asserting cell: AssertionError naming the claim that does not hold
    verdict(claims)        # the conclusion cell: Markdown, "holds" / "does not hold" per claim
    record(res, claims)    # and into the saved results' meta.json, where docs/workbench_results.md reads it
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    """One statement, whether the results support it, and the numbers that say so."""

    statement: str
    holds: bool | None                 # None: not tested here (the evidence says why)
    evidence: str = ""

    def __post_init__(self):   # numpy booleans from pandas comparisons become plain ones
        if self.holds is not None:
            object.__setattr__(self, "holds", bool(self.holds))

    @classmethod
    def from_comparison(cls, statement: str, c: dict) -> "Claim":
        """A claim that `c` (stats.compare) is a win: the whole interval on the good side of 1."""
        ev = (f"{c['metric']} ratio {c['variant']} / {c['baseline']} = {c['ratio']:.3f} "
              f"[{c['ci_low']:.3f}, {c['ci_high']:.3f}] over {c['n_pairs']} pairs: {c['verdict']}")
        return cls(statement, c["verdict"] == "win", ev)

    def __bool__(self) -> bool:
        return bool(self.holds)

    @property
    def status(self) -> str:
        return "not tested" if self.holds is None else "holds" if self.holds else "does not hold"

    def line(self) -> str:
        mark = self.status if self.holds is not False else "DOES NOT HOLD"
        return f"{self.statement}: {mark}" + (f" ({self.evidence})" if self.evidence else "")

    def __str__(self) -> str:
        return self.line()

    def _repr_markdown_(self) -> str:
        return verdict([self]).data


def check(claims) -> None:
    """Assert every claim; the error names the first one that does not hold
    (or was not tested), in its own words."""
    for c in claims:
        assert c.holds is True, f"claim does not hold: {c.line()}"


def verdict(claims, title: str = "Verdict"):
    """The conclusion, rendered from the claims: an IPython Markdown object
    (plain text when IPython is missing), one bullet per claim, and a first
    line that says whether all of them hold."""
    claims = list(claims)
    n_ok = sum(c.holds is True for c in claims)
    n_bad = sum(c.holds is False for c in claims)
    n_untested = len(claims) - n_ok - n_bad
    parts = [f"{n_ok} of {len(claims)} claims hold" if n_ok < len(claims) else f"all {len(claims)} claims hold"]
    if n_bad:
        parts.append(f"{n_bad} do{'es' if n_bad == 1 else ''} not")
    if n_untested:
        parts.append(f"{n_untested} not tested")
    head = f"**{title}: {', '.join(parts)}.**"
    mark = {"holds": "✔", "does not hold": "✘", "not tested": "–"}
    lines = [head, ""] + [f"- {mark[c.status]} {c.statement} — **{c.status}**"
                          + (f": {c.evidence}" if c.evidence else "") for c in claims]
    text = "\n".join(lines)
    try:
        from IPython.display import Markdown

        return Markdown(text)
    except ImportError:   # pragma: no cover - IPython ships with the notebook dependencies
        return text


def record(results, claims) -> None:
    """Store the claims in results.meta["claims"] and, when the results were
    saved, in their meta.json too (the tables are not rewritten)."""
    import json
    from pathlib import Path

    recs = [{"statement": c.statement, "holds": c.holds, "evidence": c.evidence} for c in claims]
    results.meta["claims"] = recs
    if getattr(results, "path", None) is not None:
        p = Path(results.path) / "meta.json"
        meta = json.loads(p.read_text())
        meta["claims"] = recs
        p.write_text(json.dumps(meta, indent=1) + "\n")
