"""Serving experiments against our server on SmolLM2: one row per request,
/metrics deltas that match the requests sent, the same Results as in-process
runs (saved and loaded back, summary_table, provenance), the CLI's
`bench serve`, and the llama.cpp anchor when it is installed."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

from colibri_lab.experiments import load_results, run, serve_table, spec_from_dict, summary_table
from colibri_lab.experiments import servers
from colibri_lab.experiments.results import file_sha256

pytestmark = [pytest.mark.smollm2, pytest.mark.slow]


def serving_spec(model_path, **over):
    d = {"name": "serve_test", "workload": {"name": "multi_turn", "n": 2, "turns": 2}, "repeats": 1, "warmup": 1,
         "seed": 3, "engine": {"model": model_path, "n_threads": 2, "n_ctx": 1024, "n_slots": 2},
         "request": {"max_tokens": 8, "temperature": 0.0},
         "serve": {"kind": "colibri", "model_id": "smollm2", "slo": "ttft:5000 tpot:1000", "args": ["--chunk", "3"]},
         "variants": [{"name": "rate=4", "arrival": {"rate": 4.0}}, {"name": "rate=8", "arrival": {"rate": 8.0}}]}
    d.update(over)
    return spec_from_dict(d, small=False)


@pytest.fixture(scope="module")
def served(smollm2_path, tmp_path_factory):
    res = run(serving_spec(smollm2_path), progress=False)
    path = res.save(root=tmp_path_factory.mktemp("results"), steps="gz")
    return res, path


def test_one_row_per_request_and_metrics_deltas_match(served):
    res, _ = served
    df = res.requests
    assert len(df) == 2 * 4 and (df["error"] == "").all(), df[["variant", "error"]]
    assert df.groupby(["variant", "repeat", "prompt_id", "turn"]).size().eq(1).all()
    assert (df["completion_tokens"] > 0).all() and (df["tokens_counted"] == "usage").all()
    assert (df["e2e_ms"] >= df["ttft_ms"]).all() and (df["ttft_ms"] > 0).all()
    # every request streamed at most one chunk per token (tokens that queued up while its HTTP thread
    # was behind share one), and each gap between chunks is in the gap table
    assert ((df["n_chunks"] >= 1) & (df["n_chunks"] <= df["completion_tokens"])).all()
    gaps = res.gaps.groupby(["variant", "prompt_id", "turn"]).size()
    for r in df.itertuples():
        assert gaps.get((r.variant, r.prompt_id, r.turn), 0) == r.n_chunks - 1
    # the server's counters moved by exactly what this client sent and received, block by block
    for b in res.meta["blocks"]:
        rows = df[df["block"] == b["block"]]
        d = b["metrics_delta"]
        assert d["request_success"] == len(rows)
        assert d["prompt_tokens"] == rows["prompt_tokens"].sum()
        assert d["generation_tokens"] == rows["completion_tokens"].sum()
        assert d["prefix_cache_hits"] == rows["cached_tokens"].sum()
        assert d["prefix_cache_hit_rate"] == pytest.approx(rows["cached_tokens"].sum() / rows["prompt_tokens"].sum())
    # turn 1 carries turn 0's history: the server finds it in its prefix cache
    t0 = df[df.turn == 0].set_index(["variant", "prompt_id"])["prompt_tokens"]
    t1 = df[df.turn == 1].set_index(["variant", "prompt_id"])
    assert (t1["cached_tokens"] >= t0.loc[t1.index]).all()


def test_blocks_are_tagged_and_pair_across_servers(served, smollm2_path):
    from colibri_lab.experiments.serve_bench import block_tag

    res, _ = served
    df = res.requests
    # each block has its own tag, so the second block on the server finds none of the first's prompts
    first = df[df.turn == 0]
    assert (first["cached_tokens"] < 0.5 * first["prompt_tokens"]).all()
    spec = serving_spec(smollm2_path, variants=[
        {"name": "a", "arrival": {"rate": 4.0}}, {"name": "b", "arrival": {"rate": 8.0}},
        {"name": "c", "arrival": {"rate": 4.0}, "serve": {"kind": "llama.cpp"}}])
    a, b, c = spec.resolved_variants()
    assert block_tag(spec, a, 0) != block_tag(spec, b, 0) and block_tag(spec, a, 0) != block_tag(spec, a, 1)
    assert block_tag(spec, a, 0) == block_tag(spec, c, 0)          # two servers at one rate: the same prompts
    nofresh = spec_from_dict({"name": "x", "fresh_cache": False, "serve": {}, "variants": [{"name": "a"}]}, small=False)
    assert block_tag(nofresh, nofresh.resolved_variants()[0], 0) == ""


def test_results_round_trip_with_provenance(served, smollm2_path):
    res, path = served
    back = load_results(path)
    assert (path / "gaps.csv.gz").is_file()
    assert len(back.requests) == len(res.requests) and len(back.gaps) == len(res.gaps)
    np.testing.assert_allclose(back.requests["ttft_ms"], res.requests["ttft_ms"])
    m = back.meta
    eng = m["engines"]["rate=4"]
    assert eng["kind"] == "colibri" and eng["model_sha256"] == file_sha256(smollm2_path)
    assert eng["params"]["n_threads"] == 2 and eng["params"]["simd"] in ("scalar", "avx2", "avx512")
    assert "--threads" in eng["cmd"] and eng["version"]
    assert eng["params"]["n_chunk"] == 3 and eng["params"]["args"] == ["--chunk", "3"]   # serve.args reach the engine
    assert len(m["git"]["commit"]) in (0, 40) and isinstance(m["git"]["dirty"], bool)
    assert m["load"]["before"]["loadavg"] and m["load"]["after"]["uptime"] is not None
    assert {"numpy", "pandas", "python"} <= set(m["versions"])
    assert all("load_before" in b and "summary" in b for b in m["blocks"])
    tab = summary_table(back)
    assert list(tab.index) == ["rate=4", "rate=8"] and (tab["model"] == os.path.basename(smollm2_path)).all()
    assert tab["commit"].iloc[0].startswith(m["git"]["commit"][:10])
    assert "commit" in back.requests.attrs["provenance"]


def test_serve_table_has_vllm_metrics(served):
    res, _ = served
    t = serve_table(res)
    for c in ("completed", "request_throughput", "output_throughput", "request_goodput", "mean_ttft_ms",
              "median_tpot_ms", "p90_itl_ms", "p99_e2el_ms", "sustained", "prefix_cache_hit_rate", "commit",
              "model_file"):
        assert c in t.columns, c
    assert (t["completed"] == 4).all() and (t["failed"] == 0).all()
    assert (t["requests_in_metrics"] == t["completed"]).all()
    assert (t["server"] == "colibri").all() and list(t["rate"]) == [4.0, 8.0]
    # the generous SLO holds for every request here
    assert (t["good_requests"] == t["completed"]).all()


def test_bench_serve_cli_against_a_running_server(smollm2_path, tmp_path, capsys):
    from colibri_lab import cli

    with servers.start_colibri(smollm2_path, n_threads=2, n_ctx=512, n_slots=2, model_id="smollm2") as srv:
        rc = cli.main(["bench", "serve", "--base-url", srv.base_url + "/v1", "--model", "smollm2", "--rate", "4,inf",
                       "--workload", "open_chat", "--n", "3", "--max-tokens", "4", "--goodput", "ttft:60000",
                       "--quiet", "--save", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    for s in ("Serving Benchmark Result: rate=4", "Serving Benchmark Result: rate=inf", "Mean TTFT (ms):",
              "P99 ITL (ms):", "Median TPOT (ms):", "Request goodput (req/s):", "commit "):
        assert s in out, s
    saved = list((tmp_path / "bench_serve").iterdir())
    assert len(saved) == 1 and (saved[0] / "summary.json").is_file()
    back = load_results(saved[0])
    assert len(back.requests) == 6 and (back.requests["server"] == "url").all()


def test_bad_serve_settings_are_refused(smollm2_path):
    with pytest.raises(ValueError, match="unknown \\[serve\\] key"):
        serving_spec(smollm2_path, serve={"kind": "colibri", "port": 1})
    with pytest.raises(ValueError, match="serve.kind"):
        run(serving_spec(smollm2_path, serve={"kind": "vllm"}), progress=False)
    with pytest.raises(ValueError, match="base_url"):
        run(serving_spec(smollm2_path, serve={"kind": "url"}), progress=False)
    with pytest.raises(ValueError, match="SLO"):
        run(serving_spec(smollm2_path, serve={"kind": "colibri", "slo": "ttft:fast"}), progress=False)


def test_llama_cpp_anchor_side_by_side(smollm2_path):
    why = servers.llama_cpp_unavailable()
    if why:
        pytest.skip(why)
    spec = serving_spec(smollm2_path, workload={"name": "open_chat", "n": 3}, variants=[
        {"name": "colibri", "arrival": {"rate": 4.0}},
        {"name": "llama.cpp", "arrival": {"rate": 4.0}, "serve": {"kind": "llama.cpp"}}])
    res = run(spec, progress=False)
    df = res.requests
    assert (df["error"] == "").all(), df["error"].tolist()
    assert len(df) == 6 and set(df["server"]) == {"colibri", "llama.cpp"}
    ll = res.meta["engines"]["llama.cpp"]
    assert ll["kind"] == "llama.cpp" and ll["model_sha256"] == res.meta["engines"]["colibri"]["model_sha256"]
    assert ll["params"]["n_threads"] == 2 and ll["params"]["n_ctx"] == 1024 and "--interrupt_requests" in ll["cmd"]
    assert not math.isnan(df[df.server == "llama.cpp"]["ttft_ms"].median())
