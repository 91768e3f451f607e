"""The first position of a text, three ways: a float64 reference from the
dequantized GGUF weights, colibri-lab, and llama.cpp.

At the first position attention sees one key, so its output is that
position's V (Q and K do not enter) and the whole row is norms, projections
and the FFN: a float reference is a few matrix-vector products per layer.
Used for docs/bench/quality.md's Qwen2.5-Coder-1.5B position-0 outlier.
llama-family / qwen2 files (RMSNorm, SwiGLU, optional q/k/v biases).

    python scripts/quality_first_position.py --model qwen2.5-coder-1.5b
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_quality as bq  # noqa: E402

LLAMA_ROW = r"""
import json, sys, numpy as np
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=16, n_threads=2, logits_all=True, verbose=False)
llm.eval([int(sys.argv[2])])
np.save(sys.argv[3], np.asarray(llm.scores[0], dtype=np.float32))
"""


def reference_row(path: Path, token: int) -> np.ndarray:
    import gguf

    r = gguf.GGUFReader(str(path))
    T = {t.name: t for t in r.tensors}

    def field(key):
        f = r.fields[key]
        return f.parts[f.data[0]][0]

    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    n_layer = int(field(f"{arch}.block_count"))
    n_head, n_kv = int(field(f"{arch}.attention.head_count")), int(field(f"{arch}.attention.head_count_kv"))
    eps = float(field(f"{arch}.attention.layer_norm_rms_epsilon"))

    def W(name):
        t = T[name]
        if t.tensor_type.name == "F32":
            return np.asarray(t.data, dtype=np.float64).reshape(t.shape[::-1])
        return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(t.shape[::-1])

    def rms(v, w):
        return v / np.sqrt(np.mean(v * v) + eps) * w

    emb = T["token_embd.weight"]
    x = np.asarray(gguf.quants.dequantize(emb.data[token:token + 1], emb.tensor_type), dtype=np.float64).reshape(-1)
    for layer in range(n_layer):
        p = f"blk.{layer}."
        h = rms(x, W(p + "attn_norm.weight"))
        v = W(p + "attn_v.weight") @ h + (W(p + "attn_v.bias") if p + "attn_v.bias" in T else 0.0)
        hd = v.size // n_kv
        att = np.concatenate([v[(i // (n_head // n_kv)) * hd:(i // (n_head // n_kv) + 1) * hd] for i in range(n_head)])
        x = x + W(p + "attn_output.weight") @ att
        h = rms(x, W(p + "ffn_norm.weight"))
        g, u = W(p + "ffn_gate.weight") @ h, W(p + "ffn_up.weight") @ h
        x = x + W(p + "ffn_down.weight") @ (g / (1 + np.exp(-g)) * u)
    h = rms(x, W("output_norm.weight"))
    out = T["output.weight"] if "output.weight" in T else emb
    n_vocab = out.shape[1]
    return np.concatenate([np.asarray(gguf.quants.dequantize(out.data[i:i + 8192], out.tensor_type),
                                      dtype=np.float64).reshape(-1, x.size) @ h for i in range(0, n_vocab, 8192)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--text", default=str(bq.DEFAULT_TEXT), help="its first token is the one scored")
    ap.add_argument("--anchor-python", default="/work/venv-anchors/bin/python")
    a = ap.parse_args(argv)
    from colibri_lab.engine import Engine

    path = bq.resolve(a.model)
    eng = Engine(str(path), n_threads=2, n_ctx=64)
    token = eng.tokenize(Path(a.text).read_text(encoding="utf-8"), parse_special=False)[0]
    ours = eng.scheduler.call(lambda core: core.forward(0, [token], 0))[0].astype(np.float64)
    eng.close()
    out = Path("/tmp") / f"first_position_{path.stem}.npy"
    subprocess.run([a.anchor_python, "-c", LLAMA_ROW, str(path), str(token), str(out)], check=True)
    llama = np.load(out).astype(np.float64)
    ref = reference_row(path, token)
    lr = bq.log_softmax(ref[None])[0]
    rows = {}
    for name, lg in (("colibri-lab", ours), ("llama.cpp", llama)):
        lo = bq.log_softmax(lg[None])[0]
        rows[name] = {"kl_ref": float(np.sum(np.exp(lr) * (lr - lo))), "max_abs_dlogit": float(np.abs(lg - ref).max()),
                      "top3": np.argsort(-lg)[:3].tolist()}
    rows["float64 reference"] = {"top3": np.argsort(-ref)[:3].tolist()}
    print(json.dumps({"model": a.model, "token": int(token), **rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
