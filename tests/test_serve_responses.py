"""OpenAI's Responses API (/v1/responses) through the official `openai` SDK,
streaming and not; Anthropic's count_tokens through the `anthropic` SDK;
/tokenize and /detokenize in llama.cpp's and vLLM's shapes."""
from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from test_serve_util import assert_openai_error, raw

pytestmark = pytest.mark.smollm2

Q = "What is the capital of France?"
TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
               "response.content_part.added"]
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                          "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def ant(server):
    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120)


def chat_text(oai, messages, max_tokens):
    r = oai.chat.completions.create(model="smollm2", messages=messages, max_tokens=max_tokens, temperature=0)
    return r.choices[0].message.content, r.usage


def test_create_matches_chat(oai):
    want, usage = chat_text(oai, [{"role": "user", "content": Q}], 12)
    r = oai.responses.create(model="smollm2", input=Q, max_output_tokens=12, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "smollm2"
    assert r.output_text == want
    assert [o.type for o in r.output] == ["message"] and r.output[0].content[0].type == "output_text"
    assert r.usage.input_tokens == usage.prompt_tokens and r.usage.output_tokens == usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.status in ("completed", "incomplete")
    if usage.completion_tokens == 12:
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"


def test_instructions_and_message_items_equal_chat(oai):
    want, _ = chat_text(oai, [{"role": "system", "content": "Answer in one word."},
                              {"role": "user", "content": Q}], 8)
    r = oai.responses.create(model="smollm2", instructions="Answer in one word.", max_output_tokens=8, temperature=0,
                             input=[{"role": "user", "content": [{"type": "input_text", "text": Q}]}])
    assert r.output_text == want and r.instructions == "Answer in one word."


def test_stream_event_sequence(oai):
    ref = oai.responses.create(model="smollm2", input=Q, max_output_tokens=10, temperature=0)
    events = list(oai.responses.create(model="smollm2", input=Q, max_output_tokens=10, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == TEXT_EVENTS, kinds
    n_delta = kinds.count("response.output_text.delta")
    assert n_delta >= 1 and kinds[4:4 + n_delta] == ["response.output_text.delta"] * n_delta
    final = "response.completed" if ref.status == "completed" else "response.incomplete"
    assert kinds[4 + n_delta:] == ["response.output_text.done", "response.content_part.done",
                                   "response.output_item.done", final], kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == ref.output_text == events[4 + n_delta].text
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert events[-1].response.output_text == ref.output_text and events[-1].response.usage.output_tokens >= 1
    item_id = events[2].item.id
    assert all(e.item_id == item_id for e in events if e.type.startswith("response.output_text"))


def test_stream_helper_final_response(oai):
    # the SDK's helper needs response.completed (an answer cut by max_output_tokens ends
    # with response.incomplete, as OpenAI's does), so the budget leaves room to finish
    ref = oai.responses.create(model="smollm2", input="Say hello.", max_output_tokens=64, temperature=0)
    assert ref.status == "completed"
    with oai.responses.stream(model="smollm2", input="Say hello.", max_output_tokens=64, temperature=0) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == final.output_text == ref.output_text


def test_function_call_and_follow_up(oai):
    r = oai.responses.create(model="smollm2", input="What is the weather in Paris?", tools=[WEATHER],
                             tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=40,
                             temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    # streamed, the same call arrives as argument events
    ev = list(oai.responses.create(model="smollm2", input="What is the weather in Paris?", tools=[WEATHER],
                                   tool_choice="required", parallel_tool_calls=False, max_output_tokens=40,
                                   temperature=0, stream=True))
    kinds = [e.type for e in ev]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    done = [e for e in ev if e.type == "response.function_call_arguments.done"][0]
    jsonschema.validate(json.loads(done.arguments), WEATHER["parameters"])
    # the next turn sends the call and its output back as input items
    r2 = oai.responses.create(model="smollm2", tools=[WEATHER], max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C and sunny"}])
    assert r2.status in ("completed", "incomplete") and r2.output


class City(BaseModel):
    name: str
    country: str


def test_parse_json_schema(oai):
    r = oai.responses.parse(model="smollm2", input="Name a city in France as JSON.", text_format=City,
                            max_output_tokens=60, temperature=0)
    assert isinstance(r.output_parsed, City)


def test_errors(oai, server):
    with pytest.raises(openai.BadRequestError) as ei:
        oai.responses.create(model="smollm2", input=Q, previous_response_id="resp_123")
    assert ei.value.param == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as ei:
        oai.responses.create(model="smollm2", input=Q, tools=[{"type": "web_search"}])
    assert ei.value.param.startswith("tools[0]")
    with pytest.raises(openai.NotFoundError):
        oai.responses.create(model="gpt-5", input=Q)
    for body, param in (({"input": []}, "input"), ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
                        ({"input": Q, "frobnicate": 1}, "frobnicate"),
                        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]},
                         "input[0].call_id"),
                        ({"input": Q, "text": {"format": {"type": "xml"}}}, "text.format.type")):
        st, h, data = raw(server, "POST", "/v1/responses", dict(model="smollm2", **body))
        assert_openai_error(st, h, data, 400, param_prefix=param)


# ------------------------------------------------------------ count_tokens
def test_count_tokens_matches_messages_usage(ant):
    kw = dict(model="smollm2", system="Be brief.", messages=[{"role": "user", "content": Q}])
    n = ant.messages.count_tokens(**kw).input_tokens
    r = ant.messages.create(max_tokens=2, extra_body={"temperature": 0, "top_p": 1.0}, **kw)
    assert n == r.usage.input_tokens + r.usage.cache_read_input_tokens and n > 5
    tools = [{"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER["parameters"]}]
    assert ant.messages.count_tokens(tools=tools, **kw).input_tokens > n
    with pytest.raises(anthropic.BadRequestError) as ei:
        ant.messages.count_tokens(model="smollm2", messages=[])
    assert ei.value.body["type"] == "error"


def test_anthropic_stream_with_extra_body_sampling(ant):
    """anthropic 2.x has no temperature / top_p arguments: they travel in extra_body."""
    with ant.messages.stream(model="smollm2", messages=[{"role": "user", "content": Q}], max_tokens=6,
                             extra_body={"temperature": 0, "top_p": 0.9, "top_k": 5}) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    r = ant.messages.create(model="smollm2", messages=[{"role": "user", "content": Q}], max_tokens=6,
                            extra_body={"temperature": 0})
    assert text == final.content[0].text == r.content[0].text


# --------------------------------------------------- tokenize / detokenize
def test_tokenize_detokenize(server, engine):
    text = "Hello, world! 123"
    st, _, data = raw(server, "POST", "/tokenize", {"content": text})
    d = json.loads(data)
    assert st == 200 and d["tokens"] == engine.tokenize(text) and d["count"] == len(d["tokens"])
    assert d["max_model_len"] == engine.params["n_ctx"]
    st, _, data = raw(server, "POST", "/tokenize", {"model": "smollm2", "prompt": text, "add_special_tokens": False,
                                                    "with_pieces": True})
    pieces = json.loads(data)["tokens"]
    assert "".join(p["piece"] for p in pieces) == text and all(isinstance(p["id"], int) for p in pieces)
    st, _, data = raw(server, "POST", "/detokenize", {"tokens": engine.tokenize(text, add_special=False)})
    assert st == 200 and json.loads(data) == {"content": text, "prompt": text}
    st, _, data = raw(server, "POST", "/tokenize", {"messages": [{"role": "user", "content": Q}]})
    assert st == 200 and json.loads(data)["count"] == len(
        engine.tokenize(engine.apply_chat_template([{"role": "user", "content": Q}]), add_special=False))
    for path, body, param in (("/tokenize", {}, "content"), ("/tokenize", {"content": 5}, "content"),
                              ("/detokenize", {"tokens": [-1]}, "tokens[0]"),
                              ("/detokenize", {"tokens": "abc"}, "tokens")):
        st, h, data = raw(server, "POST", path, body)
        assert_openai_error(st, h, data, 400, param_prefix=param)
