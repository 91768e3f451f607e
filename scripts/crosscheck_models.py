#!/usr/bin/env python
"""Cross-check the engine against llama.cpp on a real GGUF: the same token
ids (llama.cpp's tokenization, BOS as the model asks) through both, then

  - teacher-forced: at every position of a ~700-token mixed prose-and-code
    text, whether both engines' top-1 token agrees, and each engine's
    perplexity of the text (log-softmax of its own logits);
  - greedy: a few short prompts decoded greedily by both, the first
    position where they part and llama.cpp's top-2 logit gap there (a
    near-tie flips between two correct engines; a large gap would not).

The text is longer than gemma3's 512-token window, so its local layers
slide; ours runs with n_batch 64 so that they keep a ring, and once more
with every position kept (n_batch 512), which must give the same bits.

    python scripts/crosscheck_models.py [--models gemma3-270m smollm2] [--threads 2] [--reference] [--out docs/bench/models.md]

--reference also runs tests/reference.py (numpy, float32, f16 KV, no
activation quantization: the exact math over the file's stored weights) on
the text, and reports how close each engine is to it (minutes and ~3 GB
for gemma3-270m).

llama.cpp runs in a child process under ANCHOR_PYTHON (default
/work/venv-anchors/bin/python: llama-cpp-python 0.3.36), which needs only
numpy and llama_cpp; it writes the per-position results to an .npz.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

ANCHOR_PYTHON = os.environ.get("ANCHOR_PYTHON", "/work/venv-anchors/bin/python")
N_CTX = 2048

# Written for this check: prose, a Python function, a shell line and a
# table, so the text mixes the registers a small model meets.
TEXT = """The ruby-throated hummingbird weighs about three grams, less than a nickel, yet every autumn it \
crosses the Gulf of Mexico in a single flight of some eight hundred kilometres. Before leaving, it nearly \
doubles its weight by feeding on nectar and small insects, storing the surplus as fat. Ornithologists who \
band these birds on the coast of Alabama have recaptured the same individuals a year later at the very same \
feeder, which suggests a memory for places that is remarkable in an animal whose brain is smaller than a pea.

How do we know how much energy such a flight costs? A simple model multiplies the bird's metabolic rate in \
flight by the duration of the crossing. The short program below does the arithmetic and prints a table.

```python
def crossing_energy(mass_g: float, hours: float, watts_per_gram: float = 0.26) -> float:
    \"\"\"Energy in kilojoules burned by a bird of mass_g grams flying for `hours`.\"\"\"
    if mass_g <= 0 or hours <= 0:
        raise ValueError("mass and duration must be positive")
    joules = mass_g * watts_per_gram * hours * 3600.0
    return joules / 1000.0


for hours in (18, 20, 22):
    kj = crossing_energy(3.2, hours)
    fat_g = kj / 37.6  # one gram of fat holds about 37.6 kJ
    print(f"{hours:>3} h  {kj:6.1f} kJ  {fat_g:4.2f} g of fat")
```

Running `python crossing.py | tee energy.txt` prints three rows. With a flight of twenty hours the bird \
burns roughly sixty kilojoules, which is a little under two grams of fat: most of what it gained before \
departure. The margin is thin. A headwind that adds four hours to the journey can exhaust the reserve, and \
storms over the Gulf are a known cause of mass mortality during migration.

| hours | energy (kJ) | fat (g) |
|------:|------------:|--------:|
| 18 | 53.9 | 1.43 |
| 20 | 59.9 | 1.59 |
| 22 | 65.9 | 1.75 |

The numbers are rough. Real birds do not fly at a constant rate: they adjust their speed to the wind, glide \
for brief moments, and may lower their body temperature at night to save energy, a state called torpor. \
Still, the estimate explains why the timing of migration matters so much, and why a garden feeder filled in \
September can make a difference to a traveller that will soon be over open water, far from any flower."""

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea,",
    "Question: What is the boiling point of water at sea level?\nAnswer:",
]
N_GREEDY = 32


def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


# ---------------------------------------------------------------- llama.cpp side (child process)

def anchor_main(model_path, out_path, threads):
    import llama_cpp
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from colibri_lab import llama_anchor
    llama_anchor.configure()   # its extra buffer types off on AMX CPUs
    llm = llama_cpp.Llama(model_path=model_path, n_ctx=N_CTX, n_batch=512, logits_all=True,
                          verbose=False, n_threads=threads)
    res = {}
    ids = llm.tokenize(TEXT.encode(), add_bos=True, special=False)
    llm.reset()
    llm.eval(ids)
    top1, lp_next = [], []
    for i in range(len(ids)):
        row = np.asarray(llm.scores[i], dtype=np.float64)
        top1.append(int(np.argmax(row)))
        if i + 1 < len(ids):
            lp_next.append(float(log_softmax(row)[ids[i + 1]]))
    res["text_ids"] = np.array(ids, np.int32)
    res["text_top1"] = np.array(top1, np.int32)
    res["text_lp"] = np.array(lp_next)
    for k, p in enumerate(PROMPTS):
        pid = llm.tokenize(p.encode(), add_bos=True, special=False)
        llm.reset()
        llm.eval(pid)
        out, gaps = [], []
        for _ in range(N_GREEDY):
            row = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            two = np.sort(row)[-2:]
            gaps.append(float(two[1] - two[0]))
            t = int(np.argmax(row))
            out.append(t)
            llm.eval([t])
        res[f"p{k}_ids"] = np.array(pid, np.int32)
        res[f"p{k}_greedy"] = np.array(out, np.int32)
        res[f"p{k}_gap"] = np.array(gaps)
    np.savez(out_path, **res)


# ---------------------------------------------------------------- our side

def ours_text(model, ids, n_batch, threads):
    """top-1 per position and log p(next) from the engine, prefilled in chunks."""
    from colibri_lab import _engine
    e = _engine.Engine(model, n_slots=1, n_ctx=N_CTX, n_batch=n_batch, n_threads=threads)
    top1, lp = [], []
    for a in range(0, len(ids), n_batch):
        lg = e.forward(0, ids[a:a + n_batch], a)
        top1.extend(int(i) for i in np.argmax(lg, axis=1))
        ls = log_softmax(lg)
        for j in range(lg.shape[0]):
            if a + j + 1 < len(ids):
                lp.append(float(ls[j, ids[a + j + 1]]))
    kv = e.kv_bytes
    e.close()
    return np.array(top1), np.array(lp), kv


def ours_greedy(model, ids, n, threads):
    from colibri_lab import _engine
    e = _engine.Engine(model, n_slots=1, n_ctx=N_CTX, n_batch=64, n_threads=threads)
    last = e.forward(0, ids, 0)[-1]
    out, pos = [], len(ids)
    for _ in range(n):
        t = int(np.argmax(last))
        out.append(t)
        last = e.forward(0, [t], pos)[-1]
        pos += 1
    e.close()
    return out


def reference_text(path, ids):
    """top-1 and log p(next) of the numpy reference (float32, f16 KV)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from reference import LlamaRef
    ref = LlamaRef.from_gguf(path, dtype=np.float32, kv_f16=True)
    cache = ref.new_cache(len(ids))
    top1, lp = [], []
    for a in range(0, len(ids), 128):
        lg = ref.forward(ids[a:a + 128], a, cache)
        top1.extend(int(i) for i in np.argmax(lg, axis=1))
        ls = log_softmax(lg)
        lp.extend(float(ls[j, ids[a + j + 1]]) for j in range(lg.shape[0]) if a + j + 1 < len(ids))
    return np.array(top1), np.array(lp)


def check_model(alias, threads, tmp, with_reference=False):
    from colibri_lab import _engine, models
    path = str(models.resolve(alias))
    dump = os.path.join(tmp, alias + ".npz")
    t0 = time.time()
    p = subprocess.run([ANCHOR_PYTHON, os.path.abspath(__file__), "--anchor", path, dump, "--threads", str(threads)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"llama.cpp side failed: {p.stderr[-2000:]}")
    t_anchor = time.time() - t0
    ref = np.load(dump)
    model = _engine.Model(path)
    ids = ref["text_ids"].tolist()
    t0 = time.time()
    top1_ring, lp_ring, kv_ring = ours_text(model, ids, 64, threads)
    top1_full, lp_full, kv_full = ours_text(model, ids, 512, threads)
    t_ours = time.time() - t0
    agree = float(np.mean(top1_ring[:-1] == ref["text_top1"][:-1]))
    ppl_ours, ppl_ref = float(np.exp(-lp_ring.mean())), float(np.exp(-ref["text_lp"].mean()))
    rows = dict(alias=alias, n_tokens=len(ids), top1=agree, ppl_ours=ppl_ours, ppl_ref=ppl_ref,
                ring_equals_full=bool(np.array_equal(top1_ring, top1_full) and np.array_equal(lp_ring, lp_full)),
                kv_ring=kv_ring, kv_full=kv_full, n_swa=model.info.get("n_swa", 0), greedy=[],
                t_anchor=t_anchor, t_ours=t_ours)
    if with_reference:
        t_r, lp_r = reference_text(path, ids)
        rows["reference"] = dict(
            ppl=float(np.exp(-lp_r.mean())),
            top1_ours=float(np.mean(top1_ring[:-1] == t_r[:-1])), top1_ref=float(np.mean(ref["text_top1"][:-1] == t_r[:-1])),
            dlp_ours=float(np.abs(lp_ring - lp_r).mean()), dlp_ref=float(np.abs(ref["text_lp"] - lp_r).mean()),
            dlp_both=float(np.abs(lp_ring - ref["text_lp"]).mean()))
    for k in range(len(PROMPTS)):
        want = ref[f"p{k}_greedy"].tolist()
        got = ours_greedy(model, ref[f"p{k}_ids"].tolist(), N_GREEDY, threads)
        div = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), None)
        rows["greedy"].append(dict(prompt=PROMPTS[k], n_prompt=len(ref[f"p{k}_ids"]), equal=div is None,
                                   first_divergence=div,
                                   gap=None if div is None else float(ref[f"p{k}_gap"][div])))
    return rows


def render(results, commit, load_before, load_after, threads):
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), platform.processor())
    lines = ["# Real models against llama.cpp", "",
             f"`python scripts/crosscheck_models.py --models {' '.join(r['alias'] for r in results)} --threads {threads}"
             f"{' --reference' if any('reference' in r for r in results) else ''}`, "
             f"commit {commit}, {time.strftime('%Y-%m-%d')}, {cpu}, load average before {load_before}, after {load_after}. "
             "llama.cpp: llama-cpp-python 0.3.36 (`logits_all=True`, n_ctx 2048, its default f16 KV); ours: "
             "the same token ids (llama.cpp's tokenization, BOS as the file asks), f16 KV, n_batch 64 "
             "(gemma3's local layers then keep a ring of 575 positions), and again with n_batch 512 (every position kept).",
             "",
             "Teacher-forced over the ~700-token mixed prose-and-code text in the script (longer than gemma3's "
             "512-token window): top-1 agreement at every position, perplexity of the text under each engine's own logits.",
             "",
             "| model | tokens | window | top-1 agreement | perplexity ours | perplexity llama.cpp | ratio | ring = full KV, bit for bit | KV bytes ring / full |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['alias']} | {r['n_tokens']} | {r['n_swa'] or '-'} | {100 * r['top1']:.2f}% | {r['ppl_ours']:.3f} | "
                     f"{r['ppl_ref']:.3f} | {r['ppl_ours'] / r['ppl_ref']:.4f} | {'yes' if r['ring_equals_full'] else 'NO'} | "
                     f"{r['kv_ring'] / 2**20:.1f} / {r['kv_full'] / 2**20:.1f} MiB |")
    if any("reference" in r for r in results):
        lines += ["", "Against the numpy reference (`tests/reference.py`: float32 over the dequantized stored weights, "
                  "f16 KV, no activation quantization, so the exact math of the file), same text: top-1 agreement with "
                  "the reference and mean |log p(next token) - reference's| over the positions.", "",
                  "| model | reference perplexity | top-1 = reference: ours | llama.cpp | mean abs. log-prob diff to reference: ours | llama.cpp | ours vs llama.cpp |",
                  "|---|---|---|---|---|---|---|"]
        for r in results:
            if "reference" not in r:
                continue
            q = r["reference"]
            lines.append(f"| {r['alias']} | {q['ppl']:.3f} | {100 * q['top1_ours']:.2f}% | {100 * q['top1_ref']:.2f}% | "
                         f"{q['dlp_ours']:.4f} | {q['dlp_ref']:.4f} | {q['dlp_both']:.4f} |")
    lines += ["", f"Greedy decoding, {N_GREEDY} tokens from each prompt (first divergence = index of the first "
              "differing token; gap = llama.cpp's top-2 logit difference there):", "",
              "| model | prompt | prompt tokens | greedy tokens equal | first divergence | llama.cpp top-2 gap there |",
              "|---|---|---|---|---|---|"]
    for r in results:
        for g in r["greedy"]:
            pr = json.dumps(g["prompt"])[1:-1][:40]
            lines.append(f"| {r['alias']} | `{pr}` | {g['n_prompt']} | {'yes' if g['equal'] else 'no'} | "
                         f"{'-' if g['equal'] else g['first_divergence']} | {'-' if g['equal'] else format(g['gap'], '.3f')} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["gemma3-270m"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write the markdown section here")
    ap.add_argument("--reference", action="store_true", help="also compare both engines with tests/reference.py")
    ap.add_argument("--anchor", nargs=2, metavar=("MODEL", "NPZ"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.anchor:
        anchor_main(a.anchor[0], a.anchor[1], a.threads)
        return 0
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    load_before = open("/proc/loadavg").read().split()[0]
    with tempfile.TemporaryDirectory() as tmp:
        results = [check_model(m, a.threads, tmp, a.reference) for m in a.models]
    load_after = open("/proc/loadavg").read().split()[0]
    text = render(results, commit, load_before, load_after, a.threads)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
