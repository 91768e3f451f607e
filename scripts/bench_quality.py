"""Quality against llama.cpp: perplexity and teacher-forced top-1 agreement.

For each model, the same token ids (our tokenizer, BOS where the model asks
for it; llama.cpp's own tokenization of the text is compared and reported) are
scored by colibri-lab's Engine.score (the batched prefill, logits for every
position) and by llama.cpp (llama-cpp-python with logits_all=True, run in a
subprocess from the anchors venv).  Reported per model:

  ppl ours / ppl llama.cpp / ratio   exp(mean NLL) of the same ids; target |ratio - 1| < 1%
  top-1 agree                        share of positions where both engines' argmax is the same token (>= 97%)
  KL mean / p99 / max                KL(llama.cpp || ours) per position, nats (full distributions)
  |dlogp| mean                       mean |log p_ours(next) - log p_llama(next)|
  ours tok/s                         tokens scored per second (Engine.score's prefill time, every row's logits)
  llama.cpp FA vs llama.cpp          the same three numbers for llama.cpp with flash_attn=True against its
                                     default: how far two correct computations of one file drift apart

    python scripts/bench_quality.py                       # the four models, 2 threads
    python scripts/bench_quality.py --models smollm2 qwen2.5-coder-1.5b --text FILE

The llama.cpp side needs /work/venv-anchors (or --anchor-python) with
llama-cpp-python installed; run this script with the colibri-lab venv.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from colibri_lab import llama_anchor  # noqa: E402  (off on AMX CPUs: its extra buffer types)

DEFAULT_TEXT = ROOT / "tests" / "fixtures" / "quality_text.txt"
DEFAULT_MODELS = ("smollm2", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma3-270m")
# Cache file names of the aliases (for a cache where the alias table lacks one).
CACHE_FILES = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
               "qwen2.5-coder-1.5b": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
               "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
               "gemma3-270m": "gemma-3-270m-q4_k_m.gguf"}

# Runs in the anchors venv: eval the ids with logits for every position, save
# the raw logits rows [n - 1, n_vocab] (the last row predicts past the text)
# and llama.cpp's own tokenization of the text; then the same with llama.cpp's
# flash attention on (its other attention numerics: the calibration of how
# far two correct implementations of one model file fall apart).
LLAMA_SIDE = r"""
import json, sys, time
import numpy as np
from llama_cpp import Llama
cfg = json.load(open(sys.argv[1]))
ids = cfg["ids"]
info = {}
for tag, fa in (("", False), ("_fa", True)):
    llm = Llama(model_path=cfg["model"], n_ctx=len(ids) + 8, n_batch=512, n_threads=cfg["threads"],
                logits_all=True, verbose=False, flash_attn=fa)
    if not fa:
        text = open(cfg["text"], encoding="utf-8").read()
        info["own_ids"] = list(map(int, llm.tokenize(text.encode("utf-8"), add_bos=cfg["add_bos"], special=False)))
        info["n_vocab"] = llm.n_vocab()
    t = time.perf_counter()
    llm.eval(ids)
    info["eval_s" + tag] = time.perf_counter() - t
    np.save(cfg["out"] + tag + ".npy", np.asarray(llm.scores[:len(ids) - 1], dtype=np.float32))
    del llm
json.dump(info, open(cfg["out"] + ".json", "w"))
"""


def resolve(name: str) -> Path:
    from colibri_lab import models

    try:
        return Path(models.resolve(name))
    except Exception:
        p = Path(os.path.expanduser("~/.cache/colibri-lab/models")) / CACHE_FILES.get(name, name)
        if p.is_file():
            return p
        raise


def log_softmax(rows: np.ndarray) -> np.ndarray:
    r = rows.astype(np.float64)
    m = r.max(axis=1, keepdims=True)
    return r - (m + np.log(np.exp(r - m).sum(axis=1, keepdims=True)))


def measure(name: str, text: str, text_path: Path, threads: int, anchor_python: str) -> dict:
    from colibri_lab.engine import Engine

    path = resolve(name)
    eng = Engine(str(path), n_threads=threads, n_ctx=4096)
    ids = eng.tokenize(text, parse_special=False)
    add_bos = bool(ids) and eng.tokenizer.bos_id is not None and ids[0] == eng.tokenizer.bos_id
    eng.score(ids[:16])  # warm-up (page in the weights)
    sc = eng.score(ids, logits=True)
    eng.close()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {"model": str(path), "ids": ids, "threads": threads, "text": str(text_path), "add_bos": add_bos,
               "out": os.path.join(tmp, "llama")}
        with open(os.path.join(tmp, "cfg.json"), "w") as f:
            json.dump(cfg, f)
        subprocess.run([anchor_python, "-c", llama_anchor.prelude() + LLAMA_SIDE, os.path.join(tmp, "cfg.json")],
                       check=True)
        ref_rows = np.load(cfg["out"] + ".npy", mmap_mode="r")
        fa_rows = np.load(cfg["out"] + "_fa.npy", mmap_mode="r")
        with open(cfg["out"] + ".json") as f:
            side = json.load(f)
        n = sc.n
        assert ref_rows.shape == sc.logits.shape, (ref_rows.shape, sc.logits.shape)
        nxt = np.asarray(ids[1:])
        lp_ref = np.empty(n)
        top1_ref = np.empty(n, dtype=np.int64)
        kl = np.empty(n)
        kl_fa = np.empty(n)
        lp_fa = np.empty(n)
        agree_fa = np.empty(n, dtype=bool)
        for a in range(0, n, 64):  # chunks: a few [64 x n_vocab] float64 blocks at a time
            b = min(n, a + 64)
            lr = log_softmax(np.asarray(ref_rows[a:b]))
            lo = log_softmax(sc.logits[a:b])
            lf = log_softmax(np.asarray(fa_rows[a:b]))
            lp_ref[a:b] = lr[np.arange(b - a), nxt[a:b]]
            lp_fa[a:b] = lf[np.arange(b - a), nxt[a:b]]
            top1_ref[a:b] = np.argmax(ref_rows[a:b], axis=1)
            agree_fa[a:b] = np.argmax(fa_rows[a:b], axis=1) == top1_ref[a:b]
            kl[a:b] = np.sum(np.exp(lr) * (lr - lo), axis=1)
            kl_fa[a:b] = np.sum(np.exp(lr) * (lr - lf), axis=1)
        del ref_rows, fa_rows
    ppl_ours, ppl_ref = sc.perplexity, float(np.exp(-lp_ref.mean()))
    return {"model": name, "file": path.name, "tokens": len(ids), "bos": add_bos,
            "same_tokenization": side["own_ids"] == ids,
            "ppl_ours": ppl_ours, "ppl_llama": ppl_ref, "ppl_ratio": ppl_ours / ppl_ref,
            "top1_agree": float(np.mean(sc.top1 == top1_ref)),
            "kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99)), "kl_max": float(kl.max()),
            "dlogp_mean": float(np.mean(np.abs(sc.logprobs.astype(np.float64) - lp_ref))),
            "ours_tok_s": sc.tok_s, "llama_tok_s": len(ids) / side["eval_s"],
            "fa_ppl_ratio": float(np.exp(-lp_fa.mean())) / ppl_ref, "fa_top1_agree": float(agree_fa.mean()),
            "fa_kl_mean": float(kl_fa.mean())}


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    ap.add_argument("--text", default=str(DEFAULT_TEXT))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--anchor-python", default="/work/venv-anchors/bin/python")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    a = ap.parse_args(argv)
    text_path = Path(a.text)
    text = text_path.read_text(encoding="utf-8")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    print(f"# commit {commit}  cpu {cpu_model()}  threads {a.threads}  text {text_path.name}  "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    for name in a.models:
        try:
            r = measure(name, text, text_path, a.threads, a.anchor_python)
        except Exception as e:  # noqa: BLE001 - report the model that cannot be measured, go on
            print(f"{name}: not measured: {type(e).__name__}: {e}", flush=True)
            continue
        rows.append(r)
        print(json.dumps(r), flush=True)
    print(f"# load after {os.getloadavg()[0]:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"commit": commit, "cpu": cpu_model(), "threads": a.threads, "rows": rows}, f, indent=1)
    hdr = ("| model | tokens | same ids as llama.cpp's tokenizer | ppl ours | ppl llama.cpp | ratio | top-1 agree "
           "| KL mean | KL p99 | KL max | mean abs dlogp | ours tok/s | llama.cpp tok/s "
           "| llama.cpp FA vs llama.cpp: ppl ratio / top-1 / KL |")
    print()
    print(hdr)
    print("|" + "---|" * (hdr.count("|") - 1))
    for r in rows:
        print(f"| {r['model']} | {r['tokens']} | {'yes' if r['same_tokenization'] else 'no'} | {r['ppl_ours']:.3f} "
              f"| {r['ppl_llama']:.3f} | {r['ppl_ratio']:.4f} | {100 * r['top1_agree']:.1f}% | {r['kl_mean']:.5f} "
              f"| {r['kl_p99']:.5f} | {r['kl_max']:.4f} | {r['dlogp_mean']:.4f} | {r['ours_tok_s']:.0f} "
              f"| {r['llama_tok_s']:.0f} | {r['fa_ppl_ratio']:.4f} / {100 * r['fa_top1_agree']:.1f}% "
              f"/ {r['fa_kl_mean']:.5f} |")
    ok = all(abs(r["ppl_ratio"] - 1) < 0.01 and r["top1_agree"] >= 0.97 for r in rows)
    return 0 if ok and len(rows) == len(a.models) else 1


if __name__ == "__main__":
    sys.exit(main())
