"""HTTP/1.1 connections: a strict request reader (RFC 9112 framing) and the
registry that keeps the server reachable under hostile clients.

Why not `BaseHTTPRequestHandler.parse_request`: it reads lines with one socket
timeout per read, so a client trickling a byte a second is never cut; it takes
the first of two different Content-Length headers, parses `+94` and `9_4`, and
leaves a GET's body to be read as the next request.  Here every byte of a
request (head and body) must arrive before one deadline, and anything whose
framing is ambiguous is refused with a status line and the connection closed.

The registry counts every open connection against one global cap (every
local client is 127.0.0.1, so a per-address limit locks all of them out at
once).  At the cap the server closes, in order: the connection idle longest
between requests, then the one that has been sending its request longest
(a slow client).  Connections running a request are never closed; when every
connection is busy a few more are accepted to answer /health (and 503 for
anything else).
"""
from __future__ import annotations

import re
import socket
import threading
import time

from .limits import Limits

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSION = re.compile(rb"HTTP/(\d)\.(\d)")
_DIGITS = re.compile(r"[0-9]{1,19}")
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_LINE = re.compile(rb"\r?\n")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
KNOWN_METHODS = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"}
BODYLESS = {"GET", "HEAD", "DELETE", "OPTIONS"}


class HttpError(Exception):
    """A request the server answers with `status` and closes the connection after."""

    def __init__(self, status: int, message: str, code: str = "bad_request"):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class Closed(Exception):
    """The peer closed (or the registry closed it): nothing is to be answered."""


class Headers:
    """Request header fields in arrival order; lookups are case-insensitive."""

    def __init__(self, items):
        self.items = items                      # [(name lower-case, value)]

    def get(self, name: str, default=None):
        n = name.lower()
        for k, v in self.items:
            if k == n:
                return v
        return default

    def get_all(self, name: str) -> list:
        n = name.lower()
        return [v for k, v in self.items if k == n]

    def __contains__(self, name: str) -> bool:
        return self.get(name) is not None


class Request:
    """One parsed request head and its framing."""

    def __init__(self, method, target, version, headers, body_len, chunked, raw_line):
        self.method, self.target, self.version = method, target, version
        self.headers, self.body_len, self.chunked = headers, body_len, chunked
        self.raw_line = raw_line


class Reader:
    """Buffered reads from a socket where every wait is bounded by both the
    per-read timeout and the request's deadline."""

    def __init__(self, sock: socket.socket, limits: Limits):
        self.sock = sock
        self.lim = limits
        self.buf = bytearray()
        self.deadline = float("inf")

    def _recv(self) -> None:
        now = time.monotonic()
        left = self.deadline - now
        if left <= 0:
            raise HttpError(408, f"the request did not arrive within {self.lim.request_timeout_s:g} s",
                            code="request_timeout")
        self.sock.settimeout(min(self.lim.read_timeout_s, left))
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            if time.monotonic() >= self.deadline:
                raise HttpError(408, f"the request did not arrive within {self.lim.request_timeout_s:g} s",
                                code="request_timeout") from None
            raise HttpError(408, f"no data for {self.lim.read_timeout_s:g} s", code="request_timeout") from None
        except OSError:
            raise Closed() from None
        if not data:
            raise Closed()
        self.buf += data

    def wait_request(self) -> bool:
        """Wait (idle, at most idle_timeout_s) for the first byte of the next request.
        False when the connection closed or stayed idle too long."""
        if self.buf:
            return True
        self.sock.settimeout(self.lim.idle_timeout_s)
        try:
            data = self.sock.recv(65536)
        except (OSError, socket.timeout):
            return False
        if not data:
            return False
        self.buf += data
        return True

    def start(self) -> None:
        """The request's deadline starts with its first byte."""
        self.deadline = time.monotonic() + self.lim.request_timeout_s

    def head(self) -> Request:
        lim = self.lim
        while True:
            # a server SHOULD ignore empty lines before the request line (RFC 9112 2.2)
            while self.buf[:2] == b"\r\n" or self.buf[:1] == b"\n":
                del self.buf[:2 if self.buf[:1] == b"\r" else 1]
            m = _HEAD_END.search(self.buf, 0, lim.max_head_bytes + 4)
            if m:
                break
            if len(self.buf) > lim.max_head_bytes:
                raise HttpError(431, f"request line and headers exceed {lim.max_head_bytes} bytes",
                                code="headers_too_large")
            self._recv()
        raw = bytes(self.buf[:m.start()])
        del self.buf[:m.end()]
        return parse_head(raw, lim)

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._recv()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def line(self, limit: int) -> bytes:
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                out = bytes(self.buf[:i])
                del self.buf[:i + 1]
                return out[:-1] if out.endswith(b"\r") else out
            if len(self.buf) > limit:
                raise HttpError(400, "chunk header line too long")
            self._recv()

    def chunked(self, max_bytes: int) -> bytes:
        """A chunked body (RFC 9112 7.1): sizes in hex, extensions ignored, trailers dropped."""
        out = bytearray()
        while True:
            size_line = self.line(1024).split(b";", 1)[0].strip()
            if not re.fullmatch(rb"[0-9A-Fa-f]{1,16}", size_line):
                raise HttpError(400, "malformed chunk size in a chunked body")
            n = int(size_line, 16)
            if n == 0:
                break
            if len(out) + n > max_bytes:
                raise HttpError(413, f"request body exceeds {max_bytes} bytes", code="request_too_large")
            out += self.exact(n)
            if self.exact(2) not in (b"\r\n",):
                raise HttpError(400, "a chunk is not followed by CRLF")
        total = 0
        while True:   # trailer section
            ln = self.line(8192)
            total += len(ln)
            if not ln:
                break
            if total > self.lim.max_head_bytes:
                raise HttpError(431, "chunked trailers too large", code="headers_too_large")
        return bytes(out)


def parse_head(raw: bytes, lim: Limits) -> Request:
    lines = _LINE.split(raw)
    line = lines[0]
    parts = line.split(b" ")
    if len(parts) != 3 or not all(parts):
        raise HttpError(400, "malformed request line (expected 'METHOD target HTTP/1.1')")
    method_b, target_b, version_b = parts
    if not _TOKEN.fullmatch(method_b):
        raise HttpError(400, "malformed request method")
    vm = _VERSION.fullmatch(version_b)
    if not vm:
        raise HttpError(400, "malformed HTTP version in the request line")
    version = (int(vm.group(1)), int(vm.group(2)))
    if version[0] != 1:
        raise HttpError(505, f"HTTP version {version_b.decode('ascii', 'replace')} is not supported (HTTP/1.1 is)",
                        code="http_version_not_supported")
    if any(c < 0x21 or c > 0x7e for c in target_b):
        raise HttpError(400, "the request target contains characters that are not allowed")
    method = method_b.decode("ascii")
    target = target_b.decode("ascii")
    if len(lines) - 1 > lim.max_headers:
        raise HttpError(431, f"more than {lim.max_headers} header fields", code="headers_too_large")
    items = []
    for ln in lines[1:]:
        if ln[:1] in (b" ", b"\t"):
            raise HttpError(400, "obsolete line folding in a header field is not accepted")
        if b"\r" in ln:
            raise HttpError(400, "a bare CR in a header field")
        name, sep, value = ln.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):
            raise HttpError(400, "malformed header field (expected 'Name: value', no space before the colon)")
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value):
            raise HttpError(400, f"control characters in header field {name.decode('ascii')}")
        items.append((name.decode("ascii").lower(), value.decode("latin-1")))
    headers = Headers(items)
    hosts = headers.get_all("host")
    if len(hosts) > 1 or (version >= (1, 1) and not hosts):
        raise HttpError(400, "an HTTP/1.1 request needs exactly one Host header")
    # framing (RFC 9112 6): Transfer-Encoding wins over nothing; both is an error
    te = headers.get_all("transfer-encoding")
    cls = headers.get_all("content-length")
    chunked = False
    body_len = 0
    if te:
        if version < (1, 1):
            raise HttpError(400, "Transfer-Encoding in an HTTP/1.0 request")
        if cls:
            raise HttpError(400, "a request with both Transfer-Encoding and Content-Length")
        codings = [c.strip().lower() for v in te for c in v.split(",")]
        if codings != ["chunked"]:
            raise HttpError(501, f"transfer coding {', '.join(codings)!r} is not supported (only chunked)",
                            code="not_implemented")
        chunked = True
    elif cls:
        vals = {v.strip() for c in cls for v in c.split(",")}
        if len(vals) != 1:
            raise HttpError(400, "conflicting Content-Length values")
        v = vals.pop()
        if not _DIGITS.fullmatch(v):
            raise HttpError(400, f"malformed Content-Length {v[:40]!r}")
        body_len = int(v)
    if method not in KNOWN_METHODS:
        raise HttpError(501, f"method {method} is not implemented", code="not_implemented")
    if method in BODYLESS and (chunked or body_len):
        raise HttpError(400, f"a {method} request must not have a body")
    return Request(method, target, version, headers, body_len, chunked, line.decode("latin-1"))


# ------------------------------------------------------------------ registry
class Conn:
    """One open connection's state, as the registry sees it."""

    __slots__ = ("sock", "state", "since", "evicted", "overflow")

    def __init__(self, sock):
        self.sock = sock
        self.state = "idle"         # idle (no request yet) | head (request arriving) | body | busy
        self.since = time.monotonic()
        self.evicted = False        # closed by the registry to make room
        self.overflow = False       # accepted beyond the cap: /health only

    def set(self, state: str) -> None:
        self.state = state
        self.since = time.monotonic()


class Registry:
    def __init__(self, limits: Limits):
        self.lim = limits
        self.lock = threading.Lock()
        self.conns: set[Conn] = set()
        self.counted = 0            # connections counted against the cap (not evicted, not overflow)
        self.overflow = 0
        self.evictions = {"idle": 0, "slow": 0}
        self.refused = 0

    def admit(self, sock) -> Conn | None:
        """Register a new connection, making room at the cap; None = refuse it."""
        c = Conn(sock)
        with self.lock:
            if self.counted < self.lim.max_connections:
                self.counted += 1
            else:
                # the newcomer takes a victim's place: a full connection if one can
                # be freed, else a place in the /health reserve
                victim = self._victim(overflow=False)
                if victim is None and self.overflow >= self.lim.health_reserve:
                    victim = self._victim(overflow=True)
                if victim is not None:
                    self._evict(victim)
                    c.overflow = victim.overflow
                elif self.overflow < self.lim.health_reserve:
                    c.overflow = True
                    self.overflow += 1
                else:
                    self.refused += 1
                    return None
            self.conns.add(c)
        return c

    def _victim(self, overflow: bool) -> Conn | None:
        """The longest-idle connection, else the one sending its request for longest
        (at least slow_after_s); never one whose request is running."""
        now = time.monotonic()
        live = [c for c in self.conns if not c.evicted and c.overflow == overflow]
        idle = [c for c in live if c.state == "idle"]
        if idle:
            self.evictions["idle"] += 1
            return min(idle, key=lambda c: c.since)
        slow = [c for c in live if c.state == "head" and now - c.since >= self.lim.slow_after_s]
        if slow:
            self.evictions["slow"] += 1
            return min(slow, key=lambda c: c.since)
        return None

    def _evict(self, c: Conn) -> None:
        """Close c to make room; its place is handed to the newcomer, so the
        counts do not change (release() skips evicted connections)."""
        c.evicted = True
        try:   # wakes the connection's thread: its recv returns end-of-file
            c.sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass

    def release(self, c: Conn) -> None:
        with self.lock:
            if c in self.conns:
                self.conns.discard(c)
                if c.evicted:
                    return
                if c.overflow:
                    self.overflow -= 1
                else:
                    self.counted -= 1

    def snapshot(self) -> dict:
        with self.lock:
            states = {}
            for c in self.conns:
                states[c.state] = states.get(c.state, 0) + 1
            return {"open": len(self.conns), "counted": self.counted, "overflow": self.overflow,
                    "states": states, "evicted_idle": self.evictions["idle"],
                    "evicted_slow": self.evictions["slow"], "refused": self.refused}
