"""Batch invariance of the raw forward (docs/architecture.md, invariant 1).

A sequence's logits must be bit-identical whatever else the engine does:
which slot holds it, how its prefill is chunked, how many threads compute it,
what other slots contain, and whether its KV was rewound and recomputed.
All comparisons are np.array_equal on float32 — no tolerance.

(The step()/scheduler path — a sequence inside a batch of 8, inside a
speculative verify — is tested separately once that path exists.)
"""
from __future__ import annotations

import numpy as np
import pytest

N_CTX = 256
# Weight types whose kernels differ most: float, 8-bit, 4-bit with min.
WTYPES = ("F32", "Q8_0", "Q4_1")


def prompt(n: int, n_vocab: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(20_000 + 31 * n + seed).integers(0, n_vocab, n).tolist()


def make_engine(path, simd, n_threads=1, n_slots=2):
    from colibri_lab import _engine
    return _engine.Engine(_engine.Model(str(path)), n_slots=n_slots, n_ctx=N_CTX,
                          n_threads=n_threads, simd=simd)


def fwd(e, slot, tokens, pos) -> np.ndarray:
    out = e.forward(slot, list(tokens), pos)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    assert out.shape == (len(tokens), e.model.info["n_vocab"])
    assert np.all(np.isfinite(out))
    return np.array(out, copy=True)  # independent of any buffer the engine reuses


def assert_same(a: np.ndarray, b: np.ndarray, what: str) -> None:
    assert a.shape == b.shape, (what, a.shape, b.shape)
    if not np.array_equal(a, b):
        rows = np.nonzero((a != b).any(axis=1))[0]
        raise AssertionError(f"{what}: not bit-identical; rows {rows.tolist()[:10]} differ, "
                             f"max |d| = {np.abs(a - b).max():.3e}")


@pytest.mark.parametrize("wtype", WTYPES)
def test_slot0_equals_slot1(make_tiny, simd, wtype):
    w = make_tiny(wtype=wtype, tied=wtype != "Q8_0")
    e = make_engine(w.path, simd)
    toks = prompt(23, w.hparams["n_vocab"])
    a = fwd(e, 0, toks, 0)
    b = fwd(e, 1, toks, 0)
    assert_same(a, b, "slot 0 vs slot 1")
    # a different sequence gives different logits (the comparison can fail)
    c = fwd(e, 1, prompt(23, w.hparams["n_vocab"], seed=1), 0)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("wtype", WTYPES)
def test_slots_do_not_interfere(make_tiny, simd, wtype):
    """Work on slot 1 between two chunks of slot 0 does not touch slot 0's KV."""
    w = make_tiny(wtype=wtype, tied=True)
    nv = w.hparams["n_vocab"]
    toks = prompt(30, nv)
    e = make_engine(w.path, simd)
    alone = fwd(e, 0, toks, 0)
    e2 = make_engine(w.path, simd)
    head = fwd(e2, 0, toks[:12], 0)
    fwd(e2, 1, prompt(40, nv, seed=7), 0)       # other sequence, longer than slot 0's
    tail = fwd(e2, 0, toks[12:], 12)
    assert_same(np.concatenate([head, tail]), alone, "slot 0 with slot 1 busy in between")


@pytest.mark.parametrize("split", [7, 1, 16])
@pytest.mark.parametrize("wtype", WTYPES)
def test_chunked_prefill_equals_one_shot(make_tiny, simd, wtype, split):
    w = make_tiny(wtype=wtype, tied=False)
    e = make_engine(w.path, simd)
    toks = prompt(29, w.hparams["n_vocab"])
    one = fwd(e, 0, toks, 0)
    first = fwd(e, 1, toks[:split], 0)
    rest = fwd(e, 1, toks[split:], split)
    assert_same(np.concatenate([first, rest]), one, f"chunks [:{split}] + [{split}:]")
    # three uneven chunks
    a = fwd(e, 1, toks[:3], 0)
    b = fwd(e, 1, toks[3:20], 3)
    c = fwd(e, 1, toks[20:], 20)
    assert_same(np.concatenate([a, b, c]), one, "chunks 3 + 17 + 9")


@pytest.mark.parametrize("wtype", WTYPES)
def test_rewind_recomputes(make_tiny, simd, wtype):
    """forward at pos < n_past keeps positions < pos and overwrites the rest:
    after a diverging sequence, rewinding to the common prefix and feeding
    the original tail gives the original logits."""
    w = make_tiny(wtype=wtype, tied=True)
    nv = w.hparams["n_vocab"]
    toks = prompt(26, nv)
    other = toks[:10] + prompt(30, nv, seed=3)
    e = make_engine(w.path, simd)
    ref = fwd(e, 0, toks, 0)
    fwd(e, 1, other, 0)
    tail = fwd(e, 1, toks[10:], 10)
    assert_same(tail, ref[10:], "rewind to 10 after a longer diverging history")


@pytest.mark.parametrize("wtype", WTYPES)
def test_threads_1_vs_2(make_tiny, simd, wtype):
    w = make_tiny(wtype=wtype, tied=False)
    toks = prompt(37, w.hparams["n_vocab"])
    a = fwd(make_engine(w.path, simd, n_threads=1), 0, toks, 0)
    e2 = make_engine(w.path, simd, n_threads=2)
    b = fwd(e2, 0, toks, 0)
    assert_same(a, b, "1 thread vs 2 threads")
    # and token by token with 2 threads
    rows = np.concatenate([fwd(e2, 1, [t], i) for i, t in enumerate(toks)])
    assert_same(rows, a, "2 threads token-by-token vs 1 thread prefill")


@pytest.mark.parametrize("wtype", ["F32", "Q4_0"])
def test_engines_are_independent(make_tiny, simd, wtype):
    """Two engines over one model, used alternately, agree with a fresh one."""
    from colibri_lab import _engine
    w = make_tiny(wtype=wtype, tied=True)
    m = _engine.Model(w.path)
    e1 = _engine.Engine(m, n_slots=1, n_ctx=N_CTX, n_threads=1, simd=simd)
    e2 = _engine.Engine(m, n_slots=1, n_ctx=N_CTX, n_threads=1, simd=simd)
    toks = prompt(18, w.hparams["n_vocab"])
    a1 = fwd(e1, 0, toks[:9], 0)
    fwd(e2, 0, prompt(50, w.hparams["n_vocab"], seed=9), 0)
    a2 = fwd(e1, 0, toks[9:], 9)
    fresh = fwd(make_engine(w.path, simd, n_slots=1), 0, toks, 0)
    assert_same(np.concatenate([a1, a2]), fresh, "engine 1 with engine 2 busy in between")
