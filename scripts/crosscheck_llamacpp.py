#!/usr/bin/env python
"""Cross-check colibri-lab against llama.cpp (llama-cpp-python) on tiny random
GGUFs of every supported architecture and several weight types.

For each model: the same prompt (token ids) goes through llama.cpp and
through the engine; both decode greedily for N tokens.  The table reports
whether the greedy tokens agree, where they first diverge, and the
relative difference of the first decode step's logits
(max|a-b| / max|b|, llama.cpp as b).

    python scripts/crosscheck_llamacpp.py [--tokens 16] [--simd auto] [--out table.md]

Needs: gguf, llama-cpp-python (the `anchors` extra), the built colibri_lab.
Tiny models are random, so logits are flat-ish: a divergence after many
tokens at a near-tie is possible even between two correct engines; the
logit column tells a near-tie from a real mismatch.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from tinymodels import write_tiny_model  # noqa: E402

K256 = dict(n_embd=256, n_ff=512, n_ff_exp=256, embd_type="Q8_0")
CONFIGS = [
    ("llama", "F32", {}), ("llama", "Q8_0", {}), ("llama", "Q4_0", {}),
    ("qwen2", "F32", {}), ("qwen2", "Q8_0", {}),
    ("qwen3", "F32", {}), ("qwen3", "F32", dict(head_dim=32)),
    ("qwen3moe", "F32", {}), ("qwen3moe", "Q8_0", {}),
    # llama.cpp: olmoe's k_norm is [n_embd] (no GQA), olmoe and qwen2moe need output.weight
    ("olmoe", "F32", dict(tied=False, n_head_kv=4)), ("qwen2moe", "F32", dict(tied=False)), ("mixtral", "F32", {}),
    ("llama", "Q4_K", K256), ("llama", "Q5_K", K256), ("llama", "Q6_K", K256),
    ("qwen3moe", "Q4_K", K256),
    # 7 layers (0-4, 6 local with a window of 8, 5 global): 8 prompt + 16 greedy tokens pass the window
    ("gemma3", "F32", {}), ("gemma3", "Q8_0", {}), ("gemma3", "F32", dict(n_swa=4, n_layer=12)),
]


def llamacpp_greedy(path, prompt, n):
    import llama_cpp
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from colibri_lab import llama_anchor
    llama_anchor.configure()   # its extra buffer types off on AMX CPUs
    # logits_all: llama-cpp-python 0.3.36 fills .scores only for rows it keeps
    llm = llama_cpp.Llama(model_path=path, n_ctx=128, logits_all=True, verbose=False, n_threads=1)
    llm.eval(prompt)
    first = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
    out = []
    for _ in range(n):
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        t = int(np.argmax(logits))
        out.append(t)
        llm.eval([t])
    return out, first


def colibri_greedy(path, prompt, n, simd):
    from colibri_lab import _engine
    m = _engine.Model(path)
    e = _engine.Engine(m, n_slots=1, n_ctx=128, n_threads=1, simd=simd)
    logits = e.forward(0, prompt, 0)
    first = logits[-1].astype(np.float64)
    out, pos, last = [], len(prompt), logits[-1]
    for _ in range(n):
        t = int(np.argmax(last))
        out.append(t)
        last = e.forward(0, [t], pos)[-1]
        pos += 1
    return out, first


def one(i, tokens, simd, d):
    """Row of the table for CONFIGS[i] (run in a child process: a crash in
    llama.cpp on one file must not lose the others)."""
    arch, wt, kw = CONFIGS[i]
    label = arch + (f" hd={kw['head_dim']}" if "head_dim" in kw else "") + (" untied" if kw.get("tied") is False else "")
    path = os.path.join(d, f"m{i}.gguf")
    write_tiny_model(path, arch=arch, wtype=wt, seed=i, **kw)
    prompt = np.random.default_rng(i).integers(0, 256, 8).tolist()
    try:
        ref, ref_first = llamacpp_greedy(path, prompt, tokens)
    except Exception as e:  # llama.cpp refused the file
        return f"| {label} | {wt} | llama.cpp error: {type(e).__name__}: {str(e)[:60]} | | |", False
    got, first = colibri_greedy(path, prompt, tokens, simd)
    div = next((j for j, (x, y) in enumerate(zip(got, ref)) if x != y), None)
    rel = float(np.max(np.abs(first - ref_first)) / max(np.max(np.abs(ref_first)), 1e-30))
    return (f"| {label} | {wt} | {'yes' if div is None else 'no'} ({tokens} tokens) | "
            f"{'-' if div is None else div} | {rel:.2e} |"), div is None


def main(argv=None):
    import subprocess
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--simd", default="auto")
    ap.add_argument("--out", help="also write the markdown table here")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one is not None:
        row, ok = one(a.one, a.tokens, a.simd, a.dir)
        print(("OK " if ok else "NO ") + row)
        return 0
    rows = ["| arch | weights | greedy tokens equal | first divergence | first-step logits rel. diff |",
            "|---|---|---|---|---|"]
    n_ok = 0
    with tempfile.TemporaryDirectory() as d:
        for i, (arch, wt, kw) in enumerate(CONFIGS):
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", str(i), "--dir", d,
                                "--tokens", str(a.tokens), "--simd", a.simd], capture_output=True, text=True)
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith(("OK ", "NO "))), None)
            if line is None:
                rows.append(f"| {arch} | {wt} | crashed (exit {p.returncode}): {p.stderr.strip()[-80:]} | | |")
                continue
            n_ok += line.startswith("OK ")
            rows.append(line[3:])
    table = "\n".join(rows)
    print(table)
    print(f"\n{n_ok}/{len(CONFIGS)} models: identical greedy tokens")
    if a.out:
        with open(a.out, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
