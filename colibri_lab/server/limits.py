"""Every limit the server enforces, defined once.

`Limits` holds the connection and request limits the command line can change
(`python -m colibri_lab.serve --help` lists them with these defaults); the
module constants bound what a request body may ask the server to build
(JSON Schemas, GBNF grammars) and are checked before any conversion runs;
the JSON Schema ones are colibri_lab.schema.limits', shared with the Engine.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    # connections: a global cap (not per client address: every local client is
    # 127.0.0.1); at the cap the longest-idle keep-alive connection is closed
    # first, then the slowest one still sending its request, and /health is
    # still answered on a small reserve beyond the cap
    max_connections: int = 512
    health_reserve: int = 32          # connections beyond the cap that may ask /health
    idle_timeout_s: float = 15.0      # keep-alive wait for the next request on a connection
    read_timeout_s: float = 30.0      # the longest wait for any one read
    request_timeout_s: float = 60.0   # the whole request (head and body) must arrive within this
    slow_after_s: float = 0.5         # at the cap, a request head still arriving after this long may be cut
    # the request itself
    max_head_bytes: int = 16 << 10    # request line plus headers
    max_headers: int = 100
    max_body_bytes: int = 4 << 20
    # conversions (JSON Schema -> grammar) run in a child process killed after this
    convert_timeout_s: float = 10.0


# what one JSON Schema may contain (response_format, tools' parameters,
# output_config.format, text.format): defined with the converter, which
# Engine(json_schema=...) runs too, so both refuse the same schemas alike
from colibri_lab.schema.limits import (MAX_ALTERNATIVES, MAX_ENUM, MAX_SCHEMA_BYTES,  # noqa: E402,F401
                                       MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES)
MAX_TOOLS = 128                   # tools in one request
# a GBNF grammar sent as text (the `grammar` extension)
MAX_GRAMMAR_BYTES = 256 << 10
# a request body's JSON nesting (checked by the door walk, after parsing)
MAX_JSON_DEPTH = 128
