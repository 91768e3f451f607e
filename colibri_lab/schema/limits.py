"""What one JSON Schema may contain, checked before any conversion runs.

One definition for every caller: `Engine(json_schema=...)` and the server's
routes (response_format, tools' parameters, output_config.format,
text.format) refuse the same schema with the same message.  Conversion cost
grows faster than linearly in enum and alternative counts, so these bound the
work an untrusted schema can buy before the converter's own bounds
(convert.MAX_RULES, MAX_GBNF_BYTES, DEADLINE_S) apply.
"""
from __future__ import annotations

import json

from ..errors import SchemaError

MAX_SCHEMA_BYTES = 256 << 10      # the schema serialized as JSON
MAX_SCHEMA_NODES = 20000          # JSON values in it
MAX_SCHEMA_DEPTH = 64             # nesting of objects / arrays
MAX_ENUM = 1024                   # values in one enum (each becomes a grammar alternative)
MAX_ALTERNATIVES = 256            # subschemas in one anyOf / oneOf / allOf / prefixItems

_LISTS = (("enum", MAX_ENUM, "values"), ("anyOf", MAX_ALTERNATIVES, "alternatives"),
          ("oneOf", MAX_ALTERNATIVES, "alternatives"), ("allOf", MAX_ALTERNATIVES, "subschemas"),
          ("prefixItems", MAX_ALTERNATIVES, "items"))


def precheck(schema) -> None:
    """Refuse a schema (parsed value) beyond the limits above with a
    SchemaError naming the limit and where it was passed.  Linear in the
    document, stops at the first excess, never recurses."""
    nodes = 0
    stack = [(schema, "", 1)]
    while stack:
        v, ptr, depth = stack.pop()
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            raise SchemaError("JSON Schema too large: more than %d values" % MAX_SCHEMA_NODES)
        if depth > MAX_SCHEMA_DEPTH:
            raise SchemaError("JSON Schema nests too deeply: more than %d levels (at #%s)" % (MAX_SCHEMA_DEPTH, ptr))
        if isinstance(v, dict):
            for key, limit, what in _LISTS:
                x = v.get(key)
                if isinstance(x, list) and len(x) > limit:
                    raise SchemaError("JSON Schema too large: %r at #%s has %d %s (at most %d)"
                                      % (key, ptr, len(x), what, limit))
            stack.extend((x, "%s/%s" % (ptr, k), depth + 1) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, "%s/%d" % (ptr, i), depth + 1) for i, x in enumerate(v))
    try:
        size = len(json.dumps(schema, ensure_ascii=False))
    except (TypeError, ValueError) as exc:
        raise SchemaError("JSON Schema is not a JSON value: %s" % exc) from None
    if size > MAX_SCHEMA_BYTES:
        raise SchemaError("JSON Schema too large: %d bytes serialized (at most %d)" % (size, MAX_SCHEMA_BYTES))
