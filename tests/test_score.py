"""Engine.score: teacher-forced log-probabilities computed in the batched prefill.

The reference for every scored position is the logits row the engine itself
produces for that prefix when it decodes it one token at a time: score()'s raw
logits must equal it bit for bit (batch invariance), its logprobs must be the
log-softmax of that row, its top1 the row's first argmax and its top list the
row's best ids, best first, lower id first on ties.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from colibri_lab import _engine
from colibri_lab.engine import Engine
from colibri_lab.errors import ContextLengthExceededError, InvalidRequestError

N_CTX = 256


def _ids(n, n_vocab, seed=0):
    return np.random.default_rng(seed).integers(0, n_vocab, n).tolist()


def _stepwise_logits(model_path, ids, **kw):
    """Logits after each prefix ids[:i+1], decoding one token per forward on a fresh engine."""
    core = _engine.Engine(_engine.Model(str(model_path)), n_slots=1, n_ctx=N_CTX, **kw)
    rows = [np.array(core.forward(0, [t], pos=i)[0], copy=True) for i, t in enumerate(ids)]
    core.close()
    return np.stack(rows)


def _log_softmax(rows):
    r = rows.astype(np.float64)
    m = r.max(axis=1, keepdims=True)
    return r - (m + np.log(np.exp(r - m).sum(axis=1, keepdims=True)))


def _ranked(row):
    """Ids by descending logit, ascending id on ties."""
    return np.lexsort((np.arange(len(row)), -row.astype(np.float64)))


@pytest.fixture(scope="module")
def tiny_q(tmp_path_factory):
    from tinymodels import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("score") / "tiny-q41.gguf", wtype="Q4_1", n_layer=2)


@pytest.fixture(scope="module")
def eng(tiny_q):
    e = Engine(str(tiny_q.path), n_threads=2, n_ctx=N_CTX)
    yield e
    e.close()


@pytest.mark.parametrize("n", [2, 31, 33, 100])  # one row; around the 32 logits rows of a step; several steps
def test_score_equals_log_softmax_of_stepwise_decode(eng, tiny_q, n):
    n_vocab = eng.info["n_vocab"]
    ids = _ids(n, n_vocab, seed=n)
    sc = eng.score(ids, top=5, logits=True)
    ref = _stepwise_logits(tiny_q.path, ids, n_threads=1)[:-1]
    assert sc.ids == ids and sc.n == n - 1
    assert sc.logits.shape == (n - 1, n_vocab) and np.array_equal(sc.logits, ref), "rows differ from decode"
    lsm = _log_softmax(ref)
    want = lsm[np.arange(n - 1), ids[1:]]
    assert sc.logprobs.dtype == np.float32 and sc.logprobs.shape == (n - 1,)
    np.testing.assert_allclose(sc.logprobs, want, rtol=0, atol=2e-6)
    assert np.array_equal(sc.top1, ref.argmax(axis=1))
    for i in range(n - 1):
        best = _ranked(ref[i])[:5]
        assert sc.top_ids[i].tolist() == best.tolist()
        np.testing.assert_allclose(sc.top_logprobs[i], lsm[i, best], rtol=0, atol=2e-6)
        assert sc.top[i] == [(int(t), float(lp)) for t, lp in zip(sc.top_ids[i], sc.top_logprobs[i])]
    assert math.isclose(sc.perplexity, math.exp(-np.mean(want)), rel_tol=1e-5)
    assert sc.metrics["prompt_tokens"] == n and sc.metrics["completion_tokens"] == 0


def test_score_rows_match_a_generate_of_each_prefix(eng):
    """The row for position i is the row a normal request ending at i samples from."""
    ids = _ids(40, eng.info["n_vocab"], seed=3)
    sc = eng.score(ids, logits=True)
    for i in (0, 7, 31, 32, 38):
        _, h, _ = eng.submit(ids[:i + 1], max_tokens=1, return_logits=True)
        tok = next(ev for ev in h if ev["type"] == "token")
        assert np.array_equal(tok["logits"], sc.logits[i]), i
        h.result()


def test_score_alongside_other_requests_is_bit_identical(tiny_q):
    """Scoring in a step shared with decodes and other prefills changes nothing."""
    with Engine(str(tiny_q.path), n_threads=2, n_ctx=N_CTX, n_slots=4) as e:
        n_vocab = e.info["n_vocab"]
        ids = _ids(90, n_vocab, seed=11)
        alone = e.score(ids, top=3, logits=True)
        others = [e.submit(_ids(20 + 5 * k, n_vocab, seed=50 + k), max_tokens=30, ignore_eos=True)[1]
                  for k in range(3)]
        mixed = e.score(ids, top=3, logits=True)
        for h in others:
            h.result()
        assert np.array_equal(alone.logits, mixed.logits)
        assert np.array_equal(alone.logprobs, mixed.logprobs) and np.array_equal(alone.top_ids, mixed.top_ids)
        assert mixed.metrics["cached_tokens"] == 0  # a scoring request computes every position


def test_a_long_score_leaves_room_for_another_prompts_last_row(tiny_q):
    """The rows with logits in a step are bounded (32 here); a scoring request
    takes what is left but one row per later prefill, so a short request
    admitted with it gets its first token in the same step."""
    core = _engine.Engine(_engine.Model(str(tiny_q.path)), n_slots=2, n_ctx=N_CTX, n_threads=1)
    s = core.submit(_ids(150, 288, seed=1), max_tokens=0, score=True)
    g = core.submit(_ids(6, 288, seed=2), max_tokens=1)
    first = core.step()
    assert [ev["type"] for ev in first if ev["id"] == g][:1] == ["token"]
    scored = [ev for ev in first if ev["id"] == s and ev["type"] == "score"]
    assert len(scored) == 1 and scored[0]["pos"] == 0 and len(scored[0]["logprob"]) == 31
    n = len(scored[0]["logprob"])
    while core.pending:
        for ev in core.step():
            if ev["type"] == "score":
                assert ev["pos"] == n
                n += len(ev["logprob"])
    assert n == 149
    core.close()


def test_score_chunking_and_threads_do_not_change_results(tiny_q):
    ids = _ids(120, 288, seed=5)
    outs = []
    for kw in ({"n_threads": 1}, {"n_threads": 2, "n_chunk": 7}, {"n_threads": 3, "n_batch": 16}):
        with Engine(str(tiny_q.path), n_ctx=N_CTX, **kw) as e:
            outs.append(e.score(ids, top=4))
    for o in outs[1:]:
        assert np.array_equal(o.logprobs, outs[0].logprobs)
        assert np.array_equal(o.top_ids, outs[0].top_ids) and np.array_equal(o.top_logprobs, outs[0].top_logprobs)


def test_score_then_generate_continues_like_a_plain_request(eng):
    """The C request flag: scoring does not disturb the generation that follows it."""
    ids = _ids(45, eng.info["n_vocab"], seed=8)
    plain = eng.generate(ids, max_tokens=6, ignore_eos=True)
    h = eng.scheduler.submit(ids, max_tokens=6, ignore_eos=True, score=True, n_logprobs=2)
    res = h.result()
    assert res["tokens"] == plain.tokens
    assert sum(len(ev["logprob"]) for ev in res["scores"]) == len(ids) - 1
    assert [ev["pos"] for ev in res["scores"]] == sorted(ev["pos"] for ev in res["scores"])


def test_score_bad_input(eng):
    with pytest.raises(InvalidRequestError, match="at least 2 tokens"):
        eng.score([5])
    with pytest.raises(InvalidRequestError, match="empty"):
        eng.score([])
    for bad in (-1, 21, 2.5, True, "3", None):
        with pytest.raises(InvalidRequestError, match="top must be"):
            eng.score([1, 2, 3], top=bad)
    with pytest.raises(InvalidRequestError, match="out of range"):
        eng.score([1, eng.info["n_vocab"]])
    with pytest.raises(ContextLengthExceededError):
        eng.score(_ids(N_CTX + 1, eng.info["n_vocab"]))
    # the C API refuses a one-token scoring request itself
    with pytest.raises(InvalidRequestError, match="at least 2 prompt tokens"):
        eng.scheduler.call(lambda core: core.submit([3], max_tokens=0, score=True))
    assert eng.score([1, 2], top=20).top_ids.shape == (1, 20)  # the engine still serves


@pytest.mark.smollm2
def test_score_text_and_ids_agree_on_smollm2(smollm2_path):
    text = "def add(a, b):\n    return a + b\n\nThe function adds two numbers."
    with Engine(smollm2_path, n_threads=2, n_ctx=512) as e:
        by_text = e.score(text, top=3)
        ids = e.tokenize(text)
        by_ids = e.score(ids, top=3)
        assert by_text.ids == ids
        assert np.array_equal(by_text.logprobs, by_ids.logprobs) and np.array_equal(by_text.top_ids, by_ids.top_ids)
        assert 1.0 < by_text.perplexity < 1000.0
        # teacher forcing: where the model's top-1 was the next token, its logprob is the best one
        hit = by_ids.top1 == np.asarray(ids[1:])
        assert hit.any()
        assert np.array_equal(by_ids.top_logprobs[hit, 0], by_ids.logprobs[hit])
        with pytest.raises(InvalidRequestError):
            e.score("", top=1)  # SmolLM2 adds no BOS: "" is no tokens at all


@pytest.mark.smollm2
def test_cli_score_prints_the_engines_perplexity(smollm2_path, tmp_path, capsys):
    from colibri_lab import cli

    f = tmp_path / "t.txt"
    f.write_text("for i in range(10):\n    print(i * i)\n\nSquares of the first ten numbers.\n")
    assert cli.main(["score", str(f), "--model", smollm2_path, "--threads", "1", "--json", "--top", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    with Engine(smollm2_path, n_threads=1) as e:
        sc = e.score(e.tokenize(f.read_text(), parse_special=False), top=2)
    assert out["tokens"] == len(sc.ids) and out["scored"] == sc.n
    assert out["perplexity"] == sc.perplexity and out["logprobs"] == sc.logprobs.tolist()
    assert out["top"] == [[list(p) for p in row] for row in sc.top]
    assert out["tok_s"] > 0
    assert cli.main(["score", str(tmp_path / "missing.txt"), "--model", smollm2_path]) == 2
    assert "cannot read" in capsys.readouterr().err
