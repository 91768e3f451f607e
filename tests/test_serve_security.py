"""Server security and bad input: API keys, Host / Origin checks, CORS, body
limits, malformed / mistyped / unknown fields, limits, 429 / 503 / 500, and
the server still serving afterwards.  Each error status must raise the SDK's
typed exception and carry the documented error shape."""
from __future__ import annotations

import json
import subprocess
import sys

import anthropic
import openai
import pytest

from colibri_lab.server import Server, ServerConfigError
from test_serve_util import assert_openai_error, make_engine, raw

pytestmark = pytest.mark.smollm2

KEY = "sk-test-0123456789"
MSG = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server_kwargs():
    return dict(api_key=KEY, cors_origins=["https://app.example"],
                allowed_hosts=["colibri.internal"], max_body_bytes=64 * 1024)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def auth(extra=None):
    h = {"Authorization": f"Bearer {KEY}"}
    h.update(extra or {})
    return h


def post(server, body, path="/v1/chat/completions", headers=None):
    return raw(server, "POST", path, body, headers=auth(headers))


def ok_body(**kw):
    b = {"model": "smollm2", "messages": MSG, "max_tokens": 1, "temperature": 0}
    b.update(kw)
    return b


# ------------------------------------------------------------------- auth
def test_api_key_required(server, oai):
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    st, h, data = raw(server, "GET", "/v1/models")
    assert_openai_error(st, h, data, 401)
    st, _, _ = raw(server, "GET", "/v1/models", headers={"x-api-key": KEY})
    assert st == 200
    assert oai.models.list().data[0].id == "smollm2"
    an = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as ei:
        an.messages.create(model="smollm2", messages=MSG, max_tokens=1)
    assert ei.value.body["type"] == "error" and ei.value.body["error"]["type"] == "authentication_error"
    good = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)
    assert good.messages.create(model="smollm2", messages=MSG, max_tokens=1).usage.output_tokens == 1
    for path in ("/metrics", "/profile", "/experts"):
        assert raw(server, "GET", path)[0] == 401


def test_health_public_minimal_details_with_key(server):
    st, _, data = raw(server, "GET", "/health")
    assert st == 200 and json.loads(data) == {"status": "ok"}
    st, _, data = raw(server, "GET", "/health", headers=auth())
    d = json.loads(data)
    assert st == 200 and d["status"] == "ok" and d["scheduler"]["n_slots"] == 4 and d["engine"]["n_ctx"] == 1024


# ---------------------------------------------------------- host / origin
def test_host_header_checked(server, oai):
    st, h, data = raw(server, "GET", "/v1/models", headers=auth({"Host": "evil.example"}))
    assert_openai_error(st, h, data, 403)
    for host in ("localhost", f"localhost:{server.port}", "[::1]:1234", "colibri.internal"):
        assert raw(server, "GET", "/v1/models", headers=auth({"Host": host}))[0] == 200, host
    evil = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0,
                         default_headers={"Host": "rebind.attacker.example"})
    with pytest.raises(openai.PermissionDeniedError):
        evil.models.list()


def test_cors(server):
    st, h, _ = raw(server, "OPTIONS", "/v1/chat/completions",
                   headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                            "Access-Control-Request-Headers": "authorization, content-type"})
    assert st == 204 and h["access-control-allow-origin"] == "https://app.example"
    assert "POST" in h["access-control-allow-methods"] and "authorization" in h["access-control-allow-headers"]
    st, h, _ = raw(server, "GET", "/v1/models", headers=auth({"Origin": "https://app.example"}))
    assert st == 200 and h["access-control-allow-origin"] == "https://app.example"
    st, h, data = raw(server, "GET", "/v1/models", headers=auth({"Origin": "https://evil.example"}))
    assert_openai_error(st, h, data, 403)
    assert "access-control-allow-origin" not in h
    st, h, _ = raw(server, "OPTIONS", "/v1/models", headers={"Origin": "https://evil.example"})
    assert st == 403


def test_no_cors_by_default(engine):
    srv = Server(engine, port=0, model_id="smollm2").start()
    try:
        st, h, _ = raw(srv, "OPTIONS", "/v1/models", headers={"Origin": "https://app.example"})
        assert st == 403 and "access-control-allow-origin" not in h
    finally:
        srv.stop()


def test_refuses_public_bind_without_key(engine):
    with pytest.raises(ServerConfigError, match="API key"):
        Server(engine, host="0.0.0.0", port=0)
    Server(engine, host="0.0.0.0", port=0, api_key=KEY)  # with a key it is allowed (not started)
    r = subprocess.run([sys.executable, "-m", "colibri_lab.serve", "--host", "0.0.0.0", "--port", "0"],
                       capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin",
                                                                         "PYTHONPATH": ":".join(sys.path)})
    assert r.returncode == 2 and "API key" in r.stderr


# -------------------------------------------------------------- bad input
def test_malformed_json_and_wrong_content(server):
    for body in (b"{", b"[1, 2]", b"\xff\xfe", b'"just a string"', b"[" * 30000):
        st, h, data = post(server, body, headers={"Content-Type": "application/json"})
        assert_openai_error(st, h, data, 400)
    st, h, data = raw(server, "POST", "/v1/chat/completions", None, headers=auth())
    assert_openai_error(st, h, data, 400)


def test_oversized_body_413(server):
    big = ok_body(messages=[{"role": "user", "content": "x" * (100 * 1024)}])
    st, h, data = post(server, big)
    assert_openai_error(st, h, data, 413)
    an = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as ei:
        an.messages.create(model="smollm2", messages=[{"role": "user", "content": "x" * (100 * 1024)}], max_tokens=1)
    assert ei.value.status_code == 413


@pytest.mark.parametrize("field,value,param", [
    ("temperature", "hot", "temperature"),
    ("temperature", 1e5, "temperature"),
    ("top_p", 1.5, "top_p"),
    ("max_tokens", -1, "max_tokens"),
    ("max_tokens", 1.5, "max_tokens"),
    ("n", 0, "n"),
    ("n", True, "n"),
    ("stop", ["a", "b", "c", "d", "e"], "stop"),
    ("stop", [""], "stop"),
    ("stop", 5, "stop"),
    ("logit_bias", {"abc": 1}, "logit_bias"),
    ("logit_bias", {"999999999": 1}, "logit_bias"),
    ("top_logprobs", 3, "top_logprobs"),
    ("frobnicate", 1, "frobnicate"),
    ("functions", [], "functions"),
    ("messages", [], "messages"),
    ("messages", [{"role": "wizard", "content": "x"}], "messages"),
    ("messages", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages"),
    ("response_format", {"type": "xml"}, "response_format"),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
     "response_format"),
    ("tool_choice", "required", "tool_choice"),
    ("tools", [{"type": "function", "function": {"name": "bad name!"}}], "tools"),
    ("stream_options", {"include_usage": True}, "stream_options"),
    ("speculative", {"sources": "prompt_lookup", "bogus": 1}, "speculative"),
    ("speculative", {"sources": ["prompt_lookup"], "k_max": -1}, "speculative"),
    ("speculative", "fast", "speculative"),
    ("grammar", "", "grammar"),
])
def test_bad_fields_400_named(server, oai, field, value, param):
    st, h, data = post(server, ok_body(**{field: value}))
    err = assert_openai_error(st, h, data, 400, param_prefix=param)
    assert err["type"] == "invalid_request_error"


def test_sdk_bad_request_and_not_found(oai):
    with pytest.raises(openai.BadRequestError) as ei:
        oai.chat.completions.create(model="smollm2", messages=MSG, max_tokens=1, extra_body={"frobnicate": 1})
    assert ei.value.param == "frobnicate" and "frobnicate" in ei.value.message
    with pytest.raises(openai.NotFoundError) as ei:
        oai.chat.completions.create(model="gpt-5", messages=MSG, max_tokens=1)
    assert ei.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model="smollm2", prompt=[], max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model="smollm2", prompt="x", max_tokens=1, echo=True, logprobs=1)


def test_speculative_extension(oai):
    with pytest.raises(openai.BadRequestError) as ei:
        oai.chat.completions.create(model="smollm2", messages=MSG, max_tokens=1,
                                    extra_body={"speculative": {"sources": ["prompt_lookup"], "bogus": 4}})
    assert ei.value.param.startswith("speculative") and "bogus" in ei.value.message
    with pytest.raises(openai.BadRequestError) as ei:
        oai.chat.completions.create(model="smollm2", messages=MSG, max_tokens=1,
                                    extra_body={"speculative": {"sources": ["telepathy"]}})
    assert ei.value.param.startswith("speculative")
    # disabled speculation is plain decoding
    plain = oai.chat.completions.create(model="smollm2", messages=MSG, max_tokens=6, temperature=0)
    r = oai.chat.completions.create(model="smollm2", messages=MSG, max_tokens=6, temperature=0,
                                    extra_body={"speculative": {"enabled": False}})
    assert r.choices[0].message.content == plain.choices[0].message.content
    # enabled: greedy output is unchanged (lossless), or a 400 that names the field where unsupported
    try:
        s = oai.chat.completions.create(model="smollm2", messages=MSG, max_tokens=6, temperature=0,
                                        extra_body={"speculative": {"sources": ["prompt_lookup"], "k_max": 4}})
    except openai.BadRequestError as e:
        assert e.param == "speculative" and "not available" in e.message
    else:
        assert s.choices[0].message.content == plain.choices[0].message.content
        assert s.model_extra["timings"]["draft_n"] >= s.model_extra["timings"]["draft_n_accepted"] >= 0


def test_context_length_exceeded(smollm2_path):
    eng = make_engine(smollm2_path, n_ctx=64, n_slots=1)
    srv = Server(eng, port=0, model_id="smollm2").start()
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        long = "hello " * 100
        with pytest.raises(openai.BadRequestError) as ei:
            c.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": long}], max_tokens=4)
        assert ei.value.code == "context_length_exceeded" and "64" in ei.value.message
        with pytest.raises(openai.BadRequestError) as ei:
            c.completions.create(model="smollm2", prompt=long, max_tokens=4)
        assert ei.value.code == "context_length_exceeded"
        a = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.BadRequestError):
            a.messages.create(model="smollm2", messages=[{"role": "user", "content": long}], max_tokens=4)
        # a max_tokens beyond the room left is clamped, not refused
        ids = (eng.tokenize("hello ") * 64)[:60]
        r = c.completions.create(model="smollm2", prompt=ids, max_tokens=5000, temperature=0)
        assert r.usage.prompt_tokens == 60 and 1 <= r.usage.completion_tokens <= 4
    finally:
        srv.stop()
        eng.close()


def test_wrong_method_and_unknown_path(server):
    st, h, data = raw(server, "GET", "/v1/chat/completions", headers=auth())
    assert_openai_error(st, h, data, 405)
    st, h, data = raw(server, "GET", "/v2/everything", headers=auth())
    assert_openai_error(st, h, data, 404)


# ------------------------------------------------------------ 429 / 503 / 500
def test_queue_full_429(smollm2_path):
    """One slot, no queue: a request is admitted while the slot is free; a second
    one while it runs gets 429 (Retry-After in whole seconds) in both shapes."""
    eng = make_engine(smollm2_path, n_ctx=256, n_slots=1, max_queue=0)
    srv = Server(eng, port=0, model_id="smollm2").start()
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        assert c.completions.create(model="smollm2", prompt="hi", max_tokens=1).usage.completion_tokens == 1
        no_eos = {str(eng.tokenizer.eos_id): -100}
        stream = c.completions.create(model="smollm2", prompt="Tell me a long story:", max_tokens=200,
                                      temperature=0, stream=True, logit_bias=no_eos)
        next(iter(stream))   # the slot is now taken
        with pytest.raises(openai.RateLimitError) as ei:
            c.completions.create(model="smollm2", prompt="hi", max_tokens=1)
        assert int(ei.value.response.headers.get("retry-after")) >= 1
        a = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.RateLimitError):
            a.messages.create(model="smollm2", messages=MSG, max_tokens=1)
        stream.close()
    finally:
        srv.stop()
        eng.close()


def test_loading_and_shutting_down_503(engine):
    srv = Server(None, port=0).start()
    try:
        st, h, data = raw(srv, "GET", "/health")
        assert st == 503 and json.loads(data) == {"status": "loading"}
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError) as ei:
            c.chat.completions.create(model="smollm2", messages=MSG, max_tokens=1)
        assert ei.value.status_code == 503
        a = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as ei:
            a.messages.create(model="smollm2", messages=MSG, max_tokens=1)
        assert ei.value.status_code == 503 and ei.value.body["error"]["type"] == "overloaded_error"
        srv.set_engine(engine)
        assert raw(srv, "GET", "/health")[0] == 200
        srv.shutting_down = True
        st, h, data = raw(srv, "GET", "/v1/models")
        assert_openai_error(st, h, data, 503)
    finally:
        srv.stop()


def test_internal_error_500_then_still_serving(server, oai, engine, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(engine, "submit", boom)
    with pytest.raises(openai.InternalServerError) as ei:
        oai.chat.completions.create(model="smollm2", messages=MSG, max_tokens=1)
    assert ei.value.status_code == 500 and "boom" in ei.value.message
    monkeypatch.undo()
    r = oai.chat.completions.create(model="smollm2", messages=MSG, max_tokens=1, temperature=0)
    assert r.usage.completion_tokens == 1
