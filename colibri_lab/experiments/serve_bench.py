"""Serving experiments: the spec's variants are servers reached over HTTP.

    from colibri_lab.experiments import run_spec, serve_table
    res = run_spec("experiments/serving.toml")      # a spec with a [serve] table (see spec.py)
    serve_table(res, slo="ttft:2000 tpot:200")      # vLLM bench serve's numbers, one row per variant

The procedure is the in-process runner's (runner.py), with a server where
the engine was:
  1. one server per distinct (serve, engine) settings - our server or
     llama.cpp's started on loopback (servers.py), or a running one at a URL
     - kept up for the whole run, so that the variants' blocks interleave;
     each gets `warmup` unrecorded requests when it starts;
  2. for repeat r every variant runs one block (a pass over the workload
     through loadgen.run_block, on the variant's arrival schedule), in ABBA
     order across repeats;
  3. fresh_cache: every block's prompts start with a tag unique to (repeat,
     arrival, request, model), so no block finds another block's prompts in
     a server's prefix cache (there is no HTTP call to clear it), while two
     servers at the same rate in the same repeat get the same prompts and
     pair request by request (repeat, prompt_id, turn, seed);
  4. /metrics is scraped before and after each block; its deltas, the
     block's vLLM summary and the load average go into meta["blocks"].
Rows are loadgen's (one per request, client-side times), gaps are one per
inter-token gap; Results carries both, with the provenance of every server
(command line, version, parameters, model sha256) in meta["engines"].

On a Dask backend (backend= as in runner.py) one task runs one repeat's
blocks on a worker, which starts the servers it needs on its own loopback
(and stops them when the task ends), so a pair (two servers at one rate in
one repeat) always ran on one machine.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import threading
import time
from typing import Any, Callable

import numpy as np
import pandas as pd

from colibri_lab.experiments import loadgen
from colibri_lab.experiments.results import Results, collect_metadata, cpu_model, load_average
from colibri_lab.experiments.blocks import INPROCESS, WARMUP_PROMPT, block_order
from colibri_lab.experiments.spec import SERVE_KEYS, ExperimentSpec, Variant
from colibri_lab.experiments.stats import verdict
from colibri_lab.experiments.workloads import Workload, load_workload

KINDS = ("colibri", "llama.cpp", "url")
DEFAULT_SERVE = {"kind": "colibri", "metrics": True, "timeout_s": 600.0, "startup_timeout_s": 300.0}


def serve_settings(v: Variant) -> dict:
    """A resolved variant's server settings, checked."""
    s = dict(DEFAULT_SERVE, **(v.serve or {}))
    bad = set(s) - set(SERVE_KEYS)
    if bad:
        raise ValueError(f"variant {v.name!r}: unknown serve key(s) {', '.join(sorted(bad))}")
    if s["kind"] not in KINDS:
        raise ValueError(f"variant {v.name!r}: serve.kind must be one of {', '.join(KINDS)}, got {s['kind']!r}")
    if s["kind"] == "url" and not s.get("base_url"):
        raise ValueError(f"variant {v.name!r}: serve.kind = 'url' needs serve.base_url")
    if s["kind"] == "url" and not s.get("model_id"):
        raise ValueError(f"variant {v.name!r}: serve.kind = 'url' needs serve.model_id (the model name to send)")
    if not isinstance(s.get("args", []), list):
        raise ValueError(f"variant {v.name!r}: serve.args must be a list of strings")
    loadgen.parse_slo(s.get("slo"))          # a malformed SLO fails before anything starts
    return s


def server_key(v: Variant) -> str:
    """Variants with equal keys share one server."""
    s = serve_settings(v)
    keep = {k: s.get(k) for k in ("kind", "base_url", "model_id", "args", "python")}
    if s["kind"] != "url":
        keep["engine"] = v.engine
    return json.dumps(keep, sort_keys=True, default=str)


def block_tag(spec: ExperimentSpec, v: Variant, rep: int) -> str:
    """The prefix of every conversation's first message in a block (fresh_cache)."""
    if not spec.fresh_cache:
        return ""
    key = json.dumps([spec.name, spec.seed, rep, v.arrival, v.request, v.engine.get("model")], sort_keys=True,
                     default=str)
    return f"[session {hashlib.sha1(key.encode()).hexdigest()[:8]}] "


class _External:
    """A server somebody else runs (kind = "url")."""

    def __init__(self, s: dict):
        self.kind, self.base_url, self.model_id = "url", s["base_url"], s["model_id"]

    def info(self) -> dict:
        t = loadgen.Target(self.base_url, self.model_id)
        d: dict[str, Any] = {"kind": "url", "base_url": self.base_url, "model_id": self.model_id}
        try:
            status, body = t.get("/v1/models")
            if status == 200:
                d["models"] = json.loads(body)
        except (OSError, ValueError):
            pass
        return d

    def stop(self) -> None:
        pass


def start_server(v: Variant):
    """Start (or, kind = "url", describe) the server a resolved variant names."""
    from colibri_lab.experiments import servers

    s = serve_settings(v)
    if s["kind"] == "url":
        return _External(s)
    eng = dict(v.engine)
    kw = dict(model=eng.pop("model", "smollm2"), n_threads=eng.pop("n_threads", 0), n_ctx=eng.pop("n_ctx", 2048),
              n_slots=eng.pop("n_slots", 4 if s["kind"] == "colibri" else 1), model_id=s.get("model_id"),
              args=[str(a) for a in s.get("args", [])], startup_timeout_s=float(s["startup_timeout_s"]))
    if s["kind"] == "llama.cpp":
        eng = {}                          # one sequence; our engine's switches do not apply
        kw["python"] = s.get("python") or None
    else:
        eng.pop("prefix_reuse", None)     # the server always reuses prefixes
        eng.pop("max_queue", None)
    return servers.STARTERS[s["kind"]](**kw, **eng)


def _server_meta(srv) -> dict:
    d = srv.info()
    health = (d.get("params") or {}).get("health") or {}
    if health.get("engine"):              # our server reports its engine's actual params (threads, SIMD path)
        d["params"] = dict(health["engine"], args=d["params"].get("args", []))
    return d


def _warm_up(target: loadgen.Target, n: int) -> None:
    for _ in range(n):
        tr = loadgen.stream_chat(target, loadgen.chat_body(target.model, WARMUP_PROMPT,
                                                           {"max_tokens": 4, "temperature": 0.0}))
        if tr.error:
            raise RuntimeError(f"warm-up request to {target.base_url} failed: {tr.error}")


class ServeRunner:
    """Runs a serving ExperimentSpec (see the module docstring).

    progress / on_row(row, rows_so_far): as Runner's.
    servers: a dict to keep started servers in (reused across runs with
      keep_servers=True; the caller stops them); backend: as Runner's.
    """

    def __init__(self, spec: ExperimentSpec, *, progress: bool = True,
                 on_row: Callable[[dict, list], None] | None = None, servers: dict | None = None,
                 keep_servers: bool = False, backend: Any = None, **_ignored):
        if not spec.is_serving:
            raise ValueError(f"experiment {spec.name!r} has no [serve] table: run it with runner.run")
        self.spec = spec
        self.progress = progress
        self.on_row = on_row
        self.backend = backend
        self.servers: dict = servers if servers is not None else {}
        self._own = servers is None and not keep_servers
        self.workload: Workload = load_workload(spec.workload, spec.workload_n, spec.workload_turns,
                                                spec.workload_order)
        self.variants = spec.resolved_variants()
        for v in self.variants:
            serve_settings(v)

    # ------------------------------------------------------------- servers
    def target_for(self, v: Variant) -> tuple[loadgen.Target, Any]:
        key = server_key(v)
        if key not in self.servers:
            srv = start_server(v)
            self.servers[key] = srv
            s = serve_settings(v)
            _warm_up(loadgen.Target(srv.base_url, srv.model_id, api_key=s.get("api_key"),
                                    timeout_s=float(s["timeout_s"])), self.spec.warmup)
        srv = self.servers[key]
        s = serve_settings(v)
        return loadgen.Target(srv.base_url, srv.model_id, api_key=s.get("api_key"),
                              timeout_s=float(s["timeout_s"])), srv

    def close(self) -> None:
        for srv in self.servers.values():
            try:
                srv.stop()
            except Exception:
                pass
        self.servers.clear()

    # ----------------------------------------------------------------- run
    def run(self) -> Results:
        from colibri_lab.experiments import distributed

        backend = self.backend if self.backend is not None else distributed.default_backend()
        if backend is not None and not (isinstance(backend, str) and backend == INPROCESS):
            return run_distributed(self, backend)
        spec = self.spec
        order = block_order([v.name for v in self.variants], spec.repeats)
        by_name = {v.name: v for v in self.variants}
        bar = self._make_bar(len(order) * self.workload.n_requests)
        rows, gaps, blocks, servers_meta = [], [], [], {}
        started, load_before = time.time(), load_average()
        interrupted = False
        try:
            for block_i, (rep, vname) in enumerate(order):
                v = by_name[vname]
                if bar is not None:
                    bar.set_description(f"{vname} r{rep}")
                brows, bgaps, binfo, srv_meta = self.run_block(v, rep, block_i, INPROCESS, rows, bar)
                servers_meta.setdefault(vname, srv_meta)
                rows += brows
                gaps += bgaps
                blocks.append(binfo)
                if binfo["interrupted"]:
                    interrupted = True
                    break
        except KeyboardInterrupt:
            interrupted = True
        finally:
            if bar is not None:
                bar.close()
            if self._own:
                self.close()
        return self._results(rows, gaps, blocks, servers_meta, started, load_before, interrupted,
                             {"kind": INPROCESS})

    def run_block(self, v: Variant, rep: int, block_i: int, worker: str, rows_so_far: list | None = None,
                  bar=None):
        """One block of variant v: (rows, gaps, block info, server metadata)."""
        spec = self.spec
        target, srv = self.target_for(v)
        s = serve_settings(v)
        srv_meta = _server_meta(srv)
        arrival = v.arrival_obj()
        simd = str((srv_meta.get("params") or {}).get("simd", ""))
        base = dict(experiment=spec.name, variant=v.name, repeat=rep, block=block_i, workload=self.workload.name,
                    concurrency=arrival.concurrency, arrival=arrival.label(),
                    rate=arrival.rate if arrival.kind == "poisson" else float("nan"),
                    server=s.get("label") or s["kind"], model=target.model, worker=worker, hostname=socket.gethostname(),
                    cpu_model=cpu_model(), simd=simd, shard=0)
        done: list[dict] = []

        def on_row(row):        # client threads: only count here; on_row callbacks run below, on this thread
            done.append(row)

        load0 = load_average()
        stop = threading.Event()
        box: dict = {}
        th = threading.Thread(target=lambda: box.update(b=loadgen.run_block(
            target, self.workload, arrival, v.request, seed=spec.seed, prefix=block_tag(spec, v, rep), base=base,
            scrape=bool(s.get("metrics", True)), on_row=on_row, stop=stop,
            deadline_s=float(s["block_timeout_s"]) if s.get("block_timeout_s") else None)), daemon=True)
        th.start()
        seen = 0
        try:
            while th.is_alive() or seen < len(done):
                th.join(0.05)
                while seen < len(done):
                    row = done[seen]
                    seen += 1
                    if bar is not None:
                        bar.update(1)
                    if self.on_row is not None:
                        self.on_row(row, list(rows_so_far or []) + done[:seen])
        except KeyboardInterrupt:
            stop.set()
            th.join()
        blk: loadgen.Block = box["b"]
        delta = blk.metrics_delta
        info = dict(block=block_i, variant=v.name, repeat=rep, worker=worker, t_start=blk.t_start,
                    duration_s=blk.duration_s, n_requests=len(blk.rows),
                    completion_tokens=int(sum(r["completion_tokens"] for r in blk.rows)),
                    metrics_delta=delta, summary=loadgen.summary(blk.rows, blk.gaps, blk.duration_s, s.get("slo")),
                    sustained=loadgen.sustained(blk.rows)[1] if arrival.kind == "poisson" else float("nan"),
                    load_before=load0, load_after=load_average(), interrupted=blk.interrupted)
        return blk.rows, blk.gaps, info, srv_meta

    def _results(self, rows, gaps, blocks, servers_meta, started, load_before, interrupted, backend) -> Results:
        meta = collect_metadata(self.spec, self.variants, servers_meta, load_before=load_before)
        meta.update(blocks=blocks, interrupted=interrupted, started=started, finished=time.time(),
                    workload_items=len(self.workload), workload_requests=self.workload.n_requests,
                    backend=backend, serving=True)
        for r in rows:          # unknown token counts (a server without usage) are NaN, not -1
            for k in ("prompt_tokens", "cached_tokens"):
                if r.get(k) == -1:
                    r[k] = float("nan")
        return Results.from_rows(rows, [], meta, gaps=gaps)

    def _make_bar(self, total: int):
        if not self.progress:
            return None
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return None
        return tqdm(total=total, desc=self.spec.name, unit="req", leave=True)


def run_serving(spec: ExperimentSpec, **kw) -> Results:
    """Run a serving spec (ServeRunner keywords: progress, on_row, servers, keep_servers, backend)."""
    return ServeRunner(spec, **kw).run()


# ----------------------------------------------------------------- Dask
def serve_task(task: dict) -> dict:
    """One repeat's blocks on this worker (servers started on its loopback)."""
    from colibri_lab.experiments.distributed import _worker_address, worker_info

    address = _worker_address()
    runner = ServeRunner(task["spec"], progress=False)
    by_name = {v.name: v for v in runner.variants}
    rows, gaps, blocks, servers_meta = [], [], [], {}
    try:   # the task's servers live as long as the task: a worker that dies leaves none behind
        for block_i, vname in task["blocks"]:
            brows, bgaps, binfo, sm = runner.run_block(by_name[vname], task["repeat"], block_i, address)
            rows += brows
            gaps += bgaps
            binfo["task"] = task["key"]
            blocks.append(binfo)
            servers_meta.setdefault(vname, sm)
    finally:
        runner.close()
    return {"key": task["key"], "rows": rows, "gaps": gaps, "blocks": blocks, "servers": servers_meta,
            "worker": dict(worker_info(address), load=load_average())}


def run_distributed(runner: ServeRunner, backend) -> Results:
    from dataclasses import replace

    from colibri_lab.experiments.distributed import as_backend

    be = as_backend(backend)
    try:
        from distributed import as_completed

        spec = runner.spec
        shipped = replace(spec, workload=runner.workload, workload_n=None, workload_turns=None, workload_order=None)
        order = block_order([v.name for v in runner.variants], spec.repeats)
        run_id = os.urandom(4).hex()
        tasks = [{"key": f"colibri-serve-{spec.name}-{run_id}-r{rep}", "repeat": rep, "spec": shipped,
                  "blocks": [(i, n) for i, (r, n) in enumerate(order) if r == rep]} for rep in range(spec.repeats)]
        started, load_before = time.time(), load_average()
        futs = [be.client.submit(serve_task, t, key=t["key"], pure=False, retries=be.retries) for t in tasks]
        outs = []
        rows_so_far: list = []
        for fut in as_completed(futs):
            out = fut.result()
            outs.append(out)
            for row in out["rows"]:
                rows_so_far.append(row)
                if runner.on_row is not None:
                    runner.on_row(row, rows_so_far)
        outs.sort(key=lambda o: o["key"])
        rows = sorted((r for o in outs for r in o["rows"]), key=lambda r: (r["block"], r["t_release_s"]))
        gaps = [g for o in outs for g in o["gaps"]]
        blocks = sorted((b for o in outs for b in o["blocks"]), key=lambda b: b["block"])
        servers_meta: dict = {}
        for o in outs:
            for k, m in o["servers"].items():
                servers_meta.setdefault(k, m)
        res = runner._results(rows, gaps, blocks, servers_meta, started, load_before, False,
                              {"kind": "dask", "n_tasks": len(tasks), "retries": be.retries})
        res.meta["workers"] = {o["worker"]["address"]: o["worker"] for o in outs}
        return res
    finally:
        be.close()


# ------------------------------------------------------------- summaries
def _variant_cols(res: Results) -> pd.DataFrame:
    df = res.requests
    cols = [c for c in ("server", "model", "rate", "concurrency", "arrival") if c in df]
    return df.groupby("variant", sort=False)[cols].first()


def serve_table(res: Results, slo: str | dict | None = None) -> pd.DataFrame:
    """vLLM `bench serve`'s result per variant, over all its blocks: its
    requests pooled for the percentiles, throughputs over the summed block
    durations; `sustained` = the median over blocks of the completion /
    arrival rate ratio (loadgen.sustained); the /metrics deltas summed over
    blocks give prefix_cache_hit_rate and acceptance_rate; then the
    model file and the commit.  slo: default the spec's serve.slo."""
    df, gp = res.requests, res.gaps if res.gaps is not None else pd.DataFrame(columns=["variant", "itl_ms"])
    if slo is None:
        slo = ((res.meta.get("experiment") or {}).get("serve") or {}).get("slo")
        if slo is None:
            for v in res.meta.get("variants", []):
                slo = slo or (v.get("serve") or {}).get("slo")
    blocks = pd.DataFrame(res.meta.get("blocks", []))
    vc = _variant_cols(res)
    git = res.meta.get("git") or {}
    commit = (git.get("commit") or "?")[:10] + ("+dirty" if git.get("dirty") else "")
    out = []
    for v, g in df.groupby("variant", sort=False):
        bv = blocks[blocks["variant"] == v] if len(blocks) else blocks
        dur = float(bv["duration_s"].sum()) if len(bv) else float("nan")
        rec = {"variant": v, **vc.loc[v].to_dict()}
        rec.update(loadgen.summary(g, gp[gp["variant"] == v], dur, slo))
        rec["sustained"] = float(np.nanmedian(bv["sustained"].astype(float))) if len(bv) and \
            bv["sustained"].notna().any() else float("nan")
        tot: dict = {}
        for d in (bv["metrics_delta"] if len(bv) else []):
            for k, x in d.items():
                if isinstance(x, (int, float)) and math.isfinite(x):
                    tot[k] = tot.get(k, 0.0) + x
        rec["requests_in_metrics"] = tot.get("request_success", float("nan"))
        rec["prefix_cache_hit_rate"] = loadgen._ratio(tot.get("prefix_cache_hits", float("nan")),
                                                      tot.get("prefix_cache_queries", float("nan")))
        rec["acceptance_rate"] = loadgen._ratio(tot.get("spec_decode_num_accepted_tokens", float("nan")),
                                                tot.get("spec_decode_num_draft_tokens", float("nan")))
        em = (res.meta.get("engines") or {}).get(v) or {}
        rec["model_file"] = os.path.basename(em.get("model_path", "")) if em.get("model_path") else ""
        rec["commit"] = commit
        out.append(rec)
    t = pd.DataFrame(out).set_index("variant")
    if df.attrs.get("provenance"):
        t.attrs["provenance"] = df.attrs["provenance"]
    return t


def percentile_ratio(a, b, q: float = 99, n_boot: int = 2000, ci: float = 0.95, seed: int = 0,
                     better: str = "lower", groups_a=None, groups_b=None) -> dict:
    """The ratio of the q-th percentiles percentile(b) / percentile(a) of two
    independent samples (two servers' latencies at one rate: not paired, so
    each is resampled on its own), with a seeded percentile-bootstrap
    interval and the verdict (stats.verdict).

    groups_a / groups_b (one label per value, e.g. the request of each
    inter-token gap): resample whole groups instead of single values (a
    cluster bootstrap), so values that are not independent (a request's gaps
    share its steps and its neighbours) are not counted as independent
    evidence; the interval is then over requests, and `n_a` / `n_b` count
    groups."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    ga = None if groups_a is None else np.asarray(groups_a)
    gb = None if groups_b is None else np.asarray(groups_b)
    fa, fb = np.isfinite(a), np.isfinite(b)
    a, b = a[fa], b[fb]
    ga = None if ga is None else ga[fa]
    gb = None if gb is None else gb[fb]
    rng = np.random.default_rng(seed)
    pa, na = _boot_percentiles(a, ga, q, n_boot, rng)
    pb, nb = _boot_percentiles(b, gb, q, n_boot, rng)
    if pa is None or pb is None:
        return {"ratio": float("nan"), "ci_low": float("nan"), "ci_high": float("nan"),
                "verdict": "no clear difference", "n_a": na, "n_b": nb}
    with np.errstate(divide="ignore", invalid="ignore"):
        r = pb / pa
    r = r[np.isfinite(r)]
    lo, hi = np.quantile(r, [(1 - ci) / 2, 1 - (1 - ci) / 2]) if len(r) else (float("nan"), float("nan"))
    est = float(np.percentile(b, q) / np.percentile(a, q)) if np.percentile(a, q) > 0 else float("nan")
    return {"ratio": est, "ci_low": float(lo), "ci_high": float(hi), "verdict": verdict(lo, hi, better),
            "n_a": na, "n_b": nb}


def _boot_percentiles(x: np.ndarray, groups, q: float, n_boot: int, rng) -> tuple:
    """n_boot bootstrap replicates of percentile(x, q) (numpy's linear interpolation), resampling
    values, or whole groups of values when `groups` labels them; (None, n) with fewer than 2."""
    if groups is None:
        if len(x) < 2:
            return None, len(x)
        return np.percentile(x[rng.integers(0, len(x), size=(n_boot, len(x)))], q, axis=1), len(x)
    _, gid = np.unique(groups, return_inverse=True)
    n_g = int(gid.max()) + 1 if len(gid) else 0
    if n_g < 2:
        return None, n_g
    order = np.argsort(x, kind="stable")
    xs, gs = x[order], gid[order]
    out = np.empty(n_boot)
    for k in range(n_boot):
        # a replicate takes each group as many times as it was drawn: the percentile of that
        # multiset, from the cumulative counts over the sorted values
        w = np.bincount(rng.integers(0, n_g, size=n_g), minlength=n_g)[gs]
        cum = np.cumsum(w)
        n = int(cum[-1])
        if n == 0:
            out[k] = np.nan
            continue
        pos = q / 100.0 * (n - 1)
        lo = int(np.floor(pos))
        hi = min(lo + 1, n - 1)
        v_lo = xs[np.searchsorted(cum, lo, side="right")]
        v_hi = xs[np.searchsorted(cum, hi, side="right")]
        out[k] = v_lo + (pos - lo) * (v_hi - v_lo)
    return out, n_g


def max_rate_meeting(table: pd.DataFrame, server: str, bounds: dict, min_sustained: float = 0.8) -> float:
    """The highest rate at which `server`'s rows of serve_table sustain the
    arrivals (sustained >= min_sustained), complete every request and meet
    every bound, e.g. {"p99_ttft_ms": 2000, "p99_tpot_ms": 200}; 0 when none
    does.  Only a rate whose lower rates all pass counts, so one lucky high
    rate above a failed one does not."""
    t = table[table["server"] == server].sort_values("rate")
    best = 0.0
    for _, r in t.iterrows():
        ok = (r["failed"] == 0 and np.isfinite(r["sustained"]) and r["sustained"] >= min_sustained
              and all(np.isfinite(r[k]) and r[k] <= v for k, v in bounds.items()))
        if not ok:
            break
        best = float(r["rate"])
    return best
