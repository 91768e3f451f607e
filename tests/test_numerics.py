"""Numerics A/B in the experiments API: KL divergence, top-1 agreement and
perplexity of variants against the baseline (experiments.numerics), checked
against an independent computation from Engine.score's logits rows."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from colibri_lab.engine import Engine
from colibri_lab.experiments import (
    ExperimentSpec, Variant, compare_sequence, load_results, numerics_table, run, spec_from_dict, summary_table,
)

MINI = {"name": "mini", "systems": {"s": "You are a tiny test model. Answer briefly."},
        "items": [{"id": f"p{i}", "group": "g", "system_ref": "s", "turns": [f"Question number {i}?"]}
                  for i in range(3)]}


def _engine(path, **kw):
    return Engine(str(path), n_ctx=256, **{"n_threads": 1, **kw})


def _reference(a: Engine, b: Engine, ids):
    """KL(a || b), top-1 agreement and b's perplexity from score()'s raw logits, in float64."""
    la, lb = a.score(ids, logits=True).logits.astype(np.float64), b.score(ids, logits=True).logits.astype(np.float64)

    def lsm(r):
        m = r.max(axis=1, keepdims=True)
        return r - (m + np.log(np.exp(r - m).sum(axis=1, keepdims=True)))

    pa, pb = lsm(la), lsm(lb)
    kl = (np.exp(pa) * (pa - pb)).sum(axis=1)
    nll = -pb[np.arange(len(ids) - 1), ids[1:]]
    return kl, float(np.mean(la.argmax(1) == lb.argmax(1))), math.exp(nll.mean())


def test_compare_sequence_matches_an_independent_computation(make_tiny):
    t0, t1 = make_tiny(), make_tiny(seed=1)  # two random models over one vocabulary
    ids = np.random.default_rng(4).integers(0, 288, 75).tolist()  # 75 positions: 3 lockstep chunks
    base, f16, other = _engine(t0.path, kv_f16=False), _engine(t0.path, kv_f16=True), _engine(t1.path)
    same = _engine(t0.path, kv_f16=False, n_threads=2)
    try:
        got = compare_sequence({"base": base, "f16": f16, "other": other, "same": same}, "base", ids)
        assert got["base"]["kl_mean"] == 0 and got["base"]["top1_agree"] == 1
        assert got["same"]["kl_max"] == 0 and got["same"]["top1_agree"] == 1  # threads change no bit
        for name, eng in (("f16", f16), ("other", other)):
            kl, agree, ppl = _reference(base, eng, ids)
            g = got[name]
            assert g["n_scored"] == 74
            assert math.isclose(g["kl_mean"], kl.mean(), rel_tol=1e-9, abs_tol=1e-15)
            assert math.isclose(g["kl_max"], kl.max(), rel_tol=1e-9, abs_tol=1e-15)
            assert g["top1_agree"] == agree and math.isclose(g["perplexity"], ppl, rel_tol=1e-9)
            assert math.isclose(g["perplexity"], eng.score(ids).perplexity, rel_tol=1e-5)
        assert got["f16"]["kl_mean"] > 0 and got["other"]["kl_mean"] > 100 * got["f16"]["kl_mean"]
        with pytest.raises(ValueError):
            compare_sequence({"base": base}, "base", ids[:1])
    finally:
        for e in (base, f16, other, same):
            e.close()


def _spec(t0, t1, **kw):
    d = dict(name="num", workload=MINI, repeats=2, warmup=0, seed=1, numerics=True,
             engine={"model": str(t0.path), "n_threads": 1, "n_ctx": 256, "simd": "scalar"},
             request={"max_tokens": 5}, baseline="f32",
             variants=[Variant("f32", engine={"kv_f16": False}), Variant("f32-2threads", engine={"kv_f16": False, "n_threads": 2}),
                       Variant("f16", engine={"kv_f16": True}), Variant("other", engine={"model": str(t1.path)})])
    d.update(kw)
    return ExperimentSpec(**d)


def test_runner_numerics_pass_table_and_verdicts(make_tiny, tmp_path):
    t0, t1 = make_tiny(), make_tiny(seed=1)
    res = run(_spec(t0, t1), progress=False)
    num = res.numerics
    assert len(num) == 4 * 3 and set(num["variant"]) == {"f32", "f32-2threads", "f16", "other"}
    base = num[num["variant"] == "f32"]
    assert (base["kl_mean"] == 0).all() and (base["top1_agree"] == 1).all()
    # the scored sequence is the prompt plus the baseline's first-repeat reply
    req = res.requests
    for r in base.itertuples():
        row = req[(req["variant"] == "f32") & (req["repeat"] == 0) & (req["prompt_id"] == r.prompt_id)].iloc[0]
        assert r.prompt_tokens == row["prompt_tokens"] and r.reply_tokens == row["completion_tokens"]
        assert r.n_scored == r.prompt_tokens + r.reply_tokens - 1
    tab = numerics_table(res)
    assert tab.loc["f32", "numerics"] == "baseline"
    assert tab.loc["f32-2threads", "numerics"] == "identical" and tab.loc["f32-2threads", "KL mean"] == 0
    assert tab.loc["other", "numerics"] == "differs"
    assert tab.loc["f16", "KL mean"] > 0 and tab.loc["f16", "numerics"] in ("equivalent", "differs")
    assert tab.loc["other", "ppl verdict"] in ("win", "loss")  # a different model: a clear perplexity change
    assert tab.loc["f32", "tokens"] == int(base["n_scored"].sum())
    s = summary_table(res)
    assert list(s.loc[["f32-2threads", "other"], "numerics"]) == ["identical", "differs"]
    back = load_results(res.save(root=tmp_path))
    pd.testing.assert_frame_equal(res.numerics, back.numerics)
    assert numerics_table(back).equals(tab)


def test_numerics_off_by_default_and_vocab_checked(make_tiny):
    t0 = make_tiny()
    res = run(_spec(t0, t0, numerics=False, repeats=1, variants=[Variant("f32"), Variant("x", engine={"kv_f16": True})],
                    baseline=None), progress=False)
    assert len(res.numerics) == 0 and numerics_table(res).empty
    small_vocab = make_tiny(n_vocab=320)
    with pytest.raises(ValueError, match="one vocabulary"):
        run(_spec(t0, small_vocab, repeats=1, variants=[Variant("f32"), Variant("v", engine={"model": str(small_vocab.path)})],
                  baseline=None), progress=False)
    assert spec_from_dict({"name": "n", "numerics": True, "variants": [{"name": "a"}]}).numerics is True


def test_numerics_verdict_thresholds():
    """equivalent: perplexity ratio's interval within 1 +- 1% and agreement's interval above 97%."""
    def frame(ppl_b, agree_b):
        rows = []
        for i, (p, a) in enumerate(zip(ppl_b, agree_b)):
            base_ppl = 10.0 + i
            rows.append(dict(variant="a", prompt_id=f"p{i}", n_scored=100, perplexity=base_ppl, kl_mean=0.0,
                             kl_max=0.0, top1_agree=1.0))
            rows.append(dict(variant="b", prompt_id=f"p{i}", n_scored=100, perplexity=base_ppl * p, kl_mean=1e-4,
                             kl_max=1e-3, top1_agree=a))
        return pd.DataFrame(rows)

    near = numerics_table(frame([1.001, 0.999, 1.002, 1.0, 1.001], [0.99, 0.98, 1.0, 0.99, 0.99]))
    assert near.loc["b", "numerics"] == "equivalent"
    far = numerics_table(frame([1.03, 1.04, 1.05, 1.03, 1.04], [0.99, 0.98, 1.0, 0.99, 0.99]))
    assert far.loc["b", "numerics"] == "differs" and far.loc["b", "ppl verdict"] == "loss"
    flips = numerics_table(frame([1.001, 0.999, 1.002, 1.0, 1.001], [0.9, 0.92, 0.95, 0.9, 0.93]))
    assert flips.loc["b", "numerics"] == "differs"
    assert math.isclose(near.loc["b", "top-1 agree"], 0.99) and near.loc["a", "numerics"] == "baseline"
