"""Architectures beyond llama: qwen2 (q/k/v biases, NeoX RoPE), qwen3
(per-head QK-norm, explicit head_dim), and the mixture-of-experts families
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
DENSE = ("qwen2", "qwen3")
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
    assert ("blk.0.attn_q_norm.weight" in names) == (arch in ("qwen3", "qwen3moe", "olmoe"))
    back, rhp = read_gguf(w.path)
    assert sorted(back) == sorted(w)
    for k in w:
        assert np.array_equal(back[k], w[k]), k
    assert rhp["rope_neox"] == hp["rope_neox"] and rhp["n_expert_used"] == hp["n_expert_used"]
    assert rhp["moe_norm_topk"] == hp["moe_norm_topk"]


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
