"""Our own SIMD levels against each other: teacher-forced top-1 agreement and KL
of every level this machine has against its fastest one, same file, same ids
(tests/fixtures/quality_text.txt), through experiments.numerics.compare_sequence.

The levels differ only in summation order and in the last bits of exp / tanh
(the K-quant matmuls are bit-identical across levels; the legacy-quant ones,
SmolLM2's Q4_1, sum in another order), so this is the
agreement two correct computations of one model reach at the float-rounding
floor: the calibration for docs/bench/quality.md's top-1 bar.

    python scripts/quality_levels.py [--models smollm2 gemma3-270m ...]
"""
import argparse
from pathlib import Path

from colibri_lab import _engine
from colibri_lab.engine import Engine
from colibri_lab.experiments.numerics import compare_sequence

TEXT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "quality_text.txt"
MODELS = ("smollm2", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    text = TEXT.read_text(encoding="utf-8")
    levels = _engine.simd_available()[::-1]  # fastest first: the baseline
    print(f"| model | level | top-1 agree vs {levels[0]} | KL mean | perplexity |")
    print("|---|---|---|---|---|")
    for m in args.models:
        engs = {s: Engine(m, n_threads=args.threads, n_ctx=4096, simd=s) for s in levels}
        ids = engs[levels[0]].tokenize(text, parse_special=False)
        for level, r in compare_sequence(engs, levels[0], ids).items():
            print(f"| {m} | {level} | {100 * r['top1_agree']:.1f}% | {r['kl_mean']:.5f} | {r['perplexity']:.3f} |",
                  flush=True)
        for e in engs.values():
            e.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
