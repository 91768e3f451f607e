"""Decode-step profile at B concurrent streams: median step time, aggregate
tok/s and the per-phase breakdown from Engine.last_step().

    python scripts/bench_step_profile.py [--threads 1 2] [--batch 1 8] [--tokens 80] [--simd avx2]
"""
import argparse
import time

import numpy as np

from colibri_lab import _engine, models

PHASES = ("matmul_ms", "attention_ms", "lm_head_ms", "sampling_ms", "other_ms", "norm_ms", "rope_ms", "sync_ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--tokens", type=int, default=80)
    ap.add_argument("--simd", default="auto", help="SIMD level: auto, avx512, avx2 or scalar")
    a = ap.parse_args()
    model = _engine.Model(str(models.resolve(a.model)))
    print("| threads | B | step ms | aggregate tok/s | " + " | ".join(PHASES) + " |")
    for th in a.threads:
        for b in a.batch:
            core = _engine.Engine(model, n_slots=b, n_ctx=512, n_threads=th, prefix_reuse=False,
                                  simd=a.simd)
            for i in range(b):
                core.submit([1 + i, 2, 3, 4, 5, 6, 7, 8], max_tokens=a.tokens, ignore_eos=True)
            steps, prof = [], []
            while core.pending:
                t = time.perf_counter()
                core.step()
                dt = time.perf_counter() - t
                s = core.last_step()
                if s["rows_prefill"] == 0 and s["rows_decode"] == b:
                    steps.append(dt)
                    prof.append(s)
            med = float(np.median(steps))
            cols = " | ".join(f"{np.median([p[k] for p in prof]):.2f}" for k in PHASES)
            print(f"| {th} | {b} | {med * 1e3:.2f} | {b / med:.0f} | {cols} |")
            core.close()


if __name__ == "__main__":
    main()
