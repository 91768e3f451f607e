"""Statistics on synthetic data with known answers."""
import numpy as np
import pandas as pd
import pytest

from colibri_lab.experiments import stats


def _ab(n, ratio, sigma, seed, metric="e2e_ms"):
    """n paired requests: A ~ lognormal per prompt, B = A * ratio * lognormal noise."""
    rng = np.random.default_rng(seed)
    base = rng.lognormal(mean=np.log(100.0), sigma=0.5, size=n)       # prompt-to-prompt spread
    a = base * rng.lognormal(0.0, sigma, size=n)
    b = base * ratio * rng.lognormal(0.0, sigma, size=n)
    rows = []
    for i in range(n):
        for v, x in (("A", a[i]), ("B", b[i])):
            rows.append({"variant": v, "repeat": 0, "prompt_id": f"p{i}", "turn": 0, "seed": i, metric: x,
                         "error": "", "output_hash": f"h{i}"})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("estimator", ["gmean", "median"])
def test_known_ratio_is_covered_at_stated_rate(estimator):
    # 95% intervals over 60 independent data sets: the true ratio must be inside
    # in most of them (binomial: expect ~57; 48 is far in the tail for a correct CI).
    true = 0.8
    hits = 0
    for seed in range(60):
        c = stats.compare(_ab(40, true, 0.1, seed), "e2e_ms", "A", "B", estimator=estimator, n_boot=500, seed=seed)
        hits += c["ci_low"] <= true <= c["ci_high"]
        assert c["ci_low"] <= c["ratio"] <= c["ci_high"]
    assert hits >= 48, f"coverage {hits}/60 too low for a 95% interval"
    # and the intervals are informative: not trivially wide
    c = stats.compare(_ab(40, true, 0.1, 0), "e2e_ms", "A", "B", estimator=estimator)
    assert c["ci_high"] - c["ci_low"] < 0.2


def test_null_ab_is_not_called_a_win():
    wins = sum(stats.earns_its_keep(_ab(30, 1.0, 0.1, seed), "e2e_ms", "A", "B", n_boot=500, seed=seed)
               for seed in range(40))
    # a 95% two-sided interval excludes 1 on the good side in ~2.5% of null data sets
    assert wins <= 4


def test_clear_speedup_is_a_win_and_slowdown_a_loss():
    df = _ab(30, 0.7, 0.05, 1)
    c = stats.compare(df, "e2e_ms", "A", "B")
    assert c["verdict"] == "win" and c["ci_high"] < 1.0 and abs(c["ratio"] - 0.7) < 0.05
    assert stats.compare(df, "e2e_ms", "B", "A")["verdict"] == "loss"
    # for a higher-is-better metric the direction flips
    thr = _ab(30, 1.5, 0.05, 2, metric="decode_tok_s")
    assert stats.compare(thr, "decode_tok_s", "A", "B")["verdict"] == "win"
    assert stats.compare(thr, "decode_tok_s", "A", "B", better="lower")["verdict"] == "loss"


def test_bootstrap_is_seeded_and_handles_degenerate_input():
    r = np.random.default_rng(0).lognormal(0, 0.2, 25)
    assert stats.bootstrap_ci(r, seed=3) == stats.bootstrap_ci(r, seed=3)
    assert stats.bootstrap_ci(r, seed=3) != stats.bootstrap_ci(r, seed=4)
    est, lo, hi = stats.bootstrap_ci([2.0])
    assert est == 2.0 and np.isnan(lo) and np.isnan(hi)
    assert stats.verdict(lo, hi, "lower") == "no clear difference"
    est, lo, hi = stats.bootstrap_ci([0.0, -1.0, np.inf])       # nothing usable
    assert np.isnan(est)


def test_pairs_match_on_keys_and_skip_errors():
    df = _ab(5, 0.5, 0.0, 0)
    df.loc[(df.variant == "B") & (df.prompt_id == "p3"), "error"] = "EngineError: boom"
    p = stats.pairs(df, "e2e_ms", "A", "B")
    assert sorted(p["prompt_id"]) == ["p0", "p1", "p2", "p4"]
    np.testing.assert_allclose(p["ratio"], 0.5)
    dup = pd.concat([df, df[df.variant == "A"].head(1)])
    with pytest.raises(ValueError, match="not unique"):
        stats.pairs(dup, "e2e_ms", "A", "B")


def test_output_equality_finds_mismatches():
    df = _ab(6, 1.0, 0.1, 0)
    eq = stats.output_equality(df, "A", "B")
    assert eq["all_equal"] and eq["n_pairs"] == 6 and eq["n_equal"] == 6
    df.loc[(df.variant == "B") & (df.prompt_id == "p2"), "output_hash"] = "different"
    eq = stats.output_equality(df, "A", "B")
    assert not eq["all_equal"] and eq["n_equal"] == 5
    assert list(eq["mismatches"]["prompt_id"]) == ["p2"]
    assert not stats.output_equality(df, "A", "nope")["all_equal"]   # no pairs is not "equal"


def test_medians_p99_throughput_and_prefix_cache_hit_rate():
    x = np.arange(1, 101, dtype=float)
    df = pd.DataFrame({"variant": "A", "e2e_ms": x})
    s = stats.summarize(df, ["e2e_ms"])
    assert s.loc[0, "e2e_ms_median"] == 50.5 and s.loc[0, "e2e_ms_p99"] == pytest.approx(99.01)
    blk = pd.DataFrame({"variant": ["A"] * 3 + ["B"] * 3, "repeat": 0, "t_submit_s": [0, 1, 2, 0, 0, 0],
                        "t_done_s": [2, 3, 4, 1, 1, 2], "completion_tokens": [10, 10, 20, 5, 5, 10],
                        "cached_tokens": [0, 50, 50, 0, 0, 0], "prompt_tokens": [100] * 6})
    bt = stats.block_throughput(blk).set_index("variant")
    assert bt.loc["A", "throughput_tok_s"] == 10.0 and bt.loc["B", "throughput_tok_s"] == 10.0
    hr = stats.prefix_cache_hit_rate(blk).set_index("variant")["prefix_cache_hit_rate"]
    assert hr["A"] == pytest.approx(1 / 3) and hr["B"] == 0.0
    with pytest.raises(ValueError):
        stats.direction("mystery")
