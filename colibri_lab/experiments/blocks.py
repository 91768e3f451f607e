"""One block of an experiment: a full pass of a workload (or one shard of it)
through one variant on one engine, recorded as rows.  This is the unit every
backend runs - in this process (runner.InProcess) or as Dask tasks
(distributed.py) - so a row means the same thing wherever it was measured.

Also here: the pieces both backends share (ABBA block order, the engine
cache with its warm-up, the progress bar, which errors end a run).
"""
from __future__ import annotations

import hashlib
import queue
import socket
import threading
import time
from typing import Any, Callable

import numpy as np

from colibri_lab import metrics as schema
from colibri_lab.decode import Decoder
from colibri_lab.errors import ContextLengthExceededError, InvalidRequestError
from colibri_lab.experiments.results import cpu_model
from colibri_lab.experiments.spec import ExperimentSpec, Variant
from colibri_lab.experiments.workloads import Item, ReleaseQueue, Workload

# Workbench switches in a variant's request settings that are not Engine.submit keywords.
_WORKBENCH_REQUEST_KEYS = ("use_schema",)
WARMUP_PROMPT = [{"role": "user", "content": "Warm-up: count from one to five."}]


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


def default_engine_factory(settings: dict):
    from colibri_lab.engine import Engine

    s = dict(settings)
    model = s.pop("model", "smollm2")
    return Engine(model, **s)


INPROCESS = "inprocess"   # the worker column of rows run in this process


def machine_columns(eng, worker: str) -> dict:
    """Columns naming where a row ran: the worker (a Dask worker address, or
    "inprocess"), the host, its CPU model and the SIMD path the engine used."""
    try:
        simd = str(eng.params.get("simd", ""))
    except Exception:
        simd = ""
    return {"worker": worker, "hostname": socket.gethostname(), "cpu_model": cpu_model(), "simd": simd}


def is_fatal(exc: BaseException) -> bool:
    """A rejected setting (InvalidRequestError, at submit or when the request
    reaches the engine) makes every request of the variant wrong: stop the run.
    A request that is merely too long for the context is that request's error."""
    return isinstance(exc, InvalidRequestError) and not isinstance(exc, ContextLengthExceededError)


class EngineCache:
    """Engines by engine settings (Variant.engine_key), each built with
    `factory` and warmed up with `warmup` unrecorded requests on a prompt
    outside the workload the first time a variant needs it.  `engines` may be
    a dict kept elsewhere (a Dask worker's, reused across tasks)."""

    def __init__(self, factory: Callable[[dict], Any] | None = None, warmup: int = 1,
                 engines: dict | None = None):
        self.factory = factory or default_engine_factory
        self.warmup = warmup
        self.engines: dict = engines if engines is not None else {}

    def get(self, v: Variant):
        key = v.engine_key()
        if key not in self.engines:
            eng = self.factory(dict(v.engine))
            self.engines[key] = eng
            if self.warmup > 0:
                ids = eng.tokenize(eng.apply_chat_template(WARMUP_PROMPT), add_special=False)
                for _ in range(self.warmup):
                    eng.generate(ids, max_tokens=4, temperature=0.0)
        return self.engines[key]

    def close(self) -> None:
        close_engines(self.engines)


def close_engines(engines: dict, keys=None) -> int:
    """Close and remove the engines of `engines` (those under `keys`, default
    all); returns how many.  Every one is closed even if one's close() fails;
    the first failure is raised after that."""
    first = None
    keys = list(engines) if keys is None else list(keys)
    for k in keys:
        eng = engines.pop(k)
        try:
            eng.close()
        except Exception as exc:  # noqa: BLE001 - re-raised below, after the others are closed
            first = first or exc
    if first is not None:
        raise first
    return len(keys)


def make_bar(total: int, desc: str, progress: bool = True):
    """A tqdm.auto progress bar (notebooks and terminals), or None when off or tqdm is missing."""
    if not progress:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="req", leave=True)


def _request_kwargs(v: Variant, item: Item, seed: int) -> dict:
    kw = {k: val for k, val in v.request.items() if k not in _WORKBENCH_REQUEST_KEYS}
    if v.request.get("use_schema") and item.schema is not None:
        kw["json_schema"] = item.schema
    if item.max_tokens is not None:
        kw["max_tokens"] = min(int(item.max_tokens), int(kw.get("max_tokens", item.max_tokens)))
    kw["seed"] = seed
    return kw

def run_block(spec: ExperimentSpec, workload: Workload, eng, v: Variant, rep: int, block_i: int, *,
              jobs: list[tuple[int, Item]] | None = None, extra: dict | None = None, bar=None,
              on_row: Callable[[dict, list], None] | None = None, rows_so_far: list = ()):
    """One pass of the workload - or of `jobs`, a list of (item index, item):
    one shard of it - through variant v; the `extra` columns go on every
    row (shard and worker also on steps and the block info).  Returns
    (rows, steps, block info, interrupted?)."""
    wl = workload
    rows_so_far = list(rows_so_far)
    arrival = v.arrival_obj()
    if spec.fresh_cache:
        eng.clear_cache()   # every block starts from the same (empty) cache
    log = eng.scheduler.step_log
    last_step = log[-1]["step"] if log else -1
    jobs = list(enumerate(wl.items)) if jobs is None else list(jobs)
    extra = dict(extra or {})
    where = {k: extra[k] for k in ("shard", "worker") if k in extra}
    n_workers = arrival.workers(len(jobs))
    stop = threading.Event()
    out_q: queue.Queue = queue.Queue()
    inflight: dict[int, Any] = {}
    t0 = time.perf_counter()
    pending = ReleaseQueue(jobs, arrival, t0)
    wall0 = time.time()
    base = dict(experiment=spec.name, variant=v.name, repeat=rep, block=block_i, workload=wl.name,
                concurrency=arrival.concurrency, arrival=arrival.label(), **extra)

    def worker(client: int) -> None:
        while not stop.is_set():
            job = pending.take(stop)
            if job is None:
                return
            idx, item, t_release = job
            replies: list[str] = []
            for turn in range(len(item.turns)):
                if stop.is_set():
                    return
                try:
                    row = _one_request(spec, eng, v, item, idx, turn, replies, client, t0, t_release, inflight)
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
            if on_row is not None:
                on_row(payload, rows_so_far + brows)
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

def _one_request(spec: ExperimentSpec, eng, v: Variant, item: Item, idx: int, turn: int, replies: list[str],
                 client: int, t0: float, t_release: float, inflight: dict) -> dict:
    msgs = item.messages(turn, replies)
    ids = eng.tokenize(eng.apply_chat_template(msgs), add_special=False)
    seed = spec.seed + idx
    kw = _request_kwargs(v, item, seed)
    conversation = f"{spec.name}/{item.id}"
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
        if is_fatal(exc):
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
    text = Decoder.decode(eng.model.token_bytes, tokens, m.get("stop_offset", -1)).text
    row.update(t_done_s=t_done - t0, client_ms=(t_done - t_release) * 1e3)
    for k in schema.REQUEST_COLUMNS:
        if k in m:
            row[k] = m[k]
    row.update(schema.flat_columns(m))  # per-position / per-source draft counts as flat columns
    row["output_hash"] = tokens_hash(tokens)
    row["output_tokens"] = " ".join(str(int(t)) for t in tokens)
    row["output_text"] = text
    row["error"] = error
    return row
