#!/usr/bin/env python
"""Batch-union experts on a tiny MoE model: unique experts computed per step
and step time vs batch size.

For each batch size B, B requests decode together; over the decode steps
(prefill excluded) the table reports the mean of experts_unique (expert
FFNs computed per step, all layers), experts_routed (= B * layers * top-k,
what a per-row loop would compute), their ratio (the weight reads saved),
and the mean step time.

    python scripts/bench_moe.py [--experts 32 --top-k 4 --layers 4 --embd 256 --wtype Q8_0 --threads 1]

Needs the binding's experts block (Engine.last_step()['experts_unique']).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from tinymodels import write_tiny_model  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--ff-exp", type=int, default=256)
    ap.add_argument("--wtype", default="Q8_0")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--simd", default="auto")
    ap.add_argument("--tokens", type=int, default=12, help="decode tokens per request")
    ap.add_argument("--batches", default="1,2,4,8,16")
    a = ap.parse_args(argv)
    from colibri_lab import _engine
    batches = [int(b) for b in a.batches.split(",")]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "moe.gguf")
        write_tiny_model(path, arch="qwen3moe", wtype=a.wtype, n_embd=a.embd, n_head=4, n_head_kv=2,
                         n_layer=a.layers, n_expert=a.experts, n_expert_used=a.top_k, n_ff_exp=a.ff_exp,
                         n_vocab=512, seed=1)
        model = _engine.Model(path)
        print(f"qwen3moe tiny: {a.layers} layers, {a.experts} experts, top-{a.top_k}, n_embd {a.embd}, "
              f"expert width {a.ff_exp}, {a.wtype}, threads {a.threads}, simd {a.simd}")
        print("| batch | experts_unique / step | experts_routed / step | routed / unique | step ms | ms / token |")
        print("|---|---|---|---|---|---|")
        for B in batches:
            e = _engine.Engine(model, n_slots=B, n_ctx=64, n_threads=a.threads, simd=a.simd, n_batch=256)
            for i in range(B):
                e.submit([(37 * i + 11 * j) % 500 for j in range(6)], max_tokens=a.tokens, ignore_eos=True)
            uniq, routed, ms = [], [], []
            while e.pending:
                e.step()
                s = e.last_step()
                if s["rows_prefill"] == 0 and s["rows_decode"] == B:
                    uniq.append(s["experts_unique"])
                    routed.append(s["experts_routed"])
                    ms.append(s["step_ms"])
            u, r, t = statistics.mean(uniq), statistics.mean(routed), statistics.median(ms)
            print(f"| {B} | {u:.1f} | {r:.0f} | {r / u:.2f} | {t:.2f} | {t / B:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
