"""Architectures beyond llama: qwen2 (q/k/v biases, NeoX RoPE), qwen3
(per-head QK-norm, explicit head_dim), gemma3 (the gemma block: scaled
embeddings, post-norms, GELU FFN, and sliding-window local layers whose KV
is a ring of the window), and the mixture-of-experts families
qwen3moe, olmoe (whole-projection QK-norm, no top-k renormalisation),
qwen2moe (shared expert) and mixtral (llama + experts), plus K-quant
(Q4_K / Q5_K / Q6_K) weights — engine logits against the numpy reference
(tests/reference.py) on tiny random GGUFs written by tinymodels.write_tiny_model.

Tolerances are those of test_reference.py (same metric, same reasoning):
float weights 1e-4, 8-bit-activation paths 2e-2 with near-tie-tolerant
argmax.  MoE models route on an F32 router (as llama.cpp's quantizer keeps
ffn_gate_inp): with float weights the engine's routing equals the
reference's; with quantized weights the router input carries activation
rounding, so quantized MoE models are compared in test_moe.py with the
reference's routing checked separately.
"""
from __future__ import annotations

import numpy as np
import pytest

from reference import LlamaRef
from test_batching import run_requests
from test_reference import TIE_FLOAT, TIE_QUANT, TOL_FLOAT, TOL_QUANT, argmax_mismatches, prompt, rel_err
from tinymodels import ARCHES, write_tiny_model

N_CTX = 128
DENSE = ("qwen2", "qwen3", "gemma3")
MOE = ("qwen3moe", "olmoe", "qwen2moe", "mixtral")


@pytest.fixture(scope="session")
def make_arch(tmp_path_factory):
    """make_arch(**write_tiny_model kwargs) -> TinyWeights, cached per session."""
    cache: dict = {}
    root = tmp_path_factory.mktemp("arch_models")

    def make(**kw):
        key = tuple(sorted(kw.items()))
        if key not in cache:
            name = "m-" + "-".join(f"{k}_{v}" for k, v in key) + ".gguf"
            cache[key] = write_tiny_model(root / name, **kw)
        return cache[key]

    return make


def ref_logits(w, tokens):
    ref = LlamaRef.from_tiny(w)
    return ref.forward(tokens, 0, ref.new_cache(N_CTX)), ref


def engine_logits(w, tokens, simd, n_threads=1):
    from colibri_lab import _engine
    m = _engine.Model(w.path)
    e = _engine.Engine(m, n_slots=1, n_ctx=N_CTX, n_threads=n_threads, simd=simd, kv_f16=False)
    return e.forward(0, tokens, 0)


def check(eng, ref, quant):
    tol, tie = (TOL_QUANT, TIE_QUANT) if quant else (TOL_FLOAT, TIE_FLOAT)
    err = rel_err(eng, ref)
    assert err <= tol, f"max relative error {err:.3e} > {tol}"
    bad = argmax_mismatches(eng, ref, tie)
    assert not bad, f"argmax differs beyond near-ties: {bad}"
    return err


# ---------------------------------------------------------------- writer / reference self-checks

@pytest.mark.parametrize("arch", ARCHES)
def test_writer_metadata_and_tensors(make_arch, arch):
    import gguf
    from reference import read_gguf
    w = make_arch(arch=arch)
    r = gguf.GGUFReader(w.path)
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("GGUF.")}
    file_arch = "llama" if arch == "mixtral" else arch
    assert f["general.architecture"] == file_arch
    names = {t.name: [int(x) for x in t.shape] for t in r.tensors}
    hp = w.hparams
    if hp["n_expert"]:
        assert f[f"{file_arch}.expert_count"] == hp["n_expert"]
        assert f[f"{file_arch}.expert_used_count"] == hp["n_expert_used"]
        ne = names["blk.0.ffn_gate_exps.weight"]
        assert ne[0] == hp["n_embd"] and ne[2] == hp["n_expert"]
        assert "blk.0.ffn_gate.weight" not in names
    else:
        assert "blk.0.ffn_gate_inp.weight" not in names
    assert ("blk.0.attn_q.bias" in names) == (arch in ("qwen2", "qwen2moe"))
    assert ("blk.0.attn_q_norm.weight" in names) == (arch in ("qwen3", "qwen3moe", "olmoe", "gemma3"))
    assert ("blk.0.post_ffw_norm.weight" in names) == (arch == "gemma3")
    back, rhp = read_gguf(w.path)
    assert sorted(back) == sorted(w)
    for k in w:
        assert np.array_equal(back[k], w[k]), k
    assert rhp["rope_neox"] == hp["rope_neox"] and rhp["n_expert_used"] == hp["n_expert_used"]
    assert rhp["moe_norm_topk"] == hp["moe_norm_topk"]
    if arch == "gemma3":
        assert f["gemma3.attention.sliding_window"] == hp["n_swa"] and f["tokenizer.ggml.add_bos_token"] is True
        assert rhp["swa_layers"] == hp["swa_layers"] and rhp["attn_scale"] == pytest.approx(hp["attn_scale"])


GEMMA_FEATURES = ("window", "local_rope", "post_norm", "gelu", "embd_scale", "attn_scale")


@pytest.mark.parametrize("feature", GEMMA_FEATURES)
def test_reference_gemma3_features_matter(make_arch, monkeypatch, feature):
    """Each part of the gemma block changes the reference's logits far beyond
    the float tolerance, on a prompt longer than the window (so an engine
    that ignored any of them would fail the comparisons below)."""
    import reference
    w = make_arch(arch="gemma3")
    toks = prompt(40, w.hparams["n_vocab"])
    base, _ = ref_logits(w, toks)
    ref = LlamaRef.from_tiny(w)
    if feature == "window":
        ref.swa_layers = [False] * ref.n_layer
    elif feature == "local_rope":
        ref.rope_base_swa = ref.rope_base
    elif feature == "post_norm":
        for L in ref.layers:
            L["post_attention_norm"] = np.ones_like(L["post_attention_norm"]) * np.mean(L["post_attention_norm"])
            L["post_ffw_norm"] = np.ones_like(L["post_ffw_norm"]) * np.mean(L["post_ffw_norm"])
    elif feature == "gelu":
        monkeypatch.setattr(reference, "gelu_tanh", reference.silu)
    elif feature == "embd_scale":  # input embeddings unscaled, the tied LM head as it was
        ref.output = ref.embd.copy()
        ref.embd = ref.embd / np.sqrt(ref.n_embd)
    elif feature == "attn_scale":
        ref.attn_scale = 1.0 / np.sqrt(ref.n_embd / ref.n_head)  # the 27B rule
    other = ref.forward(toks, 0, ref.new_cache(N_CTX))
    assert rel_err(other, base) > 50 * TOL_FLOAT, feature


@pytest.mark.parametrize("arch", ("qwen2", "qwen3", "olmoe", "qwen3moe", "qwen2moe"))
def test_reference_variants_matter(make_arch, arch):
    """Each variant's feature changes the reference's logits far beyond the
    float tolerance (so an engine that ignored it would fail)."""
    w = make_arch(arch=arch)
    toks = prompt(9, w.hparams["n_vocab"])
    base, _ = ref_logits(w, toks)
    w2 = type(w)(w)
    w2.hparams = dict(w.hparams)
    if arch in ("qwen2", "qwen2moe"):
        for l in range(w.hparams["n_layer"]):
            w2[f"blk.{l}.attn_q.bias"] = np.zeros_like(w[f"blk.{l}.attn_q.bias"])
    elif arch in ("qwen3", "olmoe"):
        for l in range(w.hparams["n_layer"]):
            w2[f"blk.{l}.attn_k_norm.weight"] = np.ones_like(w[f"blk.{l}.attn_k_norm.weight"])
    else:  # qwen3moe: renormalisation off
        w2.hparams["moe_norm_topk"] = False
    if arch == "qwen2moe":
        for l in range(w.hparams["n_layer"]):
            del w2[f"blk.{l}.ffn_gate_shexp.weight"]
    other, _ = ref_logits(w2, toks)
    assert rel_err(other, base) > 50 * TOL_FLOAT


def test_reference_rejects_bad_moe():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        LlamaRef({"token_embd.weight": rng.standard_normal((300, 64)),
                  "output_norm.weight": np.ones(64),
                  **{f"blk.0.{n}.weight": rng.standard_normal(s) for n, s in (
                      ("attn_norm", (64,)), ("attn_q", (64, 64)), ("attn_k", (64, 64)), ("attn_v", (64, 64)),
                      ("attn_output", (64, 64)), ("ffn_norm", (64,)), ("ffn_gate_inp", (4, 64)),
                      ("ffn_gate_exps", (4, 32, 64)), ("ffn_up_exps", (4, 32, 64)), ("ffn_down_exps", (4, 64, 32)))}},
                 n_head=4, n_head_kv=4, norm_eps=1e-5, rope_base=1e4, n_expert_used=0)


# ---------------------------------------------------------------- engine vs reference

@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("n", (1, 7, 33))
def test_engine_matches_reference_f32(make_arch, simd, arch, n):
    w = make_arch(arch=arch)
    toks = prompt(n, w.hparams["n_vocab"])
    ref, _ = ref_logits(w, toks)
    check(engine_logits(w, toks, simd), ref, quant=False)


@pytest.mark.parametrize("arch", DENSE + ("llama",))
@pytest.mark.parametrize("wtype", ("F16", "Q8_0", "Q4_1"))
def test_engine_matches_reference_dense_types(make_arch, simd, arch, wtype):
    w = make_arch(arch=arch, wtype=wtype)
    toks = prompt(17, w.hparams["n_vocab"])
    ref, _ = ref_logits(w, toks)
    check(engine_logits(w, toks, simd), ref, quant=wtype != "F16")


def test_qwen3_explicit_head_dim(make_arch, simd):
    """head_dim from attention.key_length, with q_dim = n_head*head_dim != n_embd."""
    w = make_arch(arch="qwen3", n_embd=64, n_head=4, n_head_kv=2, head_dim=32)
    toks = prompt(12, w.hparams["n_vocab"])
    ref, _ = ref_logits(w, toks)
    check(engine_logits(w, toks, simd), ref, quant=False)
    from colibri_lab import _engine
    info = _engine.Model(w.path).info
    assert info["head_dim"] == 32 and info["arch"] == "qwen3" and info["rope_neox"]


@pytest.mark.parametrize("arch", MOE)
def test_moe_threads_and_untied(make_arch, simd, arch):
    w = make_arch(arch=arch, tied=False, seed=3)
    toks = prompt(20, w.hparams["n_vocab"], seed=1)
    ref, _ = ref_logits(w, toks)
    check(engine_logits(w, toks, simd, n_threads=2), ref, quant=False)


@pytest.mark.parametrize("wtype", ("Q4_K", "Q5_K", "Q6_K"))
@pytest.mark.parametrize("arch", ("llama", "qwen2"))
def test_engine_kquant_models(make_arch, simd, arch, wtype):
    """K-quant weights end to end (n_embd, n_ff multiples of 256); Q8_0 embedding."""
    w = make_arch(arch=arch, wtype=wtype, embd_type="Q8_0", n_embd=256, n_ff=512, n_head=4, n_head_kv=2)
    toks = prompt(9, w.hparams["n_vocab"])
    ref, _ = ref_logits(w, toks)
    check(engine_logits(w, toks, simd), ref, quant=True)


def test_model_info_reports_experts(make_arch):
    from colibri_lab import _engine
    w = make_arch(arch="qwen3moe")
    info = _engine.Model(w.path).info
    assert info["arch"] == "qwen3moe"
    if "n_expert" in info:  # needs the binding's experts block
        assert (info["n_expert"], info["n_expert_used"]) == (w.hparams["n_expert"], w.hparams["n_expert_used"])


@pytest.mark.parametrize("drop", ("blk.0.attn_q.bias", "blk.1.attn_k_norm.weight", "blk.0.ffn_up_exps.weight"))
def test_missing_arch_tensor_is_a_clear_error(tmp_path, drop):
    """A file lacking a tensor its architecture needs is refused by name."""
    import gguf
    from colibri_lab import _engine
    from colibri_lab.errors import ModelLoadError
    arch = {"blk.0.attn_q.bias": "qwen2", "blk.1.attn_k_norm.weight": "qwen3",
            "blk.0.ffn_up_exps.weight": "qwen3moe"}[drop]
    src = write_tiny_model(tmp_path / "src.gguf", arch=arch)
    r = gguf.GGUFReader(src.path)
    wr = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        v = f.contents()
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            wr.add_array(k, v)
        else:
            wr.add_key_value(k, v, vt)
    for t in r.tensors:
        if t.name != drop:
            wr.add_tensor(t.name, np.asarray(src[t.name], dtype=np.float32))
    wr.write_header_to_file(); wr.write_kv_data_to_file(); wr.write_tensors_to_file(); wr.close()
    with pytest.raises(ModelLoadError, match=drop.replace(".", r"\.")):
        _engine.Model(str(tmp_path / "bad.gguf"))


@pytest.mark.parametrize("arch,extra", [(a, {}) for a in ARCHES] +
                         [("qwen3", dict(n_embd=64, n_head=4, n_head_kv=2, head_dim=32))])
def test_decode_batch_of_six_matches_alone(make_arch, simd, arch, extra):
    """Six streams decoding together at 2 threads take the paths a lone stream
    never does (RoPE and the KV store inside the attention run, each matmul
    input quantized by the task that made it, the LM head's argmax): every
    architecture's logits must still equal each stream's alone, bit for bit."""
    from colibri_lab import _engine
    w = make_arch(arch=arch, wtype="Q4_1", seed=5, **extra)
    m = _engine.Model(w.path)
    prompts = [prompt(3 + 2 * i, w.hparams["n_vocab"], seed=i) for i in range(6)]
    kw = dict(max_tokens=5, ignore_eos=True)
    together = run_requests(_engine.Engine(m, n_slots=6, n_ctx=N_CTX, n_threads=2, simd=simd),
                            [(p, kw) for p in prompts])
    alone_core = _engine.Engine(m, n_slots=1, n_ctx=N_CTX, n_threads=1, simd=simd)
    for i, p in enumerate(prompts):
        alone = run_requests(alone_core, [(p, kw)])[0]
        assert together[i]["error"] is None and together[i]["tokens"] == alone["tokens"], (arch, i)
        for a, b in zip(together[i]["logits"], alone["logits"]):
            assert np.array_equal(a, b), f"{arch}: stream {i}'s logits differ in a batch of six"


# ---------------------------------------------------------------- gemma3: sliding window in a KV ring
#
# The tiny gemma3 has a window of 8 positions.  With n_batch=16 its local
# layers keep a ring of 8 + 16 - 1 = 23 rows (plus 7 mirrored) instead of
# n_ctx = 128, so sequences longer than 23 wrap the ring; with n_batch=128
# the ring would not be smaller than the context and every position is kept.

RING = dict(n_ctx=N_CTX, n_batch=16)
FULL = dict(n_ctx=N_CTX, n_batch=N_CTX)


def gemma_model(make_arch, **kw):
    from colibri_lab import _engine
    w = make_arch(arch="gemma3", **kw)
    return w, _engine.Model(w.path)


def run_positions(e, toks, n_prefill):
    """Prefill toks[:n_prefill], then one token at a time: all logits."""
    out = [e.forward(0, toks[:n_prefill], 0)]
    for i in range(n_prefill, len(toks)):
        out.append(e.forward(0, toks[i:i + 1], i))
    return np.concatenate(out)


def test_gemma3_ring_equals_full_kv_and_reference(make_arch, simd):
    """Prefill past the window in chunks, then decode past the end of the
    ring: logits with the ring equal those with every position kept, bit for
    bit, and the reference; the ring is what makes the cache smaller."""
    from colibri_lab import _engine
    w, m = gemma_model(make_arch)
    toks = prompt(110, w.hparams["n_vocab"], seed=2)
    ring = _engine.Engine(m, n_slots=1, n_threads=1, simd=simd, kv_f16=False, **RING)
    full = _engine.Engine(m, n_slots=1, n_threads=1, simd=simd, kv_f16=False, **FULL)
    a, b = run_positions(ring, toks, 70), run_positions(full, toks, 70)
    assert np.array_equal(a, b)
    ref, _ = ref_logits(w, toks)
    check(a, ref, quant=False)
    # 6 local layers of 30 rows and 1 global of 128, against 7 x 128
    row = w.hparams["n_head_kv"] * w.hparams["head_dim"] * 4 * 2
    assert ring.kv_bytes == (6 * 30 + 128) * row and full.kv_bytes == 7 * 128 * row


def test_gemma3_kv_grows_with_the_window_not_the_context(make_arch):
    from colibri_lab import _engine
    w, m = gemma_model(make_arch)
    row = w.hparams["n_head_kv"] * w.hparams["head_dim"] * 2 * 2   # f16 K and V
    sizes = {n_ctx: _engine.Engine(m, n_slots=2, n_ctx=n_ctx, n_batch=16).kv_bytes for n_ctx in (256, 4096)}
    # only the one global layer grows with n_ctx; the six local ones stay at 30 rows
    assert sizes[256] == 2 * (6 * 30 + 256) * row and sizes[4096] - sizes[256] == 2 * (4096 - 256) * row


def test_gemma3_quantized_ring_matches_reference(make_arch, simd):
    from colibri_lab import _engine
    w, m = gemma_model(make_arch, wtype="Q8_0")
    toks = prompt(60, w.hparams["n_vocab"], seed=4)
    e = _engine.Engine(m, n_slots=1, n_threads=2, simd=simd, kv_f16=False, **RING)
    ref, _ = ref_logits(w, toks)
    check(run_positions(e, toks, 40), ref, quant=True)


def test_gemma3_forward_refuses_a_dropped_window(make_arch):
    """cb_engine_forward may restart a slot at any pos whose window the ring
    still holds, and refuses (clearly) one it no longer does."""
    from colibri_lab import _engine
    w, m = gemma_model(make_arch)
    toks = prompt(60, w.hparams["n_vocab"], seed=3)
    e = _engine.Engine(m, n_slots=1, n_threads=1, kv_f16=False, **RING)
    e.forward(0, toks, 0)                       # positions 0..59: the ring holds 37..59
    with pytest.raises(Exception, match="sliding window"):
        e.forward(0, toks[20:30], 20)
    again = e.forward(0, toks[50:], 50)         # window 43..49 still held
    fresh = _engine.Engine(m, n_slots=1, n_threads=1, kv_f16=False, **FULL).forward(0, toks, 0)
    assert np.array_equal(again, fresh[50:])
    e.slot_clear(0)
    assert np.array_equal(e.forward(0, toks, 0), fresh)


@pytest.mark.parametrize("shared", (50, 30))
def test_gemma3_prefix_reuse_with_ring(make_arch, simd, shared):
    """A request sharing 50 tokens with the slot's history reuses them (the
    ring still holds the window before position 50); one sharing 30 cannot
    (the ring moved past 23..29) and prefills from the start.  Both give the
    logits of a fresh engine, bit for bit."""
    from colibri_lab import _engine
    from test_batching import run_requests
    w, m = gemma_model(make_arch, wtype="Q4_1")
    V = w.hparams["n_vocab"]
    first = prompt(60, V, seed=5)
    second = first[:shared] + prompt(20, V, seed=6)
    kw = dict(max_tokens=6, ignore_eos=True)
    core = _engine.Engine(m, n_slots=1, n_threads=2, simd=simd, **RING)
    run_requests(core, [(first, kw)])           # history 0..65: the ring holds 43..65
    got = run_requests(core, [(second, kw)])[0]
    want = run_requests(_engine.Engine(m, n_slots=1, n_threads=2, simd=simd, **RING), [(second, kw)])[0]
    assert got["metrics"]["cached_tokens"] == (shared if shared == 50 else 0)
    assert got["tokens"] == want["tokens"]
    assert all(np.array_equal(a, b) for a, b in zip(got["logits"], want["logits"]))


@pytest.mark.parametrize("first_len", (60, 18))
def test_gemma3_copy_prefix_with_ring(make_arch, simd, first_len):
    """copy_prefix takes a prefix from another slot's ring (wrapped: the
    whole ring is copied; not wrapped yet: only the positions) and the
    copied slot computes what a fresh one does."""
    from colibri_lab import _engine
    from test_batching import run_requests
    w, m = gemma_model(make_arch, wtype="Q4_1")
    V = w.hparams["n_vocab"]
    first = prompt(first_len, V, seed=7)
    shared = first_len - 6
    second = first[:shared] + prompt(15, V, seed=8)
    kw = dict(max_tokens=5, ignore_eos=True)
    core = _engine.Engine(m, n_slots=2, n_threads=1, simd=simd, **RING)
    run_requests(core, [(first, dict(kw, slot=0))])
    got = run_requests(core, [(second, dict(kw, slot=1, copy_prefix=True))])[0]
    want = run_requests(_engine.Engine(m, n_slots=1, n_threads=1, simd=simd, **RING), [(second, kw)])[0]
    assert got["metrics"]["cached_tokens"] == shared
    assert got["tokens"] == want["tokens"]
    assert all(np.array_equal(a, b) for a, b in zip(got["logits"], want["logits"]))


def test_gemma3_speculation_with_ring_is_lossless(make_arch, simd):
    """Drafts verified in the batched step and rolled back when rejected
    (prompt lookup, and layer skip, whose drafter keeps its own ring) leave
    greedy output and logits those of plain decoding, past the window."""
    from colibri_lab import _engine
    from test_batching import run_requests
    w, m = gemma_model(make_arch, wtype="Q4_1")
    V = w.hparams["n_vocab"]
    base = prompt(12, V, seed=9)                   # repeated n-grams: lookup drafts, some rejected
    p = base + prompt(9, V, seed=20) + base[:5] + prompt(7, V, seed=40) + base[:3]
    plain = run_requests(_engine.Engine(m, n_slots=1, n_threads=1, simd=simd, **RING),
                         [(p, dict(max_tokens=40, ignore_eos=True))])[0]
    for sources in (["prompt_lookup"], ["layer_skip"]):
        spec = dict(sources=sources, k_max=4, adaptive=False)
        got = run_requests(_engine.Engine(m, n_slots=1, n_threads=1, simd=simd, layer_skip=True, **RING),
                           [(p, dict(max_tokens=40, ignore_eos=True, speculative=spec))])[0]
        assert got["error"] is None and got["tokens"] == plain["tokens"], sources
        mt = got["metrics"]
        assert 0 < mt["draft_accepted"] < mt["draft_n"], (sources, mt)   # both paths taken
        assert all(np.array_equal(a, b) for a, b in zip(got["logits"], plain["logits"])), sources


def test_gemma3_decode_batch_of_six_with_ring(make_arch, simd):
    """Six streams past the window together (ring rows of several slots
    written in one step) equal each stream alone, bit for bit."""
    from colibri_lab import _engine
    from test_batching import run_requests
    w, m = gemma_model(make_arch, wtype="Q4_1", seed=5)
    prompts = [prompt(20 + 3 * i, w.hparams["n_vocab"], seed=i) for i in range(6)]
    kw = dict(max_tokens=12, ignore_eos=True)
    together = run_requests(_engine.Engine(m, n_slots=6, n_threads=2, simd=simd, **RING), [(p, kw) for p in prompts])
    alone_core = _engine.Engine(m, n_slots=1, n_threads=1, simd=simd, **RING)
    for i, p in enumerate(prompts):
        alone = run_requests(alone_core, [(p, kw)])[0]
        assert together[i]["error"] is None and together[i]["tokens"] == alone["tokens"], i
        assert all(np.array_equal(a, b) for a, b in zip(together[i]["logits"], alone["logits"])), i
