"""Running one HTTP request's generations on the engine.

A `Generation` submits every choice of a request at once (n choices, times
the prompts of a legacy completion), so they run in parallel slots.  The
request path is three hops: the scheduler thread hands each event to the
sink given at submit, which puts it on this Generation's queue; the HTTP
thread reads that queue, decodes the token (colibri_lab.decode.Decoder: UTF-8
safe, stop strings held back) and writes the SSE bytes.  No thread in
between.  Reading with a timeout lets the HTTP thread send keep-alive
comments and notice a client that went away between tokens; `cancel()` stops
every choice.  The sink records a finished request's metrics exactly once,
whether or not the client is still there.

A plain stream's tokens (no logprobs, no tool-call buffering; chat and legacy
completions, Anthropic messages and Responses alike) skip the queue: the
scheduler thread writes their chunks itself (`write_tokens_directly`),
and it does so once every event of the step has been handed out, all
streams' writes back to back (`Scheduler.after_step`).  On 2 shared cores a
write that wakes a client that has gone back to sleep costs ~100 us of the
scheduler thread (the wake-up), one that finds it awake ~14 us; writes spread
between each token's Python let the client fall asleep between them.
"""
from __future__ import annotations

import functools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from colibri_lab.decode import Decoder
from colibri_lab.errors import ContextLengthExceededError, EngineError, InvalidRequestError, ModelLoadError, QueueFullError

from .errors import ApiError


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
    logprobs: list = field(default_factory=list)         # (logprob, [(id, lp)]) per kept token
    finish_reason: str | None = None                     # engine reason: stop|length|cancelled|context
    metrics: dict | None = None
    stop_sequence: str | None = None                     # the stop string that ended it, if any
    error: Exception | None = None
    decoder: Decoder | None = field(default=None, repr=False)


def map_engine_error(exc: Exception) -> ApiError:
    if isinstance(exc, ContextLengthExceededError):
        return ApiError(400, str(exc), code="context_length_exceeded", param="messages")
    if isinstance(exc, QueueFullError):
        return ApiError(429, str(exc), code="queue_full",
                        headers={"Retry-After": str(getattr(exc, "retry_after", 1))})
    if isinstance(exc, InvalidRequestError):
        return ApiError(400, str(exc), param=getattr(exc, "param", None))
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
        self.handles: dict[int, object] = {}
        self.pending: set[int] = set()
        self._on_done = on_done
        # choices whose token chunks the scheduler thread writes itself (write_tokens_directly)
        self._lock = threading.Lock()
        self._direct: dict[int, Callable[[str], bytes]] = {}
        self._direct_on: set[int] = set()
        self._try_write: Callable[[bytes], bool] | None = None
        self._stateful: set[int] = set()   # choices whose built-but-unwritten bytes must be written as built
        self.n_direct = 0   # tokens whose chunk went out from the scheduler thread
        self._step_events: list = []    # this step's events, until the scheduler's after_step (_prepare)
        self._ready: list = []   # prepared (index, event, piece, bytes), until _commit
        # the scheduler runs a sink's I/O once a step's events are out; an engine without one, at once
        self._after_step = getattr(engine.scheduler, "after_step", None) or (lambda fn: fn())
        try:
            engine.scheduler.admit(len(specs))
        except InvalidRequestError as e:   # more choices than could ever be scheduled
            raise ApiError(400, str(e), param="n", code="too_many_choices") from None
        except QueueFullError as e:
            raise map_engine_error(e) from None
        try:
            for s in specs:
                ids, handle, stops = engine.submit(s.prompt_ids, sink=functools.partial(self._sink, s.index),
                                                   **s.kwargs)
                self.results[s.index] = ChoiceResult(index=s.index, prompt_ids=list(ids), stops=stops,
                                                     decoder=Decoder(engine.model.token_bytes, stops))
                self.handles[s.index] = handle
                self.pending.add(s.index)
        except Exception as e:
            self.cancel()   # what was submitted still finishes in the engine, and its sink records it
            raise map_engine_error(e) from e

    def write_tokens_directly(self, index: int, chunk_of: Callable[[str], bytes], try_write,
                              stateful: bool = False) -> None:
        """Let the scheduler thread write choice `index`'s token chunks itself (`chunk_of(text)` ->
        the SSE bytes, `try_write(bytes)` -> False when it cannot write now), for a choice whose
        token pieces need nothing but their text (no logprobs, no tool-call buffering).  It starts
        once this thread has written everything queued before; a token that cannot be written goes
        through the queue as before, and so does every later one until the queue is empty again.
        With `stateful` (a stream whose chunks carry state, a Responses event's sequence_number),
        a token whose bytes were built but not written arrives with them (its piece's "data",
        never merged with another piece) and the HTTP thread writes them as built.
        The HTTP thread is then woken for the end of the request, not for each token."""
        self._try_write = try_write
        self._direct[index] = chunk_of
        if stateful:
            self._stateful.add(index)

    def _sink(self, index: int, ev: dict) -> None:
        """On the scheduler thread: record a finished request at once; hold the event until every
        event of the step is out (`_prepare`, run by the scheduler's after_step), so the writes of
        all streams go out in one burst (never blocks)."""
        if ev["type"] == "done":
            try:
                self._on_done(ev["metrics"])
            except Exception:
                pass
        self._step_events.append((index, ev))
        if len(self._step_events) == 1:
            self._after_step(self._prepare)

    def _prepare(self) -> None:
        """After the step's events: decode the tokens of the choices written directly and build
        their bytes; the writes (and the queue puts, in order) wait for `_commit`, which runs
        after every stream's prepare, so one step's writes are back to back."""
        held, self._step_events = self._step_events, []
        out = []
        with self._lock:
            for index, ev in held:
                piece = data = None
                if ev["type"] == "token" and index in self._direct_on:
                    piece = self._decode(index, ev)
                    text = piece["text"]
                    try:
                        data = self._direct[index](text) if text else b""
                    except Exception:   # never lose the token: the HTTP thread writes it
                        data = None
                out.append((index, ev, piece, data))
        self._ready.extend(out)
        self._after_step(self._commit)

    def _commit(self) -> None:
        """Write what `_prepare` built; a token that cannot be written, and every later event of
        its choice, goes through the queue (decoded: the HTTP thread writes its piece)."""
        ready, self._ready = self._ready, []
        with self._lock:
            for index, ev, piece, data in ready:
                if data is not None and index in self._direct_on:
                    try:
                        written = not data or self._try_write(data)
                    except Exception:   # the HTTP thread writes it (and meets the error)
                        written = False
                    if written:
                        self.n_direct += 1
                        continue
                self._direct_on.discard(index)
                if data and piece is not None and index in self._stateful:   # the HTTP thread writes them
                    piece["data"] = data
                self.q.put((index, ev, piece))

    def _decode(self, index: int, ev: dict) -> dict:
        """On the HTTP thread: one engine event as the piece the API modules write: a token's
        {"text", "tokens": [(id, logprob, top)], "t"}, the end's {"text", "done", ...}, or {"error"}."""
        r = self.results[index]
        t = ev["type"]
        if t == "token":
            top = ev.get("top", [])
            r.tokens.append(ev["token"])
            r.logprobs.append((ev["logprob"], top))
            return {"text": r.decoder.feed(ev["token"]), "tokens": [(ev["token"], ev["logprob"], top)], "t": ev["t"]}
        if t == "done":
            m = ev["metrics"]
            dec = r.decoder
            tail = dec.finish(m["stop_offset"])
            keep = dec.n_kept
            del r.tokens[keep:], r.logprobs[keep:]
            stop = dec.stop_sequence
            r.stop_sequence = stop.decode("utf-8", "replace") if stop is not None else None
            r.text = dec.text
            r.finish_reason = m["finish_reason"]
            r.metrics = m
            return {"text": tail, "done": True, "finish_reason": m["finish_reason"], "metrics": m, "t": ev["t"]}
        r.error = self.handles[index].error or EngineError(ev.get("message", "engine error"))
        return {"error": r.error}

    def _pieces(self, batch: list) -> list:
        """Decode the events taken in one wake, in order, merging each choice's consecutive token
        events into one piece (text concatenated, every token in `tokens`, the last one's time).
        Only events already queued are merged: a client that keeps up gets one piece per token."""
        out, open_tok = [], {}   # choice -> index in out of its token piece still open for merging
        for idx, ev, piece in batch:
            if piece is None:   # not decoded yet (the scheduler thread did when it tried to write it)
                piece = self._decode(idx, ev)
            j = open_tok.get(idx)
            if "tokens" in piece and j is not None and "data" not in piece and "data" not in out[j][1]:
                merged = out[j][1]
                merged["text"] += piece["text"]
                merged["tokens"] += piece["tokens"]
                merged["t"] = piece["t"]
                continue
            open_tok.pop(idx, None)
            if "tokens" in piece:
                open_tok[idx] = len(out)
            out.append((idx, piece))
        return out

    def cancel(self) -> None:
        for h in self.handles.values():
            try:
                h.cancel()
            except Exception:
                pass

    def events(self, tick: float):
        """Yield (index, piece) as events come, or None every `tick` seconds of silence,
        until every choice is done or failed.  Events that queued up while this thread was
        busy (a client or a thread behind the engine) come out merged per choice (see _pieces):
        one SSE chunk and one write for several tokens, each token's text and logprob in it."""
        while self.pending:
            if self._direct:
                with self._lock:   # everything taken so far is written: the scheduler thread may go on
                    if self.q.empty():
                        self._direct_on.update(i for i in self._direct if i in self.pending)
            try:
                batch = [self.q.get(timeout=tick)]
            except queue.Empty:
                yield None
                continue
            while True:
                try:
                    batch.append(self.q.get_nowait())
                except queue.Empty:
                    break
            for idx, piece in self._pieces(batch):
                if piece.get("done") or "error" in piece:
                    self.pending.discard(idx)
                yield idx, piece

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
