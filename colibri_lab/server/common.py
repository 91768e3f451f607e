"""Pieces shared by the OpenAI and Anthropic front ends: the API error type,
request-body validation with parameter names, ids, usage / timings objects,
grammar construction (response_format, tools) and tool-call parsing.

Standard library plus colibri_lab only.
"""
from __future__ import annotations

import json
import math
import re
import secrets
import time
from typing import Any, Iterable, Mapping

from colibri_lab import metrics as schema
from colibri_lab import schema as json_schema

from . import convert

__all__ = ["ApiError", "Body", "new_id", "usage_openai", "timings"]


class ApiError(Exception):
    """An error answered to the client.  `kind` is the OpenAI/Anthropic error
    type name; `param` names the offending field (OpenAI shape only)."""

    def __init__(self, status: int, message: str, kind: str | None = None, param: str | None = None,
                 code: str | None = None, headers: Mapping[str, str] | None = None):
        message = safe_text(message)
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind or _DEFAULT_KIND.get(status, "api_error")
        self.param = safe_text(param) if param is not None else None
        self.code = code
        self.headers = dict(headers or {})

    def openai(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def anthropic(self) -> dict:
        return {"type": "error", "error": {"type": _ANTHROPIC_KIND.get(self.status, self.kind),
                                            "message": self.message}}


_DEFAULT_KIND = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error",
    411: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error",
    431: "invalid_request_error", 500: "server_error", 501: "invalid_request_error",
    503: "service_unavailable", 505: "invalid_request_error",
}
_ANTHROPIC_KIND = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error",
    411: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error",
    431: "invalid_request_error", 500: "api_error", 501: "invalid_request_error",
    503: "overloaded_error", 505: "invalid_request_error",
}


def safe_text(s: str) -> str:
    """`s` with lone surrogates escaped (\\udXXX), so it always encodes as UTF-8:
    error messages echo what the client sent."""
    s = str(s)
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")


def check_text(data: Any) -> None:
    """The door check on a parsed JSON body: every string (keys included) must be
    valid Unicode (JSON lets a client send a lone surrogate such as "\\ud800",
    which no tokenizer or UTF-8 encoder takes), and nesting is bounded.  A 400
    names the first offending field."""
    from .limits import MAX_JSON_DEPTH
    stack = [(data, "", 0)]
    while stack:
        v, path, depth = stack.pop()
        if isinstance(v, str):
            if not _valid(v):
                raise bad(f"{path or 'the request body'} contains invalid Unicode (a lone surrogate)",
                          param=path or None, code="invalid_unicode")
        elif isinstance(v, dict):
            if depth >= MAX_JSON_DEPTH:
                raise bad(f"{path or 'the request body'} is nested deeper than {MAX_JSON_DEPTH} levels",
                          param=path or None)
            kids = []
            for k, x in v.items():
                p = f"{path}.{k}" if path else str(k)
                if not _valid(k):
                    raise bad(f"a field name in {path or 'the request body'} contains invalid Unicode "
                              f"(a lone surrogate): {safe_text(k)[:64]}", param=safe_text(p), code="invalid_unicode")
                kids.append((x, p, depth + 1))
            stack.extend(reversed(kids))   # depth first, in document order
        elif isinstance(v, list):
            if depth >= MAX_JSON_DEPTH:
                raise bad(f"{path or 'the request body'} is nested deeper than {MAX_JSON_DEPTH} levels",
                          param=path or None)
            stack.extend((v[i], f"{path}[{i}]", depth + 1) for i in range(len(v) - 1, -1, -1))


def _valid(s: str) -> bool:
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def now() -> int:
    return int(time.time())


# ------------------------------------------------------------------ validation
class Body:
    """A parsed JSON request body with typed, named accessors.

    `allowed` is the endpoint's allowlist; `ignored` are known-harmless fields
    accepted and dropped.  Anything else is a 400 that names the field."""

    def __init__(self, data: Any, allowed: Iterable[str], ignored: Iterable[str] = ()):
        if not isinstance(data, dict):
            raise bad(f"the request body must be a JSON object, got {_tname(data)}")
        allowed, ignored = set(allowed), set(ignored)
        unknown = sorted(k for k in data if k not in allowed and k not in ignored)
        if unknown:
            raise bad(f"unsupported field(s): {', '.join(unknown)} (this server rejects fields it does not "
                      f"implement rather than ignoring them)", param=unknown[0])
        self.d = {k: v for k, v in data.items() if k in allowed}

    def has(self, key: str) -> bool:
        return self.d.get(key) is not None

    def raw(self, key: str, default=None):
        v = self.d.get(key)
        return default if v is None else v

    def num(self, key: str, default: float | None, lo: float | None = None, hi: float | None = None,
            lo_open: bool = False) -> float | None:
        v = self.d.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise bad(f"{key} must be a number, got {_tname(v)}", param=key)
        if lo is not None and (v < lo or (lo_open and v == lo)):
            raise bad(f"{key} must be {'>' if lo_open else '>='} {lo}, got {v}", param=key)
        if hi is not None and v > hi:
            raise bad(f"{key} must be <= {hi}, got {v}", param=key)
        return float(v)

    def int(self, key: str, default: int | None, lo: int | None = None, hi: int | None = None) -> int | None:
        v = self.d.get(key)
        if v is None:
            return default
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise bad(f"{key} must be an integer, got {_tname(v)}", param=key)
        if lo is not None and v < lo:
            raise bad(f"{key} must be >= {lo}, got {v}", param=key)
        if hi is not None and v > hi:
            raise bad(f"{key} must be <= {hi}, got {v}", param=key)
        return v

    def bool(self, key: str, default: bool) -> bool:
        v = self.d.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise bad(f"{key} must be a boolean, got {_tname(v)}", param=key)
        return v

    def str(self, key: str, default: str | None = None, required: bool = False) -> str | None:
        v = self.d.get(key)
        if v is None:
            if required:
                raise bad(f"{key} is required", param=key)
            return default
        if not isinstance(v, str):
            raise bad(f"{key} must be a string, got {_tname(v)}", param=key)
        return v

    def obj(self, key: str) -> dict | None:
        v = self.d.get(key)
        if v is None:
            return None
        if not isinstance(v, dict):
            raise bad(f"{key} must be an object, got {_tname(v)}", param=key)
        return v

    def list(self, key: str) -> list | None:
        v = self.d.get(key)
        if v is None:
            return None
        if not isinstance(v, list):
            raise bad(f"{key} must be an array, got {_tname(v)}", param=key)
        return v


def _tname(v) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(v), type(v).__name__)


def check_keys(obj: Mapping, allowed: Iterable[str], where: str) -> None:
    unknown = sorted(set(obj) - set(allowed))
    if unknown:
        raise bad(f"{where}: unsupported field(s) {', '.join(unknown)}", param=f"{where}.{unknown[0]}")


def stop_list(v, key: str, max_n: int) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise bad(f"{key} must be a string or an array of strings", param=key)
    if len(v) > max_n:
        raise bad(f"{key} accepts at most {max_n} strings, got {len(v)}", param=key)
    if any(s == "" for s in v):
        raise bad(f"{key} must not contain empty strings", param=key)
    return list(v)


def logit_bias(v, key: str, n_vocab: int) -> dict[int, float]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise bad(f"{key} must be an object mapping token ids to biases", param=key)
    out = {}
    for k, b in v.items():
        try:
            tid = int(k)
        except (TypeError, ValueError):
            raise bad(f"{key}: key {k!r} is not a token id", param=key) from None
        if not 0 <= tid < n_vocab:
            raise bad(f"{key}: token id {tid} is out of range [0, {n_vocab})", param=key)
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b):
            raise bad(f"{key}[{k}] must be a number", param=key)
        out[tid] = float(min(100.0, max(-100.0, b)))
    return out


def seed_value(v, key: str = "seed"):
    """OpenAI seeds are any int64; the engine takes [0, 2**64)."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(f"{key} must be an integer", param=key)
    return v % (1 << 64)


# ------------------------------------------------------------- grammars
def check_schema_limits(schema: Any, param: str) -> None:
    """Refuse, before any conversion runs, a schema larger than the server
    converts (limits.py): conversion cost grows faster than linearly in enum
    and alternative counts, so a 4 MiB body could otherwise buy minutes of CPU."""
    from . import limits as L
    size = len(json.dumps(schema, ensure_ascii=False))
    if size > L.MAX_SCHEMA_BYTES:
        raise bad(f"{param}: the schema is {size} bytes; the limit is {L.MAX_SCHEMA_BYTES}", param=param,
                  code="schema_too_large")
    nodes = 0
    stack = [(schema, "", 0)]
    while stack:
        v, ptr, depth = stack.pop()
        nodes += 1
        if nodes > L.MAX_SCHEMA_NODES:
            raise bad(f"{param}: the schema has more than {L.MAX_SCHEMA_NODES} values", param=param,
                      code="schema_too_large")
        if depth > L.MAX_SCHEMA_DEPTH:
            raise bad(f"{param}: the schema nests deeper than {L.MAX_SCHEMA_DEPTH} levels (at {ptr or '/'})",
                      param=param, code="schema_too_large")
        if isinstance(v, dict):
            for key, limit, what in (("enum", L.MAX_ENUM, "values"), ("anyOf", L.MAX_ALTERNATIVES, "alternatives"),
                                     ("oneOf", L.MAX_ALTERNATIVES, "alternatives"),
                                     ("allOf", L.MAX_ALTERNATIVES, "subschemas"),
                                     ("prefixItems", L.MAX_ALTERNATIVES, "items")):
                x = v.get(key)
                if isinstance(x, list) and len(x) > limit:
                    raise bad(f"{param}: {key} at {ptr or '/'} has {len(x)} {what}; the limit is {limit}",
                              param=param, code="schema_too_large")
            stack.extend((x, f"{ptr}/{k}", depth + 1) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{ptr}/{i}", depth + 1) for i, x in enumerate(v))


def schema_grammar(engine, schema: Any, param: str, ctx=None) -> str:
    if not isinstance(schema, dict) and not isinstance(schema, bool):
        raise bad(f"{param} must be a JSON Schema object", param=param)
    check_schema_limits(schema, param)
    try:
        return convert.schema_to_gbnf(schema, ctx)
    except convert.ConversionTimeout as e:
        raise bad(f"{param}: {e}", param=param, code="schema_too_complex") from None
    except convert.ConversionError as e:
        if e.kind in ("SchemaError", "GrammarError", "InvalidRequestError"):
            raise bad(f"{param}: {e}", param=param) from None
        raise bad(f"{param}: unsupported or invalid schema ({e.kind}: {e})", param=param) from None


def json_object_grammar(engine, param: str) -> str:
    return json_schema.json_object_gbnf()


def response_format_grammar(engine, rf: Any, param: str = "response_format") -> str | None:
    """OpenAI response_format -> GBNF text, or None for plain text."""
    if rf is None:
        return None
    if not isinstance(rf, dict):
        raise bad(f"{param} must be an object", param=param)
    kind = rf.get("type")
    if kind == "text":
        check_keys(rf, {"type"}, param)
        return None
    if kind == "json_object":
        check_keys(rf, {"type"}, param)
        return json_object_grammar(engine, param)
    if kind == "json_schema":
        check_keys(rf, {"type", "json_schema"}, param)
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise bad(f"{param}.json_schema must be an object", param=f"{param}.json_schema")
        check_keys(js, {"name", "schema", "strict", "description"}, f"{param}.json_schema")
        if not isinstance(js.get("name"), str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", js["name"]):
            raise bad(f"{param}.json_schema.name must be 1-64 characters of a-z, A-Z, 0-9, _ and -",
                      param=f"{param}.json_schema.name")
        schema = js.get("schema", {"type": "object"})
        # strict or not, the schema is enforced: silently ignoring a schema is the
        # complaint users have about other servers.
        return schema_grammar(engine, schema, f"{param}.json_schema.schema")
    raise bad(f"{param}.type must be one of 'text', 'json_object', 'json_schema', got {kind!r}",
              param=f"{param}.type")


# --------------------------------------------------------------------- tools
# Tools are normalized to [{"name", "description", "parameters"}].
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def tool_call_schema(tools: list[dict], only: str | None, parallel: bool) -> dict:
    """JSON Schema of the model's tool-call output: {"name": ..., "arguments": {...}}
    (or a non-empty list of them when parallel)."""
    alts = []
    for t in tools:
        if only is not None and t["name"] != only:
            continue
        alts.append({"type": "object",
                     "properties": {"name": {"const": t["name"]},
                                    "arguments": t["parameters"] or {"type": "object"}},
                     "required": ["name", "arguments"], "additionalProperties": False})
    one = alts[0] if len(alts) == 1 else {"anyOf": alts}
    if parallel:
        return {"type": "array", "items": one, "minItems": 1}
    return one


def tool_system_text(tools: list[dict]) -> str:
    """Tool instructions for chat templates that do not render `tools` themselves."""
    spec = json.dumps([{"name": t["name"], "description": t.get("description") or "",
                        "parameters": t["parameters"] or {"type": "object"}} for t in tools],
                      ensure_ascii=False)
    return ("You can call these tools (each tool's arguments follow its JSON Schema):\n" + spec +
            "\nTo call a tool, reply with only a JSON object: "
            '{"name": "<tool name>", "arguments": {<arguments>}}. '
            "To call several tools, reply with a JSON array of such objects.")


def tool_call_text(calls: list[dict]) -> str:
    """How an earlier assistant tool call is shown to a template that cannot render tool_calls:
    the same JSON the model is asked to produce."""
    objs = [{"name": c["name"], "arguments": c["arguments"]} for c in calls]
    return json.dumps(objs[0] if len(objs) == 1 else objs, ensure_ascii=False)


_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)
_TAG = re.compile(r"^<tool_call>\s*(.*?)\s*(?:</tool_call>)?$", re.S)


def parse_tool_calls(text: str, tools: list[dict]) -> list[dict] | None:
    """The tool calls in a model's output, [{"name", "arguments": dict}], or None
    when the output is not (only) tool calls."""
    s = text.strip()
    for rx in (_FENCE, _TAG):
        m = rx.match(s)
        if m:
            s = m.group(1).strip()
    if not s or s[0] not in "{[":
        return None
    try:
        obj = json.loads(s)
    except ValueError:
        return None
    items = obj if isinstance(obj, list) else [obj]
    names = {t["name"] for t in tools}
    calls = []
    for it in items:
        if not isinstance(it, dict) or it.get("name") not in names:
            return None
        args = it.get("arguments", it.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        calls.append({"name": it["name"], "arguments": args})
    return calls or None


def looks_like_tool_call(prefix: str) -> bool | None:
    """For streaming under tool_choice auto: True if the output so far may be a
    tool call (buffer it), False if it is plain text, None if undecided."""
    s = prefix.lstrip()
    if not s:
        return None
    if s[0] in "{[":
        return True
    for lead in ("<tool_call>", "```"):
        if s.startswith(lead):
            return True
        if lead.startswith(s):
            return None
    return False


# ------------------------------------------------------------- usage, timings
def timings(m: Mapping) -> dict:
    """llama.cpp's `timings` object from a request's metrics (colibri_lab.metrics.LLAMACPP_TIMINGS)."""
    return schema.llamacpp_timings(m)


def usage_openai(prompt_tokens: int, cached: int, completion_tokens: int) -> dict:
    return schema.openai_usage({"prompt_tokens": prompt_tokens, "cached_tokens": cached,
                                "completion_tokens": completion_tokens})
