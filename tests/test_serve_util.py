"""Helpers shared by the server tests (tests/test_serve_*.py); no tests here.

Each test module builds its own module-scoped Engine on SmolLM2
(n_threads=2, n_ctx=1024, n_slots=4) and a Server on 127.0.0.1 with an
ephemeral port.  COLIBRI_LAB_SIMD (default "auto") picks the kernels, for
builds where auto-detection and the compiled kernels disagree.
"""
from __future__ import annotations

import http.client
import json
import os
import time


def make_engine(path, **kw):
    from colibri_lab.engine import Engine

    kw.setdefault("n_threads", 2)
    kw.setdefault("n_ctx", 1024)
    kw.setdefault("n_slots", 4)
    kw.setdefault("simd", os.environ.get("COLIBRI_LAB_SIMD", "auto"))
    return Engine(path, **kw)


def raw(srv, method: str, path: str, body=None, headers=None, timeout: float = 120.0):
    """One HTTP request with http.client; returns (status, headers (lower-case keys), body bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    try:
        h = {"Host": f"127.0.0.1:{srv.port}"}
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        conn.close()


def sse_events(data: bytes):
    """Parse an SSE body into [(event or None, data str)], skipping comments."""
    out = []
    for block in data.decode("utf-8").split("\n\n"):
        ev, lines = None, []
        for line in block.split("\n"):
            if line.startswith(":") or not line:
                continue
            if line.startswith("event: "):
                ev = line[7:]
            elif line.startswith("data: "):
                lines.append(line[6:])
        if lines:
            out.append((ev, "\n".join(lines)))
    return out


def wait_idle(engine, timeout: float = 60.0) -> None:
    """Wait until the scheduler has nothing active or queued."""
    t_end = time.time() + timeout
    while time.time() < t_end:
        if engine.scheduler.n_active == 0 and engine.scheduler.queue_depth == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"engine still busy after {timeout}s: n_active={engine.scheduler.n_active}, "
                         f"queue={engine.scheduler.queue_depth}")


def assert_openai_error(status, headers, data, want_status, param_prefix=None, code=None):
    assert status == want_status, (status, data)
    body = json.loads(data)
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert headers.get("x-request-id")
    if param_prefix is not None:
        assert err["param"] and err["param"].startswith(param_prefix), err
    if code is not None:
        assert err["code"] == code, err
    return err
