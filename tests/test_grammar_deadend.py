"""Dead ends a vocabulary can cause (issue #16): a grammar needs a code point
no token of the vocabulary can write.  When no token can even begin it, the
grammar is refused at compile time naming it (Engine: GrammarError; HTTP:
400); when tokens begin it but none continues it, the request ends with an
error naming the dead end (Engine: InvalidRequestError; HTTP: 400, or an
error event on a stream), never a 500 and never a silent stop.  A tiny
byte-level model whose byte tokens 0xA9 and 0xE6 are made control tokens
(never text) stands in for a vocabulary without byte fallback."""
from __future__ import annotations

import json

import pytest

import tinymodels
from colibri_lab import Engine
from colibri_lab.errors import GrammarError, InvalidRequestError
from colibri_lab.server import Server
from test_serve_util import assert_openai_error, raw, sse_events, wait_idle

MISSING = (0xA9, 0xE6)   # 'é' = C3 A9 cannot be finished; '日' = E6 97 A5 cannot be begun


@pytest.fixture(scope="module")
def engine(tmp_path_factory, monkeypatch_module):
    plain = tinymodels.tiny_vocab

    def vocab(n):
        tokens, types, merges = plain(n)
        for b in MISSING:
            types[b] = 3  # control: not text, never allowed by a grammar
        return tokens, types, merges
    monkeypatch_module.setattr(tinymodels, "tiny_vocab", vocab)
    path = tmp_path_factory.mktemp("deadend") / "tiny.gguf"
    tinymodels.write_tiny_llama(str(path))
    eng = Engine(str(path), n_threads=1, n_ctx=256, n_slots=2)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def server(engine):
    srv = Server(engine, port=0, model_id="tiny").start()
    yield srv
    srv.stop()


def test_unbeginnable_code_point_refused_at_compile_time(engine, server):
    with pytest.raises(GrammarError, match="U\\+65E5"):
        engine.generate("hi", grammar='root ::= "a" "\u65e5"', max_tokens=8)
    # another way through the grammar: only that way is kept, the output takes it
    out = engine.generate("hi", grammar='root ::= "a" ("\u65e5" | "b")', max_tokens=8)
    assert out.text == "ab" and out.finish_reason == "stop"
    st, h, data = raw(server, "POST", "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 8,
                                                         "grammar": 'root ::= "a" "\u65e5"'})
    err = assert_openai_error(st, h, data, 400)
    assert err["type"] == "invalid_request_error" and "U+65E5" in err["message"]


def test_unfinishable_code_point_ends_the_request_with_a_clear_error(engine, server):
    g = 'root ::= "a" "\u00e9"'
    with pytest.raises(InvalidRequestError, match="grammar dead end"):
        engine.generate("hi", grammar=g, max_tokens=8)
    assert engine.generate("hi", grammar='root ::= "ok"', max_tokens=4).text == "ok"  # still serving
    st, h, data = raw(server, "POST", "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 8,
                                                         "grammar": g})
    err = assert_openai_error(st, h, data, 400)
    assert "grammar dead end" in err["message"]
    st, h, data = raw(server, "POST", "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 8,
                                                         "grammar": g, "stream": True})
    assert st == 200
    evs = [json.loads(d) for _, d in sse_events(data) if d != "[DONE]"]
    assert any("grammar dead end" in (e.get("error") or {}).get("message", "") for e in evs), evs
    wait_idle(engine)
