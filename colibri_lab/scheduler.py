"""One thread owns the engine; callers from any thread submit requests.

The owner thread loops: hand newly submitted requests to the C engine (FIFO),
run one `step()` with the GIL released, and route the events to each
request's handle.  A request is a `RequestHandle`: iterate it for events, or
call `result()` for the whole completion.  Admission is FIFO; a conversation
key pins a conversation to the slot it used last, so the next turn reuses its
KV prefix.  The waiting queue is bounded: past `max_queue` requests, submit
raises QueueFullError at once instead of letting latency grow without limit.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field

from colibri_lab import metrics as schema
from colibri_lab.errors import ColibriError, EngineError, InvalidRequestError, QueueFullError, from_status
from colibri_lab.params import RequestParams

_DRAIN_WINDOW_S = 60.0  # Retry-After is computed from completions in this window


@dataclass
class _Pending:
    tokens: list
    params: RequestParams
    handle: "RequestHandle"
    conversation: str | None
    t_submit: float = field(default_factory=time.perf_counter)


@dataclass
class _Active:
    handle: "RequestHandle"
    py_queue_ms: float           # Scheduler.submit -> handed to C
    conversation: str | None
    token_times: list = field(default_factory=list)   # perf_counter of each token event


class RequestHandle:
    """A submitted request: its events, and its final result.

    Events go to the `sink` given at submit (a callable run on the scheduler's
    thread, which must not block), or, without one, to a queue that iterating
    the handle reads."""

    def __init__(self, scheduler: "Scheduler", sink=None):
        self._scheduler = scheduler
        self._sink = sink
        self._events: queue.SimpleQueue | None = queue.SimpleQueue() if sink is None else None
        self._done = threading.Event()
        self.id: int | None = None  # engine request id once submitted to C
        self.tokens: list[int] = []
        self.logprobs: list[dict] = []
        self.scores: list[dict] = []  # "score" events of a scoring request, in prompt order
        self.metrics: dict | None = None
        self.error: Exception | None = None
        self.cancelled = False

    def __iter__(self):
        """Yield event dicts ({"type": "token"|"score"|"done"|"error", ...}) until the request ends."""
        if self._events is None:
            raise ColibriError("this request's events go to the sink it was submitted with")
        while True:
            ev = self._events.get()
            yield ev
            if ev["type"] in ("done", "error"):
                return

    def cancel(self) -> None:
        """Ask the engine to stop this request; it ends with finish_reason 'cancelled'."""
        self.cancelled = True
        self._scheduler._cancel(self)

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def result(self, timeout: float | None = None) -> dict:
        """Block until done; returns {"tokens", "logprobs", "scores", "metrics"} or raises the request's error."""
        if not self._done.wait(timeout):
            raise TimeoutError("request did not finish in time")
        if self.error is not None:
            raise self.error
        return {"tokens": list(self.tokens), "logprobs": list(self.logprobs), "scores": list(self.scores),
                "metrics": dict(self.metrics)}

    # called on the owner thread
    def _deliver(self, ev: dict) -> None:
        if ev["type"] == "token":
            self.tokens.append(ev["token"])
            self.logprobs.append({"token": ev["token"], "logprob": ev["logprob"], "top": ev.get("top", [])})
        elif ev["type"] == "score":
            self.scores.append(ev)
        elif ev["type"] == "done":
            self.metrics = ev["metrics"]
        elif ev["type"] == "error" and self.error is None:
            self.error = from_status(ev["status"], ev["message"], event=True)
        if ev["type"] in ("done", "error") and not self._done.is_set():
            self._scheduler._release()
        if self._sink is not None:
            try:
                self._sink(ev)
            except Exception:  # a broken sink must not stop the engine for everyone else
                traceback.print_exc()
        else:
            self._events.put(ev)
        if ev["type"] in ("done", "error"):
            self._done.set()

    def _fail(self, exc: Exception) -> None:
        """End the request with an error raised outside the engine (refused at
        submit, engine failure, scheduler closed)."""
        self.error = exc
        self._deliver({"type": "error", "id": self.id, "status": None, "message": str(exc)})


class Scheduler:
    """Drives a `colibri_lab._engine.Engine` from a dedicated thread.

    step_log keeps the per-step profile of the last `step_log_size` steps
    (colibri_lab.metrics.STEP) for experiments and the server's /profile."""

    def __init__(self, core, max_queue: int = 256, step_log_size: int = 4096):
        self._core = core
        self._n_slots = core.params["n_slots"]
        self._max_queue = max_queue
        self._incoming: collections.deque[_Pending] = collections.deque()
        self._active: dict[int, _Active] = {}
        self._to_cancel: list[RequestHandle] = []
        self._calls: list[tuple] = []  # (fn, done Event, result box) run on the owner thread
        self._conversation_slot: dict[str, int] = {}
        self._after: list = []   # after_step callables, run on the owner thread once a step's events are out
        self._done_times: collections.deque[float] = collections.deque(maxlen=256)  # drain-rate window
        self._outstanding = 0   # submitted and not yet finished (queued in Python or C, or running)
        self._cv = threading.Condition()
        self._closed = False
        self.step_log: collections.deque[dict] = collections.deque(maxlen=step_log_size)
        self.finished: collections.deque[dict] = collections.deque(maxlen=step_log_size)
        self._thread = threading.Thread(target=self._loop, name="colibri-scheduler", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- API
    def submit(self, tokens, params: RequestParams | None = None, conversation: str | None = None, sink=None,
               **kw) -> RequestHandle:
        """Queue a request (a RequestParams, or its fields as keywords).  Raises
        QueueFullError when full.  sink(event) receives the request's events on
        the scheduler thread (see RequestHandle)."""
        if params is None:
            params = RequestParams.from_kwargs(**kw)
        elif kw:
            raise ColibriError("give either a RequestParams or keywords, not both")
        handle = RequestHandle(self, sink)
        with self._cv:
            if self._closed:
                raise ColibriError("scheduler is closed")
            self._check_room(1)
            self._incoming.append(_Pending(list(tokens), params, handle, conversation))
            self._outstanding += 1
            self._cv.notify()
        return handle

    def admit(self, n: int) -> None:
        """Check that n requests submitted now would all be accepted (a request
        with n choices): raises InvalidRequestError when n could never fit
        (more than the slots plus the whole queue), QueueFullError (with a
        `retry_after` in seconds) when they do not fit now."""
        if n > self._n_slots + self._max_queue:
            raise InvalidRequestError(f"{n} sequences can never be scheduled: the server runs {self._n_slots} at once "
                                      f"and queues at most {self._max_queue} more")
        with self._cv:
            self._check_room(n)

    @property
    def n_waiting(self) -> int:
        """Requests that will not get a slot at the next step (submitted but beyond the free slots)."""
        with self._cv:
            return self._waiting_locked()

    @property
    def n_running(self) -> int:
        """Requests holding (or about to take) a KV slot."""
        with self._cv:
            return min(self._outstanding, self._n_slots)

    def _waiting_locked(self) -> int:
        # a request waits only when no slot is free for it: everything in flight
        # (handed to C or about to be) beyond the slots is waiting
        return max(0, self._outstanding - self._n_slots)

    def _release(self) -> None:
        with self._cv:
            self._outstanding -= 1
            self._done_times.append(time.perf_counter())

    def _check_room(self, n: int) -> None:
        waiting = self._waiting_locked()
        over = self._outstanding + n - self._n_slots - self._max_queue
        if over > 0:
            err = QueueFullError(f"queue full: {waiting} requests waiting (max_queue={self._max_queue}); retry later")
            err.retry_after = self._retry_after_locked(over)
            raise err

    def _retry_after_locked(self, ahead: int) -> int:
        """Seconds until `ahead` more requests will have finished, at the completion
        rate measured over the last minute (1 s when nothing finished yet)."""
        now = time.perf_counter()
        times = [t for t in self._done_times if now - t <= _DRAIN_WINDOW_S]
        if len(times) < 2:
            return 1
        rate = len(times) / max(now - times[0], 1e-3)   # completions per second, idle time included
        return max(1, min(300, math.ceil(ahead / rate)))

    @property
    def queue_depth(self) -> int:
        with self._cv:
            return len(self._incoming)

    @property
    def n_active(self) -> int:
        with self._cv:
            return len(self._active)

    def call(self, fn, timeout: float | None = 60.0):
        """Run fn(core) on the owner thread between steps and return its result
        (the core is not thread-safe; this is how other threads touch it)."""
        done, box = threading.Event(), {}
        with self._cv:
            if self._closed:
                raise ColibriError("scheduler is closed")
            self._calls.append((fn, done, box))
            self._cv.notify()
        if not done.wait(timeout):
            raise TimeoutError("scheduler call did not run in time")
        if "error" in box:
            raise box["error"]
        return box.get("result")

    def after_step(self, fn) -> None:
        """Run fn() on the owner thread once every event of the current step has gone to its
        sink (a sink calls this to do its I/O for all requests in one burst: the loopback
        client then wakes once per step instead of once per token).  fn may call after_step
        again: that runs after every fn of this round.  From another thread fn runs at once."""
        if threading.get_ident() != self._thread.ident:
            fn()
            return
        self._after.append(fn)

    def _run_after(self) -> None:
        while self._after:
            fns, self._after = self._after, []
            for fn in fns:
                try:
                    fn()
                except Exception:   # like a broken sink: must not stop the engine for everyone else
                    traceback.print_exc()

    def clear_conversations(self) -> None:
        """Forget conversation -> slot pins."""
        with self._cv:
            self._conversation_slot.clear()

    def close(self, timeout: float = 10.0) -> None:
        """Cancel everything, stop the owner thread."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout)

    # ----------------------------------------------------------- internals
    def _cancel(self, handle: RequestHandle) -> None:
        with self._cv:
            self._to_cancel.append(handle)
            self._cv.notify()

    def _loop(self) -> None:
        try:
            while self._iteration():
                pass
        finally:
            self._closing()

    def _iteration(self) -> bool:
        """One pass of the owner thread: calls, submits, cancels, one step and its events; False
        once closed."""
        try:
            return self._iterate()
        finally:
            self._run_after()

    def _iterate(self) -> bool:
        core = self._core
        with self._cv:
            while (not self._closed and not self._incoming and not self._active and not self._to_cancel
                   and not self._calls):
                self._cv.wait()
            if self._closed:
                return False
            incoming = list(self._incoming)
            self._incoming.clear()
            cancels, self._to_cancel = self._to_cancel, []
            calls, self._calls = self._calls, []
        for fn, done, box in calls:
            try:
                box["result"] = fn(core)
            except Exception as exc:
                box["error"] = exc
            done.set()
        for p in incoming:
            self._submit_to_core(p)
        for h in cancels:
            if h.id is not None and h.id in self._active:
                core.cancel(h.id)
            elif h.id is None and not h._done.is_set():
                h._deliver({"type": "done", "id": None, "t": time.perf_counter(),
                            "metrics": schema.empty_request("cancelled", len(h.tokens))})
        if not self._active:
            return True
        try:
            events = core.step()
            t = time.perf_counter()
            stats = core.last_step()   # raises if the engine was closed during the step
        except Exception as exc:  # the engine itself failed: fail every request, keep serving
            for a in list(self._active.values()):
                a.handle._fail(EngineError(f"engine step failed: {exc}"))
            self._active.clear()
            return True
        stats["t"] = time.time()
        self.step_log.append(stats)
        for ev in events:
            a = self._active.get(ev["id"])
            if a is None:
                continue
            ev["t"] = t
            if ev["type"] == "token":
                a.token_times.append(t)
            elif ev["type"] == "done":
                ev["metrics"] = m = schema.derive_request(ev["metrics"], a.py_queue_ms, a.token_times)
                if a.conversation is not None and m["slot"] >= 0:
                    self._conversation_slot[a.conversation] = m["slot"]
                self.finished.append(dict(m, id=ev["id"]))
            if ev["type"] in ("done", "error"):
                del self._active[ev["id"]]
            a.handle._deliver(ev)
        return True

    def _closing(self) -> None:
        """The owner thread's last act: fail what is left."""
        core = self._core
        for a in list(self._active.values()):
            try:
                core.cancel(a.handle.id)
            except ColibriError:   # the engine was closed while its last step ran
                pass
            a.handle._fail(ColibriError("scheduler closed"))
        with self._cv:
            left = list(self._incoming)
            self._incoming.clear()
        for p in left:
            p.handle._fail(ColibriError("scheduler closed"))
        self._run_after()

    def _submit_to_core(self, p: _Pending) -> None:
        params = p.params
        if p.conversation is not None and params.slot == -1 and p.conversation in self._conversation_slot:
            # a conversation goes back to the slot that holds its history
            params = dataclasses.replace(params, slot=self._conversation_slot[p.conversation])
        if p.handle.cancelled:
            p.handle._deliver({"type": "done", "id": None, "t": time.perf_counter(),
                               "metrics": schema.empty_request("cancelled")})
            return
        try:
            rid = self._core.submit(p.tokens, params)
        except Exception as exc:
            p.handle._fail(exc)
            return
        p.handle.id = rid
        self._active[rid] = _Active(p.handle, (time.perf_counter() - p.t_submit) * 1e3, p.conversation)
