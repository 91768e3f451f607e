"""Render docs/workbench_results.md from the saved runs under experiments/results/.

    python scripts/workbench_results.py [--root experiments/results] [--out docs/workbench_results.md]
    python scripts/workbench_results.py --section experiments/results/serving/<timestamp>   # one run

Every section is computed from one saved run (the latest per experiment and
model): where it came from (command, commit and dirty flag, machine, SIMD
path, threads, model file and sha256, load before and after), its summary
table (summary_table, or serve_table for serving runs) and the claims its
notebook checked and rendered (meta["claims"], written by verdicts.record).
Nothing in the page is typed by hand except the titles and the notebook
each experiment comes from.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from colibri_lab.experiments import load_results, serve_table, summary_table  # noqa: E402
from colibri_lab.experiments.results import provenance  # noqa: E402

# experiment name -> (title, notebook)
TITLES = {
    "tour": ("Tour: prefix reuse off vs on (shared_prefix)", "tour.ipynb"),
    "batching": ("Continuous batching: throughput vs concurrency (open_chat)", "batching_latency.ipynb"),
    "prefix": ("Prefix hit ratio across turns (multi_turn)", "prefix_hit_ratio.ipynb"),
    "speculative": ("Speculative decoding on copy-heavy edits (copy_edit)", "speculative_acceptance.ipynb"),
    "speculative_chat": ("Speculative decoding on open chat: the adaptive policy (open_chat)",
                         "speculative_acceptance.ipynb"),
    "grammar": ("Grammar overhead: JSON Schema constrained decoding (json_extract)", "grammar_overhead.ipynb"),
    "serving": ("Serving latency: our server vs llama.cpp's server, Poisson arrivals (open_chat)",
                "serving_latency.ipynb"),
}
SERVE_COLS = ["server", "rate", "completed", "failed", "sustained", "request_throughput", "request_goodput",
              "output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms",
              "p99_itl_ms", "p99_e2el_ms", "prefix_cache_hit_rate"]


def fmt(x) -> str:
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, float):
        if math.isnan(x):
            return ""
        return f"{x:.1f}" if abs(x) >= 100 else f"{x:.3g}" if abs(x) >= 1 else f"{x:.3f}"
    return str(x)


def md_table(df) -> str:
    df = df.reset_index()
    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(fmt(x).replace("|", "/") for x in row) + " |")
    return "\n".join(lines)


def latest_runs(root: Path) -> list[Path]:
    """The latest run of every (experiment, model) under root."""
    best: dict = {}
    for meta in sorted(root.glob("*/*/meta.json")):
        res_dir = meta.parent
        try:
            res = load_results(res_dir)
        except Exception as exc:  # noqa: BLE001
            print(f"skipping {res_dir}: {exc}", file=sys.stderr)
            continue
        key = (res_dir.parent.name, tuple(provenance(res.meta)["models"]))
        best[key] = res_dir          # sorted by timestamp: the last one wins
    order = list(TITLES)
    return [best[k] for k in sorted(best, key=lambda k: (order.index(k[0]) if k[0] in order else 99, k[1]))]


# Facts about a run that its files cannot say (keyed by the run's folder name).
NOTES = {
    "20261201-215850": "This run's notebook stated its gap-table claim over every request; the gaps of failed "
                       "requests are left out by design (as vLLM does), so the claim read 'does not hold' for a "
                       "counting reason. The notebook now states it over answered requests; the data are unchanged.",
}


def section(path: Path) -> str:
    res = load_results(path)
    m = res.meta
    name = path.parent.name
    title, nb = TITLES.get(name, (name, "?"))
    p = provenance(m)
    git = m.get("git") or {}
    load = m.get("load") or {}
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    models = ", ".join(p["models"]) or "?"
    out = [f"## {title} - {models}", ""]
    out.append(f"- notebook: `notebooks/{nb}`, run at full size with nbclient "
               f"(`COLIBRI_LAB_SMALL=0`, model and threads in the parameter cell's environment variables)")
    simd = "/".join(p["simd"]) or "?"
    threads = "/".join(map(str, p["n_threads"])) or "?"
    out.append(f"- machine: {p['cpu']}, {(m.get('machine') or {}).get('n_cpus', '?')} CPUs (shared with other "
               f"jobs), SIMD path `{simd}`, n_threads={threads}")
    out.append(f"- commit: `{git.get('commit', '?')}`" + (" + uncommitted changes" if git.get("dirty") else "")
               + f"; date {m.get('date', '?')}")
    for k in ("before", "after"):
        if (load.get(k) or {}).get("uptime"):
            out.append(f"- load {k}: `{load[k]['uptime']}`")
    out.append(f"- model: {models} (sha256 `{', '.join(p['model_sha256'])}…`)")
    files = ", ".join(f.name for f in sorted(path.iterdir()) if f.is_file())
    out.append(f"- results: `{rel}/` ({files})")
    if (path / "figure.png").is_file():
        out.append(f"- figure: `{rel}/figure.png`")
    out.append("")
    if m.get("serving"):
        t = serve_table(res)
        out.append(md_table(t[[c for c in SERVE_COLS if c in t.columns]]))
        servers = {v: e for v, e in (m.get("engines") or {}).items()}
        kinds = {}
        for e in servers.values():
            kinds.setdefault(e.get("kind"), e)
        out.append("")
        for k, e in kinds.items():
            out.append(f"- server `{k}`: {e.get('version', '')}; `{' '.join(e.get('cmd', []))}`")
    else:
        t = summary_table(res)
        out.append(md_table(t.drop(columns=[c for c in ("model", "commit") if c in t.columns])))
    if path.name in NOTES:
        out += ["", f"Note: {NOTES[path.name]}"]
    claims = m.get("claims")
    if claims:
        out += ["", "Claims (checked and rendered by the notebook from this run):", ""]
        for c in claims:
            status = "not tested" if c["holds"] is None else "holds" if c["holds"] else "does not hold"
            out.append(f"- {c['statement']} - **{status}**" + (f": {c['evidence']}" if c["evidence"] else ""))
    return "\n".join(out) + "\n"


HEAD = """# Workbench results

Full-size runs of the experiment-family notebooks, one section per saved run (the latest of
each experiment and model under `experiments/results/`). This page is generated by
`python scripts/workbench_results.py` from the saved runs: provenance, tables and claims all
come from each run's `meta.json` and tables, none is typed by hand. Every timing is a median
over requests or a paired ratio (variant / baseline, same prompt, repeat and seed) with a
seeded 95 % bootstrap interval; a variant *wins* only when the whole interval is on the good
side of 1. The machine is a small VM (2 vCPUs) shared with other jobs during these runs (see
each run's load average): absolute times are only indicative; the ratios and their intervals
are the result. Load the raw tables with `colibri_lab.experiments.load_results(path)`.
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(ROOT / "experiments" / "results"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "workbench_results.md"))
    ap.add_argument("--section", default=None, metavar="RUN",
                    help="print the section of one saved run (e.g. for docs/bench/serve.md) instead")
    a = ap.parse_args(argv)
    if a.section:
        print(section(Path(a.section).resolve()))
        return 0
    parts = [HEAD] + [section(p) for p in latest_runs(Path(a.root).resolve())]
    Path(a.out).write_text("\n".join(parts))
    print(f"wrote {a.out} ({len(parts) - 1} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
