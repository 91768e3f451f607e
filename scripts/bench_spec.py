#!/usr/bin/env python
"""Speculative decoding by task category (issue 17): qwen2.5-coder-1.5b, plain
decoding vs each draft source and the adaptive policy, per category with a
bootstrap interval, outputs checked identical; llama.cpp's prompt lookup
(llama-cpp-python's LlamaPromptLookupDecoding) on the same prompts and file.

    python scripts/bench_spec.py [--model qwen2.5-coder-1.5b] [--draft qwen2.5-coder-0.5b] [--cross smollm2]
                                 [--threads 2] [--per-category 10] [--max-tokens 128] [--repeats 1]
                                 [--categories a,b] [--no-llama] [--quick] [--out docs/bench/speculative.md]
    python scripts/bench_spec.py --merge DIR [DIR ...] [--out docs/bench/speculative.md]

A full run takes longer than one turn of the shared machine's bench lock, so
it is run in parts (--categories: a few categories each, every part saved
under experiments/results/speculative_categories/<stamp>/ with its own
command, commit and load) and --merge writes the report of several saved
parts as one (a category measured in two parts: the later part wins).  A run
without --merge writes the report of its own part.  The report replaces the
top of --out; whatever follows its first line "---" (earlier records) is kept.

Arms (greedy, batch 1, one fresh engine per arm and category so each
adaptive policy learns the category from nothing; colibri_lab.speculative.CATEGORY_ARMS):
  plain        no speculation
  lookup       prompt lookup (k_max 16)
  draft        qwen2.5-coder-0.5b drafting (same vocabulary, checked at load)
  cross_vocab  smollm2 drafting in its own vocabulary, re-tokenized into the target's
  layer_skip   the target with the blocks chosen by the measured calibration skipped
  adaptive     lookup, draft and cross_vocab; the policy prices each source per request and drafts with the
               best that pays (layer skip left out: its catch-up is nearly a second prefill)
  combined     lookup and draft: lookup where the text copies, the draft model where it does not, a
               draft-model draft that reaches copied text continued by lookup
All speculating arms are adaptive (depth from measured acceptance and cost; a
source that does not pay pauses).  For each prompt the arms run back to back
in an order that rotates with the prompt, then the next prompt.  Decode tok/s
= (tokens - 1) / (wall time from the first to the last token).  Speedup =
geometric mean over prompts of arm tok/s / plain tok/s with a bootstrap 95%
interval.  Each arm's tokens are compared with plain greedy's.
Multi-turn items are measured on their second turn (history: the model's own
first reply).  llama.cpp: Llama(model) vs Llama(model,
draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10)), temperature 0,
the same token prompts and max tokens, stop at end of generation, plain and
PLD interleaved per prompt.
Targets: code_editing >= 2.5x (lookup, combined or adaptive); draft or cross_vocab >= 1.3x
on at least three chat categories; adaptive >= 0.97x on every category.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil as bu  # noqa: E402

CHAT_CATEGORIES = ("conversation", "translation", "summarization", "qa", "math_reasoning", "rag")


def run_llama(llm, ids, max_tokens, eog):
    toks, t_first, t_last = [], None, None
    for t in llm.generate(ids, temp=0.0, reset=True):
        now = time.perf_counter()
        if t in eog:
            break
        t_first = now if t_first is None else t_first
        t_last = now
        toks.append(int(t))
        if len(toks) >= max_tokens:
            break
    tps = (len(toks) - 1) / (t_last - t_first) if len(toks) > 1 and t_last > t_first else 0.0
    return toks, tps


def llama_worker(job_path, out_path):
    """Child process: llama.cpp plain vs prompt-lookup decoding on the given prompts."""
    import importlib.metadata as md

    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    job = json.load(open(job_path))
    from colibri_lab import llama_anchor
    extra_bufts = llama_anchor.configure()   # off on AMX CPUs only
    lkw = dict(model_path=job["path"], n_ctx=2048, n_threads=job["threads"], n_threads_batch=job["threads"],
               verbose=False, seed=0)
    arms = {"plain": llama_cpp.Llama(**lkw),
            "pld": llama_cpp.Llama(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10), **lkw)}
    eog = set(job["eog"])
    run_llama(arms["plain"], job["prompts"][0][2], 8, eog)
    rows = []
    for i, (cat, item, ids) in enumerate(job["prompts"]):
        got = {}
        for arm in bu.abba(i, "plain", "pld"):
            got[arm] = run_llama(arms[arm], ids, job["max_tokens"], eog)
        for arm, (toks, tps) in got.items():
            rows.append({"category": cat, "item": item, "arm": arm, "tps": tps, "n_tokens": len(toks),
                         "same_as_plain": toks == got["plain"][0],
                         "same_as_ours_plain": toks == job["ours_plain"].get(f"{cat}/{item}")})
        print(f"  llama.cpp {cat} {item}: plain {got['plain'][1]:.1f} pld {got['pld'][1]:.1f} tok/s", flush=True)
    with open(out_path, "w") as f:
        json.dump({"version": md.version("llama_cpp_python"), "use_extra_bufts": extra_bufts, "rows": rows}, f)
    return 0


def llama_anchor(path, threads, max_tokens, eog, prompts, python, ours_plain):
    """Run llama_worker in a child process (a crash inside llama.cpp must not lose our results).
    ours_plain {"category/item": our plain greedy tokens}: to say whether the two agree."""
    with tempfile.TemporaryDirectory() as td:
        job, res = os.path.join(td, "job.json"), os.path.join(td, "out.json")
        flat = [(cat, item, ids) for cat, items in prompts.items() for item, ids in items]
        with open(job, "w") as f:
            json.dump({"path": path, "threads": threads, "max_tokens": max_tokens, "eog": eog, "prompts": flat,
                       "ours_plain": ours_plain}, f)
        p = subprocess.run([python, os.path.abspath(__file__), "--llama-worker", job, res], capture_output=True,
                           text=True)
        sys.stdout.write(p.stdout[-2000:])
        if p.returncode == 0 and os.path.exists(res):
            return json.load(open(res))
        tail = " | ".join(p.stderr.strip().splitlines()[-4:])
        return {"error": f"llama-cpp-python child exited with code {p.returncode}: {tail[:400]}"}


COST_ROWS = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17)


def step_costs(named_models, threads, rows=COST_ROWS, reps=9, ctx=300):
    """{name: {rows: median ms}}: the wall time of one forward of `rows` rows (LM head on every row, as a
    verify step) after `ctx` tokens of context, per model, sizes interleaved.  What a verify step of k
    drafts (k + 1 rows) costs against a decode step (1 row), and what a drafter's token costs."""
    import numpy as np

    from colibri_lab import _engine

    out = {}
    for name, model in named_models.items():
        core = _engine.Engine(model, n_slots=1, n_ctx=ctx + max(rows) + 8, n_threads=threads)
        try:
            toks = [100 + (i * 37) % 5000 for i in range(ctx + max(rows))]
            core.forward_argmax(0, toks[:ctx], 0)
            got = {k: [] for k in rows}
            for _ in range(reps):
                for k in rows:
                    t = time.perf_counter()
                    core.forward_argmax(0, toks[ctx:ctx + k], ctx)
                    got[k].append((time.perf_counter() - t) * 1e3)
            out[name] = {k: float(np.median(v)) for k, v in got.items()}
        finally:
            core.close()
    return out


def run_part(a):
    """Measure ours (and llama.cpp unless --no-llama) on a.categories; save the part; return its directory."""
    from colibri_lab import _engine, models
    from colibri_lab.experiments.workloads import SPEC_CATEGORIES
    from colibri_lab.speculative import category_prompts, layer_skip_for, run_categories
    from colibri_lab.tokenizer import Tokenizer

    cats = [c for c in a.categories.split(",") if c] or list(SPEC_CATEGORIES)
    unknown = [c for c in cats if c not in SPEC_CATEGORIES]
    if unknown:
        raise SystemExit(f"unknown categories {unknown}; known: {', '.join(SPEC_CATEGORIES)}")
    arms = ["plain"] + [x for x in a.arms.split(",") if x and x != "plain"]
    load0 = bu.loadavg()
    info = bu.machine_info(a.threads)
    path = str(models.resolve(a.model))
    target = _engine.Model(path)
    meta = target.metadata()
    tok = Tokenizer.from_metadata(meta)
    draft = _engine.Model(str(models.resolve(a.draft)))
    cross = _engine.Model(str(models.resolve(a.cross)))
    cal = layer_skip_for(target, path, tok, n_threads=a.threads) if "layer_skip" in arms else None
    n_ctx = 2048
    shared = {}

    def make_engine(arm):
        """The single-source arms share one engine per category (its prefix reuse prefills each prompt once
        for all of them; each source keeps its own policy record); adaptive and layer_skip get their own."""
        if arm in ("plain", "lookup", "draft", "cross_vocab") and not a.fresh_engines:
            if arm == "plain" or "core" not in shared:  # run_categories asks for "plain" first in each category
                shared["core"] = _engine.Engine(target, n_slots=1, n_ctx=n_ctx, n_threads=a.threads,
                                                draft_model=draft, xdraft_model=cross)
            return shared["core"]
        kw = dict(n_slots=1, n_ctx=n_ctx, n_threads=a.threads)
        if arm in ("draft", "adaptive", "combined"):
            kw["draft_model"] = draft
        if arm in ("cross_vocab", "adaptive"):
            kw["xdraft_model"] = cross
        if arm == "layer_skip":
            kw["skip_layers"] = cal.skip_layers
        return _engine.Engine(target, **kw)

    plain = _engine.Engine(target, n_slots=1, n_ctx=n_ctx, n_threads=a.threads)
    prompts = category_prompts(tok, meta["tokenizer.chat_template"], cats, a.per_category, plain_core=plain,
                               max_tokens=a.max_tokens)
    plain.close()
    print("prompt lengths: " + "; ".join(f"{c} {[len(x) for _, x in v]}" for c, v in prompts.items()), flush=True)
    t0 = time.time()
    df, policy = run_categories(make_engine, prompts, arms, max_tokens=a.max_tokens, repeats=a.repeats,
                                slow_arms={"layer_skip": a.slow_prompts},
                                progress=lambda c, r, i: print(f"  {c} r{r} #{i} {time.time() - t0:.0f}s", flush=True))
    ours_s = time.time() - t0
    costs = step_costs({a.model: target, a.draft: draft, a.cross: cross}, a.threads)
    llama, llama_s = None, 0.0
    if not a.no_llama:
        eog = [i for i in range(target.n_vocab) if target.token_is_eog(i)]
        ours_plain = {f"{r.category}/{r.item}": [int(t) for t in r.tokens]
                      for r in df[(df.arm == "plain") & (df.repeat == 0)].itertuples()}
        t1 = time.time()
        llama = llama_anchor(path, a.threads, a.max_tokens, eog, prompts, a.llama_python, ours_plain)
        llama_s = time.time() - t1
    load1 = bu.loadavg()

    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    save_dir = os.path.join(a.save, stamp)
    os.makedirs(save_dir, exist_ok=True)
    df.drop(columns=["tokens"]).to_csv(os.path.join(save_dir, "requests.csv"), index=False)
    with open(os.path.join(save_dir, "meta.json"), "w") as f:
        json.dump({"argv": [os.path.relpath(sys.argv[0], bu.ROOT)] + sys.argv[1:], "machine": info,
                   "commit": info.get("commit"), "load_start": load0, "load_end": load1, "categories": cats,
                   "arms": arms, "model": a.model, "model_file": os.path.basename(path), "draft": a.draft,
                   "cross": a.cross, "threads": a.threads, "per_category": a.per_category,
                   "max_tokens": a.max_tokens, "repeats": a.repeats, "slow_prompts": a.slow_prompts,
                   "ours_minutes": ours_s / 60, "llama_minutes": llama_s / 60,
                   "calibration": cal.__dict__ if cal else None, "policy": policy, "step_costs": costs,
                   "llama": {k: v for k, v in (llama or {}).items() if k != "rows"} if llama is not None else None,
                   "llama_rows": (llama or {}).get("rows", [])},
                  f, indent=1, default=str)
    print(f"saved {save_dir}", flush=True)
    return save_dir


def report(df, llama_rows, metas, a, ap):
    """The markdown report and verdicts of the (merged) parts."""
    import numpy as np

    from colibri_lab.experiments.stats import bootstrap_ci
    from colibri_lab.experiments.workloads import SPEC_CATEGORIES
    from colibri_lab.speculative import category_speedups

    sp = category_speedups(df)
    cats = [c for c in SPEC_CATEGORIES if c in set(df.category)]
    arms = list(dict.fromkeys(df.arm))
    m0 = metas[0]
    info = m0["machine"]
    out = ["## Speculative decoding by task category (issue 17)", ""]
    out.append(f"- machine: {info['cpu']}, {info['cores']} cores (shared), SIMD path `{info['simd']}`, "
               f"n_threads={info['threads']}, Python {info['python']}")
    for i, m in enumerate(metas):
        mi = m["machine"]
        used = (f"ours used for {', '.join(m['ours_used']) or 'none'}; llama.cpp anchor used for "
                f"{', '.join(m['anchor_used']) or 'none'}" if len(metas) > 1 else "")
        out.append(f"- part {i + 1} ({', '.join(m['categories'])}{'; ' + used if used else ''}): "
                   f"`python {' '.join(m['argv'])}`; commit "
                   f"`{m['commit']}`" + (" (uncommitted changes)" if mi.get("dirty") else "")
                   + f"; {mi['date']}; ours {m.get('ours_minutes', float('nan')):.1f} min, llama.cpp "
                   f"{m.get('llama_minutes', 0.0):.1f} min; load at start `{m['load_start']}`, at end "
                   f"`{m['load_end']}`; saved in `{os.path.relpath(m['dir'], bu.ROOT)}`")
    out.append("")
    cal = next((m["calibration"] for m in metas if m.get("calibration")), None)
    out.append(f"Target {m0['model']} ({m0['model_file']}), greedy, batch 1, {m0['threads']} threads, max_tokens "
               f"{m0['max_tokens']}, {m0['per_category']} prompts per category, {m0['repeats']} repeat(s); arms "
               f"interleaved per prompt in rotating order, one engine per category for the single-source arms "
               f"and its own for adaptive and layer_skip. Draft model {m0['draft']}; cross-vocabulary draft "
               f"{m0['cross']}; "
               + (f"layer skip: the {len(cal['skip_layers'])} blocks {cal['skip_layers']} chosen by the "
                  f"calibration (expected speedup {cal['expected_speedup']:.2f}); the layer_skip arm ran on the "
                  f"first {m0['slow_prompts']} prompts of each category" if cal else "no layer_skip arm in this run")
               + ".\n")
    if cal:
        out.append("Layer-skip calibration (teacher-forced agreement with the full model over "
                   f"{cal['n_tokens']} tokens; cost = measured pass time relative to the full model; verify cost "
                   f"v(k) = {', '.join(f'{x:.2f}' for x in cal['verify_cost'])}):\n")
        out.append("| blocks skipped | agreement | cost | expected speedup (k) |")
        out.append("|---|---|---|---|")
        for c in cal["curve"]:
            out.append(f"| {c['layers']} | {c['agreement']:.3f} | {c['cost']:.3f} | {c['expected_speedup']:.2f} "
                       f"({c['k']}) |")
        out.append("")
    costs = [m["step_costs"] for m in metas if m.get("step_costs")]
    if costs:
        tgt = m0["model"]
        out.append(f"Measured costs (median ms of one forward with the LM head on every row, after 300 tokens, "
                   f"{m0['threads']} threads, measured at the end of each part): a verify step of k drafts is k + 1 "
                   f"rows of {tgt}; a drafter's token is about one row of the drafter.\n")
        out.append("| part | model | " + " | ".join(f"{k} row{'s' * (k > 1)}" for k in COST_ROWS) + " |")
        out.append("|---|---|" + "---|" * len(COST_ROWS))
        for i, m in enumerate(metas):
            c = m.get("step_costs")
            if not c:
                continue
            one = c[tgt]["1"]
            for name, ms in c.items():
                out.append(f"| {i + 1} | {name} | " + " | ".join(
                    f"{ms[str(k)]:.1f} ({ms[str(k)] / one:.2f})" for k in COST_ROWS) + " |")
        out.append(f"\n(in brackets: relative to one row of {tgt})\n")
    out.append("Speedup = decode tok/s vs plain (geometric mean of per-prompt ratios, 95% bootstrap interval); "
               "acc = acceptance rate (accepted / draft tokens); len = mean acceptance length (1 + accepted / "
               "drafts); share = draft time share (drafting / decode time); = : every output identical to plain "
               "greedy.\n")
    spec_arms = [x for x in arms if x != "plain"]
    out.append("| category | plain tok/s | " + " | ".join(spec_arms) + " |")
    out.append("|---|---|" + "---|" * len(spec_arms))
    for cat in cats:
        g = sp[sp.category == cat].set_index("arm")
        cells = []
        for arm in spec_arms:
            if arm not in g.index:
                cells.append("")
                continue
            r = g.loc[arm]
            cells.append(f"**{r.speedup:.2f}x** [{r.ci_low:.2f}, {r.ci_high:.2f}] {'=' if r.identical else 'DIFFERS'}"
                         f" acc {r.acceptance_rate:.2f} len {r.mean_acceptance_length:.2f} share "
                         f"{r.draft_time_share:.2f}")
        plain_tps = df[(df.category == cat) & (df.arm == "plain")].decode_tok_s.median()
        out.append(f"| {cat} | {plain_tps:.1f} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("Acceptance rate by draft position (vLLM's: accepted at position i / drafts), per category and arm:\n")
    out.append("| category | arm | drafts | draft tokens | accepted | by position |")
    out.append("|---|---|---|---|---|---|")
    for r in sp.itertuples():
        pos = [getattr(r, f"acceptance_rate_pos_{i}") for i in range(16) if hasattr(r, f"acceptance_rate_pos_{i}")]
        pos = [p for p in pos if p == p]
        out.append(f"| {r.category} | {r.arm} | {r.spec_decode_num_drafts} | {r.spec_decode_num_draft_tokens} | "
                   f"{r.spec_decode_num_accepted_tokens} | {', '.join(f'{p:.2f}' for p in pos[:12])} |")
    out.append("")

    verdicts = []
    g = sp.set_index(["category", "arm"])

    def best_of(cat, names):
        have = [(g.loc[(cat, n)].speedup, g.loc[(cat, n)].ci_low, n) for n in names if (cat, n) in g.index]
        return max(have) if have else (float("nan"), float("nan"), "-")
    if "code_editing" in cats:
        s, lo, n = best_of("code_editing", ["lookup", "combined", "adaptive"])
        verdicts.append(f"code_editing: {n} {s:.2f}x (CI low {lo:.2f}), target >= 2.5x: **{bu.verdict_ge(s, lo, 2.5)}**")
    chat_hits = []
    for cat in [c for c in CHAT_CATEGORIES if c in cats]:
        s, lo, n = best_of(cat, ["draft", "cross_vocab"])
        if s >= 1.3:
            chat_hits.append(f"{cat} ({n} {s:.2f}x, CI low {lo:.2f})")
    verdicts.append(f"draft model / cross-vocabulary draft >= 1.3x on {len(chat_hits)} chat categories (target >= 3): "
                    f"**{'met' if len(chat_hits) >= 3 else 'not met'}**: {', '.join(chat_hits) or 'none'}")
    if "adaptive" in arms:
        ad = sp[sp.arm == "adaptive"]
        bad = [f"{r.category} {r.speedup:.2f}x" for r in ad.itertuples() if not r.speedup >= 0.97]
        verdicts.append(f"adaptive >= 0.97x on every category: **{'met' if not bad else 'not met'}**"
                        + (f" ({', '.join(bad)})" if bad else f" (lowest {ad.speedup.min():.2f}x, CI low "
                                                              f"{ad.ci_low.min():.2f})"))
    verdicts.append(f"outputs identical to plain greedy: {bool(df.identical.all())} ({int((~df.identical).sum())} of "
                    f"{len(df)} differ)")

    errors = [f"part {i + 1}: {m['llama']['error']}" for i, m in enumerate(metas) if (m.get("llama") or {}).get("error")]
    if llama_rows or errors:
        out.append("### llama.cpp anchor: prompt lookup decoding on the same prompts and file\n")
        out += [f"NOT MEASURED in {e}\n" for e in errors]
    if llama_rows:
        version = next(m["llama"]["version"] for m in metas if (m.get("llama") or {}).get("version"))
        out.append(f"llama-cpp-python {version}, `Llama(model)` vs `Llama(model, draft_model="
                   "LlamaPromptLookupDecoding(num_pred_tokens=10))` (max_ngram_size 2, its default), temperature 0, "
                   "the same prompt tokens and max_tokens, plain and PLD interleaved per prompt. Ratios are of "
                   "decode tok/s paired by prompt (geometric mean, 95% bootstrap interval). Ours best = our arm "
                   "with the highest speedup on that category.\n")
        out.append("| category | llama.cpp plain tok/s | llama.cpp PLD tok/s | its PLD speedup | PLD = its plain "
                   "| ours plain / llama.cpp plain | ours best (arm) / llama.cpp PLD | its plain = ours plain |")
        out.append("|---|---|---|---|---|---|---|---|")
        ours = {(r.category, r.item, r.arm): r.decode_tok_s for r in df[df.repeat == 0].itertuples()}

        def paired(num, den):
            v = [num[i] / den[i] for i in den if i in num and den[i] > 0 and num[i] > 0]
            return bootstrap_ci(np.asarray(v)) if v else (float("nan"),) * 3
        for cat in cats:
            pl = {r["item"]: r for r in llama_rows if r["category"] == cat and r["arm"] == "plain"}
            pd_ = {r["item"]: r for r in llama_rows if r["category"] == cat and r["arm"] == "pld"}
            if not pl:
                continue
            lp = {i: r["tps"] for i, r in pl.items()}
            ld = {i: r["tps"] for i, r in pd_.items()}
            s, lo, hi = paired(ld, lp)
            same = sum(bool(r["same_as_plain"]) for r in pd_.values())
            agree = sum(bool(r["same_as_ours_plain"]) for r in pl.values())
            op = {i: ours.get((cat, i, "plain"), 0.0) for i in pl}
            cat_sp = sp[(sp.category == cat) & (sp.n_pairs == sp[sp.category == cat].n_pairs.max())]
            best = cat_sp.loc[cat_sp.speedup.idxmax(), "arm"] if len(cat_sp) else "plain"
            ob = {i: ours.get((cat, i, best), 0.0) for i in pd_}
            r1, r1lo, r1hi = paired(op, lp)
            r2, r2lo, r2hi = paired(ob, ld)
            out.append(f"| {cat} | {np.median(list(lp.values())):.1f} | {np.median(list(ld.values())):.1f} | "
                       f"{s:.2f}x [{lo:.2f}, {hi:.2f}] | {same}/{len(pd_)} | {r1:.2f} [{r1lo:.2f}, {r1hi:.2f}] | "
                       f"{r2:.2f} [{r2lo:.2f}, {r2hi:.2f}] ({best}) | {agree}/{len(pl)} |")
        out.append("")
    return out, verdicts


def write_report(out, verdicts, a, ap):
    """Print the report and write it over the top of a.out, keeping what follows its first '---' line."""
    out = out + ["### Verdict\n"] + [f"- {v}" for v in verdicts]
    text = "\n".join(out)
    print("\n" + text)
    if a.quick and a.out == ap.get_default("out"):
        return
    keep = ""
    if os.path.exists(a.out):
        old = open(a.out).read()
        at = old.find("\n---\n")
        keep = old[at:] if at >= 0 else ""
    bu.write_doc(a.out, text.rstrip() + "\n" + keep)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--cross", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--per-category", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--categories", default="", help="comma-separated; default every category")
    ap.add_argument("--arms", default="plain,lookup,draft,cross_vocab,layer_skip,adaptive")
    ap.add_argument("--slow-prompts", type=int, default=4, help="layer_skip arm: first N prompts of a category")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--fresh-engines", action="store_true", help="an engine of its own for every arm")
    ap.add_argument("--llama-python", default="/work/venv-anchors/bin/python")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--merge", nargs="+", metavar="DIR", help="report the saved parts DIR ... as one run")
    ap.add_argument("--save", default=os.path.join(bu.ROOT, "experiments", "results", "speculative_categories"))
    ap.add_argument("--out", default=os.path.join(bu.ROOT, "docs", "bench", "speculative.md"))
    ap.add_argument("--llama-worker", nargs=2, metavar=("JOB", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.llama_worker:
        return llama_worker(*a.llama_worker)
    if a.quick:
        a.per_category, a.max_tokens, a.slow_prompts = 1, 24, 1
    from colibri_lab.speculative import load_category_runs

    dirs = a.merge or [run_part(a)]
    df, llama_rows, metas = load_category_runs(dirs)
    out, verdicts = report(df, llama_rows, metas, a, ap)
    write_report(out, verdicts, a, ap)
    return 0


if __name__ == "__main__":
    sys.exit(main())
