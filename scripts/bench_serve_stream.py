"""Streaming through the server: how long a token takes from the engine to the
socket, and streamed tok/s through HTTP against the engine driven directly.

    python scripts/bench_serve_stream.py --streams 1 16 --rounds 3 --out res.json

Event -> socket latency: the scheduler's engine is wrapped so every token
event is stamped (time.perf_counter, CLOCK_MONOTONIC) when cb_engine_step
returns it; a client in another process reads every stream on one selector
in one thread and stamps each recv as it returns (same clock; `--client
threads`: a thread per stream reading line by line, as runs 1-2 did).  A
token arrives with the first chunk whose text reaches the end of its bytes
(a chunk carries one token, or several that queued up while the server's
HTTP thread was behind; ASCII prompts, no stop strings; a stream whose text
differs from its tokens' is dropped).  Tokens are counted from the stream's
usage chunk.

Throughput: the same prompts at the same concurrency, (a) streamed through
/v1/completions and (b) through Engine.stream_events in threads, tokens over
wall time (HTTP: from the first request sent to the last content chunk
read).  The client runs on the same cores as the server, so it keeps its
own work out of the streaming window: it stamps and stores each line and
parses the JSON after its stream ends.  With `--pin` it runs on other cores
(this process on the first --threads cores, the client on the rest), as a
client on another machine would: the ratio is then the server's own cost,
not the server's plus a loopback client's.  Both read the same engine, so the
ratio is what the HTTP path costs.  The code under test is whatever `colibri_lab` imports (run it from
two checkouts, interleaved, for a before / after).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

# both clients start here: with --pin, the client on the cores the server does not use
CLIENT_START = r"""
import os, sys
if os.environ.get("BENCH_CLIENT_CPUS"):
    os.sched_setaffinity(0, [int(c) for c in os.environ["BENCH_CLIENT_CPUS"].split(",")])
"""

CLIENT = CLIENT_START + r"""
import json, selectors, socket, time
port, prompts, max_tokens = int(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
# one thread, every stream on one selector: each recv is stamped when it returns and kept whole;
# the lines are split and parsed after the last stream ends (the client shares the server's cores)
sel, got, socks = selectors.DefaultSelector(), {}, []
t0, c0 = time.perf_counter(), time.process_time()
for i, p in enumerate(prompts):
    body = json.dumps({"model": "m", "prompt": p, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ, i)
    got[i] = []
    socks.append(s)
open_n = len(socks)
while open_n:
    for key, _ in sel.select():
        data = key.fileobj.recv(1 << 20)
        if data:
            got[key.data].append((time.perf_counter(), data))
        else:
            sel.unregister(key.fileobj)
            key.fileobj.close()
            open_n -= 1
cpu = time.process_time() - c0
out = {}
for i, parts in got.items():
    raw = b"".join(d for _, d in parts)
    ends, n = [], 0
    for t, d in parts:
        n += len(d)
        ends.append((n, t))
    head = raw.index(b"\r\n\r\n") + 4
    ts, n_tok, pos, k = [], 0, head, 0
    for line in raw[head:].split(b"\n"):
        pos += len(line) + 1
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        while ends[k][0] < min(pos, len(raw)):   # the recv that brought the line's last byte
            k += 1
        d = json.loads(line[6:])
        if d["choices"] and d["choices"][0]["text"]:
            ts.append((ends[k][1], d["choices"][0]["text"]))
        if d.get("usage"):
            n_tok = d["usage"]["completion_tokens"]
    out[i] = {"chunks": ts, "tokens": n_tok}
last = max((o["chunks"][-1][0] for o in out.values() if o["chunks"]), default=time.perf_counter())
print(json.dumps({"recv": out, "wall": last - t0, "cpu": cpu}))
"""

CLIENT_THREADS = CLIENT_START + r"""
import http.client, json, threading, time
port, prompts, max_tokens = int(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
out = {}
def one(i, p):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    body = json.dumps({"model": "m", "prompt": p, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    got = []
    while True:   # stamp and keep each line; parse after the stream (the client shares the server's cores)
        line = r.fp.readline()
        if not line:
            break
        if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
            got.append((time.perf_counter(), line))
    ts, n = [], 0
    for t, line in got:
        d = json.loads(line[6:])
        if d["choices"] and d["choices"][0]["text"]:
            ts.append((t, d["choices"][0]["text"]))
        if d.get("usage"):
            n = d["usage"]["completion_tokens"]
    out[i] = {"chunks": ts, "tokens": n}
th = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(prompts)]
t0, c0 = time.perf_counter(), time.process_time()
for t in th: t.start()
for t in th: t.join()
cpu = time.process_time() - c0   # the parse after each stream included
last = max((o["chunks"][-1][0] for o in out.values() if o["chunks"]), default=time.perf_counter())
print(json.dumps({"recv": out, "wall": last - t0, "cpu": cpu}))
"""


class Stamped:
    """The engine core, with each token event's time recorded by request id."""

    def __init__(self, core):
        self._core = core
        self.times: dict[int, list[float]] = {}
        self.tokens: dict[int, list[int]] = {}
        self.prompt_of: dict[int, tuple] = {}
        self.reset_clock()

    def reset_clock(self):
        """Wall time inside core.step() and between two steps (the scheduler's Python per step:
        events to sinks, writes, submits), summed since the last reset."""
        self.in_step = self.between = 0.0
        self.n_steps = 0
        self._t_end = None

    def __getattr__(self, name):
        return getattr(self._core, name)

    def submit(self, tokens, *a, **kw):
        rid = self._core.submit(tokens, *a, **kw)
        self.prompt_of[rid] = tuple(int(t) for t in tokens)
        return rid

    def step(self):
        t0 = time.perf_counter()
        evs = self._core.step()
        t = time.perf_counter()
        if self._t_end is not None and t0 - self._t_end < 0.05:   # not an idle wait for work
            self.between += t0 - self._t_end
        self.in_step += t - t0
        self.n_steps += 1
        self._t_end = t
        for e in evs:
            if e["type"] == "token":
                self.times.setdefault(e["id"], []).append(t)
                self.tokens.setdefault(e["id"], []).append(e["token"])
        return evs


class CpuMeter:
    """CPU time of this process over a run, split by thread: the scheduler thread, the engine's
    pool threads (native, not Python threads), the main thread, and the rest (the threads that
    come and go: HTTP handlers, or the threads reading Engine.stream_events), from the kernel's
    per-thread run time (/proc/self/task/*/schedstat, ns)."""

    def __init__(self, scheduler_thread):
        self.sched = scheduler_thread.native_id
        self.main = threading.main_thread().native_id

    @staticmethod
    def _run_ns(tid):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                return int(f.read().split()[0])
        except OSError:
            return 0

    def snap(self):
        py = {t.native_id for t in threading.enumerate()}
        d = {"total": time.process_time_ns(), "scheduler": 0, "pool": 0, "main": 0}
        for tid in map(int, os.listdir("/proc/self/task")):
            k = "scheduler" if tid == self.sched else "main" if tid == self.main else \
                "pool" if tid not in py else None
            if k:
                d[k] += self._run_ns(tid)
        return d

    @staticmethod
    def delta(a, b, tokens):
        """us of CPU per token by part, b - a."""
        out = {k: (b[k] - a[k]) / 1e3 / max(1, tokens) for k in a}
        out["other"] = out["total"] - out["scheduler"] - out["pool"] - out["main"]
        return out


def prompts_for(n):
    return [f"Story {i}: Once upon a time, in a small village by the sea, there lived a" for i in range(n)]


def run_http(eng, srv, stamped, n, max_tokens, client=CLIENT, meter=None):
    prompts = prompts_for(n)
    stamped.times.clear()
    stamped.tokens.clear()
    stamped.prompt_of.clear()
    c0 = meter.snap() if meter else None
    stamped.reset_clock()
    r = subprocess.run([sys.executable, "-c", client, str(srv.port), json.dumps(prompts), str(max_tokens)],
                       capture_output=True, text=True, check=True)
    c1 = meter.snap() if meter else None
    res = json.loads(r.stdout)
    by_prompt = {stamped.prompt_of[rid]: rid for rid in stamped.times}
    lat, dropped, toks, n_chunks = [], 0, 0, 0
    for i, p in enumerate(prompts):
        ids = tuple(eng.tokenize(p))
        rid = by_prompt.get(ids)
        recv = res["recv"][str(i)]
        toks += recv["tokens"]
        n_chunks += len(recv["chunks"])
        if rid is None:
            dropped += 1
            continue
        lat_i = _token_latencies(eng, stamped.times[rid], stamped.tokens[rid], recv["chunks"])
        if lat_i is None:
            dropped += 1
            continue
        lat += lat_i
    out = {"latency_ms": lat, "dropped": dropped, "tok_s": toks / res["wall"], "tokens": toks, "chunks": n_chunks}
    if meter:
        out["cpu_us_per_token"] = dict(CpuMeter.delta(c0, c1, toks), client=res.get("cpu", 0) * 1e6 / max(1, toks))
    out.update(_clock(stamped, toks))
    return out


def _clock(stamped, toks):
    return {"step_ms": stamped.in_step * 1e3 / max(1, stamped.n_steps),
            "between_us_per_token": stamped.between * 1e6 / max(1, toks)}


def _token_latencies(eng, times, tokens, chunks):
    """ms from each token's engine event to the chunk that carried its last byte; None when the
    chunks' text is not the tokens' bytes."""
    ends, n = [], 0
    for t in tokens:
        n += len(eng.model.token_bytes(t))
        ends.append(n)
    got, n = [], 0
    for t, text in chunks:
        n += len(text.encode("utf-8"))
        got.append((n, t))
    if not got or got[-1][0] != ends[-1]:
        return None
    out, k = [], 0
    for end, t_ev in zip(ends, times):
        while got[k][0] < end:
            k += 1
        out.append((got[k][1] - t_ev) * 1e3)
    return out


def run_direct(eng, n, max_tokens, meter=None, stamped=None):
    prompts = prompts_for(n)
    counts = [0] * n

    def one(i):
        for ev in eng.stream_events(prompts[i], max_tokens=max_tokens, temperature=0):
            if not ev.get("done"):   # a token (as the HTTP side counts them, from usage)
                counts[i] += 1

    th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    c0 = meter.snap() if meter else None
    if stamped is not None:
        stamped.reset_clock()
    t0 = time.perf_counter()
    for t in th:
        t.start()
    for t in th:
        t.join()
    out = {"tok_s": sum(counts) / (time.perf_counter() - t0)}
    if meter:
        out["cpu_us_per_token"] = CpuMeter.delta(c0, meter.snap(), sum(counts))
    if stamped is not None:
        out.update(_clock(stamped, sum(counts)))
    return out


def _boot_ci(vals, stat=statistics.median, n=2000, seed=0):
    import random

    rng = random.Random(seed)
    bs = sorted(stat([rng.choice(vals) for _ in vals]) for _ in range(n))
    return bs[int(0.025 * n)], bs[int(0.975 * n) - 1]


def summarize(paths):
    """Markdown rows from runs saved with --out, grouped by --label (file name prefix before '-')."""
    runs = {}
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        label = os.path.basename(p).split("-")[0]
        for r in d["runs"]:
            runs.setdefault((label, r["streams"]), []).append(r)
    print("| code | streams | runs | event->socket p50 ms [95% CI] | p99 ms | HTTP tok/s | engine tok/s | "
          "HTTP/engine median [95% CI] | tokens per chunk | between steps us/token HTTP / engine |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (label, n), rs in sorted(runs.items()):
        p50 = [statistics.median(r["http"]["latency_ms"]) for r in rs]
        p99 = [sorted(r["http"]["latency_ms"])[int(0.99 * (len(r["http"]["latency_ms"]) - 1))] for r in rs]
        ratio = [r["http"]["tok_s"] / r["direct"]["tok_s"] for r in rs]
        lo, hi = _boot_ci(p50)
        rlo, rhi = _boot_ci(ratio)
        print(f"| {label} | {n} | {len(rs)} | {statistics.median(p50):.2f} [{lo:.2f}, {hi:.2f}] | "
              f"{statistics.median(p99):.2f} | {statistics.median(r['http']['tok_s'] for r in rs):.1f} | "
              f"{statistics.median(r['direct']['tok_s'] for r in rs):.1f} | {statistics.median(ratio):.3f} "
              f"[{rlo:.3f}, {rhi:.3f}] | {_per_chunk(rs)} | {_between(rs)} |")


def _between(rs):
    """The scheduler thread's wall time between two steps per token (median over runs), through
    HTTP and through Engine.stream_events; runs saved before it was recorded have none."""
    h = [r["http"]["between_us_per_token"] for r in rs if "between_us_per_token" in r["http"]]
    d = [r["direct"]["between_us_per_token"] for r in rs if "between_us_per_token" in r["direct"]]
    return f"{statistics.median(h):.0f} / {statistics.median(d):.0f}" if h and d else ""


def _per_chunk(rs):
    """Tokens per content chunk over the runs (1.00: one chunk per token); runs saved before the
    client counted chunks have no figure."""
    t = sum(r["http"].get("tokens", 0) for r in rs)
    c = sum(r["http"].get("chunks", 0) for r in rs)
    return f"{t / c:.2f}" if c else ""


def _cpu_str(r):
    c = r.get("cpu_us_per_token") or {}
    out = " ".join(f"{k} {v:.0f}" for k, v in c.items() if k in ("total", "other", "client"))
    if "step_ms" in r:
        out += f" step {r['step_ms']:.2f} ms, between steps {r['between_us_per_token']:.0f} us/token"
    return out


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--summarize":
        return summarize(sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--client", choices=["select", "threads"], default="select",
                    help="the streaming client: one thread on a selector (default), or a thread per stream "
                         "reading lines (runs 1 and 2 of docs/bench/serve.md)")
    ap.add_argument("--pin", action="store_true",
                    help="this process (engine pool, scheduler, HTTP threads, the direct run's readers) on the "
                         "first --threads cores, the client on the others, so the client's reads take no "
                         "time from the server's cores (needs more cores than --threads)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    pin = None
    if a.pin:   # before the engine starts: its pool threads inherit the affinity
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) <= a.threads:
            ap.error(f"--pin needs more cores than --threads ({len(cpus)} cores, {a.threads} threads)")
        pin = {"server": cpus[:a.threads], "client": cpus[a.threads:]}
        os.sched_setaffinity(0, pin["server"])
        os.environ["BENCH_CLIENT_CPUS"] = ",".join(map(str, pin["client"]))

    from colibri_lab.engine import Engine
    from colibri_lab.scheduler import Scheduler
    from colibri_lab.server import Server

    prof = os.environ.get("BENCH_PROFILE")   # a path: cProfile of the scheduler thread (slows it; for shares only)
    if prof:
        import cProfile

        _loop = Scheduler._loop

        def _profiled(self):
            pr = cProfile.Profile()
            try:
                pr.runcall(_loop, self)
            finally:
                pr.dump_stats(prof)
        Scheduler._loop = _profiled
    eng = Engine(a.model, n_threads=a.threads, n_slots=max(a.streams), n_ctx=512)
    eng.scheduler.close()
    stamped = Stamped(eng.core)
    eng.scheduler = Scheduler(stamped)
    srv = Server(eng, port=0, model_id="m").start()
    meter = CpuMeter(eng.scheduler._thread)
    import colibri_lab

    client = CLIENT if a.client == "select" else CLIENT_THREADS
    out = {"commit": os.environ.get("BENCH_COMMIT", ""), "package": colibri_lab.__file__, "client": a.client, "pin": pin,
           "threads": a.threads, "model": a.model, "runs": [],
           "load_before": os.getloadavg()}
    try:
        # warm-up at every concurrency and length measured, both paths: the first run at 16 streams
        # touches 16 slots' KV pages and buffers for the first time (round 0 read 0.68-0.85 before)
        for n in a.streams:
            run_http(eng, srv, stamped, n, a.max_tokens, client)
            run_direct(eng, n, a.max_tokens)
        for r in range(a.rounds):
            for n in a.streams:
                order = ("http", "direct") if r % 2 == 0 else ("direct", "http")
                rec = {"round": r, "streams": n}
                for kind in order:
                    rec[kind] = run_http(eng, srv, stamped, n, a.max_tokens, client, meter) if kind == "http" \
                        else run_direct(eng, n, a.max_tokens, meter, stamped)
                out["runs"].append(rec)
                lat = rec["http"]["latency_ms"]
                print(f"round {r} streams {n}: event->socket p50 {statistics.median(lat):.3f} ms "
                      f"p99 {sorted(lat)[int(0.99 * (len(lat) - 1))]:.3f} ms (dropped {rec['http']['dropped']}, "
                      f"{rec['http']['tokens'] / max(1, rec['http']['chunks']):.2f} tokens per chunk), "
                      f"http {rec['http']['tok_s']:.1f} tok/s, direct {rec['direct']['tok_s']:.1f} tok/s; "
                      f"CPU us/token http {_cpu_str(rec['http'])} | direct {_cpu_str(rec['direct'])}",
                      flush=True)
    finally:
        srv.stop()
        eng.close()
    out["load_after"] = os.getloadavg()
    with open(a.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
