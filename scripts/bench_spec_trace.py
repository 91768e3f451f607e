#!/usr/bin/env python
"""Per-step trace of speculative decoding on one category (issue 17): for each decode step of each arm,
the rows verified, tokens emitted, step time and its phases (matmul, LM head, attention, drafting), so the
time a speculating arm spends can be split into verify rows that were accepted, rows that were wasted,
and drafting.  Arms run back to back per prompt, as in bench_spec.py.

    python scripts/bench_spec_trace.py [--category code_editing] [--arms plain,lookup,combined] [--n 10]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil as bu  # noqa: E402


def trace_one(core, ids, max_tokens, speculative=None):
    kw = {"speculative": speculative} if speculative else {}
    rid = core.submit(ids, max_tokens=max_tokens, **kw)
    steps, toks, metrics = [], [], None
    while core.pending:
        t0 = time.perf_counter()
        evs = core.step()
        wall = (time.perf_counter() - t0) * 1e3
        st = core.last_step()
        got = [ev for ev in evs if ev["id"] == rid and ev["type"] == "token"]
        toks += [ev["token"] for ev in got]
        for ev in evs:
            if ev["id"] == rid and ev["type"] == "done":
                metrics = ev["metrics"]
        steps.append({"rows": st["rows_decode"], "prefill": st["rows_prefill"], "emitted": len(got), "wall": wall,
                      **{k: st[k] for k in ("step_ms", "matmul_ms", "lm_head_ms", "attention_ms", "draft_ms",
                                            "sampling_ms", "other_ms")}})
    return toks, steps, metrics


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--category", default="code_editing")
    ap.add_argument("--arms", default="plain,lookup,combined")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="", help="write every step here")
    a = ap.parse_args(argv)

    from colibri_lab import _engine, models
    from colibri_lab.speculative import CATEGORY_ARMS, category_prompts
    from colibri_lab.tokenizer import Tokenizer

    arms = a.arms.split(",")
    target = _engine.Model(str(models.resolve(a.model)))
    draft = _engine.Model(str(models.resolve(a.draft)))
    meta = target.metadata()
    tok = Tokenizer.from_metadata(meta)
    plain = _engine.Engine(target, n_slots=1, n_ctx=2048, n_threads=a.threads)
    prompts = category_prompts(tok, meta["tokenizer.chat_template"], [a.category], a.n, plain_core=plain,
                               max_tokens=a.max_tokens)[a.category]
    cores = {arm: plain if arm == "plain" else _engine.Engine(target, n_slots=1, n_ctx=2048, n_threads=a.threads,
                                                            draft_model=draft) for arm in arms}
    print(f"load {bu.loadavg()}", flush=True)
    trace_one(plain, prompts[0][1], 8)
    out = []
    for i, (iid, ids) in enumerate(prompts):
        k = i % len(arms)
        res = {}
        for arm in arms[k:] + arms[:k]:
            toks, steps, m = trace_one(cores[arm], ids, a.max_tokens, CATEGORY_ARMS[arm])
            dec = [s for s in steps if s["prefill"] == 0 and s["emitted"] > 0][1:]  # after the first token
            res[arm] = (toks, dec, m)
            out.append({"item": iid, "arm": arm, "steps": steps, "n_tokens": len(toks)})
        base = res["plain"]
        line = []
        for arm, (toks, dec, m) in res.items():
            ms = sum(s["wall"] for s in dec)
            n = sum(s["emitted"] for s in dec)
            line.append(f"{arm} {n / ms * 1e3:.1f} tok/s ({len(dec)} steps{'' if toks == base[0] else ' DIFFERS'})")
        print(f"{iid:16s} " + "; ".join(line), flush=True)
    print(f"load {bu.loadavg()}", flush=True)
    # aggregate: per arm, step time by rows, and the split of time
    for arm in arms:
        by_rows = collections.defaultdict(list)
        tot = collections.Counter()
        for rec in out:
            if rec["arm"] != arm:
                continue
            dec = [s for s in rec["steps"] if s["prefill"] == 0 and s["emitted"] > 0][1:]
            for s in dec:
                by_rows[s["rows"]].append(s)
                tot["steps"] += 1
                tot["emitted"] += s["emitted"]
                tot["rows"] += s["rows"]
                for k in ("wall", "step_ms", "matmul_ms", "lm_head_ms", "attention_ms", "draft_ms"):
                    tot[k] += s[k]
        if not tot["steps"]:
            continue
        print(f"\n{arm}: {tot['steps']} steps, {tot['emitted']} tokens ({tot['emitted'] / tot['steps']:.2f} a step), "
              f"{tot['rows']} rows ({tot['rows'] - tot['emitted']} wasted), wall {tot['wall'] / 1e3:.2f} s: "
              + ", ".join(f"{k} {tot[k] / tot['wall']:.2f}" for k in ("matmul_ms", "lm_head_ms", "attention_ms",
                                                                      "draft_ms")))
        print("  rows: steps, median wall ms (forward part: step - draft), mean emitted")
        for r in sorted(by_rows):
            v = by_rows[r]
            fw = sorted(s["wall"] - s["draft_ms"] for s in v)
            lm = sorted(s["lm_head_ms"] for s in v)
            print(f"  {r:3d}: {len(v):4d}, {fw[len(fw) // 2]:6.1f} ms (lm head {lm[len(lm) // 2]:5.1f}), "
                  f"emitted {sum(s['emitted'] for s in v) / len(v):.2f}, draft {sum(s['draft_ms'] for s in v) / len(v):.1f} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)
    for c in {id(c): c for c in cores.values()}.values():
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
