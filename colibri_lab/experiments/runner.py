"""The runner: send a workload through every variant, interleaved, and record
one row per request and one row per engine step.

Procedure (the practice of ANCHORS.md "Benchmark practice"):
  1. engines are built per distinct engine settings (cached, closed at the end)
     and warmed up with a few unrecorded requests on a prompt outside the workload;
  2. for repeat r = 0..R-1 every variant runs one *block* (a full pass over the
     workload); the variant order alternates forward / backward (A B, B A, A B,
     ... - ABBA for two variants) so slow drifts of the machine hit all variants
     alike;
  3. before each block the KV slots are cleared (spec.fresh_cache) so that every
     block starts from the same cache state - prefix hits then come from the
     workload itself, not from the previous block;
  4. item i always gets seed spec.seed + i, so rows pair across variants by
     (repeat, prompt_id, turn, seed).

Client threads run the items (closed loop at a concurrency, or Poisson
arrivals); the main thread only waits, collects rows, updates the progress bar
and calls `on_row`, so a KeyboardInterrupt (Ctrl-C, Jupyter's stop button)
lands there: in-flight requests are cancelled and the rows finished so far are
returned, with meta["interrupted"] = True.

Backends: by default everything runs in this process.  `backend=` (a dask
Client, a scheduler address, "local" / "local:N", or a DaskBackend) runs the
same procedure as tasks on a Dask cluster instead - see
colibri_lab.experiments.distributed and docs/distributed.md.  Every row carries
the machine it ran on (worker, hostname, cpu_model, simd) and its shard of the
workload (0 in-process), so the table has the same columns on every backend.
"""
from __future__ import annotations

import hashlib
import queue
import socket
import threading
import time
from typing import Any, Callable

import numpy as np

from colibri_lab.errors import ContextLengthExceededError, InvalidRequestError
from colibri_lab.experiments.results import (Results, collect_metadata, cpu_model, engine_metadata, list_metric_columns,
                                             load_average)
from colibri_lab.experiments.numerics import run_numerics
from colibri_lab.experiments.spec import ExperimentSpec, Variant, load_spec
from colibri_lab.experiments.workloads import Item, Workload, load_workload

# Workbench switches in a variant's request settings that are not Engine.submit keywords.
_WORKBENCH_REQUEST_KEYS = ("use_schema",)
WARMUP_PROMPT = [{"role": "user", "content": "Warm-up: count from one to five."}]
STEP_PHASES = ("matmul_ms", "attention_ms", "lm_head_ms", "sampling_ms", "grammar_ms", "draft_ms", "other_ms")


def block_order(variant_names: list[str], repeats: int) -> list[tuple[int, str]]:
    """(repeat, variant) in run order: forward on even repeats, backward on odd
    ones (A B | B A | A B ...), so every variant sits at every position equally."""
    out = []
    for r in range(repeats):
        names = variant_names if r % 2 == 0 else list(reversed(variant_names))
        out += [(r, n) for n in names]
    return out


def tokens_hash(tokens) -> str:
    """Short stable hash of a token id sequence (equal outputs <=> equal hashes)."""
    return hashlib.sha1(np.asarray(list(tokens), dtype=np.int64).tobytes()).hexdigest()[:16]


def _default_engine_factory(settings: dict):
    from colibri_lab.engine import Engine

    s = dict(settings)
    model = s.pop("model", "smollm2")
    return Engine(model, **s)


def _clear_cache(eng) -> None:
    """Forget every slot's KV history (the engine is idle between blocks)."""
    if hasattr(eng, "clear_cache"):
        eng.clear_cache()
        return
    for s in range(eng.params["n_slots"]):
        eng.core.slot_clear(s)
    pins = getattr(eng.scheduler, "_conversation_slot", None)
    if isinstance(pins, dict):
        pins.clear()


INPROCESS = "inprocess"   # the worker column of rows run in this process


def machine_columns(eng, worker: str) -> dict:
    """Columns naming where a row ran: the worker (a Dask worker address, or
    "inprocess"), the host, its CPU model and the SIMD path the engine used."""
    try:
        simd = str(eng.params.get("simd", ""))
    except Exception:
        simd = ""
    return {"worker": worker, "hostname": socket.gethostname(), "cpu_model": cpu_model(), "simd": simd}


def _fatal(exc: BaseException) -> bool:
    """A rejected setting (InvalidRequestError, at submit or when the request
    reaches the engine) makes every request of the variant wrong: stop the run.
    A request that is merely too long for the context is that request's error."""
    return isinstance(exc, InvalidRequestError) and not isinstance(exc, ContextLengthExceededError)


class Runner:
    """Runs an ExperimentSpec.

    progress: show a tqdm.auto bar (works in notebooks and terminals; silently
      off when tqdm is missing).
    on_row(row: dict, results_so_far: list[dict]): called on the main thread
      after every finished request (live widgets use it).
    engine_factory(settings) -> Engine: how engines are built (tests inject).
    keep_engines: do not close the engines at the end (reuse them for another
      run through `engines=`); the caller closes them.
    backend: None / "inprocess" (default: this process, as always), or a Dask
      backend: a distributed.Client, a scheduler address "tcp://host:8786",
      "local" / "local:N" (start a LocalCluster with N worker processes) or a
      colibri_lab.experiments.distributed.DaskBackend (shards=, retries=).
      None also honours a default set by `with distributed.use_backend(...)`.
      On a Dask backend `engines` / `keep_engines` do not apply: every worker
      process keeps its own engines (distributed.run_task).
    """

    def __init__(self, spec: ExperimentSpec, *, progress: bool = True,
                 on_row: Callable[[dict, list], None] | None = None,
                 engine_factory: Callable[[dict], Any] | None = None,
                 engines: dict | None = None, keep_engines: bool = False, backend: Any = None):
        self.spec = spec
        self.backend = backend
        self.progress = progress
        self.on_row = on_row
        self.engine_factory = engine_factory or _default_engine_factory
        self.engines: dict = engines if engines is not None else {}
        self._own_engines = engines is None and not keep_engines
        self.workload: Workload = load_workload(spec.workload, spec.workload_n, spec.workload_turns,
                                                spec.workload_order)
        self.variants: list[Variant] = spec.resolved_variants()

    # ------------------------------------------------------------ engines
    def engine_for(self, v: Variant):
        key = v.engine_key()
        if key not in self.engines:
            eng = self.engine_factory(dict(v.engine))
            self.engines[key] = eng
            self._warm_up(eng, v)
        return self.engines[key]

    def _warm_up(self, eng, v: Variant) -> None:
        if self.spec.warmup <= 0:
            return
        ids = eng.tokenize(eng.apply_chat_template(WARMUP_PROMPT), add_special=False)
        for _ in range(self.spec.warmup):
            eng.generate(ids, max_tokens=4, temperature=0.0)

    def close(self) -> None:
        for eng in self.engines.values():
            try:
                eng.close()
            except Exception:
                pass
        self.engines.clear()

    # ---------------------------------------------------------------- run
    def run(self) -> Results:
        from colibri_lab.experiments import distributed  # no dask import unless a Dask backend is used

        backend = self.backend if self.backend is not None else distributed.default_backend()
        if backend is not None and not (isinstance(backend, str) and backend == INPROCESS):
            res = distributed.run_distributed(self, backend)
            if self.spec.numerics and not res.interrupted:  # the numerics pass runs here, in this process
                try:
                    res.numerics = Results.numerics_frame(run_numerics(self, res.requests.to_dict("records")))
                finally:
                    if self._own_engines:
                        self.close()
            return res
        spec, wl = self.spec, self.workload
        order = block_order([v.name for v in self.variants], spec.repeats)
        by_name = {v.name: v for v in self.variants}
        total = len(order) * wl.n_requests
        rows: list[dict] = []
        steps: list[dict] = []
        blocks: list[dict] = []
        engines_meta: dict = {}
        bar = self._make_bar(total)
        interrupted = False
        started = time.time()
        load_before = load_average()
        num_rows: list[dict] = []
        try:
            for block_i, (rep, vname) in enumerate(order):
                v = by_name[vname]
                eng = self.engine_for(v)
                if vname not in engines_meta:
                    engines_meta[vname] = engine_metadata(eng)
                if bar is not None:
                    bar.set_description(f"{vname} r{rep}")
                extra = dict(machine_columns(eng, INPROCESS), shard=0)
                brows, bsteps, binfo, stop = self._run_block(eng, v, rep, block_i, rows, bar, extra=extra)
                rows += brows
                steps += bsteps
                blocks.append(binfo)
                if stop:
                    interrupted = True
                    break
            if spec.numerics and not interrupted:
                num_rows = run_numerics(self, rows)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            if bar is not None:
                bar.close()
            if self._own_engines:
                self.close()
        meta = collect_metadata(spec, self.variants, engines_meta, load_before=load_before)
        meta.update(blocks=blocks, interrupted=interrupted, started=started, finished=time.time(),
                    workload_items=len(wl), workload_requests=wl.n_requests, backend={"kind": INPROCESS})
        res = Results.from_rows(rows, steps, meta)
        res.numerics = Results.numerics_frame(num_rows)
        return res

    def _make_bar(self, total: int):
        if not self.progress:
            return None
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return None
        return tqdm(total=total, desc=self.spec.name, unit="req", leave=True)

    def _request_kwargs(self, v: Variant, item: Item, seed: int) -> dict:
        kw = {k: val for k, val in v.request.items() if k not in _WORKBENCH_REQUEST_KEYS}
        if v.request.get("use_schema") and item.schema is not None:
            kw["json_schema"] = item.schema
        if item.max_tokens is not None:
            kw["max_tokens"] = min(int(item.max_tokens), int(kw.get("max_tokens", item.max_tokens)))
        kw["seed"] = seed
        return kw

    def _run_block(self, eng, v: Variant, rep: int, block_i: int, rows_so_far: list, bar,
                   jobs: list[tuple[int, Item]] | None = None, extra: dict | None = None):
        """One pass of the workload - or of `jobs`, a list of (item index, item):
        one shard of it - through variant v; the `extra` columns go on every
        row (shard and worker also on steps and the block info).  Returns
        (rows, steps, block info, interrupted?)."""
        spec, wl = self.spec, self.workload
        arrival = v.arrival_obj()
        if spec.fresh_cache:
            _clear_cache(eng)
        log = eng.scheduler.step_log
        last_step = log[-1]["step"] if log else -1
        jobs = list(enumerate(wl.items)) if jobs is None else list(jobs)
        extra = dict(extra or {})
        where = {k: extra[k] for k in ("shard", "worker") if k in extra}
        release = arrival.start_times(len(jobs))
        n_workers = arrival.workers(len(jobs))
        stop = threading.Event()
        out_q: queue.Queue = queue.Queue()
        next_job = [0]
        lock = threading.Lock()
        inflight: dict[int, Any] = {}
        t0 = time.perf_counter()
        wall0 = time.time()
        base = dict(experiment=spec.name, variant=v.name, repeat=rep, block=block_i, workload=wl.name,
                    concurrency=arrival.concurrency, arrival=arrival.label(), **extra)

        def worker(client: int) -> None:
            while not stop.is_set():
                with lock:
                    j = next_job[0]
                    next_job[0] += 1
                if j >= len(jobs):
                    return
                idx, item = jobs[j]
                wait = t0 + release[j] - time.perf_counter()
                if wait > 0 and stop.wait(wait):
                    return
                t_release = t0 + release[j] if arrival.kind == "poisson" else time.perf_counter()
                replies: list[str] = []
                for turn in range(len(item.turns)):
                    if stop.is_set():
                        return
                    try:
                        row = self._one_request(eng, v, item, idx, turn, replies, client, t0, t_release, inflight)
                    except BaseException as exc:  # noqa: BLE001 - fatal: report, never hang the main thread
                        out_q.put(("fatal", exc))
                        return
                    row.update(base)
                    out_q.put(("row", row))
                    if row["error"]:
                        break  # later turns need this reply
                    replies.append(row["output_text"])
                    t_release = time.perf_counter()  # the next turn is released when the reply arrives

        threads = [threading.Thread(target=worker, args=(c,), name=f"colibri-client-{c}", daemon=True)
                   for c in range(n_workers)]
        for t in threads:
            t.start()
        brows: list[dict] = []
        fatal = None
        interrupted = False
        try:
            while any(t.is_alive() for t in threads) or not out_q.empty():
                try:
                    kind, payload = out_q.get(timeout=0.05)
                except queue.Empty:
                    continue
                if kind == "fatal":
                    fatal = payload
                    stop.set()
                    continue
                brows.append(payload)
                if bar is not None:
                    bar.update(1)
                if self.on_row is not None:
                    self.on_row(payload, rows_so_far + brows)
        except KeyboardInterrupt:
            interrupted = True
            stop.set()
            for h in list(inflight.values()):
                try:
                    h.cancel()
                except Exception:
                    pass
            for t in threads:
                t.join(timeout=5.0)
            while not out_q.empty():
                kind, payload = out_q.get_nowait()
                if kind == "row":
                    brows.append(payload)
        wall_s = time.perf_counter() - t0
        if fatal is not None:
            for t in threads:
                t.join(timeout=5.0)
            raise fatal
        bsteps = []
        for s in list(log):
            if s["step"] > last_step:
                d = dict(s)
                d["t_rel_s"] = d.pop("t", wall0) - wall0
                d.update(experiment=spec.name, variant=v.name, repeat=rep, block=block_i, **where)
                bsteps.append(d)
        info = dict(block=block_i, variant=v.name, repeat=rep, **where, t_start=wall0, wall_s=wall_s,
                    n_requests=len(brows), n_steps=len(bsteps),
                    completion_tokens=int(sum(r.get("completion_tokens", 0) or 0 for r in brows)))
        return brows, bsteps, info, interrupted

    def _one_request(self, eng, v: Variant, item: Item, idx: int, turn: int, replies: list[str],
                     client: int, t0: float, t_release: float, inflight: dict) -> dict:
        msgs = item.messages(turn, replies)
        ids = eng.tokenize(eng.apply_chat_template(msgs), add_special=False)
        seed = self.spec.seed + idx
        kw = self._request_kwargs(v, item, seed)
        conversation = f"{self.spec.name}/{item.id}"
        row: dict[str, Any] = dict(item_index=idx, prompt_id=item.id, group=item.group, turn=turn,
                                   n_turns=len(item.turns), seed=seed, client=client,
                                   t_release_s=t_release - t0, prompt_hash=tokens_hash(ids))
        t_sub = time.perf_counter()
        row["t_submit_s"] = t_sub - t0
        error = ""
        handle = None
        try:
            _, handle, _ = eng.submit(ids, conversation=conversation, **kw)
            inflight[id(handle)] = handle
            res = handle.result()
            tokens, m = res["tokens"], dict(res["metrics"])
        except Exception as exc:  # noqa: BLE001
            if _fatal(exc):
                raise
            # this request's own failure (e.g. its prompt exceeds the context): record it, go on
            tokens = list(handle.tokens) if handle is not None else []
            m = dict(handle.metrics or {}) if handle is not None else {}
            error = f"{type(exc).__name__}: {exc}"
            m.setdefault("finish_reason", "error")
        finally:
            if handle is not None:
                inflight.pop(id(handle), None)
        t_done = time.perf_counter()
        data = eng.model.detokenize_bytes(tokens) if tokens else b""
        if m.get("stop_offset", -1) is not None and m.get("stop_offset", -1) >= 0:
            data = data[:m["stop_offset"]]
        row.update(t_done_s=t_done - t0, client_ms=(t_done - t_release) * 1e3)
        for k, val in m.items():
            if isinstance(val, (int, float, str, bool, np.integer, np.floating)) or val is None:
                row[k] = val
        row.update(list_metric_columns(m))  # per-position / per-source draft counts as flat columns
        dn, da = m.get("draft_n", 0) or 0, m.get("draft_accepted", 0) or 0
        row["accept_rate"] = da / dn if dn else float("nan")
        sp = v.request.get("speculative")
        spec_k = sp.get("k_max") if isinstance(sp, dict) and not sp.get("adaptive", True) else None
        n_drafts = m.get("draft_steps") or (dn / spec_k if spec_k and dn else 0)
        row["accept_len_mean"] = m.get("accept_len_mean", 1.0 + da / n_drafts if n_drafts else float("nan"))
        row["output_hash"] = tokens_hash(tokens)
        row["output_tokens"] = " ".join(str(int(t)) for t in tokens)
        row["output_text"] = data.decode("utf-8", errors="replace")
        row["error"] = error
        return row


def run(spec: ExperimentSpec, **kw) -> Results:
    """Run a spec (Runner keywords: progress, on_row, engine_factory, engines, keep_engines, backend);
    a spec with a [serve] table goes over HTTP (serve_bench.ServeRunner keywords)."""
    if spec.is_serving:
        from colibri_lab.experiments.serve_bench import run_serving

        return run_serving(spec, **kw)
    return Runner(spec, **kw).run()


def run_spec(path, *, small: bool | None = None, overrides: dict | None = None, save: bool | str = True,
             results_root=None, **kw) -> Results:
    """Load a TOML spec, run it, and (save=True) save the results under
    <results_root or the spec's folder/results>/<name>/<timestamp>/.  The
    saved folder is results.path.  This is what `colibri-lab run` calls."""
    from pathlib import Path

    spec = load_spec(path, small=small, overrides=overrides)
    res = run(spec, **kw)
    if save:
        root = Path(results_root) if results_root is not None else Path(path).resolve().parent / "results"
        res.save(root=root)
    return res
