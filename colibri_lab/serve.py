"""`python -m colibri_lab.serve`: OpenAI- and Anthropic-compatible HTTP server.

    python -m colibri_lab.serve --model smollm2 --port 8080
    curl localhost:8080/v1/chat/completions -H 'Content-Type: application/json' \\
         -d '{"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}]}'

Endpoints: POST /v1/chat/completions, /v1/completions, /v1/responses,
/v1/messages, /v1/messages/count_tokens, /tokenize, /detokenize;
GET /v1/models, /v1/models/{id}, /health, /profile, /experts, /metrics.
Standard library only (plus colibri_lab).  The CLI reuses this module:
`colibri-lab serve` calls `add_arguments(parser)` and `run(args)`.

Security defaults: binds 127.0.0.1; refuses any non-loopback address without
an API key (--api-key or COLIBRI_LAB_API_KEY); checks the Host header
against DNS rebinding (--allowed-host to add names); no CORS origins unless
--cors-origin; bodies over 4 MiB are refused.

Limits (see colibri_lab/server/limits.py): one global connection cap; at the
cap the longest-idle keep-alive connection is closed first, then the client
that has been sending its request longest, and /health is still answered;
every request's head and body must arrive within --request-timeout (408
otherwise), no single read waits longer than --read-timeout, an idle
keep-alive connection is closed after --idle-timeout.  JSON Schemas are
bounded before conversion (256 KiB, 20,000 nodes, 64 levels, 1,024 enum
values, 256 alternatives per anyOf/oneOf/allOf) and converted in a child
process stopped after --convert-timeout or when the client leaves; a GBNF
grammar is at most 256 KiB.  A request waits only when no KV slot is free;
past --max-queue waiting sequences it gets 429 with a Retry-After measured
from the completion rate.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from colibri_lab.server import Server, ServerConfigError, is_loopback  # noqa: F401
from colibri_lab.server.limits import Limits

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
    p.add_argument("--chunk", type=int, default=0,
                   help="rows of a step in which requests decode (0 = 3 per thread): the decoding streams' rows "
                        "first, new prompts share the rest (at least a quarter of it), so a prompt is spread over "
                        "several steps and no stream waits for a whole prefill between two tokens; a step with "
                        "nothing decoding prefills at full width")
    p.add_argument("--prompt-slack", type=float, default=None,
                   help="while streams decode, a step takes the most prompt rows whose measured step time is within "
                        "(1 + this) x a decode-only step (default 0.25; < 0: the --chunk budget alone)")
    p.add_argument("--max-queue", type=int, default=256, help="waiting requests before 429 (default 256)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow browser requests from this origin (repeatable; '*' = any)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="HOST",
                   help="extra Host header value to accept (repeatable; '*' disables the check)")
    p.add_argument("--model-id", default=None, help="model name reported in /v1/models (default: alias or file stem)")
    p.add_argument("--max-body", type=int, default=4 << 20, help="request body limit in bytes (default 4 MiB)")
    d = Limits()
    p.add_argument("--max-connections", type=int, default=d.max_connections,
                   help=f"open connections, all clients together (default {d.max_connections}); at the cap the "
                        f"longest-idle keep-alive connection, then the slowest sender, is closed; /health is "
                        f"answered on {d.health_reserve} more")
    p.add_argument("--request-timeout", type=float, default=d.request_timeout_s,
                   help=f"seconds for a request's whole head and body to arrive (default {d.request_timeout_s:g}; "
                        f"408 after)")
    p.add_argument("--read-timeout", type=float, default=d.read_timeout_s,
                   help=f"seconds one read may wait (default {d.read_timeout_s:g})")
    p.add_argument("--idle-timeout", type=float, default=d.idle_timeout_s,
                   help=f"seconds a keep-alive connection may wait for its next request (default "
                        f"{d.idle_timeout_s:g})")
    p.add_argument("--convert-timeout", type=float, default=d.convert_timeout_s,
                   help=f"seconds a JSON Schema conversion may run (default {d.convert_timeout_s:g}; 400 after)")
    p.add_argument("--keepalive", type=float, default=15.0, help="SSE keep-alive comment after this many idle seconds")
    p.add_argument("--log-requests", action="store_true", help="log each request to stderr")


def run(args: argparse.Namespace) -> int:
    """Start the server for parsed `args`; blocks until SIGINT/SIGTERM.  Returns an exit code."""
    api_key = args.api_key if args.api_key is not None else (os.environ.get("COLIBRI_LAB_API_KEY") or None)
    try:
        srv = Server(None, args.host, args.port, api_key=api_key, model_id=args.model_id,
                     cors_origins=args.cors_origin, allowed_hosts=args.allowed_host, max_body_bytes=args.max_body,
                     keepalive_s=args.keepalive, log_requests=args.log_requests,
                     max_connections=args.max_connections, request_timeout_s=args.request_timeout,
                     read_timeout_s=args.read_timeout, idle_timeout_s=args.idle_timeout,
                     convert_timeout_s=args.convert_timeout)
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
                            n_chunk=args.chunk, simd=args.simd, max_queue=args.max_queue,
                            prompt_slack=args.prompt_slack)
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
    ap = argparse.ArgumentParser(prog="python -m colibri_lab.serve", description=__doc__.split("\n")[0],
                                 epilog=__doc__[__doc__.index("Security defaults"):],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
