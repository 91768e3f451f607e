"""The HTTP layer: a ThreadingHTTPServer, routing, security checks, JSON and
SSE responses, and the programmatic `Server`.

Security, in the order a request meets it: per-client-IP connection limit
(429 at accept), Host header allowlist against DNS rebinding (403), Origin
allowlist (403; CORS preflight answered only for configured origins), API key
(401; Bearer or x-api-key, constant-time compare; /health answers a minimal
public body without one), body size limit (413) and socket read timeouts.
Errors use the OpenAI shape, or the Anthropic shape under /v1/messages.
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import ipaddress
import json
import os
import re
import select
import socket
import sys
import threading
import time
import traceback
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from . import anthropic_api, convert, openai_api, responses_api, tokens_api
from .body import check_text
from .errors import ApiError
from .conn import Closed, HttpError, Reader, Registry
from .gen import ClientGone
from .limits import Limits
from .metrics import Metrics

_RID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


class ServerConfigError(ValueError):
    """A configuration the server refuses to run with (e.g. public bind without a key)."""


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


# ------------------------------------------------------------------ routing
# path -> (method, handler(ctx, body_or_none), needs_engine)
def _health(ctx, _):
    ctx.health()


def _metrics(ctx, _):
    ctx.send_text(200, ctx.srv.render_metrics(), "text/plain; version=0.0.4; charset=utf-8")


def _profile(ctx, _):
    eng = ctx.engine
    steps = list(eng.scheduler.step_log) if eng is not None and eng.scheduler is not None else []
    ctx.send_json(200, ctx.srv.metrics.profile(steps))


def _experts(ctx, _):
    """Per-layer expert heat over the engine's life (routing counts); a dense model says so."""
    eng = ctx.engine
    info = eng.info if eng is not None else {}
    n_expert = int(info.get("n_expert", 0) or 0)
    layers = []
    if n_expert > 0 and eng.scheduler is not None:
        counts = eng.scheduler.call(lambda core: core.expert_counts())
        for layer, row in enumerate(counts.tolist()):
            total = sum(row)
            layers.append({"layer": layer, "counts": row, "total": total,
                           "hottest": max(range(n_expert), key=row.__getitem__) if total else None})
    ctx.send_json(200, {"object": "experts", "moe": n_expert > 0, "n_expert": n_expert,
                        "n_expert_used": int(info.get("n_expert_used", 0) or 0), "layers": layers})


ROUTES = {
    "/health": ("GET", _health, False),
    "/metrics": ("GET", _metrics, False),
    "/profile": ("GET", _profile, False),
    "/experts": ("GET", _experts, False),
    "/v1/models": ("GET", lambda ctx, _: openai_api.list_models(ctx), False),
    "/v1/chat/completions": ("POST", openai_api.chat_completions, True),
    "/v1/completions": ("POST", openai_api.completions, True),
    "/v1/messages": ("POST", anthropic_api.messages, True),
    "/v1/messages/count_tokens": ("POST", anthropic_api.count_tokens, True),
    "/v1/responses": ("POST", responses_api.responses, True),
    "/tokenize": ("POST", tokens_api.tokenize, True),
    "/detokenize": ("POST", tokens_api.detokenize, True),
}


# ------------------------------------------------------------------ handler
class Handler(BaseHTTPRequestHandler):
    """One connection: requests read by `conn.Reader` (strict framing, one
    deadline per request), answered through the ctx interface the API
    modules use (send_json, start_sse, sse, gone, ...)."""

    protocol_version = "HTTP/1.1"
    server_version = "colibri-lab"
    sys_version = ""

    # -- plumbing
    def setup(self):
        self.srv = self.server.app
        self.lim = self.srv.limits
        super().setup()
        try:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        self.reader = Reader(self.connection, self.lim)
        self.conn = self.server.conn_of(self.connection)
        self._wlock = threading.Lock()   # one writer at a time: this thread, or the scheduler's (try_write)
        self._rest = b""                 # bytes try_write could not send: they go out before anything else
        self.request_version = "HTTP/1.1"
        self.requestline = ""
        self.command = ""

    @property
    def engine(self):
        return self.srv.engine

    def log_message(self, fmt, *args):
        if self.srv.log_requests:
            sys.stderr.write(f"{self.address_string()} - {fmt % args}\n")

    def handle(self):
        self.close_connection = False
        while not self.close_connection:
            if not self._one_request():
                break

    def _one_request(self) -> bool:
        conn = self.conn
        if conn is not None:
            conn.set("idle")
        if not self.reader.wait_request() or (conn is not None and conn.evicted):
            return False
        if conn is not None:
            conn.set("head")
        self.reader.start()
        self.rid = _new_rid()
        self._cors = None
        self.endpoint = "other"
        self.sse_started = False
        try:
            req = self.reader.head()
        except HttpError as e:
            self._framing_error(e)
            return False
        except Closed:
            if conn is not None and conn.evicted:
                self._framing_error(HttpError(408, "the request did not arrive before the server needed the "
                                                   "connection (it is at its connection limit)",
                                              code="request_timeout"))
            return False
        self.req = req
        self.command = req.method
        self.requestline = req.raw_line
        self.request_version = f"HTTP/{req.version[0]}.{req.version[1]}"
        self.headers = req.headers
        conn_hdr = ",".join(req.headers.get_all("connection")).lower()
        if req.version >= (1, 1):
            self.close_connection = "close" in conn_hdr
        else:
            self.close_connection = "keep-alive" not in conn_hdr
        if conn is not None and conn.overflow:
            self.close_connection = True
        self._dispatch(req.method)
        return not self.close_connection

    def finish(self):
        super().finish()
        if getattr(self, "_linger", False):
            _linger(self.connection)

    def _framing_error(self, e: HttpError) -> None:
        """A request whose framing is broken: a status line, an OpenAI-shape body, close."""
        self.close_connection = True
        self._linger = True
        self.endpoint = "other"
        try:
            self.connection.settimeout(min(5.0, self.lim.read_timeout_s))
            self._send_json(e.status, ApiError(e.status, e.message, code=e.code).openai())
        except OSError:
            pass

    def send_error(self, code, message=None, explain=None):
        """Framework-level errors, in the OpenAI shape (not reached by the strict reader's requests)."""
        self._framing_error(HttpError(code, message or explain or "bad request"))

    # -- dispatch
    def _dispatch(self, method: str) -> None:
        self.t0 = time.perf_counter()
        self.last_write = time.monotonic()
        self._body_read = not (self.req.body_len or self.req.chunked)
        rid = self.headers.get("x-request-id", "")
        if _RID.fullmatch(rid or ""):
            self.rid = rid
        target = self.req.target
        self.host_value = self.headers.get("Host")
        path = target
        anth = False
        try:
            if target.startswith("/"):
                path = urllib.parse.urlsplit(target).path
            elif "://" in target:
                # absolute-form: the authority in the target is the host (RFC 9112 3.2.2)
                u = urllib.parse.urlsplit(target)
                if u.scheme.lower() not in ("http", "https") or not u.netloc or "@" in u.netloc:
                    raise ApiError(400, "malformed absolute-form request target", code="bad_request")
                self.host_value = u.netloc
                path = u.path or "/"
            elif target == "*" and method == "OPTIONS":
                path = "*"
            else:
                raise ApiError(400, "the request target must be a path ('/...') or an absolute URI",
                               code="bad_request")
            self.endpoint = path if path in ROUTES else ("/v1/models/{id}" if path.startswith("/v1/models/")
                                                         else "other")
            anth = path.startswith("/v1/messages")
            self._check_host()
            self._check_origin()
            if self.conn is not None and self.conn.overflow and path != "/health":
                raise ApiError(503, "the server is at its connection limit; retry shortly (/health is still "
                                    "answered)", code="too_many_connections", headers={"Retry-After": "1"})
            if method == "OPTIONS":
                return self._preflight()
            if method == "HEAD":
                method = "GET"
            if path.startswith("/v1/models/"):
                route = ("GET", lambda ctx, _: openai_api.get_model(ctx, urllib.parse.unquote(path[len("/v1/models/"):])),
                         False)
            else:
                route = ROUTES.get(path)
            if route is None:
                raise ApiError(404, f"no route for {method} {path}", code="not_found")
            want, fn, needs_engine = route
            if method != want:
                raise ApiError(405, f"{path} accepts {want}, not {method}", code="method_not_allowed",
                               headers={"Allow": f"{want}, OPTIONS"})
            self.authed = self.srv.check_key(self.headers)
            if not self.authed and path != "/health":
                raise ApiError(401, "invalid or missing API key (send 'Authorization: Bearer <key>' or "
                                    "'x-api-key: <key>')", code="invalid_api_key")
            if self.srv.shutting_down:
                raise ApiError(503, "the server is shutting down", code="shutting_down")
            if (needs_engine or path != "/health") and self.engine is None:
                raise ApiError(503, "the model is still loading; retry shortly", code="loading",
                               headers={"Retry-After": "2"})
            if self.conn is not None:
                self.conn.state = "body"
            body = self._read_json() if method == "POST" else None
            if self.conn is not None:
                self.conn.set("busy")
            # the request is in: writes get the whole per-read timeout again (the
            # reader may have left the socket with only the deadline's remainder)
            self.connection.settimeout(self.lim.read_timeout_s)
            convert.bind(self.gone, self.lim.convert_timeout_s)
            try:
                fn(self, body)
            finally:
                convert.unbind()
        except ApiError as e:
            self._error(e, anth)
        except HttpError as e:
            self._body_read = False
            self._error(ApiError(e.status, e.message, code=e.code), anth)
        except (ClientGone, Closed, convert.ClientLeft):
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, socket.timeout):
            self.close_connection = True
        except Exception as e:  # a bug: report it, keep serving
            traceback.print_exc()
            self._error(ApiError(500, f"internal error: {type(e).__name__}: {e}"), anth)

    def _error(self, e: ApiError, anth: bool) -> None:
        if not self._body_read:
            self.close_connection = True   # unread body bytes would be parsed as the next request
            self._linger = True
        if self.sse_started:
            try:
                if anth:
                    self.sse(e.anthropic(), event="error")
                else:
                    self.sse(e.openai())
            except ClientGone:
                pass
            self.close_connection = True
            return
        try:
            self._send_json(e.status, e.anthropic() if anth else e.openai(), e.headers)
        except OSError:
            self.close_connection = True

    # -- checks
    def _check_host(self) -> None:
        host = self.host_value
        if not host:
            raise ApiError(400, "missing Host header", code="bad_host")
        h = host.strip()
        if h.startswith("["):
            h = h[1:h.find("]")] if "]" in h else h
        elif h.count(":") == 1:
            h = h.rsplit(":", 1)[0]
        if not self.srv.host_allowed(h.lower().rstrip(".")):
            raise ApiError(403, f"Host {host!r} is not allowed (DNS-rebinding protection; add it with "
                                f"--allowed-host)", code="bad_host")

    def _check_origin(self) -> None:
        origin = self.headers.get("Origin")
        if origin is None:
            return
        if self.srv.origin_allowed(origin):
            self._cors = origin
            return
        try:
            same = urllib.parse.urlsplit(origin).netloc.lower() == (self.host_value or "").lower()
        except ValueError:
            same = False
        if not same:
            raise ApiError(403, f"Origin {origin!r} is not allowed (configure --cors-origin)", code="bad_origin")

    def _preflight(self) -> None:
        self.send_response(204)
        self._common_headers()
        self.send_header("Allow", "GET, POST, OPTIONS")
        if self._cors:
            self.send_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
            req = self.headers.get("Access-Control-Request-Headers")
            self.send_header("Access-Control-Allow-Headers", req if req and len(req) < 1024 else
                             "authorization, content-type, x-api-key, x-request-id, anthropic-version")
            self.send_header("Access-Control-Max-Age", "600")
        self.send_header("Content-Length", "0")
        self.end_headers()
        self.srv.metrics.count_http("OPTIONS", 204)

    def _read_body(self) -> bytes:
        req = self.req
        if not req.chunked and req.body_len == 0 and "content-length" not in req.headers:
            raise ApiError(411, "a POST needs a Content-Length header (or a chunked body) and a JSON body",
                           code="length_required")
        if req.body_len > self.lim.max_body_bytes:
            raise ApiError(413, f"request body is {req.body_len} bytes; the limit is {self.lim.max_body_bytes}",
                           code="request_too_large")
        if (self.headers.get("Expect") or "").lower() == "100-continue":
            self._write(b"HTTP/1.1 100 Continue\r\n\r\n")
        data = self.reader.chunked(self.lim.max_body_bytes) if req.chunked else self.reader.exact(req.body_len)
        self._body_read = True
        return data

    def _read_json(self):
        data = self._read_body()
        try:
            obj = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ApiError(400, f"request body is not UTF-8: {e}", code="invalid_json") from None
        except ValueError as e:
            raise ApiError(400, f"request body is not valid JSON: {e}", code="invalid_json") from None
        except RecursionError:
            raise ApiError(400, "request body JSON is nested too deeply", code="invalid_json") from None
        check_text(obj)
        return obj

    # -- responses (the ctx interface used by the API modules)
    def _common_headers(self) -> None:
        self.send_header("x-request-id", self.rid)
        if self._cors:
            self.send_header("Access-Control-Allow-Origin", self._cors)
            self.send_header("Vary", "Origin")
            self.send_header("Access-Control-Expose-Headers", "x-request-id, retry-after, x-schema-ignored")
        ign = convert.ignored()
        if ign is not None:  # a lenient request: what its schemas left out (the body has it too, unless streamed)
            self.send_header("x-schema-ignored", json.dumps(ign))

    def _send_json(self, status: int, obj, headers=None) -> None:
        self.send_text(status, json.dumps(obj, ensure_ascii=False), "application/json", headers)

    def send_json(self, status: int, obj) -> None:
        self._send_json(status, obj)

    def send_text(self, status: int, text: str, ctype: str, headers=None) -> None:
        data = text.encode("utf-8", "backslashreplace")   # never fails, whatever a message echoes
        self.send_response(status)
        self._common_headers()
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.srv.metrics.count_http(self.endpoint, status)

    def start_sse(self) -> None:
        try:
            self.send_response(200)
            self._common_headers()
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("X-Accel-Buffering", "no")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.flush()
        except OSError:
            raise ClientGone() from None
        self.close_connection = True
        self.sse_started = True
        self.last_write = time.monotonic()
        self.srv.metrics.count_http(self.endpoint, 200)

    def _write(self, data: bytes) -> None:
        with self._wlock:
            try:
                if self._rest:
                    rest, self._rest = self._rest, b""
                    self.wfile.write(rest)
                self.wfile.write(data)
            except OSError:
                self.close_connection = True
                raise ClientGone() from None
            self.last_write = time.monotonic()

    def try_write(self, data: bytes) -> bool:
        """Write from another thread (the scheduler's, between steps) without ever blocking: False
        when this thread is writing, earlier bytes are still unsent or the socket failed (then the
        caller hands the data to this thread instead).  Bytes the socket buffer cannot take now are
        kept and sent first by this thread's next write."""
        if not self._wlock.acquire(blocking=False):
            return False
        try:
            if self._rest or not self.sse_started:
                return False
            try:
                sock = self.connection
                # a socket with a timeout has a non-blocking fd; one without one is asked not to wait
                n = sock.send(data, socket.MSG_DONTWAIT) if sock.gettimeout() is None else os.write(sock.fileno(), data)
            except BlockingIOError:
                n = 0
            except OSError:
                return False
            if n < len(data):
                self._rest = data[n:]
            self.last_write = time.monotonic()
            return True
        finally:
            self._wlock.release()

    def sse(self, obj, event: str | None = None) -> None:
        payload = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
        head = f"event: {event}\n" if event else ""
        self._write(f"{head}data: {payload}\n\n".encode("utf-8", "backslashreplace"))

    def write_sse_bytes(self, data: bytes) -> None:
        """Write SSE events already serialised (a token chunk built for try_write that it could not send)."""
        self._write(data)

    def sse_comment(self, text: str) -> None:
        self._write(f": {text}\n\n".encode())

    def idle_s(self) -> float:
        return time.monotonic() - self.last_write

    def gone(self) -> bool:
        """True when the client has closed its end (checked between tokens)."""
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            if not r:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (BlockingIOError, InterruptedError, socket.timeout):
            return False
        except (OSError, ValueError):
            return True

    def health(self) -> None:
        srv = self.srv
        if srv.shutting_down:
            raise ApiError(503, "the server is shutting down", code="shutting_down")
        if srv.engine is None:
            self._send_json(503, {"status": "loading"}, {"Retry-After": "2"})
            return
        body = {"status": "ok"}
        if self.authed:
            eng = srv.engine
            sch = eng.scheduler
            n_slots = int(eng.params["n_slots"])
            body.update({
                "model": srv.model_id, "model_path": str(eng.model_path), "uptime_s": time.time() - srv.t_start,
                "engine": eng.params, "info": eng.info,
                "scheduler": {"n_slots": n_slots, "running": sch.n_running if sch is not None else 0,
                              "waiting": sch.n_waiting if sch is not None else 0,
                              "max_queue": getattr(sch, "_max_queue", None)},
                "connections": self.server.registry.snapshot(),
                "limits": dataclasses.asdict(srv.limits),
                "grammar": True,
            })
        self._send_json(200, body)


def _linger(sock, max_s: float = 2.0, max_bytes: int = 8 << 20) -> None:
    """Close after an early answer (413, 400 on framing) without losing it: a
    close with unread input makes the kernel send RST, which can discard the
    answer before the client reads it.  So: stop writing, read and drop what
    the client is still sending (bounded in time and bytes), then close."""
    try:
        sock.shutdown(socket.SHUT_WR)
        t_end = time.monotonic() + max_s
        got = 0
        while got < max_bytes:
            left = t_end - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            data = sock.recv(65536)
            if not data:
                break
            got += len(data)
    except OSError:
        pass


def _new_rid() -> str:
    import secrets
    return "req_" + secrets.token_hex(12)


# ---------------------------------------------------------------- the server
class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 1024

    def __init__(self, addr, handler, app, family):
        self.address_family = family
        self.app = app
        self.registry = Registry(app.limits)
        self._by_sock: dict = {}
        super().__init__(addr, handler)

    def conn_of(self, sock):
        return self._by_sock.get(id(sock))

    def process_request(self, request, client_address):
        c = self.registry.admit(request)
        if c is None:
            _reject(request)
            self.shutdown_request(request)
            return
        self._by_sock[id(request)] = c
        try:
            super().process_request(request, client_address)
        except Exception:
            self._forget(request)
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def _forget(self, request):
        c = self._by_sock.pop(id(request), None)
        if c is not None:
            self.registry.release(c)


def _reject(sock) -> None:
    """Beyond the cap and its /health reserve: a 503 written without reading the request."""
    body = json.dumps(ApiError(503, "the server is at its connection limit; retry shortly",
                               code="too_many_connections").openai()).encode()
    head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nx-request-id: {_new_rid()}\r\n"
            f"Connection: close\r\n\r\n").encode()
    try:
        sock.setblocking(False)
        sock.send(head + body)
    except OSError:
        pass


class Server:
    """An OpenAI/Anthropic-compatible HTTP server over an `Engine`.

        srv = Server(engine, port=0).start()   # background thread, ephemeral port
        srv.url                                # "http://127.0.0.1:PORT"
        srv.stop()

    engine may be None at first (requests answer 503 while loading) and set
    later with `set_engine`.  The server never closes the engine it was given.
    """

    def __init__(self, engine=None, host: str = "127.0.0.1", port: int = 8080, *, api_key: str | None = None,
                 model_id: str | None = None, cors_origins=(), allowed_hosts=(), max_body_bytes: int = 4 << 20,
                 keepalive_s: float = 15.0, limits: Limits | None = None, log_requests: bool = False, **limit_kw):
        if not is_loopback(host) and not api_key:
            raise ServerConfigError(
                f"refusing to listen on {host!r} without an API key: anyone who can reach it could use it. "
                f"Pass --api-key (or set COLIBRI_LAB_API_KEY), or bind 127.0.0.1.")
        self.host, self.port = host, int(port)
        self.api_key = api_key.encode() if api_key else None
        self.cors_origins = {o.rstrip("/") for o in cors_origins}
        h = host.strip("[]").lower()
        self.wildcard = h in ("", "0.0.0.0", "::")
        self.allowed_hosts = set(_LOOPBACK_NAMES) | {h} | {a.lower().strip("[]") for a in allowed_hosts}
        self.limits = dataclasses.replace(limits or Limits(), max_body_bytes=int(max_body_bytes), **limit_kw)
        self.max_body_bytes = self.limits.max_body_bytes
        self.keepalive_s = float(keepalive_s)
        self.log_requests = log_requests
        self.metrics = Metrics()
        self.t_start = time.time()
        self.shutting_down = False
        self._model_id = model_id
        self.engine = None
        self.fingerprint = "fp_colibri"
        self._httpd = None
        self._thread = None
        if engine is not None:
            self.set_engine(engine)

    # -- config
    def set_engine(self, engine) -> None:
        name = str(engine.model_name)
        if self._model_id is None:
            self._model_id = Path(name).stem if (name.endswith(".gguf") or "/" in name or "\\" in name) else name
        self.fingerprint = "fp_" + hashlib.sha1(f"{engine.model_path}|{engine.params}".encode()).hexdigest()[:10]
        self.engine = engine

    @property
    def model_id(self) -> str:
        return self._model_id or "unknown"

    def model_names(self) -> set:
        names = {self.model_id}
        if self.engine is not None:
            names.add(str(self.engine.model_name))
        return names

    def check_key(self, headers) -> bool:
        if self.api_key is None:
            return True
        cand = headers.get("x-api-key")
        auth = headers.get("Authorization") or ""
        if auth[:7].lower() == "bearer ":
            cand = auth[7:].strip()
        if not cand:
            return False
        return hmac.compare_digest(cand.encode("utf-8", "replace"), self.api_key)

    def host_allowed(self, h: str) -> bool:
        if "*" in self.allowed_hosts or h in self.allowed_hosts:
            return True
        # names are what DNS rebinding abuses; a literal IP cannot be rebound
        return self.wildcard and _is_ip(h)

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.cors_origins or origin.rstrip("/") in self.cors_origins

    def render_metrics(self) -> str:
        eng = self.engine
        running = waiting = n_slots = 0
        if eng is not None and eng.scheduler is not None:
            running = eng.scheduler.n_running
            waiting = eng.scheduler.n_waiting
            n_slots = int(eng.params["n_slots"])
        conns = self._httpd.registry.snapshot() if self._httpd is not None else None
        return self.metrics.render(running, waiting, self.model_id, n_slots, conns)

    # -- lifecycle
    def _bind(self) -> None:
        h = self.host.strip("[]")
        family = socket.AF_INET6 if ":" in h else socket.AF_INET
        self._httpd = _HTTPServer((h, self.port), Handler, self, family)
        self.port = self._httpd.server_address[1]

    @property
    def url(self) -> str:
        h = self.host.strip("[]")
        if h in ("", "0.0.0.0"):
            h = "127.0.0.1"
        elif h == "::":
            h = "::1"
        return f"http://[{h}]:{self.port}" if ":" in h else f"http://{h}:{self.port}"

    def start(self) -> "Server":
        """Listen and serve on a background thread; returns self."""
        if self._httpd is None:
            self._bind()
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="colibri-http", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        if self._httpd is None:
            self._bind()
        self._httpd.serve_forever(poll_interval=0.5)

    def stop(self) -> None:
        """Stop accepting, answer 503 to anything still arriving, close the socket."""
        self.shutting_down = True
        if self._httpd is not None:
            if self._thread is not None:
                self._httpd.shutdown()
                self._thread.join(5)
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
