"""Streaming throughput through HTTP vs. the engine directly.

    python scripts/bench_serve.py [--model smollm2] [--threads 2] [--max-tokens 64] [--repeats 6] [--quick]
                                  [--out docs/bench/serve.md]

For concurrency 1 and 8 it streams the same greedy requests (a) straight
from `Engine.stream_events` on threads and (b) through the server
(`/v1/completions`, stream=True, raw http.client on threads), interleaving
A and B in ABBA order after a warm-up, and prints per configuration the
median aggregate tok/s, median time to first token / byte, and the ratios
HTTP / engine.  Outputs are checked to be identical (greedy, batch-invariant).
The machine may be shared: look at the spread, not just the medians.
Each adjacent engine/HTTP pair of runs gives one ratio; the report gives the
median ratio with a bootstrap 95% interval (target: HTTP >= 0.95x engine).
"""
from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import os
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil as bu  # noqa: E402  (also puts the checkout on sys.path)

PROMPTS = ["Write a short story about a robot who learns to paint.",
           "Explain how a bicycle works, step by step.",
           "List ten facts about the ocean.",
           "Describe a day in the life of a lighthouse keeper.",
           "Write a poem about autumn leaves.",
           "Explain recursion to a child.",
           "What makes a good cup of coffee?",
           "Describe the water cycle."]


def run_engine(eng, prompts, max_tokens):
    out = [None] * len(prompts)

    def one(i):
        t0 = time.perf_counter()
        ttft, text, n = None, [], 0
        for ev in eng.stream_events(prompts[i], max_tokens=max_tokens, temperature=0):
            if ev.get("done"):
                n = ev["metrics"]["completion_tokens"]
            elif ttft is None:
                ttft = time.perf_counter() - t0
            text.append(ev["text"])
        out[i] = (ttft or 0.0, "".join(text), n)

    return _threads(one, len(prompts)), out


def run_http(port, prompts, max_tokens):
    out = [None] * len(prompts)

    def one(i):
        body = json.dumps({"model": "bench", "prompt": prompts[i], "max_tokens": max_tokens, "temperature": 0,
                           "stream": True, "stream_options": {"include_usage": True}})
        t0 = time.perf_counter()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        ttfb, text, n, buf = None, [], 0, b""
        while True:
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            d = line[6:].strip()
            if d == b"[DONE]":
                break
            obj = json.loads(d)
            if obj["choices"]:
                if ttfb is None and obj["choices"][0]["text"]:
                    ttfb = time.perf_counter() - t0
                text.append(obj["choices"][0]["text"])
            elif obj.get("usage"):
                n = obj["usage"]["completion_tokens"]
        c.close()
        out[i] = (ttfb or 0.0, "".join(text), n)

    return _threads(one, len(prompts)), out


def _threads(fn, n):
    ts = [threading.Thread(target=fn, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--simd", default="auto")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--quick", action="store_true", help="small smoke run")
    ap.add_argument("--out", default=os.path.join(bu.ROOT, "docs", "bench", "serve.md"))
    a = ap.parse_args(argv)
    if a.quick:
        a.repeats, a.max_tokens = 2, 16

    from colibri_lab.engine import Engine
    from colibri_lab.server import Server

    load0 = bu.loadavg()
    info = bu.machine_info(a.threads)
    eng = Engine(a.model, n_threads=a.threads, n_ctx=1024, n_slots=max(a.concurrency), simd=a.simd)
    srv = Server(eng, port=0, model_id="bench").start()
    print(f"engine {eng!r}\nserver {srv.url}; max_tokens {a.max_tokens}; repeats {a.repeats} (ABBA)", flush=True)
    rows = {}
    try:
        for c in a.concurrency:
            # chat-formatted token ids, so the instruct model answers at length on both paths
            prompts = [eng.tokenize(eng.apply_chat_template([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]),
                                    add_special=False) for i in range(c)]
            # warm-up (also fills the prefix cache equally for both paths)
            run_engine(eng, prompts, a.max_tokens)
            run_http(srv.port, prompts, a.max_tokens)
            res = {"engine": [], "http": []}
            for r in range(a.repeats):
                for which in bu.abba(r, "engine", "http"):
                    if which == "engine":
                        wall, out = run_engine(eng, prompts, a.max_tokens)
                    else:
                        wall, out = run_http(srv.port, prompts, a.max_tokens)
                    n = sum(o[2] for o in out)
                    res[which].append({"tok_s": n / wall, "ttft": statistics.median(o[0] for o in out),
                                       "texts": [o[1] for o in out], "n": n})
            same = all(x["texts"] == res["engine"][0]["texts"] for x in res["engine"] + res["http"])
            med = {w: {k: statistics.median(x[k] for x in res[w]) for k in ("tok_s", "ttft")} for w in res}
            ratios = [h["tok_s"] / e["tok_s"] for e, h in zip(res["engine"], res["http"]) if e["tok_s"] > 0]
            ttfb = [1e3 * (h["ttft"] - e["ttft"]) for e, h in zip(res["engine"], res["http"])]
            rows[c] = dict(res=res, med=med, same=same, ratios=ratios, ttfb=ttfb)
            print(f"\nconcurrency {c}: outputs identical across paths and repeats: {same}")
            for w in ("engine", "http"):
                print(f"  {w:>6}: {bu.describe([x['tok_s'] for x in res[w]], ' tok/s')}   median TTFT "
                      f"{1e3 * med[w]['ttft']:8.1f} ms")
            if not ratios:
                print("  no tokens generated; cannot compare")
                continue
            print(f"  ratio http/engine: tok/s {bu.median(ratios):.3f} (CI {bu.bootstrap_ci(ratios)})   "
                  f"TTFB overhead {bu.median(ttfb):+.1f} ms", flush=True)
    finally:
        srv.stop()
        eng.close()
    load1 = bu.loadavg()

    doc = [bu.header("Serving overhead: streamed HTTP vs the engine directly",
                     [os.path.relpath(sys.argv[0], bu.ROOT)] + sys.argv[1:], info, load0, load1)]
    doc.append(f"Greedy, chat-formatted prompts, max_tokens {a.max_tokens}, {a.repeats} repeats in ABBA order after "
               "a warm-up; engine = `Engine.stream_events` on threads, HTTP = `/v1/completions` stream=True over "
               "http.client on threads (loopback); tok/s = all completion tokens / wall time of the batch; "
               "TTFT/TTFB = median over streams of submit → first token (engine) or first non-empty text chunk (HTTP). "
               "Ratio = HTTP/engine per adjacent pair of runs.\n")
    doc.append("| streams | engine tok/s | HTTP tok/s | ratio HTTP/engine (median) | 95% CI | engine TTFT ms | "
               "HTTP TTFB ms | TTFB overhead ms (median of pairs) | outputs identical | target >= 0.95x |")
    doc.append("|---|---|---|---|---|---|---|---|---|---|")
    verdict = []
    for c, row in rows.items():
        if not row["ratios"]:
            doc.append(f"| {c} | no tokens | | | | | | | {row['same']} | |")
            continue
        lo, hi = bu.bootstrap_ci(row["ratios"])
        rm = bu.median(row["ratios"])
        ok = bu.verdict_ge(rm, lo, 0.95)
        verdict.append(f"{c} stream(s): HTTP/engine {rm:.3f} (CI {lo:.3f}–{hi:.3f}), TTFB overhead "
                       f"{bu.median(row['ttfb']):+.1f} ms — target >= 0.95x: **{ok}**")
        doc.append(f"| {c} | {bu.describe([x['tok_s'] for x in row['res']['engine']])} | "
                   f"{bu.describe([x['tok_s'] for x in row['res']['http']])} | {rm:.3f} | {lo:.3f}–{hi:.3f} | "
                   f"{1e3 * row['med']['engine']['ttft']:.1f} | {1e3 * row['med']['http']['ttft']:.1f} | "
                   f"{bu.median(row['ttfb']):+.1f} | {row['same']} | {ok} |")
    doc.append("\n### Verdict\n")
    doc += [f"- {v}" for v in verdict]
    text = "\n".join(doc)
    print("\n" + text)
    if not a.quick or a.out != ap.get_default("out"):
        bu.write_doc(a.out, text)
    return 0 if all(r["same"] for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
