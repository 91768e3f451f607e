"""Plots of experiment results: pure functions DataFrame -> matplotlib Figure.

No pyplot, no global state, no plt.show(): each function builds its own
`matplotlib.figure.Figure` (displayed by Jupyter's inline backend, or saved
with fig.savefig).  Pass `ax=` to draw into an existing Axes instead (the
function then returns that Axes' figure).

    fig = plots.latency_cdf(results.requests, "ttft_ms")
    fig = plots.step_breakdown(results.steps)
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from colibri_lab.metrics import PHASES  # a partition of step_ms: the stacked bars add up to it


def _axes(ax=None, figsize=(6.4, 4.0)):
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot(1, 1, 1)


def _stamp(fig: Figure, src) -> Figure:
    """Put where the data came from (commit, model, SIMD, threads, CPU; see
    results.provenance_line) under the figure, when the data knows it: a
    Results, or a frame taken from one (its attrs carry the line)."""
    line = ""
    if hasattr(src, "meta"):
        from colibri_lab.experiments.results import provenance_line

        line = provenance_line(src.meta)
    elif isinstance(src, pd.DataFrame):
        line = src.attrs.get("provenance", "")
    if line and not getattr(fig, "_colibri_stamped", False):
        fig.text(0.0, 0.0, line, fontsize=6.5, color="0.35", ha="left", va="top", transform=fig.transFigure)
        fig._colibri_stamped = True
    return fig


def _requests(df) -> pd.DataFrame:
    return df.requests if hasattr(df, "requests") else df


def _steps(df) -> pd.DataFrame:
    return df.steps if hasattr(df, "steps") else df


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    if "error" in df.columns:
        return df[df["error"].fillna("") == ""]
    return df


def _groups(df: pd.DataFrame, by: str | None):
    if by is None or by not in df.columns:
        return [("all", df)]
    return [(k, g) for k, g in df.groupby(by, sort=False)]


def latency_cdf(df, metric: str = "ttft_ms", by: str | None = "variant", ax=None, log: bool = False) -> Figure:
    """Empirical CDF of a per-request latency metric, one line per group, with
    the median marked."""
    df = _ok(_requests(df))
    fig, ax = _axes(ax)
    for name, g in _groups(df, by):
        x = np.sort(pd.to_numeric(g[metric], errors="coerce").dropna().to_numpy(float))
        if not len(x):
            continue
        y = np.arange(1, len(x) + 1) / len(x)
        line, = ax.step(x, y, where="post", label=f"{name} (n={len(x)}, p50={np.median(x):.3g})")
        ax.axvline(np.median(x), color=line.get_color(), lw=0.8, ls=":")
    ax.set_xlabel(metric)
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    if log:
        ax.set_xscale("log")
    ax.set_title(f"{metric}: CDF")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    return _stamp(fig, df)


def throughput_vs_concurrency(df, x: str = "concurrency", by: str | None = None, ax=None) -> Figure:
    """Aggregate output tokens/s of each block (sum of completion tokens over
    the block's wall time) against `x` (a column constant within a variant):
    median over repeats with the min-max range as error bars; the median
    per-request decode tok/s is drawn dashed.  `by` splits lines by another
    per-variant column."""
    from colibri_lab.experiments.stats import block_throughput

    df = _ok(_requests(df))
    fig, ax = _axes(ax)
    bt = block_throughput(df, by=("variant", "repeat"))
    cols = [c for c in dict.fromkeys([x, by]) if c and c in df.columns and c not in bt.columns]
    if cols:
        bt = bt.merge(df.groupby("variant", sort=False)[cols].first().reset_index(), on="variant")
    for name, g in _groups(bt, by):
        agg = g.groupby(x)["throughput_tok_s"].agg(["median", "min", "max"]).sort_index()
        xs = agg.index.to_numpy(float)
        ax.errorbar(xs, agg["median"], yerr=[agg["median"] - agg["min"], agg["max"] - agg["median"]],
                    marker="o", capsize=3, label=f"aggregate {name}" if by else "aggregate")
        rq = df[df["variant"].isin(g["variant"].unique())]
        d = rq.groupby(x)["decode_tok_s"].median().sort_index()
        ax.plot(d.index.to_numpy(float), d.to_numpy(), ls="--", marker=".",
                label=f"per request {name}" if by else "per request (median)")
    ax.set_xlabel(x)
    ax.set_ylabel("output tokens / s")
    ax.set_title(f"Throughput vs {x}")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _stamp(fig, df)


def acceptance_by_position(df, by: str | None = "variant", ax=None) -> Figure:
    """Draft acceptance rate by draft position (0 = first drafted token), one
    bar group per position, one bar per group (variant); the legend gives how
    many drafted tokens each group had verified.  The engine verifies position
    i only when positions 0..i-1 were accepted, so the rate at i is
    P(accept at i | accepted before i).

    `df` is either the request table (or Results) with the runner's
    draft_n_pos_<i> / draft_accepted_pos_<i> columns (the engine's
    draft_n_by_pos / draft_accepted_by_pos metrics), or long-form with columns
    position, drafted, accepted [, variant] (counts summed per position, as
    vLLM's spec_decode_num_accepted_tokens_per_pos)."""
    from colibri_lab.experiments.stats import acceptance_by_position as _table
    from colibri_lab.metrics import POS_PREFIXES

    df = _requests(df)
    need = {"position", "drafted", "accepted"}
    if not need <= set(df.columns):
        if any(c.startswith(POS_PREFIXES[0]) for c in df.columns):
            df = _table(df, by=by)
        else:
            raise ValueError(f"acceptance_by_position needs columns {sorted(need)} or the request table's "
                             f"draft_n_pos_<i> columns, got {list(df.columns)}")
    fig, ax = _axes(ax)
    groups = _groups(df, by)
    width = 0.8 / max(1, len(groups))
    for i, (name, g) in enumerate(groups):
        s = g.groupby("position")[["drafted", "accepted"]].sum().sort_index()
        rate = s["accepted"] / s["drafted"].where(s["drafted"] > 0)
        ax.bar(s.index.to_numpy(float) + (i - (len(groups) - 1) / 2) * width, rate.to_numpy(), width=width,
               label=f"{name} ({int(s['drafted'].sum())} verified)")
    if len(df):
        ax.set_xticks(sorted(pd.unique(df["position"])))
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate (accepted / drafted there)")
    ax.set_ylim(0, 1.05)
    ax.set_title("Acceptance by draft position")
    ax.grid(alpha=0.3, axis="y")
    if by and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", loc="lower right")
    return _stamp(fig, df)


def grammar_mask_per_token(df, by: str | None = "variant", ax=None) -> Figure:
    """Distribution (CDF) over requests of the grammar mask time per token, in
    µs: the engine's grammar_mask_us is already the mean time of one mask
    (one mask per sampled position).  Requests without a grammar (0) are left out."""
    df = _ok(_requests(df))
    d = df[(df["completion_tokens"] > 0) & (df["grammar_mask_us"].astype(float) > 0)].copy()
    d["mask_us_per_token"] = d["grammar_mask_us"].astype(float)
    fig = latency_cdf(d, "mask_us_per_token", by=by, ax=ax)
    fig.axes[0].set_xlabel("grammar mask time per token (µs)")
    fig.axes[0].set_title("Grammar mask cost per token")
    return fig


def prefix_cache_hit_rate_by_turn(df, by: str | None = "variant", ax=None) -> Figure:
    """Prefix cache hit rate (sum cached_tokens / sum prompt_tokens) per turn, grouped bars."""
    from colibri_lab.experiments.stats import prefix_cache_hit_rate

    df = _ok(_requests(df))
    fig, ax = _axes(ax)
    keys = [by, "turn"] if by and by in df.columns else ["turn"]
    hr = prefix_cache_hit_rate(df, by=keys)
    groups = _groups(hr, by if by in hr.columns else None)
    width = 0.8 / max(1, len(groups))
    for i, (name, g) in enumerate(groups):
        ax.bar(g["turn"].to_numpy(float) + (i - (len(groups) - 1) / 2) * width, g["prefix_cache_hit_rate"].to_numpy(),
               width=width, label=str(name))
    ax.set_xlabel("turn")
    ax.set_ylabel("prefix cache hit rate (cached / prompt tokens)")
    ax.set_ylim(0, 1.05)
    ax.set_xticks(sorted(hr["turn"].unique()))
    ax.set_title("Prefix cache hit rate by turn")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small")
    return _stamp(fig, df)


def step_breakdown(steps, by: str = "variant", phases: Sequence[str] = PHASES, kind: str = "mean",
                   ax=None) -> Figure:
    """Stacked bars of per-step time by phase (colibri_lab.metrics.PHASES, a
    partition of step_ms, so a bar's height is the step time): mean (or total
    with kind="total") ms per step for each group."""
    st = _steps(steps)
    fig, ax = _axes(ax)
    phases = [p for p in phases if p in st.columns]
    if by in st.columns:
        g = st.groupby(by, sort=False)[phases]
        agg = g.mean() if kind == "mean" else g.sum()
    else:
        agg = pd.DataFrame([st[phases].mean() if kind == "mean" else st[phases].sum()], index=["all"])
    bottom = np.zeros(len(agg))
    xs = np.arange(len(agg))
    for p in phases:
        vals = agg[p].to_numpy(float)
        ax.bar(xs, vals, bottom=bottom, label=p.removesuffix("_ms"))
        bottom += vals
    ax.set_xticks(xs)
    ax.set_xticklabels([str(i) for i in agg.index], rotation=20, ha="right")
    ax.set_ylabel("ms per step" if kind == "mean" else "total ms")
    ax.set_title("Step time by phase")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small", ncols=2)
    return _stamp(fig, st)


def latency_vs_rate(table, metrics: Sequence[str] = ("p99_ttft_ms", "p99_itl_ms", "p99_tpot_ms"),
                    by: str = "server", bounds: dict | None = None, log: bool = True) -> Figure:
    """Serving latency percentiles against the offered request rate, one panel
    per metric of serve_bench.serve_table (p50/p90/p99 of ttft, tpot, itl,
    e2el), one line per `by` group; `bounds` ({metric: ms}) draws SLO lines."""
    t = table.reset_index() if "variant" not in getattr(table, "columns", []) else table
    fig = Figure(figsize=(4.2 * len(metrics), 3.8), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, m in zip(axes, metrics):
        for name, g in _groups(t, by):
            g = g.sort_values("rate")
            ax.plot(g["rate"].to_numpy(float), g[m].to_numpy(float), marker="o", label=str(name))
        if bounds and m in bounds:
            ax.axhline(bounds[m], color="grey", ls="--", lw=1, label=f"SLO {bounds[m]:g} ms")
        ax.set_xscale("log", base=2)
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("request rate (req/s, Poisson)")
        ax.set_ylabel(m)
        ax.set_title(m.replace("_ms", "").replace("_", " ").upper().replace("P", "p", 1) + " vs rate")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize="small")
    return _stamp(fig, table)


def goodput_vs_rate(table, by: str = "server", ax=None) -> Figure:
    """Request throughput and goodput (requests meeting every SLO per second)
    against the offered rate, one colour per `by` group; the dotted diagonal
    is the offered rate (a server that keeps up completes at it)."""
    t = table.reset_index() if "variant" not in getattr(table, "columns", []) else table
    fig, ax = _axes(ax)
    for name, g in _groups(t, by):
        g = g.sort_values("rate")
        line, = ax.plot(g["rate"].to_numpy(float), g["request_throughput"].to_numpy(float), marker="o",
                        label=f"{name} throughput")
        if "request_goodput" in g:
            ax.plot(g["rate"].to_numpy(float), g["request_goodput"].to_numpy(float), marker="s", ls="--",
                    color=line.get_color(), label=f"{name} goodput")
    if len(t):
        r = np.sort(t["rate"].to_numpy(float))
        ax.plot(r, r, ls=":", color="grey", label="offered rate")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("request rate (req/s, Poisson)")
    ax.set_ylabel("requests / s")
    ax.set_ylim(bottom=0)
    ax.set_title("Throughput and goodput vs rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _stamp(fig, table)


def ratio_forest(comparisons: pd.DataFrame | Sequence[dict], ax=None) -> Figure:
    """Paired ratios with their confidence intervals (from stats.compare), one
    line per comparison, with the no-change line at 1."""
    c = pd.DataFrame(list(comparisons)) if not isinstance(comparisons, pd.DataFrame) else comparisons
    fig, ax = _axes(ax, figsize=(6.4, 0.6 + 0.5 * max(1, len(c))))
    ys = np.arange(len(c))[::-1]
    lo = (c["ratio"] - c["ci_low"]).clip(lower=0)
    hi = (c["ci_high"] - c["ratio"]).clip(lower=0)
    ax.errorbar(c["ratio"], ys, xerr=[lo, hi], fmt="o", capsize=3)
    ax.axvline(1.0, color="grey", ls="--")
    ax.set_yticks(ys)
    ax.set_yticklabels([f"{r.variant} / {r.baseline}: {r.metric} ({r.verdict})" for r in c.itertuples()])
    ax.set_xlabel("ratio (variant / baseline)")
    ax.set_title("Paired ratios with bootstrap intervals")
    return fig


def expert_heatmap(counts, ax=None, normalize: bool = True) -> Figure:
    """MoE expert heat: layers x experts, from Engine.core.expert_counts() or
    the server's /experts counts.  normalize=True shows each layer's share."""
    c = np.asarray(counts, dtype=float)
    if c.ndim != 2 or c.shape[1] == 0:
        raise ValueError("expert_heatmap needs a [n_layer, n_expert] array of counts (dense models have none)")
    if normalize:
        tot = c.sum(axis=1, keepdims=True)
        c = np.divide(c, tot, out=np.zeros_like(c), where=tot > 0)
    fig, ax = _axes(ax, figsize=(max(4.0, 0.25 * c.shape[1] + 2), max(3.0, 0.3 * c.shape[0] + 1.5)))
    im = ax.imshow(c, aspect="auto", cmap="magma", interpolation="nearest")
    ax.set_xlabel("expert")
    ax.set_ylabel("layer")
    ax.set_title("expert heat" + (" (share of each layer's routings)" if normalize else " (routings)"))
    fig.colorbar(im, ax=ax)
    return fig


def speedup_by_category(table, ax=None) -> Figure:
    """Decode speedup per task category and arm with its interval, from
    colibri_lab.speculative.category_speedups (columns category, arm,
    speedup, ci_low, ci_high); a line at 1 (plain decoding)."""
    fig, ax = _axes(ax, figsize=(8.0, 4.2))
    cats = list(dict.fromkeys(table["category"]))
    arms = list(dict.fromkeys(table["arm"]))
    width = 0.8 / max(1, len(arms))
    for j, arm in enumerate(arms):
        g = table[table.arm == arm].set_index("category")
        xs = [i + (j - (len(arms) - 1) / 2) * width for i, c in enumerate(cats) if c in g.index]
        ys = [g.loc[c, "speedup"] for c in cats if c in g.index]
        lo = [g.loc[c, "speedup"] - g.loc[c, "ci_low"] for c in cats if c in g.index]
        hi = [g.loc[c, "ci_high"] - g.loc[c, "speedup"] for c in cats if c in g.index]
        yerr = np.nan_to_num(np.array([lo, hi], dtype=float))
        ax.bar(xs, ys, width=width, label=arm, yerr=yerr, capsize=2)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(cats)))
    ax.set_xticklabels(cats, rotation=30, ha="right")
    ax.set_ylabel("decode speedup vs plain")
    ax.legend(fontsize="small", ncol=min(3, len(arms)))
    return _stamp(fig, table)


def acceptance_by_position_category(table, arms: Sequence[str] | None = None, ax=None) -> Figure:
    """Acceptance rate by draft position (vLLM's: accepted at i / drafts) per
    category, one panel per arm, from category_speedups' acceptance_rate_pos_<i>."""
    arms = list(arms or dict.fromkeys(table["arm"]))
    if ax is not None:
        fig, axes = ax.figure, [ax] * len(arms)
    else:
        fig = Figure(figsize=(3.2 * len(arms), 3.4), layout="constrained")
        axes = [fig.add_subplot(1, len(arms), i + 1) for i in range(len(arms))]
    cols = sorted((c for c in table.columns if c.startswith("acceptance_rate_pos_")),
                  key=lambda c: int(c.rsplit("_", 1)[1]))
    for a, arm in zip(axes, arms):
        g = table[table.arm == arm]
        for r in g.itertuples():
            ys = [getattr(r, c) for c in cols]
            xs = [i for i, y in enumerate(ys) if y == y]      # positions are 0-based (colibri_lab.metrics)
            a.plot(xs, [y for y in ys if y == y], marker=".", label=r.category)
        a.set_title(arm)
        a.set_xlabel("draft position")
        a.set_ylim(0, 1)
    axes[0].set_ylabel("accepted / drafts")
    axes[-1].legend(fontsize="x-small")
    return _stamp(fig, table)
