"""Continuous batching over KV slots (issue 3): batch invariance through the
step loop, prefix reuse, cancel / context overflow isolation, and many
concurrent callers through the scheduler."""
from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from colibri_lab import _engine
from colibri_lab.scheduler import Scheduler

RNG = np.random.default_rng(1234)


def _prompts(n, n_vocab, lo=3, hi=40, seed=0):
    r = np.random.default_rng(seed)
    return [r.integers(0, n_vocab, size=int(r.integers(lo, hi))).tolist() for _ in range(n)]


def run_requests(core, reqs, cancel_after=None):
    """Submit (prompt, kwargs) pairs, step until all finish; returns per request
    {"tokens", "logits", "metrics", "error"} in submission order.  cancel_after
    maps request index -> number of steps after which to cancel it."""
    ids = [core.submit(p, return_logits=True, **kw) for p, kw in reqs]
    out = {rid: {"tokens": [], "logits": [], "metrics": None, "error": None} for rid in ids}
    steps = 0
    while core.pending:
        for ev in core.step():
            o = out[ev["id"]]
            if ev["type"] == "token":
                o["tokens"].append(ev["token"])
                o["logits"].append(ev["logits"])
            elif ev["type"] == "done":
                o["metrics"] = ev["metrics"]
            else:
                o["error"] = ev["message"]
        steps += 1
        for i, n in (cancel_after or {}).items():
            if steps == n:
                core.cancel(ids[i])
        assert steps < 10_000
    return [out[rid] for rid in ids]


@pytest.fixture
def tiny(make_tiny):
    return make_tiny(wtype="Q4_1", n_layer=2)


@pytest.fixture
def model(tiny):
    return _engine.Model(str(tiny.path))


def test_alone_vs_mixed_batches_bit_identical(model, simd):
    n_vocab = model.n_vocab
    target = _prompts(1, n_vocab, 20, 21, seed=7)[0]
    alone_core = _engine.Engine(model, n_slots=16, n_ctx=128, n_threads=1, simd=simd)
    alone = run_requests(alone_core, [(target, dict(max_tokens=12))])[0]
    assert len(alone["tokens"]) == 12
    for n_other, chunk, threads in [(1, 0, 1), (3, 5, 2), (7, 1, 2), (15, 7, 1)]:
        core = _engine.Engine(model, n_slots=16, n_ctx=128, n_threads=threads, n_chunk=chunk, simd=simd)
        others = [(p, dict(max_tokens=int(RNG.integers(1, 16)))) for p in _prompts(n_other, n_vocab, seed=n_other)]
        # the target runs on a different slot each time, in the middle of the batch
        mid = len(others) // 2
        reqs = others[:mid] + [(target, dict(max_tokens=12, slot=n_other))] + others[mid:]
        res = run_requests(core, reqs)
        mixed = res[mid]
        assert mixed["tokens"] == alone["tokens"], (n_other, chunk)
        for a, b in zip(alone["logits"], mixed["logits"]):
            assert np.array_equal(a, b), f"logits differ with {n_other} other sequences, chunk {chunk}"
        assert all(r["error"] is None for r in res)


def test_step_logits_equal_direct_forward(model):
    core = _engine.Engine(model, n_slots=2, n_ctx=64, n_threads=1, simd="scalar")
    prompt = _prompts(1, model.n_vocab, 9, 10, seed=3)[0]
    res = run_requests(core, [(prompt, dict(max_tokens=4))])[0]
    seq = prompt + res["tokens"]
    direct = core.forward(1, seq[:-1], 0)
    for i, lg in enumerate(res["logits"]):
        assert np.array_equal(lg, direct[len(prompt) - 1 + i])


def test_prefix_reuse_matches_cold_prefill(model):
    n_vocab = model.n_vocab
    first, second = _prompts(2, n_vocab, 30, 31, seed=11)
    second = first[:22] + second[:8]
    warm = _engine.Engine(model, n_slots=1, n_ctx=128, n_threads=1)
    r1 = run_requests(warm, [(first, dict(max_tokens=5))])[0]
    assert r1["metrics"]["cached_tokens"] == 0
    r2 = run_requests(warm, [(second, dict(max_tokens=6))])[0]
    assert r2["metrics"]["cached_tokens"] == 22
    cold = _engine.Engine(model, n_slots=1, n_ctx=128, n_threads=1, prefix_reuse=False)
    run_requests(cold, [(first, dict(max_tokens=5))])
    c2 = run_requests(cold, [(second, dict(max_tokens=6))])[0]
    assert c2["metrics"]["cached_tokens"] == 0
    assert r2["tokens"] == c2["tokens"]
    for a, b in zip(r2["logits"], c2["logits"]):
        assert np.array_equal(a, b)
    # the same prompt again: all but the last token come from the cache
    r3 = run_requests(warm, [(second, dict(max_tokens=6))])[0]
    assert r3["metrics"]["cached_tokens"] == len(second) - 1
    assert r3["tokens"] == r2["tokens"]


def test_any_slot_picks_longest_prefix_and_copy_prefix(model):
    n_vocab = model.n_vocab
    a, b = _prompts(2, n_vocab, 25, 26, seed=5)
    core = _engine.Engine(model, n_slots=3, n_ctx=128, n_threads=1)
    run_requests(core, [(a, dict(max_tokens=2, slot=0)), (b, dict(max_tokens=2, slot=1))])
    follow = b[:20] + a[:3]
    r = run_requests(core, [(follow, dict(max_tokens=3))])[0]
    assert r["metrics"]["slot"] == 1 and r["metrics"]["cached_tokens"] == 20
    # pinned to the empty slot 2, but allowed to copy the prefix from slot 0
    follow_a = a[:18] + b[:4]
    r2 = run_requests(core, [(follow_a, dict(max_tokens=3, slot=2, copy_prefix=True))])[0]
    assert r2["metrics"]["slot"] == 2 and r2["metrics"]["cached_tokens"] == 18
    cold = _engine.Engine(model, n_slots=1, n_ctx=128, n_threads=1, prefix_reuse=False)
    c = run_requests(cold, [(follow_a, dict(max_tokens=3))])[0]
    assert c["tokens"] == r2["tokens"]
    assert all(np.array_equal(x, y) for x, y in zip(c["logits"], r2["logits"]))


def test_cancel_and_context_overflow_leave_others_unchanged(model):
    n_vocab = model.n_vocab
    p1, p2, p3 = _prompts(3, n_vocab, 10, 20, seed=21)
    alone = _engine.Engine(model, n_slots=4, n_ctx=64, n_threads=1)
    ref1 = run_requests(alone, [(p1, dict(max_tokens=20))])[0]
    ref3 = run_requests(alone, [(p3, dict(max_tokens=20))])[0]
    core = _engine.Engine(model, n_slots=4, n_ctx=64, n_threads=1)
    too_long = list(range(1, 60))
    res = run_requests(core, [(p1, dict(max_tokens=20)), (p2, dict(max_tokens=30)),
                              (too_long, dict(max_tokens=10)), (p3, dict(max_tokens=20))],
                       cancel_after={1: 3})
    assert res[0]["tokens"] == ref1["tokens"] and res[3]["tokens"] == ref3["tokens"]
    assert res[1]["metrics"]["finish_reason"] == "cancelled"
    assert len(res[1]["tokens"]) < 30
    assert res[2]["error"] is not None and "context_length_exceeded" in res[2]["error"]
    for s in range(4):
        assert not core.slot_info(s)["busy"]


def test_bad_request_parameters_are_refused(model):
    core = _engine.Engine(model, n_slots=1, n_ctx=32, n_threads=1)
    from colibri_lab.errors import InvalidRequestError
    with pytest.raises(InvalidRequestError, match="out of range"):
        core.submit([model.n_vocab + 5])
    with pytest.raises(InvalidRequestError, match="top_p"):
        core.submit([1, 2], top_p=0.0)
    with pytest.raises(InvalidRequestError, match="slot"):
        core.submit([1, 2], slot=3)
    with pytest.raises(InvalidRequestError, match="temperature"):
        core.submit([1, 2], temperature=float("nan"))
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        core.submit([1, 2], logit_bias={10**6: 1.0})
    # the engine still works afterwards
    assert len(run_requests(core, [([1, 2, 3], dict(max_tokens=3, ignore_eos=True))])[0]["tokens"]) == 3


def test_32_concurrent_callers_get_complete_correct_outputs(model):
    n_vocab = model.n_vocab
    prompts = _prompts(32, n_vocab, 4, 24, seed=99)
    ref_core = _engine.Engine(model, n_slots=1, n_ctx=96, n_threads=1)
    refs = [run_requests(ref_core, [(p, dict(max_tokens=10, ignore_eos=True))])[0]["tokens"] for p in prompts]
    core = _engine.Engine(model, n_slots=8, n_ctx=96, n_threads=2)
    sched = Scheduler(core, max_queue=64)
    results = [None] * 32

    def worker(i):
        h = sched.submit(prompts[i], max_tokens=10, ignore_eos=True)
        results[i] = h.result(timeout=120)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sched.close()
    for i in range(32):
        assert results[i]["tokens"] == refs[i], i
        assert results[i]["metrics"]["completion_tokens"] == 10
        assert results[i]["metrics"]["queue_ms"] >= 0


@pytest.mark.parametrize("threads", [1, 2])
def test_greedy_token_is_the_first_maximum_of_its_logits(model, simd, threads):
    """The LM head takes each greedy row's argmax as it writes the logits
    (per thread, then combined): the token must be the first index of the
    row's maximum, as np.argmax gives, at any batch size."""
    core = _engine.Engine(model, n_slots=8, n_ctx=96, n_threads=threads, simd=simd)
    res = run_requests(core, [(p, dict(max_tokens=6, ignore_eos=True))
                              for p in _prompts(8, model.n_vocab, 3, 12, seed=5)])
    n = 0
    for r in res:
        assert r["error"] is None and len(r["tokens"]) == 6
        for tok, logits in zip(r["tokens"], r["logits"]):
            assert tok == int(np.argmax(logits))
            n += 1
    assert n == 48


def test_scheduler_queue_full_is_a_clear_error(model):
    from colibri_lab.errors import QueueFullError
    core = _engine.Engine(model, n_slots=1, n_ctx=64, n_threads=1)
    sched = Scheduler(core, max_queue=2)
    handles = []
    with pytest.raises(QueueFullError, match="queue full"):
        for _ in range(50):
            handles.append(sched.submit([1, 2, 3], max_tokens=40, ignore_eos=True))
    for h in handles:
        h.result(timeout=60)
    sched.close()


def test_step_profile_is_consistent(model):
    """Per-phase profile (issue 9): matmul by weight type adds up to matmul_ms;
    norms and RoPE are parts of other_ms; phases never exceed the step."""
    core = _engine.Engine(model, n_slots=2, n_ctx=64, n_threads=2)
    core.submit(list(range(1, 30)), max_tokens=4, ignore_eos=True)
    core.submit([5, 6, 7], max_tokens=4, ignore_eos=True)
    seen = 0
    while core.pending:
        core.step()
        s = core.last_step()
        if s["rows_decode"] + s["rows_prefill"] == 0:
            continue
        seen += 1
        by_type = core.last_step_matmul_by_type()
        assert set(by_type) == {"q4_1"} and abs(sum(by_type.values()) - s["matmul_ms"]) < 1e-6
        assert 0 < s["norm_ms"] and 0 < s["rope_ms"] and s["norm_ms"] + s["rope_ms"] <= s["other_ms"] + 1e-6
        assert s["sync_ms"] >= 0
        parts = s["matmul_ms"] + s["attention_ms"] + s["lm_head_ms"] + s["sampling_ms"] + s["other_ms"]
        assert parts <= s["step_ms"] + 1e-6
    assert seen >= 4


def _prompt_rows_by_step(core, ids, left):
    """Step until every request in `ids` has a token; returns (rows_decode, rows_prefill, prompt rows
    left before the step, prompts of `ids` still prefilling before it) per step, and each request's
    first logits."""
    steps, logits = [], {i: [] for i in ids}
    while any(not logits[i] for i in ids):
        before = sum(left.values())
        waiting = sum(v > 0 for v in left.values())
        for ev in core.step():
            if ev["type"] == "token" and ev["id"] in logits:
                logits[ev["id"]].append(ev["logits"])
        st = core.last_step()
        steps.append((st["rows_decode"], st["rows_prefill"], before, waiting))
        take = st["rows_prefill"]
        for i in ids:   # prompts are served in admission order
            got = min(take, left[i])
            left[i] -= got
            take -= got
    return steps, logits


def _budget(n_chunk, d, waiting, before):
    """The prompt rows of a step with d streams decoding (no drafts) and `waiting` prompts: the rest
    of n_chunk, at least a quarter of it, times the prompts per stream when prompts outnumber them."""
    share = waiting / d if waiting > d else 1
    return min(before, math.ceil(max(n_chunk - d, -(-n_chunk // 4)) * share))


def test_n_chunk_is_the_row_budget_of_steps_with_decoding(model):
    """n_chunk is the rows of a step in which requests decode: the decode rows count first and the
    prompts, all together, take the rest (at least n_chunk / 4, rounded up), times the prompts per
    decoding stream while prompts outnumber the streams; a step with nothing decoding prefills at
    full width.  The logits stay those of a lone run (batch invariance)."""
    n_vocab = model.n_vocab
    first, a, b = _prompts(3, n_vocab, 20, 21, seed=21)
    core = _engine.Engine(model, n_slots=4, n_ctx=128, n_threads=1, n_chunk=5, prompt_slack=-1)
    core.submit(first, max_tokens=40, ignore_eos=True)
    core.step()
    assert core.last_step()["rows_prefill"] == 20          # nothing decoded yet: the whole prompt in one step
    core.step()
    assert core.last_step()["rows_decode"] == 1
    ids = [core.submit(p, max_tokens=3, ignore_eos=True, return_logits=True) for p in (a, b)]
    left = {i: 20 for i in ids}
    steps, logits = _prompt_rows_by_step(core, ids, left)
    for d, p, before, waiting in steps:
        assert d >= 1
        assert p == _budget(5, d, waiting, before), steps   # 5 rows in all, decode rows first
    # one stream, two prompts: 2 x 4 prompt rows a step until a has its token; then two streams
    # decode beside b, 3 prompt rows a step
    assert [(d, p) for d, p, _, _ in steps[:4]] == [(1, 8), (1, 8), (1, 8), (2, 3)], steps
    assert sum(p for _, p, _, _ in steps) == 40
    alone = _engine.Engine(model, n_slots=1, n_ctx=128, n_threads=1)
    for i, p in zip(ids, (a, b)):
        ref = run_requests(alone, [(p, dict(max_tokens=2, ignore_eos=True))])[0]
        assert np.array_equal(ref["logits"][0], logits[i][0])


def test_prompts_that_outnumber_the_streams_take_a_budget_per_stream(model):
    """Seven prompts that arrive just after a lone stream (a closed loop starting up) share 7 x the
    budget beside it, not the stream's budget between them; once prompts no longer outnumber the
    streams the budget is n_chunk's again."""
    n_vocab = model.n_vocab
    first, *rest = _prompts(8, n_vocab, 12, 13, seed=8)
    core = _engine.Engine(model, n_slots=8, n_ctx=128, n_threads=1, n_chunk=5, prompt_slack=-1)
    core.submit(first, max_tokens=40, ignore_eos=True)
    core.step()
    ids = [core.submit(p, max_tokens=2, ignore_eos=True, return_logits=True) for p in rest]
    steps, _ = _prompt_rows_by_step(core, ids, {i: 12 for i in ids})
    assert steps[0] == (1, 28, 84, 7), steps           # 4 rows a stream's share, 7 prompts per stream
    for d, p, before, waiting in steps:
        assert p == _budget(5, d, waiting, before), steps
    assert len(steps) <= 84 // 4 // 2, steps           # one share: 84 / 4 = 21 steps


def test_prompts_progress_when_the_decode_rows_fill_the_budget(model):
    """With as many streams decoding as n_chunk, a prompt still gets a quarter of the budget a step."""
    n_vocab = model.n_vocab
    ps = _prompts(5, n_vocab, 12, 13, seed=5)
    core = _engine.Engine(model, n_slots=5, n_ctx=128, n_threads=1, n_chunk=4, prompt_slack=-1)
    for p in ps[:4]:
        core.submit(p, max_tokens=40, ignore_eos=True)
    core.step()
    assert core.last_step()["rows_prefill"] == 48        # nothing decodes: every prompt at once
    rid = core.submit(ps[4], max_tokens=1, ignore_eos=True, return_logits=True)
    steps, logits = _prompt_rows_by_step(core, [rid], {rid: 12})
    assert [(d, p) for d, p, _, _ in steps] == [(4, 1)] * 12  # 4 decode rows fill the budget: 1 prompt row a step
    ref = run_requests(_engine.Engine(model, n_slots=1, n_ctx=128, n_threads=1),
                       [(ps[4], dict(max_tokens=1, ignore_eos=True))])[0]
    assert np.array_equal(ref["logits"][0], logits[rid][0])


def _two_prompts_beside_a_stream(model, **kw):
    n_vocab = model.n_vocab
    first, a, b = _prompts(3, n_vocab, 20, 21, seed=21)
    core = _engine.Engine(model, n_slots=4, n_ctx=128, n_threads=1, n_chunk=5, **kw)
    core.submit(first, max_tokens=60, ignore_eos=True)
    for _ in range(12):   # the stream decodes: steps of 1 row measured, and the prefill's
        core.step()
    ids = [core.submit(p, max_tokens=3, ignore_eos=True, return_logits=True) for p in (a, b)]
    steps, logits = _prompt_rows_by_step(core, ids, {i: 20 for i in ids})
    return steps, [logits[i][0] for i in ids], (a, b)


@pytest.mark.parametrize("slack", [-1.0, 1000.0])
def test_prompt_slack_off_or_wide_keeps_the_n_chunk_budget(model, slack):
    """prompt_slack < 0 is off, and a slack every step fits in cuts nothing: the n_chunk budget exactly."""
    steps, _, _ = _two_prompts_beside_a_stream(model, prompt_slack=slack)
    for d, p, before, waiting in steps:
        assert p == _budget(5, d, waiting, before), steps


@pytest.mark.parametrize("slack", [0.0, 0.25])
def test_prompt_slack_cuts_within_the_budget_and_keeps_the_logits(model, slack):
    """With the slack on, the prompt rows beside decode rows follow the measured step times: never more
    than the n_chunk budget, at least one a step (prompts progress), and the first logits are those of a
    lone run (batch invariance holds whatever the composition)."""
    steps, first_logits, prompts = _two_prompts_beside_a_stream(model, prompt_slack=slack)
    for d, p, before, waiting in steps:
        assert d >= 1
        assert 1 <= p <= _budget(5, d, waiting, before), steps
    assert sum(p for _, p, _, _ in steps) == 40
    alone = _engine.Engine(model, n_slots=1, n_ctx=128, n_threads=1)
    for got, prompt in zip(first_logits, prompts):
        ref = run_requests(alone, [(prompt, dict(max_tokens=2, ignore_eos=True))])[0]
        assert np.array_equal(ref["logits"][0], got)


def test_prompt_slack_default_and_bounds(model):
    core = _engine.Engine(model, n_slots=1, n_ctx=64, n_threads=1)
    assert core.params["prompt_slack"] == pytest.approx(0.25)
    assert _engine.Engine(model, n_slots=1, n_ctx=64, n_threads=1, prompt_slack=-1).params["prompt_slack"] == -1
    for bad in (float("nan"), 2000.0):
        with pytest.raises(Exception, match="prompt_slack"):
            _engine.Engine(model, n_slots=1, n_ctx=64, n_threads=1, prompt_slack=bad)


def test_n_chunk_default_is_three_rows_per_thread(model):
    """The default step budget (n_chunk=0) is 3 rows per thread, within n_batch."""
    for kw, want in (({"n_threads": 1}, 3), ({"n_threads": 2}, 6), ({"n_threads": 4, "n_batch": 10}, 10),
                     ({"n_threads": 2, "n_chunk": 3}, 3), ({"n_threads": 1, "n_chunk": 900}, 512)):
        core = _engine.Engine(model, n_slots=2, n_ctx=64, **kw)
        assert core.params["n_chunk"] == want, kw
        core.close()
