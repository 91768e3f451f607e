"""Run an experiment on a Dask cluster (optional extra: pip install colibri-lab[distributed]).

    from dask.distributed import Client, LocalCluster
    from colibri_lab.experiments import run, load_spec
    client = Client(LocalCluster(n_workers=2, threads_per_worker=1, processes=True))
    res = run(load_spec("experiments/tour.toml"), backend=client)
    # or: run(spec, backend="local:2"), run(spec, backend="tcp://scheduler:8786"),
    #     colibri-lab run experiments/tour.toml --dask local:2

How the in-process procedure (runner.py) maps onto tasks:

  * one task per (repeat, shard).  A shard is a contiguous slice of the
    workload's items; the task runs *every* variant over that slice, one block
    per variant in the repeat's ABBA position, on one worker.  So the rows of an
    A/B pair - same repeat, prompt, turn and seed, different variant - always
    come from the same machine: ratios compare timings taken on one machine.
    Block numbers, seeds (seed + item index) and the per-block cache clearing
    are those of the in-process run; with one shard a task's blocks are exactly
    the in-process blocks.  More shards give more parallelism but split a
    block's workload: prefix-cache hits and the load a concurrency level
    reaches are then per shard.
  * each worker process keeps its engines in a module-level cache keyed by the
    engine settings (and the engine factory), builds and warms an engine the
    first time a task needs it, and reuses it for every later task; models are
    resolved on the worker (an alias is pulled into the worker's cache, a path
    must exist there).  A worker runs one task at a time (a process lock), so
    two tasks never share an engine or the CPU; start workers with
    threads_per_worker=1.
  * tasks are submitted with `retries=` (a task that raised is run again) and a
    task whose worker dies is rescheduled by Dask on another worker; the rows
    of a task are gathered as soon as it finishes (as_completed), so rows
    already back are never lost.  A rejected setting (InvalidRequestError) is
    not retried: it cancels the run and is raised, as in-process.
  * every row carries worker (address), hostname, cpu_model, simd (the engine's
    kernel path) and shard; meta["workers"] describes each worker's machine and
    meta["tasks"] which worker ran which task.

Progress (tqdm) and on_row work as in-process, row by row as tasks come back.
Ctrl-C cancels the tasks not yet finished and returns the rows so far, with
meta["interrupted"] = True.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import os
import socket
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

from colibri_lab.experiments.blocks import (
    EngineCache,
    block_order,
    close_engines,
    default_engine_factory,
    is_fatal,
    machine_columns,
    make_bar,
    run_block,
)
from colibri_lab.experiments.results import engine_metadata
from colibri_lab.experiments.workloads import load_workload

# Nothing from dask is imported at module level: dask is an optional extra.

# ------------------------------------------------------------------ defaults
_DEFAULT: contextvars.ContextVar[Any] = contextvars.ContextVar("colibri_lab_backend", default=None)


def default_backend():
    """The backend set by `use_backend` (None: in-process)."""
    return _DEFAULT.get()


@contextlib.contextmanager
def use_backend(backend):
    """Make `backend` the default of every run in this block (e.g. for a
    widget that builds its own Runner):  with use_backend(client): live.run()"""
    tok = _DEFAULT.set(backend)
    try:
        yield backend
    finally:
        _DEFAULT.reset(tok)


def _import_distributed():
    try:
        import distributed  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the Dask backend needs dask.distributed: pip install 'colibri-lab[distributed]' "
                          "(or pip install 'dask[distributed]')") from exc
    return distributed


class TaskFailedError(RuntimeError):
    """A task still failed after its retries.  `.results` holds every row that
    did come back (nothing finished is lost); `.failures` the failed tasks."""

    def __init__(self, msg: str, results=None, failures=None):
        super().__init__(msg)
        self.results = results
        self.failures = failures or []


# ------------------------------------------------------------------ backend
def parse_local(address: str) -> int | None:
    """"local" -> 2 workers, "local:N" -> N workers; anything else -> None."""
    if address == "local":
        return 2
    if address.startswith("local:"):
        n = address.split(":", 1)[1]
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"local cluster size must be a positive integer: {address!r}")
        return int(n)
    return None


@dataclass
class DaskBackend:
    """A Dask client plus how to split the work.

    client: a distributed.Client.
    shards: workload slices per repeat ("auto": enough tasks for about two per
      worker, with each slice holding at least as many items as the highest
      concurrency, so the concurrency is still reached; 1: each task is a full
      in-process repeat).
    retries: times a task that raised is run again (dask `retries=`).
    own: close the client (and its cluster) after the run - set when this
      module started them (a "local" or address string).
    """

    client: Any
    shards: int | str = "auto"
    retries: int = 2
    own: bool = False
    cluster: Any = field(default=None, repr=False)

    @classmethod
    def local(cls, n_workers: int = 2, *, shards: int | str = "auto", retries: int = 2, **cluster_kw) -> "DaskBackend":
        """Start a LocalCluster of n_workers processes with one thread each."""
        _import_distributed()
        from distributed import Client, LocalCluster

        # dashboard on a free port (":0"), so that a second cluster never fights over 8787
        kw = dict(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=":0")
        kw.update(cluster_kw)
        cluster = LocalCluster(**kw)
        client = Client(cluster)
        client.wait_for_workers(n_workers, timeout=120)
        return cls(client, shards=shards, retries=retries, own=True, cluster=cluster)

    @classmethod
    def connect(cls, address: str, **kw) -> "DaskBackend":
        """A Client of the scheduler at `address` ("tcp://host:8786"), closed after the run."""
        _import_distributed()
        from distributed import Client

        return cls(Client(address), own=True, **kw)

    def execute(self, runner) -> "Results":
        """Run `runner`'s spec as tasks on this cluster (the Backend interface)."""
        try:
            return _run(runner, self)
        finally:
            self.close()

    def close(self) -> None:
        if not self.own:
            return
        try:
            self.client.close()
        finally:
            if self.cluster is not None:
                self.cluster.close()

    def n_workers(self) -> int:
        try:
            info = self.client.scheduler_info(n_workers=-1)   # newer dask lists only 5 workers by default
        except Exception:   # older dask: no n_workers keyword (it lists them all)
            info = self.client.scheduler_info()
        return max(1, len(info.get("workers", {})))


def as_backend(backend) -> DaskBackend:
    """A DaskBackend from a DaskBackend, a Client, "local", "local:N" or a scheduler address."""
    if isinstance(backend, DaskBackend):
        return backend
    if isinstance(backend, str):
        n = parse_local(backend)
        return DaskBackend.local(n) if n is not None else DaskBackend.connect(backend)
    distributed = _import_distributed()
    if isinstance(backend, distributed.Client):
        return DaskBackend(backend)
    raise TypeError(f"backend must be None, 'inprocess', 'local', 'local:N', a scheduler address, "
                    f"a distributed.Client or a DaskBackend; got {type(backend).__name__}")


# --------------------------------------------------------------- planning
def shard_slices(n_items: int, shards: int) -> list[list[int]]:
    """Contiguous, nearly equal slices of range(n_items), at most `shards` of them, none empty."""
    shards = max(1, min(int(shards), n_items)) if n_items else 1
    out, start = [], 0
    for s in range(shards):
        size = n_items // shards + (1 if s < n_items % shards else 0)
        out.append(list(range(start, start + size)))
        start += size
    return [x for x in out if x] or [[]]


def auto_shards(n_items: int, repeats: int, n_workers: int, max_concurrency: int) -> int:
    """About two tasks per worker, but every slice at least `max_concurrency` items long."""
    want = math.ceil(2 * n_workers / max(1, repeats))
    cap = max(1, n_items // max(1, max_concurrency))
    return max(1, min(want, cap))


def plan_tasks(runner, shards: int) -> list[dict]:
    """The tasks of a run: one per (repeat, shard), each with its blocks
    [(block index, variant name)] in ABBA order and its item indices."""
    names = [v.name for v in runner.variants]
    order = block_order(names, runner.spec.repeats)
    slices = shard_slices(len(runner.workload.items), shards)
    tasks = []
    for rep in range(runner.spec.repeats):
        blocks = [(i, n) for i, (r, n) in enumerate(order) if r == rep]
        for s, items in enumerate(slices):
            tasks.append({"repeat": rep, "shard": s, "blocks": blocks, "items": items})
    return tasks


# ----------------------------------------------------------- worker side
# Engines of this worker process: {factory key: {engine key: Engine}}.  Kept
# between tasks, so a model is loaded (and warmed up) once per worker process.
_ENGINES: dict[str, dict] = {}
# One task at a time per process: tasks never share an engine or the cores.
_TASK_LOCK = threading.Lock()
MAX_ENGINES = int(os.environ.get("COLIBRI_LAB_DASK_MAX_ENGINES", "4"))   # per worker process
# The task this process is running: {"key", "worker"} (None between tasks).
# Readable from any thread, unlike distributed.get_worker() - e.g. from an
# engine factory's wrapper, or a log line.
_CURRENT: dict = {"key": None, "worker": None}


def current_task() -> dict:
    """{"key": task key, "worker": worker address} of the task this worker process runs now."""
    return dict(_CURRENT)


def factory_key(factory) -> str:
    """Names an engine factory for the worker caches (computed on the client):
    "default", the factory's own `cache_key` attribute, or a hash of its
    pickle - so two closures of one function with different arguments never
    share engines."""
    if factory is None:
        return "default"
    own = getattr(factory, "cache_key", None)
    if own is not None:
        return str(own)
    import hashlib

    import cloudpickle

    return hashlib.sha1(cloudpickle.dumps(factory)).hexdigest()[:16]


def worker_info(address: str) -> dict:
    """The machine a worker runs on (results.machine_info, with the worker's address, host and pid)."""
    from colibri_lab.experiments.results import machine_info

    return {"address": address, "hostname": socket.gethostname(), "pid": os.getpid(), **machine_info()}


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except Exception:  # not inside a worker (called directly in tests)
        return f"pid:{os.getpid()}"


def _evict(fkey: str, keep: set) -> None:
    """Close engines beyond MAX_ENGINES in this process: first those of other
    factories, then this factory's least recently used, never one in `keep`."""
    def n_engines():
        return sum(len(c) for c in _ENGINES.values())

    others = [(f, k) for f, c in _ENGINES.items() if f != fkey for k in c]
    mine = [(fkey, k) for k in _ENGINES.get(fkey, {}) if k not in keep]
    for f, k in others + mine:
        if n_engines() <= MAX_ENGINES:
            return
        close_engines(_ENGINES[f], [k])


def run_task(task: dict) -> dict:
    """Run one task on this worker: every block of task["blocks"] over the items
    task["items"] of the shipped spec.  Returns its rows, steps, block infos,
    engine metadata and the worker's machine; a rejected setting comes back as
    {"fatal": exc} (not raised, so that it is not retried)."""
    with _TASK_LOCK:
        address = _worker_address()
        _CURRENT.update(key=task["key"], worker=address)
        spec = task["spec"]
        fkey = task.get("factory_key", "default")
        cache = EngineCache(task.get("engine_factory"), spec.warmup, _ENGINES.setdefault(fkey, {}))
        variants = spec.resolved_variants()
        workload = load_workload(spec.workload, spec.workload_n, spec.workload_turns, spec.workload_order)
        by_name = {v.name: v for v in variants}
        jobs = [(i, workload.items[i]) for i in task["items"]]
        rows, steps, blocks, engines = [], [], [], {}
        used = set()
        try:
            for block_i, vname in task["blocks"]:
                v = by_name[vname]
                eng = cache.get(v)
                used.add(v.engine_key())
                cache.engines[v.engine_key()] = cache.engines.pop(v.engine_key())   # most recently used last
                engines.setdefault(vname, engine_metadata(eng))
                extra = dict(machine_columns(eng, address), shard=task["shard"])
                brows, bsteps, binfo, _ = run_block(spec, workload, eng, v, task["repeat"], block_i,
                                                    jobs=jobs, extra=extra)
                rows += brows
                steps += bsteps
                binfo["task"] = task["key"]
                blocks.append(binfo)
        except Exception as exc:
            if is_fatal(exc):
                return {"key": task["key"], "fatal": exc}
            raise
        finally:
            _evict(fkey, used)
            _CURRENT.update(key=None, worker=None)
        return {"key": task["key"], "rows": rows, "steps": steps, "blocks": blocks, "engines": engines,
                "worker": worker_info(address)}


def clear_worker_engines() -> int:
    """Close this worker process's cached engines (client.run(clear_worker_engines))."""
    return sum(close_engines(cache) for cache in _ENGINES.values())


# ----------------------------------------------------------- client side
def _max_concurrency(variants) -> int:
    c = 1
    for v in variants:
        a = v.arrival_obj()
        c = max(c, a.concurrency if a.concurrency else 1)
    return c


def run_distributed(runner, backend):
    """Run `runner`'s spec on a Dask backend (see the module docstring); returns Results."""
    return as_backend(backend).execute(runner)


def _run(runner, be: DaskBackend):
    from distributed import as_completed

    from colibri_lab.experiments.results import Results, collect_metadata, load_average

    spec, wl = runner.spec, runner.workload
    n_workers = be.n_workers()
    if be.shards == "auto":
        shards = auto_shards(len(wl.items), spec.repeats, n_workers, _max_concurrency(runner.variants))
    else:
        shards = int(be.shards)
        if shards < 1:
            raise ValueError("shards must be >= 1")
    # Ship the workload itself (already cut and ordered): workers need no file of it.
    shipped = replace(spec, workload=wl, workload_n=None, workload_turns=None, workload_order=None)
    # The default factory is resolved on the worker itself; a custom one is pickled (cloudpickle) to it.
    factory = None if runner.engine_factory is default_engine_factory else runner.engine_factory
    run_id = uuid.uuid4().hex[:8]
    tasks = plan_tasks(runner, shards)
    fkey = factory_key(factory)
    for t in tasks:
        t.update(key=f"colibri-{spec.name}-{run_id}-r{t['repeat']}-s{t['shard']}", spec=shipped,
                 engine_factory=factory, factory_key=fkey)
    position = {t["key"]: i for i, t in enumerate(tasks)}
    total = len(runner.variants) * spec.repeats * wl.n_requests
    bar = make_bar(total, spec.name, runner.progress)
    started = time.time()
    load_before = load_average()     # of the client's machine; each worker's is in meta["workers"]
    client = be.client
    futures = {t["key"]: client.submit(run_task, t, key=t["key"], pure=False, retries=be.retries) for t in tasks}
    done: dict[str, dict] = {}
    rows_so_far: list[dict] = []
    failures: list[dict] = []
    interrupted = False
    fatal = None
    ac = as_completed(list(futures.values()))
    try:
        for fut in ac:
            # Drop our reference at once: a gathered result must not be recomputed
            # when the worker that holds it dies later.
            futures.pop(fut.key, None)
            if fut.status == "error":
                failures.append({"key": fut.key, "error": repr(fut.exception())})
                continue
            if fut.status == "cancelled":
                continue
            out = fut.result()
            fut.release()
            if "fatal" in out:
                fatal = out["fatal"]
                break
            done[out["key"]] = out
            if bar is not None:
                bar.set_description(f"{spec.name} {len(done)}/{len(tasks)} tasks")
            for row in out["rows"]:
                rows_so_far.append(row)
                if bar is not None:
                    bar.update(1)
                if runner.on_row is not None:
                    runner.on_row(row, rows_so_far)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bar is not None:
            bar.close()
        ac.clear()
        if futures:   # interrupted or fatal: stop what has not finished
            client.cancel(list(futures.values()))
        futures.clear()
    if fatal is not None:
        raise fatal
    # Deterministic order: the in-process block order, shards in order, rows as they finished.
    outs = sorted(done.values(), key=lambda o: position[o["key"]])
    rows = sorted((r for o in outs for r in o["rows"]), key=lambda r: (r["block"], r["shard"]))
    steps = sorted((s for o in outs for s in o["steps"]), key=lambda s: (s["block"], s["shard"]))
    blocks = sorted((b for o in outs for b in o["blocks"]), key=lambda b: (b["block"], b["shard"]))
    engines_meta: dict = {}
    workers: dict = {}
    for o in outs:
        for vname, em in o["engines"].items():
            engines_meta.setdefault(vname, em)
            if em.get("model_sha256") != engines_meta[vname].get("model_sha256"):
                warnings.warn(f"variant {vname!r}: workers loaded different model files "
                              f"({engines_meta[vname].get('model_path')} vs {em.get('model_path')} on "
                              f"{o['worker']['address']}); see meta['workers']", RuntimeWarning, stacklevel=3)
        w = workers.setdefault(o["worker"]["address"], dict(o["worker"], models={}))
        w["models"].update({vname: em.get("model_sha256", "") for vname, em in o["engines"].items()})
    meta = collect_metadata(spec, runner.variants, engines_meta, load_before=load_before)
    meta.update(blocks=blocks, interrupted=interrupted, started=started, finished=time.time(),
                workload_items=len(wl), workload_requests=wl.n_requests,
                backend={"kind": "dask", "scheduler": getattr(client.scheduler, "address", str(client.scheduler)),
                         "n_workers": n_workers, "shards": len(tasks) // spec.repeats,
                         "retries": be.retries, "n_tasks": len(tasks)},
                workers=workers,
                tasks=[{"key": o["key"], "repeat": tasks[position[o["key"]]]["repeat"],
                        "shard": tasks[position[o["key"]]]["shard"], "items": tasks[position[o["key"]]]["items"],
                        "worker": o["worker"]["address"], "hostname": o["worker"]["hostname"],
                        "n_rows": len(o["rows"])} for o in outs],
                failed_tasks=failures)
    res = Results.from_rows(rows, steps, meta)
    if failures:
        raise TaskFailedError(f"{len(failures)} of {len(tasks)} tasks failed after {be.retries} retries: "
                              + "; ".join(f"{f['key']}: {f['error']}" for f in failures[:3]),
                              results=res, failures=failures)
    return res
