"""Tokens that queue up while the HTTP thread is behind the engine go out merged: one SSE
chunk per wake and choice, every token's text and logprob in it, usage unchanged, stop
strings still honored.  A client that keeps up gets one chunk per token."""
from __future__ import annotations

import json

import pytest

from colibri_lab.server import Server, gen
from test_serve_util import make_engine, raw, sse_events

# ---------------------------------------------------------------- no model: Generation alone
VOCAB = {1: b"Hel", 2: b"lo", 3: b" wor", 4: b"ld", 5: b"!", 6: b"\xc3", 7: b"\xa9", 8: b" STOP", 9: b" more"}


class _Handle:
    error = None

    def cancel(self):
        pass


class _FakeEngine:
    """What Generation needs of an engine: admission, submit with a sink, token bytes."""

    class scheduler:
        @staticmethod
        def admit(n):
            pass

    class model:
        @staticmethod
        def token_bytes(t):
            return VOCAB[t]

    def __init__(self):
        self.sinks = []

    def submit(self, ids, sink=None, stop=None, **kw):
        self.sinks.append(sink)
        return list(ids), _Handle(), [s.encode() for s in stop or []]


def _gen(n_choices=1, stop=None):
    eng, done = _FakeEngine(), []
    g = gen.Generation(eng, [gen.Spec(i, [7], {"stop": stop}) for i in range(n_choices)],
                       lambda m: done.append(m))
    return g, eng.sinks, done


def _tok(sink, t, lp=-0.5, at=0.0):
    sink({"type": "token", "id": 1, "token": t, "logprob": lp, "top": [(t, lp)], "t": at})


def _done(sink, n_out_bytes=-1, reason="length", at=0.0):
    sink({"type": "done", "id": 1, "t": at, "metrics": {"stop_offset": n_out_bytes, "finish_reason": reason}})


def test_queued_tokens_merge_into_one_piece_per_choice():
    g, (s0, s1), done = _gen(2)
    # choice 0 gets four tokens, choice 1 two, interleaved, all before the HTTP thread looks
    for k, (a, b) in enumerate([(1, 3), (2, 4), (3, None), (4, None)]):
        _tok(s0, a, lp=-k, at=k)
        if b is not None:
            _tok(s1, b, lp=-10 - k, at=k)
    _done(s1, at=9)
    pieces = []
    for item in g.events(0.01):
        assert item is not None   # everything was queued: no silence
        pieces.append(item)
        if len(pieces) == 3:
            _done(s0, at=10)
    assert pieces[0] == (0, {"text": "Hello world", "tokens": [(1, 0, [(1, 0)]), (2, -1, [(2, -1)]),
                                                              (3, -2, [(3, -2)]), (4, -3, [(4, -3)])], "t": 3})
    assert pieces[1] == (1, {"text": " world", "tokens": [(3, -10, [(3, -10)]), (4, -11, [(4, -11)])], "t": 1})
    assert pieces[2][0] == 1 and pieces[2][1]["done"] and pieces[2][1]["t"] == 9
    assert pieces[3][0] == 0 and pieces[3][1]["done"]
    r0, r1 = g.results[0], g.results[1]
    assert (r0.text, r0.tokens, [lp for lp, _ in r0.logprobs]) == ("Hello world", [1, 2, 3, 4], [0, -1, -2, -3])
    assert (r1.text, r1.tokens) == (" world", [3, 4])
    assert len(done) == 2   # each finished request's metrics recorded once


def test_a_reader_that_keeps_up_gets_one_piece_per_token():
    g, (s0,), _ = _gen(1)
    it = g.events(0.01)
    texts = []
    for t in (1, 2, 6, 7, 5):
        _tok(s0, t)
        idx, piece = next(it)
        assert len(piece["tokens"]) == 1 and piece["tokens"][0][0] == t
        texts.append(piece["text"])
    assert texts == ["Hel", "lo", "", "é", "!"]   # an incomplete UTF-8 character waits for its second byte
    _done(s0)
    assert next(it)[1]["done"]


def test_merged_pieces_hold_back_and_cut_stop_strings():
    g, (s0,), _ = _gen(1, stop=[" STOP"])
    for t in (1, 2, 8, 9):   # "Hello STOP more": the engine stops at the stop string's offset
        _tok(s0, t)
    _done(s0, n_out_bytes=len(b"Hello"), reason="stop")
    pieces = [p for _, p in g.events(0.01)]
    assert "".join(p["text"] for p in pieces) == "Hello"
    assert [t for t, _, _ in pieces[0]["tokens"]] == [1, 2, 8, 9]   # every token was seen...
    r = g.results[0]
    assert r.text == "Hello" and r.tokens == [1, 2] and r.stop_sequence == " STOP"   # ...the kept ones counted


# ---------------------------------------------------------------- the live server, a reader behind


@pytest.fixture(scope="module")
def engine(smollm2_path):
    eng = make_engine(smollm2_path)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def server(engine):
    srv = Server(engine, port=0, model_id="smollm2", keepalive_s=15.0).start()
    yield srv
    srv.stop()


@pytest.fixture
def behind(monkeypatch):
    """Each request's token events reach its HTTP thread only when the request is done, all at
    once, as if the thread had been busy for the whole stream."""
    orig = gen.Generation._sink

    def sink(self, index, ev):
        held = self.__dict__.setdefault("_held", [])
        if ev["type"] == "token":
            held.append(ev)
            return
        for h in held:
            orig(self, index, h)
        held.clear()
        orig(self, index, ev)

    monkeypatch.setattr(gen.Generation, "_sink", sink)


def _stream(server, path, body):
    st, h, data = raw(server, "POST", path, dict(body, stream=True, stream_options={"include_usage": True}))
    assert st == 200 and h["content-type"].startswith("text/event-stream")
    return [json.loads(d) for _, d in sse_events(data) if d != "[DONE]"]


@pytest.mark.smollm2
def test_completion_stream_behind_delivers_every_token(server, engine, behind):
    prompt = "Once upon a time"
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 1}
    want = engine.generate(prompt, max_tokens=12, temperature=0)
    evs = _stream(server, "/v1/completions", body)
    content = [e for e in evs if e["choices"]]
    assert "".join(e["choices"][0]["text"] for e in content) == want.text
    assert len([e for e in content if e["choices"][0]["text"]]) < 12       # merged: fewer chunks than tokens
    toks = [t for e in content if e["choices"][0]["logprobs"] for t in e["choices"][0]["logprobs"]["tokens"]]
    assert len(toks) == 12 and "".join(toks) == want.text                    # a logprob entry per token
    assert evs[-1]["usage"]["completion_tokens"] == 12 == len(want.tokens)


@pytest.mark.smollm2
def test_chat_stream_behind_honors_stop_and_counts_usage(server, engine, behind):
    msg = [{"role": "user", "content": "Count from one to ten in words."}]
    full = engine.chat(msg, max_tokens=24, temperature=0).text
    words = full.split()
    assert len(words) >= 4, full
    stop = " " + words[len(words) // 2]
    want = engine.chat(msg, max_tokens=24, temperature=0, stop=[stop])
    body = {"model": "smollm2", "messages": msg, "max_tokens": 24, "temperature": 0, "stop": [stop],
            "logprobs": True}
    evs = _stream(server, "/v1/chat/completions", body)
    content = [e for e in evs if e["choices"]]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in content)
    assert text == want.text and stop not in text
    lps = [lp for e in content if e["choices"][0]["logprobs"] for lp in e["choices"][0]["logprobs"]["content"]]
    assert len(lps) == len(want.tokens) == evs[-1]["usage"]["completion_tokens"]
    assert [e["choices"][0]["finish_reason"] for e in content][-1] == "stop"


# ---------------------------------------------------------------- tokens written from the scheduler thread
def test_direct_writes_keep_order_and_fall_back_to_the_queue():
    g, (s0,), _ = _gen(1)
    wrote, ok = [], [True]

    def try_write(data):
        if ok[0]:
            wrote.append(data)
        return ok[0]
    g.write_tokens_directly(0, lambda text: text.encode(), try_write)
    it = g.events(0.01)
    _tok(s0, 1), _tok(s0, 2)                 # queued before this thread wrote anything: through the queue
    assert next(it)[1]["text"] == "Hello" and wrote == []
    assert next(it) is None                  # the queue is empty: direct writes may start
    _tok(s0, 3), _tok(s0, 6), _tok(s0, 7)    # " wor", then "é" in two tokens (nothing to write for the first)
    assert wrote == [b" wor", "é".encode()] and g.q.empty()
    ok[0] = False
    _tok(s0, 4), _tok(s0, 5)                 # cannot write: this token and the next go through the queue
    ok[0] = True
    assert next(it)[1] == {"text": "ld!", "tokens": [(4, -0.5, [(4, -0.5)]), (5, -0.5, [(5, -0.5)])], "t": 0.0}
    assert next(it) is None                  # drained again
    _tok(s0, 9)
    assert wrote[-1] == b" more"
    _done(s0)
    assert next(it)[1]["done"]
    r = g.results[0]
    assert r.tokens == [1, 2, 3, 6, 7, 4, 5, 9] and r.text == "Hello wor" + "é" + "ld!" + " more"
    assert g.n_direct == 4


@pytest.fixture
def generations(monkeypatch):
    seen = []
    orig = gen.Generation.write_tokens_directly

    def record(self, *a, **kw):
        if self not in seen:
            seen.append(self)
        return orig(self, *a, **kw)
    monkeypatch.setattr(gen.Generation, "write_tokens_directly", record)
    return seen


@pytest.mark.smollm2
def test_plain_streams_are_written_from_the_scheduler_thread(server, engine, generations):
    prompt = "Once upon a time"
    want = engine.generate(prompt, max_tokens=24, temperature=0)
    evs = _stream(server, "/v1/completions", {"model": "smollm2", "prompt": prompt, "max_tokens": 24,
                                               "temperature": 0})
    assert "".join(e["choices"][0]["text"] for e in evs if e["choices"]) == want.text
    assert evs[-1]["usage"]["completion_tokens"] == len(want.tokens)
    assert len(generations) == 1 and generations[0].n_direct > 0
    msg = [{"role": "user", "content": "Say hello."}]
    want = engine.chat(msg, max_tokens=16, temperature=0)
    evs = _stream(server, "/v1/chat/completions", {"model": "smollm2", "messages": msg, "max_tokens": 16,
                                                    "temperature": 0})
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in evs if e["choices"]) == want.text
    assert len(generations) == 2 and generations[1].n_direct > 0


def _output_text(final: dict) -> str:
    return "".join(c["text"] for item in final["response"]["output"] if item["type"] == "message"
                   for c in item["content"] if c["type"] == "output_text")


def _responses_stream(server, prompt, n):
    st, h, data = raw(server, "POST", "/v1/responses", {"model": "smollm2", "input": prompt, "max_output_tokens": n,
                                                         "temperature": 0, "stream": True})
    assert st == 200 and h["content-type"].startswith("text/event-stream")
    evs = [(k, json.loads(d)) for k, d in sse_events(data)]
    assert all(k == e["type"] for k, e in evs)
    assert [e["sequence_number"] for _, e in evs] == list(range(len(evs)))
    return [e for _, e in evs]


@pytest.mark.smollm2
def test_responses_text_deltas_are_written_from_the_scheduler_thread(server, engine, generations):
    prompt = "Once upon a time"
    want = engine.chat([{"role": "user", "content": prompt}], max_tokens=20, temperature=0)
    evs = _responses_stream(server, prompt, 20)
    deltas = [e["delta"] for e in evs if e["type"] == "response.output_text.delta"]
    assert "".join(deltas) == want.text
    done = next(e for e in evs if e["type"] == "response.output_text.done")
    assert done["text"] == want.text and _output_text(evs[-1]) == want.text
    assert len(generations) == 1 and 0 < generations[0].n_direct <= len(deltas)


@pytest.mark.smollm2
def test_responses_deltas_the_socket_refused_go_out_in_order(server, engine, generations, monkeypatch):
    """try_write refuses from the third token on: the bytes already built (with their sequence
    numbers) go through the queue and the HTTP thread writes them; numbering stays contiguous."""
    from colibri_lab.server.http import Handler
    orig, calls = Handler.try_write, [0]

    def refuse_later(self, data):
        calls[0] += 1
        return orig(self, data) if calls[0] <= 2 else False
    monkeypatch.setattr(Handler, "try_write", refuse_later)
    prompt = "Once upon a time"
    want = engine.chat([{"role": "user", "content": prompt}], max_tokens=20, temperature=0)
    evs = _responses_stream(server, prompt, 20)
    assert "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta") == want.text
    assert _output_text(evs[-1]) == want.text
    assert generations[0].n_direct == 2


def test_try_write_never_blocks_and_the_rest_goes_out_first():
    """A client that does not read: try_write keeps what the socket cannot take, refuses more, and
    the handler's next write sends the kept bytes before its own."""
    import socket
    import threading
    import types

    from colibri_lab.server.http import Handler
    a, b = socket.socketpair()
    a.settimeout(5.0)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    h = types.SimpleNamespace(connection=a, wfile=a.makefile("wb", buffering=0), _wlock=threading.Lock(),
                              _rest=b"", sse_started=True, last_write=0.0, close_connection=False)
    sent, k = [], 0
    while not h._rest:                          # fill the socket buffer without blocking
        data = b"%08d" % k * 64
        assert Handler.try_write(h, data)
        sent.append(data)
        k += 1
    assert not Handler.try_write(h, b"later")   # earlier bytes are still unsent: the caller must queue it
    got = []
    reader = threading.Thread(target=lambda: got.append(b"".join(iter(lambda: b.recv(1 << 16), b""))))
    reader.start()
    Handler._write(h, b"END")
    a.shutdown(socket.SHUT_WR)
    reader.join(10)
    assert got[0] == b"".join(sent) + b"END"


def test_a_steps_writes_go_out_after_every_sink_back_to_back():
    """With a scheduler that runs sinks' I/O after the step (after_step), no token is written while
    the step's events are handed out; then every stream's bytes are built, then all written, in
    order, and a failed write still falls back to the queue in order."""
    later = []

    class _Sched(_FakeEngine.scheduler):
        @staticmethod
        def after_step(fn):
            later.append(fn)

    def run_after():
        while later:
            fns = list(later)
            later.clear()
            for fn in fns:
                fn()

    eng = _FakeEngine()
    eng.scheduler = _Sched
    wrote, log = [], []
    gens = [gen.Generation(eng, [gen.Spec(0, [7], {"stop": None})], lambda m: None) for _ in range(2)]
    for k, g in enumerate(gens):
        g.write_tokens_directly(0, lambda text, k=k: (log.append(("build", k)), f"{k}:{text}".encode())[1],
                                lambda data: (wrote.append(data), log.append(("write", data)))[0] is None)
        assert next(g.events(0.01)) is None   # queue empty: direct writes on
    s0, s1 = eng.sinks
    _tok(s0, 1), _tok(s1, 3), _tok(s0, 2)     # one step's events
    assert wrote == [] and log == []
    run_after()
    assert log == [("build", 0), ("build", 0), ("build", 1), ("write", b"0:Hel"), ("write", b"0:lo"),
                   ("write", b"1: wor")]
    assert [g.n_direct for g in gens] == [2, 1] and all(g.q.empty() for g in gens)
    _tok(s1, 4), _done(s1)                    # a token and the end in one step: the end is queued after it
    run_after()
    assert wrote[-1] == b"1:ld" and gens[1].q.qsize() == 1
    idx, piece = next(gens[1].events(0.01))
    assert piece["done"] and gens[1].results[0].text == " world"
