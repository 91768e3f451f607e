"""JSON Schemas over HTTP as through the Engine (issue #16): one definition of
the schema limits (colibri_lab.schema.limits) refuses the same oversized
schema with the same message through Engine, the OpenAI route and the
Anthropic route (HTTP 400 invalid_request_error), and the `lenient` request
parameter does what Engine(lenient=True) does, the response saying what it
left out."""
from __future__ import annotations

import json
import time

import pytest

from colibri_lab.errors import SchemaError
from test_serve_util import assert_openai_error, raw, sse_events, wait_idle

pytestmark = pytest.mark.smollm2

MSG = [{"role": "user", "content": "Hi"}]
LENIENT_SCHEMA = {"type": "object", "properties": {"when": {"type": "string", "format": "color"}},
                  "required": ["when"]}
IGNORED = [{"keyword": "format", "path": "#/properties/when", "reason": "format 'color' is not enforced"}]


def _openai(schema, **extra):
    return dict({"model": "smollm2", "messages": MSG, "max_tokens": 24, "temperature": 0,
                 "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}},
                **extra)


def _anthropic(schema, **extra):
    return dict({"model": "smollm2", "messages": MSG, "max_tokens": 24, "temperature": 0,
                 "output_config": {"format": {"type": "json_schema", "schema": schema}}}, **extra)


@pytest.mark.parametrize("schema", [
    {"type": "string", "enum": [f"v{i}" for i in range(1025)]},
    {"anyOf": [{"const": i} for i in range(257)]},
    {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(10_001)}},
    __import__("functools").reduce(lambda a, _: {"items": a}, range(70), {"type": "integer"}),
    {"type": "string", "description": "x" * (300 << 10)},
], ids=["enum", "anyOf", "values", "depth", "bytes"])
def test_oversized_schema_same_error_engine_openai_anthropic(engine, server, schema):
    # bounded work, not a timing: CPU seconds of this process (engine, server and
    # client threads), which other processes' load on the machine does not inflate
    t0 = time.process_time()
    with pytest.raises(SchemaError) as ei:
        engine.generate("x", json_schema=schema, max_tokens=4)
    msg = str(ei.value)
    assert msg.startswith("JSON Schema too large") or msg.startswith("JSON Schema nests too deeply"), msg
    st, h, data = raw(server, "POST", "/v1/chat/completions", _openai(schema))
    err = assert_openai_error(st, h, data, 400, param_prefix="response_format", code="schema_too_large")
    assert err["type"] == "invalid_request_error" and err["message"] == f"response_format.json_schema.schema: {msg}"
    st, h, data = raw(server, "POST", "/v1/messages", _anthropic(schema))
    assert st == 400, data
    body = json.loads(data)
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    assert body["error"]["message"] == f"output_config.format.schema: {msg}"
    assert time.process_time() - t0 < 5.0
    wait_idle(engine)


def test_lenient_over_http_reports_what_it_ignored(engine, server):
    """Without lenient a format the converter cannot enforce is refused by name
    on both routes; with lenient=true the request runs, the output validates
    against what was enforced, and `schema_ignored` (body, and the
    x-schema-ignored header, also on streams) equals Engine.generate's."""
    want = engine.generate("x", json_schema=LENIENT_SCHEMA, lenient=True, max_tokens=24).schema_ignored
    assert want == IGNORED
    st, h, data = raw(server, "POST", "/v1/chat/completions", _openai(LENIENT_SCHEMA))
    err = assert_openai_error(st, h, data, 400, param_prefix="response_format")
    assert "'format'" in err["message"] and "#/properties/when" in err["message"]
    assert "x-schema-ignored" not in h
    st, h, data = raw(server, "POST", "/v1/messages", _anthropic(LENIENT_SCHEMA))
    assert st == 400 and "'format'" in json.loads(data)["error"]["message"]

    st, h, data = raw(server, "POST", "/v1/chat/completions", _openai(LENIENT_SCHEMA, lenient=True))
    assert st == 200, data
    body = json.loads(data)
    assert body["schema_ignored"] == want and json.loads(h["x-schema-ignored"]) == want
    assert isinstance(json.loads(body["choices"][0]["message"]["content"])["when"], str)
    st, h, data = raw(server, "POST", "/v1/messages", _anthropic(LENIENT_SCHEMA, lenient=True))
    assert st == 200, data
    body = json.loads(data)
    assert body["schema_ignored"] == want and json.loads(h["x-schema-ignored"]) == want
    assert isinstance(json.loads(body["content"][0]["text"])["when"], str)
    st, h, data = raw(server, "POST", "/v1/responses", {
        "model": "smollm2", "input": "Hi", "max_output_tokens": 24, "temperature": 0, "lenient": True,
        "text": {"format": {"type": "json_schema", "name": "s", "schema": LENIENT_SCHEMA}}})
    assert st == 200 and json.loads(data)["schema_ignored"] == want, data
    st, h, data = raw(server, "POST", "/v1/chat/completions", _openai(LENIENT_SCHEMA, lenient=True, stream=True))
    assert st == 200 and json.loads(h["x-schema-ignored"]) == want
    assert sse_events(data)[-1][1] == "[DONE]"
    # lenient with nothing to leave out says so; a strict request has no such field
    st, h, data = raw(server, "POST", "/v1/chat/completions", _openai({"type": "integer"}, lenient=True))
    assert st == 200 and json.loads(data)["schema_ignored"] == [] and json.loads(h["x-schema-ignored"]) == []
    st, h, data = raw(server, "POST", "/v1/chat/completions", _openai({"type": "integer"}))
    assert st == 200 and "schema_ignored" not in json.loads(data) and "x-schema-ignored" not in h
    st, h, data = raw(server, "POST", "/v1/chat/completions", _openai({"type": "integer"}, lenient="yes"))
    assert_openai_error(st, h, data, 400, param_prefix="lenient")
    wait_idle(engine)
