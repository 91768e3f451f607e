"""Tiny random llama-architecture GGUF files for tests.

`write_tiny_llama()` writes a complete, valid GGUF (metadata, byte-level
tokenizer, tensors) with random weights and returns the float32 values that
are *actually stored*: every tensor goes through quantize -> dequantize with
the `gguf` package, so a reference forward over the returned weights uses
exactly the numbers the engine reads from the file.  The difference between
engine and reference is then only arithmetic (accumulation order, activation
quantization), never weight rounding.

Conventions (those of llama.cpp's GGUF llama files):
  - a matrix W used as y = W @ x has numpy shape [n_out, n_in]; GGUF stores
    it with ne = [n_in, n_out] (gguf reverses the numpy shape);
  - token_embd.weight is [n_vocab, n_embd] (one row per token);
  - Q and K are in the layout of RoPE mode 0 ("normal"): the rotated pairs
    are adjacent elements (2i, 2i+1) of each head, which is what llama.cpp's
    convert script produces for the llama architecture by permuting the
    Hugging Face weights;
  - norm weights are always F32 (llama.cpp keeps 1-D tensors in F32).
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf import quants

__all__ = [
    "WTYPES",
    "KQ_WTYPES",
    "ARCHES",
    "write_tiny_model",
    "quantize_k",
    "bytes_to_unicode",
    "tiny_vocab",
    "write_tiny_llama",
    "TinyWeights",
    "CHATML_TEMPLATE",
]

# Weight types the tests exercise, by GGUF type name.
WTYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")

# K-quant weight types (rows must be multiples of 256).  gguf.quants can
# dequantize but not quantize them, so quantize_k() below builds the blocks.
KQ_WTYPES = ("Q4_K", "Q5_K", "Q6_K")

# Architectures write_tiny_model() can write ("mixtral" = llama + experts).
ARCHES = ("llama", "qwen2", "qwen3", "qwen3moe", "olmoe", "qwen2moe", "mixtral", "gemma3")

# general.file_type (llama_ftype) that llama.cpp writes for a model whose
# matrices are mostly of this type.
_FILE_TYPE = {
    "F32": gguf.LlamaFileType.ALL_F32,
    "F16": gguf.LlamaFileType.MOSTLY_F16,
    "BF16": gguf.LlamaFileType.MOSTLY_BF16,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
    "Q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_M,
    "Q5_K": gguf.LlamaFileType.MOSTLY_Q5_K_M,
    "Q6_K": gguf.LlamaFileType.MOSTLY_Q6_K,
}

# Special tokens placed right after the 256 byte tokens (ChatML, like SmolLM2).
SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")

# A few real BPE merges so the tokenizer section is not degenerate: each
# merge's result is a vocabulary entry, in merge-priority order.  Strings are
# in the GPT-2 byte-to-unicode alphabet ("Ġ" is the space byte 0x20).
_MERGES = (
    ("h", "e"),
    ("Ġ", "t"),
    ("Ġt", "he"),
    ("i", "n"),
    ("Ġ", "a"),
    ("e", "r"),
    ("o", "n"),
    ("r", "e"),
)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map.

    Printable Latin-1 bytes map to themselves; the other 68 bytes map to
    U+0100 onwards in byte order.  Byte-level BPE vocabularies (GPT-2,
    SmolLM2, Qwen2...) spell every token in this alphabet.
    """
    bs = (list(range(ord("!"), ord("~") + 1))
          + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tiny_vocab(n_vocab: int) -> tuple[list[str], list[int], list[str]]:
    """Tokens, token types and merges of the tiny byte-level vocabulary.

    Layout: ids 0..255 are the single bytes (token i is byte i, spelled with
    bytes_to_unicode), then the ChatML control tokens (type 3), then one token
    per merge in _MERGES (type 1), then "<unused_k>" fillers (type 5, unused).
    """
    n_fixed = 256 + len(SPECIAL_TOKENS)
    if n_vocab < n_fixed:
        raise ValueError(f"n_vocab must be >= {n_fixed} (256 bytes + {len(SPECIAL_TOKENS)} specials)")
    b2u = bytes_to_unicode()
    tokens = [b2u[i] for i in range(256)]
    types = [int(gguf.TokenType.NORMAL)] * 256
    tokens += list(SPECIAL_TOKENS)
    types += [int(gguf.TokenType.CONTROL)] * len(SPECIAL_TOKENS)
    merges: list[str] = []
    for a, b in _MERGES:
        if len(tokens) >= n_vocab:
            break
        tokens.append(a + b)
        types.append(int(gguf.TokenType.NORMAL))
        merges.append(f"{a} {b}")
    k = 0
    while len(tokens) < n_vocab:
        tokens.append(f"<unused_{k}>")
        types.append(int(gguf.TokenType.UNUSED))
        k += 1
    return tokens, types, merges


class TinyWeights(dict):
    """name -> float32 numpy array of the stored (dequantized) tensor values.

    `.hparams` holds the hyperparameters the file declares (the same names
    as reference.LlamaRef takes) and `.path` the file written.
    """
    hparams: dict[str, Any]
    path: str


def _f16(a):
    return np.asarray(a, dtype=np.float32).astype(np.float16)


def quantize_k(w: np.ndarray, qtype: QT) -> np.ndarray:
    """Quantize float32 rows (last axis a multiple of 256) to Q4_K, Q5_K or
    Q6_K blocks in ggml's byte layout; returns uint8 [..., row_bytes].

    A plain round-to-nearest quantizer (ggml searches scales harder); what
    matters for the tests is that the bytes are valid blocks: the stored
    values are read back with gguf.quants.dequantize.
    Q4_K/Q5_K: 8 sub-blocks of 32 with 6-bit scale sc and min m under f16 d,
    dmin: w = d*sc*q - dmin*m.  Q6_K: 16 sub-blocks of 16 with int8 scales
    under f16 d: w = d*sc*(q-32).
    """
    w = np.ascontiguousarray(w, dtype=np.float32)
    shp = w.shape
    if shp[-1] % 256:
        raise ValueError(f"K-quant rows must be multiples of 256, got {shp[-1]}")
    x = w.reshape(-1, 256).astype(np.float64)
    nb = x.shape[0]
    if qtype in (QT.Q4_K, QT.Q5_K):
        nmax = 15 if qtype == QT.Q4_K else 31
        sub = x.reshape(nb, 8, 32)
        mn = np.minimum(sub.min(axis=2), 0.0)                 # [nb, 8] <= 0
        mx = sub.max(axis=2)
        scale = (mx - mn) / nmax
        mins = -mn
        d = _f16(scale.max(axis=1) / 63.0).astype(np.float64)  # [nb]
        dmin = _f16(mins.max(axis=1) / 63.0).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            sc = np.where(d[:, None] > 0, np.rint(scale / d[:, None]), 0).clip(0, 63).astype(np.int64)
            m = np.where(dmin[:, None] > 0, np.rint(mins / dmin[:, None]), 0).clip(0, 63).astype(np.int64)
            dl = d[:, None] * sc
            ml = dmin[:, None] * m
            q = np.where(dl[:, :, None] > 0, np.rint((sub + ml[:, :, None]) / dl[:, :, None]), 0)
        q = q.clip(0, nmax).astype(np.uint8)                    # [nb, 8, 32]
        scales = np.zeros((nb, 12), np.uint8)
        for j in range(4):
            scales[:, j] = (sc[:, j] | ((sc[:, j + 4] >> 4) << 6)).astype(np.uint8)
            scales[:, j + 4] = (m[:, j] | ((m[:, j + 4] >> 4) << 6)).astype(np.uint8)
            scales[:, j + 8] = ((sc[:, j + 4] & 0xF) | ((m[:, j + 4] & 0xF) << 4)).astype(np.uint8)
        qs = np.zeros((nb, 128), np.uint8)
        for g in range(4):
            qs[:, 32 * g:32 * g + 32] = (q[:, 2 * g] & 0xF) | ((q[:, 2 * g + 1] & 0xF) << 4)
        parts = [_f16(d).view(np.uint8).reshape(nb, 2), _f16(dmin).view(np.uint8).reshape(nb, 2), scales]
        if qtype == QT.Q5_K:
            qh = np.zeros((nb, 32), np.uint8)
            for j in range(8):
                qh |= ((q[:, j] >> 4) & 1) << j
            parts.append(qh)
        parts.append(qs)
        out = np.concatenate(parts, axis=1)
    elif qtype == QT.Q6_K:
        sub = x.reshape(nb, 16, 16)
        amax = np.abs(sub).max(axis=2)                          # [nb, 16]
        s16 = amax / 31.0
        d = _f16(s16.max(axis=1) / 127.0).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            sc = np.where(d[:, None] > 0, np.rint(s16 / d[:, None]), 0).clip(-128, 127).astype(np.int64)
            dl = d[:, None] * sc
            q = np.where(dl[:, :, None] != 0, np.rint(sub / dl[:, :, None]), 0)
        q = (q.clip(-32, 31) + 32).astype(np.uint8).reshape(nb, 256)
        ql = np.zeros((nb, 128), np.uint8)
        qh = np.zeros((nb, 64), np.uint8)
        for h in range(2):
            for k in range(4):
                v = q[:, 128 * h + 32 * k:128 * h + 32 * k + 32]
                lo = 64 * h + (32 if k & 1 else 0)
                ql[:, lo:lo + 32] |= (v & 0xF) << (4 if k & 2 else 0)
                qh[:, 32 * h:32 * h + 32] |= ((v >> 4) & 3) << (2 * k)
        out = np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), _f16(d).view(np.uint8).reshape(nb, 2)], axis=1)
    else:
        raise ValueError(f"not a K-quant: {qtype!r}")
    row_blocks = shp[-1] // 256
    return np.ascontiguousarray(out.reshape(*shp[:-1], row_blocks * out.shape[1]))


def _store(name: str, w: np.ndarray, qtype: QT, writer: gguf.GGUFWriter) -> np.ndarray:
    """Quantize `w` (float32, numpy shape [rows, cols] or [experts, rows,
    cols]) to `qtype`, add it to the writer and return the dequantized
    float32 values that were written."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K):
        q = quantize_k(w, qtype)
        writer.add_tensor(name, q, raw_dtype=qtype)
        return quants.dequantize(q, qtype).astype(np.float32).reshape(w.shape)
    if qtype == QT.F32:
        writer.add_tensor(name, w)
        return w.copy()
    q = quants.quantize(w, qtype)
    if qtype == QT.F16:
        # quantize() returns a float16 array; the writer infers F16 from it.
        writer.add_tensor(name, q)
    else:
        # Byte array of whole blocks; raw_dtype makes the writer record the
        # element shape (quant_shape_from_byte_shape) and the type.
        writer.add_tensor(name, q, raw_dtype=qtype)
    d = quants.dequantize(q, qtype).astype(np.float32).reshape(w.shape)
    return d


def write_tiny_llama(path: str | os.PathLike, **kw) -> TinyWeights:
    """write_tiny_model(path, arch="llama", ...): the dense llama model."""
    return write_tiny_model(path, arch="llama", **kw)


def write_tiny_model(
    path: str | os.PathLike,
    *,
    arch: str = "llama",
    wtype: str = "F32",
    embd_type: str | None = None,
    n_vocab: int = 288,
    n_embd: int = 64,
    n_ff: int = 128,
    n_layer: int | None = None,
    n_head: int = 4,
    n_head_kv: int = 2,
    head_dim: int | None = None,
    n_expert: int = 8,
    n_expert_used: int = 2,
    n_ff_exp: int = 64,
    n_ff_shexp: int = 96,
    n_ctx: int = 256,
    n_swa: int = 8,
    rope_base: float | None = None,
    rope_scale: float | None = None,
    norm_eps: float = 1e-5,
    attn_out_gain: float = 0.4,
    ffn_down_gain: float = 0.3,
    tied: bool = True,
    seed: int = 0,
) -> TinyWeights:
    """Write a random GGUF of architecture `arch` to `path`; return the stored
    float32 weights.

    arch:       one of ARCHES.  llama: the dense llama block.  qwen2: + q/k/v
                biases, NeoX RoPE.  qwen3: + per-head RMSNorm of q and k
                (attn_q_norm / attn_k_norm [head_dim]) before RoPE, NeoX;
                head_dim may differ from n_embd / n_head (attention.key_length).
                qwen3moe: qwen3 attention + experts, top-k renormalised.
                olmoe: whole-projection q/k RMSNorm ([q_dim] / [kv_dim]) +
                experts, not renormalised.  qwen2moe: qwen2 attention +
                experts (not renormalised) + a shared expert with a sigmoid
                gate.  mixtral: arch "llama" with llama.expert_count > 0,
                top-k renormalised.  gemma3: per-head QK-norm, NeoX, the gemma
                block (embeddings * sqrt(n_embd), post-attention and post-FFN
                RMSNorms, GELU-tanh FFN), head_dim 32 by default (q_dim 128 !=
                n_embd), and a sliding window of n_swa positions on every
                layer but each 6th (7 layers by default: 0-4 and 6 local, 5
                global); add_bos_token true, as gemma asks.
    n_layer:    blocks (default 2; gemma3: 7, so both layer kinds occur).
    n_swa:      gemma3's attention.sliding_window (0: none, all layers global).
    rope_base:  rope.freq_base (default 10000; gemma3: 1e6, as the real file).
    wtype:      type of every 2-D matrix and expert tensor (attention, FFN,
                experts, output) — one of WTYPES or KQ_WTYPES (K-quants need
                n_embd, n_ff, n_ff_exp, q_dim multiples of 256).  The router
                (ffn_gate_inp) is always F32, as llama.cpp's quantizer keeps it.
    embd_type:  type of token_embd.weight (default: wtype).  When tied, the
                LM head is token_embd, so it is in this type too.
    n_vocab:    >= 259 (256 bytes + 3 ChatML specials); default 288 = 9*32.
    n_embd, n_ff, n_ff_exp, n_ff_shexp: multiples of 32.
    n_expert, n_expert_used, n_ff_exp: experts per layer, top-k, expert width
                (MoE archs only; mixtral/olmoe use n_ff_exp as their
                feed_forward_length).  n_ff_shexp: qwen2moe's shared expert.
    rope_scale: linear RoPE scaling *factor* (e.g. 4.0): positions are
                multiplied by 1/factor.  None writes no scaling keys.
    attn_out_gain, ffn_down_gain: gain of the matrices that write into the
                residual stream (attn_output; ffn_down and the experts' and
                shared expert's down projections).  Below 1 so that, as in a
                trained transformer, each block adds an update to a residual
                that it does not swamp; see "Conditioning" below.  1.0 gives
                the unit-gain model of earlier versions.
    tied:       True: no output.weight (LM head = token_embd).
    seed:       numpy RNG seed; same arguments -> byte-identical file.

    Conditioning.  Every matrix is drawn with entries N(0, gain^2 / n_in),
    so a projection keeps the scale of its (normalised) input.  With unit
    gain everywhere each attention and FFN block writes an update as large as
    the whole residual stream (the embeddings have rms 0.5), so the logits
    are a chain of ~5 matrix products per layer, each carrying the ~0.5%
    relative rounding of 8-bit activation blocks (llama.cpp's Q8_0/Q8_1
    design, used by the engine for quantized weights).  Measured, 2 layers,
    engine vs reference in test_reference's metric (max|d|/max|ref|, worst
    row, prompts of 1-64 tokens): 2.1-3.2% at unit gain.  A trained model is
    residual-dominated: blocks add comparatively small updates, and a tied
    model's logits are peaked (SmolLM2-135M: max|logit|/std ~8 over a README
    prompt, the random unit-gain model ~3.1-3.5).  attn_out_gain=0.4,
    ffn_down_gain=0.3 give that regime: the same metric drops to 0.8-1.1%
    (tied) and 1.4-1.7% (untied) with seed 0.
    The gains are a trade: a plausible implementation bug (RoPE pairing,
    base, scaling, norm epsilon, GQA head mapping) changes the blocks'
    output, so its effect on the logits shrinks with the gains as the
    rounding noise does; with these values every such bug still moves the
    logits by >= 0.21 (test_reference.test_tolerances_can_fail), an FFN with
    gate and up swapped by 0.33 and removing any one block's attention or FFN
    by >= 0.24.  Lower gains leave a floor (the LM head's own rounding,
    ~1% worst row for the flat untied head) while the bugs' effects keep
    shrinking, so they do not buy anything.  The Q/K gain stays 1: it sets
    attention scores of std ~1 (far from uniform, so a wrong mask or RoPE
    shows), and sharper scores amplify rounding faster than bugs' effects.
    """
    if arch not in ARCHES:
        raise ValueError(f"arch {arch!r} not in {ARCHES}")
    all_types = WTYPES + KQ_WTYPES
    if wtype not in all_types:
        raise ValueError(f"wtype {wtype!r} not in {all_types}")
    embd_type = embd_type or wtype
    if embd_type not in all_types:
        raise ValueError(f"embd_type {embd_type!r} not in {all_types}")
    moe = arch in ("qwen3moe", "olmoe", "qwen2moe", "mixtral")
    gemma = arch == "gemma3"
    file_arch = "llama" if arch == "mixtral" else arch
    qkv_bias = arch in ("qwen2", "qwen2moe")
    qk_norm = 1 if arch in ("qwen3", "qwen3moe", "gemma3") else 2 if arch == "olmoe" else 0
    if n_layer is None:
        n_layer = 7 if gemma else 2
    if gemma and head_dim is None:
        head_dim = 32
    if rope_base is None:  # gemma3's global layers: 1e6 (its local layers: 10000)
        rope_base = 1e6 if gemma else 10000.0
    neox = arch != "llama" and arch != "mixtral"
    shared = arch == "qwen2moe"
    if arch in ("olmoe", "mixtral"):
        n_ff = n_ff_exp          # these use feed_forward_length for the experts
    if n_embd % 32 or n_ff % 32 or (moe and (n_ff_exp % 32 or n_ff_shexp % 32)):
        raise ValueError("n_embd, n_ff, n_ff_exp, n_ff_shexp must be multiples of 32")
    if n_head % n_head_kv:
        raise ValueError("n_head % n_head_kv must be 0")
    explicit_hd = head_dim is not None
    if head_dim is None:
        if n_embd % n_head:
            raise ValueError("n_embd % n_head must be 0 (or give head_dim)")
        head_dim = n_embd // n_head
    if head_dim % 2:
        raise ValueError("head_dim must be even for RoPE")
    if moe and not 1 <= n_expert_used <= n_expert:
        raise ValueError("need 1 <= n_expert_used <= n_expert")
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    qt = QT[wtype]
    et = QT[embd_type]
    path = os.fspath(path)

    rng = np.random.default_rng(seed)

    def mat(n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:
        # 1/sqrt(n_in) keeps every projection's output at `gain` times its
        # input's scale, so the residual stream neither explodes nor vanishes
        # across layers.
        return (rng.standard_normal((n_out, n_in)) * (gain / np.sqrt(n_in))).astype(np.float32)

    def norm_w(n: int) -> np.ndarray:
        # Around 1, but not 1: a norm weight that is ignored must show.
        return (1.0 + 0.25 * rng.standard_normal(n)).astype(np.float32)

    w = TinyWeights()
    writer = gguf.GGUFWriter(path, file_arch)
    writer.add_name(f"tiny-{arch}-{wtype}{'' if tied else '-untied'}")
    writer.add_file_type(int(_FILE_TYPE[wtype]))
    writer.add_block_count(n_layer)
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    if explicit_hd:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(rope_base))
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(float(norm_eps))
    writer.add_vocab_size(n_vocab)
    if moe:
        writer.add_expert_count(n_expert)
        writer.add_expert_used_count(n_expert_used)
        if arch in ("qwen3moe", "qwen2moe"):
            writer.add_expert_feed_forward_length(n_ff_exp)
        if shared:
            writer.add_expert_shared_feed_forward_length(n_ff_shexp)
    if rope_scale is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope_scale))
    if gemma and n_swa:
        writer.add_sliding_window(int(n_swa))

    tokens, types, merges = tiny_vocab(n_vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm" if file_arch == "llama" else "qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(256)   # <|im_start|>, as in SmolLM2
    writer.add_eos_token_id(257)   # <|im_end|>
    writer.add_unk_token_id(258)   # <|endoftext|>
    writer.add_pad_token_id(257)
    writer.add_add_bos_token(gemma)
    writer.add_chat_template(CHATML_TEMPLATE)

    # Tensors, in llama.cpp's order.  Embedding rows have unit-ish norm; the
    # tied LM head then gives logits of a few units: peaked enough for a
    # clear argmax, flat enough that many tokens matter.
    w["token_embd.weight"] = _store(
        "token_embd.weight",
        rng.standard_normal((n_vocab, n_embd)).astype(np.float32) * np.float32(0.5),
        et, writer)
    for i in range(n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = _store(p + "attn_norm.weight", norm_w(n_embd), QT.F32, writer)
        # Unit Q/K gain gives attention scores of std ~1 after the
        # 1/sqrt(head_dim) scale: far from uniform (a wrong mask or RoPE
        # changes the output by far more than any tolerance) yet not so sharp
        # that the network amplifies rounding (Q/K gain 1.5 raised the
        # engine's error from 3.2% to 5.6% at unit output gains).  The output
        # projection's gain is attn_out_gain (see "Conditioning").
        w[p + "attn_q.weight"] = _store(p + "attn_q.weight", mat(q_dim, n_embd), qt, writer)
        w[p + "attn_k.weight"] = _store(p + "attn_k.weight", mat(kv_dim, n_embd), qt, writer)
        w[p + "attn_v.weight"] = _store(p + "attn_v.weight", mat(kv_dim, n_embd), qt, writer)
        if qkv_bias:
            for nm, dim in (("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)):
                b = (0.5 * rng.standard_normal(dim)).astype(np.float32)
                w[p + nm + ".bias"] = _store(p + nm + ".bias", b, QT.F32, writer)
        if qk_norm:
            w[p + "attn_q_norm.weight"] = _store(p + "attn_q_norm.weight",
                                                 norm_w(head_dim if qk_norm == 1 else q_dim), QT.F32, writer)
            w[p + "attn_k_norm.weight"] = _store(p + "attn_k_norm.weight",
                                                 norm_w(head_dim if qk_norm == 1 else kv_dim), QT.F32, writer)
        w[p + "attn_output.weight"] = _store(p + "attn_output.weight", mat(n_embd, q_dim, attn_out_gain), qt, writer)
        if gemma:
            # The post-norms set the scale of what a block adds.  The
            # residual starts at rms 0.5 * sqrt(n_embd) (scaled embeddings),
            # so gain * sqrt(n_embd) would keep each block's update in the
            # same proportion to it as attn_out_gain / ffn_down_gain do for
            # the other architectures (see "Conditioning"); seven blocks
            # instead of two accumulate more activation rounding (measured,
            # 17-token prompt, engine vs reference: Q8_0 2.7%, Q4_1 2.9%),
            # so half that: Q8_0 1.7%, Q4_1 1.4%, and every gemma feature
            # still moves the logits far beyond the float tolerance
            # (test_models_arch.test_reference_gemma3_features_matter).
            post_gain = 0.5 * np.sqrt(n_embd)
            w[p + "post_attention_norm.weight"] = _store(
                p + "post_attention_norm.weight", norm_w(n_embd) * np.float32(attn_out_gain * post_gain),
                QT.F32, writer)
        w[p + "ffn_norm.weight"] = _store(p + "ffn_norm.weight", norm_w(n_embd), QT.F32, writer)
        if not moe:
            w[p + "ffn_gate.weight"] = _store(p + "ffn_gate.weight", mat(n_ff, n_embd), qt, writer)
            w[p + "ffn_up.weight"] = _store(p + "ffn_up.weight", mat(n_ff, n_embd), qt, writer)
            w[p + "ffn_down.weight"] = _store(p + "ffn_down.weight", mat(n_embd, n_ff, ffn_down_gain), qt, writer)
            if gemma:
                w[p + "post_ffw_norm.weight"] = _store(
                    p + "post_ffw_norm.weight", norm_w(n_embd) * np.float32(ffn_down_gain * post_gain), QT.F32, writer)
            continue
        # Router with gain 2: routing probabilities well spread (clear top-k
        # most of the time) so a near-tie between the k-th and (k+1)-th
        # expert is rare.
        w[p + "ffn_gate_inp.weight"] = _store(p + "ffn_gate_inp.weight", mat(n_expert, n_embd, 2.0), QT.F32, writer)
        exps = lambda n_out, n_in, g=1.0: np.stack([mat(n_out, n_in, g) for _ in range(n_expert)])  # noqa: E731
        w[p + "ffn_gate_exps.weight"] = _store(p + "ffn_gate_exps.weight", exps(n_ff_exp, n_embd), qt, writer)
        w[p + "ffn_up_exps.weight"] = _store(p + "ffn_up_exps.weight", exps(n_ff_exp, n_embd), qt, writer)
        w[p + "ffn_down_exps.weight"] = _store(p + "ffn_down_exps.weight", exps(n_embd, n_ff_exp, ffn_down_gain), qt, writer)
        if shared:
            w[p + "ffn_gate_inp_shexp.weight"] = _store(p + "ffn_gate_inp_shexp.weight",
                                                        mat(1, n_embd, 2.0).reshape(n_embd), QT.F32, writer)
            w[p + "ffn_gate_shexp.weight"] = _store(p + "ffn_gate_shexp.weight", mat(n_ff_shexp, n_embd), qt, writer)
            w[p + "ffn_up_shexp.weight"] = _store(p + "ffn_up_shexp.weight", mat(n_ff_shexp, n_embd), qt, writer)
            w[p + "ffn_down_shexp.weight"] = _store(p + "ffn_down_shexp.weight", mat(n_embd, n_ff_shexp, ffn_down_gain), qt, writer)
    w["output_norm.weight"] = _store("output_norm.weight", norm_w(n_embd), QT.F32, writer)
    if not tied:
        w["output.weight"] = _store("output.weight", mat(n_vocab, n_embd, 4.0), qt, writer)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    w.hparams = dict(
        n_vocab=n_vocab, n_embd=n_embd, n_ff=n_ff, n_layer=n_layer,
        n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, n_rot=head_dim,
        # Floats as the file holds them (GGUF stores f32), so the reference
        # uses the same epsilon and frequencies as the engine.
        n_ctx_train=n_ctx, rope_base=float(np.float32(rope_base)),
        rope_freq_scale=float(1.0 / np.float32(rope_scale)) if rope_scale else 1.0,
        rope_neox=neox, norm_eps=float(np.float32(norm_eps)), tied=bool(tied),
        wtype=wtype, embd_type=embd_type, arch=arch,
        n_expert=n_expert if moe else 0, n_expert_used=n_expert_used if moe else 0,
        moe_norm_topk=file_arch in ("llama", "qwen3moe"),  # llama = Mixtral when it has experts
        gemma=gemma, n_swa=int(n_swa) if gemma else 0,
        swa_layers=[gemma and n_swa > 0 and l % 6 < 5 for l in range(n_layer)],
        rope_base_swa=10000.0, rope_freq_scale_swa=1.0,
        attn_scale=float(1.0 / np.sqrt(head_dim)), final_softcap=0.0,
    )
    w.path = path
    return w
