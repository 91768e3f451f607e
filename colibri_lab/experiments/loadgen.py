"""An HTTP load generator for any OpenAI-compatible server, with vLLM
`bench serve`'s procedure and metric definitions.

    from colibri_lab.experiments import loadgen
    target = loadgen.Target("http://127.0.0.1:8080", model="smollm2")
    block = loadgen.run_block(target, load_workload("open_chat", n=16),
                              Arrival(kind="poisson", rate=2.0, seed=0), {"max_tokens": 64})
    loadgen.summary(block.rows, block.gaps, block.duration_s, slo=parse_slo("ttft:2000 tpot:200"))

Procedure.  Every item of the workload is a conversation.  Its first turn is
released at the arrival schedule's time (Poisson, or gamma with a
burstiness factor, from a seed: workloads.Arrival) or, closed loop, when one
of `concurrency` clients is free; a cap on the requests in flight
(Arrival.concurrency with a rate) delays a released request until a client
is free, as vLLM's --max-concurrency does.  Turn t+1 of a conversation is
sent as soon as the reply to turn t has arrived, with the whole history
(system prompt, user turns, the server's own replies), so a server that
keeps a conversation's KV shows it in TTFT.  Every request streams
(`stream: true`, `stream_options.include_usage`), and the client records the
arrival time of every chunk that carries output text.

Metrics, per request, as vLLM's benchmarks/serve.py defines them (times
from the moment the request is sent):
  ttft_ms   time to the first chunk carrying output text (vLLM times the
            first chunk with a `choices` entry; servers that send the
            assistant-role chunk before any token would get a TTFT of
            nothing, so the role-only chunk does not count here);
  itl_ms    every gap between two successive output chunks (the per-gap table);
  tpot_ms   (e2e - ttft) / (completion_tokens - 1), the first token
            excluded; NaN for one-token replies (0 when counting goodput,
            as vLLM does);
  e2e_ms    vLLM's E2EL: from sending to the end of the stream;
  completion_tokens from the stream's usage chunk, or - for a server that
            sends none - the number of output chunks (one token per chunk
            for the servers here).
Over a block: request throughput = completed requests / duration, output
throughput = completion tokens / duration, where duration runs from the
first release to the last reply; goodput = requests meeting every SLO
(`ttft:ms tpot:ms e2el:ms`, any subset) / duration; mean, median, p90 and
p99 of TTFT, TPOT, ITL and E2EL (numpy's linear percentiles).  From the
server's /metrics before and after a block (Prometheus text, names with any
namespace such as `colibri:` or `vllm:`): the prefix-cache hit rate
(delta hits / delta queries), speculative acceptance rate (accepted / draft
tokens) and mean acceptance length (1 + accepted / drafts).

Standard library only (plus numpy); a request runs on its own client thread.
"""
from __future__ import annotations

import hashlib
import http.client
import json
import math
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from colibri_lab.experiments.workloads import Arrival, Item, ReleaseQueue, Workload

PERCENTILES = (50, 90, 99)
# SLO keys as vLLM's --goodput takes them -> the request-table column they bound
SLO_COLUMNS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2e_ms"}


# ------------------------------------------------------------------ targets
@dataclass(frozen=True)
class Target:
    """An OpenAI-compatible server: its base URL (with or without /v1) and
    the model name to put in requests."""

    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 600.0             # per request, from sending to the end of the stream

    def __post_init__(self):
        u = urllib.parse.urlsplit(self.base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"base_url must be http(s)://host[:port][/v1], got {self.base_url!r}")

    @property
    def root(self) -> str:
        """The URL without a trailing /v1 (where /metrics and /health live)."""
        u = self.base_url.rstrip("/")
        return u[:-3] if u.endswith("/v1") else u

    def connection(self, timeout: float | None = None) -> http.client.HTTPConnection:
        u = urllib.parse.urlsplit(self.root)
        cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        return cls(u.hostname, u.port, timeout=self.timeout_s if timeout is None else timeout)

    def path(self, p: str) -> str:
        return urllib.parse.urlsplit(self.root).path.rstrip("/") + p

    def headers(self) -> dict:
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def get(self, p: str, timeout: float = 10.0) -> tuple[int, bytes]:
        conn = self.connection(timeout)
        try:
            conn.request("GET", self.path(p), headers=self.headers())
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()


# ------------------------------------------------------------------- traces
@dataclass
class Trace:
    """One streamed request as the client saw it (times: perf_counter seconds)."""

    t_send: float
    chunk_t: list[float] = field(default_factory=list)   # arrival of every chunk with output text
    t_done: float = float("nan")
    text: str = ""
    status: int = 0
    completion_tokens: int | None = None                 # from the usage chunk, if the server sent one
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str = ""
    error: str = ""


def chat_body(model: str, messages: list[dict], request: dict) -> dict:
    """The JSON body of a streamed chat completion: the request settings
    (max_tokens, temperature, seed, ...) passed through as they are."""
    body = {"model": model, "messages": messages}
    body.update(request)
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    return body


def stream_chat(target: Target, body: dict, clock: Callable[[], float] = time.perf_counter) -> Trace:
    """POST a streamed chat completion and record every output chunk's arrival."""
    data = json.dumps(body).encode()
    tr = Trace(t_send=clock())
    conn = None
    try:
        conn = target.connection()
        conn.request("POST", target.path("/v1/chat/completions"), body=data, headers=target.headers())
        resp = conn.getresponse()
        tr.status = resp.status
        if resp.status != 200:
            tr.error = f"HTTP {resp.status}: {resp.read()[:500].decode('utf-8', 'replace')}"
            return tr
        parts: list[str] = []
        while True:
            line = resp.readline()
            if not line:
                break
            now = clock()
            if now - tr.t_send > target.timeout_s:      # a stream that trickles on never trips the socket timeout
                tr.error = f"timeout: no end of stream within {target.timeout_s:g} s"
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue                                  # blank separators, ": keep-alive" comments, event: lines
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            ev = json.loads(payload)
            if "error" in ev:
                tr.error = f"stream error: {json.dumps(ev['error'])[:500]}"
                break
            for ch in ev.get("choices") or ():
                text = (ch.get("delta") or {}).get("content") or ch.get("text") or ""
                if text:
                    tr.chunk_t.append(now)
                    parts.append(text)
                if ch.get("finish_reason"):
                    tr.finish_reason = str(ch["finish_reason"])
            usage = ev.get("usage")
            if usage:
                tr.completion_tokens = _int_or_none(usage.get("completion_tokens"))
                tr.prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
                details = usage.get("prompt_tokens_details") or {}
                tr.cached_tokens = _int_or_none(details.get("cached_tokens"))
        tr.text = "".join(parts)
        if not tr.error and not tr.finish_reason:
            tr.error = "stream ended without a finish_reason"
    except Exception as exc:  # noqa: BLE001 - a failed request is a row with its error, never a dead client
        tr.error = f"{type(exc).__name__}: {exc}"
    finally:
        tr.t_done = clock()
        if conn is not None:
            conn.close()
    return tr


def _int_or_none(x):
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def trace_metrics(t_send: float, chunk_t: Sequence[float], t_done: float,
                  completion_tokens: int | None = None) -> dict:
    """TTFT, TPOT, E2EL and the ITL gaps (ms) of one request from its send
    time, its output chunks' arrival times and its end (see the module
    docstring for the definitions)."""
    ct = np.asarray(chunk_t, dtype=float)
    n = int(completion_tokens) if completion_tokens is not None else len(ct)
    e2e = (t_done - t_send) * 1e3
    ttft = (ct[0] - t_send) * 1e3 if len(ct) else float("nan")
    tpot = (e2e - ttft) / (n - 1) if n > 1 and len(ct) else float("nan")
    itl = np.diff(ct) * 1e3
    return {"ttft_ms": float(ttft), "tpot_ms": float(tpot), "e2e_ms": float(e2e), "itl_ms": itl.tolist(),
            "completion_tokens": n}


# ------------------------------------------------------------------- blocks
@dataclass
class Block:
    """What one pass of a workload through one server produced."""

    rows: list[dict]                 # one per request
    gaps: list[dict]                 # one per inter-token gap
    duration_s: float                # first release to last reply
    t_start: float                   # wall clock (time.time()) at the block's start
    metrics_before: dict = field(default_factory=dict)
    metrics_after: dict = field(default_factory=dict)
    interrupted: bool = False

    @property
    def metrics_delta(self) -> dict:
        return metrics_delta(self.metrics_before, self.metrics_after)


def text_hash(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def run_block(target: Target, workload: Workload, arrival: Arrival, request: dict, *, seed: int = 0,
              jobs: Sequence[tuple[int, Item]] | None = None, prefix: str = "", base: dict | None = None,
              scrape: bool = True, on_row: Callable[[dict], None] | None = None,
              stop: threading.Event | None = None, deadline_s: float | None = None) -> Block:
    """Send every conversation of `workload` (or `jobs`, (item index, item)
    pairs) to `target` on `arrival`'s schedule; item i gets seed `seed + i`.
    `prefix` is put in front of each conversation's first message (a block
    tag that keeps one block's prompts out of the prefix cache of the next);
    `base` columns go on every row.  Scrapes /metrics before and after
    (scrape=False: not).  `stop` (an Event) ends the block early: in-flight
    requests finish, nothing new is sent.  `deadline_s`: no request is sent
    later than this many seconds after the block's start; each one left is a
    row with the error "not sent: ..." (so a server that cannot keep up
    shows as failed requests in bounded time, not as an unbounded queue)."""
    jobs = list(enumerate(workload.items)) if jobs is None else list(jobs)
    base = dict(base or {})
    stop = stop or threading.Event()
    before = scrape_metrics(target) if scrape else {}
    n_clients = arrival.workers(len(jobs))
    lock = threading.Lock()
    rows: list[dict] = []
    gaps: list[dict] = []
    wall0 = time.time()
    t0 = time.perf_counter()
    pending = ReleaseQueue(jobs, arrival, t0)
    req_settings = {k: v for k, v in request.items() if k != "max_tokens"}

    def client(c: int) -> None:
        while not stop.is_set():
            job = pending.take(stop)
            if job is None:
                return
            idx, item, t_release = job
            replies: list[str] = []
            for turn in range(len(item.turns)):
                if stop.is_set():
                    return
                if deadline_s is not None and time.perf_counter() - t0 > deadline_s:
                    for t in range(turn, len(item.turns)):
                        _unsent(rows, lock, base, idx, item, t, seed, c, t_release - t0,
                                f"not sent: the block's deadline of {deadline_s:g} s had passed")
                    break
                msgs = _tagged(item.messages(turn, replies), prefix)
                kw = dict(req_settings, seed=seed + idx)
                mt = request.get("max_tokens")
                if item.max_tokens is not None:
                    mt = min(int(item.max_tokens), int(mt)) if mt is not None else int(item.max_tokens)
                if mt is not None:
                    kw["max_tokens"] = int(mt)
                tr = stream_chat(target, chat_body(target.model, msgs, kw))
                m = trace_metrics(tr.t_send, tr.chunk_t, tr.t_done, tr.completion_tokens)
                row = dict(base, item_index=idx, prompt_id=item.id, group=item.group, turn=turn,
                           n_turns=len(item.turns), seed=seed + idx, client=c,
                           t_release_s=t_release - t0, t_submit_s=tr.t_send - t0, t_done_s=tr.t_done - t0,
                           client_wait_ms=(tr.t_send - t_release) * 1e3,
                           client_ms=(tr.t_done - t_release) * 1e3,
                           prompt_tokens=tr.prompt_tokens if tr.prompt_tokens is not None else -1,
                           cached_tokens=tr.cached_tokens if tr.cached_tokens is not None else -1,
                           completion_tokens=m["completion_tokens"] if not tr.error else len(tr.chunk_t),
                           tokens_counted="usage" if tr.completion_tokens is not None else "chunks",
                           n_chunks=len(tr.chunk_t), ttft_ms=m["ttft_ms"], tpot_ms=m["tpot_ms"],
                           e2e_ms=m["e2e_ms"],
                           itl_ms_mean=float(np.mean(m["itl_ms"])) if m["itl_ms"] else float("nan"),
                           itl_ms_max=float(np.max(m["itl_ms"])) if m["itl_ms"] else float("nan"),
                           finish_reason=tr.finish_reason, status=tr.status,
                           output_hash=text_hash(tr.text), output_text=tr.text, error=tr.error)
                g = [dict(gap=k + 1, t_s=tr.chunk_t[k + 1] - t0, itl_ms=x) for k, x in enumerate(m["itl_ms"])]
                with lock:
                    rows.append(row)
                    if not tr.error:     # a failed request's gaps are not latencies (vLLM leaves them out too)
                        keys = {k: row[k] for k in ("prompt_id", "turn", "seed")}
                        gaps.extend(dict(base, **keys, **d) for d in g)
                if on_row is not None:
                    on_row(row)
                if tr.error:
                    break                                     # later turns need this reply
                replies.append(tr.text)
                t_release = time.perf_counter()               # the next turn is released when the reply is in

    threads = [threading.Thread(target=client, args=(c,), name=f"colibri-loadgen-{c}", daemon=True)
               for c in range(n_clients)]
    for t in threads:
        t.start()
    interrupted = False
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.1)
    except KeyboardInterrupt:
        interrupted = True
        stop.set()
        for t in threads:
            t.join(timeout=target.timeout_s)
    t_first = min((r["t_release_s"] for r in rows), default=0.0)
    duration = max((r["t_done_s"] for r in rows if r["t_done_s"] == r["t_done_s"]), default=t_first) - t_first
    after = scrape_metrics(target) if scrape else {}
    rows.sort(key=lambda r: (r["t_release_s"], r["item_index"], r["turn"]))
    return Block(rows, gaps, duration, wall0, before, after, interrupted or stop.is_set())


def _unsent(rows, lock, base, idx, item, turn, seed, client, t_release_s, why) -> None:
    nan = float("nan")
    row = dict(base, item_index=idx, prompt_id=item.id, group=item.group, turn=turn, n_turns=len(item.turns),
               seed=seed + idx, client=client, t_release_s=t_release_s, t_submit_s=nan, t_done_s=nan,
               client_wait_ms=nan, client_ms=nan, prompt_tokens=-1, cached_tokens=-1, completion_tokens=0,
               tokens_counted="", n_chunks=0, ttft_ms=nan, tpot_ms=nan, e2e_ms=nan, itl_ms_mean=nan,
               itl_ms_max=nan, finish_reason="", status=0, output_hash=text_hash(""), output_text="", error=why)
    with lock:
        rows.append(row)


def _tagged(messages: list[dict], prefix: str) -> list[dict]:
    if not prefix:
        return messages
    out = [dict(m) for m in messages]
    out[0]["content"] = prefix + out[0]["content"]
    return out


# ------------------------------------------------------------------ /metrics
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text -> {name: value summed over label sets}, the name
    without its namespace ("colibri:", "vllm:") and without a "_total"
    suffix; histogram buckets are left out (their _sum and _count stay)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name = m.group(1).rsplit(":", 1)[-1]
        if name.endswith("_bucket"):
            continue
        if name.endswith("_total"):
            name = name[:-6]
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        out[name] = out.get(name, 0.0) + v
    return out


def scrape_metrics(target: Target) -> dict[str, float]:
    """The server's /metrics as parse_prometheus gives it; {} when it has none."""
    try:
        status, data = target.get("/metrics")
    except OSError:
        return {}
    return parse_prometheus(data.decode("utf-8", "replace")) if status == 200 else {}


def metrics_delta(before: dict, after: dict) -> dict:
    """Counter deltas over a block and what vLLM derives from them: prefix
    cache hit rate, speculative acceptance rate and mean acceptance length
    (NaN when the server does not export the counters or nothing happened)."""
    def d(name):
        if name in after and name in before:
            return after[name] - before[name]
        return float("nan")

    out = {k: d(k) for k in ("request_success", "prompt_tokens", "generation_tokens", "prefix_cache_queries",
                             "prefix_cache_hits", "spec_decode_num_drafts", "spec_decode_num_draft_tokens",
                             "spec_decode_num_accepted_tokens")}
    out["prefix_cache_hit_rate"] = _ratio(out["prefix_cache_hits"], out["prefix_cache_queries"])
    out["acceptance_rate"] = _ratio(out["spec_decode_num_accepted_tokens"], out["spec_decode_num_draft_tokens"])
    acc = _ratio(out["spec_decode_num_accepted_tokens"], out["spec_decode_num_drafts"])
    out["mean_acceptance_length"] = 1.0 + acc if math.isfinite(acc) else float("nan")
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else float("nan")


# ------------------------------------------------------------------- summary
def parse_slo(text: str | dict | None) -> dict[str, float]:
    """"ttft:2000 tpot:200 e2el:5000" (ms; vLLM's --goodput syntax, any
    subset, spaces or commas) -> {"ttft_ms": 2000.0, ...}; a dict of either
    key form passes through."""
    if not text:
        return {}
    if isinstance(text, dict):
        items = list(text.items())
    else:
        items = []
        for tok in re.split(r"[\s,]+", str(text).strip()):
            if not tok:
                continue
            if ":" not in tok:
                raise ValueError(f"SLO {tok!r}: expected name:milliseconds (ttft, tpot, e2el)")
            k, v = tok.split(":", 1)
            items.append((k, v))
    out = {}
    for k, v in items:
        col = SLO_COLUMNS.get(k, k if k in SLO_COLUMNS.values() else None)
        if col is None:
            raise ValueError(f"unknown SLO {k!r}: use ttft, tpot or e2el (milliseconds)")
        try:
            ms = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"SLO {k}: {v!r} is not a number of milliseconds") from None
        if not ms > 0:
            raise ValueError(f"SLO {k} must be > 0 ms, got {v!r}")
        out[col] = ms
    return out


def good_requests(rows, slo: dict) -> np.ndarray:
    """Boolean mask: requests that succeeded and are within every SLO
    (<= the bound, vLLM's rule; TPOT of a one-token reply counts as 0)."""
    import pandas as pd

    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if not len(df):
        return np.zeros(0, dtype=bool)
    ok = (df["error"].fillna("") == "").to_numpy() if "error" in df else np.ones(len(df), dtype=bool)
    for col, bound in parse_slo(slo).items():
        x = pd.to_numeric(df[col], errors="coerce").to_numpy(float)
        if col == "tpot_ms":
            x = np.where(np.isnan(x) & (pd.to_numeric(df["completion_tokens"]).to_numpy() <= 1), 0.0, x)
        ok = ok & (np.nan_to_num(x, nan=np.inf) <= bound)
    return ok


def _stats(x, name: str) -> dict:
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    out = {f"mean_{name}_ms": float(np.mean(x)) if len(x) else float("nan"),
           f"median_{name}_ms": float(np.median(x)) if len(x) else float("nan"),
           f"std_{name}_ms": float(np.std(x)) if len(x) else float("nan")}
    for p in PERCENTILES:
        if p != 50:
            out[f"p{p}_{name}_ms"] = float(np.percentile(x, p)) if len(x) else float("nan")
    return out


def summary(rows, gaps, duration_s: float, slo: dict | str | None = None) -> dict:
    """vLLM `bench serve`'s result for one block (its key names): completed,
    failed, total_input_tokens, total_output_tokens, request_throughput,
    output_throughput, total_token_throughput, request_goodput (with an SLO),
    mean/median/std/p90/p99 of ttft, tpot, itl, e2el (ms)."""
    import pandas as pd

    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    gp = gaps if isinstance(gaps, pd.DataFrame) else pd.DataFrame(list(gaps))
    if not len(df):
        return {"completed": 0, "failed": 0}
    ok = df[df["error"].fillna("") == ""]
    dur = float(duration_s)
    n_in = int(pd.to_numeric(ok["prompt_tokens"]).clip(lower=0).sum())
    n_out = int(pd.to_numeric(ok["completion_tokens"]).sum())
    out = {"duration": dur, "completed": int(len(ok)), "failed": int(len(df) - len(ok)),
           "total_input_tokens": n_in, "total_output_tokens": n_out,
           "request_throughput": len(ok) / dur if dur > 0 else float("nan"),
           "output_throughput": n_out / dur if dur > 0 else float("nan"),
           "total_token_throughput": (n_in + n_out) / dur if dur > 0 else float("nan")}
    slo = parse_slo(slo)
    if slo:
        good = int(good_requests(df, slo).sum())
        out["good_requests"] = good
        out["request_goodput"] = good / dur if dur > 0 else float("nan")
    out.update(_stats(ok["ttft_ms"], "ttft"))
    out.update(_stats(ok["tpot_ms"], "tpot"))
    itl = gp["itl_ms"] if len(gp) and "itl_ms" in gp else []     # successful requests' gaps only
    out.update(_stats(itl, "itl"))
    out.update(_stats(ok["e2e_ms"], "e2el"))
    return out


def sustained(rows, threshold: float = 0.9) -> tuple[bool, float]:
    """Did the server keep up with the arrivals?  The rate at which first
    turns completed (between the first and last completion) over the rate
    at which they were released (between the first and last release):
    about 1 when the server keeps up - completions follow arrivals shifted
    by the latency - and the service rate / the offered rate when a queue
    builds; capped at 1 (completions bunched closer than the arrivals - a
    batch finishing together - is keeping up, not more).  Returns
    (ratio >= threshold, ratio)."""
    import pandas as pd

    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if "error" in df and (df["error"].fillna("") != "").any():
        return False, 0.0                       # requests that failed or were never sent: it did not keep up
    if "turn" in df:
        df = df[df["turn"] == 0]
    if len(df) < 3:
        return False, float("nan")
    rel = np.sort(df["t_release_s"].to_numpy(float))
    done = np.sort(df["t_done_s"].to_numpy(float))
    span_rel, span_done = rel[-1] - rel[0], done[-1] - done[0]
    if span_rel <= 0:
        return True, 1.0
    ratio = min(1.0, span_rel / span_done) if span_done > 0 else 1.0
    return bool(ratio >= threshold), float(ratio)
