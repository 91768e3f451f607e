"""What the server holds: connections, slow clients, and the request rate it
sustains at a p99 latency, with and without hostile sockets.

    python scripts/bench_serve_limits.py --model smollm2 --threads 2 --out docs/bench/serve_limits.json

1. connections: open N idle sockets (below, at and past --max-connections) and
   time GET /health and a 1-token completion from a fresh client meanwhile;
2. slow clients: N sockets trickling a request head a byte a second;
3. rate: Poisson arrivals of short greedy completions (open loop, fixed seed)
   at several rates, alone and next to 64 slow-loris + 100 idle sockets
   (interleaved A B B A at each rate); p50 / p99 end-to-end latency and the
   share answered 200.
Numbers are from this machine under its load at the time (uptime is printed).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time


def pct(v, p):
    v = sorted(v)
    if not v:
        return float("nan")
    k = (len(v) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def one(port, method, path, body=None, timeout=60.0):
    t = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        h = {"Host": f"127.0.0.1:{port}"}
        if body is not None:
            body = json.dumps(body)
            h["Content-Type"] = "application/json"
        c.request(method, path, body, h)
        r = c.getresponse()
        r.read()
        return r.status, time.perf_counter() - t
    except OSError:
        return 0, time.perf_counter() - t
    finally:
        c.close()


COMPLETION = {"model": "m", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}


def probe(port, n=20):
    """n sequential /health and 1-token completions from fresh connections: (ok share, p50, p99 ms)."""
    out = {}
    for name, meth, path, body in (("health", "GET", "/health", None),
                                   ("completion", "POST", "/v1/completions", dict(COMPLETION, max_tokens=1))):
        res = [one(port, meth, path, body, timeout=30) for _ in range(n)]
        lat = [t * 1e3 for st, t in res if st == 200]
        out[name] = {"ok": sum(st == 200 for st, _ in res) / n, "p50_ms": round(pct(lat, 50), 1),
                     "p99_ms": round(pct(lat, 99), 1)}
    return out


class Hostile:
    """n_idle silent sockets and n_slow sockets trickling a request head."""

    def __init__(self, port, n_idle=0, n_slow=0):
        self.port, self.socks, self.slow, self.stop = port, [], [], threading.Event()
        for _ in range(n_idle):
            self.socks.append(socket.create_connection(("127.0.0.1", port), timeout=30))
        for _ in range(n_slow):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-A: ".encode())
            self.slow.append(s)
        self.t = threading.Thread(target=self._trickle, daemon=True)
        self.t.start()

    def _trickle(self):
        while not self.stop.wait(1.0):
            for s in self.slow:
                try:
                    s.send(b"a")
                except OSError:
                    pass

    def close(self):
        self.stop.set()
        for s in self.socks + self.slow:
            s.close()


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/health", headers={"Host": "127.0.0.1"})
    d = json.loads(c.getresponse().read())
    c.close()
    return d.get("connections", {})


def rate_run(port, rate, duration, seed):
    rng = random.Random(seed)
    t_next = time.perf_counter()
    t_end = t_next + duration
    res, threads = [], []
    while t_next < t_end:
        delay = t_next - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        th = threading.Thread(target=lambda: res.append(one(port, "POST", "/v1/completions", COMPLETION, 120)))
        th.start()
        threads.append(th)
        t_next += rng.expovariate(rate)
    for th in threads:
        th.join(180)
    lat = [t * 1e3 for st, t in res if st == 200]
    return {"rate": rate, "sent": len(res), "ok": round(sum(st == 200 for st, _ in res) / max(1, len(res)), 3),
            "p50_ms": round(pct(lat, 50), 1), "p99_ms": round(pct(lat, 99), 1),
            "mean_ms": round(statistics.fmean(lat), 1) if lat else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--max-connections", type=int, default=512)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--rates", default="1,2,4,8")
    ap.add_argument("--rates-only", action="store_true", help="skip the connection and slow-client probes")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    port = 18000 + os.getpid() % 1000
    load0 = os.getloadavg()
    srv = subprocess.Popen([sys.executable, "-m", "colibri_lab.serve", "--model", a.model, "--port", str(port),
                            "--threads", str(a.threads), "--slots", str(a.slots), "--model-id", "m",
                            "--max-connections", str(a.max_connections)], stderr=subprocess.DEVNULL)
    try:
        t_end = time.time() + 120
        while time.time() < t_end and one(port, "GET", "/health", timeout=2)[0] != 200:
            time.sleep(0.5)
        one(port, "POST", "/v1/completions", COMPLETION)   # warm-up
        report = {"model": a.model, "threads": a.threads, "slots": a.slots, "max_connections": a.max_connections,
                  "load_before": load0, "connections": [], "slow": [], "rate": []}
        for n in () if a.rates_only else (0, 256, a.max_connections, a.max_connections + 64, 2 * a.max_connections):
            h = Hostile(port, n_idle=n)
            time.sleep(1.0)
            row = {"idle_sockets": n, **probe(port), "server": metrics(port)}
            h.close()
            report["connections"].append(row)
            print("idle", json.dumps(row), flush=True)
            time.sleep(1.0)
        for n in () if a.rates_only else (64, 256, a.max_connections):
            h = Hostile(port, n_slow=n)
            time.sleep(2.0)
            row = {"slow_sockets": n, **probe(port), "server": metrics(port)}
            h.close()
            report["slow"].append(row)
            print("slow", json.dumps(row), flush=True)
            time.sleep(1.0)
        # plain and hostile runs interleaved ABBA at each rate, same arrival seed,
        # so background load drifts hit both alike
        for r in [float(x) for x in a.rates.split(",")]:
            for hostile in (False, True, True, False):
                h = Hostile(port, n_idle=100, n_slow=64) if hostile else None
                row = dict(rate_run(port, r, a.duration, seed=int(r * 10)), hostile=hostile)
                if h:
                    h.close()
                report["rate"].append(row)
                print("rate", json.dumps(row), flush=True)
        report["load_after"] = os.getloadavg()
        if a.out:
            with open(a.out, "w") as f:
                json.dump(report, f, indent=1)
    finally:
        srv.terminate()
        srv.wait(30)


if __name__ == "__main__":
    main()
