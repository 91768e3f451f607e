"""JSON Schema -> GBNF conversion in child processes that can be stopped.

A schema within limits.py's bounds converts in milliseconds, but conversion is
Python code whose cost grows faster than linearly in what a schema holds, and
a thread cannot be stopped.  So conversions run in a small pool of child
processes (spawned once, reused); the request thread waits on the pipe and
checks, every 50 ms, the request's deadline and whether its client is still
there.  Past the deadline, or when the client has gone, the child is killed
(a fresh one is spawned for the next conversion) and the request ends with a
400 (or silently, for a client that left).

The HTTP layer binds the current request (`bind(gone, timeout_s)`) on its
thread, so the API modules call `schema_to_gbnf(schema)` without passing the
connection through every helper.  The same binding carries the request's
`lenient` flag (`set_lenient`, from the body) and collects what lenient
conversions left out (`ignored()`, reported in the response).
"""
from __future__ import annotations

import multiprocessing as mp
import threading
import time

__all__ = ["schema_to_gbnf", "bind", "unbind", "set_lenient", "ignored", "ConversionError", "ConversionTimeout",
           "ClientLeft"]

POLL_S = 0.05


class ConversionError(Exception):
    """The converter refused the schema; `kind` is its exception's class name."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class ConversionTimeout(Exception):
    """The conversion ran past its deadline and was stopped."""


class ClientLeft(Exception):
    """The client disconnected while its schema was converting; the conversion was stopped."""


_local = threading.local()


def bind(gone, timeout_s: float) -> None:
    _local.gone, _local.timeout_s = gone, timeout_s
    _local.lenient, _local.ignored = False, []


def unbind() -> None:
    _local.gone = _local.timeout_s = None
    _local.lenient, _local.ignored = False, []


def set_lenient(flag: bool) -> None:
    """The bound request's `lenient`: its schemas leave out what cannot be
    enforced (as Engine(lenient=True) does) instead of being refused."""
    _local.lenient = bool(flag)


def ignored():
    """What the bound request's lenient conversions left out ({keyword, path,
    reason}, as Engine.generate's schema_ignored), or None when it did not ask
    for lenient."""
    return list(getattr(_local, "ignored", [])) if getattr(_local, "lenient", False) else None


def _child(conn) -> None:
    from colibri_lab.schema import convert_schema as convert
    while True:
        try:
            schema, lenient = conn.recv()
        except (EOFError, OSError, TypeError, ValueError):
            return
        try:
            conv = convert(schema, lenient=lenient)
            out = ("ok", conv.gbnf, conv.ignored)
        except RecursionError:
            out = ("err", "SchemaError", "the schema nests too deeply to convert")
        except Exception as e:  # reported to the request as a 400 naming the schema
            out = ("err", type(e).__name__, str(e))
        try:
            conn.send(out)
        except (OSError, ValueError):
            return


class _Worker:
    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_child, args=(child,), name="colibri-convert", daemon=True)
        self.proc.start()
        child.close()

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.join(5)
        except Exception:
            pass
        self.conn.close()


class Pool:
    def __init__(self, size: int = 2):
        self.size = size
        self.ctx = mp.get_context("spawn")   # no fork of a threaded server
        self.cv = threading.Condition()
        self.free: list[_Worker] = []
        self.n = 0   # workers alive (free or busy)
        self.killed = 0

    def _get(self, deadline: float) -> _Worker:
        with self.cv:
            while True:
                if self.free:
                    return self.free.pop()
                if self.n < self.size:
                    self.n += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ConversionTimeout("no converter was free before the deadline")
                self.cv.wait(min(left, POLL_S))
        try:
            return _Worker(self.ctx)
        except BaseException:
            with self.cv:
                self.n -= 1
                self.cv.notify()
            raise

    def _put(self, w: _Worker) -> None:
        with self.cv:
            self.free.append(w)
            self.cv.notify()

    def _drop(self, w: _Worker) -> None:
        w.kill()
        with self.cv:
            self.n -= 1
            self.killed += 1
            self.cv.notify()

    def run(self, schema, timeout_s: float, gone=None, lenient: bool = False):
        """(GBNF, what lenient mode left out)."""
        deadline = time.monotonic() + timeout_s
        w = self._get(deadline)
        try:
            w.conn.send((schema, bool(lenient)))
            while not w.conn.poll(POLL_S):
                if not w.proc.is_alive():
                    raise ConversionError("ConverterDied", "the schema converter exited")
                if gone is not None and gone():
                    raise ClientLeft()
                if time.monotonic() >= deadline:
                    raise ConversionTimeout(f"converting the schema took longer than {timeout_s:g} s; "
                                            f"it was stopped (simplify the schema)")
            res = w.conn.recv()
        except BaseException:
            self._drop(w)
            raise
        self._put(w)
        if res[0] == "ok":
            return res[1], res[2]
        raise ConversionError(res[1], res[2])

    def close(self) -> None:
        with self.cv:
            ws, self.free = self.free, []
        for w in ws:
            w.kill()


_pool: Pool | None = None
_pool_lock = threading.Lock()
DEFAULT_TIMEOUT_S = 10.0


def pool() -> Pool:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = Pool()
        return _pool


def schema_to_gbnf(schema, ctx=None) -> str:
    """Convert in a child process, bounded by the bound request's deadline and
    stopped if its client leaves (unbound callers get DEFAULT_TIMEOUT_S);
    lenient as the bound request asked, what it left out kept for ignored()."""
    gone = getattr(_local, "gone", None)
    timeout = getattr(_local, "timeout_s", None) or DEFAULT_TIMEOUT_S
    lenient = getattr(_local, "lenient", False)
    gbnf, left_out = pool().run(schema, timeout, gone, lenient)
    if lenient:
        _local.ignored.extend(left_out)
    return gbnf
