"""Plots build from synthetic results without a model, and draw what they say."""
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from colibri_lab import plots


def synthetic_requests(seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for v, conc, speed in (("c1", 1, 1.0), ("c2", 2, 1.7), ("c4", 4, 2.9)):
        for rep in range(2):
            for i in range(6):
                for turn in range(3):
                    ptoks = 100 + 40 * turn
                    rows.append(dict(variant=v, repeat=rep, concurrency=conc, prompt_id=f"p{i}", turn=turn, seed=i,
                                     t_submit_s=i / speed, t_done_s=(i + 1) / speed,
                                     completion_tokens=10, prompt_tokens=ptoks,
                                     cached_tokens=0 if turn == 0 else ptoks - 30,
                                     ttft_ms=rng.lognormal(3, 0.3), e2e_ms=rng.lognormal(5, 0.3),
                                     decode_tok_s=50 / conc ** 0.2, grammar_mask_us=rng.uniform(10, 100),
                                     error=""))
    return pd.DataFrame(rows)


def synthetic_steps():
    return pd.DataFrame([dict(variant=v, step=i, rows_decode=1, rows_prefill=0, step_ms=10.0, matmul_ms=6.0 * k,
                              attention_ms=2.0, lm_head_ms=1.0, sampling_ms=0.5, grammar_ms=0.0, draft_ms=0.0,
                              other_ms=0.5) for k, v in ((1, "A"), (2, "B")) for i in range(5)])


def test_latency_cdf():
    df = synthetic_requests()
    fig = plots.latency_cdf(df, "ttft_ms")
    assert isinstance(fig, Figure)
    lines = [l for l in fig.axes[0].get_lines() if len(l.get_xdata()) > 2]
    assert len(lines) == 3
    y = lines[0].get_ydata()
    assert y[-1] == 1.0 and np.all(np.diff(y) >= 0)
    # errored rows are left out
    df.loc[:5, "error"] = "boom"
    fig = plots.latency_cdf(df, "ttft_ms", by=None)
    assert max(l.get_ydata()[-1] for l in fig.axes[0].get_lines()) == 1.0
    assert "n=102" in fig.axes[0].get_legend().get_texts()[0].get_text()


def test_throughput_vs_concurrency_plots_block_aggregates():
    fig = plots.throughput_vs_concurrency(synthetic_requests())
    ax = fig.axes[0]
    agg = [l for l in ax.get_lines() if l.get_marker() == "o"][0]
    np.testing.assert_allclose(np.asarray(agg.get_xdata(), float), [1, 2, 4])
    np.testing.assert_allclose(np.asarray(agg.get_ydata(), float), [30.0, 51.0, 87.0])   # 6 items x 3 turns x 10 tokens over 6/speed s


def test_prefix_cache_hit_rate_by_turn():
    fig = plots.prefix_cache_hit_rate_by_turn(synthetic_requests(), by=None)
    heights = [p.get_height() for p in fig.axes[0].patches]
    np.testing.assert_allclose(heights, [0.0, 110 / 140, 150 / 180])


def test_step_breakdown_stacks_phases():
    fig = plots.step_breakdown(synthetic_steps())
    ax = fig.axes[0]
    assert len(ax.patches) == 2 * 7
    tops = {}
    for p in ax.patches:
        x = round(p.get_x() + p.get_width() / 2)
        tops[x] = max(tops.get(x, 0), p.get_y() + p.get_height())
    assert tops == pytest.approx({0: 10.0, 1: 16.0})


def test_acceptance_grammar_and_forest():
    pos = pd.DataFrame({"variant": "k4", "position": [1, 2, 3, 4], "drafted": [100, 80, 60, 40],
                        "accepted": [90, 60, 30, 10]})
    fig = plots.acceptance_by_position(pos)
    np.testing.assert_allclose([p.get_height() for p in fig.axes[0].patches], [0.9, 0.75, 0.5, 0.25])
    with pytest.raises(ValueError):
        plots.acceptance_by_position(pos.drop(columns="drafted"))
    fig = plots.grammar_mask_per_token(synthetic_requests())
    assert "per token" in fig.axes[0].get_xlabel()
    fig = plots.ratio_forest([{"variant": "B", "baseline": "A", "metric": "e2e_ms", "ratio": 0.8,
                               "ci_low": 0.7, "ci_high": 0.9, "verdict": "win"}])
    assert isinstance(fig, Figure)


def test_plots_draw_into_given_axes_and_leave_pyplot_alone():
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    fig = Figure()
    ax = fig.add_subplot(1, 1, 1)
    assert plots.latency_cdf(synthetic_requests(), "e2e_ms", ax=ax) is fig
    plots.step_breakdown(synthetic_steps())
    assert plt.get_fignums() == before
