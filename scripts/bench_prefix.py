#!/usr/bin/env python
"""Prefix reuse (issue 3): time to first token on a growing multi-turn
conversation with the KV prefix reused vs a cold prefill, and the cost of
prefix reuse on a workload that shares no prefixes.

    python scripts/bench_prefix.py [--model smollm2] [--threads 2] [--repeats 6] [--quick]
                                   [--out docs/bench/prefix.md]

Part A (multi-turn).  A chat whose history grows turn by turn (real greedy
replies from the model, appended token for token) until it passes ~1,000
tokens.  For the turns whose prompt is nearest 250 / 500 / 1,000 tokens:
  reuse: the slot holds the previous turn (prompt + reply), as it would in a
         conversation; the new turn's prompt is submitted and TTFT measured;
  cold:  the same slot cleared (cb_engine_slot_clear), the same prompt submitted.
Same engine, same slot, same prompt: the only difference is the cached KV.
TTFT is wall time from submit to the first token event (the engine is driven
directly, no scheduler thread); arms alternate in ABBA order.  Target: reuse
>= 5x faster at ~1,000 tokens.

Part B (no shared prefixes).  Random distinct prompts (fresh random words per
repeat, so nothing can be cached), 32 tokens each with ignore_eos, on an
engine with prefix_reuse=True and one with prefix_reuse=False (4 slots each,
one request at a time), ABBA by repeat, paired by prompt.  Metric: end-to-end
wall time per request; ratio on/off with a bootstrap 95% interval of the
median paired ratio.  Target: <= 1.02 (reuse costs at most 2%).
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil as bu  # noqa: E402

QUESTIONS = [
    "What are the main causes of the seasons on Earth?",
    "Can you explain how photosynthesis works in simple terms?",
    "Why is the sky blue during the day and red at sunset?",
    "How do vaccines train the immune system?",
    "What is the difference between weather and climate?",
    "How does a refrigerator keep food cold?",
    "Why do we have leap years?",
    "What makes a good habit stick?",
    "How do airplanes stay in the air?",
    "What is the water cycle?",
    "How does compound interest work?",
    "Why do cats purr?",
    "What is the greenhouse effect?",
    "How do noise-cancelling headphones work?",
    "What should I pack for a week-long hiking trip?",
    "How do bees make honey?",
]

WORDS = ("apple river stone cloud engine garden window silver quiet rapid forest number pencil "
         "ocean bridge candle market winter summer yellow orange planet rocket doctor teacher "
         "music paper basket mirror castle island mountain valley desert thunder lantern violin "
         "harbor meadow canyon glacier compass feather marble saddle tunnel velvet whisper").split()


def run_one(core, ids, max_tokens, **kw):
    """Submit one request on an idle engine and step it to completion.
    Returns (tokens, metrics, wall TTFT seconds, wall e2e seconds)."""
    t0 = time.perf_counter()
    rid = core.submit(ids, max_tokens=max_tokens, **kw)
    toks, metrics, ttft = [], None, None
    while core.pending:
        for ev in core.step():
            if ev["id"] != rid:
                continue
            if ev["type"] == "token":
                if ttft is None:
                    ttft = time.perf_counter() - t0
                toks.append(ev["token"])
            elif ev["type"] == "done":
                metrics = ev["metrics"]
            else:
                raise RuntimeError(ev["message"])
    return toks, metrics, ttft, time.perf_counter() - t0


def build_conversation(core, tok, template, target_len, reply_tokens):
    """Grow a conversation until its prompt passes target_len tokens.
    Returns [(prompt ids, reply ids)] per turn."""
    from colibri_lab.chat import render

    first = render(template, [{"role": "system", "content": "You are a helpful assistant."},
                              {"role": "user", "content": QUESTIONS[0]}], add_generation_prompt=True)
    prompt = tok.encode(first, add_special=False)
    turns, qi = [], 1
    while True:
        reply, _, _, _ = run_one(core, prompt, reply_tokens)
        turns.append((list(prompt), list(reply)))
        if len(prompt) >= target_len:
            return turns
        q = QUESTIONS[qi % len(QUESTIONS)]
        qi += 1
        suffix = tok.encode(f"<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
                            add_special=False)
        prompt = prompt + reply + suffix


def random_prompt(rng, n_words):
    return " ".join(rng.choice(WORDS) for _ in range(n_words)).capitalize() + "."


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=6, help="ABBA repeats per length (part A) and per arm (part B)")
    ap.add_argument("--lengths", default="250,500,1000")
    ap.add_argument("--reply-tokens", type=int, default=80)
    ap.add_argument("--unshared-prompts", type=int, default=8)
    ap.add_argument("--unshared-words", type=int, default=110)
    ap.add_argument("--quick", action="store_true", help="small smoke run")
    ap.add_argument("--out", default=os.path.join(bu.ROOT, "docs", "bench", "prefix.md"))
    a = ap.parse_args(argv)
    if a.quick:
        a.repeats, a.lengths, a.unshared_prompts, a.reply_tokens = 2, "250", 3, 40

    from colibri_lab import _engine, models
    from colibri_lab.tokenizer import Tokenizer

    load0 = bu.loadavg()
    info = bu.machine_info(a.threads)
    model = _engine.Model(str(models.resolve(a.model)))
    meta = model.metadata()
    tok = Tokenizer.from_metadata(meta)
    template = meta["tokenizer.chat_template"]
    lengths = [int(x) for x in a.lengths.split(",")]

    # ---------------------------------------------------------------- part A
    core = _engine.Engine(model, n_slots=1, n_ctx=2048, n_threads=a.threads, prefix_reuse=True)
    print(f"building a conversation up to {max(lengths)} tokens ...", flush=True)
    turns = build_conversation(core, tok, template, max(lengths), a.reply_tokens)
    print("  turn prompt lengths:", [len(p) for p, _ in turns], flush=True)
    picks = []
    for L in lengths:
        # turn index >= 1 (it needs a previous turn), prompt length nearest L
        n = min(range(1, len(turns)), key=lambda i: abs(len(turns[i][0]) - L))
        picks.append((L, n))
    # warm-up: one of each arm on the longest pick
    resA = {L: {"reuse": [], "cold": [], "cached": [], "n_prompt": 0} for L, _ in picks}
    for r in range(-1, a.repeats):
        for L, n in picks:
            prev_prompt, prev_reply = turns[n - 1]
            state = prev_prompt + prev_reply
            prompt = turns[n][0]
            for arm in bu.abba(max(r, 0), "reuse", "cold"):
                core.slot_clear(0)
                if arm == "reuse":
                    run_one(core, state, 1)          # the slot holds the previous turn
                _, m, ttft, _ = run_one(core, prompt, 1)
                if r < 0:
                    continue                          # warm-up
                resA[L][arm].append(ttft * 1e3)
                if arm == "reuse":
                    resA[L]["cached"].append(m["cached_tokens"])
                resA[L]["n_prompt"] = len(prompt)
        if r >= 0:
            print(f"  repeat {r}: " + "  ".join(
                f"{L}: reuse {resA[L]['reuse'][-1]:.1f} ms cold {resA[L]['cold'][-1]:.1f} ms" for L, _ in picks),
                flush=True)
    core.close()

    # ---------------------------------------------------------------- part B
    print("unshared workload ...", flush=True)
    engines = {"on": _engine.Engine(model, n_slots=4, n_ctx=1024, n_threads=a.threads, prefix_reuse=True),
               "off": _engine.Engine(model, n_slots=4, n_ctx=1024, n_threads=a.threads, prefix_reuse=False)}
    wrng = random.Random(12345)
    for arm in ("on", "off"):  # warm-up
        for _ in range(2):
            run_one(engines[arm], tok.encode(random_prompt(wrng, a.unshared_words), add_special=False), 8,
                    ignore_eos=True)
    e2e = {"on": [], "off": []}
    tps = {"on": [], "off": []}
    ratios, cached_on, same = [], 0, True
    for r in range(a.repeats):
        rng = random.Random(1000 + r)  # fresh prompts every repeat: nothing can be cached
        prompts = [tok.encode(random_prompt(rng, a.unshared_words), add_special=False)
                   for _ in range(a.unshared_prompts)]
        per = {"on": [], "off": []}
        outs = {"on": [], "off": []}
        for arm in bu.abba(r, "on", "off"):
            for p in prompts:
                toks, m, _, wall = run_one(engines[arm], p, 32, ignore_eos=True)
                per[arm].append(wall * 1e3)
                outs[arm].append(toks)
                tps[arm].append(m["decode_tok_s"])
                if arm == "on":
                    cached_on += m["cached_tokens"]
        same &= outs["on"] == outs["off"]
        for arm in per:
            e2e[arm] += per[arm]
        ratios += [x / y for x, y in zip(per["on"], per["off"])]
        print(f"  repeat {r}: on {bu.median(per['on']):.1f} ms  off {bu.median(per['off']):.1f} ms", flush=True)
    for e in engines.values():
        e.close()
    load1 = bu.loadavg()

    # ---------------------------------------------------------------- report
    out = [bu.header("Prefix reuse (issue 3)", [os.path.relpath(sys.argv[0], bu.ROOT)] + sys.argv[1:], info,
                     load0, load1)]
    out.append("### A. Multi-turn conversation: TTFT with the previous turn cached vs cold prefill\n")
    out.append(f"Real greedy replies of up to {a.reply_tokens} tokens; turn prompt lengths "
               f"{[len(p) for p, _ in turns]}. Same engine and slot; cold = slot cleared. "
               f"{a.repeats} ABBA repeats after one warm-up; TTFT = wall time submit → first token.\n")
    out.append("| history (target) | prompt tokens | cached tokens (reuse) | TTFT reuse, ms | TTFT cold, ms "
               "| speedup cold/reuse (median of pairs) | 95% CI | target |")
    out.append("|---|---|---|---|---|---|---|---|")
    verdicts = []
    for L, n in picks:
        d = resA[L]
        sp = [c / w for c, w in zip(d["cold"], d["reuse"])]
        lo, hi = bu.bootstrap_ci(sp)
        tgt = ""
        if L == max(lengths):
            ok = bu.median(sp) >= 5.0
            tgt = f">= 5x: **{'met' if ok else 'MISSED'}**"
            verdicts.append(f"TTFT speedup at {d['n_prompt']} tokens: {bu.median(sp):.1f}x (95% CI {lo:.1f}–{hi:.1f}), "
                            f"target >= 5x: {'met' if ok else 'MISSED'}")
        out.append(f"| ~{L} | {d['n_prompt']} | {int(bu.median(d['cached']))} | {bu.describe(d['reuse'])} | "
                   f"{bu.describe(d['cold'])} | {bu.median(sp):.2f}x | {lo:.2f}–{hi:.2f} | {tgt} |")
    rlo, rhi = bu.bootstrap_ci(ratios)
    rmed = bu.median(ratios)
    # met: the whole interval is within target; "not resolved": the median is, the interval is not
    verdB = "met" if rhi <= 1.02 else ("median within target, CI not resolved" if rmed <= 1.02 else "MISSED")
    out.append("\n### B. No shared prefixes: cost of prefix_reuse=True\n")
    out.append(f"{a.unshared_prompts} random prompts of {a.unshared_words} random words per repeat (new each repeat), "
               f"32 tokens each (ignore_eos), 4 slots, one request at a time; {a.repeats} repeats, arms ABBA; "
               f"one engine per arm. Cached tokens on the reuse engine over the whole run: {cached_on}. "
               f"Outputs identical on/off: {same}.\n")
    out.append("| arm | e2e per request, ms | decode tok/s |")
    out.append("|---|---|---|")
    for arm in ("on", "off"):
        out.append(f"| prefix_reuse={arm} | {bu.describe(e2e[arm])} | {bu.describe(tps[arm])} |")
    out.append(f"\nPaired e2e ratio on/off: median {rmed:.4f} (95% bootstrap CI {rlo:.4f}–{rhi:.4f}, "
               f"n={len(ratios)} pairs). Target <= 1.02: **{verdB}**.\n")
    verdicts.append(f"unshared workload e2e on/off {rmed:.3f} (CI {rlo:.3f}–{rhi:.3f}), target <= 1.02: "
                    f"{verdB}")
    bu.finish_report(out, verdicts, a, ap)
    return 0


if __name__ == "__main__":
    sys.exit(main())
