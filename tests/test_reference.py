"""The engine's forward against the independent numpy reference (tests/reference.py).

Two groups:
  - self-checks of the reference and of the tiny-model writer (no engine
    needed): file round trip, prefill == token-by-token, RoPE orderings,
    and that the tolerances used below can actually fail;
  - engine vs reference on tiny random llama GGUFs, every weight type, tied
    and untied LM head, several prompt lengths, every SIMD level the CPU has.

Error metric: per row, max|engine - ref| / max|ref|; the worst row counts.

Tolerances (calibrated, see test_tolerances_can_fail and
test_tolerances_admit_q8_activations):
  - F32, F16, BF16: 1e-4.  The reference runs on the exact stored weights,
    so only float32 accumulation order separates the two (~1e-6).
  - Q8_0, Q4_0, Q4_1 (and any model with a quantized matrix): 2e-2.  The
    reference also runs on the exact stored (dequantized) weights, but a CPU
    engine may round activations to 8-bit blocks (ggml's Q8_0/Q8_1) before
    integer dot products, ~0.5% relative noise per matrix product.  The
    tiny models are residual-dominated (tinymodels "Conditioning":
    attn_output gain 0.4, ffn_down gain 0.3), like trained models; with the
    unit-gain models of earlier versions the same engine measured 2.8-3.2e-2
    and this tolerance was 8e-2.  Measured now (every SIMD level, tied and
    untied, prompts of 1-64 tokens): Q8_0 1.68e-2, Q4_0 1.39e-2, Q4_1
    1.57e-2; emulating the rounding (LlamaRef(act_q8=True), float32) up to
    1.83e-2.  No second reference can follow the engine more closely: one
    rounding flip in a K/V row re-draws the rounding noise of every later
    row.  The smallest real mistake tried (test_tolerances_can_fail: RoPE
    pairing, base, scaling, epsilon, GQA head mapping, FFN gate/up order,
    a block left out) moves logits by 0.21, >= 10x this tolerance.  An
    engine with float activations lands near 1e-6 here too; the exact kernel
    arithmetic is pinned down by the C kernel tests, not by these end-to-end
    ones.  (F32/F16/BF16, every SIMD level: <= 3e-7.)
  - argmax: identical on every row, except where the reference's top two
    are within TIE * max|ref| (float types 1e-3; quantized types 5e-2,
    2.4x the largest gap at which the emulated Q8 activations flipped one,
    2x the largest at which the scalar engine did).
"""
from __future__ import annotations

import numpy as np
import pytest

from reference import LlamaRef, rope
from tinymodels import WTYPES, write_tiny_llama

TOL_FLOAT = 1e-4
TOL_QUANT = 2e-2
TIE_FLOAT = 1e-3
TIE_QUANT = 5e-2
# SmolLM2-135M (30 layers) compounds activation rounding more than 2 layers:
# measured 4.8e-2 (scalar), 5.1e-2 (auto) and 4.8e-2 for the Q8_0 emulation.
TOL_SMOLLM2 = 1e-1
QUANT_TYPES = ("Q8_0", "Q4_0", "Q4_1")
PROMPT_LENS = (1, 5, 17, 64)
N_CTX = 256


# ---------------------------------------------------------------- helpers

def prompt(n: int, n_vocab: int, seed: int = 0) -> list[int]:
    """Deterministic pseudo-random token ids covering the whole vocabulary."""
    return np.random.default_rng(10_000 + 97 * n + seed).integers(0, n_vocab, n).tolist()


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """Worst row of max|a-b| / max|b| (b is the reference)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.all(np.isfinite(a)), "engine logits contain NaN/inf"
    return float((np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)).max())


def argmax_mismatches(a: np.ndarray, b: np.ndarray, tie_rel: float) -> list:
    """Rows whose argmax differs and is not a near-tie in the reference b.

    Returns (row, engine argmax, reference argmax, relative gap) tuples."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    ia, ib = a.argmax(axis=1), b.argmax(axis=1)
    bad = []
    for r in np.nonzero(ia != ib)[0]:
        gap = (b[r, ib[r]] - b[r, ia[r]]) / np.abs(b[r]).max()
        if gap > tie_rel:
            bad.append((int(r), int(ia[r]), int(ib[r]), float(gap)))
    return bad


def is_quant(w) -> bool:
    return w.hparams["wtype"] in QUANT_TYPES or w.hparams["embd_type"] in QUANT_TYPES


def reference_logits(w, tokens, start_pos: int = 0, prefix=(), **kw) -> np.ndarray:
    """Reference logits for `tokens` at start_pos, after prefix[:start_pos]."""
    ref = LlamaRef.from_tiny(w, **kw)
    cache = ref.new_cache(N_CTX)
    if start_pos:
        ref.forward(list(prefix)[:start_pos], 0, cache)
    return ref.forward(tokens, start_pos, cache)


def check_close(eng: np.ndarray, w, tokens, start_pos: int = 0, prefix=()) -> float:
    """Assert engine logits `eng` for `tokens` at start_pos (after `prefix`
    at positions 0..start_pos-1) match the reference under the tolerances of
    the model's weight types.  Returns the error measured."""
    ref = reference_logits(w, tokens, start_pos, prefix)
    tol, tie = (TOL_QUANT, TIE_QUANT) if is_quant(w) else (TOL_FLOAT, TIE_FLOAT)
    err = rel_err(eng, ref)
    assert err <= tol, f"max relative error {err:.3e} > {tol} ({w.hparams['wtype']})"
    bad = argmax_mismatches(eng, ref, tie)
    assert not bad, f"argmax differs (row, engine, ref, gap) beyond near-ties {tie}: {bad}"
    return err


def load(path):
    from colibri_lab import _engine
    return _engine.Model(str(path))


def engine(model, simd, n_threads=1, n_slots=2, kv_f16=False):
    """An engine with an f32 KV cache unless asked (the reference keeps K and V
    exact; test_f16_kv_matches_reference checks the default f16 cache)."""
    from colibri_lab import _engine
    return _engine.Engine(model, n_slots=n_slots, n_ctx=N_CTX, n_threads=n_threads, simd=simd, kv_f16=kv_f16)


def fwd(e, slot, tokens, pos):
    out = e.forward(slot, list(tokens), pos)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32, (type(out), getattr(out, "dtype", None))
    return out


# ---------------------------------------------------------------- reference self-checks

@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("tied", [True, False])
def test_tiny_file_roundtrip(tmp_path, wtype, tied):
    """The writer's returned weights are what a GGUF reader dequantizes from
    the file; types, shapes and metadata are as documented."""
    import gguf
    from reference import read_gguf

    w = write_tiny_llama(tmp_path / "m.gguf", wtype=wtype, tied=tied, rope_scale=2.0)
    r = gguf.GGUFReader(w.path)
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("GGUF.")}
    hp = w.hparams
    assert f["general.architecture"] == "llama"
    assert f["llama.block_count"] == hp["n_layer"]
    assert f["llama.embedding_length"] == hp["n_embd"]
    assert f["llama.feed_forward_length"] == hp["n_ff"]
    assert f["llama.attention.head_count"] == hp["n_head"]
    assert f["llama.attention.head_count_kv"] == hp["n_head_kv"]
    assert f["llama.rope.dimension_count"] == hp["head_dim"]
    assert f["llama.rope.scaling.type"] == "linear"
    assert f["llama.rope.scaling.factor"] == 2.0
    assert f["llama.vocab_size"] == hp["n_vocab"]
    assert f["tokenizer.ggml.model"] == "gpt2"
    assert f["tokenizer.ggml.pre"] == "smollm"
    toks = f["tokenizer.ggml.tokens"]
    assert len(toks) == hp["n_vocab"] == len(f["tokenizer.ggml.token_type"])
    assert toks[ord("A")] == "A" and toks[32] == "Ġ" and toks[10] == "Ċ"
    assert toks[f["tokenizer.ggml.eos_token_id"]] == "<|im_end|>"
    assert f["tokenizer.ggml.token_type"][toks.index("<|im_end|>")] == 3
    assert f["tokenizer.ggml.add_bos_token"] is False
    for m in f["tokenizer.ggml.merges"]:
        a, b = m.split(" ")
        assert a + b in toks, m

    types = {t.name: t.tensor_type.name for t in r.tensors}
    ne = {t.name: [int(x) for x in t.shape] for t in r.tensors}
    assert ("output.weight" in types) == (not tied)
    assert types["token_embd.weight"] == wtype
    assert ne["token_embd.weight"] == [hp["n_embd"], hp["n_vocab"]]
    assert ne["blk.1.attn_k.weight"] == [hp["n_embd"], hp["n_head_kv"] * hp["head_dim"]]
    assert ne["blk.0.ffn_down.weight"] == [hp["n_ff"], hp["n_embd"]]
    assert types["blk.0.attn_q.weight"] == wtype
    assert types["blk.0.attn_norm.weight"] == "F32" and types["output_norm.weight"] == "F32"

    back, rhp = read_gguf(w.path)
    assert sorted(back) == sorted(w)
    for name in w:
        assert back[name].shape == w[name].shape, name
        assert np.array_equal(back[name], w[name]), name
    assert rhp["rope_freq_scale"] == 0.5 and rhp["n_head_kv"] == hp["n_head_kv"]


def test_tiny_writer_deterministic_and_quantized(tmp_path):
    """Same seed -> same bytes; another seed -> other weights; the quantized
    values really are rounded (they differ from the F32 draw of the same seed)."""
    a = write_tiny_llama(tmp_path / "a.gguf", wtype="Q4_0", seed=3)
    b = write_tiny_llama(tmp_path / "b.gguf", wtype="Q4_0", seed=3)
    c = write_tiny_llama(tmp_path / "c.gguf", wtype="Q4_0", seed=4)
    f = write_tiny_llama(tmp_path / "f.gguf", wtype="F32", seed=3)
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    assert not np.array_equal(a["blk.0.attn_q.weight"], c["blk.0.attn_q.weight"])
    d = np.abs(a["blk.0.attn_q.weight"] - f["blk.0.attn_q.weight"]).max()
    assert 1e-4 < d < 0.2, d
    # 4-bit blocks: at most 16 distinct values per block of 32
    blk = a["blk.0.ffn_up.weight"].reshape(-1, 32)
    assert max(len(np.unique(r)) for r in blk) <= 16


@pytest.mark.parametrize("wtype,tied", [("F32", True), ("Q4_1", False)])
def test_reference_prefill_equals_incremental(make_tiny, wtype, tied):
    w = make_tiny(wtype=wtype, tied=tied)
    ref = LlamaRef.from_tiny(w)
    toks = prompt(33, w.hparams["n_vocab"])
    full = ref.forward(toks, 0, ref.new_cache(64))
    cache = ref.new_cache(64)
    step = np.concatenate([ref.forward([t], i, cache) for i, t in enumerate(toks)])
    assert np.abs(full - step).max() <= 1e-10 * np.abs(full).max()
    # chunks, and rewinding: positions >= start_pos are recomputed
    cache = ref.new_cache(64)
    ref.forward(toks[:20], 0, cache)
    ref.forward(prompt(9, w.hparams["n_vocab"], seed=1), 11, cache)  # diverge at 11
    tail = ref.forward(toks[11:], 11, cache)
    assert np.abs(full[11:] - tail).max() <= 1e-10 * np.abs(full).max()
    # causality: changing a later token leaves earlier rows unchanged
    toks2 = list(toks)
    toks2[20] = (toks2[20] + 1) % w.hparams["n_vocab"]
    full2 = ref.forward(toks2, 0, ref.new_cache(64))
    assert np.array_equal(full2[:20], full[:20])
    assert np.abs(full2[20:] - full[20:]).max() > 1e-2 * np.abs(full).max()


def test_rope_orderings():
    """Mode 0 rotates adjacent pairs, NeoX the two halves; permuting the head
    dims maps one onto the other (what llama.cpp's convert script relies on);
    rotation preserves norms; position 0 is the identity; relative positions
    only matter for q.k."""
    rng = np.random.default_rng(0)
    n, h, hd = 6, 3, 16
    x = rng.standard_normal((n, h, hd))
    pos = np.arange(n) * 7 + 3
    kw = dict(n_rot=hd, base=10000.0, freq_scale=0.5)
    a = rope(x, pos, **kw, neox=False)
    # adjacent pairs (2i, 2i+1) <-> halves (i, i + hd/2)
    perm = np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])
    b = rope(x[..., perm], pos, **kw, neox=True)
    assert np.allclose(a[..., perm], b, atol=1e-12)
    assert not np.allclose(a, rope(x, pos, **kw, neox=True), atol=1e-3)
    assert np.allclose(np.linalg.norm(a, axis=-1), np.linalg.norm(x, axis=-1))
    assert np.allclose(rope(x, np.zeros(n), **kw), x)
    # explicit pair 0 at position p: angle p * scale * base^0
    p = pos[2]
    c, s = np.cos(p * 0.5), np.sin(p * 0.5)
    assert np.allclose(a[2, :, 0], x[2, :, 0] * c - x[2, :, 1] * s)
    assert np.allclose(a[2, :, 1], x[2, :, 0] * s + x[2, :, 1] * c)
    # last pair: base^(-(hd-2)/hd)
    th = p * 0.5 * 10000.0 ** (-(hd - 2) / hd)
    assert np.allclose(a[2, :, hd - 1], x[2, :, hd - 2] * np.sin(th) + x[2, :, hd - 1] * np.cos(th))
    # q.k depends on the position difference only
    q, k = x[0:1], x[1:2]
    d1 = np.sum(rope(q, [10], **kw) * rope(k, [4], **kw))
    d2 = np.sum(rope(q, [26], **kw) * rope(k, [20], **kw))
    assert np.isclose(d1, d2)
    # partial rotation: dims >= n_rot pass through
    part = rope(x, pos, n_rot=8, base=10000.0)
    assert np.array_equal(part[..., 8:], x[..., 8:])


def test_tolerances_can_fail(make_tiny):
    """The comparisons below would catch real mistakes: each plausible bug
    moves the reference's logits by far more than the tolerance."""
    w = make_tiny(wtype="F32", tied=True)
    ws = make_tiny(wtype="F32", tied=True, rope_scale=4.0)
    toks = prompt(64, w.hparams["n_vocab"])
    good = LlamaRef.from_tiny(w).logits(toks)
    errs = {
        "neox rope": rel_err(LlamaRef.from_tiny(w, rope_neox=True).logits(toks), good),
        "rope base 1e4 -> 1e6": rel_err(LlamaRef.from_tiny(w, rope_base=1e6).logits(toks), good),
        "eps 1e-5 -> 1e-1": rel_err(LlamaRef.from_tiny(w, norm_eps=1e-1).logits(toks), good),
        "linear scale 1/4 ignored": rel_err(
            LlamaRef.from_tiny(ws, rope_freq_scale=1.0).logits(toks),
            LlamaRef.from_tiny(ws).logits(toks)),
    }
    # GQA: query head j reads kv head j // group.  A kernel that used
    # j % n_head_kv instead computes the correct model with query heads (Q
    # rows and the matching Wo columns) reordered so that the heads a buggy
    # kernel sends to kv head c sit at positions c*group .. c*group+group-1.
    ref = LlamaRef.from_tiny(w)
    nh, nkv, hd = ref.n_head, ref.n_head_kv, ref.head_dim
    sigma = [j for c in range(nkv) for j in range(nh) if j % nkv == c]
    assert sigma != list(range(nh))
    for L in ref.layers:
        L["attn_q"] = L["attn_q"].reshape(nh, hd, -1)[sigma].reshape(nh * hd, -1)
        L["attn_output"] = L["attn_output"].reshape(-1, nh, hd)[:, sigma].reshape(-1, nh * hd)
    errs["GQA mapping j % n_head_kv"] = rel_err(ref.logits(toks), good)
    # Every block matters (the residual-writing gains < 1 must not make any
    # block negligible), and so does the FFN's gate/up order.
    ref = LlamaRef.from_tiny(w)
    for L in ref.layers:
        L["ffn_gate"], L["ffn_up"] = L["ffn_up"], L["ffn_gate"]
    errs["FFN gate/up swapped"] = rel_err(ref.logits(toks), good)
    for li in range(w.hparams["n_layer"]):
        for part in ("attn_output", "ffn_down"):
            ref = LlamaRef.from_tiny(w)
            ref.layers[li][part] = np.zeros_like(ref.layers[li][part])
            errs[f"layer {li} without {part}"] = rel_err(ref.logits(toks), good)
    for name, e in errs.items():
        assert e > 5 * TOL_QUANT, f"{name}: only {e:.3e}"


@pytest.mark.parametrize("wtype", QUANT_TYPES)
def test_tolerances_admit_q8_activations(make_tiny, wtype):
    """A legitimate engine design — float32 arithmetic with activations
    rounded through Q8_0 before every matrix product — passes check_close
    on the prompts the engine tests use; and it is measurably different
    from the reference (so the tolerance is not vacuous for it)."""
    for tied in (True, False):
        w = make_tiny(wtype=wtype, tied=tied)
        emu = LlamaRef.from_tiny(w, dtype=np.float32, act_q8=True)
        for n in PROMPT_LENS:
            toks = prompt(n, w.hparams["n_vocab"])
            out = emu.logits(toks).astype(np.float32)
            err = check_close(out, w, toks)
            if n == 64:
                assert err > 1e-3, err


# ---------------------------------------------------------------- engine vs reference

@pytest.mark.parametrize("n", PROMPT_LENS)
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("wtype", WTYPES)
def test_engine_matches_reference(make_tiny, simd, wtype, tied, n):
    w = make_tiny(wtype=wtype, tied=tied)
    e = engine(load(w.path), simd)
    toks = prompt(n, w.hparams["n_vocab"])
    logits = fwd(e, 0, toks, 0)
    assert logits.shape == (n, w.hparams["n_vocab"])
    check_close(logits, w, toks)


@pytest.mark.parametrize("n", (5, 64))
@pytest.mark.parametrize("wtype", ("F32", "Q8_0", "Q4_1"))
def test_f16_kv_matches_reference(make_tiny, simd, wtype, n):
    """The default f16 KV cache: the engine against the reference that stores
    K and V rounded to f16, under the same tolerances; prefill and
    token-by-token decode agree bit for bit; and the cache type matters (f16
    and f32 caches give different logits, so the flag reaches the kernels)."""
    w = make_tiny(wtype=wtype, tied=False)
    m = load(w.path)
    toks = prompt(n, w.hparams["n_vocab"])
    e = engine(m, simd, kv_f16=True)
    full = fwd(e, 0, toks, 0).copy()
    ref = LlamaRef.from_tiny(w, kv_f16=True)
    cache = ref.new_cache(N_CTX)
    want = ref.forward(toks, 0, cache)
    tol, tie = (TOL_QUANT, TIE_QUANT) if is_quant(w) else (TOL_FLOAT, TIE_FLOAT)
    assert rel_err(full, want) <= tol
    assert not argmax_mismatches(full, want, tie)
    rows = np.concatenate([fwd(e, 1, [t], i).copy() for i, t in enumerate(toks)])
    assert np.array_equal(full, rows)
    f32 = fwd(engine(m, simd, kv_f16=False), 0, toks, 0)
    assert n == 1 or not np.array_equal(full[1:], f32[1:])


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("wtype", WTYPES)
def test_engine_prefill_equals_token_by_token(make_tiny, simd, wtype, tied):
    """Batch invariance of the forward: one prefill of n rows and n forwards
    of one row give bit-identical logits."""
    w = make_tiny(wtype=wtype, tied=tied)
    e = engine(load(w.path), simd)
    toks = prompt(17, w.hparams["n_vocab"])
    full = fwd(e, 0, toks, 0).copy()
    rows = np.concatenate([fwd(e, 0, [t], i).copy() for i, t in enumerate(toks)])
    assert np.array_equal(full, rows), (
        f"prefill vs token-by-token differ: max |d| = {np.abs(full - rows).max():.3e}, "
        f"first differing row {int(np.nonzero((full != rows).any(axis=1))[0][0])}")
    check_close(full, w, toks)


@pytest.mark.parametrize("rope_base,rope_scale", [(10000.0, 4.0), (1e6, None), (500000.0, 2.0)])
def test_engine_rope_scaling(make_tiny, simd, rope_base, rope_scale):
    """Linear RoPE scaling and other bases, at positions up to 200."""
    w = make_tiny(wtype="F32", tied=False, rope_base=rope_base, rope_scale=rope_scale)
    m = load(w.path)
    info = m.info
    want_scale = 1.0 / rope_scale if rope_scale else 1.0
    assert abs(info["rope_freq_scale"] - want_scale) < 1e-7, info["rope_freq_scale"]
    assert abs(info["rope_freq_base"] - rope_base) <= 1e-6 * rope_base
    e = engine(m, simd)
    toks = prompt(200, w.hparams["n_vocab"], seed=5)
    head = fwd(e, 0, toks[:64], 0).copy()
    tail = fwd(e, 0, toks[64:], 64).copy()
    check_close(head, w, toks[:64])
    check_close(tail, w, toks[64:], start_pos=64, prefix=toks)
    if rope_scale:
        # the unscaled model is far away: the engine did apply the factor
        unscaled = LlamaRef.from_tiny(w, rope_freq_scale=1.0)
        c = unscaled.new_cache(N_CTX)
        unscaled.forward(toks[:64], 0, c)
        assert rel_err(tail, unscaled.forward(toks[64:], 64, c)) > 10 * TOL_QUANT


@pytest.mark.parametrize("wtype", ["F32", "Q4_0"])
def test_engine_quantized_embedding(make_tiny, simd, wtype):
    """token_embd in Q8_0 while the matrices are another type (SmolLM2's mix)."""
    w = make_tiny(wtype=wtype, embd_type="Q8_0", tied=True)
    e = engine(load(w.path), simd)
    toks = prompt(17, w.hparams["n_vocab"], seed=2)
    check_close(fwd(e, 0, toks, 0), w, toks)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_engine_info(make_tiny, tied):
    w = make_tiny(wtype="Q4_1", tied=tied)
    info = load(w.path).info
    hp = w.hparams
    assert info["arch"] == "llama"
    for k in ("n_vocab", "n_embd", "n_ff", "n_layer", "n_head", "n_head_kv", "head_dim", "n_rot"):
        assert info[k] == hp[k], (k, info[k], hp[k])
    assert info["n_ctx_train"] == hp["n_ctx_train"]
    assert bool(info["tied_output"]) == tied
    assert not info["rope_neox"]
    assert abs(info["norm_eps"] - hp["norm_eps"]) < 1e-12
    assert info["bos_id"] == 256 and info["eos_id"] == 257
    assert not info["add_bos"]
    n_params = sum(int(np.prod(a.shape)) for a in w.values())
    assert info["n_params"] == n_params


# ---------------------------------------------------------------- real model

SMOLLM2_PROMPT = ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                  "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    """(engine Model, float32 reference, tokenizer, prompt ids) for SmolLM2."""
    from colibri_lab.tokenizer import Tokenizer
    m = load(smollm2_path)
    ref = LlamaRef.from_gguf(smollm2_path, dtype=np.float32)
    tok = Tokenizer.from_metadata(m.metadata())
    ids = tok.encode(SMOLLM2_PROMPT, add_special=False)
    assert len(ids) < 32, ids
    return m, ref, tok, ids


def greedy(step, ids, n):
    """n greedy tokens; step(tokens, pos) -> logits rows."""
    lg = step(ids, 0)
    out, pos = [], len(ids)
    for _ in range(n):
        t = int(np.argmax(lg[-1]))
        out.append(t)
        lg = step([t], pos)
        pos += 1
    return out


@pytest.mark.smollm2
def test_smollm2_reference_answers(smollm2):
    """The reference itself on a real model (an independent check of its
    RoPE pairing, GQA mapping and norms): greedy decoding answers the
    question."""
    m, ref, tok, ids = smollm2
    assert ref.n_layer == 30 and ref.n_head == 9 and ref.n_head_kv == 3 and ref.tied
    cache = ref.new_cache(64)
    text = tok.decode(greedy(lambda t, p: ref.forward(t, p, cache), ids, 7))
    assert "Paris" in text, text


@pytest.mark.smollm2
@pytest.mark.parametrize("simd_level", ["scalar", "auto"])
def test_smollm2_matches_reference(smollm2, simd_level):
    """SmolLM2-135M (Q4_1, tied Q8_0 embedding): engine vs the float32
    reference on a chat prompt.  30 layers compound activation rounding more
    than 2 do (measured ~5e-2 for both the scalar engine and the Q8_0
    emulation): tolerance TOL_SMOLLM2, argmax equal where the reference's
    top two are 0.1 apart; greedy decoding answers the question."""
    from colibri_lab import _engine
    m, ref, tok, ids = smollm2
    assert m.info["n_layer"] == ref.n_layer and m.info["n_vocab"] == ref.n_vocab
    e = _engine.Engine(m, n_slots=1, n_ctx=64, n_threads=2, simd=simd_level)
    out = fwd(e, 0, ids, 0)
    ref_logits = ref.logits(ids)
    err = rel_err(out, ref_logits)
    assert err <= TOL_SMOLLM2, err
    assert not argmax_mismatches(out, ref_logits, 0.1)
    text = tok.decode(greedy(lambda t, p: fwd(e, 0, t, p), ids, 7))
    assert "Paris" in text, text
