"""Shared helpers for the feature benchmarks (scripts/bench_*.py): robust
statistics for A/B runs on a noisy shared machine, and the machine/commit
header every docs/bench/*.md section starts with.

Statistics: medians, inter-quartile range, and a percentile bootstrap
interval for the median of paired ratios (resampling the pairs), with a fixed
seed so a rerun on the same data prints the same interval.
"""
from __future__ import annotations

import datetime
import os
import random
import shlex
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, ROOT)


def quantile(xs, q):
    """Linear-interpolated quantile of a non-empty sequence (q in [0, 1])."""
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def iqr(xs):
    return (quantile(xs, 0.25), quantile(xs, 0.75))


def bootstrap_ci(xs, stat=statistics.median, n=2000, alpha=0.05, seed=0):
    """Percentile bootstrap interval of stat(xs), resampling elements (pairs)."""
    xs = list(xs)
    if len(xs) < 2:
        v = stat(xs) if xs else float("nan")
        return (v, v)
    rng = random.Random(seed)
    vals = sorted(stat([xs[rng.randrange(len(xs))] for _ in xs]) for _ in range(n))
    return (vals[int(alpha / 2 * n)], vals[min(n - 1, int((1 - alpha / 2) * n))])


def fmt_ms(x):
    return f"{x:.1f}"


def describe(xs, unit="", prec=1):
    """'median [IQR lo-hi] (min-max, n)' for a list of numbers."""
    if not xs:
        return "n/a"
    lo, hi = iqr(xs)
    f = f"{{:.{prec}f}}"
    return (f"{f.format(median(xs))}{unit} [IQR {f.format(lo)}–{f.format(hi)}; "
            f"min {f.format(min(xs))}, max {f.format(max(xs))}; n={len(xs)}]")


def loadavg():
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "uptime unavailable"


def llama_extra_bufts():
    """Whether the llama.cpp anchor opens models with use_extra_bufts on (colibri_lab.llama_anchor)."""
    from colibri_lab import llama_anchor
    return llama_anchor.extra_bufts()


def machine_info(n_threads):
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        from colibri_lab import _engine
        simd = _engine.simd_detect()
        so = _engine.__file__
        so_time = datetime.datetime.fromtimestamp(os.path.getmtime(so)).isoformat(timespec="seconds")
    except Exception as e:  # noqa: BLE001 - a header line, never fatal
        simd, so_time = f"unknown ({e})", "?"
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
    except OSError:
        commit, dirty = "unknown", ""
    return {"cpu": cpu, "cores": os.cpu_count(), "simd": simd, "threads": n_threads, "commit": commit,
            "dirty": bool(dirty), "so_built": so_time,
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "python": sys.version.split()[0]}


def header(title, argv, info, load_start, load_end):
    cmd = "python " + " ".join(shlex.quote(a) for a in argv)
    lines = [f"## {title}", "",
             f"- command: `{cmd}`",
             f"- machine: {info['cpu']}, {info['cores']} cores (shared), SIMD path `{info['simd']}`, "
             f"n_threads={info['threads']}, Python {info['python']}",
             f"- commit: `{info['commit']}`" + (" (working tree had uncommitted changes to tracked files; "
                                                  f"extension built {info['so_built']})" if info["dirty"] else ""),
             f"- date: {info['date']}",
             f"- load at start: `{load_start}`",
             f"- load at end: `{load_end}`", ""]
    return "\n".join(lines)


def write_doc(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text.rstrip() + "\n")
    print(f"wrote {path}")


def finish_report(out, verdicts, args, parser):
    """Append the verdict list, print the report, and write it to args.out
    (a --quick run writes only when --out was given explicitly)."""
    out.append("### Verdict\n")
    out += [f"- {v}" for v in verdicts]
    text = "\n".join(out)
    print("\n" + text)
    if not args.quick or args.out != parser.get_default("out"):
        write_doc(args.out, text)


def abba(r, a="A", b="B"):
    """Order of the two arms in repeat r: A B, B A, B A, A B, ... (ABBA blocks)."""
    return (a, b) if r % 4 in (0, 3) else (b, a)


def verdict_ge(med, lo, target):
    """'met' when the whole interval clears the target; 'median within target, CI not
    resolved' when only the median does; 'MISSED' otherwise."""
    return "met" if lo >= target else ("median within target, CI not resolved" if med >= target else "MISSED")


def verdict_le(med, hi, target):
    return "met" if hi <= target else ("median within target, CI not resolved" if med <= target else "MISSED")
