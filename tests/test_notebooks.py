"""Execute every notebook in notebooks/ with nbclient (fresh kernel each, small
sizes via COLIBRI_LAB_SMALL=1) and fail on any error - the notebooks assert
what they show, so a failed claim fails here.

Uses the real SmolLM2 model (fixture smollm2_path).  COLIBRI_LAB_SIMD and
COLIBRI_LAB_THREADS pass through to the notebooks (e.g. COLIBRI_LAB_SIMD=scalar
while a SIMD path is unavailable); COLIBRI_LAB_NB_TIMEOUT sets the per-cell
timeout in seconds (default 900).
"""
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    names = {p.name for p in NOTEBOOKS}
    assert {"tour.ipynb", "batching_latency.ipynb", "prefix_hit_ratio.ipynb", "speculative_acceptance.ipynb",
            "grammar_overhead.ipynb"} <= names


# ---- the workbench pieces the speculative / grammar notebooks stand on (no model needed)
def _spec_metrics(n_pos, a_pos, by_src):
    return {"draft_n_by_pos": n_pos, "draft_accepted_by_pos": a_pos,
            "draft_n_by_source": {s: n for s, (n, _) in by_src.items()},
            "draft_accepted_by_source": {s: a for s, (_, a) in by_src.items()}}


def test_per_position_columns_flatten_and_aggregate():
    import numpy as np
    from colibri_lab import plots
    from colibri_lab.experiments import Results, acceptance_by_position, acceptance_by_source
    from colibri_lab.metrics import flat_columns as list_metric_columns

    cols = list_metric_columns(_spec_metrics([5, 3, 1], [3, 1, 0], {"prompt_lookup": (9, 4)}))
    assert cols == {"draft_n_pos_0": 5, "draft_accepted_pos_0": 3, "draft_n_pos_1": 3, "draft_accepted_pos_1": 1,
                    "draft_n_pos_2": 1, "draft_accepted_pos_2": 0, "draft_n_src_prompt_lookup": 9,
                    "draft_accepted_src_prompt_lookup": 4}
    assert list_metric_columns({"draft_n_by_pos": [], "draft_n_by_source": {}}) == {}
    base = dict(repeat=0, turn=0, seed=0, error="")
    rows = [dict(base, variant="plain", prompt_id="a", draft_n=0, draft_accepted=0),
            dict(base, variant="k4", prompt_id="a", draft_n=9, draft_accepted=4,
                 **list_metric_columns(_spec_metrics([5, 3, 1], [3, 1, 0], {"prompt_lookup": (9, 4)}))),
            dict(base, variant="k4", prompt_id="b", draft_n=2, draft_accepted=1,
                 **list_metric_columns(_spec_metrics([2], [1], {"prompt_lookup": (2, 1)})))]
    req = Results.from_rows(rows, [], {}).requests
    # rows that did not reach a position get 0 there (not NaN), positions in numeric order
    assert req["draft_n_pos_2"].tolist() == [0, 1, 0] and str(req["draft_n_pos_2"].dtype) == "int64"
    pos_cols = [c for c in req.columns if c.startswith("draft_n_pos_")]
    assert pos_cols == ["draft_n_pos_0", "draft_n_pos_1", "draft_n_pos_2"]
    t = acceptance_by_position(req)
    assert t[["variant", "position", "drafted", "accepted"]].values.tolist() == [
        ["k4", 0, 7, 4], ["k4", 1, 3, 1], ["k4", 2, 1, 0]]      # plain drafted nothing: no rows
    np.testing.assert_allclose(t["accept_rate"], [4 / 7, 1 / 3, 0.0])
    src = acceptance_by_source(req).set_index("variant")
    assert src.loc["k4", "drafted"] == 11 and src.loc["k4", "accepted"] == 5
    fig = plots.acceptance_by_position(req)                  # straight from the request table
    np.testing.assert_allclose(sorted(p.get_height() for p in fig.axes[0].patches), sorted([4 / 7, 1 / 3, 0.0]))


def test_results_save_steps_compressed_and_none(tmp_path):
    import numpy as np
    import pandas as pd
    from colibri_lab.experiments import Results, load_results

    rows = [dict(variant="v", repeat=0, prompt_id="a", turn=0, seed=0, e2e_ms=1.5, output_text="x", error="")]
    steps = [dict(variant="v", repeat=0, step=i, step_ms=1.0 + i / 3, t_rel_s=i * 0.123456789) for i in range(50)]
    res = Results.from_rows(rows, steps, {"experiment": {"name": "t"}})
    p = res.save(path=tmp_path / "gz", steps="gz")
    assert (p / "steps.csv.gz").is_file() and not (p / "steps.csv").exists()
    back = load_results(p)
    pd.testing.assert_frame_equal(back.requests, res.requests)
    np.testing.assert_allclose(back.steps["step_ms"], res.steps["step_ms"], atol=5e-5, rtol=0)
    assert not np.array_equal(back.steps["step_ms"], res.steps["step_ms"])   # rounded, as documented
    p = res.save(path=tmp_path / "gz", steps="none")                       # re-save: the old steps file goes
    assert not (p / "steps.csv.gz").exists() and len(load_results(p).steps) == 0
    with pytest.raises(ValueError):
        res.save(path=tmp_path / "x", steps="zip")


def test_json_validity_parses_and_validates():
    pytest.importorskip("jsonschema")
    import pandas as pd
    from colibri_lab.experiments import json_validity

    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "d": {"type": "string", "format": "date"}},
              "required": ["n"], "additionalProperties": False}
    wl = {"name": "w", "items": [{"id": "x", "turns": ["q"], "schema": schema}, {"id": "y", "turns": ["q"]}]}
    df = pd.DataFrame({"variant": "v", "repeat": 0, "prompt_id": ["x", "x", "x", "x", "y", "y"],
                       "output_text": ['{"n": 3}', '{"n": "3"}', '{"n": 3', '{"n": 1, "d": "2024-13-45"}',
                                       '[1]', 'no']})
    v = json_validity(df, wl)
    assert v["parses"].tolist() == [True, True, False, True, True, False]
    assert v["valid"].tolist() == [True, False, False, False, True, False]   # format "date" is checked
    assert v["problem"].iloc[0] == "" and v["problem"].iloc[2].startswith("not JSON")


@pytest.mark.smollm2
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, smollm2_path, monkeypatch):
    monkeypatch.setenv("COLIBRI_LAB_SMALL", "1")
    monkeypatch.setenv("COLIBRI_LAB_SMOLLM2", smollm2_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("MPLBACKEND", "agg")
    nb = nbformat.read(path, as_version=4)
    assert nb.cells and "COLIBRI_LAB_SMALL" in nb.cells[1].source, "the first code cell holds the parameters"
    client = nbclient.NotebookClient(nb, timeout=int(os.environ.get("COLIBRI_LAB_NB_TIMEOUT", "900")),
                                     kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    client.execute()   # raises CellExecutionError on the first failing cell
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
