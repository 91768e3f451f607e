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
import math
import queue
import threading
import time
from dataclasses import dataclass, field

from colibri_lab.errors import (
    ColibriError,
    ContextLengthExceededError,
    EngineError,
    InvalidRequestError,
    QueueFullError,
)

_CONTEXT_STATUS = -7  # CB_ERR_CONTEXT
# statuses of an error event that the request itself caused (its grammar hit a
# dead end or outgrew the matcher's limits): the client's fault, not the engine's
_REQUEST_STATUSES = (-2, -3, -5)  # CB_ERR_FORMAT, CB_ERR_UNSUPPORTED, CB_ERR_ARG
_DRAIN_WINDOW_S = 60.0  # Retry-After is computed from completions in this window


@dataclass
class _Pending:
    tokens: list
    params: dict
    handle: "RequestHandle"
    conversation: str | None
    t_submit: float = field(default_factory=time.perf_counter)


class RequestHandle:
    """A submitted request: an iterator over its events, and its final result."""

    def __init__(self, scheduler: "Scheduler"):
        self._scheduler = scheduler
        self._events: queue.SimpleQueue = queue.SimpleQueue()
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
        elif ev["type"] == "error":
            msg = ev["message"]
            st = ev.get("status")
            cls = (ContextLengthExceededError if st == _CONTEXT_STATUS else
                   InvalidRequestError if st in _REQUEST_STATUSES else EngineError)
            self.error = cls(msg)
        if ev["type"] in ("done", "error") and not self._done.is_set():
            self._scheduler._release()
        self._events.put(ev)
        if ev["type"] in ("done", "error"):
            self._done.set()


class Scheduler:
    """Drives a `colibri_lab._engine.Engine` from a dedicated thread.

    step_log keeps the per-step profile of the last `step_log_size` steps
    (DESIGN.md step metrics) for experiments and the server's /profile."""

    def __init__(self, core, max_queue: int = 256, step_log_size: int = 4096):
        self._core = core
        self._n_slots = core.params["n_slots"]
        self._max_queue = max_queue
        self._incoming: collections.deque[_Pending] = collections.deque()
        self._active: dict[int, tuple[RequestHandle, float, str | None, float]] = {}
        self._to_cancel: list[RequestHandle] = []
        self._calls: list[tuple] = []  # (fn, done Event, result box) run on the owner thread
        self._conversation_slot: dict[str, int] = {}
        self._done_times: collections.deque[float] = collections.deque(maxlen=256)  # drain-rate window
        self._outstanding = 0   # submitted and not yet finished (queued in Python or C, or running)
        self._cv = threading.Condition()
        self._closed = False
        self.step_log: collections.deque[dict] = collections.deque(maxlen=step_log_size)
        self.finished: collections.deque[dict] = collections.deque(maxlen=step_log_size)
        self._thread = threading.Thread(target=self._loop, name="colibri-scheduler", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- API
    def submit(self, tokens, conversation: str | None = None, **params) -> RequestHandle:
        """Queue a request (engine.submit keyword parameters).  Raises QueueFullError when full."""
        handle = RequestHandle(self)
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
        core = self._core
        while True:
            with self._cv:
                while (not self._closed and not self._incoming and not self._active and not self._to_cancel
                       and not self._calls):
                    self._cv.wait()
                if self._closed:
                    break
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
                    h._deliver({"type": "done", "id": None, "metrics": _cancelled_metrics(len(h.tokens))})
            if not self._active:
                continue
            try:
                events = core.step()
            except Exception as exc:  # the engine itself failed: fail every request, keep serving
                for handle, *_ in list(self._active.values()):
                    handle._deliver({"type": "error", "id": handle.id, "status": -1, "message": f"engine step failed: {exc}"})
                self._active.clear()
                continue
            stats = core.last_step()
            stats["t"] = time.time()
            self.step_log.append(stats)
            for ev in events:
                entry = self._active.get(ev["id"])
                if entry is None:
                    continue
                handle, py_queue_ms, conversation, _ = entry
                if ev["type"] == "done":
                    ev["metrics"]["queue_ms"] += py_queue_ms
                    if conversation is not None and ev["metrics"]["slot"] >= 0:
                        self._conversation_slot[conversation] = ev["metrics"]["slot"]
                    self.finished.append(dict(ev["metrics"], id=ev["id"]))
                if ev["type"] in ("done", "error"):
                    del self._active[ev["id"]]
                handle._deliver(ev)
        # closing: fail what is left
        for handle, *_ in list(self._active.values()):
            core.cancel(handle.id)
            handle._deliver({"type": "error", "id": handle.id, "status": -1, "message": "scheduler closed"})
        with self._cv:
            left = list(self._incoming)
            self._incoming.clear()
        for p in left:
            p.handle._deliver({"type": "error", "id": None, "status": -1, "message": "scheduler closed"})

    def _submit_to_core(self, p: _Pending) -> None:
        params = dict(p.params)
        if p.conversation is not None and params.get("slot", -1) == -1:
            params["slot"] = self._conversation_slot.get(p.conversation, -1)
        if p.handle.cancelled:
            p.handle._deliver({"type": "done", "id": None, "metrics": _cancelled_metrics(0)})
            return
        try:
            rid = self._core.submit(p.tokens, **params)
        except Exception as exc:
            p.handle.error = exc
            self._release()
            p.handle._events.put({"type": "error", "id": None, "status": -5, "message": str(exc)})
            p.handle._done.set()
            return
        p.handle.id = rid
        py_queue_ms = (time.perf_counter() - p.t_submit) * 1e3
        self._active[rid] = (p.handle, py_queue_ms, p.conversation, p.t_submit)


def _cancelled_metrics(n_tokens: int) -> dict:
    return dict(prompt_tokens=0, cached_tokens=0, completion_tokens=n_tokens, queue_ms=0.0, ttft_ms=0.0,
                prefill_ms=0.0, decode_ms=0.0, e2e_ms=0.0, tpot_ms=0.0, decode_tok_s=0.0, draft_n=0,
                draft_accepted=0, grammar_mask_us=0.0, slot=-1, finish_reason="cancelled", stop_offset=-1)
