"""Expert heat for MoE models (issue 8): per-request routing stats, engine-life
counts behind the server's /experts, and the heat-map figure."""
from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

from colibri_lab import _engine
from tinymodels import write_tiny_model


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    w = write_tiny_model(tmp_path_factory.mktemp("experts") / "moe.gguf", arch="qwen3moe", wtype="F32")
    return str(w.path)


def _run(core, prompt, max_tokens):
    core.submit(prompt, max_tokens=max_tokens, ignore_eos=True)
    done = None
    while core.pending:
        for ev in core.step():
            if ev["type"] == "done":
                done = ev["metrics"]
    return done


def test_per_request_expert_stats(moe_path):
    model = _engine.Model(moe_path)
    info = model.info
    core = _engine.Engine(model, n_slots=2, n_ctx=64, n_threads=1)
    m = _run(core, [5, 6, 7, 8, 9], 6)
    rows = m["prompt_tokens"] + m["completion_tokens"] - 1  # the last token is never fed back
    assert m["experts_routed"] == rows * info["n_layer"] * info["n_expert_used"]
    assert 0 < m["experts_unique"] <= info["n_layer"] * info["n_expert"]
    counts = core.expert_counts()
    assert counts.shape == (info["n_layer"], info["n_expert"])
    assert counts.sum() == m["experts_routed"]
    # a second request adds to the engine-life counts, and reports only its own
    m2 = _run(core, [9, 8, 7], 3)
    assert core.expert_counts().sum() == m["experts_routed"] + m2["experts_routed"]


def test_dense_model_reports_no_experts(make_tiny):
    model = _engine.Model(str(make_tiny(wtype="F32").path))
    core = _engine.Engine(model, n_slots=1, n_ctx=32, n_threads=1)
    m = _run(core, [1, 2, 3], 2)
    assert m["experts_routed"] == 0 and m["experts_unique"] == 0
    assert core.expert_counts().shape[1] == 0


def test_experts_endpoint_and_heatmap(moe_path):
    from colibri_lab import Engine
    from colibri_lab.plots import expert_heatmap
    from colibri_lab.server import Server

    eng = Engine(moe_path, n_threads=1, n_ctx=64)
    srv = Server(eng, "127.0.0.1", 0)
    srv.start()
    try:
        eng.generate([5, 6, 7, 8], max_tokens=4, ignore_eos=True)
        with urllib.request.urlopen(srv.url + "/experts", timeout=30) as r:
            body = json.loads(r.read())
        assert body["moe"] is True and body["n_expert"] == eng.info["n_expert"]
        assert len(body["layers"]) == eng.info["n_layer"]
        assert sum(l["total"] for l in body["layers"]) > 0
        fig = expert_heatmap(np.array([l["counts"] for l in body["layers"]]))
        assert fig.axes and fig.axes[0].get_xlabel() == "expert"
    finally:
        srv.stop()
        eng.close()


def test_expert_heat_widget_headless(moe_path):
    from colibri_lab import Engine
    from colibri_lab.widgets import ExpertHeat

    eng = Engine(moe_path, n_threads=1, n_ctx=64)
    try:
        w = ExpertHeat(eng)
        eng.generate([5, 6, 7], max_tokens=3, ignore_eos=True)
        fig = w.refresh()
        assert fig is not None and w.counts().sum() > 0
    finally:
        eng.close()
