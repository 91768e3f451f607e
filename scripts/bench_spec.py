#!/usr/bin/env python
"""Speculative decoding by task category (issue 17): qwen2.5-coder-1.5b, plain
decoding vs each draft source and the adaptive policy, per category with a
bootstrap interval, outputs checked identical; llama.cpp's prompt lookup
(llama-cpp-python's LlamaPromptLookupDecoding) on the same prompts and file.

    python scripts/bench_spec.py [--model qwen2.5-coder-1.5b] [--draft qwen2.5-coder-0.5b] [--cross smollm2]
                                 [--threads 2] [--per-category 10] [--max-tokens 128] [--repeats 1]
                                 [--categories a,b] [--no-llama] [--quick] [--out docs/bench/speculative.md]

Arms (greedy, batch 1, one fresh engine per arm and category so each
adaptive policy learns the category from nothing; colibri_lab.speculative.CATEGORY_ARMS):
  plain        no speculation
  lookup       prompt lookup (k_max 16)
  draft        qwen2.5-coder-0.5b drafting (same vocabulary, checked at load)
  cross_vocab  smollm2 drafting in its own vocabulary, re-tokenized into the target's
  layer_skip   the target with the blocks chosen by the measured calibration skipped
  adaptive     lookup, draft and cross_vocab; the policy prices each source per request and drafts with the
               best that pays (layer skip left out: its catch-up is nearly a second prefill)
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
Targets: code_editing >= 2.5x (lookup or adaptive); draft or cross_vocab >= 1.3x
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
    # The AMX extra buffer type crashes llama.cpp 0.3.36 on these VMs (SIGSEGV in its AMX matmul on the first
    # decode); without it llama.cpp runs its AVX-512 kernels.  Llama() has no argument for it: patch the defaults.
    _defaults = llama_cpp.llama_cpp.llama_model_default_params

    def _no_extra_bufts():
        p = _defaults()
        p.use_extra_bufts = False
        return p
    llama_cpp.llama_cpp.llama_model_default_params = _no_extra_bufts
    lkw = dict(model_path=job["path"], n_ctx=2048, n_threads=job["threads"], n_threads_batch=job["threads"],
               verbose=False, seed=0)
    arms = {"plain": llama_cpp.Llama(**lkw),
            "pld": llama_cpp.Llama(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10), **lkw)}
    eog = set(job["eog"])
    run_llama(arms["plain"], job["prompts"][0][2], 8, eog)
    rows = []
    for i, (cat, item, ids) in enumerate(job["prompts"]):
        for arm in bu.abba(i, "plain", "pld"):
            toks, tps = run_llama(arms[arm], ids, job["max_tokens"], eog)
            rows.append({"category": cat, "item": item, "arm": arm, "tps": tps, "tokens": toks})
        print(f"  llama.cpp {cat} {item}: plain {rows[-2 if rows[-1]['arm'] == 'pld' else -1]['tps']:.1f}", flush=True)
    with open(out_path, "w") as f:
        json.dump({"version": md.version("llama_cpp_python"), "rows": rows}, f)
    return 0


def llama_anchor(path, threads, max_tokens, eog, prompts, python):
    """Run llama_worker in a child process (a crash inside llama.cpp must not lose our results)."""
    with tempfile.TemporaryDirectory() as td:
        job, res = os.path.join(td, "job.json"), os.path.join(td, "out.json")
        flat = [(cat, item, ids) for cat, items in prompts.items() for item, ids in items]
        with open(job, "w") as f:
            json.dump({"path": path, "threads": threads, "max_tokens": max_tokens, "eog": eog, "prompts": flat}, f)
        p = subprocess.run([python, os.path.abspath(__file__), "--llama-worker", job, res], capture_output=True,
                           text=True)
        sys.stdout.write(p.stdout[-2000:])
        if p.returncode == 0 and os.path.exists(res):
            return json.load(open(res))
        tail = " | ".join(p.stderr.strip().splitlines()[-4:])
        return {"error": f"llama-cpp-python child exited with code {p.returncode}: {tail[:400]}"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--cross", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--per-category", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--categories", default="")
    ap.add_argument("--arms", default="plain,lookup,draft,cross_vocab,layer_skip,adaptive")
    ap.add_argument("--slow-prompts", type=int, default=4, help="layer_skip arm: first N prompts of a category")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--fresh-engines", action="store_true", help="an engine of its own for every arm")
    ap.add_argument("--llama-python", default="/work/venv-anchors/bin/python")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--save", default=os.path.join(bu.ROOT, "experiments", "results", "speculative_categories"))
    ap.add_argument("--out", default=os.path.join(bu.ROOT, "docs", "bench", "speculative.md"))
    ap.add_argument("--llama-worker", nargs=2, metavar=("JOB", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.llama_worker:
        return llama_worker(*a.llama_worker)
    if a.quick:
        a.per_category, a.max_tokens, a.slow_prompts = 1, 24, 1

    from colibri_lab import _engine, models
    from colibri_lab.experiments.workloads import SPEC_CATEGORIES
    from colibri_lab.speculative import category_prompts, category_speedups, layer_skip_for, run_categories
    from colibri_lab.tokenizer import Tokenizer

    cats = [c for c in a.categories.split(",") if c] or list(SPEC_CATEGORIES)
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
        if arm in ("draft", "adaptive"):
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
    sp = category_speedups(df)
    ours_s = time.time() - t0
    llama = None
    if not a.no_llama:
        eog = [i for i in range(target.n_vocab) if target.token_is_eog(i)]
        llama = llama_anchor(path, a.threads, a.max_tokens, eog, prompts, a.llama_python)
    load1 = bu.loadavg()

    # ---------------------------------------------------------------- save
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    save_dir = os.path.join(a.save, stamp)
    os.makedirs(save_dir, exist_ok=True)
    df.drop(columns=["tokens"]).to_csv(os.path.join(save_dir, "requests.csv"), index=False)
    sp.to_csv(os.path.join(save_dir, "speedups.csv"), index=False)
    with open(os.path.join(save_dir, "meta.json"), "w") as f:
        json.dump({"argv": sys.argv[1:], "machine": info, "commit": info.get("commit"), "load_start": load0,
                   "load_end": load1, "calibration": cal.__dict__ if cal else None, "policy": policy,
                   "llama": {k: v for k, v in (llama or {}).items() if k != "rows"},
                   "llama_rows": [{k: v for k, v in r.items() if k != "tokens"} for r in (llama or {}).get("rows", [])]},
                  f, indent=1, default=str)

    # -------------------------------------------------------------- report
    out = [bu.header("Speculative decoding by task category (issue 17)",
                     [os.path.relpath(sys.argv[0], bu.ROOT)] + sys.argv[1:], info, load0, load1)]
    out.append(f"Target {a.model} ({os.path.basename(path)}), greedy, batch 1, {a.threads} threads, max_tokens "
               f"{a.max_tokens}, {a.per_category} prompts per category, {a.repeats} repeat(s); arms interleaved per "
               f"prompt in rotating order; ours took {ours_s / 60:.1f} min. Draft model {a.draft}; cross-vocabulary "
               f"draft {a.cross}; "
               + (f"layer skip: the {len(cal.skip_layers)} blocks {cal.skip_layers} chosen by the calibration "
                  f"(expected speedup {cal.expected_speedup:.2f}); the layer_skip arm ran on the first "
                  f"{a.slow_prompts} prompts of each category" if cal else "no layer_skip arm in this run")
               + f". Results saved in `{os.path.relpath(save_dir, bu.ROOT)}`.\n")
    if cal:
        out.append("Layer-skip calibration (teacher-forced agreement with the full model over "
                   f"{cal.n_tokens} tokens; cost = measured pass time relative to the full model; verify cost "
                   f"v(k) = {', '.join(f'{x:.2f}' for x in cal.verify_cost)}):\n")
        out.append("| blocks skipped | agreement | cost | expected speedup (k) |")
        out.append("|---|---|---|---|")
        for c in cal.curve:
            out.append(f"| {c['layers']} | {c['agreement']:.3f} | {c['cost']:.3f} | {c['expected_speedup']:.2f} "
                       f"({c['k']}) |")
        out.append("")
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
        s, lo, n = best_of("code_editing", ["lookup", "adaptive"])
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
                        + (f" ({', '.join(bad)})" if bad else f" (lowest {ad.speedup.min():.2f}x)"))
    verdicts.append(f"outputs identical to plain greedy: {bool(df.identical.all())} ({int((~df.identical).sum())} of "
                    f"{len(df)} differ)")

    if llama is not None:
        out.append("### llama.cpp anchor: prompt lookup decoding on the same prompts and file\n")
        if "error" in llama:
            out.append(f"NOT MEASURED: `{llama['error']}`\n")
        else:
            import numpy as np
            from colibri_lab.experiments.stats import bootstrap_ci
            L = llama["rows"]
            out.append(f"llama-cpp-python {llama['version']}, LlamaPromptLookupDecoding(num_pred_tokens=10), "
                       "max_ngram_size 2 (its default). Ours lookup / llama.cpp PLD = ratio of tok/s paired by prompt.\n")
            out.append("| category | llama.cpp plain tok/s | llama.cpp PLD tok/s | PLD speedup [CI] | PLD = its plain | "
                       "ours lookup / llama.cpp PLD [CI] | ours plain / llama.cpp plain |")
            out.append("|---|---|---|---|---|---|---|")
            ours = {(r.category, r.item, r.arm): r.decode_tok_s for r in df.itertuples()}
            for cat in cats:
                pl = {r["item"]: r for r in L if r["category"] == cat and r["arm"] == "plain"}
                pd_ = {r["item"]: r for r in L if r["category"] == cat and r["arm"] == "pld"}
                ratio = [pd_[i]["tps"] / pl[i]["tps"] for i in pl if i in pd_ and pl[i]["tps"] > 0]
                s, lo, hi = bootstrap_ci(np.asarray(ratio))
                same = all(pd_[i]["tokens"] == pl[i]["tokens"] for i in pl if i in pd_)
                ov = [ours[(cat, i, "lookup")] / pd_[i]["tps"] for i in pd_ if (cat, i, "lookup") in ours and pd_[i]["tps"] > 0]
                os_, olo, ohi = bootstrap_ci(np.asarray(ov)) if ov else (float("nan"),) * 3
                pv = [ours[(cat, i, "plain")] / pl[i]["tps"] for i in pl if (cat, i, "plain") in ours and pl[i]["tps"] > 0]
                out.append(f"| {cat} | {np.median([r['tps'] for r in pl.values()]):.1f} | "
                           f"{np.median([r['tps'] for r in pd_.values()]):.1f} | {s:.2f}x [{lo:.2f}, {hi:.2f}] | {same} | "
                           f"{os_:.2f} [{olo:.2f}, {ohi:.2f}] | {np.exp(np.mean(np.log(pv))) if pv else float('nan'):.2f} |")
            out.append("")
    bu.finish_report(out, verdicts, a, ap)
    return 0


if __name__ == "__main__":
    sys.exit(main())
