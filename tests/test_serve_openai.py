"""OpenAI-compatible endpoints through the official `openai` SDK, against a live
server on SmolLM2 (greedy unless a test says otherwise, small max_tokens)."""
from __future__ import annotations

import json
from typing import Literal

import openai
import pytest
from pydantic import BaseModel

from colibri_lab.server import Server
from test_serve_util import raw, sse_events, wait_idle

pytestmark = pytest.mark.smollm2

MSG = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server_kwargs():
    return dict(keepalive_s=15.0)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat(client, **kw):
    kw.setdefault("model", "smollm2")
    kw.setdefault("messages", MSG)
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 8)
    return client.chat.completions.create(**kw)


# ------------------------------------------------------------------ chat
def test_chat_matches_engine_and_reports_usage_and_timings(client, engine):
    r = chat(client)
    want = engine.chat(MSG, max_tokens=8, temperature=0)
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert c.message.content == want.text
    assert c.finish_reason == ("length" if want.finish_reason == "length" else "stop")
    assert r.usage.prompt_tokens == len(want.prompt_tokens)
    assert r.usage.completion_tokens == len(want.tokens)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0
    t = r.model_extra["timings"]
    for k in ("cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
              "predicted_ms", "predicted_per_token_ms", "predicted_per_second", "draft_n", "draft_n_accepted"):
        assert k in t, k
    assert t["predicted_n"] == r.usage.completion_tokens
    assert t["cache_n"] + t["prompt_n"] == r.usage.prompt_tokens


def test_second_turn_reuses_prefix(client):
    chat(client, max_tokens=2)
    r = chat(client, max_tokens=2)
    # the same prompt again: almost all of it comes from the KV prefix cache
    assert r.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens // 2


def test_chat_stream_matches_non_stream_without_usage(client):
    full = chat(client).choices[0].message.content
    chunks = list(chat(client, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    assert all(ch.choices for ch in chunks), "no usage chunk without stream_options.include_usage"
    assert all(ch.usage is None for ch in chunks)
    assert "timings" in chunks[-1].model_extra


def test_chat_stream_include_usage(client, server):
    chunks = list(chat(client, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == []
    u = chunks[-1].usage
    assert u is not None and u.completion_tokens > 0 and u.prompt_tokens > 0
    assert u.prompt_tokens_details.cached_tokens >= 0
    assert all(ch.usage is None for ch in chunks[:-1])
    # on the wire: every chunk carries the key, null except the last; then [DONE]
    body = {"model": "smollm2", "messages": MSG, "max_tokens": 4, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    st, _, data = raw(server, "POST", "/v1/chat/completions", body)
    evs = [json.loads(d) for _, d in sse_events(data) if d != "[DONE]"]
    assert st == 200 and all("usage" in e for e in evs) and sum(e["usage"] is not None for e in evs) == 1
    assert data.rstrip().endswith(b"data: [DONE]")


def test_chat_stop_string(client):
    base = chat(client, max_tokens=10).choices[0].message.content
    words = base.split()
    assert len(words) >= 2, base
    stop = " " + words[1]
    r = chat(client, max_tokens=10, stop=[stop])
    assert r.choices[0].message.content == base[:base.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    s = "".join(ch.choices[0].delta.content or "" for ch in chat(client, max_tokens=10, stop=stop, stream=True)
                if ch.choices)
    assert s == base[:base.index(stop)]


def test_chat_logprobs(client):
    r = chat(client, max_tokens=4, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    assert "".join(e.token for e in lp).startswith(r.choices[0].message.content[:3])
    for e in lp:
        assert e.logprob <= 0.0
        assert len(e.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert abs(e.top_logprobs[0].logprob - e.logprob) < 1e-4
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
    stream_lp = [e for ch in chat(client, max_tokens=4, logprobs=True, top_logprobs=1, stream=True)
                 if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [e.token for e in stream_lp] == [e.token for e in lp]


def test_n_choices_parallel(client, engine):
    r = chat(client, n=2, max_tokens=6, temperature=0.9, seed=7)
    assert [c.index for c in r.choices] == [0, 1]
    assert 2 <= r.usage.completion_tokens <= 12
    # seeded: reproducible
    r2 = chat(client, n=2, max_tokens=6, temperature=0.9, seed=7)
    assert [c.message.content for c in r.choices] == [c.message.content for c in r2.choices]
    # streamed n=2 greedy: both choices present and identical to the greedy text
    greedy = chat(client, max_tokens=6).choices[0].message.content
    texts = {0: "", 1: ""}
    for ch in chat(client, n=2, max_tokens=6, stream=True):
        for c in ch.choices:
            texts[c.index] += c.delta.content or ""
    assert texts == {0: greedy, 1: greedy}


def test_sampling_params_accepted(client):
    r = chat(client, temperature=0.7, top_p=0.9, seed=3, presence_penalty=0.5, frequency_penalty=0.5,
             logit_bias={"28": -100}, max_completion_tokens=4,
             extra_body={"top_k": 20, "min_p": 0.05, "repeat_penalty": 1.1})
    assert r.usage.completion_tokens <= 4


def test_logit_bias_bans_token(client, engine):
    base = chat(client, max_tokens=3)
    first = engine.tokenize(base.choices[0].message.content)[0]
    r = chat(client, max_tokens=3, logit_bias={str(first): -100})
    assert engine.tokenize(r.choices[0].message.content or " ")[0] != first


def test_conversation_extension_and_multi_turn(client):
    msgs = MSG + [{"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Italy?"}]
    r = chat(client, messages=msgs, max_tokens=4, extra_body={"conversation": "conv-test-1"})
    r2 = chat(client, messages=msgs + [{"role": "assistant", "content": r.choices[0].message.content},
                                       {"role": "user", "content": "Thanks"}],
              max_tokens=2, extra_body={"conversation": "conv-test-1"})
    assert r2.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 2


# ----------------------------------------------------------- completions
def test_completions_string_ids_list_echo(client, engine):
    prompt = "The capital of France is"
    want = engine.generate(prompt, max_tokens=5, temperature=0)
    r = client.completions.create(model="smollm2", prompt=prompt, max_tokens=5, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].text == want.text
    ids = engine.tokenize(prompt)
    r2 = client.completions.create(model="smollm2", prompt=ids, max_tokens=5, temperature=0)
    assert r2.choices[0].text == want.text
    r3 = client.completions.create(model="smollm2", prompt=[prompt, "Once upon a time"], max_tokens=3,
                                   temperature=0)
    assert [c.index for c in r3.choices] == [0, 1]
    assert r3.choices[0].text == engine.generate(prompt, max_tokens=3, temperature=0).text
    r4 = client.completions.create(model="smollm2", prompt=prompt, max_tokens=5, temperature=0, echo=True)
    assert r4.choices[0].text == prompt + want.text
    assert r.usage.prompt_tokens == len(ids) and r3.usage.prompt_tokens == len(ids) + len(
        engine.tokenize("Once upon a time"))


def test_completions_logprobs_legacy_format(client):
    r = client.completions.create(model="smollm2", prompt="1, 2, 3,", max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert all(len(t) <= 2 for t in lp.top_logprobs)
    assert all(v <= 0 for v in lp.token_logprobs)


def test_completions_stream(client, engine):
    want = engine.generate("Once upon a time", max_tokens=6, temperature=0).text
    chunks = list(client.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=6,
                                            temperature=0, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


# ------------------------------------------------------ structured output
class Answer(BaseModel):
    city: Literal["Paris", "Berlin", "Rome"]
    is_capital: bool


def test_structured_output_parse(client):
    r = client.chat.completions.parse(model="smollm2", messages=MSG, response_format=Answer, temperature=0,
                                      max_tokens=48)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Answer)


def test_json_object_mode(client):
    r = chat(client, max_tokens=48, response_format={"type": "json_object"},
             messages=[{"role": "user", "content": "Give a JSON object with a key 'a'."}])
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut by max_tokens: still a JSON prefix that starts an object
        assert r.choices[0].message.content.lstrip().startswith("{")


# ------------------------------------------------------------------ tools
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time",
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}
WMSG = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_tool_call_named(client):
    r = chat(client, messages=WMSG, tools=[WEATHER, TIME], max_tokens=40,
             tool_choice={"type": "function", "function": {"name": "get_weather"}})
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.content is None
    call = c.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments)["city"] in ("Paris", "London")


def test_tool_call_required_stream(client):
    chunks = list(chat(client, messages=WMSG, tools=[WEATHER], tool_choice="required", max_tokens=60,
                       parallel_tool_calls=False, stream=True))
    calls = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert calls and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments)["city"] in ("Paris", "London")
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_result_turn_renders(client):
    msgs = WMSG + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"},
    ]
    r = chat(client, messages=msgs, tools=[WEATHER], max_tokens=6)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r.usage.prompt_tokens > 20


# --------------------------------------------------------- other endpoints
def test_models(client, server):
    ms = client.models.list()
    assert [m.id for m in ms.data] == ["smollm2"]
    assert client.models.retrieve("smollm2").id == "smollm2"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_health_profile_experts_metrics(server, client):
    chat(client, max_tokens=2)
    st, h, data = raw(server, "GET", "/health")
    assert st == 200 and json.loads(data)["status"] == "ok" and h["x-request-id"]
    st, _, data = raw(server, "GET", "/profile")
    p = json.loads(data)
    assert st == 200 and p["window"] == 120 and 1 <= p["n"] <= 120
    assert {"ttft_ms", "e2e_ms", "completion_tokens"} <= set(p["requests"][-1])
    st, _, data = raw(server, "GET", "/experts")
    assert st == 200 and json.loads(data) == {"object": "experts", "moe": False, "n_expert": 0, "n_expert_used": 0,
                                              "layers": []}
    st, h, data = raw(server, "GET", "/metrics")
    text = data.decode()
    assert st == 200 and h["content-type"].startswith("text/plain")
    for name in ("time_to_first_token_seconds_bucket", "inter_token_latency_seconds_count",
                 "e2e_request_latency_seconds_sum", "request_queue_time_seconds_count", "prefix_cache_queries_total",
                 "prefix_cache_hits_total", "spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
                 "spec_decode_num_accepted_tokens_total", "prompt_tokens_total", "generation_tokens_total",
                 "request_success_total", "num_requests_running", "num_requests_waiting"):
        assert f"vllm:{name}" in text, name
    gen = [ln for ln in text.splitlines() if ln.startswith("vllm:generation_tokens_total")]
    assert int(gen[0].split()[-1]) >= 2


def _metric_samples(server, family):
    """{labels: value} of one vLLM-named /metrics family."""
    st, _, data = raw(server, "GET", "/metrics")
    assert st == 200
    out = {}
    for ln in data.decode().splitlines():
        if ln.startswith(f"vllm:{family}{{"):
            labels, val = ln[len(f"vllm:{family}"):].rsplit(" ", 1)
            out[labels] = float(val)
    return out


def test_speculative_request_counts_in_metrics(server, client):
    """A speculative request's drafts, draft tokens, accepted tokens and accepted
    tokens per draft position reach /metrics under vLLM's names."""
    names = ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
             "spec_decode_num_accepted_tokens_total")
    before = {n: sum(_metric_samples(server, n).values()) for n in names}
    pos_before = _metric_samples(server, "spec_decode_num_accepted_tokens_per_pos_total")
    code = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
    msgs = [{"role": "user", "content": f"Repeat this code exactly, twice:\n{code}"}]
    chat(client, messages=msgs, max_tokens=48,
         extra_body={"speculative": {"sources": ["prompt_lookup"], "k_max": 4, "adaptive": False}})
    after = {n: sum(_metric_samples(server, n).values()) for n in names}
    pos = _metric_samples(server, "spec_decode_num_accepted_tokens_per_pos_total")
    drafts, tokens, accepted = (after[n] - before[n] for n in names)
    assert drafts > 0 and tokens >= drafts and 0 < accepted <= tokens
    assert all('position="' in k for k in pos) and pos
    gained = {k: v - pos_before.get(k, 0.0) for k, v in pos.items()}
    assert sum(gained.values()) == accepted and gained['{model_name="smollm2",position="0"}'] > 0


def test_request_id_echo_and_generate(server):
    st, h, _ = raw(server, "GET", "/v1/models", headers={"x-request-id": "my-req.42"})
    assert h["x-request-id"] == "my-req.42"
    st, h, _ = raw(server, "GET", "/v1/models", headers={"x-request-id": "bad id with spaces\t"})
    assert h["x-request-id"].startswith("req_")
    st, h, _ = raw(server, "GET", "/nope")
    assert st == 404 and h["x-request-id"]


def test_keepalive_comments(engine):
    srv = Server(engine, port=0, model_id="smollm2", keepalive_s=0.001).start()
    try:
        wait_idle(engine)
        # a prompt long enough that its prefill is a silence longer than the stream's
        # 10 ms polling tick however fast the engine is (a short one can finish first)
        prompt = " ".join(["Zebras quietly juggle purple umbrellas while seven tired otters debate quantum "
                           "soup recipes near a lighthouse at dawn."] * 40)
        body = {"model": "smollm2", "prompt": prompt, "max_tokens": 3, "temperature": 0, "stream": True}
        st, h, data = raw(srv, "POST", "/v1/completions", body)
        assert st == 200 and h["content-type"].startswith("text/event-stream")
        assert b": keep-alive\n\n" in data
        assert data.rstrip().endswith(b"data: [DONE]")
    finally:
        srv.stop()
