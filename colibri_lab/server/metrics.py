"""Server-side counters and histograms, rendered as Prometheus text with
vLLM's metric names and types (prefix `vllm:`, so dashboards and tools that
read a vLLM server read this one), and the /profile window.

Every finished request (HTTP-submitted, including cancelled ones) is recorded
once, from its metrics (colibri_lab.metrics: every family's name, prefix,
kind, help text and the request fields it is computed from are in its
PROMETHEUS table).  Inter-token latency is observed once per gap between two
consecutive token events of a request (its itl_ms; tokens accepted together
from one speculative step have a gap of 0), not as a request's mean.  Series
that are the server's own (HTTP responses, connections) carry the `colibri:`
prefix.
"""
from __future__ import annotations

import collections
import math
import statistics
import threading
import time

from colibri_lab import metrics as schema

PREFIX = schema.PROMETHEUS_PREFIX
OWN = schema.PROMETHEUS_OWN_PREFIX

_LAT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
                0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                240.0, 480.0, 960.0)


class Histogram:
    def __init__(self, buckets):
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)   # non-cumulative count per bucket (le = bound)
        self.inf = 0                            # observations above the last bound
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float, n: int = 1) -> None:
        if n <= 0:
            return
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += n
                break
        else:
            self.inf += n
        self.sum += v * n
        self.count += n

    def render(self, name: str, out: list, labels: str = "") -> None:
        acc = 0
        pre = labels + "," if labels else ""
        tail = "{" + labels + "}" if labels else ""
        for b, c in zip(self.buckets, self.counts):
            acc += c
            out.append(f'{name}_bucket{{{pre}le="{b}"}} {acc}')
        out.append(f'{name}_bucket{{{pre}le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{tail} {self.sum:.6f}")
        out.append(f"{name}_count{tail} {self.count}")


class Metrics:
    PROFILE_WINDOW = 120

    def __init__(self):
        self.lock = threading.Lock()
        self.t_start = time.time()
        self.ttft = Histogram(_LAT_BUCKETS)
        self.itl = Histogram(_ITL_BUCKETS)
        self.e2e = Histogram(_E2E_BUCKETS)
        self.queue = Histogram(_LAT_BUCKETS)
        self.prefill = Histogram(_E2E_BUCKETS)
        self.decode = Histogram(_E2E_BUCKETS)
        self.req_prompt = Histogram(_TOKEN_BUCKETS)
        self.req_gen = Histogram(_TOKEN_BUCKETS)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_queries = 0       # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0          # of those, tokens served from it
        self.spec_drafts = 0
        self.spec_draft_tokens = 0
        self.spec_accepted = 0
        self.spec_accepted_pos = collections.Counter()  # draft position -> accepted tokens
        self.finished = collections.Counter()   # finish reason -> requests
        self.http = collections.Counter()       # (endpoint, status) -> responses
        self.window: collections.deque = collections.deque(maxlen=self.PROFILE_WINDOW)

    def record(self, m: dict) -> None:
        """One finished request, from its metrics (colibri_lab.metrics.REQUEST)."""
        with self.lock:
            n_out = int(m.get("completion_tokens", 0))
            self.prompt_tokens += int(m.get("prompt_tokens", 0))
            self.generation_tokens += n_out
            self.prefix_queries += int(m.get("prompt_tokens", 0))
            self.prefix_hits += int(m.get("cached_tokens", 0))
            self.spec_draft_tokens += int(m.get("draft_n", 0))
            self.spec_accepted += int(m.get("draft_accepted", 0))
            self.spec_drafts += int(m.get("draft_steps", 0))
            for pos, n in enumerate(m.get("draft_accepted_by_pos") or ()):
                self.spec_accepted_pos[pos] += int(n)
            self.finished[m.get("finish_reason", "unknown")] += 1
            if n_out > 0:
                self.ttft.observe(float(m.get("ttft_ms", 0.0)) / 1e3)
            for gap_ms in m.get("itl_ms") or ():
                self.itl.observe(float(gap_ms) / 1e3)
            self.e2e.observe(float(m.get("e2e_ms", 0.0)) / 1e3)
            self.queue.observe(float(m.get("queue_ms", 0.0)) / 1e3)
            self.prefill.observe(float(m.get("prefill_ms", 0.0)) / 1e3)
            self.decode.observe(float(m.get("decode_ms", 0.0)) / 1e3)
            self.req_prompt.observe(int(m.get("prompt_tokens", 0)))
            self.req_gen.observe(n_out)
            self.window.append(dict(schema.json_safe({k: v for k, v in m.items() if k != "itl_ms"}), t=time.time()))

    def count_http(self, endpoint: str, status: int) -> None:
        with self.lock:
            self.http[(endpoint, status)] += 1

    def render(self, running: int, waiting: int, model: str, n_slots: int = 0, conns: dict | None = None) -> str:
        out: list[str] = []
        lab = f'model_name="{_esc(model)}"'

        def head(name, kind, prefix=PREFIX):
            e = schema.PROMETHEUS_BY_NAME[name]   # every family is in the schema's table
            assert (e.kind, e.prefix) == (kind, prefix), (name, kind, prefix)
            out.append(f"# HELP {prefix}{name} {e.help}")
            out.append(f"# TYPE {prefix}{name} {kind}")

        with self.lock:
            head("num_requests_running", "gauge")
            out.append(f"{PREFIX}num_requests_running{{{lab}}} {running}")
            head("num_requests_waiting", "gauge")
            out.append(f"{PREFIX}num_requests_waiting{{{lab}}} {waiting}")
            head("kv_cache_usage_perc", "gauge")
            out.append(f"{PREFIX}kv_cache_usage_perc{{{lab}}} {running / n_slots if n_slots else 0.0}")
            for name, val in (
                ("prompt_tokens_total", self.prompt_tokens),
                ("generation_tokens_total", self.generation_tokens),
                ("prefix_cache_queries_total", self.prefix_queries),
                ("prefix_cache_hits_total", self.prefix_hits),
                ("spec_decode_num_drafts_total", self.spec_drafts),
                ("spec_decode_num_draft_tokens_total", self.spec_draft_tokens),
                ("spec_decode_num_accepted_tokens_total", self.spec_accepted),
            ):
                head(name, "counter")
                out.append(f"{PREFIX}{name}{{{lab}}} {val}")
            head("spec_decode_num_accepted_tokens_per_pos_total", "counter")
            for pos in sorted(self.spec_accepted_pos):
                out.append(f'{PREFIX}spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{pos}"}} '
                           f"{self.spec_accepted_pos[pos]}")
            head("request_success_total", "counter")
            for reason in sorted(set(self.finished) | {"stop", "length"}):
                out.append(f'{PREFIX}request_success_total{{{lab},finished_reason="{_esc(reason)}"}} '
                           f"{self.finished.get(reason, 0)}")
            for name, h in (
                ("time_to_first_token_seconds", self.ttft),
                ("inter_token_latency_seconds", self.itl),
                ("e2e_request_latency_seconds", self.e2e),
                ("request_queue_time_seconds", self.queue),
                ("request_prefill_time_seconds", self.prefill),
                ("request_decode_time_seconds", self.decode),
                ("request_prompt_tokens", self.req_prompt),
                ("request_generation_tokens", self.req_gen),
            ):
                head(name, "histogram")
                h.render(PREFIX + name, out, lab)
            head("http_responses_total", "counter", OWN)
            for (ep, st), c in sorted(self.http.items()):
                out.append(f'{OWN}http_responses_total{{endpoint="{_esc(ep)}",status="{st}"}} {c}')
            for key, kind in (("open", "gauge"), ("evicted_idle", "counter"), ("evicted_slow", "counter"), ("refused", "counter")):
                if conns is not None:
                    name = "connections_" + key + ("_total" if kind == "counter" else "")
                    head(name, kind, OWN)
                    out.append(f"{OWN}{name} {conns[key]}")
        return "\n".join(out) + "\n"

    def profile(self, steps: list[dict]) -> dict:
        with self.lock:
            reqs = list(self.window)
        summary = {}
        for key in schema.PROFILE_FIELDS:
            vals = [float(r[key]) for r in reqs
                    if isinstance(r.get(key), (int, float)) and not isinstance(r[key], bool) and math.isfinite(r[key])]
            if vals:
                vals.sort()
                summary[key] = {"mean": statistics.fmean(vals), "p50": _pct(vals, 50), "p90": _pct(vals, 90),
                                "p99": _pct(vals, 99), "max": vals[-1]}
        total_p = sum(int(r.get("prompt_tokens", 0)) for r in reqs)
        hit = sum(int(r.get("cached_tokens", 0)) for r in reqs)
        step_ms = sorted(float(s.get("step_ms", 0.0)) for s in steps)
        return {
            "object": "profile",
            "window": self.PROFILE_WINDOW,
            "n": len(reqs),
            "requests": reqs,
            "summary": summary,
            "prefix_cache_hit_rate": schema.json_safe(schema.prefix_cache_hit_rate(total_p, hit)),
            "finish_reasons": dict(collections.Counter(r.get("finish_reason") for r in reqs)),
            "steps": {"n": len(steps), "step_ms_p50": _pct(step_ms, 50) if step_ms else 0.0,
                      "step_ms_p90": _pct(step_ms, 90) if step_ms else 0.0,
                      "recent": steps[-self.PROFILE_WINDOW:]},
        }


def _pct(sorted_vals, p):
    if not sorted_vals:
        return 0.0
    k = (len(sorted_vals) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


def _esc(s: str) -> str:
    return str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
