"""Running one HTTP request's generations on the engine.

A `Generation` submits every choice of a request at once (n choices, times
the prompts of a legacy completion), so they run in parallel slots, and pumps
each handle's events on a small thread into one queue.  The HTTP thread reads
that queue with a timeout, which lets it send keep-alive comments and notice a
client that went away between tokens; `cancel()` stops every choice.

Each pump turns token bytes into UTF-8-safe text with stop-string holdback
(the engine's `_Utf8Stream`) and records the finished request's metrics
exactly once, whether or not the client is still there.
"""
from __future__ import annotations

import queue
import time
import threading
from dataclasses import dataclass, field
from typing import Callable

from colibri_lab.engine import _Utf8Stream
from colibri_lab.errors import (ContextLengthExceededError, InvalidRequestError, ModelLoadError, QueueFullError)

from .common import ApiError


class ClientGone(Exception):
    """The client closed its connection."""


@dataclass
class Spec:
    """One choice to generate."""

    index: int                 # choice index in the response
    prompt_ids: list           # prompt token ids
    kwargs: dict               # Engine.submit keywords (max_tokens, stop, sampling, grammar...)


@dataclass
class ChoiceResult:
    index: int
    prompt_ids: list
    stops: list                                          # stop strings as bytes
    text: str = ""                                       # output, cut before a matched stop string
    tokens: list = field(default_factory=list)           # ids of the tokens whose bytes start before the cut
    token_bytes: list = field(default_factory=list)      # their bytes
    logprobs: list = field(default_factory=list)         # (logprob, [(id, lp)]) per kept token
    finish_reason: str | None = None                     # engine reason: stop|length|cancelled|context
    metrics: dict | None = None
    stop_sequence: str | None = None                     # the stop string that ended it, if any
    error: Exception | None = None


def map_engine_error(exc: Exception) -> ApiError:
    if isinstance(exc, ContextLengthExceededError):
        return ApiError(400, str(exc), code="context_length_exceeded", param="messages")
    if isinstance(exc, QueueFullError):
        return ApiError(429, str(exc), code="queue_full",
                        headers={"Retry-After": str(getattr(exc, "retry_after", 1))})
    if isinstance(exc, InvalidRequestError):
        return ApiError(400, str(exc))
    if isinstance(exc, ModelLoadError):
        # raised by a submit only for what the request asked for (a grammar the
        # matcher cannot hold: "unsupported"), never for the loaded model
        return ApiError(400, str(exc), code="unsupported")
    return ApiError(500, f"generation failed: {exc}")


class Generation:
    def __init__(self, engine, specs: list[Spec], on_done: Callable[[dict, list], None]):
        self.engine = engine
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.results: dict[int, ChoiceResult] = {}
        self.handles = []
        self._on_done = on_done
        submitted = []
        try:
            engine.scheduler.admit(len(specs))
        except InvalidRequestError as e:   # more choices than could ever be scheduled
            raise ApiError(400, str(e), param="n", code="too_many_choices") from None
        except QueueFullError as e:
            raise map_engine_error(e) from None
        try:
            for s in specs:
                ids, handle, stops = engine.submit(s.prompt_ids, **s.kwargs)
                submitted.append((s, ids, handle, stops))
        except Exception as e:
            for _, _, h, _ in submitted:
                h.cancel()
            # the cancelled choices still finish in the engine; drain them so they are recorded
            for s, ids, h, stops in submitted:
                self._start(s, ids, h, stops)
            raise map_engine_error(e) from e
        for s, ids, h, stops in submitted:
            self._start(s, ids, h, stops)
        self.pending = {s.index for s, *_ in submitted}

    def _start(self, s: Spec, ids, handle, stops) -> None:
        self.handles.append(handle)
        r = ChoiceResult(index=s.index, prompt_ids=list(ids), stops=stops)
        self.results[s.index] = r
        t = threading.Thread(target=self._pump, args=(r, handle), name=f"colibri-pump-{s.index}", daemon=True)
        t.start()

    def _pump(self, r: ChoiceResult, handle) -> None:
        dec = _Utf8Stream(r.stops)
        model = self.engine.model
        offs = []   # byte offset where each token starts
        times = []  # when each token arrived (inter-token latency: the true gaps)
        try:
            for ev in handle:
                t = ev["type"]
                if t == "token":
                    times.append(time.perf_counter())
                    b = model.token_bytes(ev["token"])
                    offs.append(len(dec.buf))
                    r.tokens.append(ev["token"])
                    r.token_bytes.append(b)
                    r.logprobs.append((ev["logprob"], ev.get("top", [])))
                    text = dec.feed(b)
                    self.q.put((r.index, {"text": text, "token": ev["token"], "logprob": ev["logprob"],
                                          "top": ev.get("top", [])}))
                elif t == "done":
                    m = ev["metrics"]
                    tail = dec.finish(m["stop_offset"])
                    cut = m["stop_offset"]
                    if cut >= 0:
                        keep = sum(1 for o in offs if o < cut)
                        del r.tokens[keep:], r.token_bytes[keep:], r.logprobs[keep:]
                        rest = dec.buf[cut:]
                        for s in r.stops:
                            if rest.startswith(s):
                                r.stop_sequence = s.decode("utf-8", "replace")
                                break
                    r.text = dec.buf[:cut if cut >= 0 else len(dec.buf)].decode("utf-8", "replace")
                    r.finish_reason = m["finish_reason"]
                    r.metrics = m
                    try:
                        self._on_done(m, [b - a for a, b in zip(times, times[1:])])
                    except Exception:
                        pass
                    self.q.put((r.index, {"text": tail, "done": True, "finish_reason": m["finish_reason"],
                                          "metrics": m}))
                    return
                else:
                    r.error = handle.error or RuntimeError(ev.get("message", "engine error"))
                    self.q.put((r.index, {"error": r.error}))
                    return
        except Exception as e:  # never leave the reader waiting
            r.error = e
            self.q.put((r.index, {"error": e}))

    def cancel(self) -> None:
        for h in self.handles:
            try:
                h.cancel()
            except Exception:
                pass

    def events(self, tick: float):
        """Yield (index, event) as they come, or None every `tick` seconds of silence,
        until every choice is done or failed."""
        while self.pending:
            try:
                idx, ev = self.q.get(timeout=tick)
            except queue.Empty:
                yield None
                continue
            if ev.get("done") or "error" in ev:
                self.pending.discard(idx)
            yield idx, ev

    def collect(self, gone: Callable[[], bool], tick: float = 0.25) -> list[ChoiceResult]:
        """Wait for every choice (non-streaming); cancels and raises ClientGone if the
        client disconnects meanwhile.  Raises the first choice error as an ApiError."""
        last_check = time.monotonic()
        for item in self.events(tick):
            # check on silence, and every tick even while tokens keep coming
            # (a fast engine may never be silent for a whole tick)
            now = time.monotonic()
            if item is None or now - last_check >= tick:
                last_check = now
                if gone():
                    self.cancel()
                    raise ClientGone()
        rs = [self.results[i] for i in sorted(self.results)]
        for r in rs:
            if r.error is not None:
                raise map_engine_error(r.error)
        return rs


def drive(ctx, gen: Generation, on_event: Callable[[int, dict], None]) -> None:
    """Stream loop: feed events to `on_event`; during silence check the client
    and send keep-alive comments.  A client that went away cancels every choice
    and raises ClientGone."""
    tick = min(0.25, max(0.01, ctx.srv.keepalive_s))
    try:
        for item in gen.events(tick):
            if item is None:
                if ctx.gone():
                    raise ClientGone()
                if ctx.idle_s() >= ctx.srv.keepalive_s:
                    ctx.sse_comment("keep-alive")
                continue
            on_event(*item)
    except ClientGone:
        gen.cancel()
        raise
    except BaseException:
        gen.cancel()
        raise
