#!/usr/bin/env python
"""Where the speedup of speculation on a category can come from (issue 17): for each prompt, plain greedy
output T, then per output position i, teacher-forced:

  L[i]  tokens prompt lookup's draft (ngram_min..ngram_max, the engine's matcher) would get accepted
  D[i]  tokens a greedy draft by the draft model would get accepted (its teacher-forced argmax agreeing
        with T from i on: a draft token is accepted only if the ones before it were, so this is exact)

and the verify cost c(rows) of the target measured on this machine (median ms of one forward, LM head on
every row).  From these, the fastest schedule each family of sources allows (dynamic programming over
output positions, knowing the future):

  lookup oracle    each step verifies a lookup draft of exactly L[i] tokens (or decodes plainly)
  combined oracle  each step: a lookup draft of L[i], a draft-model draft of D[i] tokens (cost c(D+1) plus
                   D drafter tokens), or plain
  combined+ext     also: j <= D[i] draft-model tokens continued by lookup from i + j (the combined source's
                   extension)

and the schedules a fixed depth k gives, so the gap between the policy and what the sources allow is on
record.  Not a timed benchmark of decoding (the costs are measured once, under the bench lock):

    python scripts/bench_spec_oracle.py [--category code_editing] [--n 10] [--max-tokens 128]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil as bu  # noqa: E402


def lookup_draft(hist, ngram_min, ngram_max, k, cap=32):
    """cb_lookup_draft_ex in Python: (draft, match length)."""
    n = len(hist)
    if n < 2:
        return [], 0
    last = hist[-1]
    capn = max(ngram_max, cap)
    best_j, best_cmp, best_len = -1, 0, 0
    for j in range(n - 2, -1, -1):
        if hist[j] != last:
            continue
        ln = 1
        while ln < capn and j - ln >= 0 and hist[j - ln] == hist[n - 1 - ln]:
            ln += 1
        if ln < ngram_min:
            continue
        cmp = min(ln, ngram_max)
        if cmp > best_cmp:
            best_cmp, best_len, best_j = cmp, ln, j
            if cmp == ngram_max:
                break
    if best_j < 0:
        return [], 0
    out = []
    s = best_j + 1
    for m in range(k):
        idx = s + m
        out.append(hist[idx] if idx < n else out[idx - n])
    return out, best_len


def accepted(draft, future):
    a = 0
    while a < len(draft) and a < len(future) and draft[a] == future[a]:
        a += 1
    return a


def schedule(n, options):
    """Least time to emit n tokens: options(i) -> [(advance, cost)] from position i (plain included)."""
    inf = float("inf")
    best = [inf] * (n + 1)
    best[0] = 0.0
    for i in range(n):
        if best[i] == inf:
            continue
        for adv, cost in options(i):
            j = min(n, i + adv)
            if best[i] + cost < best[j]:
                best[j] = best[i] + cost
    return best[n]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--category", default="code_editing")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--k-max", type=int, default=16)
    ap.add_argument("--ngram-min", type=int, default=2)
    ap.add_argument("--ngram-max", type=int, default=16)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--costs", default="", help="comma-separated ms for 1..k_max+1 rows (skip measuring)")
    ap.add_argument("--draft-ms", type=float, default=0.0, help="ms per drafted token (default: measured row)")
    a = ap.parse_args(argv)

    import numpy as np

    from colibri_lab import _engine, models
    from colibri_lab.speculative import _run_one, category_prompts
    from colibri_lab.tokenizer import Tokenizer

    target = _engine.Model(str(models.resolve(a.model)))
    draft = _engine.Model(str(models.resolve(a.draft)))
    meta = target.metadata()
    tok = Tokenizer.from_metadata(meta)
    core = _engine.Engine(target, n_slots=1, n_ctx=2048, n_threads=a.threads)
    dcore = _engine.Engine(draft, n_slots=1, n_ctx=2048, n_threads=a.threads)
    prompts = category_prompts(tok, meta["tokenizer.chat_template"], [a.category], a.n, plain_core=core,
                               max_tokens=a.max_tokens)[a.category]
    rows = list(range(1, a.k_max + 2))
    if a.costs:
        c = [float(x) for x in a.costs.split(",")]
        cost = {r: c[r - 1] for r in rows}
        dms = a.draft_ms
    else:
        from bench_spec import step_costs
        print(f"load {bu.loadavg()}", flush=True)
        sc = step_costs({"t": target, "d": draft}, a.threads, rows=tuple(rows), reps=a.reps)
        print(f"load {bu.loadavg()}", flush=True)
        cost = sc["t"]
        dms = a.draft_ms or sc["d"][1]
    one = cost[1]
    print("verify cost c(rows) ms: " + ",".join(f"{cost[r]:.1f}" for r in rows))
    print("verify cost c(rows)/c(1): " + ", ".join(f"{r}:{cost[r] / one:.2f}" for r in rows))
    print(f"draft token {dms:.1f} ms = {dms / one:.2f} of a target row")

    tot = {}
    per = []
    for iid, ids in prompts:
        toks, _, _ = _run_one(core, ids, a.max_tokens)
        full = list(ids) + list(toks)
        # draft model's teacher-forced argmax over prompt + output: dam[p] predicts full[p + 1]
        dcore.slot_clear(0)
        dam = list(dcore.forward_argmax(0, full, 0))
        n = len(toks)
        P = len(ids)
        L, D, M = [], [], []
        for i in range(n):  # T[i] pending (in the history), drafting T[i+1..]
            hist = full[:P + i + 1]
            fut = toks[i + 1:]
            d, ml = lookup_draft(hist, a.ngram_min, a.ngram_max, a.k_max)
            L.append(accepted(d, fut) if d else -1)
            M.append(ml)
            run = 0
            while i + 1 + run < n and run < a.k_max and dam[P + i + run] == toks[i + 1 + run]:
                run += 1
            D.append(run)

        def opt_lookup(i):
            o = [(1, one)]
            if L[i] > 0:
                o.append((L[i] + 1, cost[L[i] + 1]))
            return o

        def opt_comb(i):
            o = opt_lookup(i)
            if D[i] > 0:
                o.append((D[i] + 1, cost[D[i] + 1] + D[i] * dms))
            return o

        def opt_ext(i):
            # a draft-model draft of j tokens continued by lookup from where it ends (the combined source)
            o = opt_comb(i)
            for j in range(1, D[i] + 1):
                if i + j < n and L[i + j] > 0 and j + L[i + j] <= a.k_max:
                    o.append((j + L[i + j] + 1, cost[j + L[i + j] + 1] + j * dms))
            return o

        def fixed_lookup(k):
            def f(i):
                if L[i] < 0:
                    return [(1, one)]
                return [(min(L[i], k) + 1, cost[k + 1])]
            return f

        base = n * one
        res = {"lookup oracle": base / schedule(n, opt_lookup), "combined oracle": base / schedule(n, opt_comb),
               "combined+ext oracle": base / schedule(n, opt_ext)}
        for k in (2, 3, 4, 6, 7, 8, 12, 15, 16):
            if k <= a.k_max:
                res[f"lookup k={k}"] = base / schedule(n, fixed_lookup(k))
        copied = sum(1 for i in range(n - 1) if L[i] > 0)
        nomatch = sum(1 for x in L if x < 0)
        per.append((iid, n, copied, nomatch, sum(max(0, x) for x in L), res))
        for kname, v in res.items():
            tot.setdefault(kname, []).append(v)
        print(f"{iid:16s} n={n:3d} lookup drafts found at {n - nomatch} positions, accepted>0 at {copied}; "
              + "; ".join(f"{k} {v:.2f}x" for k, v in res.items()), flush=True)
        # where lookup fails: positions with no match or 0 accepted
        s = "".join("." if L[i] > 0 else ("-" if L[i] < 0 else "x") for i in range(n))
        t = "".join("d" if D[i] > 0 else " " for i in range(n))
        print("   lookup: " + s)
        print("   draft : " + t)
    print("geometric means over prompts:")
    for kname, v in tot.items():
        print(f"  {kname}: {float(np.exp(np.mean(np.log(v)))):.2f}x")
    core.close()
    dcore.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
