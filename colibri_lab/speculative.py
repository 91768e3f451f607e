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

Metric names (vLLM's where it has one):
  spec_decode_num_drafts             verification rounds that carried drafts (vLLM num_drafts)
  spec_decode_num_draft_tokens       draft tokens proposed
  spec_decode_num_accepted_tokens    draft tokens accepted
  spec_decode_num_accepted_tokens_per_pos   accepted tokens at draft position i (1-based)
  acceptance_rate                    accepted / draft tokens
  mean_acceptance_length             1 + accepted / drafts (tokens per verify step of a drafting request)
  acceptance_rate_per_pos            accepted at i / drafts (vLLM's per-position rate)
  conditional_acceptance_per_pos     accepted at i / drafts that reached i (our draft_n_by_pos)
  draft_time_share                   time spent drafting / decode time
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

# ------------------------------------------------------------ metrics

SPEC_METRICS = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
                "acceptance_rate", "mean_acceptance_length", "draft_time_share")


def spec_summary(metrics: Iterable[Mapping]) -> dict:
    """vLLM-named speculation metrics summed over requests' metric dicts (the
    engine's per-request `metrics`: draft_steps, draft_n, draft_accepted,
    draft_n_by_pos, draft_accepted_by_pos, draft_ms, decode_ms)."""
    drafts = tokens = accepted = 0
    draft_ms = decode_ms = 0.0
    per_pos: list[int] = []
    reached: list[int] = []
    for m in metrics:
        drafts += int(m.get("draft_steps", 0) or 0)
        tokens += int(m.get("draft_n", 0) or 0)
        accepted += int(m.get("draft_accepted", 0) or 0)
        draft_ms += float(m.get("draft_ms", 0.0) or 0.0)
        decode_ms += float(m.get("decode_ms", 0.0) or 0.0)
        for name, acc in (("draft_accepted_by_pos", per_pos), ("draft_n_by_pos", reached)):
            for i, v in enumerate(m.get(name) or ()):
                if i >= len(acc):
                    acc.extend([0] * (i + 1 - len(acc)))
                acc[i] += int(v)
    return {
        "spec_decode_num_drafts": drafts,
        "spec_decode_num_draft_tokens": tokens,
        "spec_decode_num_accepted_tokens": accepted,
        "spec_decode_num_accepted_tokens_per_pos": per_pos,
        "acceptance_rate": accepted / tokens if tokens else float("nan"),
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts else float("nan"),
        "acceptance_rate_per_pos": [a / drafts for a in per_pos] if drafts else [],
        "conditional_acceptance_per_pos": [a / n if n else float("nan") for a, n in zip(per_pos, reached)],
        "draft_time_share": draft_ms / decode_ms if decode_ms > 0 else float("nan"),
    }


def spec_table(df, by: Sequence[str] = ("variant",)):
    """The vLLM-named speculation metrics per group of a request DataFrame
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
        row.update({k: s[k] for k in SPEC_METRICS})
        for i, v in enumerate(s["acceptance_rate_per_pos"]):
            row[f"acceptance_rate_pos_{i + 1}"] = v
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
