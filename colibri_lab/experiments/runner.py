"""The runner: send a workload through every variant, interleaved, and record
one row per request and one row per engine step.

Procedure (warm up, interleave, pair, compare medians):
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

Backends: a backend is anything with `execute(runner) -> Results`.  By default
everything runs in this process (InProcess).  `backend=` (a dask Client, a
scheduler address, "local" / "local:N", or a DaskBackend) runs the same
procedure as tasks on a Dask cluster instead - see
colibri_lab.experiments.distributed and docs/distributed.md.  Both call the
one block runner, blocks.run_block.  Every row carries
the machine it ran on (worker, hostname, cpu_model, simd) and its shard of the
workload (0 in-process), so the table has the same columns on every backend.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Protocol

from colibri_lab.experiments.blocks import (  # noqa: F401  (re-exported)
    INPROCESS,
    EngineCache,
    block_order,
    default_engine_factory,
    machine_columns,
    make_bar,
    run_block,
    tokens_hash,
)
from colibri_lab.experiments.results import Results, collect_metadata, engine_metadata, load_average
from colibri_lab.experiments.numerics import run_numerics
from colibri_lab.experiments.spec import ExperimentSpec, Variant, load_spec
from colibri_lab.experiments.workloads import Workload, load_workload


class Backend(Protocol):
    """Where and how the blocks of a run execute."""

    def execute(self, runner: "Runner") -> Results: ...


class Runner:
    """Runs an ExperimentSpec.

    progress: show a tqdm.auto bar (works in notebooks and terminals; silently
      off when tqdm is missing).
    on_row(row: dict, results_so_far: list[dict]): called on the main thread
      after every finished request (live widgets use it).
    engine_factory(settings) -> Engine: how engines are built (tests inject).
    keep_engines: do not close the engines at the end (reuse them for another
      run through `engines=`); the caller closes them.
    backend: None / "inprocess" (default: this process, as always), a Backend,
      or a Dask backend: a distributed.Client, a scheduler address
      "tcp://host:8786", "local" / "local:N" (start a LocalCluster with N
      worker processes) or a colibri_lab.experiments.distributed.DaskBackend
      (shards=, retries=).  None also honours a default set by
      `with distributed.use_backend(...)`.  On a Dask backend `engines` /
      `keep_engines` do not apply: every worker process keeps its own engines.
    """

    def __init__(self, spec: ExperimentSpec, *, progress: bool = True,
                 on_row: Callable[[dict, list], None] | None = None,
                 engine_factory: Callable[[dict], Any] | None = None,
                 engines: dict | None = None, keep_engines: bool = False, backend: Any = None):
        self.spec = spec
        self.backend = backend
        self.progress = progress
        self.on_row = on_row
        self.engine_factory = engine_factory or default_engine_factory
        self.cache = EngineCache(self.engine_factory, spec.warmup, engines)
        self._own_engines = engines is None and not keep_engines
        self.workload: Workload = load_workload(spec.workload, spec.workload_n, spec.workload_turns,
                                                spec.workload_order)
        self.variants: list[Variant] = spec.resolved_variants()

    @property
    def engines(self) -> dict:
        return self.cache.engines

    def engine_for(self, v: Variant):
        return self.cache.get(v)

    def close(self) -> None:
        self.cache.close()

    def run(self) -> Results:
        try:
            res = resolve_backend(self.backend).execute(self)
            if self.spec.numerics and not res.interrupted:  # the numerics pass runs here, in this process
                res.numerics = Results.numerics_frame(run_numerics(self, res.requests.to_dict("records")))
            return res
        finally:
            if self._own_engines:
                self.close()


class InProcess:
    """Every block in this process, one after the other, in ABBA order."""

    def execute(self, runner: Runner) -> Results:
        spec, wl = runner.spec, runner.workload
        order = block_order([v.name for v in runner.variants], spec.repeats)
        by_name = {v.name: v for v in runner.variants}
        rows: list[dict] = []
        steps: list[dict] = []
        blocks: list[dict] = []
        engines_meta: dict = {}
        bar = make_bar(len(order) * wl.n_requests, spec.name, runner.progress)
        interrupted = False
        started = time.time()
        load_before = load_average()
        try:
            for block_i, (rep, vname) in enumerate(order):
                v = by_name[vname]
                eng = runner.engine_for(v)
                if vname not in engines_meta:
                    engines_meta[vname] = engine_metadata(eng)
                if bar is not None:
                    bar.set_description(f"{vname} r{rep}")
                extra = dict(machine_columns(eng, INPROCESS), shard=0)
                brows, bsteps, binfo, stop = run_block(spec, wl, eng, v, rep, block_i, extra=extra, bar=bar,
                                                       on_row=runner.on_row, rows_so_far=rows)
                rows += brows
                steps += bsteps
                blocks.append(binfo)
                if stop:
                    interrupted = True
                    break
        except KeyboardInterrupt:
            interrupted = True
        finally:
            if bar is not None:
                bar.close()
        meta = collect_metadata(spec, runner.variants, engines_meta, load_before=load_before)
        meta.update(blocks=blocks, interrupted=interrupted, started=started, finished=time.time(),
                    workload_items=len(wl), workload_requests=wl.n_requests, backend={"kind": INPROCESS})
        res = Results.from_rows(rows, steps, meta)
        return res


def resolve_backend(backend) -> Backend:
    """The Backend for a Runner's `backend=` (see Runner)."""
    if backend is None:
        from colibri_lab.experiments import distributed   # no dask import unless a Dask backend is used

        backend = distributed.default_backend()
    if backend is None or (isinstance(backend, str) and backend == INPROCESS):
        return InProcess()
    if hasattr(backend, "execute"):
        return backend
    from colibri_lab.experiments import distributed

    return distributed.as_backend(backend)


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
