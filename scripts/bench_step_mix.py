"""What a step costs by its rows: D decode rows beside P prompt rows, against decode rows alone.

    python scripts/bench_step_mix.py --model qwen2.5-coder-1.5b --configs 2+0,8+0,2+6,5+0,5+3 [--rounds 6]

Each configuration D+P is one engine (D + 1 slots, n_chunk = D + P): D streams decode
(short random prompts, ignore_eos) and, for P > 0, a prompt of 3P random tokens is kept
waiting, so its steps carry D decode and P prompt rows.  Only steps of exactly that
composition are kept.  The configurations run round-robin, `--per` steps each per round,
the order reversed every other round (so a load change hits them alike); the table gives
the step time's median and quartiles and the median of its phases (Engine.last_step).
"""
import argparse

import numpy as np

from colibri_lab import _engine, models


class Config:
    def __init__(self, model, d, p, threads, rng):
        self.d, self.p, self.rng = d, p, rng
        self.core = _engine.Engine(model, n_slots=d + 1, n_ctx=2048, n_threads=threads,
                                   n_chunk=d + p if p else 0, prefix_reuse=False)
        self.steps = []
        self.start_decoders()

    def toks(self, n):
        return [int(t) for t in self.rng.integers(100, 20000, n)]

    def start_decoders(self):
        for _ in range(self.d):
            self.core.submit(self.toks(8), max_tokens=400, ignore_eos=True)
        while True:
            self.core.step()
            s = self.core.last_step()
            if s["rows_decode"] == self.d and s["rows_prefill"] == 0:
                return

    def run(self, k):
        got = 0
        while got < k:
            if self.core.pending < self.d:   # a decoder reached max_tokens
                self.start_decoders()
            if self.p and self.core.pending == self.d:
                self.core.submit(self.toks(3 * self.p), max_tokens=1, ignore_eos=True)
            self.core.step()
            s = self.core.last_step()
            if s["rows_decode"] == self.d and s["rows_prefill"] == self.p:
                self.steps.append(s)
                got += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--configs", default="1+0,2+0,4+0,8+0,12+0,2+2,2+6,2+10,2+36,5+0,5+3,5+7")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--per", type=int, default=3, help="steps of each configuration per round")
    a = ap.parse_args()
    model = _engine.Model(str(models.resolve(a.model)))
    rng = np.random.default_rng(0)
    cfgs = [Config(model, *(int(v) for v in c.split("+")), a.threads, rng) for c in a.configs.split(",")]
    for c in cfgs:   # warm-up
        c.run(1)
        c.steps.clear()
    for r in range(a.rounds):
        for c in (cfgs if r % 2 == 0 else cfgs[::-1]):
            c.run(a.per)
    print("| rows | decode | prompt | steps | step ms p50 [IQR] | matmul ms | LM head ms | attention + other ms | sync ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in cfgs:
        st = np.array([s["step_ms"] for s in c.steps])
        q = np.percentile(st, [25, 50, 75])

        def med(k):
            return float(np.median([s[k] for s in c.steps]))
        print(f"| {c.d + c.p} | {c.d} | {c.p} | {len(st)} | {q[1]:.1f} [{q[0]:.1f}, {q[2]:.1f}] | "
              f"{med('matmul_ms'):.1f} | {med('lm_head_ms'):.1f} | {med('attention_ms') + med('other_ms'):.1f} | "
              f"{med('sync_ms'):.1f} |", flush=True)
        c.core.close()


if __name__ == "__main__":
    main()
