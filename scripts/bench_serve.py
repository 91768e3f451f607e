"""Streaming throughput through HTTP vs. the engine directly.

    python scripts/bench_serve.py [--model smollm2] [--threads 2] [--max-tokens 64] [--repeats 3]

For concurrency 1 and 8 it streams the same greedy requests (a) straight
from `Engine.stream_events` on threads and (b) through the server
(`/v1/completions`, stream=True, raw http.client on threads), interleaving
A and B in ABBA order after a warm-up, and prints per configuration the
median aggregate tok/s, median time to first token / byte, and the ratios
HTTP / engine.  Outputs are checked to be identical (greedy, batch-invariant).
The machine may be shared: look at the spread, not just the medians.
"""
from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import time

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
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    a = ap.parse_args(argv)

    from colibri_lab.engine import Engine
    from colibri_lab.server import Server

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
                order = ("engine", "http") if r % 2 == 0 else ("http", "engine")
                for which in order:
                    if which == "engine":
                        wall, out = run_engine(eng, prompts, a.max_tokens)
                    else:
                        wall, out = run_http(srv.port, prompts, a.max_tokens)
                    n = sum(o[2] for o in out)
                    res[which].append({"tok_s": n / wall, "ttft": statistics.median(o[0] for o in out),
                                       "texts": [o[1] for o in out]})
            same = all(x["texts"] == res["engine"][0]["texts"] for x in res["engine"] + res["http"])
            med = {w: {k: statistics.median(x[k] for x in res[w]) for k in ("tok_s", "ttft")} for w in res}
            spread = {w: (min(x["tok_s"] for x in res[w]), max(x["tok_s"] for x in res[w])) for w in res}
            rows[c] = (med, spread, same)
            print(f"\nconcurrency {c}: outputs identical across paths and repeats: {same}")
            for w in ("engine", "http"):
                print(f"  {w:>6}: {med[w]['tok_s']:8.1f} tok/s (min {spread[w][0]:.1f}, max {spread[w][1]:.1f})"
                      f"   median TTFT {1e3 * med[w]['ttft']:8.1f} ms")
            if not (med["engine"]["tok_s"] > 0 and med["http"]["tok_s"] > 0):
                print("  no tokens generated; cannot compare")
                continue
            print(f"  ratio http/engine: tok/s {med['http']['tok_s'] / med['engine']['tok_s']:.3f}   "
                  f"TTFB overhead {1e3 * (med['http']['ttft'] - med['engine']['ttft']):+.1f} ms")
    finally:
        srv.stop()
        eng.close()
    return 0 if all(r[2] for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
