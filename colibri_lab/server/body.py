"""Request-body validation: the door check on a parsed JSON body (valid
Unicode, bounded nesting), typed accessors that name the offending field, and
the checks of fields several endpoints share (stop, logit_bias, seed).

Standard library only.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from .errors import bad, safe_text

__all__ = ["Body", "check_text", "check_keys", "stop_list", "logit_bias", "seed_value"]


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
