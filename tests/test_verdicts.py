"""Verdicts rendered from results: the printed conclusion and the assertion are one Claim."""
import pytest

from colibri_lab.experiments.verdicts import Claim, check, verdict


def comparison(v, lo, hi):
    return {"metric": "ttft_ms", "variant": "on", "baseline": "off", "ratio": (lo + hi) / 2, "ci_low": lo,
            "ci_high": hi, "n_pairs": 9, "verdict": v}


def test_claim_from_comparison_holds_only_on_a_win():
    win = Claim.from_comparison("Reuse shortens TTFT", comparison("win", 0.1, 0.2))
    tie = Claim.from_comparison("Reuse shortens TTFT", comparison("no clear difference", 0.8, 1.1))
    assert win.holds and not tie.holds
    assert "0.100, 0.200" in win.evidence and "no clear difference" in tie.evidence
    check([win])
    with pytest.raises(AssertionError, match="claim does not hold: Reuse shortens TTFT: DOES NOT HOLD"):
        check([win, tie])


def test_verdict_text_follows_the_claims():
    a = Claim("A holds", True, "x = 1")
    b = Claim("B holds", False, "y = 2")
    c = Claim("C holds", None, "not run here")
    text = getattr(verdict([a]), "data", verdict([a]))
    assert "all 1 claims hold" in text and "A holds — **holds**: x = 1" in text
    text = getattr(verdict([a, b, c]), "data", verdict([a, b, c]))
    assert "1 of 3 claims hold, 1 does not, 1 not tested" in text
    assert "B holds — **does not hold**: y = 2" in text and "C holds — **not tested**" in text
    with pytest.raises(AssertionError, match="not tested"):
        check([c])


def test_numpy_booleans_count_as_booleans():
    import numpy as np

    c = Claim("x", np.bool_(True))
    assert c.holds is True
    check([c])


def test_record_writes_the_claims_into_saved_results(tmp_path):
    from colibri_lab.experiments import Results, load_results
    from colibri_lab.experiments.verdicts import record

    res = Results.from_rows([dict(variant="v", repeat=0, prompt_id="a", turn=0, seed=0, error="")], [],
                            {"experiment": {"name": "t"}})
    res.save(path=tmp_path / "r", steps="none")
    record(res, [Claim("A holds", True, "x"), Claim("B", None)])
    assert load_results(tmp_path / "r").meta["claims"] == [{"statement": "A holds", "holds": True, "evidence": "x"},
                                                           {"statement": "B", "holds": None, "evidence": ""}]
