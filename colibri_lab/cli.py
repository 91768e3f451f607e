"""`colibri-lab` command line.

    colibri-lab generate "The capital of France is" --max-tokens 32
    colibri-lab chat "Write a haiku about hummingbirds"
    colibri-lab models list
    colibri-lab models pull smollm2
    colibri-lab info [--model PATH]
    colibri-lab run experiments/tour.toml [--small] [--model qwen2.5-coder-1.5b]
    colibri-lab score FILE --model qwen2.5-coder-1.5b
    colibri-lab serve --model smollm2 --port 8080
    colibri-lab bench serve --base-url http://127.0.0.1:8080 --model smollm2 --rate 0.5,1,2,4 --workload open_chat
"""
from __future__ import annotations

import argparse
import json
import math
import sys

from colibri_lab import models
from colibri_lab.errors import ColibriError



def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="alias or GGUF path (default: smollm2)")
    p.add_argument("--threads", type=int, default=0, help="compute threads (0 = all cores)")
    p.add_argument("--ctx", type=int, default=2048, help="context length per slot")
    p.add_argument("--simd", default="auto", choices=["auto", "avx512", "avx2", "scalar"])


def _gen_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text + table")
    p.add_argument("--no-stream", action="store_true", help="print the text at the end instead of streaming it")


def _make_engine(a):
    from colibri_lab.engine import Engine

    return Engine(a.model, n_threads=a.threads, n_ctx=a.ctx, simd=a.simd)


def _print_result(eng, text: str, metrics: dict, as_json: bool, streamed: bool) -> None:
    if as_json:
        print(json.dumps({"text": text, "metrics": metrics, "engine": eng.params}, indent=2))
        return
    if not streamed:
        print(text)
    else:
        print()
    print("-" * 60)
    print(f"model {eng.model_name}  simd {eng.params['simd']}  threads {eng.params['n_threads']}")
    from colibri_lab.metrics import REQUEST_SCALARS

    for k in REQUEST_SCALARS:
        v = metrics.get(k)
        print(f"{k:>18}  {v:.2f}" if isinstance(v, float) else f"{k:>18}  {v}")


def _run_generation(eng, prompt_ids, a) -> int:
    kw = dict(max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p, top_k=a.top_k,
              seed=a.seed, stop=a.stop)
    stream = not a.no_stream and not a.json
    pieces, metrics = [], {}
    for ev in eng.stream_events(prompt_ids, **kw):
        pieces.append(ev["text"])
        if stream:
            print(ev["text"], end="", flush=True)
        if ev.get("done"):
            metrics = ev["metrics"]
    _print_result(eng, "".join(pieces), metrics, a.json, stream)
    return 0


def cmd_generate(a) -> int:
    eng = _make_engine(a)
    try:
        if not a.json and not a.no_stream:
            print(a.prompt, end="", flush=True)
        return _run_generation(eng, eng.tokenize(a.prompt), a)
    finally:
        eng.close()


def cmd_chat(a) -> int:
    eng = _make_engine(a)
    try:
        messages = ([{"role": "system", "content": a.system}] if a.system else []) + [{"role": "user", "content": a.message}]
        prompt = eng.apply_chat_template(messages)
        return _run_generation(eng, eng.tokenize(prompt, add_special=False), a)
    finally:
        eng.close()


def cmd_score(a) -> int:
    """Perplexity of a text file (teacher-forced, BOS where the model asks for it)."""
    from pathlib import Path

    try:
        text = Path(a.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ColibriError(f"cannot read {a.file}: {e}") from e
    eng = _make_engine(a)
    try:
        ids = eng.tokenize(text, parse_special=False)
        sc = eng.score(ids, top=a.top)
    finally:
        eng.close()
    ms = sc.metrics["prefill_ms"]
    out = {"model": eng.model_name, "file": str(a.file), "tokens": len(sc.ids), "scored": sc.n,
           "perplexity": sc.perplexity, "mean_logprob": -math.log(sc.perplexity),
           "time_ms": ms, "tok_s": sc.tok_s, "simd": eng.params["simd"], "threads": eng.params["n_threads"]}
    if a.json:
        if a.top:
            out["top"] = sc.top
        out["logprobs"] = sc.logprobs.tolist()
        out["top1"] = sc.top1.tolist()
        print(json.dumps(out))
        return 0
    print(f"model {out['model']}  simd {out['simd']}  threads {out['threads']}")
    print(f"{'tokens':>12}  {out['tokens']}  ({out['scored']} scored)")
    print(f"{'perplexity':>12}  {out['perplexity']:.4f}")
    print(f"{'time':>12}  {ms:.1f} ms")
    print(f"{'tok/s':>12}  {out['tok_s']:.1f}")
    return 0


def cmd_models(a) -> int:
    if a.action == "list":
        rows = models.list_models()
        head = ("alias", "cached", "size", "arch", "quant (share of weights)", "licence")
        table = [head] + [
            (r["alias"], "yes" if r["cached"] else "no", f"{r['size'] / 1e6:.1f} MB", r["arch"],
             r["quant"], r["license"])
            for r in rows
        ]
        widths = [max(len(str(row[k])) for row in table) for k in range(len(head))]
        for row in table:
            print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip())
        for r in rows:
            where = r["path"] if r["cached"] else f"{r['source']} ({r['parts']} wheel(s)) -> {r['path']}"
            print(f"{r['alias']}: {where}")
            if r.get("terms"):
                print(f"  {r['license']} apply: {r['terms']}")
            if r.get("error"):
                print(f"  unreadable: {r['error']}")
        return 0
    path = models.pull(a.name, force=a.force)
    print(path)
    return 0


def cmd_info(a) -> int:
    from colibri_lab import _engine

    m = _engine.Model(str(models.resolve(a.model)))
    print(json.dumps({"path": m.path, "info": m.info, "simd_available": _engine.simd_available(),
                      "simd_detected": _engine.simd_detect(), "amx": _engine.amx_active(),
                      "prefetch": _engine.prefetch_mode(),
                      "ymm_decode": _engine.ymm_decode()}, indent=2))
    return 0


def save_plots(res, out_dir) -> list:
    """Write the figures that fit the results' columns next to them; returns the paths."""
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    from colibri_lab import plots

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    req, steps = res.requests, res.steps
    figures = {"latency_cdf_ttft": lambda: plots.latency_cdf(req, "ttft_ms"),
               "latency_cdf_e2e": lambda: plots.latency_cdf(req, "e2e_ms")}
    if "turn" in req and req["turn"].max() > 0:
        figures["prefix_cache_hit_rate_by_turn"] = lambda: plots.prefix_cache_hit_rate_by_turn(req)
    if "draft_n" in req and req["draft_n"].sum() > 0:
        figures["acceptance_by_position"] = lambda: plots.acceptance_by_position(req)
    if "grammar_mask_us" in req and req["grammar_mask_us"].sum() > 0:
        figures["grammar_mask_per_token"] = lambda: plots.grammar_mask_per_token(req)
    if "concurrency" in req and req["concurrency"].nunique() > 1:
        figures["throughput_vs_concurrency"] = lambda: plots.throughput_vs_concurrency(req)
    if steps is not None and len(steps):
        figures["step_breakdown"] = lambda: plots.step_breakdown(steps)
    paths = []
    for name, make in figures.items():
        fig = make()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        paths.append(path)
    return paths


def cmd_run(a) -> int:
    from colibri_lab.experiments import run_spec, summary_table

    kw = {"backend": a.dask} if getattr(a, "dask", None) else {}   # a Dask cluster, else in-process
    over = {"engine": {"model": a.model}} if a.model else None      # every variant's model (serving: both servers')
    res = run_spec(a.spec, small=True if a.small else None, overrides=over, save=not a.no_save, **kw)
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(summary_table(res).to_string())
    out = getattr(res, "path", None) or "."
    for p in save_plots(res, out):
        print(f"plot: {p}")
    if getattr(res, "path", None):
        print(f"results: {res.path}")
    return 0


def _rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rate takes comma-separated numbers (inf = all at once), got {text!r}")
    if not rates or any(not r > 0 for r in rates):
        raise argparse.ArgumentTypeError(f"--rate needs positive rates, got {text!r}")
    return rates


def serve_bench_spec(a):
    """The ExperimentSpec `colibri-lab bench serve` runs: one variant per rate
    (or one closed-loop variant at --concurrency) against --base-url."""
    from colibri_lab.experiments.spec import ExperimentSpec, Variant

    wl = a.workload
    request = {"max_tokens": a.max_tokens, "temperature": a.temperature}
    if a.concurrency:
        variants = [Variant(f"concurrency={a.concurrency}", arrival={"concurrency": a.concurrency})]
    else:
        variants = [Variant(f"rate={r:g}", arrival={"rate": r, "burstiness": a.burstiness, "seed": a.seed,
                                                    "concurrency": a.max_concurrency}) for r in a.rate]
    serve = {"kind": "url", "base_url": a.base_url, "model_id": a.model, "metrics": not a.no_metrics}
    if a.goodput:
        serve["slo"] = a.goodput
    if a.api_key:
        serve["api_key"] = a.api_key
    return ExperimentSpec(name=a.name, variants=variants, workload=wl, workload_n=a.n, repeats=a.repeats,
                          warmup=a.warmup, seed=a.seed, request=request, serve=serve,
                          description=f"bench serve {a.base_url} {a.model}")


_BENCH_ROWS = [("completed", "Successful requests", "d"), ("failed", "Failed requests", "d"),
               ("duration", "Benchmark duration (s)", ".2f"), ("total_input_tokens", "Total input tokens", "d"),
               ("total_output_tokens", "Total generated tokens", "d"),
               ("request_throughput", "Request throughput (req/s)", ".2f"),
               ("request_goodput", "Request goodput (req/s)", ".2f"),
               ("output_throughput", "Output token throughput (tok/s)", ".2f"),
               ("total_token_throughput", "Total token throughput (tok/s)", ".2f"),
               ("sustained", "Completion rate / arrival rate", ".2f"),
               ("prefix_cache_hit_rate", "Prefix cache hit rate (/metrics)", ".3f"),
               ("acceptance_rate", "Spec. acceptance rate (/metrics)", ".3f")]


def _print_bench(table) -> None:
    for v, r in table.iterrows():
        print(f"{'=' * 16} Serving Benchmark Result: {v} {'=' * 16}")
        for key, label, fmt in _BENCH_ROWS:
            if key in r and r[key] == r[key]:
                print(f"{label + ':':<42}{format(int(r[key]) if fmt == 'd' else float(r[key]), fmt):>12}")
        for name, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                            ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
            print(f"{'-' * 15}{title}{'-' * 15}")
            for stat, label in (("mean", "Mean"), ("median", "Median"), ("p90", "P90"), ("p99", "P99")):
                print(f"{f'{label} {name.upper()} (ms):':<42}{float(r[f'{stat}_{name}_ms']):>12.2f}")
    if len(table):
        print(f"commit {table['commit'].iloc[0]}  model {table['model'].iloc[0]}")


def cmd_bench(a) -> int:
    from colibri_lab.experiments import run, serve_table

    if a.what != "serve":   # argparse allows only "serve"; kept for a clear message if that changes
        raise SystemExit(f"unknown bench {a.what!r}")
    spec = serve_bench_spec(a)
    res = run(spec, progress=not a.quiet)
    table = serve_table(res)
    _print_bench(table)
    if a.save:
        from pathlib import Path

        path = res.save(root=Path(a.save))
        (path / "summary.json").write_text(table.reset_index().to_json(orient="records", indent=1) + "\n")
        print(f"results: {path}")
    return 0 if (table["failed"] == 0).all() else 1


def cmd_serve(a) -> int:
    from colibri_lab import serve

    return serve.run(a)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="colibri-lab", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="complete a prompt and print text plus metrics")
    g.add_argument("prompt")
    _engine_args(g)
    _gen_args(g)
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("chat", help="one chat turn through the model's chat template")
    c.add_argument("message")
    c.add_argument("--system", default=None)
    _engine_args(c)
    _gen_args(c)
    c.set_defaults(func=cmd_chat)

    m = sub.add_parser("models", help="list or pull model aliases")
    msub = m.add_subparsers(dest="action", required=True)
    msub.add_parser("list")
    pl = msub.add_parser("pull", help="download an alias into the model cache (resumes a broken pull)")
    pl.add_argument("name", choices=sorted(models.REGISTRY))
    pl.add_argument("--force", action="store_true", help="download again even if the cached file verifies")
    m.set_defaults(func=cmd_models)

    r = sub.add_parser("run", help="run an experiment spec (TOML): table, results and plots")
    r.add_argument("spec")
    r.add_argument("--small", action="store_true", help="the spec's small (CI) sizes")
    r.add_argument("--model", default=None,
                   help="alias or GGUF path replacing the spec's [engine] model (after --small's overrides)")
    r.add_argument("--no-save", action="store_true", help="do not write results")
    r.add_argument("--dask", default=None, metavar="ADDRESS",
                   help='run on a Dask cluster: a scheduler address (tcp://host:8786), "local" or "local:N" '
                        "(start a LocalCluster of N worker processes); needs colibri-lab[distributed]")
    r.set_defaults(func=cmd_run)

    b = sub.add_parser("bench", help="benchmarks: `bench serve` load-tests an OpenAI-compatible server")
    b.add_argument("what", choices=["serve"])
    b.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8080 (with or without /v1)")
    b.add_argument("--model", required=True, help="model name to send in requests")
    b.add_argument("--rate", type=_rates, default=[1.0],
                   help="request rates (req/s), comma-separated: one block each (default 1; inf = all at once)")
    b.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps (1 = Poisson)")
    b.add_argument("--max-concurrency", type=int, default=0, help="cap on requests in flight (0 = none)")
    b.add_argument("--concurrency", type=int, default=0,
                   help="closed loop at this many clients instead of --rate")
    b.add_argument("--workload", default="open_chat", help="a built-in workload name or a JSON/JSONL file")
    b.add_argument("--n", type=int, default=None, help="first N conversations of the workload")
    b.add_argument("--max-tokens", type=int, default=64)
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--goodput", default=None, metavar="SLO", help='SLOs in ms, e.g. "ttft:2000 tpot:200 e2el:10000"')
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument("--warmup", type=int, default=1, help="unrecorded requests first")
    b.add_argument("--seed", type=int, default=0, help="seed of the schedule and of the requests")
    b.add_argument("--api-key", default=None)
    b.add_argument("--no-metrics", action="store_true", help="do not scrape /metrics")
    b.add_argument("--name", default="bench_serve", help="experiment name (results folder)")
    b.add_argument("--save", default=None, metavar="DIR", help="save results under DIR/<name>/<timestamp>/")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.set_defaults(func=cmd_bench)

    sc = sub.add_parser("score", help="perplexity of a text file (teacher-forced scoring in the batched prefill)")
    sc.add_argument("file")
    _engine_args(sc)
    sc.add_argument("--top", type=int, default=0, help="alternatives per position in --json output (0..20)")
    sc.add_argument("--json", action="store_true", help="one JSON object with per-position logprobs and top-1")
    sc.set_defaults(func=cmd_score)

    from colibri_lab import serve

    sv = sub.add_parser("serve", help="OpenAI- and Anthropic-compatible HTTP server")
    serve.add_arguments(sv)
    sv.set_defaults(func=cmd_serve)

    i = sub.add_parser("info", help="print a model's hyperparameters and the SIMD paths")
    i.add_argument("--model", default="smollm2")
    i.set_defaults(func=cmd_info)
    return ap


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    try:
        return a.func(a)
    except ColibriError as e:
        print(f"colibri-lab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
