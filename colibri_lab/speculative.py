"""Speculative decoding on the Python side: the measured calibration that
chooses which layers a layer-skip drafter skips, and the speculation metrics
under vLLM's names (per request, per group of requests).

Layer skip drafts with the target itself, some blocks left out.  Which
blocks matters more than how many (the first and last carry the most), and
it differs by model, so it is measured, not guessed:

1. the full model's teacher-forced greedy tokens over a calibration text;
2. for every block l, the same with only l skipped: the fraction of positions
   whose greedy token is unchanged (agreement) says how much l matters;
3. blocks ordered from least to most harmful; for the first m of them
   (m = 1, 2, ...) the agreement with all m skipped, a, and the measured time
   of that pass relative to the full one, c (the LM head is never skipped);
4. the chosen m maximises the expected speedup of drafting k tokens,
   max_k (1 + a + ... + a^k) / (v(k) + k c), with v(k) the measured cost of
   verifying k drafts relative to one decode row, and a the per-token
   acceptance (teacher-forced agreement is exactly the probability that a
   greedy draft token is accepted when the ones before it were).

The result is cached per model file (name, size, mtime) under the model
cache directory; `Engine(..., layer_skip=True)` uses it.

The speculation metrics (spec_summary, spec_table) are colibri_lab.metrics.SUMMARY's,
under vLLM's names.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from colibri_lab.metrics import SPEC_POS_PREFIX, SPEC_SUMMARY_SCALARS, spec_summary  # noqa: F401 (re-exported)


# ------------------------------------------------------------ metrics
def spec_table(df, by: Sequence[str] = ("variant",)):
    """The speculation metrics of colibri_lab.metrics.SUMMARY per group of a request DataFrame
    (the runner's columns: draft_steps, draft_n, draft_accepted,
    draft_n_pos_<i>, draft_accepted_pos_<i>, draft_ms, decode_ms)."""
    import pandas as pd

    by = list(by)
    pos_cols = sorted((c for c in df.columns if c.startswith("draft_accepted_pos_")),
                      key=lambda c: int(c.rsplit("_", 1)[1]))
    rows = []
    for key, g in df.groupby(by, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        ms = []
        for _, r in g.iterrows():
            n_pos = [int(r.get(f"draft_n_pos_{c.rsplit('_', 1)[1]}", 0) or 0) for c in pos_cols]
            ms.append({"draft_steps": r.get("draft_steps", 0), "draft_n": r.get("draft_n", 0),
                       "draft_accepted": r.get("draft_accepted", 0), "draft_ms": r.get("draft_ms", 0.0),
                       "decode_ms": r.get("decode_ms", 0.0),
                       "draft_accepted_by_pos": [int(r.get(c, 0) or 0) for c in pos_cols],
                       "draft_n_by_pos": n_pos})
        s = spec_summary(ms)
        row = dict(zip(by, key))
        row.update({k: s[k] for k in SPEC_SUMMARY_SCALARS})
        for i, v in enumerate(s["acceptance_rate_per_pos"]):
            row[f"{SPEC_POS_PREFIX}{i}"] = v
        rows.append(row)
    return pd.DataFrame(rows)


# ------------------------------------------------------- layer-skip calibration

# Mixed prose, chat and code: what the drafter will have to continue.  Written for this project.
CALIBRATION_TEXT = (
    "The museum opens at nine in the morning and closes at six, except on Mondays. Visitors who arrive "
    "before ten can join a free guided tour of the main hall, where the oldest maps of the harbour are kept.\n\n"
    "Q: How many minutes are there in three and a half hours?\n"
    "A: One hour has 60 minutes, so three hours have 180 minutes and half an hour has 30. In total "
    "180 + 30 = 210 minutes.\n\n"
    "def moving_average(values, window):\n"
    "    \"\"\"Return the averages of every run of `window` consecutive values.\"\"\"\n"
    "    if window <= 0:\n"
    "        raise ValueError(\"window must be positive\")\n"
    "    out = []\n"
    "    total = sum(values[:window])\n"
    "    out.append(total / window)\n"
    "    for i in range(window, len(values)):\n"
    "        total += values[i] - values[i - window]\n"
    "        out.append(total / window)\n"
    "    return out\n"
)


@dataclass
class LayerSkipCalibration:
    """What the calibration measured and chose (see the module docstring)."""

    model: str
    n_layer: int
    n_tokens: int
    layer_agreement: list[float]          # agreement with only block l skipped, by l
    order: list[int]                      # blocks from least to most harmful
    curve: list[dict] = field(default_factory=list)  # per m: skipped, agreement, cost, expected_speedup, k
    verify_cost: list[float] = field(default_factory=list)  # v(k) for k = 0..k_max (v(0) = 1)
    skip_layers: list[int] = field(default_factory=list)
    expected_speedup: float = 0.0
    seconds: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, s: str) -> "LayerSkipCalibration":
        return cls(**json.loads(s))


def expected_speedup(a: float, cost: float, verify_cost: Sequence[float]) -> tuple[float, int]:
    """max over k >= 1 of (1 + a + ... + a^k) / (v(k) + k * cost), and that k."""
    best, best_k, e, p = 0.0, 0, 1.0, 1.0
    for k in range(1, len(verify_cost)):
        p *= a
        e += p
        g = e / (verify_cost[k] + k * cost)
        if g > best:
            best, best_k = g, k
    return best, best_k


def _timed(fn, repeats: int = 1):
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return out, best


def calibrate_layer_skip(core, tokens: Sequence[int], *, max_skip: int | None = None, k_max: int = 8,
                         model_name: str = "") -> LayerSkipCalibration:
    """Measure and choose the blocks to skip on an idle engine `core`
    (colibri_lab._engine.Engine; slot 0 is used and cleared)."""
    import numpy as np

    t0 = time.perf_counter()
    n_layer = int(core.model.info["n_layer"])
    tokens = [int(t) for t in tokens]
    if len(tokens) < 16:
        raise ValueError("calibration needs at least 16 tokens")
    if max_skip is None:
        max_skip = n_layer // 2
    max_skip = max(1, min(max_skip, n_layer - 1))
    n = len(tokens)

    def run(skip):
        return core.forward_argmax(0, tokens, 0, skip=list(skip))

    full, t_full = _timed(lambda: run(()), 3)
    # verify cost: k + 1 rows after the text vs one row (decode-like), best of 3
    v = [1.0]
    base_ms = None
    for k in range(0, k_max + 1):
        _, t = _timed(lambda k=k: core.forward_argmax(0, tokens[n - 1 - k:n], n - 1 - k), 3)
        if k == 0:
            base_ms = t
        else:
            v.append(max(1.0, t / base_ms))
    agree = []
    for layer in range(n_layer):
        a = run((layer,))
        agree.append(float(np.mean(a == full)))
    order = sorted(range(n_layer), key=lambda layer: (-agree[layer], layer))
    curve, best = [], None
    for m in range(1, max_skip + 1):
        skip = sorted(order[:m])
        a_m, t_m = _timed(lambda: run(skip), 2)
        a = float(np.mean(a_m == full))
        cost = min(1.0, t_m / t_full)  # leaving blocks out cannot cost more: a slower pass was noise
        sp, k = expected_speedup(a, cost, v)
        curve.append({"skipped": m, "layers": skip, "agreement": a, "cost": cost, "expected_speedup": sp, "k": k})
        if best is None or sp > best["expected_speedup"]:
            best = curve[-1]
        if a < 0.2:  # deeper cuts only get worse
            break
    core.slot_clear(0)
    return LayerSkipCalibration(model=model_name, n_layer=n_layer, n_tokens=n, layer_agreement=agree, order=order,
                                curve=curve, verify_cost=v, skip_layers=list(best["layers"]),
                                expected_speedup=float(best["expected_speedup"]),
                                seconds=time.perf_counter() - t0)


def _cache_path(model_path: str | os.PathLike) -> Path:
    from colibri_lab import models

    p = Path(model_path)
    st = p.stat()
    root = Path(models.cache_dir())
    return root / "calibration" / f"layer_skip-{p.name}-{st.st_size}-{st.st_mtime_ns}.json"


def layer_skip_for(model, model_path: str | os.PathLike, tokenizer, *, n_threads: int = 0,
                   recalibrate: bool = False) -> LayerSkipCalibration:
    """The calibrated layer-skip set for a model file: from the cache, or
    measured now (a temporary engine over `model`, a colibri_lab._engine.Model)."""
    from colibri_lab import _engine

    path = _cache_path(model_path)
    if path.is_file() and not recalibrate:
        try:
            return LayerSkipCalibration.from_json(path.read_text())
        except (ValueError, TypeError):
            pass  # a stale or damaged cache entry: measure again
    tokens = tokenizer.encode(CALIBRATION_TEXT, add_special=False)
    core = _engine.Engine(model, n_slots=1, n_ctx=len(tokens) + 16, n_threads=n_threads)
    try:
        cal = calibrate_layer_skip(core, tokens, model_name=Path(model_path).name)
    finally:
        core.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(cal.to_json())
    tmp.replace(path)
    return cal


# ------------------------------------------------------- speedup by task category

# Arms of the category benchmark: the speculative settings of each (None: plain decoding).  Every
# speculating arm is adaptive (the policy picks depth and source per request and pauses what does not pay).
# The adaptive arm leaves layer skip out: its drafter must first run the whole prompt through the kept
# blocks of the target (nearly a second prefill) and its calibrated expected speedup is about 1.1x at best.
CATEGORY_ARMS = {
    "plain": None,
    "lookup": {"sources": ["prompt_lookup"], "k_max": 16},
    "draft": {"sources": ["draft"], "k_max": 8},
    "cross_vocab": {"sources": ["cross_vocab"], "k_max": 8},
    "layer_skip": {"sources": ["layer_skip"], "k_max": 8},
    "adaptive": {"sources": ["prompt_lookup", "draft", "cross_vocab"], "k_max": 16},
    # prompt lookup where the text copies, the same-vocabulary draft model where it does not: the policy
    # prices both per step, and a draft-model draft that reaches copied text continues by lookup
    "combined": {"sources": ["prompt_lookup", "draft"], "k_max": 16},
}


def _run_one(core, ids, max_tokens, speculative=None):
    """One request on an idle engine: tokens, metrics, decode tok/s by wall clock
    ((tokens - 1) / time from the first to the last token event)."""
    kw = {"speculative": speculative} if speculative else {}
    rid = core.submit(ids, max_tokens=max_tokens, **kw)
    toks, metrics, t_first, t_last = [], None, None, None
    while core.pending:
        evs = core.step()
        now = time.perf_counter()
        for ev in evs:
            if ev["id"] != rid:
                continue
            if ev["type"] == "token":
                t_first = now if t_first is None else t_first
                t_last = now
                toks.append(ev["token"])
            elif ev["type"] == "done":
                metrics = ev["metrics"]
            else:
                raise RuntimeError(ev["message"])
    tps = (len(toks) - 1) / (t_last - t_first) if len(toks) > 1 and t_last > t_first else float("nan")
    return toks, metrics, tps


def category_prompts(tokenizer, chat_template, categories, n_per: int, plain_core=None, max_tokens: int = 128):
    """{category: [(item id, prompt token ids)]}: the first n_per items of each
    category workload, rendered with the chat template.  Multi-turn items are
    measured on their last turn, whose history holds the model's own earlier
    replies (greedy, from plain_core: lossless decoding makes them the same
    for every arm)."""
    from colibri_lab.chat import render
    from colibri_lab.experiments import load_workload

    def ids_of(msgs):
        return tokenizer.encode(render(chat_template, msgs, add_generation_prompt=True), add_special=False)

    out = {}
    for cat in categories:
        rows = []
        for it in load_workload(cat, n=n_per).items:
            replies = []
            for t in range(len(it.turns) - 1):
                if plain_core is None:
                    raise ValueError(f"{cat}: multi-turn items need plain_core for the earlier replies")
                toks, _, _ = _run_one(plain_core, ids_of(it.messages(t, replies)), max_tokens)
                replies.append(plain_core.model.detokenize_bytes(toks).decode("utf-8", errors="replace"))
            rows.append((it.id, ids_of(it.messages(len(it.turns) - 1, replies))))
        out[cat] = rows
    return out


def run_categories(make_engine, prompts: Mapping[str, Sequence], arms: Sequence[str], *, max_tokens: int = 128,
                   repeats: int = 1, slow_arms: Mapping[str, int] | None = None, progress=None):
    """Plain vs speculative arms on every category's prompts, interleaved.

    make_engine(arm) -> the colibri_lab._engine.Engine for that arm, called
    once per arm and category (a fresh one: the policy learns the category
    from nothing; arms may share one, whose prefix reuse then saves the
    prompt's prefill for the next arm on the same prompt).
    For each prompt the arms run back to back in an order that rotates with
    the prompt (ABBA-like), then the next prompt.  slow_arms {arm: n}: that
    arm runs on the first n prompts of each category only.
    Returns (requests DataFrame, {category: {arm: spec_stats}})."""
    import pandas as pd

    from colibri_lab.metrics import flat_columns as list_metric_columns

    rows, policy = [], {}
    slow_arms = dict(slow_arms or {})
    for cat, items in prompts.items():
        cores = {arm: make_engine(arm) for arm in arms}
        try:
            _run_one(cores["plain"], items[0][1], 8)  # warm-up
            for r in range(repeats):
                for i, (iid, ids) in enumerate(items):
                    k = (r * len(items) + i) % len(arms)
                    ref = None
                    for arm in list(arms[k:]) + list(arms[:k]):
                        if arm in slow_arms and i >= slow_arms[arm]:
                            continue
                        toks, m, tps = _run_one(cores[arm], ids, max_tokens, CATEGORY_ARMS[arm])
                        row = {"category": cat, "item": iid, "arm": arm, "repeat": r, "order": len(rows),
                               "prompt_tokens": len(ids), "completion_tokens": len(toks), "decode_tok_s": tps,
                               "tokens": toks}
                        row.update({key: m[key] for key in ("draft_steps", "draft_n", "draft_accepted", "draft_ms",
                                                            "decode_ms", "e2e_ms", "finish_reason")})
                        row.update(list_metric_columns(m))
                        rows.append(row)
                    if progress:
                        progress(cat, r, i)
            policy[cat] = {arm: c.spec_stats() for arm, c in cores.items() if arm != "plain"}
        finally:
            for c in {id(c): c for c in cores.values()}.values():
                c.close()
    df = pd.DataFrame(rows)
    for c in df.columns:
        if c.startswith(("draft_n_pos_", "draft_accepted_pos_", "draft_n_src_", "draft_accepted_src_")):
            df[c] = df[c].fillna(0).astype(int)
    plain = {(r.category, r.item, r.repeat): r.tokens for r in df[df.arm == "plain"].itertuples()}
    df["identical"] = [plain.get((r.category, r.item, r.repeat)) == r.tokens for r in df.itertuples()]
    return df, policy


def category_speedups(df, baseline: str = "plain", n_boot: int = 2000):
    """Per (category, arm): decode speedup vs the baseline (geometric mean of
    the paired per-prompt tok/s ratios, bootstrap 95% interval), outputs
    identical, and the vLLM-named speculation metrics."""
    import numpy as np
    import pandas as pd

    from colibri_lab.experiments.stats import bootstrap_ci

    base = {(r.category, r.item, r.repeat): r.decode_tok_s for r in df[df.arm == baseline].itertuples()}
    out = []
    for (cat, arm), g in df[df.arm != baseline].groupby(["category", "arm"], sort=False):
        ratios = [r.decode_tok_s / base[(cat, r.item, r.repeat)] for r in g.itertuples()
                  if base.get((cat, r.item, r.repeat))]
        est, lo, hi = bootstrap_ci(np.asarray(ratios), n_boot=n_boot)
        row = {"category": cat, "arm": arm, "speedup": est, "ci_low": lo, "ci_high": hi, "n_pairs": len(ratios),
               "identical": bool(g.identical.all()),
               "tok_s": float(np.median(g.decode_tok_s)),
               "plain_tok_s": float(np.median([base[(cat, r.item, r.repeat)] for r in g.itertuples()
                                               if (cat, r.item, r.repeat) in base]))}
        row.update(spec_table(g, by=["arm"]).iloc[0].drop("arm").to_dict())
        out.append(row)
    return pd.DataFrame(out)


def load_category_runs(dirs):
    """The parts of a category benchmark saved by scripts/bench_spec.py
    (each DIR/requests.csv and DIR/meta.json) as one run: (requests
    DataFrame, llama.cpp anchor rows, the parts' metas).  A category measured
    in several parts: the last one's rows (the anchor's: the last part that
    ran the anchor on it)."""
    import pandas as pd

    metas, dfs, llama = [], [], []
    for i, d in enumerate(dirs):
        with open(os.path.join(d, "meta.json")) as f:
            m = json.load(f)
        m["dir"] = d
        df = pd.read_csv(os.path.join(d, "requests.csv"), keep_default_na=False, na_values=[""])
        df["identical"] = df["identical"].astype(str) == "True"
        df["part"] = i
        cats = list(dict.fromkeys(df.category))
        m.setdefault("categories", cats)
        dfs = [x[~x.category.isin(cats)] for x in dfs]
        dfs.append(df)
        mine = [dict(r, part=i) for r in m.get("llama_rows") or []]  # --no-llama: the earlier anchor rows stay
        llama = [r for r in llama if r["category"] not in {x["category"] for x in mine}] + mine
        metas.append(m)
    df = pd.concat(dfs, ignore_index=True)
    for i, m in enumerate(metas):  # what of each part the merged run uses
        m["ours_used"] = [c for c in dict.fromkeys(df.category) if (df[df.category == c].part == i).any()]
        m["anchor_used"] = list(dict.fromkeys(r["category"] for r in llama if r["part"] == i))
    for c in df.columns:
        if c.startswith(("draft_n_pos_", "draft_accepted_pos_", "draft_n_src_", "draft_accepted_src_")):
            df[c] = df[c].fillna(0).astype(int)
    return df, llama, metas
