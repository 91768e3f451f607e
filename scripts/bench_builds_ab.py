#!/usr/bin/env python
"""Two builds (or two SIMD levels) of our engine against each other, interleaved.

Each variant runs in its own worker process (its own PYTHONPATH, so two built
trees can be compared; its own `simd=`), with the model loaded once; the
parent alternates the workers A B B A per round after a warm-up round, on the
same fixed token ids, and prints each variant's median and the paired ratio
B / A (median of the per-round ratios and their range).

  prefill   one prompt of --prefill-tokens ids, tok/s of the prefill steps
  decode    --decode-tokens greedy steps after a 32-id prompt, tok/s
  batched   --streams prompts of 32 ids, then --decode-tokens steps of one
            token per stream: aggregate decode tok/s

Usage:

  python scripts/bench_builds_ab.py --a /work/main --b /work/wt-x \\
      --model ~/.cache/colibri-lab/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
      --sections prefill,decode --threads 1,2 --rounds 3
  python scripts/bench_builds_ab.py --a . --b . --simd-a avx512 --simd-b avx2 ...
  python scripts/bench_builds_ab.py --a . --b . --prefetch-a on --prefetch-b auto ...
  python scripts/bench_builds_ab.py --a . --b . --ymm-a off --ymm-b on ...

Timed around Engine.step() as scripts/bench_engine.py does.  Run it under the
bench lock (flock /tmp/bench.lock ...).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

WORKER = r"""
import json, sys, time
from colibri_lab import _engine
import colibri_lab
model, knobs = _engine.Model(sys.argv[1]), json.loads(sys.argv[2])
simd = knobs["simd"]
if knobs["prefetch"] != "default":
    _engine.set_prefetch(knobs["prefetch"])
if knobs["ymm"] != "default":
    _engine.set_ymm_decode({"auto": None, "on": True, "off": False}[knobs["ymm"]])
engines = {}
def engine(nt, n_slots, n_ctx, n_batch):
    key = (nt, n_slots, n_ctx, n_batch)
    if key not in engines:
        for e in engines.values():
            e.close()
        engines.clear()
        engines[key] = _engine.Engine(model, n_slots=n_slots, n_ctx=n_ctx, n_threads=nt, n_batch=n_batch,
                                      prefix_reuse=False, simd=simd)
    return engines[key]
def run(eng, prompts, max_tokens):
    for p in prompts:
        eng.submit(p, max_tokens=max_tokens, ignore_eos=True)
    t_pp = t_tg = 0.0
    n_tg = 0
    global prof
    prof = {}
    while eng.pending:
        t0 = time.perf_counter()
        evs = eng.step()
        dt = time.perf_counter() - t0
        s = eng.last_step()
        if s["rows_prefill"] > 0:
            t_pp += dt
            for k in ("matmul_ms", "attention_ms", "lm_head_ms", "other_ms", "step_ms"):
                prof[k] = prof.get(k, 0.0) + s[k]
        elif s["rows_decode"] > 0:
            t_tg += dt
            n_tg += s["rows_decode"]
        for e in evs:
            if e["type"] == "error":
                raise RuntimeError(e["message"])
    return t_pp, t_tg, n_tg
print(json.dumps({"file": colibri_lab.__file__}), flush=True)
for line in sys.stdin:
    q = json.loads(line)
    nt = q["threads"]
    if q["op"] == "prefill":
        ids = q["ids"]
        eng = engine(nt, 1, len(ids) + 8, max(512, len(ids)))
        t_pp, _, _ = run(eng, [ids], 1)
        v = len(ids) / t_pp
    else:
        prompts = q["prompts"]
        eng = engine(nt, len(prompts), 32 + q["tokens"] + 8, 512)
        _, t_tg, n_tg = run(eng, prompts, q["tokens"] + 1)
        v = n_tg / t_tg
    print(json.dumps({"v": v, "prof": prof}), flush=True)
"""


# Per-variant settings: --NAME-a / --NAME-b, (default, choices or None, help).
KNOBS = {
    "simd": ("auto", None, "SIMD level of variant A: auto, avx512, avx2 or scalar"),
    "prefetch": ("default", ["default", "auto", "on", "off"],
                 "panel software-prefetch mode of variant A (_engine.set_prefetch; default: as started)"),
    "ymm": ("default", ["default", "auto", "on", "off"],
            "decode's Q4_K on the 256-bit kernel in variant A (_engine.set_ymm_decode; default: as started)"),
}


class Worker:
    def __init__(self, tree, model, knobs):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.path.abspath(tree)
        self.p = subprocess.Popen([sys.executable, "-c", WORKER, model, json.dumps(knobs)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env,
                                  cwd=env["PYTHONPATH"])  # '' on sys.path is the tree, before any install
        self.file = json.loads(self.p.stdout.readline())["file"]

    def ask(self, q):
        self.p.stdin.write(json.dumps(q) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("worker died")
        r = json.loads(line)
        self.prof = r["prof"]
        return r["v"]

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="tree whose colibri_lab is variant A")
    ap.add_argument("--b", required=True, help="tree whose colibri_lab is variant B")
    for name, (default, choices, help_a) in KNOBS.items():
        ap.add_argument(f"--{name}-a", default=default, choices=choices, help=help_a)
        ap.add_argument(f"--{name}-b", default=default, choices=choices, help="the same for variant B")
    ap.add_argument("--model", required=True)
    ap.add_argument("--sections", default="prefill,decode")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=48)
    ap.add_argument("--streams", type=int, default=8)
    args = ap.parse_args()
    model = os.path.expanduser(args.model)
    knobs = {v: {name: getattr(args, f"{name}_{v}") for name in KNOBS} for v in "ab"}
    wa, wb = Worker(args.a, model, knobs["a"]), Worker(args.b, model, knobs["b"])
    for v, w in (("A", wa), ("B", wb)):
        print(f"{v}: {w.file} " + " ".join(f"{k}={x}" for k, x in knobs[v.lower()].items()))
    print(f"load {os.getloadavg()[0]:.2f}", flush=True)
    ids = [1000 + (i * 7919) % 20000 for i in range(max(args.prefill_tokens, 32 * args.streams))]
    for sec in args.sections.split(","):
        for nt in [int(t) for t in args.threads.split(",")]:
            if sec == "prefill":
                q = {"op": "prefill", "threads": nt, "ids": ids[:args.prefill_tokens]}
            elif sec == "decode":
                q = {"op": "decode", "threads": nt, "tokens": args.decode_tokens, "prompts": [ids[:32]]}
            elif sec == "batched":
                q = {"op": "decode", "threads": nt, "tokens": args.decode_tokens,
                     "prompts": [ids[32 * s:32 * s + 32] for s in range(args.streams)]}
            else:
                raise SystemExit(f"unknown section {sec}")
            wa.ask(q), wb.ask(q)  # warm-up
            va, vb, ratios = [], [], []
            for _ in range(args.rounds):
                a1 = wa.ask(q); b1 = wb.ask(q); b2 = wb.ask(q); a2 = wa.ask(q)
                va += [a1, a2]; vb += [b1, b2]
                ratios.append((b1 + b2) / (a1 + a2))
            if sec == "prefill":
                for name, w in (("A", wa), ("B", wb)):
                    print(f"  {name} last prefill (ms): " + ", ".join(f"{k[:-3]} {v:.0f}" for k, v in w.prof.items()))
            print(f"[{time.strftime('%H:%M:%S')}] {sec}, {nt} thread(s): A {statistics.median(va):.1f}, "
                  f"B {statistics.median(vb):.1f} tok/s, B/A {statistics.median(ratios):.3f} "
                  f"[{min(ratios):.3f}, {max(ratios):.3f}], load {os.getloadavg()[0]:.2f}", flush=True)
    wa.close(); wb.close()


if __name__ == "__main__":
    main()
