"""Grammars from request fields: OpenAI's response_format and JSON Schemas
(bounded by limits.py, converted to GBNF in a child process by convert.py).

Standard library plus colibri_lab only.
"""
from __future__ import annotations

import re
from typing import Any

from colibri_lab import schema as json_schema

from . import convert
from .body import check_keys
from .errors import bad


def check_schema_limits(schema: Any, param: str) -> None:
    """Refuse, before any conversion runs, a schema beyond
    colibri_lab.schema.limits (the Engine's bounds too, with the same
    message): conversion cost grows faster than linearly in enum and
    alternative counts, so a 4 MiB body could otherwise buy minutes of CPU."""
    try:
        json_schema.precheck(schema)
    except json_schema.SchemaError as e:
        raise bad(f"{param}: {e}", param=param, code="schema_too_large") from None


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
