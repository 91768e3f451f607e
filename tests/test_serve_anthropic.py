"""Anthropic-compatible /v1/messages through the official `anthropic` SDK,
against a live server on SmolLM2."""
from __future__ import annotations

import json

from typing import Literal

import anthropic
import pytest
from pydantic import BaseModel

from test_serve_util import raw, sse_events

pytestmark = pytest.mark.smollm2

MSG = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}},
                            "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def create(client, temperature=0, **kw):
    """messages.create, greedy.  Current SDKs no longer take sampling parameters;
    the server still accepts them (older clients send them), so pass through extra_body."""
    kw.setdefault("model", "smollm2")
    kw.setdefault("messages", MSG)
    kw.setdefault("max_tokens", 8)
    kw["extra_body"] = dict(kw.get("extra_body") or {}, temperature=temperature)
    return client.messages.create(**kw)


def test_message_matches_engine(client, engine):
    r = create(client, system="You are terse.")
    want = engine.chat([{"role": "system", "content": "You are terse."}] + MSG, max_tokens=8, temperature=0)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_")
    assert [b.type for b in r.content] == ["text"]
    assert r.content[0].text == want.text
    assert r.stop_reason == ("max_tokens" if want.finish_reason == "length" else "end_turn")
    assert r.usage.output_tokens == len(want.tokens)
    assert r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) == len(want.prompt_tokens)


def test_system_blocks_equal_system_string(client):
    a = create(client, system="You are terse.")
    b = create(client, system=[{"type": "text", "text": "You are terse."}])
    assert a.content[0].text == b.content[0].text


def test_stop_sequence(client):
    base = create(client, max_tokens=10).content[0].text
    words = base.split()
    assert len(words) >= 2, base
    stop = " " + words[1]
    r = create(client, max_tokens=10, stop_sequences=[stop])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert r.content[0].text == base[:base.index(stop)]


def test_stream_event_sequence(client, server):
    full = create(client).content[0].text
    with client.messages.stream(model="smollm2", messages=MSG, max_tokens=8,
                                extra_body={"temperature": 0}) as s:
        events = list(s)
        final = s.get_final_message()
    types = [e.type for e in events]
    assert types[0] == "message_start"
    assert types[-1] == "message_stop"
    assert "content_block_start" in types and "content_block_stop" in types and "message_delta" in types
    assert final.content[0].text == full
    assert final.usage.output_tokens > 0
    # on the wire: message_start, content_block_start, ping, deltas..., stop, message_delta, message_stop
    body = {"model": "smollm2", "messages": MSG, "max_tokens": 8, "temperature": 0, "stream": True}
    st, h, data = raw(server, "POST", "/v1/messages", body)
    evs = sse_events(data)
    names = [e for e, _ in evs]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    for name, d in evs:
        assert json.loads(d)["type"] == name
    deltas = [json.loads(d)["delta"] for n, d in evs if n == "content_block_delta"]
    assert all(x["type"] == "text_delta" for x in deltas)
    assert "".join(x["text"] for x in deltas) == full
    md = json.loads(evs[-2][1])
    assert md["delta"]["stop_reason"] in ("end_turn", "max_tokens") and md["usage"]["output_tokens"] > 0


def test_max_tokens_stop_reason(client):
    r = create(client, max_tokens=2)
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 2


def test_tool_use_forced(client):
    r = create(client, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER],
               tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=40)
    assert r.stop_reason == "tool_use"
    blk = r.content[0]
    assert blk.type == "tool_use" and blk.name == "get_weather" and blk.id.startswith("toolu_")
    assert blk.input["city"] in ("Paris", "London")


def test_tool_use_stream_input_json_delta(client):
    with client.messages.stream(model="smollm2", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                max_tokens=40, extra_body={"temperature": 0}) as s:
        events = list(s)
        final = s.get_final_message()
    assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events)
    assert final.stop_reason == "tool_use"
    assert final.content[-1].type == "tool_use" and final.content[-1].input["city"] in ("Paris", "London")


def test_tool_result_round_trip(client):
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                               "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                          "content": "18 C and sunny"}]}]
    r = create(client, messages=msgs, tools=[WEATHER], max_tokens=6)
    assert r.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) > 20


class City(BaseModel):
    city: Literal["Paris", "Berlin", "Rome"]
    is_capital: bool


def test_structured_output_parse(client):
    r = client.messages.parse(model="smollm2", messages=MSG, max_tokens=48, output_format=City,
                              extra_body={"temperature": 0})
    assert isinstance(r.parsed_output, City)


def test_errors_anthropic_shape(client, server):
    with pytest.raises(anthropic.NotFoundError) as ei:
        create(client, model="claude-opus-9")
    assert ei.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as ei:
        create(client, extra_body={"thinking": {"type": "enabled"}})
    assert "thinking" in ei.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        create(client, messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}])
    with pytest.raises(anthropic.BadRequestError):
        create(client, temperature=-1)
    st, h, data = raw(server, "POST", "/v1/messages", {"model": "smollm2", "messages": MSG})
    body = json.loads(data)
    assert st == 400 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"] and h["x-request-id"]
    st, _, data = raw(server, "POST", "/v1/messages", b"{not json", headers={"Content-Type": "application/json"})
    assert st == 400 and json.loads(data)["type"] == "error"
    # still serving
    assert create(client, max_tokens=1).usage.output_tokens == 1
