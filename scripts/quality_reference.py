"""Both engines against the exact forward: who is closer to the model?

bench_quality.py measures how far colibri-lab's logits fall from llama.cpp's.
That distance has two parts, our rounding error and llama.cpp's, and it
cannot tell them apart.  This script adds the third computation, the numpy
reference forward of tests/reference.py from the dequantized GGUF weights
(float32 or float64 arithmetic, no activation quantization, exact softmax),
and scores the same token ids of the same text with all three:

  top-1 vs ref     share of positions whose argmax equals the reference's
  KL(ref || x)     mean over positions, nats (full distributions)
  KL at 0          the first position alone (one key: norms, projections, FFN)
  ours vs llama    the top-1 agreement bench_quality.py reports

plus llama.cpp with flash attention (its other numerics) for scale, and the
reference in float32 against float64 on models small enough for both (the
reference's own rounding).

    python scripts/quality_reference.py --models smollm2 gemma3-270m
    python scripts/quality_reference.py --models qwen2.5-coder-1.5b --dtype float32

Run with the colibri-lab venv; the llama.cpp side runs in the anchors venv
(--anchor-python), as in bench_quality.py.  Memory: the reference holds every
weight dequantized (4 bytes per weight in float32, 8 in float64).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
import bench_quality as bq  # noqa: E402
from colibri_lab.experiments.numerics import kl_rows  # noqa: E402


def reference_logits(path: Path, ids: list, dtype: str) -> np.ndarray:
    from reference import LlamaRef

    ref = LlamaRef.from_gguf(path, dtype=np.dtype(dtype))
    out = ref.logits(ids)[: len(ids) - 1]
    del ref
    return np.asarray(out, dtype=np.float64)


def measure(name: str, text_path: Path, threads: int, dtypes: list, anchor_python: str) -> dict:
    from colibri_lab.engine import Engine

    path = bq.resolve(name)
    text = text_path.read_text(encoding="utf-8")
    eng = Engine(str(path), n_threads=threads, n_ctx=4096)
    ids = eng.tokenize(text, parse_special=False)
    add_bos = bool(ids) and eng.tokenizer.bos_id is not None and ids[0] == eng.tokenizer.bos_id
    ours = np.asarray(eng.score(ids, logits=True).logits, dtype=np.float64)
    eng.close()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {"model": str(path), "ids": ids, "threads": threads, "text": str(text_path),
               "add_bos": add_bos, "out": os.path.join(tmp, "llama")}
        cfg_path = os.path.join(tmp, "cfg.json")
        Path(cfg_path).write_text(json.dumps(cfg))
        subprocess.run([anchor_python, "-c", bq.LLAMA_SIDE, cfg_path], check=True)
        llama = np.load(cfg["out"] + ".npy").astype(np.float64)
        llama_fa = np.load(cfg["out"] + "_fa.npy").astype(np.float64)
    refs = {dt: reference_logits(path, ids, dt) for dt in dtypes}
    ref = refs[dtypes[-1]]                         # the most precise one asked for is the reference
    lp_ref = bq.log_softmax(ref)
    top_ref = ref.argmax(1)
    row = {"model": name, "file": path.name, "positions": int(ref.shape[0]), "reference": dtypes[-1]}
    engines = {"colibri-lab": ours, "llama.cpp": llama, "llama.cpp flash-attn": llama_fa}
    engines.update({f"reference {dt}": r for dt, r in refs.items() if dt != dtypes[-1]})
    for label, lg in engines.items():
        kl = kl_rows(lp_ref, bq.log_softmax(lg))
        row[label] = {"top1_vs_ref": float(np.mean(lg.argmax(1) == top_ref)),
                      "kl_ref_mean": float(kl.mean()), "kl_ref_p99": float(np.quantile(kl, 0.99)),
                      "kl_ref_first": float(kl[0]), "kl_ref_mean_without_first": float(kl[1:].mean())}
    row["ours_vs_llama_top1"] = float(np.mean(ours.argmax(1) == llama.argmax(1)))
    row["llama_fa_vs_llama_top1"] = float(np.mean(llama_fa.argmax(1) == llama.argmax(1)))
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(bq.DEFAULT_MODELS))
    ap.add_argument("--text", type=Path, default=bq.DEFAULT_TEXT)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", nargs="+", default=["float64"], choices=["float32", "float64"],
                    help="reference arithmetic; with two, the last is the reference and the first is compared to it")
    ap.add_argument("--anchor-python", default="/work/venv-anchors/bin/python")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    a = ap.parse_args(argv)
    dtypes = sorted(set(a.dtype), key=["float32", "float64"].index)
    rows = []
    for name in a.models:
        row = measure(name, a.text, a.threads, dtypes, a.anchor_python)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\nCPU: {bq.cpu_model()}\n")
    print("| model | engine | top-1 vs reference | KL(ref \\|\\| x) mean | p99 | at position 0 | mean without 0 |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        for label, v in row.items():
            if isinstance(v, dict):
                print(f"| {row['model']} | {label} | {v['top1_vs_ref'] * 100:.1f}% | {v['kl_ref_mean']:.5f} | "
                      f"{v['kl_ref_p99']:.4f} | {v['kl_ref_first']:.4f} | {v['kl_ref_mean_without_first']:.5f} |")
        print(f"| {row['model']} | ours vs llama.cpp top-1 | {row['ours_vs_llama_top1'] * 100:.1f}% "
              f"(llama.cpp flash vs default {row['llama_fa_vs_llama_top1'] * 100:.1f}%) | | | | |")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
