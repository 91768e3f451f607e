"""Numerics A/B: how far each variant's next-token distributions are from
the baseline's, position by position, on the same token ids.

A spec with `numerics = true` runs, after its timed blocks, one numerics pass
in this process: every workload item's first-turn prompt (chat template
applied, as the runner sends it) followed by the baseline's reply to it (the
first repeat's output tokens) is teacher-forced through every variant's
engine.  For each position i the rows are the logits each engine produces
after ids[:i+1] (bit-identical to its decode and to Engine.score, batch
invariance), and one row of the numerics table per (variant, item) holds:

  n_scored     positions scored (len(ids) - 1)
  perplexity   exp(mean NLL of ids[i+1]) under this variant
  kl_mean      mean over positions of KL(baseline || variant), nats (full distributions)
  kl_max       the largest per-position KL
  top1_agree   share of positions where the variant's argmax is the baseline's (lowest id on ties)

The baseline's own row has KL 0 and agreement 1.  Engines run the sequence
in lockstep chunks of CHUNK positions (cb_engine_forward on slot 0 of each
idle engine), so memory stays at a few [CHUNK x n_vocab] blocks whatever the
length.  Variants must share the vocabulary and tokenize the prompts alike
(kv_f16 on / off, SIMD levels, two quantizations of one model, the 0.5B and
1.5B Qwen2.5-Coder).  stats.numerics_table turns the table into per-variant
statistics and verdicts.
"""
from __future__ import annotations

import numpy as np

CHUNK = 32  # positions per lockstep forward


def log_softmax(rows: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64."""
    r = np.asarray(rows, dtype=np.float64)
    m = r.max(axis=1, keepdims=True)
    return r - (m + np.log(np.exp(r - m).sum(axis=1, keepdims=True)))


def kl_rows(lp: np.ndarray, lq: np.ndarray) -> np.ndarray:
    """KL(p || q) per row from log-probabilities (0 * log 0 = 0)."""
    p = np.exp(lp)
    with np.errstate(invalid="ignore"):
        terms = np.where(p > 0, p * (lp - lq), 0.0)
    return terms.sum(axis=1)


def _rows(eng, ids: list[int], p: int, q: int) -> np.ndarray:
    """Logits rows of positions p..q-1 (the slot holds positions < p from the previous chunk)."""
    chunk = ids[p:q]
    return eng.scheduler.call(lambda core: core.forward(0, chunk, p), timeout=3600)


def compare_sequence(engines: dict, baseline: str, ids: list[int], chunk: int = CHUNK) -> dict[str, dict]:
    """Teacher-force `ids` through every engine ({variant name: Engine}); per
    variant: n_scored, perplexity, kl_mean, kl_max, top1_agree against the
    baseline's engine.  Variants sharing one Engine object compute it once."""
    if len(ids) < 2:
        raise ValueError("a numerics sequence needs at least 2 tokens")
    n = len(ids) - 1
    tgt = np.asarray(ids[1:])
    acc = {v: {"nll": 0.0, "kl": 0.0, "kl_max": 0.0, "agree": 0} for v in engines}
    for p in range(0, n, chunk):
        q = min(n, p + chunk)
        rows_by_engine: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for eng in engines.values():
            if id(eng) not in rows_by_engine:
                raw = _rows(eng, ids, p, q)
                rows_by_engine[id(eng)] = (log_softmax(raw), raw.argmax(axis=1))
        lb, ab = rows_by_engine[id(engines[baseline])]
        for v, eng in engines.items():
            lv, av = rows_by_engine[id(eng)]
            kl = kl_rows(lb, lv)
            a = acc[v]
            a["nll"] -= float(lv[np.arange(q - p), tgt[p:q]].sum())
            a["kl"] += float(kl.sum())
            a["kl_max"] = max(a["kl_max"], float(kl.max()))
            a["agree"] += int(np.sum(av == ab))
    return {v: {"n_scored": n, "perplexity": float(np.exp(a["nll"] / n)), "kl_mean": a["kl"] / n,
                "kl_max": a["kl_max"], "top1_agree": a["agree"] / n} for v, a in acc.items()}


def run_numerics(runner, rows: list[dict]) -> list[dict]:
    """The numerics pass of a Runner (see the module docstring): one row per
    (variant, workload item), using the runner's engines (built if needed)."""
    spec, wl = runner.spec, runner.workload
    base = spec.baseline_name
    engines = {v.name: runner.engine_for(v) for v in runner.variants}
    vocab = {v: e.info["n_vocab"] for v, e in engines.items()}
    if len(set(vocab.values())) != 1:
        raise ValueError(f"numerics needs one vocabulary across variants, got n_vocab {vocab}")
    replies = {}
    for r in rows:  # the baseline's first-repeat reply to each item's first turn
        if r.get("variant") == base and r.get("turn") == 0 and not r.get("error") and r.get("repeat") == 0:
            replies[r["prompt_id"]] = [int(t) for t in str(r.get("output_tokens", "")).split()]
    out = []
    for idx, item in enumerate(wl.items):
        msgs = item.messages(0, [])
        ids_by = {v: e.tokenize(e.apply_chat_template(msgs), add_special=False) for v, e in engines.items()}
        ids = ids_by[base]
        if any(x != ids for x in ids_by.values()):
            raise ValueError(f"item {item.id!r}: the variants tokenize its prompt differently; "
                             "numerics compares variants over one vocabulary and tokenizer")
        n_ctx = min(e.params["n_ctx"] for e in engines.values())
        seq = (ids + replies.get(item.id, []))[:n_ctx]
        res = compare_sequence(engines, base, seq)
        for v in runner.variants:
            out.append(dict(experiment=spec.name, variant=v.name, item_index=idx, prompt_id=item.id,
                            group=item.group, prompt_tokens=min(len(ids), len(seq)),
                            reply_tokens=max(0, len(seq) - len(ids)), **res[v.name]))
    return out
