"""The Dask backend of the experiment runner, on a LocalCluster of 2 worker
processes (one thread each) and the tiny model:

  * a sweep returns the same rows as in-process (outputs token for token,
    identical column schema), with the worker's machine on every row;
  * an A/B pair (same repeat, prompt, turn, seed) never spans two workers;
  * a worker that dies mid-task loses no finished rows and its task is rerun
    on another worker; a task that raises is retried; a rejected setting is not;
  * `colibri-lab run SPEC --dask local:2` runs a TOML spec.
"""
import json
import os
import sys
import time

import pytest

pytest.importorskip("distributed")
import cloudpickle  # noqa: E402  (a dependency of distributed)
from distributed import Client, LocalCluster  # noqa: E402

from colibri_lab.errors import InvalidRequestError  # noqa: E402
from colibri_lab.experiments import ExperimentSpec, Variant, run, sweep  # noqa: E402
from colibri_lab.experiments.distributed import (  # noqa: E402
    DaskBackend, auto_shards, clear_worker_engines, current_task, parse_local, plan_tasks, run_task, shard_slices,
    use_backend,
)
from colibri_lab.experiments.runner import Runner  # noqa: E402
from colibri_lab.experiments.stats import PAIR_KEYS  # noqa: E402

# The engine factories below are defined in this module, which the worker
# processes cannot import: ship them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MACHINE_COLUMNS = ["worker", "hostname", "cpu_model", "simd", "shard"]
MINI = {"name": "mini6", "systems": {"s": "You are a tiny test model. Answer briefly."},
        "items": [{"id": f"p{i}", "group": "g", "system_ref": "s", "turns": [f"Question {i}?", "Why?"]}
                  for i in range(6)]}


def _spec(tiny, **kw):
    d = dict(name="mini6", workload=MINI, repeats=2, warmup=1, seed=7,
             engine={"model": str(tiny.path), "n_threads": 1, "n_ctx": 256, "n_slots": 2, "simd": "scalar"},
             request={"max_tokens": 6, "temperature": 0.8}, arrival={"concurrency": 2},
             variants=[Variant("off", engine={"prefix_reuse": False}), Variant("on", engine={"prefix_reuse": True})],
             lossless=True)
    d.update(kw)
    return ExperimentSpec(**d)


@pytest.fixture(scope="module")
def client():
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    c = Client(cluster)
    c.wait_for_workers(2, timeout=120)
    yield c
    c.close()
    cluster.close()


# Concurrency 1: which slot a request lands on - and so its prefix-cache hits -
# does not depend on which client thread wins a race, so whole rows compare.
ONE = {"concurrency": 1}


@pytest.fixture(scope="module")
def inprocess(make_tiny):
    tiny = make_tiny()
    return tiny, run(_spec(tiny, arrival=ONE), progress=False)


def _keyed(df):
    return df.sort_values(list(PAIR_KEYS) + ["variant"]).reset_index(drop=True)


def _claim(marker_dir: str | None, action: str) -> bool:
    """True for exactly one caller, in any process, once <dir>/<action> exists
    (it is removed); that caller records its task in <dir>/done."""
    if not marker_dir:
        return False
    try:
        os.unlink(os.path.join(marker_dir, action))   # atomic: one winner
    except FileNotFoundError:
        return False
    with open(os.path.join(marker_dir, "done"), "w") as f:
        json.dump(dict(current_task(), action=action, pid=os.getpid()), f)
    return True


class SlowEngine:
    """An Engine whose submit first sleeps and - in the one process that claims
    the marker <dir>/kill - ends its worker process in the middle of a task."""

    def __init__(self, eng, sleep_s: float, marker_dir: str | None):
        self._eng, self._sleep, self._dir = eng, sleep_s, marker_dir

    def __getattr__(self, name):
        return getattr(self._eng, name)

    def submit(self, *a, **kw):
        time.sleep(self._sleep)
        if _claim(self._dir, "kill"):
            os._exit(1)
        return self._eng.submit(*a, **kw)

    def close(self):
        self._eng.close()


def slow_factory(sleep_s: float, marker_dir: str | None = None):
    """Engines wrapped in SlowEngine; building one fails once (a task-level
    error, retried by dask) in the process that claims <dir>/raise."""
    def factory(settings):
        from colibri_lab.engine import Engine

        if _claim(marker_dir, "raise"):
            raise RuntimeError("injected failure while loading the model")
        s = dict(settings)
        return SlowEngine(Engine(s.pop("model"), **s), sleep_s, marker_dir)
    return factory


# ----------------------------------------------------------------- units
def test_planning_helpers():
    assert parse_local("local") == 2 and parse_local("local:3") == 3 and parse_local("tcp://h:8786") is None
    with pytest.raises(ValueError):
        parse_local("local:0")
    assert shard_slices(5, 2) == [[0, 1, 2], [3, 4]]
    assert shard_slices(2, 5) == [[0], [1]]
    assert sum(shard_slices(7, 3), []) == list(range(7))
    assert auto_shards(12, 1, 2, 1) == 4            # two tasks per worker
    assert auto_shards(12, 4, 2, 1) == 1            # repeats alone give enough tasks
    assert auto_shards(8, 1, 4, 4) == 2             # a slice keeps >= concurrency items


# ------------------------------------------------------------- same rows
def test_same_rows_as_inprocess(client, inprocess):
    tiny, a = inprocess
    b = run(_spec(tiny, arrival=ONE), backend=DaskBackend(client, shards=1), progress=False)
    assert not b.interrupted and len(b.requests) == len(a.requests) == 2 * 2 * 12
    # same schema, column for column, dtype for dtype - requests and steps
    assert list(b.requests.columns) == list(a.requests.columns)
    assert dict(b.requests.dtypes) == dict(a.requests.dtypes)
    assert list(b.steps.columns) == list(a.steps.columns)
    for c in MACHINE_COLUMNS:
        assert c in a.requests.columns
    A, B = _keyed(a.requests), _keyed(b.requests)
    # shards=1: every task is an in-process block, so even the cache hits agree
    for c in ["variant", "block", "item_index", "prompt_hash", "output_hash", "output_tokens", "output_text",
              "completion_tokens", "prompt_tokens", "cached_tokens", "finish_reason", "error"]:
        assert list(A[c]) == list(B[c]), c
    workers = set(client.scheduler_info()["workers"])
    assert set(b.requests["worker"]) <= workers and (a.requests["worker"] == "inprocess").all()
    assert (b.requests["simd"] == "scalar").all() and (b.requests["hostname"] != "").all()
    assert (b.requests["cpu_model"] == a.requests["cpu_model"]).all()
    m = b.meta
    assert m["backend"]["kind"] == "dask" and m["backend"]["n_tasks"] == 2 and a.meta["backend"]["kind"] == "inprocess"
    assert set(m["workers"]) == set(b.requests["worker"]) and not m["failed_tasks"]
    assert [blk["block"] for blk in m["blocks"]] == [blk["block"] for blk in a.meta["blocks"]]
    assert m["engines"]["on"]["model_sha256"] == a.meta["engines"]["on"]["model_sha256"]


def test_sharded_sweep_keeps_pairs_on_one_worker(client, inprocess):
    tiny, a = inprocess
    base = Variant("base", engine={"prefix_reuse": False})
    variants = sweep("engine.n_slots", [1, 2, 3], base=base)
    spec = _spec(tiny, variants=variants, repeats=2, baseline="n_slots=1")
    seen = []
    b = run(spec, backend=DaskBackend(client, shards=3), progress=False,
            on_row=lambda row, rows: seen.append(len(rows)))
    df = b.requests
    assert len(df) == 3 * 2 * 12 and seen == list(range(1, len(df) + 1))    # on_row: every row, in order
    assert b.meta["backend"]["n_tasks"] == 6 and set(df["shard"]) == {0, 1, 2}
    # pairs never split: every (repeat, prompt, turn, seed) ran all variants on one worker
    g = df.groupby(list(PAIR_KEYS))
    assert (g["worker"].nunique() == 1).all() and (g["variant"].nunique() == 3).all()
    assert df["worker"].nunique() == 2, "both workers should get tasks"
    # batch invariance across shards, slot counts and concurrency 2: the outputs of the in-process run
    ref = a.requests[a.requests.variant == "off"].set_index(list(PAIR_KEYS))["output_tokens"]
    for v, part in df.groupby("variant"):
        assert part.set_index(list(PAIR_KEYS))["output_tokens"].sort_index().equals(ref.sort_index()), v


# --------------------------------------------------------------- failures
def test_killed_worker_loses_no_rows_and_its_task_reruns(client, make_tiny, tmp_path):
    tiny = make_tiny()
    before: list[dict] = []
    first: dict = {}

    def on_row(row, rows):
        # once the first task is back, arm the kill: the next request on any worker ends its process
        if not first:
            first.update(repeat=row["repeat"], shard=row["shard"])
            (tmp_path / "kill").write_text("")
        if (row["repeat"], row["shard"]) == (first["repeat"], first["shard"]):
            before.append(dict(row))     # the rows of the task that finished before the kill

    spec = _spec(tiny, repeats=2)
    res = run(spec, backend=DaskBackend(client, shards=3), progress=False, on_row=on_row,
              engine_factory=slow_factory(0.05, str(tmp_path)))
    done = json.loads((tmp_path / "done").read_text())
    assert done["action"] == "kill" and done["key"], "no worker was killed: the sweep finished first"
    df = res.requests
    assert len(df) == 2 * 2 * 12 and (df["error"] == "").all()
    assert df.groupby(list(PAIR_KEYS) + ["variant"]).size().eq(1).all()
    # the killed task ran again, to completion, on another worker
    task = {t["key"]: t for t in res.meta["tasks"]}[done["key"]]
    assert task["worker"] != done["worker"] and task["n_rows"] == 2 * 2 * len(task["items"])
    rerun = df[(df.repeat == task["repeat"]) & (df.shard == task["shard"])]
    assert len(rerun) == task["n_rows"] and (rerun["worker"] == task["worker"]).all()
    # rows that were back before the kill are in the result, unchanged
    final = df.set_index(list(PAIR_KEYS) + ["variant"])
    assert len(before) == 2 * 2 * 2          # 2 variants x 2 items x 2 turns
    for r in before:
        got = final.loc[tuple(r[k] for k in list(PAIR_KEYS) + ["variant"])]
        assert got["output_hash"] == r["output_hash"] and got["worker"] == r["worker"]
        assert got["t_done_s"] == pytest.approx(r["t_done_s"])
    assert (df.groupby(list(PAIR_KEYS))["worker"].nunique() == 1).all()
    client.wait_for_workers(2, timeout=120)   # the nanny restarts the killed worker


def test_failed_task_is_retried(client, make_tiny, tmp_path):
    tiny = make_tiny()
    (tmp_path / "raise").write_text("")
    res = run(_spec(tiny, repeats=1), backend=DaskBackend(client, shards=2, retries=1), progress=False,
              engine_factory=slow_factory(0.0, str(tmp_path)))
    done = json.loads((tmp_path / "done").read_text())
    assert done["action"] == "raise" and done["key"] and not (tmp_path / "raise").exists()
    assert len(res.requests) == 2 * 12 and (res.requests["error"] == "").all() and not res.meta["failed_tasks"]


def test_rejected_setting_is_raised_not_retried(client, make_tiny):
    spec = _spec(make_tiny(), repeats=1, variants=[Variant("bad", request={"no_such_setting": 1})])
    # the task returns the error (a raised one would be retried) ...
    task = plan_tasks(Runner(spec), 1)[0]
    task.update(key="k", spec=spec)
    out = run_task(task)
    assert isinstance(out.get("fatal"), InvalidRequestError) and "rows" not in out
    clear_worker_engines()
    # ... and the client raises it, as in-process (the default backend set by use_backend)
    with pytest.raises(InvalidRequestError, match="no_such_setting"):
        with use_backend(DaskBackend(client, shards=2, retries=3)):
            run(spec, progress=False)


def test_interrupt_returns_finished_rows(client, make_tiny):
    seen = []

    def on_row(row, rows):
        seen.append(row)
        if len(seen) == 3:
            raise KeyboardInterrupt

    res = run(_spec(make_tiny(), repeats=2), backend=DaskBackend(client, shards=3), progress=False, on_row=on_row,
              engine_factory=slow_factory(0.02))
    assert res.interrupted and 3 <= len(res.requests) < 2 * 2 * 12
    assert len(res.requests) % 8 == 0          # whole tasks: 2 variants x 2 items x 2 turns


# -------------------------------------------------------------------- CLI
def test_cli_run_dask_local(make_tiny, tmp_path, monkeypatch, capsys, toml_spec):
    from colibri_lab.cli import main

    spec = toml_spec(make_tiny().path, MINI, n=4)
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(spec), "--dask", "local:2"]) == 0
    out = capsys.readouterr().out
    assert "results:" in out
    from colibri_lab.experiments import latest_results

    res = latest_results("x", root=tmp_path / "results")
    assert len(res.requests) == 2 * 8 and res.meta["backend"]["kind"] == "dask"
    assert res.requests["worker"].str.startswith("tcp://").all()
    assert (res.requests.groupby(list(PAIR_KEYS))["worker"].nunique() == 1).all()


def test_serving_spec_runs_on_dask(client, make_tiny):
    """A [serve] spec on Dask: one task per repeat starts our server on the
    worker's loopback; one row per request, each repeat (so each A/B pair)
    on one worker, and the server's /metrics deltas match each block."""
    tiny = make_tiny()
    spec = _spec(tiny, arrival={}, request={"max_tokens": 4, "temperature": 0.0}, lossless=False,
                 serve={"kind": "colibri", "model_id": "tiny"},
                 variants=[Variant("r=20", arrival={"rate": 20.0}), Variant("r=40", arrival={"rate": 40.0})])
    res = run(spec, backend=client, progress=False)
    df = res.requests
    assert len(df) == 2 * 2 * 12 and (df["error"] == "").all(), df["error"].unique()
    assert res.meta["backend"]["kind"] == "dask" and df["worker"].str.startswith("tcp://").all()
    assert df.groupby("repeat")["worker"].nunique().eq(1).all()
    for b in res.meta["blocks"]:
        rows = df[df["block"] == b["block"]]
        assert b["metrics_delta"]["request_success"] == len(rows)
        assert b["metrics_delta"]["generation_tokens"] == rows["completion_tokens"].sum()
    assert list(df.groupby("block")["variant"].first()) == ["r=20", "r=40", "r=40", "r=20"]   # ABBA
