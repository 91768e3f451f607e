"""Widgets build and work headless: from synthetic data, and on a tiny model."""
import ipywidgets as W
import pytest

from colibri_lab import plots, widgets
from colibri_lab.experiments import ExperimentSpec, Variant


def test_token_stream_html_colours_and_escapes():
    h = widgets.token_stream_html(["<a>", "b", "c"], ["x", "&y"], cached=2, accepted=[False, True])
    assert h.count('class="cl-cached"') == 2 and h.count('class="cl-prompt"') == 1
    assert h.count('class="cl-output"') == 1 and h.count('class="cl-accepted"') == 1
    assert "&lt;a&gt;" in h and "&amp;y" in h and "<a>" not in h
    assert "reused 2" in h
    with pytest.raises(ValueError):
        widgets.token_stream_html(["a"], [], cached=2)
    with pytest.raises(ValueError):
        widgets.token_stream_html(["a"], ["b"], accepted=[True, False])


def _spec(tiny):
    wl = {"name": "w", "items": [{"id": f"q{i}", "system": "Be brief.", "turns": [f"Hi {i}", "Again"]}
                                 for i in range(2)]}
    return ExperimentSpec("w", workload=wl, repeats=1, warmup=0,
                          engine={"model": str(tiny.path), "n_threads": 1, "n_ctx": 256, "n_slots": 2,
                                  "simd": "scalar"},
                          request={"max_tokens": 4},
                          variants=[Variant("off", engine={"prefix_reuse": False}),
                                    Variant("on", engine={"prefix_reuse": True})])


def test_live_run_updates_progress_and_plot(make_tiny):
    live = widgets.LiveRun(_spec(make_tiny()), plot=plots.latency_cdf, plot_kwargs={"metric": "e2e_ms"},
                           min_interval=0.0)
    assert isinstance(live.widget, W.VBox)
    res = live.run()
    assert len(res.requests) == 8
    assert live.progress.value == live.progress.max == 8
    assert live.n_draws >= 8 and "done: 8 requests" in live.status.value


def test_knobs_rerun_with_new_settings(make_tiny):
    k = widgets.Knobs(_spec(make_tiny()))
    try:
        # prefix_reuse differs between the variants: it is not offered as a knob
        assert "engine.prefix_reuse" not in k.controls and "engine.n_slots" in k.controls
        res = k.run_once(max_tokens=2, n_slots=1)
        assert res.requests["completion_tokens"].max() == 2
        assert k.controls["request.max_tokens"].value == 2
        assert {e["params"]["n_slots"] for e in res.meta["engines"].values()} == {1}
        n_eng = len(k.engines)
        k.run_once()                       # same settings: engines are reused
        assert len(k.engines) == n_eng
    finally:
        k.close()


def test_token_stream_view_marks_reused_prefix(make_tiny):
    from colibri_lab.engine import Engine

    eng = Engine(str(make_tiny().path), n_threads=1, n_ctx=256, simd="scalar")
    try:
        ts = widgets.TokenStream(eng, min_interval=0.0)
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
        first = ts.show(msgs, max_tokens=3)
        assert first["cached_tokens"] == 0 and len(first["output_tokens"]) == 3
        second = ts.show(msgs, max_tokens=3)
        assert second["cached_tokens"] > 0
        assert ts.html.value.count('class="cl-cached"') == min(second["cached_tokens"],
                                                                len(second["prompt_tokens"]))
    finally:
        eng.close()
