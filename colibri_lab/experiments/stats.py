"""Statistics for A/B runs on a noisy machine.

Never a single absolute time: compare variant B with baseline A by the ratio
B/A of paired requests (same repeat, prompt, turn and seed), with a seeded
bootstrap confidence interval.  A variant *earns its keep* on a metric only if
the whole interval lies on the good side of 1 (below 1 for latencies, above 1
for throughputs and hit rates).  Lossless variants are also checked for equal
outputs, pair by pair.

Numerics (specs with numerics = true, see experiments.numerics) get the same
treatment: the perplexity ratio of paired items with its bootstrap interval
and verdict, and KL divergence and top-1 agreement with the baseline as
token-weighted means over items with bootstrap intervals (numerics_table).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

PAIR_KEYS = ("repeat", "prompt_id", "turn", "seed")

# Which way is better for each metric ("lower" or "higher").  Unknown metrics
# ending in _ms/_us are latencies (lower); others must be given explicitly.
DIRECTION = {
    "queue_ms": "lower", "ttft_ms": "lower", "prefill_ms": "lower", "decode_ms": "lower", "e2e_ms": "lower",
    "tpot_ms": "lower", "client_ms": "lower", "grammar_mask_us": "lower", "step_ms": "lower",
    "decode_tok_s": "higher", "throughput_tok_s": "higher", "accept_rate": "higher",
    "accept_len_mean": "higher", "cached_tokens": "higher", "prefix_cache_hit_rate": "higher",
    "perplexity": "lower", "kl_mean": "lower", "kl_max": "lower", "top1_agree": "higher",
}

# A variant is numerically "equivalent" to the baseline when the perplexity
# ratio's interval lies within 1 +- NUMERICS_PPL_TOL and the top-1 agreement's
# interval above NUMERICS_AGREE_MIN: the bars two correct engines clear on the
# same model file (docs/bench/quality.md: llama.cpp against llama.cpp and ours
# against llama.cpp are well under 1% apart in perplexity, with a few near-tied top-1 flips).
NUMERICS_PPL_TOL = 0.01
NUMERICS_AGREE_MIN = 0.97


def direction(metric: str) -> str:
    if metric in DIRECTION:
        return DIRECTION[metric]
    if metric.endswith(("_ms", "_us", "_s")) and not metric.endswith("tok_s"):
        return "lower"
    if metric.endswith("tok_s"):
        return "higher"
    raise ValueError(f"no known direction for metric {metric!r}; pass direction='lower' or 'higher'")


def p99(x) -> float:
    x = np.asarray(x, dtype=float)
    x = x[~np.isnan(x)]
    return float(np.percentile(x, 99)) if len(x) else float("nan")


def summarize(df: pd.DataFrame, metrics: Sequence[str] = ("ttft_ms", "tpot_ms", "e2e_ms", "decode_tok_s"),
              by: str | Sequence[str] = "variant") -> pd.DataFrame:
    """n, median, mean and p99 of each metric per group (columns metric_median, ...)."""
    by = [by] if isinstance(by, str) else list(by)
    out = []
    for key, g in df.groupby(by, sort=False):
        rec = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        rec["n"] = len(g)
        for m in metrics:
            x = pd.to_numeric(g[m], errors="coerce").dropna().to_numpy(float) if m in g else np.array([])
            rec[f"{m}_median"] = float(np.median(x)) if len(x) else float("nan")
            rec[f"{m}_mean"] = float(np.mean(x)) if len(x) else float("nan")
            rec[f"{m}_p99"] = p99(x)
        out.append(rec)
    return pd.DataFrame(out)


def pairs(df: pd.DataFrame, metric: str, a: str, b: str, on: Sequence[str] = PAIR_KEYS,
          variant_col: str = "variant") -> pd.DataFrame:
    """Rows of variant a and variant b matched on `on`; columns on..., a, b, ratio (b/a).
    Requests with an error are left out."""
    on = [c for c in on if c in df.columns]
    d = df
    if "error" in d.columns:
        d = d[d["error"].fillna("") == ""]
    da = d[d[variant_col] == a][on + [metric]].rename(columns={metric: "a"})
    db = d[d[variant_col] == b][on + [metric]].rename(columns={metric: "b"})
    if da.duplicated(on).any() or db.duplicated(on).any():
        raise ValueError(f"pair keys {on} are not unique within a variant")
    p = da.merge(db, on=on, how="inner")
    p["a"] = p["a"].astype(float)
    p["b"] = p["b"].astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        p["ratio"] = p["b"] / p["a"]
    return p


def _estimate(r: np.ndarray, estimator: str, axis=None):
    if estimator == "gmean":
        return np.exp(np.mean(np.log(r), axis=axis))
    if estimator == "median":
        return np.median(r, axis=axis)
    raise ValueError(f"estimator must be 'gmean' or 'median', got {estimator!r}")


def bootstrap_ci(ratios, estimator: str = "gmean", n_boot: int = 2000, ci: float = 0.95,
                 seed: int = 0) -> tuple[float, float, float]:
    """(estimate, low, high): the estimator over the ratios and its percentile
    bootstrap interval at coverage `ci`, resampling pairs with a seeded rng."""
    r = np.asarray(ratios, dtype=float)
    r = r[np.isfinite(r) & (r > 0)]
    if len(r) == 0:
        return float("nan"), float("nan"), float("nan")
    est = float(_estimate(r, estimator))
    if len(r) == 1:
        return est, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(r), size=(n_boot, len(r)))
    boots = _estimate(r[idx], estimator, axis=1)
    alpha = (1.0 - ci) / 2.0
    lo, hi = np.quantile(boots, [alpha, 1.0 - alpha])
    return est, float(lo), float(hi)


def verdict(low: float, high: float, better: str) -> str:
    """"win" if the interval excludes 1 on the good side, "loss" on the bad
    side, otherwise "no clear difference" (also when the interval is unknown)."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return "no clear difference"
    if better == "lower":
        return "win" if high < 1.0 else "loss" if low > 1.0 else "no clear difference"
    if better == "higher":
        return "win" if low > 1.0 else "loss" if high < 1.0 else "no clear difference"
    raise ValueError("better must be 'lower' or 'higher'")


def compare(df: pd.DataFrame, metric: str, baseline: str, variant: str, *, better: str | None = None,
            estimator: str = "gmean", n_boot: int = 2000, ci: float = 0.95, seed: int = 0,
            on: Sequence[str] = PAIR_KEYS) -> dict:
    """Paired comparison of `variant` against `baseline` on one metric:
    n pairs, medians and p99 of both, the ratio variant/baseline with its
    bootstrap interval, and the verdict."""
    better = better or direction(metric)
    p = pairs(df, metric, baseline, variant, on=on)
    ok = np.isfinite(p["ratio"]) & (p["ratio"] > 0)
    est, lo, hi = bootstrap_ci(p.loc[ok, "ratio"], estimator=estimator, n_boot=n_boot, ci=ci, seed=seed)
    return {"metric": metric, "baseline": baseline, "variant": variant, "n_pairs": int(ok.sum()),
            "n_dropped": int((~ok).sum()),
            "median_baseline": float(p["a"].median()) if len(p) else float("nan"),
            "median_variant": float(p["b"].median()) if len(p) else float("nan"),
            "p99_baseline": p99(p["a"]), "p99_variant": p99(p["b"]),
            "ratio": est, "ci_low": lo, "ci_high": hi, "ci": ci, "estimator": estimator,
            "better": better, "verdict": verdict(lo, hi, better)}


def earns_its_keep(df: pd.DataFrame, metric: str, baseline: str, variant: str, **kw) -> bool:
    """True only if `variant` beats `baseline` on `metric` with the interval excluding 1."""
    return compare(df, metric, baseline, variant, **kw)["verdict"] == "win"


def output_equality(df: pd.DataFrame, a: str, b: str, on: Sequence[str] = PAIR_KEYS,
                    column: str = "output_hash") -> dict:
    """Compare outputs of two variants pair by pair (same repeat, prompt, turn, seed).
    Returns n_pairs, n_equal, all_equal and a `mismatches` DataFrame."""
    on_ = [c for c in on if c in df.columns]
    d = df[df["error"].fillna("") == ""] if "error" in df.columns else df
    da = d[d["variant"] == a][on_ + [column]].rename(columns={column: f"{column}_{a}"})
    db = d[d["variant"] == b][on_ + [column]].rename(columns={column: f"{column}_{b}"})
    p = da.merge(db, on=on_, how="inner")
    eq = (p[f"{column}_{a}"].astype(str) == p[f"{column}_{b}"].astype(str)).to_numpy()
    mism = p[~eq]
    return {"a": a, "b": b, "n_pairs": int(len(p)), "n_equal": int(eq.sum()),
            "all_equal": bool(len(p) > 0 and eq.all()), "mismatches": mism.reset_index(drop=True)}


# ------------------------------------------------------------ aggregates
def block_throughput(df: pd.DataFrame, by: Sequence[str] = ("variant", "repeat")) -> pd.DataFrame:
    """Aggregate output tokens per second of wall time for each block:
    sum(completion_tokens) / (last reply - first submit)."""
    by = [c for c in by if c in df.columns]
    extra = [c for c in ("concurrency",) if c in df.columns and c not in by]
    out = []
    for key, g in df.groupby(by, sort=False):
        span = float(g["t_done_s"].max() - g["t_submit_s"].min())
        toks = float(g["completion_tokens"].sum())
        rec = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        for c in extra:
            rec[c] = g[c].iloc[0]
        rec.update(n=len(g), completion_tokens=toks, wall_s=span,
                   throughput_tok_s=toks / span if span > 0 else float("nan"))
        out.append(rec)
    return pd.DataFrame(out)


def prefix_cache_hit_rate(df: pd.DataFrame, by: str | Sequence[str] = "variant") -> pd.DataFrame:
    """colibri_lab.metrics.SUMMARY's prefix_cache_hit_rate per group:
    sum(cached_tokens) / sum(prompt_tokens) (vLLM's prefix cache hits /
    queries, counted in tokens; NaN for a group without prompt tokens)."""
    by = [by] if isinstance(by, str) else list(by)
    g = df.groupby(by, sort=True)[["cached_tokens", "prompt_tokens"]].sum().reset_index()
    g["prefix_cache_hit_rate"] = g["cached_tokens"] / g["prompt_tokens"].where(g["prompt_tokens"] > 0)
    return g


def compare_blocks(df: pd.DataFrame, baseline: str, variant: str, metric: str = "throughput_tok_s",
                   **kw) -> dict:
    """Like compare() for block-level aggregates (throughput): blocks pair by repeat."""
    bt = block_throughput(df)
    bt["prompt_id"], bt["turn"], bt["seed"] = "block", 0, 0
    return compare(bt, metric, baseline, variant, **kw)


def bootstrap_mean_ci(values, weights=None, n_boot: int = 2000, ci: float = 0.95,
                      seed: int = 0) -> tuple[float, float, float]:
    """(estimate, low, high): the weighted mean of `values` (weights default 1)
    and its percentile bootstrap interval, resampling items with a seeded rng."""
    x = np.asarray(values, dtype=float)
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=float)
    ok = np.isfinite(x) & np.isfinite(w) & (w > 0)
    x, w = x[ok], w[ok]
    if len(x) == 0:
        return float("nan"), float("nan"), float("nan")
    est = float(np.sum(w * x) / np.sum(w))
    if len(x) == 1:
        return est, float("nan"), float("nan")
    idx = np.random.default_rng(seed).integers(0, len(x), size=(n_boot, len(x)))
    boots = np.sum(w[idx] * x[idx], axis=1) / np.sum(w[idx], axis=1)
    alpha = (1.0 - ci) / 2.0
    lo, hi = np.quantile(boots, [alpha, 1.0 - alpha])
    return est, float(lo), float(hi)


def numerics_table(results, *, ppl_tol: float = NUMERICS_PPL_TOL, agree_min: float = NUMERICS_AGREE_MIN,
                   n_boot: int = 2000, ci: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """One row per variant of the numerics pass: items, scored tokens,
    perplexity over all of them, the paired perplexity ratio against the
    baseline with its interval and verdict (as compare() gives for speed),
    KL(baseline || variant) and top-1 agreement as token-weighted means over
    items with bootstrap intervals, the largest per-position KL, and the
    numerics verdict: "identical" (every position's KL is 0 and every top-1
    agrees), "equivalent" (the perplexity ratio's interval within
    1 +- ppl_tol and the agreement's interval above agree_min) or "differs"."""
    num = results.numerics if hasattr(results, "numerics") else results
    meta = getattr(results, "meta", {}) or {}
    if num is None or len(num) == 0:
        return pd.DataFrame()
    variants = list(dict.fromkeys(num["variant"]))
    base = meta.get("experiment", {}).get("baseline") or variants[0]
    if base not in variants:
        base = variants[0]
    rows = []
    for v in variants:
        g = num[num["variant"] == v]
        w = g["n_scored"].astype(float).to_numpy()
        kl = bootstrap_mean_ci(g["kl_mean"], w, n_boot=n_boot, ci=ci, seed=seed)
        ag = bootstrap_mean_ci(g["top1_agree"], w, n_boot=n_boot, ci=ci, seed=seed)
        ppl = float(np.exp(np.sum(w * np.log(g["perplexity"].astype(float))) / np.sum(w)))
        rec = {"variant": v, "items": int(len(g)), "tokens": int(w.sum()), "perplexity": ppl}
        if v == base:
            rec.update({"ppl ratio": 1.0, "ppl ci": "baseline", "ppl verdict": ""})
        else:
            c = compare(num, "perplexity", base, v, better="lower", n_boot=n_boot, ci=ci, seed=seed,
                        on=("prompt_id",))
            rec.update({"ppl ratio": c["ratio"], "ppl ci": f"[{c['ci_low']:.4f}, {c['ci_high']:.4f}]",
                        "ppl verdict": c["verdict"]})
        rec.update({"KL mean": kl[0], "KL ci": f"[{kl[1]:.2e}, {kl[2]:.2e}]", "KL max": float(g["kl_max"].max()),
                    "top-1 agree": ag[0], "top-1 ci": f"[{ag[1]:.4f}, {ag[2]:.4f}]"})
        if v == base:
            rec["numerics"] = "baseline"
        elif (g["kl_max"] == 0).all() and (g["top1_agree"] == 1).all():
            rec["numerics"] = "identical"
        else:
            lo, hi = (c["ci_low"], c["ci_high"]) if len(g) > 1 else (c["ratio"], c["ratio"])
            agree_lo = ag[1] if len(g) > 1 else ag[0]
            within = np.isfinite(lo) and 1 - ppl_tol <= lo and hi <= 1 + ppl_tol
            rec["numerics"] = "equivalent" if within and agree_lo >= agree_min else "differs"
        rows.append(rec)
    return pd.DataFrame(rows).set_index("variant")


def summary_table(results, metrics: Sequence[str] = ("ttft_ms", "tpot_ms", "e2e_ms"),
                  primary: str = "e2e_ms", **kw) -> pd.DataFrame:
    """One row per variant: requests, medians (and p99 of e2e), aggregate
    throughput, prefix cache hit rate, the paired ratio of `primary` against the
    baseline with its interval and verdict, and output equality with the
    baseline (for lossless experiments, every mismatch is a bug); then the
    model file each variant ran and the commit of the run ("+dirty" when
    tracked files had uncommitted changes), from the results' metadata."""
    from pathlib import Path

    df = results.requests if hasattr(results, "requests") else results
    meta = getattr(results, "meta", {}) or {}
    if len(df) == 0:
        return pd.DataFrame()
    variants = list(dict.fromkeys(df["variant"]))
    base = meta.get("experiment", {}).get("baseline") or variants[0]
    if base not in variants:
        base = variants[0]
    s = summarize(df, metrics).set_index("variant")
    bt = block_throughput(df).groupby("variant")["throughput_tok_s"].median()
    hr = prefix_cache_hit_rate(df).set_index("variant")["prefix_cache_hit_rate"]
    rows = []
    for v in variants:
        rec = {"variant": v, "n": int(s.loc[v, "n"])}
        for m in metrics:
            rec[f"{m} median"] = s.loc[v, f"{m}_median"]
        if "e2e_ms" in metrics:
            rec["e2e_ms p99"] = s.loc[v, "e2e_ms_p99"]
        rec["tok/s (agg)"] = bt.get(v, float("nan"))
        rec["prefix_cache_hit_rate"] = hr.get(v, float("nan"))
        if v != base:
            c = compare(df, primary, base, v, **kw)
            rec[f"{primary} ratio"] = c["ratio"]
            rec["ci"] = f"[{c['ci_low']:.3f}, {c['ci_high']:.3f}]"
            rec["verdict"] = c["verdict"]
            rec["outputs equal"] = output_equality(df, base, v)["all_equal"]
        else:
            rec[f"{primary} ratio"] = 1.0
            rec["ci"] = "baseline"
            rec["verdict"] = ""
            rec["outputs equal"] = True
        if "errors" not in rec and "error" in df:
            rec["errors"] = int((df.loc[df["variant"] == v, "error"].fillna("") != "").sum())
        if meta:
            path = ((meta.get("engines") or {}).get(v) or {}).get("model_path")
            rec["model"] = Path(path).name if path else ""
            git = meta.get("git") or {}
            rec["commit"] = (git.get("commit") or "?")[:10] + ("+dirty" if git.get("dirty") else "")
        rows.append(rec)
    out = pd.DataFrame(rows).set_index("variant")
    num = getattr(results, "numerics", None)
    if num is not None and len(num):  # the numerics pass's verdicts next to the speed ones
        nt = numerics_table(results)
        for col in ("ppl ratio", "KL mean", "top-1 agree", "numerics"):
            out[col] = nt[col].reindex(out.index)
    if df.attrs.get("provenance"):
        out.attrs["provenance"] = df.attrs["provenance"]
    return out


# ------------------------------------------------------------ speculation
def acceptance_by_position(df: pd.DataFrame, by: str | Sequence[str] | None = "variant") -> pd.DataFrame:
    """Long-form acceptance by draft position from the request table's
    draft_n_pos_<i> / draft_accepted_pos_<i> columns (the engine's
    draft_n_by_pos / draft_accepted_by_pos lists, flattened by the runner):
    one row per (group, position) with drafted and accepted summed over
    requests and accept_rate = accepted / drafted (vLLM's
    spec_decode_num_accepted_tokens_per_pos over its draft tokens).
    Positions are 0-based (as Prometheus' position label); positions never
    drafted are left out."""
    from colibri_lab.metrics import POS_PREFIXES

    by = [] if by is None else [by] if isinstance(by, str) else list(by)
    by = [c for c in by if c in df.columns]
    if "error" in df.columns:
        df = df[df["error"].fillna("") == ""]
    n_cols = sorted((c for c in df.columns if c.startswith(POS_PREFIXES[0])), key=lambda c: int(c.rsplit("_", 1)[1]))
    out = []
    groups = df.groupby(by, sort=False) if by else [((), df)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        for c in n_cols:
            i = int(c.rsplit("_", 1)[1])
            a = f"{POS_PREFIXES[1]}{i}"
            drafted = int(pd.to_numeric(g[c], errors="coerce").fillna(0).sum())
            if drafted == 0:
                continue
            accepted = int(pd.to_numeric(g[a], errors="coerce").fillna(0).sum()) if a in g else 0
            out.append({**dict(zip(by, key)), "position": i, "drafted": drafted, "accepted": accepted,
                        "accept_rate": accepted / drafted})
    return pd.DataFrame(out, columns=by + ["position", "drafted", "accepted", "accept_rate"])


def acceptance_by_source(df: pd.DataFrame, by: str | Sequence[str] | None = "variant") -> pd.DataFrame:
    """Drafted / accepted tokens per draft source (draft_n_src_<s> columns),
    summed per group, with accept_rate."""
    from colibri_lab.metrics import SRC_PREFIXES

    by = [] if by is None else [by] if isinstance(by, str) else list(by)
    by = [c for c in by if c in df.columns]
    srcs = [c[len(SRC_PREFIXES[0]):] for c in df.columns if c.startswith(SRC_PREFIXES[0])]
    out = []
    groups = df.groupby(by, sort=False) if by else [((), df)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        for s in srcs:
            drafted = int(g[SRC_PREFIXES[0] + s].fillna(0).sum())
            accepted = int(g.get(SRC_PREFIXES[1] + s, pd.Series(0, index=g.index)).fillna(0).sum())
            out.append({**dict(zip(by, key)), "source": s, "drafted": drafted, "accepted": accepted,
                        "accept_rate": accepted / drafted if drafted else float("nan")})
    return pd.DataFrame(out, columns=by + ["source", "drafted", "accepted", "accept_rate"])


# ------------------------------------------------------------ grammar
def json_validity(df: pd.DataFrame, workload, column: str = "output_text") -> pd.DataFrame:
    """Parse every output as JSON and validate it against its workload item's
    JSON Schema (jsonschema's Draft 2020-12 validator with format checking).
    Returns the request table's key columns plus parses (bool), valid (bool)
    and problem (the first error, "" when valid).  Items without a schema give
    valid = parses.  Needs the optional `jsonschema` package."""
    import json

    import jsonschema

    from colibri_lab.experiments.workloads import load_workload

    wl = load_workload(workload)   # a name, path, dict or Workload
    schemas = {it.id: it.schema for it in wl.items}
    fmt = jsonschema.Draft202012Validator.FORMAT_CHECKER
    validators: dict[str, jsonschema.Draft202012Validator] = {}
    recs = []
    for r in df.itertuples(index=False):
        pid = str(r.prompt_id)
        text = getattr(r, column)
        parses, valid, problem = False, False, ""
        try:
            obj = json.loads(text)
            parses = True
        except (TypeError, ValueError) as exc:
            problem = f"not JSON: {exc}"
        if parses:
            schema = schemas.get(pid)
            if schema is None:
                valid = True
            else:
                if pid not in validators:
                    jsonschema.Draft202012Validator.check_schema(schema)
                    validators[pid] = jsonschema.Draft202012Validator(schema, format_checker=fmt)
                err = jsonschema.exceptions.best_match(validators[pid].iter_errors(obj))
                valid = err is None
                problem = "" if valid else f"invalid: {err.message}"
        recs.append({"variant": r.variant, "repeat": r.repeat, "prompt_id": pid, "parses": parses,
                     "valid": valid, "problem": problem})
    return pd.DataFrame(recs, columns=["variant", "repeat", "prompt_id", "parses", "valid", "problem"])
