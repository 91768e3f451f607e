"""Mixture-of-experts execution: batch-union experts, batch invariance,
expert heat counters and the route trace.

In one step the engine runs every expert that any row routed to exactly
once, over the rows routed to it.  These tests check, on tiny random MoE
GGUFs:
  - a request's logits are bit-identical whether it runs alone or batched
    with others (different experts per row, prefill and decode mixed);
  - per step, the number of expert FFNs computed (experts_unique) equals the
    number of distinct (layer, expert) pairs the route trace shows for that
    step — each routed expert is read once per step — and is smaller than
    the routings (experts_routed = rows * layers * top-k) when rows share;
  - the engine's (layer, expert) counts equal the trace's;
  - quantized MoE weights against the reference with the reference's own
    routing compared to the engine's.
The expert statistics need the binding's experts block (Engine.route_trace,
Engine.expert_counts, last_step()['experts_unique']).
"""
from __future__ import annotations

import csv
from collections import Counter, defaultdict

import numpy as np
import pytest

from reference import LlamaRef
from test_reference import TIE_QUANT, TOL_QUANT, argmax_mismatches, prompt, rel_err
from tinymodels import write_tiny_model

N_CTX = 128


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    cache = {}
    root = tmp_path_factory.mktemp("moe")

    def make(**kw):
        key = tuple(sorted(kw.items()))
        if key not in cache:
            cache[key] = write_tiny_model(root / ("m-" + "-".join(f"{k}_{v}" for k, v in key) + ".gguf"), **kw)
        return cache[key]
    return make


def _engine(w, simd, n_slots, n_threads=1):
    from colibri_lab import _engine
    return _engine.Engine(_engine.Model(w.path), n_slots=n_slots, n_ctx=N_CTX, n_threads=n_threads,
                          simd=simd, n_batch=64, kv_f16=False)  # the reference keeps K, V exact


def _need_experts_api(e):
    assert hasattr(e, "route_trace") and "experts_unique" in e.last_step(), "binding lacks the experts API"


def run(e, prompts, max_tokens):
    """Submit all prompts, step until done; per request: tokens and logits rows; per step: stats."""
    ids = [e.submit(p, max_tokens=max_tokens, ignore_eos=True, return_logits=True) for p in prompts]
    toks = defaultdict(list)
    logits = defaultdict(list)
    steps = []
    for _ in range(500):
        if not e.pending:
            break
        for ev in e.step():
            if ev["type"] == "token":
                toks[ev["id"]].append(ev["token"])
                logits[ev["id"]].append(ev["logits"])
            assert ev["type"] != "error", ev
        steps.append(e.last_step())
    return [toks[i] for i in ids], [np.stack(logits[i]) for i in ids], steps


PROMPTS = [[5, 77, 200, 31, 9, 140, 250], [260, 12], [101, 102, 103, 104, 105, 106, 107, 108, 109, 110], [42]]


@pytest.mark.parametrize("arch,wtype", [("qwen3moe", "F32"), ("olmoe", "Q8_0"), ("qwen2moe", "Q4_0"), ("mixtral", "F16")])
def test_batched_equals_alone_bit_identical(moe_model, simd, arch, wtype):
    w = moe_model(arch=arch, wtype=wtype)
    batched_toks, batched_logits, _ = run(_engine(w, simd, len(PROMPTS)), PROMPTS, 6)
    for i, p in enumerate(PROMPTS):
        toks, logits, _ = run(_engine(w, simd, 1), [p], 6)
        assert toks[0] == batched_toks[i]
        assert np.array_equal(logits[0].view(np.uint32), batched_logits[i].view(np.uint32)), i


def test_threads_do_not_change_bits(moe_model, simd):
    w = moe_model(arch="qwen3moe", wtype="Q8_0")
    _, a, _ = run(_engine(w, simd, len(PROMPTS), n_threads=1), PROMPTS, 4)
    _, b, _ = run(_engine(w, simd, len(PROMPTS), n_threads=2), PROMPTS, 4)
    for x, y in zip(a, b):
        assert np.array_equal(x.view(np.uint32), y.view(np.uint32))


def _read_trace(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("arch", ["qwen3moe", "olmoe"])
def test_each_routed_expert_runs_once_per_step(moe_model, tmp_path, arch):
    w = moe_model(arch=arch, n_expert=8, n_expert_used=2)
    e = _engine(w, "scalar", len(PROMPTS))
    _need_experts_api(e)
    trace = tmp_path / "routes.csv"
    e.route_trace(str(trace))
    _, _, steps = run(e, PROMPTS, 5)
    e.route_trace(None)
    rows = _read_trace(trace)
    assert rows, "trace is empty"
    by_step = defaultdict(set)
    routed = Counter()
    for r in rows:
        by_step[int(r["step"])].add((int(r["layer"]), int(r["expert"])))
        routed[int(r["step"])] += 1
    n_layer, k = w.hparams["n_layer"], w.hparams["n_expert_used"]
    shared_seen = False
    for s in steps:
        n_rows = s["rows_decode"] + s["rows_prefill"]
        if n_rows == 0:
            continue
        assert s["experts_routed"] == n_rows * n_layer * k == routed[s["step"]]
        assert s["experts_unique"] == len(by_step[s["step"]]), s
        assert s["experts_unique"] <= n_layer * w.hparams["n_expert"]
        shared_seen |= s["experts_unique"] < s["experts_routed"]
    assert shared_seen, "no step had rows sharing an expert: the test would not show batch-union"
    # weights in the trace are probabilities (renormalised per row for qwen3moe)
    per_row = defaultdict(float)
    for r in rows:
        assert 0.0 < float(r["weight"]) <= 1.0
        per_row[(r["forward"], r["row"], r["layer"])] += float(r["weight"])
    if w.hparams["moe_norm_topk"]:
        assert all(abs(v - 1.0) < 1e-5 for v in per_row.values())
    else:
        assert all(v < 1.0 for v in per_row.values())


def test_expert_counts_match_trace(moe_model, tmp_path):
    w = moe_model(arch="qwen3moe")
    e = _engine(w, "scalar", len(PROMPTS))
    _need_experts_api(e)
    assert e.expert_counts().sum() == 0
    trace = tmp_path / "t.csv"
    e.route_trace(str(trace))
    run(e, PROMPTS, 3)
    counts = e.expert_counts()
    assert counts.shape == (w.hparams["n_layer"], w.hparams["n_expert"])
    want = np.zeros_like(counts)
    for r in _read_trace(trace):
        want[int(r["layer"]), int(r["expert"])] += 1
    assert np.array_equal(counts, want)
    assert (counts > 0).sum() > w.hparams["n_expert_used"]  # several experts got traffic


def test_route_trace_errors(moe_model, tmp_path):
    from colibri_lab.errors import ModelLoadError, UnsupportedModelError
    e = _engine(moe_model(arch="qwen3moe"), "scalar", 1)
    _need_experts_api(e)
    with pytest.raises((ModelLoadError, OSError)):
        e.route_trace(str(tmp_path / "no" / "such" / "dir" / "t.csv"))
    dense = _engine(moe_model(arch="qwen2"), "scalar", 1)
    with pytest.raises(UnsupportedModelError):
        dense.route_trace(str(tmp_path / "d.csv"))
    assert dense.expert_counts().shape == (2, 0)


@pytest.mark.parametrize("arch,wtype,kw", [
    ("qwen3moe", "Q8_0", {}), ("olmoe", "Q8_0", {}), ("qwen2moe", "Q8_0", {}),
    ("qwen3moe", "Q6_K", dict(n_embd=256, n_ff_exp=256, embd_type="Q8_0")),
    ("mixtral", "Q4_K", dict(n_embd=256, n_ff_exp=256, embd_type="Q8_0")),
])
def test_quantized_moe_matches_reference_while_routes_agree(moe_model, tmp_path, arch, wtype, kw):
    """Quantized experts vs the reference: compare the rows up to the first
    row whose routing (any layer) differs between engine and reference — a
    different expert set is a legitimate consequence of activation rounding
    near a routing tie, and changes all later rows through the KV."""
    # Default seed 0: with the residual-dominated tiny models (tinymodels
    # "Conditioning") routing agrees with the reference for >= 17 of 24 rows
    # in all five cases; seed 2, tuned for the unit-gain models, hits a
    # routing near-tie at row 2 for qwen3moe/Q6_K.
    w = moe_model(arch=arch, wtype=wtype, **kw)
    toks = prompt(24, w.hparams["n_vocab"])
    e = _engine(w, "scalar", 1)
    _need_experts_api(e)
    trace = tmp_path / "q.csv"
    e.route_trace(str(trace))
    eng = e.forward(0, toks, 0)
    e.route_trace(None)
    ref_m = LlamaRef.from_tiny(w)
    ref = ref_m.forward(toks, 0, ref_m.new_cache(N_CTX))
    eng_routes = defaultdict(list)
    for r in _read_trace(trace):
        eng_routes[(int(r["layer"]), int(r["row"]))].append(int(r["expert"]))
    n_ok = len(toks)
    for row in range(len(toks)):
        if any(sorted(eng_routes[(l, row)]) != sorted(ref_m.last_routes[(l, row)]) for l in range(w.hparams["n_layer"])):
            n_ok = row
            break
    assert n_ok >= 4, f"routing diverged at row {n_ok}"
    assert rel_err(eng[:n_ok], ref[:n_ok]) <= TOL_QUANT
    assert not argmax_mismatches(eng[:n_ok], ref[:n_ok], TIE_QUANT)
