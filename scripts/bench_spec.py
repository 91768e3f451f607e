#!/usr/bin/env python
"""Speculative decoding (issue 5): speedup with / without, paired by prompt,
outputs checked identical, on a copy-heavy workload and on open-ended chat;
acceptance by position per draft source; llama.cpp's prompt-lookup decoding
(llama-cpp-python's LlamaPromptLookupDecoding) as the anchor.

    python scripts/bench_spec.py [--model smollm2] [--threads 2] [--repeats 2] [--max-tokens 96] [--quick]
                                 [--out docs/bench/speculative.md]

Arms (greedy, batch 1, prefix reuse off so every request prefills the same):
  plain       no speculation (its own engine)
  lookup      sources=[prompt_lookup], default settings (adaptive, k_max 8); own engine per workload [copy-heavy]
  lookup_raw  sources=[prompt_lookup], adaptive=False, k_max 8 (never pauses)      [copy-heavy]
  adaptive    sources=[prompt_lookup, layer_skip], adaptive=True (own engine per workload, so the
              policy starts from nothing and learns on that workload alone)
  layer_skip  sources=[layer_skip], adaptive=False, k_max=4 (raw source behaviour)
  draft       sources=[draft], adaptive=False, k_max=4; draft = SmolLM2 cut to its first 8 blocks
              (tests/draftmodel.py write_truncated)
The raw layer_skip and draft arms are slow on this machine, so they run on
the first --slow-prompts prompts in the first --slow-repeats repeats only.
For each prompt the arms run back to back in rotating order (then the next
prompt), --repeats times.  Decode tok/s = (tokens - 1) / (wall time from the
first to the last token), measured the same way for llama.cpp.  Speedup =
median over (prompt, repeat) pairs of arm tok/s / plain tok/s, with a
bootstrap 95% interval.  Each arm's tokens are compared with plain greedy.

llama.cpp anchor (copy-heavy workload): Llama(model) vs
Llama(model, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10)),
temperature 0, same token prompts, same max tokens, stop at EOS.
Targets: lookup >= 1.5x on copy-heavy; adaptive >= 0.97x on chat.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil as bu  # noqa: E402

CODE = '''def compute_totals(orders):
    totals = {}
    for order in orders:
        customer = order["customer"]
        amount = order["quantity"] * order["unit_price"]
        if customer not in totals:
            totals[customer] = 0
        totals[customer] = totals[customer] + amount
    return totals


def top_customers(orders, n):
    totals = compute_totals(orders)
    ranked = sorted(totals.items(), key=lambda kv: kv[1], reverse=True)
    return ranked[:n]
'''

PASSAGE = ("The lighthouse keeper wrote in his log every evening. \"The sea was calm today,\" he noted on the "
           "first of May, \"and the gulls followed the fishing boats home.\" A week later the weather turned: "
           "\"Waves broke over the lower gallery, and the lamp burned all night.\" His daughter, who later "
           "published the logs, said that \"he never missed a single entry in forty years.\" The last line he "
           "wrote reads: \"Fog at dawn, clear by noon, all ships accounted for.\"")

COPY_PROMPTS = [
    "Rename the function compute_totals to sum_by_customer everywhere in this code and output the full code:\n\n" + CODE,
    "Add type hints to every function in this code. Output the complete code:\n\n" + CODE,
    "Replace `totals[customer] = totals[customer] + amount` with `totals[customer] += amount` and output the "
    "whole file unchanged otherwise:\n\n" + CODE,
    "Add a docstring to each function in this code and output the full code:\n\n" + CODE,
    "Extract every direct quotation from this passage, one per line:\n\n" + PASSAGE,
    "Copy this passage exactly, then give it a title:\n\n" + PASSAGE,
    "Fix the typos and output the corrected text in full:\n\nThe quick brwon fox jumps over the lazy dog. "
    "A jouney of a thousand miles begins with a single stpe. All that glitters is not gold, and not all those "
    "who wander are lost. Actions speak louder than wrods. The early bird catches the worm.",
    "Convert this list to a numbered list, keeping each item's text exactly:\n\n- buy fresh bread from the "
    "bakery on Main Street\n- return the library books before Friday\n- call the plumber about the kitchen "
    "sink\n- book train tickets for the trip to Lisbon\n- water the tomato plants in the garden\n- send the "
    "quarterly report to the finance team",
]

# Added with the lookup policy rework: the issue names two kinds of copy-heavy work, editing code given in the
# prompt and extracting quotes, and the eight prompts above hold four code edits (all on one snippet) and one
# quote extraction.  Two code edits on a second snippet and two quote extractions from other passages, written
# before they were run and kept whatever they measure.
CODE2 = '''class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count):
        if name in self.items:
            self.items[name] += count
        else:
            self.items[name] = count

    def remove(self, name, count):
        if self.items.get(name, 0) < count:
            raise ValueError("not enough " + name)
        self.items[name] -= count
'''

PASSAGE2 = ("At the town meeting the mayor opened with a warning: \"We cannot keep patching the old bridge.\" "
            "The engineer who inspected it agreed. \"The steel is sound, but the deck has rotted through in three "
            "places,\" she said. A shop owner asked who would pay, and the treasurer answered, \"The state will "
            "cover half if we apply before March.\" The vote passed, and the mayor closed by saying, \"Work starts "
            "in the spring.\"")

PASSAGE3 = ("In his lecture on the history of flight, the professor reminded the students that \"every airplane "
            "is a compromise between weight and strength.\" He described the Wright brothers' first glider and "
            "said, \"They failed more often than they flew, and they wrote down every failure.\" Near the end a "
            "student asked what the next breakthrough would be. \"Quieter engines,\" he replied, \"because the "
            "sky is getting crowded.\"")

COPY_PROMPTS += [
    "Rename the method remove to take in this class and output the complete class:\n\n" + CODE2,
    "Add a method total(self) that returns the sum of all counts to this class. Output the whole class:\n\n"
    + CODE2,
    "List every quotation in this text, exactly as written, one per line:\n\n" + PASSAGE2,
    "Extract the direct quotes from this passage and say who said each one:\n\n" + PASSAGE3,
]

CHAT_PROMPTS = [
    "What are some fun things to do on a rainy weekend?",
    "Write a short poem about the moon.",
    "Why do people enjoy music?",
    "Give me three tips for learning a new language.",
    "Tell me a story about a dragon who is afraid of the dark.",
    "What is the best way to start running as a beginner?",
    "Describe your ideal vacation.",
    "How can I be more productive when working from home?",
]


def run_one(core, ids, max_tokens, **kw):
    """One request on an idle engine; (tokens, metrics, decode tok/s from wall clock)."""
    rid = core.submit(ids, max_tokens=max_tokens, **kw)
    toks, metrics, t_first, t_last = [], None, None, None
    while core.pending:
        evs = core.step()
        now = time.perf_counter()
        for ev in evs:
            if ev["id"] != rid:
                continue
            if ev["type"] == "token":
                if t_first is None:
                    t_first = now
                t_last = now
                toks.append(ev["token"])
            elif ev["type"] == "done":
                metrics = ev["metrics"]
            else:
                raise RuntimeError(ev["message"])
    tps = (len(toks) - 1) / (t_last - t_first) if len(toks) > 1 and t_last > t_first else 0.0
    return toks, metrics, tps


def run_llama(llm, ids, max_tokens, eog):
    toks, t_first, t_last = [], None, None
    for t in llm.generate(ids, temp=0.0, reset=True):
        now = time.perf_counter()
        if t in eog:
            break
        if t_first is None:
            t_first = now
        t_last = now
        toks.append(int(t))
        if len(toks) >= max_tokens:
            break
    tps = (len(toks) - 1) / (t_last - t_first) if len(toks) > 1 and t_last > t_first else 0.0
    return toks, tps


def llama_worker(job_path, out_path):
    """Child process: llama.cpp plain vs prompt-lookup decoding on the given prompts."""
    import importlib.metadata as md
    import json

    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    job = json.load(open(job_path))
    # The AMX extra buffer type crashes llama.cpp 0.3.36 on this VM (SIGSEGV in
    # its AMX matmul on the first decode); without it llama.cpp runs its plain
    # AVX-512 kernels.  Llama() has no argument for it, so patch the defaults.
    _defaults = llama_cpp.llama_cpp.llama_model_default_params

    def _no_extra_bufts():
        p = _defaults()
        p.use_extra_bufts = False
        return p
    llama_cpp.llama_cpp.llama_model_default_params = _no_extra_bufts
    lkw = dict(model_path=job["path"], n_ctx=2048, n_threads=job["threads"], n_threads_batch=job["threads"],
               verbose=False, seed=0)
    lplain = llama_cpp.Llama(**lkw)
    lpld = llama_cpp.Llama(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10), **lkw)
    eog, ids = set(job["eog"]), job["prompts"]
    L = {"plain": {"tps": [], "tokens": {}}, "pld": {"tps": [], "tokens": {}}}
    run_llama(lplain, ids[0], 16, eog)
    run_llama(lpld, ids[0], 16, eog)
    for r in range(job["repeats"]):
        for i, p in enumerate(ids):
            for arm in bu.abba(r * len(ids) + i, "plain", "pld"):
                toks, tps = run_llama(lplain if arm == "plain" else lpld, p, job["max_tokens"], eog)
                L[arm]["tps"].append((i, r, tps))
                L[arm]["tokens"].setdefault(i, toks)
        print(f"  llama.cpp repeat {r}: plain {bu.median([x[2] for x in L['plain']['tps'] if x[1] == r]):.1f} "
              f"pld {bu.median([x[2] for x in L['pld']['tps'] if x[1] == r]):.1f} tok/s", flush=True)
    with open(out_path, "w") as f:
        json.dump({"version": md.version("llama_cpp_python"), "L": L}, f)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--slow-prompts", type=int, default=4, help="layer_skip/draft arms: first N prompts only")
    ap.add_argument("--slow-repeats", type=int, default=1, help="layer_skip/draft arms: first N repeats only")
    ap.add_argument("--draft-layers", type=int, default=8)
    ap.add_argument("--no-llama", action="store_true", help="skip the llama.cpp anchor")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(bu.ROOT, "docs", "bench", "speculative.md"))
    ap.add_argument("--llama-worker", nargs=2, metavar=("JOB", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.llama_worker:
        return llama_worker(*a.llama_worker)
    copy_prompts, chat_prompts = COPY_PROMPTS, CHAT_PROMPTS
    if a.quick:
        copy_prompts, chat_prompts, a.repeats, a.max_tokens = COPY_PROMPTS[:2], CHAT_PROMPTS[:2], 1, 32
        a.slow_prompts = 1

    from colibri_lab import _engine, models
    from colibri_lab.chat import render
    from colibri_lab.tokenizer import Tokenizer

    sys.path.insert(0, os.path.join(bu.ROOT, "tests"))
    from draftmodel import write_truncated

    load0 = bu.loadavg()
    info = bu.machine_info(a.threads)
    path = str(models.resolve(a.model))
    model = _engine.Model(path)
    meta = model.metadata()
    tok = Tokenizer.from_metadata(meta)
    tmpl = meta["tokenizer.chat_template"]
    draft_path = os.path.join("/tmp", f"colibri-bench-draft-{a.draft_layers}l-{os.getpid()}.gguf")
    write_truncated(path, draft_path, a.draft_layers)
    draft = _engine.Model(draft_path)

    def chat_ids(text):
        return tok.encode(render(tmpl, [{"role": "user", "content": text}], add_generation_prompt=True),
                          add_special=False)

    kw = dict(n_slots=1, n_ctx=2048, n_threads=a.threads, prefix_reuse=False)
    plain_core = _engine.Engine(model, **kw)
    fixed_core = _engine.Engine(model, draft_model=draft, layer_skip=True, **kw)
    SPEC = {"lookup": {"sources": ["prompt_lookup"]},
            "lookup_raw": {"sources": ["prompt_lookup"], "adaptive": False, "k_max": 8},
            "adaptive": {"sources": ["prompt_lookup", "layer_skip"], "adaptive": True},
            "layer_skip": {"sources": ["layer_skip"], "adaptive": False, "k_max": 4},
            "draft": {"sources": ["draft"], "adaptive": False, "k_max": 4}}
    workloads = {"copy-heavy": (copy_prompts, ["plain", "lookup", "lookup_raw", "adaptive", "layer_skip", "draft"]),
                 "chat": (chat_prompts, ["plain", "adaptive", "layer_skip", "draft"])}
    results = {}
    for wname, (prompts, arms) in workloads.items():
        adapt_core = _engine.Engine(model, layer_skip=True, **kw)  # fresh policy state per workload
        # the policy's acceptance record is engine-wide per source: the adaptive lookup arm gets an engine of
        # its own so the never-pausing lookup_raw arm cannot feed it
        lookup_core = _engine.Engine(model, **kw)
        cores = {"plain": plain_core, "lookup": lookup_core, "lookup_raw": fixed_core, "adaptive": adapt_core,
                 "layer_skip": fixed_core,
                 "draft": fixed_core}
        ids = [chat_ids(p) for p in prompts]
        R = {arm: {"tps": [], "tokens": {}, "identical": True, "n_pos": [0] * 16, "acc_pos": [0] * 16,
                   "draft_n": 0, "accepted": 0, "steps": 0} for arm in arms}
        print(f"{wname}: prompt lengths {[len(x) for x in ids]}", flush=True)
        run_one(plain_core, ids[0], 16)  # warm-up
        for r in range(a.repeats):
            for i, p in enumerate(ids):
                k = (r * len(ids) + i) % len(arms)
                for arm in arms[k:] + arms[:k]:
                    if arm in ("layer_skip", "draft") and (i >= a.slow_prompts or r >= a.slow_repeats):
                        continue  # the raw (non-adaptive) sources are slow here: measured on a subset
                    spec = SPEC.get(arm)
                    toks, m, tps = run_one(cores[arm], p, a.max_tokens, **({"speculative": spec} if spec else {}))
                    d = R[arm]
                    d["tps"].append((i, r, tps))
                    d["tokens"].setdefault(i, toks)
                    d["draft_n"] += m["draft_n"]
                    d["accepted"] += m["draft_accepted"]
                    d["steps"] += m["draft_steps"]
                    for j, (n, acc) in enumerate(zip(m["draft_n_by_pos"], m["draft_accepted_by_pos"])):
                        d["n_pos"][j] += n
                        d["acc_pos"][j] += acc
            print(f"  repeat {r}: " + "  ".join(f"{arm} {bu.median([x[2] for x in R[arm]['tps'] if x[1] == r]):.1f}"
                                                 for arm in arms) + " tok/s", flush=True)
        for arm in arms:
            R[arm]["identical"] = all(R[arm]["tokens"][i] == R["plain"]["tokens"][i] for i in R[arm]["tokens"])
        R["_stats_adaptive"] = adapt_core.spec_stats()
        R["_stats_lookup"] = lookup_core.spec_stats()
        adapt_core.close()
        lookup_core.close()
        results[wname] = (ids, arms, R)
    fixed_core.close()

    # ----------------------------------------------------------- llama.cpp anchor
    llama = None
    if not a.no_llama:
        # in a child process: a crash inside llama.cpp must not lose the results above
        import json
        import subprocess
        import tempfile
        eog = [i for i in range(model.n_vocab) if model.token_is_eog(i)]
        with tempfile.TemporaryDirectory() as td:
            job = os.path.join(td, "job.json")
            res_path = os.path.join(td, "out.json")
            with open(job, "w") as f:
                json.dump({"path": path, "threads": a.threads, "repeats": a.repeats, "max_tokens": a.max_tokens,
                           "eog": eog, "prompts": results["copy-heavy"][0]}, f)
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--llama-worker", job, res_path],
                               capture_output=True, text=True)
            sys.stdout.write(p.stdout)
            if p.returncode == 0 and os.path.exists(res_path):
                llama = json.load(open(res_path))
                for arm in llama["L"].values():  # JSON keys are strings, tps rows lists
                    arm["tokens"] = {int(k): v for k, v in arm["tokens"].items()}
                    arm["tps"] = [tuple(x) for x in arm["tps"]]
            else:
                tail = " | ".join(p.stderr.strip().splitlines()[-4:])
                llama = {"error": f"llama-cpp-python child exited with code {p.returncode} "
                                  f"({'SIGSEGV' if p.returncode in (-11, 139) else 'error'}): {tail[:400]}"}
    os.unlink(draft_path)
    load1 = bu.loadavg()

    # ------------------------------------------------------------------ report
    def pairs(arm_list, base_list):
        base = {(i, r): t for i, r, t in base_list}
        return [t / base[(i, r)] for i, r, t in arm_list if base.get((i, r))]

    out = [bu.header("Speculative decoding (issue 5)", [os.path.relpath(sys.argv[0], bu.ROOT)] + sys.argv[1:],
                     info, load0, load1)]
    out.append(f"Greedy, batch 1, max_tokens {a.max_tokens}, {a.repeats} repeats, arms back to back per prompt in "
               f"rotating order; draft model = SmolLM2 first {a.draft_layers} blocks. The raw layer_skip / draft arms "
               f"(adaptive off, k_max 4) ran on the first {a.slow_prompts} prompts of {a.slow_repeats} repeat(s) only. "
               "Acceptance by position = accepted / tried at draft position 1, 2, ...\n")
    verdicts = []
    for wname, (ids, arms, R) in results.items():
        out.append(f"### {wname} ({len(ids)} prompts)\n")
        out.append("| arm | decode tok/s | speedup vs plain (median of pairs) | 95% CI | output = plain greedy | "
                   "accept rate | mean accepted length | acceptance by position |")
        out.append("|---|---|---|---|---|---|---|---|")
        for arm in arms:
            d = R[arm]
            tps = [x[2] for x in d["tps"]]
            if arm == "plain":
                out.append(f"| plain | {bu.describe(tps)} | 1 | | | | | |")
                continue
            sp = pairs(d["tps"], R["plain"]["tps"])
            lo, hi = bu.bootstrap_ci(sp)
            rate = d["accepted"] / d["draft_n"] if d["draft_n"] else 0.0
            alen = 1 + d["accepted"] / d["steps"] if d["steps"] else 0.0
            pos = ", ".join(f"{acc / n:.2f}" for n, acc in zip(d["n_pos"], d["acc_pos"]) if n)
            out.append(f"| {arm} | {bu.describe(tps)} | {bu.median(sp):.3f}x | {lo:.3f}–{hi:.3f} | {d['identical']} | "
                       f"{rate:.2f} ({d['accepted']}/{d['draft_n']}) | {alen:.2f} | {pos} |")
            if wname == "copy-heavy" and arm == "lookup":
                verdicts.append(f"prompt lookup on copy-heavy: {bu.median(sp):.2f}x (CI {lo:.2f}–{hi:.2f}), target >= 1.5x: "
                                f"**{bu.verdict_ge(bu.median(sp), lo, 1.5)}**; outputs identical: {d['identical']}")
            if wname == "chat" and arm == "adaptive":
                verdicts.append(f"adaptive (prompt_lookup+layer_skip) on chat: {bu.median(sp):.3f}x (CI {lo:.3f}–{hi:.3f}), "
                                f"target >= 0.97x: **{bu.verdict_ge(bu.median(sp), lo, 0.97)}**; "
                                f"outputs identical: {d['identical']}")
        st = R["_stats_lookup"]
        out.append("\nLookup-arm engine's policy state at the end of this workload: " + "; ".join(
            f"{s}: drafts {v['drafts']}, accept {v['accept_rate']:.2f}, k {v['k']}, expected gain "
            f"{v['expected_gain']:.2f}, paused {v['paused']}" for s, v in st.items() if s == "prompt_lookup"))
        st = R["_stats_adaptive"]
        out.append("\nAdaptive engine's policy state at the end of this workload: " + "; ".join(
            f"{s}: drafts {v['drafts']}, accept {v['accept_rate']:.2f}, k {v['k']}, expected gain "
            f"{v['expected_gain']:.2f}, paused {v['paused']}" for s, v in st.items() if s in ("prompt_lookup", "layer_skip")) + "\n")
    if llama is not None:
        out.append("### llama.cpp anchor: prompt-lookup decoding on the copy-heavy workload\n")
        if "error" in llama:
            out.append(f"NOT MEASURED: `{llama['error']}`\n")
        else:
            L = llama["L"]
            sp = pairs(L["pld"]["tps"], L["plain"]["tps"])
            lo, hi = bu.bootstrap_ci(sp)
            same = all(L["pld"]["tokens"][i] == L["plain"]["tokens"][i] for i in L["plain"]["tokens"])
            ours = results["copy-heavy"][2]
            ours_vs = [o / t for (i, r, o), (_, _, t) in zip(sorted(ours["lookup"]["tps"]), sorted(L["pld"]["tps"])) if t]
            olo, ohi = bu.bootstrap_ci(ours_vs)
            pvs = [o / t for (i, r, o), (_, _, t) in zip(sorted(ours["plain"]["tps"]), sorted(L["plain"]["tps"])) if t]
            match = sum(ours["plain"]["tokens"][i] == L["plain"]["tokens"][i] for i in L["plain"]["tokens"])
            out.append(f"llama-cpp-python {llama['version']}, LlamaPromptLookupDecoding(num_pred_tokens=10) "
                       "(max_ngram_size 2; llama-cpp-python turns on logits for all rows when a draft model is set).\n")
            out.append("| arm | decode tok/s |")
            out.append("|---|---|")
            out.append(f"| llama.cpp plain | {bu.describe([x[2] for x in L['plain']['tps']])} |")
            out.append(f"| llama.cpp prompt lookup | {bu.describe([x[2] for x in L['pld']['tps']])} |")
            out.append(f"\n- llama.cpp PLD speedup vs its own plain decoding: {bu.median(sp):.3f}x (CI {lo:.3f}–{hi:.3f}); "
                       f"its outputs identical to its plain greedy: {same}")
            out.append(f"- ours (lookup) tok/s / llama.cpp (PLD) tok/s, paired by prompt and repeat: {bu.median(ours_vs):.3f} "
                       f"(CI {olo:.3f}–{ohi:.3f})")
            out.append(f"- ours plain / llama.cpp plain: {bu.median(pvs):.3f}; plain greedy outputs equal to ours on "
                       f"{match}/{len(L['plain']['tokens'])} prompts\n")
            verdicts.append(f"ours lookup vs llama.cpp PLD: {bu.median(ours_vs):.2f}x its tok/s; its PLD speedup "
                            f"{bu.median(sp):.2f}x")
    bu.finish_report(out, verdicts, a, ap)
    return 0


if __name__ == "__main__":
    sys.exit(main())
