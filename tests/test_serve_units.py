"""Pure-Python pieces of the server (no model): validation, tool-call parsing
and streaming decisions, timings, Prometheus histograms, CLI options."""
from __future__ import annotations

import argparse
import json

import jsonschema
import pytest

from colibri_lab.server.body import Body, logit_bias, stop_list
from colibri_lab.server.errors import ApiError
from colibri_lab.server.tools import parse_tool_calls, tool_call_schema
from colibri_lab.server.usage import timings
from colibri_lab.server.metrics import Histogram, Metrics
from colibri_lab.server.openai_api import ChoiceStream
from colibri_lab.server.prep import ToolMode

TOOLS = [{"name": "get_weather", "description": "", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"name": "get_time", "description": "", "parameters": None}]


def test_body_allowlist_and_types():
    with pytest.raises(ApiError) as ei:
        Body({"model": "m", "wat": 1}, {"model"})
    assert ei.value.status == 400 and ei.value.param == "wat"
    b = Body({"model": "m", "user": "u", "t": 0.5, "n": 2.0}, {"model", "t", "n"}, ignored={"user"})
    assert "user" not in b.d
    assert b.num("t", 1.0, 0, 2) == 0.5 and b.int("n", 1, 1) == 2
    for bad in ("x", True, float("nan")):
        with pytest.raises(ApiError):
            Body({"t": bad}, {"t"}).num("t", 1.0)
    with pytest.raises(ApiError):
        Body([], {"t"})


def test_logit_bias_clamped_and_checked():
    assert logit_bias({"5": 250, "6": -1000, "7": 3}, "logit_bias", 10) == {5: 100.0, 6: -100.0, 7: 3.0}
    for bad in ({"x": 1}, {"10": 1}, {"-1": 1}, {"1": "a"}, [1]):
        with pytest.raises(ApiError):
            logit_bias(bad, "logit_bias", 10)


def test_stop_list():
    assert stop_list("a", "stop", 4) == ["a"]
    assert stop_list(None, "stop", 4) == []
    for bad in (["a"] * 5, [""], 3, ["a", 1]):
        with pytest.raises(ApiError):
            stop_list(bad, "stop", 4)


def test_parse_tool_calls():
    one = parse_tool_calls('{"name": "get_weather", "arguments": {"city": "Paris"}}', TOOLS)
    assert one == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    many = parse_tool_calls('[{"name": "get_time", "arguments": {}}, '
                            '{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}]', TOOLS)
    assert [c["name"] for c in many] == ["get_time", "get_weather"] and many[1]["arguments"] == {"city": "Rome"}
    fenced = parse_tool_calls('```json\n{"name": "get_time", "arguments": {}}\n```', TOOLS)
    tagged = parse_tool_calls('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>', TOOLS)
    assert fenced == tagged == [{"name": "get_time", "arguments": {}}]
    for text in ("Hello", '{"name": "nope", "arguments": {}}', '{"name": "get_time", "arguments": 3}',
                 '{"name": "get_time"', "[]", ""):
        assert parse_tool_calls(text, TOOLS) is None, text


def test_tool_call_schema_validates_calls():
    s = tool_call_schema(TOOLS, None, parallel=False)
    jsonschema.validate({"name": "get_weather", "arguments": {"city": "Paris"}}, s)
    jsonschema.validate({"name": "get_time", "arguments": {}}, s)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_weather", "arguments": {}}, s)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "other", "arguments": {}}, s)
    named = tool_call_schema(TOOLS, "get_time", parallel=False)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_weather", "arguments": {"city": "x"}}, named)
    par = tool_call_schema(TOOLS, None, parallel=True)
    jsonschema.validate([{"name": "get_time", "arguments": {}}], par)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([], par)


def test_choice_stream_auto_decides():
    tm = ToolMode(tools=TOOLS, choice="auto")
    st = ChoiceStream(tm)
    assert st.feed(" ") == ""            # undecided: whitespace only
    assert st.feed("Hel") == " Hel"       # plain text: flushed and passed through from then on
    assert st.feed("lo") == "lo"
    assert st.finish() == ("", None)
    st = ChoiceStream(tm)
    assert st.feed('{"name": "get_time", ') == ""
    assert st.feed('"arguments": {}}') == ""
    assert st.finish() == ("", [{"name": "get_time", "arguments": {}}])
    st = ChoiceStream(tm)
    assert st.feed("{not a call}") == ""
    assert st.finish() == ("{not a call}", None)
    st = ChoiceStream(ToolMode())
    assert st.feed("{x") == "{x"


def test_timings_shape():
    t = timings({"prompt_tokens": 30, "cached_tokens": 10, "completion_tokens": 5, "prefill_ms": 40.0,
                 "decode_ms": 20.0, "draft_n": 3, "draft_accepted": 2})
    assert t["cache_n"] == 10 and t["prompt_n"] == 20 and t["prompt_per_token_ms"] == 2.0
    assert t["prompt_per_second"] == 500.0 and t["predicted_per_second"] == 250.0
    assert t["draft_n"] == 3 and t["draft_n_accepted"] == 2
    z = timings({})
    assert z["prompt_per_second"] == 0.0 and z["predicted_per_token_ms"] == 0.0


def test_histogram_and_render():
    h = Histogram((0.1, 1.0))
    h.observe(0.05)
    h.observe(0.5, n=3)
    h.observe(5.0)
    out = []
    h.render("x", out)
    assert out[:3] == ['x_bucket{le="0.1"} 1', 'x_bucket{le="1.0"} 4', 'x_bucket{le="+Inf"} 5']
    assert out[-1] == "x_count 5"
    m = Metrics()
    m.record({"prompt_tokens": 10, "cached_tokens": 4, "completion_tokens": 3, "ttft_ms": 50, "tpot_ms": 10,
              "itl_ms": [4.0, 300.0], "e2e_ms": 80, "queue_ms": 1, "finish_reason": "stop"})
    text = m.render(1, 2, "m", n_slots=4)
    assert 'vllm:prefix_cache_hits_total{model_name="m"} 4' in text
    # inter-token latency: each true gap observed once, not the request's mean (10 ms) twice
    assert 'vllm:inter_token_latency_seconds_count{model_name="m"} 2' in text
    assert 'vllm:inter_token_latency_seconds_bucket{model_name="m",le="0.005"} 1' in text
    assert 'vllm:inter_token_latency_seconds_bucket{model_name="m",le="0.2"} 1' in text
    assert 'vllm:inter_token_latency_seconds_bucket{model_name="m",le="0.3"} 2' in text
    assert 'vllm:num_requests_waiting{model_name="m"} 2' in text
    assert 'vllm:kv_cache_usage_perc{model_name="m"} 0.25' in text
    assert 'finished_reason="stop"} 1' in text
    p = m.profile([{"step_ms": 2.0}, {"step_ms": 4.0}])
    assert p["n"] == 1 and p["prefix_cache_hit_rate"] == 0.4 and p["steps"]["step_ms_p50"] == 3.0


def test_cli_options_shared():
    from colibri_lab import serve

    ap = argparse.ArgumentParser()
    serve.add_arguments(ap)
    a = ap.parse_args(["--model", "x.gguf", "--port", "0", "--cors-origin", "https://a", "--cors-origin",
                       "https://b", "--allowed-host", "h", "--slots", "2", "--ctx", "512", "--threads", "1",
                       "--max-queue", "3", "--model-id", "mine", "--api-key", "k", "--chunk", "4"])
    assert a.cors_origin == ["https://a", "https://b"] and a.allowed_host == ["h"]
    assert (a.slots, a.ctx, a.threads, a.max_queue, a.model_id, a.api_key, a.host) == (2, 512, 1, 3, "mine", "k",
                                                                                      "127.0.0.1")
    assert a.chunk == 4 and ap.parse_args([]).chunk == 0


def test_error_shapes():
    e = ApiError(429, "slow down", headers={"Retry-After": "1"})
    assert e.openai() == {"error": {"message": "slow down", "type": "rate_limit_error", "param": None, "code": None}}
    assert e.anthropic() == {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    assert ApiError(503, "x").anthropic()["error"]["type"] == "overloaded_error"
    json.dumps(ApiError(400, "x", param="p", code="c").openai())


def test_metrics_vllm_names_and_types():
    """The series tools that read vLLM's /metrics look for, with vLLM's types."""
    m = Metrics()
    m.record({"prompt_tokens": 10, "cached_tokens": 4, "completion_tokens": 3, "ttft_ms": 50, "e2e_ms": 80,
              "draft_n": 6, "draft_accepted": 4, "draft_steps": 2, "draft_accepted_by_pos": [2, 2],
              "itl_ms": [10.0, 20.0], "finish_reason": "stop"})
    text = m.render(1, 0, "m", n_slots=4, conns={"open": 3, "evicted_idle": 1, "evicted_slow": 0, "refused": 0})
    types = dict(ln.split()[2:4] for ln in text.splitlines() if ln.startswith("# TYPE "))
    want = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
            "vllm:kv_cache_usage_perc": "gauge",
            "vllm:time_to_first_token_seconds": "histogram", "vllm:inter_token_latency_seconds": "histogram",
            "vllm:e2e_request_latency_seconds": "histogram", "vllm:request_queue_time_seconds": "histogram",
            "vllm:request_prefill_time_seconds": "histogram", "vllm:request_decode_time_seconds": "histogram",
            "vllm:request_prompt_tokens": "histogram", "vllm:request_generation_tokens": "histogram",
            "vllm:prompt_tokens_total": "counter", "vllm:generation_tokens_total": "counter",
            "vllm:prefix_cache_queries_total": "counter", "vllm:prefix_cache_hits_total": "counter",
            "vllm:request_success_total": "counter", "vllm:spec_decode_num_drafts_total": "counter",
            "vllm:spec_decode_num_draft_tokens_total": "counter",
            "vllm:spec_decode_num_accepted_tokens_total": "counter",
            "vllm:spec_decode_num_accepted_tokens_per_pos_total": "counter",
            "colibri:connections_open": "gauge", "colibri:connections_evicted_idle_total": "counter"}
    for name, kind in want.items():
        assert types.get(name) == kind, (name, types.get(name))
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 2' in text
    assert 'vllm:spec_decode_num_drafts_total{model_name="m"} 2' in text
    assert 'vllm:request_generation_tokens_count{model_name="m"} 1' in text
    # every sample line belongs to a declared family
    fams = set(types)
    for ln in text.splitlines():
        if ln and not ln.startswith("#"):
            name = ln.split("{")[0].split(" ")[0]
            base = name[:-len("_bucket")] if name.endswith("_bucket") else name
            base = base[:-len("_sum")] if base.endswith("_sum") else base
            base = base[:-len("_count")] if base.endswith("_count") else base
            assert name in fams or base in fams, ln


def test_retry_after_from_completion_rate():
    """Retry-After = requests ahead / completions per second over the last minute."""
    import collections
    import time as _time
    from types import SimpleNamespace

    from colibri_lab.scheduler import Scheduler

    now = _time.perf_counter()
    fake = SimpleNamespace(_done_times=collections.deque(now - 19.9 + 2 * i for i in range(10)))  # ~0.5 / s
    assert Scheduler._retry_after_locked(fake, 1) == 2
    assert Scheduler._retry_after_locked(fake, 10) == 20
    assert Scheduler._retry_after_locked(fake, 10_000) == 300          # capped
    fake.old = SimpleNamespace(_done_times=collections.deque([now - 120, now - 100]))  # outside the window
    assert Scheduler._retry_after_locked(fake.old, 5) == 1


def test_request_head_parser_total():
    """Any bytes give a Request or an HttpError with a status, never another exception."""
    from hypothesis import given, settings, strategies as st

    from colibri_lab.server.conn import HttpError, parse_head
    from colibri_lab.server.limits import Limits

    lim = Limits()
    parts = st.sampled_from([b"GET", b"POST", b" ", b"/", b"HTTP/1.1", b"HTTP/1.0", b"\r\n", b"\n", b":",
                             b"Host", b"Content-Length", b"Transfer-Encoding", b"chunked", b"5", b"-1", b",",
                             b"\t", b"\x00", b"\xff", b"http://h/x", b"+9", b"9_4"])

    @settings(max_examples=400, deadline=None)
    @given(st.lists(st.one_of(parts, st.binary(max_size=4)), max_size=40))
    def check(chunks):
        raw = b"".join(chunks)
        try:
            req = parse_head(raw, lim)
        except HttpError as e:
            assert 400 <= e.status <= 505 and e.message
            return
        assert req.method in ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")
        assert req.body_len >= 0 and not (req.chunked and req.body_len)

    check()


def test_text_chunk_template_is_the_dumps_of_the_chunk():
    from colibri_lab.server.openai_api import _chunk_maker, _text_chunks

    class Srv:
        fingerprint = "fp_\x00text\x00"   # the template's marker elsewhere in the chunk does not confuse it
    for include_usage in (False, True):
        chunk = _chunk_maker(Srv, "cmpl-1", 'm"\\x00text\x00', 7, "text_completion", include_usage)
        choice = lambda t: {"index": 3, "delta": {"content": t}, "logprobs": None, "finish_reason": None}
        fast = _text_chunks(chunk, choice)
        for text in ("", "a", 'q"uote\\', "tab\tnl\n\x00\x1f", "é中😀", "\x00text\x00", "\ud800"):
            assert fast(text) == json.dumps(chunk([choice(text)]), ensure_ascii=False), text
