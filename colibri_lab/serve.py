"""`python -m colibri_lab.serve`: OpenAI- and Anthropic-compatible HTTP server.

    python -m colibri_lab.serve --model smollm2 --port 8080
    curl localhost:8080/v1/chat/completions -H 'Content-Type: application/json' \\
         -d '{"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}]}'

Endpoints: POST /v1/chat/completions, /v1/completions, /v1/messages;
GET /v1/models, /v1/models/{id}, /health, /profile, /experts, /metrics.
Standard library only (plus colibri_lab).  The CLI reuses this module:
`colibri-lab serve` calls `add_arguments(parser)` and `run(args)`.

Security defaults: binds 127.0.0.1; refuses any non-loopback address without
an API key (--api-key or COLIBRI_LAB_API_KEY); checks the Host header
against DNS rebinding (--allowed-host to add names); no CORS origins unless
--cors-origin; bodies over 4 MiB are refused.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from colibri_lab.server import Server, ServerConfigError, is_loopback  # noqa: F401

__all__ = ["Server", "ServerConfigError", "add_arguments", "run", "main"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The server's options (shared with `colibri-lab serve`)."""
    p.add_argument("--model", default="smollm2", help="model alias or GGUF path (default: smollm2)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 = any free port)")
    p.add_argument("--api-key", default=None,
                   help="require this key (Bearer or x-api-key); default: env COLIBRI_LAB_API_KEY")
    p.add_argument("--slots", type=int, default=4, help="concurrent sequences (KV slots), default 4")
    p.add_argument("--ctx", type=int, default=2048, help="context length per slot (default 2048)")
    p.add_argument("--threads", type=int, default=0, help="compute threads (0 = all cores)")
    p.add_argument("--simd", default="auto", choices=["auto", "avx512", "avx2", "scalar"])
    p.add_argument("--max-queue", type=int, default=256, help="waiting requests before 429 (default 256)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow browser requests from this origin (repeatable; '*' = any)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="HOST",
                   help="extra Host header value to accept (repeatable; '*' disables the check)")
    p.add_argument("--model-id", default=None, help="model name reported in /v1/models (default: alias or file stem)")
    p.add_argument("--max-body", type=int, default=4 << 20, help="request body limit in bytes (default 4 MiB)")
    p.add_argument("--max-conns-per-ip", type=int, default=64, help="concurrent connections per client IP")
    p.add_argument("--keepalive", type=float, default=15.0, help="SSE keep-alive comment after this many idle seconds")
    p.add_argument("--log-requests", action="store_true", help="log each request to stderr")


def run(args: argparse.Namespace) -> int:
    """Start the server for parsed `args`; blocks until SIGINT/SIGTERM.  Returns an exit code."""
    api_key = args.api_key if args.api_key is not None else (os.environ.get("COLIBRI_LAB_API_KEY") or None)
    try:
        srv = Server(None, args.host, args.port, api_key=api_key, model_id=args.model_id,
                     cors_origins=args.cors_origin, allowed_hosts=args.allowed_host, max_body_bytes=args.max_body,
                     keepalive_s=args.keepalive, max_conns_per_ip=args.max_conns_per_ip,
                     log_requests=args.log_requests)
        srv._bind()
    except ServerConfigError as e:
        print(f"colibri-lab serve: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"colibri-lab serve: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def _on_signal(signum, frame):
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            signal.signal(sig, _on_signal)
        except ValueError:  # not the main thread
            pass
    srv.start()  # answers 503 "loading" until the engine is ready
    print(f"colibri-lab serve: listening on {srv.url} (loading {args.model} ...)", file=sys.stderr, flush=True)
    engine = None
    try:
        from colibri_lab.engine import Engine
        from colibri_lab.errors import ColibriError
        try:
            engine = Engine(args.model, n_threads=args.threads, n_ctx=args.ctx, n_slots=args.slots,
                            simd=args.simd, max_queue=args.max_queue)
        except ColibriError as e:
            print(f"colibri-lab serve: cannot load model: {e}", file=sys.stderr)
            return 2
        srv.set_engine(engine)
        print(f"colibri-lab serve: ready: model {srv.model_id!r} {engine.params}"
              + ("" if api_key else " (no API key)"), file=sys.stderr, flush=True)
        while not stop.wait(0.5):
            pass
        return 0
    finally:
        srv.stop()
        if engine is not None:
            engine.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m colibri_lab.serve", description=__doc__.split("\n")[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
