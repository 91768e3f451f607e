"""Independent numpy reference forward for the llama architecture.

Written from the model's math, not from the engine's code, in float64 so that
its own rounding is negligible next to the engine's float32 arithmetic:

    x   = token_embd[tokens]
    for each block:
        h  = rmsnorm(x) * attn_norm
        q, k, v = Wq h, Wk h, Wv h            (split into heads)
        q, k = rope(q, pos), rope(k, pos)
        a  = softmax(q k^T / sqrt(head_dim) + causal mask) v    (GQA: query
             head j reads key/value head j // (n_head / n_head_kv))
        x  = x + Wo a
        h  = rmsnorm(x) * ffn_norm
        x  = x + Wdown (silu(Wgate h) * Wup h)
    logits = Wout (rmsnorm(x) * output_norm)   (Wout = token_embd when tied)

rmsnorm(x) = x / sqrt(mean(x^2) + eps).

RoPE rotates pairs of each head's first n_rot dims by theta = p * s * base^(-2i/n_rot)
for pair i at position p with linear scale s (= 1/factor).  The pairs are
(2i, 2i+1) in ggml's mode 0 ("normal", the llama architecture's GGUF layout)
and (i, i + n_rot/2) in NeoX mode (qwen2 and others).

Architecture variants (switched on by which tensors the weights hold):
  - q/k/v biases (qwen2): q = Wq h + bq, ...;
  - QK-norm (qwen3, olmoe): q, k = rmsnorm(q) * q_norm, rmsnorm(k) * k_norm
    before RoPE, per head when the norm weight has head_dim entries (qwen3),
    over the whole projection when it has q_dim / kv_dim (olmoe);
  - the gemma block (gemma3; hparam gemma=True): x = token_embd[tokens] *
    sqrt(n_embd); the attention and FFN outputs are RMSNormed with
    post_attention_norm / post_ffw_norm before they are added to x; the FFN is
    Wdown (gelu(Wgate h) * Wup h) with gelu's tanh form
        gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));
    scores are scaled by attn_scale (1/sqrt(head_dim) unless given); and with
    a sliding window n_swa > 0 the local layers (swa_layers[l]) attend only
    to positions j > pos - n_swa and rotate with their own RoPE base and
    scale (rope_base_swa, rope_freq_scale_swa); logits are soft-capped,
    c * tanh(logits / c), when final_softcap > 0;
  - mixture of experts (qwen3moe, olmoe, qwen2moe, mixtral): the FFN becomes
        p = softmax(Wr h) ; E = the n_expert_used largest p (stable order)
        w_e = p_e, divided by sum_E p when moe_norm_topk (qwen3moe, mixtral)
        out = sum_{e in E} w_e * Wd_e (silu(Wg_e h) * Wu_e h)
    plus, with a shared expert (qwen2moe), sigmoid(g . h) * FFN_shexp(h).

Weights are numpy arrays [n_out, n_in] (y = W @ x; experts [n_expert, n_out,
n_in]), as returned by tinymodels.write_tiny_model() or read back from a GGUF
by LlamaRef.from_gguf().
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

__all__ = ["LlamaRef", "KVCache", "rms_norm", "rope", "silu", "gelu_tanh", "softmax",
           "quantize_q8_0_rows", "read_gguf"]


# ------------------------------------------------------------------ pieces

def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def gemma3_swa_layers(n_layer: int) -> list:
    """Which gemma3 layers are local: all but every 6th (llama.cpp's
    set_swa_pattern(6): layer l is local iff l % 6 < 5)."""
    return [l % 6 < 5 for l in range(n_layer)]


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def rope(x: np.ndarray, pos: np.ndarray, *, n_rot: int, base: float,
         freq_scale: float = 1.0, neox: bool = False) -> np.ndarray:
    """Rotary position embedding.

    x: [n_tokens, n_heads, head_dim]; pos: [n_tokens] absolute positions.
    Rotates the first n_rot dims of every head; later dims pass through.
    neox=False: pairs (2i, 2i+1); neox=True: pairs (i, i + n_rot/2).
    """
    if n_rot % 2 or n_rot > x.shape[-1]:
        raise ValueError(f"bad n_rot {n_rot} for head_dim {x.shape[-1]}")
    half = n_rot // 2
    i = np.arange(half, dtype=np.float64)
    inv_freq = base ** (-2.0 * i / n_rot)                              # [half]
    theta = np.asarray(pos, dtype=np.float64)[:, None] * freq_scale * inv_freq  # [n, half]
    cos = np.cos(theta)[:, None, :]                                    # [n, 1, half]
    sin = np.sin(theta)[:, None, :]
    out = np.array(x, copy=True)
    if neox:
        x0, x1 = x[..., :half], x[..., half:n_rot]
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half:n_rot] = x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = x0 * cos - x1 * sin
        out[..., 1:n_rot:2] = x0 * sin + x1 * cos
    return out


def quantize_q8_0_rows(x: np.ndarray) -> np.ndarray:
    """Round-trip activations through Q8_0 (blocks of 32, fp16 scale amax/127).

    Not part of the model: an optional emulation of what a CPU engine does to
    activations before an integer dot product with quantized weights, used to
    study how far that moves logits.  Returns an array like x.
    """
    shp = x.shape
    b = np.asarray(x, dtype=np.float32).reshape(-1, 32)
    amax = np.max(np.abs(b), axis=1, keepdims=True)
    d = (amax / 127.0).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(d == 0, 0.0, 1.0 / d)
    y = b * inv
    q = np.clip(np.sign(y) * np.floor(np.abs(y) + 0.5), -127, 127)  # roundf: half away from zero
    d16 = d.astype(np.float16).astype(np.float64)
    return (q * d16).reshape(shp).astype(x.dtype, copy=False)


# ------------------------------------------------------------------ cache

@dataclass
class KVCache:
    """Keys (after RoPE) and values of one sequence.

    k[l], v[l]: [n_ctx, n_head_kv, head_dim] float64 for layer l.
    n: positions filled (0..n-1).
    """
    k: list
    v: list
    n: int = 0
    tokens: list = field(default_factory=list)  # token at each filled position


# ------------------------------------------------------------------ model

class LlamaRef:
    """The reference model.  `forward(tokens, start_pos, cache)` gives logits
    [len(tokens), n_vocab] in float64 and extends the cache."""

    def __init__(self, weights: dict, *, n_head: int, n_head_kv: int,
                 norm_eps: float, rope_base: float, rope_freq_scale: float = 1.0,
                 rope_neox: bool = False, head_dim: int | None = None,
                 n_rot: int | None = None, n_layer: int | None = None,
                 act_q8: bool = False, kv_f16: bool = False, dtype=np.float64,
                 n_expert_used: int = 0, moe_norm_topk: bool = True,
                 gemma: bool = False, n_swa: int = 0, swa_layers=None,
                 rope_base_swa: float = 10000.0, rope_freq_scale_swa: float = 1.0,
                 attn_scale: float | None = None, final_softcap: float = 0.0, **_ignored):
        """weights: name -> array (GGUF tensor names, numpy shape [n_out, n_in]).
        act_q8: emulate Q8_0 activation rounding before every matrix product
        (emulates a CPU engine's integer dot products; off for the reference
        proper).  kv_f16: store keys and values rounded to f16, the values an
        engine's f16 KV cache holds (a storage format, like the weights'
        stored values).  dtype: float64 for tiny models; float32 halves the memory
        of a real model (SmolLM2: ~0.5 GB instead of ~1 GB)."""
        self.kv_f16 = bool(kv_f16)
        self.dtype = np.dtype(dtype)
        f = lambda a: np.asarray(a, dtype=self.dtype)  # noqa: E731
        self.embd = f(weights["token_embd.weight"])            # [n_vocab, n_embd]
        self.n_vocab, self.n_embd = self.embd.shape
        self.n_head = int(n_head)
        self.n_head_kv = int(n_head_kv)
        if self.n_head % self.n_head_kv:
            raise ValueError("n_head must be a multiple of n_head_kv")
        self.head_dim = int(head_dim or self.n_embd // self.n_head)
        self.n_rot = int(n_rot or self.head_dim)
        self.norm_eps = float(norm_eps)
        self.rope_base = float(rope_base)
        self.rope_freq_scale = float(rope_freq_scale)
        self.rope_neox = bool(rope_neox)
        self.act_q8 = bool(act_q8)
        self.gemma = bool(gemma)
        self.n_swa = int(n_swa)
        self.rope_base_swa = float(rope_base_swa)
        self.rope_freq_scale_swa = float(rope_freq_scale_swa)
        self.attn_scale = float(attn_scale) if attn_scale else 1.0 / np.sqrt(self.head_dim)
        self.final_softcap = float(final_softcap)
        if n_layer is None:
            n_layer = 0
            while f"blk.{n_layer}.attn_norm.weight" in weights:
                n_layer += 1
        self.n_layer = int(n_layer)
        optional = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_q_norm.weight",
                    "post_attention_norm.weight", "post_ffw_norm.weight",
                    "attn_k_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
                    "ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight",
                    "ffn_down_exps.weight", "ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight",
                    "ffn_up_shexp.weight", "ffn_down_shexp.weight")
        names = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm")
        self.layers = []
        for i in range(self.n_layer):
            L = {n: f(weights[f"blk.{i}.{n}.weight"]) for n in names}
            for n in optional:
                if f"blk.{i}.{n}" in weights:
                    L[n.removesuffix(".weight")] = f(weights[f"blk.{i}.{n}"])
            self.layers.append(L)
        if swa_layers is None:
            swa_layers = gemma3_swa_layers(self.n_layer) if self.n_swa > 0 else [False] * self.n_layer
        self.swa_layers = [bool(v) and self.n_swa > 0 for v in swa_layers]
        if len(self.swa_layers) != self.n_layer:
            raise ValueError("swa_layers needs one entry per layer")
        if self.gemma and any("post_attention_norm" not in L or "post_ffw_norm" not in L for L in self.layers):
            raise ValueError("a gemma model needs post_attention_norm and post_ffw_norm in every layer")
        self.moe = "ffn_gate_inp" in self.layers[0] if self.layers else False
        self.n_expert_used = int(n_expert_used)
        self.moe_norm_topk = bool(moe_norm_topk)
        if self.moe and not 1 <= self.n_expert_used <= self.layers[0]["ffn_gate_inp"].shape[0]:
            raise ValueError("a MoE model needs 1 <= n_expert_used <= n_expert")
        # per forward: (layer, row) -> experts chosen, for tests that compare routing
        self.last_routes: dict = {}
        self.output_norm = f(weights["output_norm.weight"])
        self.tied = "output.weight" not in weights
        self.output = self.embd if self.tied else f(weights["output.weight"])
        # Shape checks: a wrong layout must fail here, not silently broadcast.
        qd, kvd = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        for i, L in enumerate(self.layers):
            want = {"attn_q": (qd, self.n_embd), "attn_k": (kvd, self.n_embd),
                    "attn_v": (kvd, self.n_embd), "attn_output": (self.n_embd, qd),
                    "attn_norm": (self.n_embd,), "ffn_norm": (self.n_embd,)}
            if not self.moe:
                want.update({"ffn_gate": (L["ffn_up"].shape[0], self.n_embd),
                             "ffn_down": (self.n_embd, L["ffn_up"].shape[0])})
            else:
                ne, ff = L["ffn_gate_inp"].shape[0], L["ffn_up_exps"].shape[1]
                want.update({"ffn_gate_inp": (ne, self.n_embd), "ffn_gate_exps": (ne, ff, self.n_embd),
                             "ffn_up_exps": (ne, ff, self.n_embd), "ffn_down_exps": (ne, self.n_embd, ff)})
            if "attn_q.bias" in L:
                want.update({"attn_q.bias": (qd,), "attn_k.bias": (kvd,), "attn_v.bias": (kvd,)})
            if "attn_q_norm" in L:
                whole = L["attn_q_norm"].shape[0] != self.head_dim or qd == self.head_dim
                want.update({"attn_q_norm": (qd,) if whole else (self.head_dim,),
                             "attn_k_norm": (kvd,) if whole else (self.head_dim,)})
            for n, shp in want.items():
                if L[n].shape != shp:
                    raise ValueError(f"blk.{i}.{n}.weight has shape {L[n].shape}, want {shp}")
        if self.output.shape != (self.n_vocab, self.n_embd):
            raise ValueError(f"LM head shape {self.output.shape}")

    # -- constructors

    @classmethod
    def from_tiny(cls, weights, **overrides) -> "LlamaRef":
        """From tinymodels.write_tiny_llama()'s return value."""
        hp = dict(weights.hparams)
        hp.update(overrides)
        return cls(weights, **hp)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike, **overrides) -> "LlamaRef":
        """Read any llama-architecture GGUF (dequantizing every tensor)."""
        weights, hp = read_gguf(path)
        hp.update(overrides)
        return cls(weights, **hp)

    # -- forward

    def new_cache(self, n_ctx: int) -> KVCache:
        shp = (n_ctx, self.n_head_kv, self.head_dim)
        return KVCache(k=[np.zeros(shp, self.dtype) for _ in range(self.n_layer)],
                       v=[np.zeros(shp, self.dtype) for _ in range(self.n_layer)])

    def _mm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        if self.act_q8:
            x = quantize_q8_0_rows(x)
        return x @ w.T

    def forward(self, tokens, start_pos: int, cache: KVCache) -> np.ndarray:
        """Run `tokens` at positions start_pos.. and return logits [n, n_vocab].

        Positions < start_pos of `cache` are kept; later ones are overwritten
        (the same contract as cb_engine_forward).
        """
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n = tokens.shape[0]
        if n == 0:
            raise ValueError("no tokens")
        if start_pos < 0 or start_pos > cache.n:
            raise ValueError(f"start_pos {start_pos} outside the cache's 0..{cache.n}")
        n_ctx = cache.k[0].shape[0] if self.n_layer else 1 << 30
        if start_pos + n > n_ctx:
            raise ValueError("context full")
        if tokens.min() < 0 or tokens.max() >= self.n_vocab:
            raise ValueError("token id out of range")
        pos = np.arange(start_pos, start_pos + n)
        n_kv = start_pos + n
        hd, nh, nkv = self.head_dim, self.n_head, self.n_head_kv
        group = nh // nkv
        # mask[i, j]: query at position pos[i] may read key position j <= pos[i]
        mask = np.arange(n_kv)[None, :] <= pos[:, None]              # [n, n_kv]
        # local layers: only the last n_swa positions (j > pos[i] - n_swa)
        mask_swa = mask & (np.arange(n_kv)[None, :] > pos[:, None] - self.n_swa)

        x = self.embd[tokens]                                          # [n, n_embd]
        if self.gemma:
            x = x * np.sqrt(self.n_embd)
        for li, L in enumerate(self.layers):
            local = self.swa_layers[li]
            h = rms_norm(x, L["attn_norm"], self.norm_eps)
            q = self._mm(h, L["attn_q"])
            k = self._mm(h, L["attn_k"])
            v = self._mm(h, L["attn_v"])
            if "attn_q.bias" in L:
                q, k, v = q + L["attn_q.bias"], k + L["attn_k.bias"], v + L["attn_v.bias"]
            if "attn_q_norm" in L and L["attn_q_norm"].shape[0] != hd:   # whole projection (olmoe)
                q = rms_norm(q, L["attn_q_norm"], self.norm_eps)
                k = rms_norm(k, L["attn_k_norm"], self.norm_eps)
            q = q.reshape(n, nh, hd)
            k = k.reshape(n, nkv, hd)
            v = v.reshape(n, nkv, hd)
            if "attn_q_norm" in L and L["attn_q_norm"].shape[0] == hd:   # per head (qwen3)
                q = rms_norm(q, L["attn_q_norm"], self.norm_eps)
                k = rms_norm(k, L["attn_k_norm"], self.norm_eps)
            rk = dict(n_rot=self.n_rot, base=self.rope_base_swa if local else self.rope_base,
                      freq_scale=self.rope_freq_scale_swa if local else self.rope_freq_scale,
                      neox=self.rope_neox)
            q = rope(q, pos, **rk)
            k = rope(k, pos, **rk)
            if self.kv_f16:
                k, v = k.astype(np.float16), v.astype(np.float16)
            cache.k[li][start_pos:n_kv] = k
            cache.v[li][start_pos:n_kv] = v
            K = cache.k[li][:n_kv]                                     # [n_kv, nkv, hd]
            V = cache.v[li][:n_kv]
            # Broadcast each KV head to its group of query heads.
            Kh = np.repeat(K, group, axis=1)                          # [n_kv, nh, hd]
            Vh = np.repeat(V, group, axis=1)
            s = np.einsum("ihd,jhd->hij", q, Kh) * self.attn_scale     # [nh, n, n_kv]
            s = np.where((mask_swa if local else mask)[None], s, -np.inf)
            p = softmax(s, axis=-1)
            a = np.einsum("hij,jhd->ihd", p, Vh).reshape(n, nh * hd)
            o = self._mm(a, L["attn_output"])
            if self.gemma:
                o = rms_norm(o, L["post_attention_norm"], self.norm_eps)
            x = x + o
            h = rms_norm(x, L["ffn_norm"], self.norm_eps)
            if self.moe:
                x = x + self._moe(li, L, h)
                continue
            g = self._mm(h, L["ffn_gate"])
            u = self._mm(h, L["ffn_up"])
            o = self._mm((gelu_tanh(g) if self.gemma else silu(g)) * u, L["ffn_down"])
            if self.gemma:
                o = rms_norm(o, L["post_ffw_norm"], self.norm_eps)
            x = x + o
        cache.n = n_kv
        cache.tokens = list(cache.tokens[:start_pos]) + tokens.tolist()
        h = rms_norm(x, self.output_norm, self.norm_eps)
        logits = self._mm(h, self.output)
        if self.final_softcap > 0:
            logits = self.final_softcap * np.tanh(logits / self.final_softcap)
        return logits

    def _moe(self, li: int, L: dict, h: np.ndarray) -> np.ndarray:
        """Mixture-of-experts FFN of layer li over rows h [n, n_embd]."""
        p = softmax(self._mm(h, L["ffn_gate_inp"]), axis=-1)          # [n, n_expert]
        out = np.zeros_like(h)
        for r in range(h.shape[0]):
            sel = np.argsort(-p[r], kind="stable")[:self.n_expert_used]
            w = p[r, sel]
            if self.moe_norm_topk:
                w = w / w.sum()
            self.last_routes[(li, r)] = sel.tolist()
            for e, we in zip(sel, w):
                g = self._mm(h[r:r + 1], L["ffn_gate_exps"][e])
                u = self._mm(h[r:r + 1], L["ffn_up_exps"][e])
                out[r] += we * self._mm(silu(g) * u, L["ffn_down_exps"][e])[0]
        if "ffn_gate_shexp" in L:
            gate = 1.0 / (1.0 + np.exp(-(h @ L["ffn_gate_inp_shexp"])))  # [n]
            g = self._mm(h, L["ffn_gate_shexp"])
            u = self._mm(h, L["ffn_up_shexp"])
            out = out + gate[:, None] * self._mm(silu(g) * u, L["ffn_down_shexp"])
        return out

    def logits(self, tokens, n_ctx: int | None = None) -> np.ndarray:
        """Prefill `tokens` from position 0 in a fresh cache."""
        cache = self.new_cache(n_ctx or len(tokens))
        return self.forward(tokens, 0, cache)


# ------------------------------------------------------------------ GGUF

def _field_value(field):
    """Value of a GGUFReader field (scalar, string or list)."""
    from gguf import GGUFValueType
    if hasattr(field, "contents"):
        return field.contents()
    t = field.types[0]
    if t == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    if t == GGUFValueType.ARRAY:
        return [field.parts[i].tolist() for i in field.data]
    return field.parts[field.data[0]].tolist()[0]


def read_gguf(path) -> tuple[dict, dict]:
    """(weights name -> float32 [n_out, n_in], hparams) of a llama GGUF."""
    from gguf import GGUFReader, GGMLQuantizationType as QT, quants

    r = GGUFReader(os.fspath(path))
    meta = {k: f for k, f in r.fields.items()}

    def get(key, default=None):
        return _field_value(meta[key]) if key in meta else default

    arch = get("general.architecture")
    if arch not in ("llama", "qwen2", "qwen3", "qwen3moe", "olmoe", "qwen2moe", "gemma3"):
        raise ValueError(f"reference supports llama, qwen2, qwen3, qwen3moe, olmoe, qwen2moe, gemma3; file has {arch!r}")
    a = arch
    n_embd = int(get(f"{a}.embedding_length"))
    n_head = int(get(f"{a}.attention.head_count"))
    head_dim = int(get(f"{a}.attention.key_length", n_embd // n_head))
    scale = 1.0
    if get(f"{a}.rope.scaling.type") == "linear":
        scale = float(1.0 / np.float32(get(f"{a}.rope.scaling.factor", 1.0)))
    hp = dict(
        n_layer=int(get(f"{a}.block_count")),
        n_head=n_head,
        n_head_kv=int(get(f"{a}.attention.head_count_kv", n_head)),
        head_dim=head_dim,
        n_rot=int(get(f"{a}.rope.dimension_count", head_dim)),
        norm_eps=float(np.float32(get(f"{a}.attention.layer_norm_rms_epsilon", 1e-5))),
        rope_base=float(np.float32(get(f"{a}.rope.freq_base", 10000.0))),
        rope_freq_scale=scale,
        rope_neox=arch != "llama",
        n_expert_used=int(get(f"{a}.expert_used_count", 0)),
        moe_norm_topk=arch in ("llama", "qwen3moe"),
    )
    if arch == "gemma3":
        # llama.cpp's gemma3 hparams: every 6th layer global, local RoPE base
        # 10000 unscaled, query scale 1/sqrt(key_length) (27B, 62 blocks:
        # 1/sqrt(n_embd / n_head)), embeddings times sqrt(n_embd).
        n_swa = int(get(f"{a}.attention.sliding_window", 0))
        hp.update(gemma=True, n_swa=n_swa, swa_layers=gemma3_swa_layers(hp["n_layer"]) if n_swa else None,
                  rope_base_swa=10000.0, rope_freq_scale_swa=1.0,
                  attn_scale=1.0 / np.sqrt(n_embd // n_head if hp["n_layer"] == 62 else head_dim),
                  final_softcap=float(get(f"{a}.final_logit_softcapping", 0.0)))
    weights = {}
    for t in r.tensors:
        qt = QT(int(t.tensor_type))
        shape = tuple(int(d) for d in reversed(t.shape))   # ne reversed = numpy order
        if qt == QT.F32:
            a = np.asarray(t.data, dtype=np.float32)
        elif qt == QT.F16:
            a = np.asarray(t.data).view(np.float16).astype(np.float32)
        else:
            a = quants.dequantize(np.asarray(t.data).view(np.uint8), qt)
        weights[t.name] = np.asarray(a, dtype=np.float32).reshape(shape)
    return weights, hp
