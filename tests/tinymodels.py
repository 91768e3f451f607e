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
    "bytes_to_unicode",
    "tiny_vocab",
    "write_tiny_llama",
    "TinyWeights",
    "CHATML_TEMPLATE",
]

# Weight types the tests exercise, by GGUF type name.
WTYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")

# general.file_type (llama_ftype) that llama.cpp writes for a model whose
# matrices are mostly of this type.
_FILE_TYPE = {
    "F32": gguf.LlamaFileType.ALL_F32,
    "F16": gguf.LlamaFileType.MOSTLY_F16,
    "BF16": gguf.LlamaFileType.MOSTLY_BF16,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
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


def _store(name: str, w: np.ndarray, qtype: QT, writer: gguf.GGUFWriter) -> np.ndarray:
    """Quantize `w` (float32, numpy shape [rows, cols]) to `qtype`, add it to
    the writer and return the dequantized float32 values that were written."""
    w = np.ascontiguousarray(w, dtype=np.float32)
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


def write_tiny_llama(
    path: str | os.PathLike,
    *,
    wtype: str = "F32",
    embd_type: str | None = None,
    n_vocab: int = 288,
    n_embd: int = 64,
    n_ff: int = 128,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ctx: int = 256,
    rope_base: float = 10000.0,
    rope_scale: float | None = None,
    norm_eps: float = 1e-5,
    tied: bool = True,
    seed: int = 0,
) -> TinyWeights:
    """Write a random llama GGUF to `path`; return the stored float32 weights.

    wtype:      type of every 2-D matrix (attention, FFN, output) — one of WTYPES.
    embd_type:  type of token_embd.weight (default: wtype).  When tied, the
                LM head is token_embd, so it is in this type too.
    n_vocab:    >= 259 (256 bytes + 3 ChatML specials); default 288 = 9*32.
    n_embd, n_ff: multiples of 32 (quantized blocks hold 32 elements).
    rope_scale: linear RoPE scaling *factor* (e.g. 4.0): positions are
                multiplied by 1/factor.  None writes no scaling keys.
    tied:       True: no output.weight (LM head = token_embd).
    seed:       numpy RNG seed; same arguments -> byte-identical file.
    """
    if wtype not in WTYPES:
        raise ValueError(f"wtype {wtype!r} not in {WTYPES}")
    embd_type = embd_type or wtype
    if embd_type not in WTYPES:
        raise ValueError(f"embd_type {embd_type!r} not in {WTYPES}")
    if n_embd % 32 or n_ff % 32:
        raise ValueError("n_embd and n_ff must be multiples of 32")
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd % n_head and n_head % n_head_kv must be 0")
    head_dim = n_embd // n_head
    if head_dim % 2:
        raise ValueError("head_dim must be even for RoPE")
    qt = QT[wtype]
    et = QT[embd_type]
    path = os.fspath(path)

    rng = np.random.default_rng(seed)

    def mat(n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:
        # 1/sqrt(n_in) keeps every projection's output at unit scale, so the
        # residual stream neither explodes nor vanishes across layers and
        # logits stay well spread (distinct argmax per row).
        return (rng.standard_normal((n_out, n_in)) * (gain / np.sqrt(n_in))).astype(np.float32)

    def norm_w(n: int) -> np.ndarray:
        # Around 1, but not 1: a norm weight that is ignored must show.
        return (1.0 + 0.25 * rng.standard_normal(n)).astype(np.float32)

    w = TinyWeights()
    writer = gguf.GGUFWriter(path, "llama")
    arch = "llama"
    writer.add_name(f"tiny-llama-{wtype}{'' if tied else '-untied'}")
    writer.add_file_type(int(_FILE_TYPE[wtype]))
    writer.add_block_count(n_layer)
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_freq_base(float(rope_base))
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(float(norm_eps))
    writer.add_vocab_size(n_vocab)
    if rope_scale is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope_scale))

    tokens, types, merges = tiny_vocab(n_vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(256)   # <|im_start|>, as in SmolLM2
    writer.add_eos_token_id(257)   # <|im_end|>
    writer.add_unk_token_id(258)   # <|endoftext|>
    writer.add_pad_token_id(257)
    writer.add_add_bos_token(False)
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
        # Unit gain gives attention scores of std ~1 after the 1/sqrt(head_dim)
        # scale: far from uniform (a wrong mask or RoPE changes the output by
        # far more than any tolerance) yet not so sharp that the network
        # amplifies rounding: with gain 2, emulated Q8_0 activation rounding
        # moved logits by ~10%, with gain 1 by ~3%.
        w[p + "attn_q.weight"] = _store(p + "attn_q.weight", mat(n_embd, n_embd), qt, writer)
        w[p + "attn_k.weight"] = _store(p + "attn_k.weight", mat(n_head_kv * head_dim, n_embd), qt, writer)
        w[p + "attn_v.weight"] = _store(p + "attn_v.weight", mat(n_head_kv * head_dim, n_embd), qt, writer)
        w[p + "attn_output.weight"] = _store(p + "attn_output.weight", mat(n_embd, n_embd), qt, writer)
        w[p + "ffn_norm.weight"] = _store(p + "ffn_norm.weight", norm_w(n_embd), QT.F32, writer)
        w[p + "ffn_gate.weight"] = _store(p + "ffn_gate.weight", mat(n_ff, n_embd), qt, writer)
        w[p + "ffn_up.weight"] = _store(p + "ffn_up.weight", mat(n_ff, n_embd), qt, writer)
        w[p + "ffn_down.weight"] = _store(p + "ffn_down.weight", mat(n_embd, n_ff), qt, writer)
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
        rope_neox=False, norm_eps=float(np.float32(norm_eps)), tied=bool(tied),
        wtype=wtype, embd_type=embd_type,
    )
    w.path = path
    return w
