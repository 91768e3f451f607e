"""Experiments API: workloads, specs, the runner on a tiny model, results I/O."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from colibri_lab.errors import InvalidRequestError
from colibri_lab.experiments import (
    BUILTIN, Arrival, ExperimentSpec, Variant, block_order, load_results, load_spec, load_workload, run,
    run_spec, spec_from_dict, summary_table, sweep,
)
from colibri_lab.experiments.results import ID_COLUMNS, METRIC_COLUMNS, TAIL_COLUMNS

ROOT = Path(__file__).resolve().parent.parent

# A small multi-turn workload whose prompts fit the tiny model's context.
MINI = {"name": "mini", "systems": {"s": "You are a tiny test model. Answer briefly."},
        "items": [{"id": f"p{i}", "group": "g", "system_ref": "s", "turns": [f"Question {i}?", "Why?"]}
                  for i in range(3)]}


def _spec(tiny, **kw):
    d = dict(name="mini", workload=MINI, repeats=2, warmup=1, seed=5,
             engine={"model": str(tiny.path), "n_threads": 1, "n_ctx": 256, "n_slots": 2, "simd": "scalar"},
             request={"max_tokens": 6, "temperature": 0.8}, arrival={"concurrency": 2},
             variants=[Variant("off", engine={"prefix_reuse": False}), Variant("on", engine={"prefix_reuse": True})],
             lossless=True)
    d.update(kw)
    return ExperimentSpec(**d)


@pytest.fixture(scope="module")
def tiny_run(make_tiny):
    tiny = make_tiny()
    return tiny, run(_spec(tiny), progress=False)


# ------------------------------------------------------------------ workloads
def test_builtin_workloads_load_and_are_well_formed():
    for name in BUILTIN:
        wl = load_workload(name)
        assert len(wl) >= 4 and wl.description
        assert len({it.id for it in wl.items}) == len(wl)
    sp = load_workload("shared_prefix")
    assert len({it.system for it in sp.items}) == 3 and all(len(it.system) > 1500 for it in sp.items)
    mt = load_workload("multi_turn", n=2, turns=3)
    assert len(mt) == 2 and mt.n_requests == 6
    msgs = mt.items[0].messages(2, ["r0", "r1"])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert msgs[2]["content"] == "r0" and msgs[-1]["content"] == mt.items[0].turns[2]
    g = load_workload("shared_prefix", n=6, order="grouped")
    assert [it.group for it in g.items] == ["weather", "weather", "hr", "hr", "recipes", "recipes"]
    assert [it.id for it in g.items][:2] == ["weather-0", "weather-1"]
    with pytest.raises(ValueError):
        load_workload("shared_prefix", order="random")
    js = load_workload("json_extract")
    assert all(it.schema and it.schema["type"] == "object" for it in js.items)


def test_workload_errors_and_jsonl(tmp_path):
    with pytest.raises(ValueError, match="duplicate"):
        load_workload({"items": [{"id": "a", "turns": ["x"]}, {"id": "a", "turns": ["y"]}]})
    with pytest.raises(ValueError, match="system_ref"):
        load_workload({"items": [{"id": "a", "turns": ["x"], "system_ref": "nope"}]})
    with pytest.raises(ValueError, match="turns"):
        load_workload({"items": [{"id": "a", "turns": []}]})
    with pytest.raises(FileNotFoundError):
        load_workload("no-such-workload")
    p = tmp_path / "w.jsonl"
    p.write_text('{"id": "x", "turns": ["hi"]}\n\n{"id": "y", "turns": ["a", "b"], "group": "g"}\n')
    wl = load_workload(p)
    assert wl.name == "w" and wl.n_requests == 3 and wl.items[1].group == "g"
    with pytest.raises(IndexError):
        wl.items[0].messages(1, ["r"])


def test_arrivals():
    a = Arrival.from_dict({"rate": 10.0, "seed": 1})
    t = a.start_times(2000)
    assert a.kind == "poisson" and np.all(np.diff(t) > 0)
    assert abs(np.mean(np.diff(t)) - 0.1) < 0.01                    # mean gap 1/rate
    assert np.array_equal(t, Arrival.from_dict({"rate": 10.0, "seed": 1}).start_times(2000))
    assert not np.array_equal(t, Arrival.from_dict({"rate": 10.0, "seed": 2}).start_times(2000))
    c = Arrival.from_dict({"concurrency": 3})
    assert c.kind == "closed" and not c.start_times(5).any() and c.workers(10) == 3 and c.workers(2) == 2
    for bad in ({"concurrency": 0}, {"kind": "poisson"}, {"kind": "burst"}, {"qps": 3}):
        with pytest.raises(ValueError):
            Arrival.from_dict(bad)


# ---------------------------------------------------------------------- specs
def test_block_order_is_abba():
    assert block_order(["A", "B"], 4) == [(0, "A"), (0, "B"), (1, "B"), (1, "A"), (2, "A"), (2, "B"),
                                          (3, "B"), (3, "A")]
    order = block_order(["A", "B", "C"], 2)
    assert [n for _, n in order] == ["A", "B", "C", "C", "B", "A"]


def test_all_shipped_specs_parse_in_both_sizes():
    for p in sorted((ROOT / "experiments").glob("*.toml")):
        full, small = load_spec(p, small=False), load_spec(p, small=True)
        assert len(full.variants) >= 2, p
        assert small.repeats <= full.repeats and (small.workload_n or 99) <= (full.workload_n or 99), p
        assert full.baseline_name in [v.name for v in full.variants]
    for name in ("tour", "batching", "prefix", "grammar", "speculative"):
        assert (ROOT / "experiments" / f"{name}.toml").is_file()
    b = load_spec(ROOT / "experiments" / "batching.toml", small=False)
    assert [v.resolved().arrival["concurrency"] for v in b.variants] == [1, 2, 4, 8]


def test_spec_validation_and_sweep():
    with pytest.raises(ValueError, match="unknown experiment key"):
        spec_from_dict({"name": "x", "variantz": []})
    with pytest.raises(ValueError, match="unknown key"):
        spec_from_dict({"name": "x", "variants": [{"name": "a", "n_slots": 2}]})
    with pytest.raises(ValueError, match="unique"):
        ExperimentSpec("x", [Variant("a"), Variant("a")])
    with pytest.raises(ValueError, match="baseline"):
        ExperimentSpec("x", [Variant("a")], baseline="b")
    vs = sweep("engine.n_slots", [1, 2], base=Variant("b", request={"max_tokens": 3}))
    assert [(v.name, v.engine["n_slots"], v.request["max_tokens"]) for v in vs] == [("n_slots=1", 1, 3),
                                                                                     ("n_slots=2", 2, 3)]
    s = spec_from_dict({"name": "x", "engine": {"n_threads": 1}, "request": {"max_tokens": 4},
                        "variants": [{"name": "a", "engine": {"n_threads": 2}}], "small": {"repeats": 1}},
                       small=True)
    v = s.resolved_variants()[0]
    assert s.repeats == 1 and v.engine["n_threads"] == 2 and v.request["max_tokens"] == 4
    assert v.engine["model"] == "smollm2"   # defaults fill what is not given


# --------------------------------------------------------------------- runner
def test_request_table_schema_and_pairing(tiny_run):
    tiny, res = tiny_run
    df = res.requests
    n_req = 2 * 2 * 6            # variants x repeats x (3 items x 2 turns)
    assert len(df) == n_req and not res.interrupted
    for c in ID_COLUMNS + METRIC_COLUMNS + TAIL_COLUMNS:
        assert c in df.columns, c
    assert (df["error"] == "").all()
    assert df.groupby(["variant", "repeat", "prompt_id", "turn", "seed"]).size().eq(1).all()
    # item i gets seed spec.seed + i in every variant
    assert (df["seed"] == 5 + df["item_index"]).all()
    assert set(df["completion_tokens"]) <= set(range(7)) and (df["completion_tokens"] > 0).all()
    assert (df["e2e_ms"] >= df["ttft_ms"]).all() and (df["t_done_s"] >= df["t_submit_s"]).all()
    assert df["output_tokens"].map(lambda s: len(s.split())).eq(df["completion_tokens"]).all()
    # prefix reuse: turn 1 of "on" hits the cache, "off" never does
    on1 = df[(df.variant == "on") & (df.turn == 1)]
    assert (on1["cached_tokens"] > 0).all()
    assert (df[df.variant == "off"]["cached_tokens"] == 0).all()
    # the first turn of the first conversation of a block starts from a clear cache
    first = df.sort_values("t_submit_s").groupby("block").head(1)
    assert (first["cached_tokens"] == 0).all()
    # ABBA blocks
    blocks = df.groupby("block")[["variant", "repeat"]].first()
    assert list(blocks["variant"]) == ["off", "on", "on", "off"]
    # sampling at temperature 0.8 with per-item seeds: reuse must not change the text
    tab = summary_table(res)
    assert bool(tab.loc["on", "outputs equal"]) and tab.loc["on", "prefix_cache_hit_rate"] > 0.3
    assert tab.loc["off", "prefix_cache_hit_rate"] == 0.0


def test_step_table_and_metadata(tiny_run):
    tiny, res = tiny_run
    st = res.steps
    assert len(st) > 0 and {"step", "rows_decode", "rows_prefill", "step_ms", "matmul_ms", "variant",
                             "block"} <= set(st.columns)
    for _, g in st.groupby("block"):
        assert g["step"].is_monotonic_increasing
    # every generated token is one decode row or the last prefill row of its request
    assert st["rows_decode"].sum() + len(res.requests) >= res.requests["completion_tokens"].sum()
    m = res.meta
    assert len(m["git"]["commit"]) in (0, 40)
    assert m["machine"]["simd"]["detected"] in ("scalar", "avx2", "avx512")
    assert m["machine"]["cpu"] and m["versions"]["numpy"] == np.__version__
    eng = m["engines"]["on"]
    assert eng["model_path"] == str(tiny.path) and len(eng["model_sha256"]) == 64
    assert eng["params"]["prefix_reuse"] is True and m["engines"]["off"]["params"]["prefix_reuse"] is False
    assert [b["variant"] for b in m["blocks"]] == ["off", "on", "on", "off"]
    assert m["experiment"]["name"] == "mini" and m["date"]


def test_results_save_load_roundtrip(tiny_run, tmp_path):
    _, res = tiny_run
    p = res.save(root=tmp_path)
    assert p.parent == tmp_path / "mini" and (p / "meta.json").is_file()
    back = load_results(p)
    pd.testing.assert_frame_equal(res.requests, back.requests)
    pd.testing.assert_frame_equal(res.steps, back.steps)
    assert back.meta["git"] == res.meta["git"] and back.meta["engines"] == json.loads(json.dumps(res.meta["engines"]))
    assert res.save(root=tmp_path) != p        # a second save does not overwrite the first


def test_interrupt_returns_finished_rows(make_tiny):
    seen = []

    def on_row(row, rows):
        seen.append(row)
        if len(seen) == 4:
            raise KeyboardInterrupt

    res = run(_spec(make_tiny()), progress=False, on_row=on_row)
    assert res.interrupted and 4 <= len(res.requests) < 24
    assert res.meta["interrupted"] is True


def test_rejected_setting_fails_the_run(make_tiny):
    spec = _spec(make_tiny(), variants=[Variant("bad", request={"no_such_setting": 1})])
    with pytest.raises(InvalidRequestError, match="no_such_setting"):
        run(spec, progress=False)
    # rejected only once the request reaches the engine (the handle's error): still fatal, not a row
    spec = _spec(make_tiny(), variants=[Variant("bad", request={"speculative": {"no_such_key": 1}})])
    with pytest.raises(InvalidRequestError, match="no_such_key"):
        run(spec, progress=False)


def test_poisson_arrivals_and_error_rows(make_tiny):
    long = {"name": "mixed", "items": [{"id": "ok", "turns": ["hi"]},
                                       {"id": "too-long", "turns": ["x" * 400]},
                                       {"id": "ok2", "turns": ["hello"]}]}
    spec = _spec(make_tiny(), workload=long, repeats=1, warmup=0, arrival={"rate": 50.0, "seed": 3},
                 variants=[Variant("only")])
    res = run(spec, progress=False)
    df = res.requests.set_index("prompt_id")
    assert "Context" in df.loc["too-long", "error"] and df.loc["ok", "error"] == ""
    assert df.loc["ok2", "t_release_s"] > df.loc["ok", "t_release_s"] > 0
    assert (df["arrival"] == "poisson 50/s").all()


def test_run_spec_from_toml(make_tiny, tmp_path, toml_spec):
    tiny = make_tiny()
    spec = toml_spec(tiny.path, MINI, n=1)
    res = run_spec(spec, progress=False)
    assert res.path is not None and res.path.parent == tmp_path / "results" / "x"
    assert set(res.requests.groupby("variant")["completion_tokens"].max()) == {3, 2}
    tab = summary_table(load_results(res.path))
    assert list(tab.index) == ["a", "b"] and tab.loc["a", "n"] == 2


def test_cli_run_model_replaces_the_specs_model(make_tiny, tmp_path, monkeypatch, capsys, toml_spec):
    """`colibri-lab run SPEC --model M` runs every variant on M (the spec names a file that does not exist)."""
    from colibri_lab.cli import main
    from colibri_lab.experiments import latest_results

    tiny = make_tiny()
    spec = toml_spec(tmp_path / "absent.gguf", MINI, n=1, max_tokens=2, b_max_tokens=None)
    assert main(["run", str(spec), "--model", str(tiny.path)]) == 0
    assert "results:" in capsys.readouterr().out
    res = latest_results("x", root=tmp_path / "results")
    assert {e["model_path"] for e in res.meta["engines"].values()} == {str(tiny.path)}
    assert res.meta["experiment"]["engine"]["model"] == str(tiny.path)
