"""The whole path on the real default model: GGUF -> C engine -> Engine.generate."""
from __future__ import annotations

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from colibri_lab import Engine
from colibri_lab.errors import ContextLengthExceededError, InvalidRequestError

pytestmark = pytest.mark.smollm2


@pytest.fixture(scope="module")
def eng(smollm2_path):
    e = Engine(smollm2_path, n_threads=2, n_ctx=512)
    yield e
    e.close()


def test_greedy_capital_of_france(eng):
    out = eng.generate("The capital of France is", max_tokens=16)
    assert "Paris" in out.text
    m = out.metrics
    assert m["prompt_tokens"] == len(eng.tokenize("The capital of France is"))
    assert m["completion_tokens"] == len(out.tokens) > 0
    for k in ("queue_ms", "ttft_ms", "prefill_ms", "decode_ms", "e2e_ms", "tpot_ms", "decode_tok_s"):
        assert m[k] >= 0, k
    assert m["e2e_ms"] >= m["ttft_ms"] > 0


def test_chat_renders_the_templates_exact_prompt(eng):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
    expected = env.from_string(eng.chat_template).render(messages=messages, add_generation_prompt=True,
                                                         bos_token="<|im_start|>", eos_token="<|im_end|>")
    assert eng.apply_chat_template(messages) == expected
    assert expected.endswith("<|im_start|>assistant\n")
    out = eng.chat(messages, max_tokens=12)
    assert out.text.strip()
    assert out.finish_reason in ("stop", "length")


def test_stream_pieces_join_to_generate_text(eng):
    ref = eng.generate("Once upon a time", max_tokens=40)
    pieces = list(eng.stream("Once upon a time", max_tokens=40))
    assert "".join(pieces) == ref.text
    assert all("\ufffd" not in p for p in pieces)


def test_stream_never_splits_utf8(eng):
    # emoji and CJK come out as several byte-level tokens each
    pieces = list(eng.stream("Translate to Japanese: good morning ->", max_tokens=24, temperature=1.0, seed=3))
    for p in pieces:
        p.encode("utf-8")  # a str with lone surrogates would fail here
    text = "".join(pieces)
    assert text == eng.generate("Translate to Japanese: good morning ->", max_tokens=24, temperature=1.0, seed=3).text


def test_stop_string_cuts_output(eng):
    ref = eng.generate("List three fruits: apple,", max_tokens=30)
    words = [w for w in ref.text.split(" ") if len(w) > 3]
    assert words, ref.text
    stop = words[min(1, len(words) - 1)]
    out = eng.generate("List three fruits: apple,", max_tokens=30, stop=[stop])
    assert out.finish_reason == "stop"
    assert stop not in out.text
    assert ref.text.startswith(out.text)
    streamed = "".join(eng.stream("List three fruits: apple,", max_tokens=30, stop=[stop]))
    assert streamed == out.text


def test_seed_reproduces_sampled_text(eng):
    kw = dict(max_tokens=24, temperature=0.9, top_p=0.95, top_k=50)
    a = eng.generate("Once upon a time, in a village by the sea,", seed=42, **kw)
    b = eng.generate("Once upon a time, in a village by the sea,", seed=42, **kw)
    c = eng.generate("Once upon a time, in a village by the sea,", seed=43, **kw)
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens


def test_logprobs(eng):
    out = eng.generate("The capital of France is", max_tokens=4, logprobs=5)
    assert len(out.logprobs) == len(out.tokens)
    for lp in out.logprobs:
        assert lp["logprob"] <= 0
        tops = [x[1] for x in lp["top"]]
        assert len(tops) == 5 and tops == sorted(tops, reverse=True)
        assert lp["top"][0][0] == lp["token"]  # greedy picks the most likely


def test_bad_parameters_raise_typed_errors(eng):
    with pytest.raises(InvalidRequestError, match="top_p"):
        eng.generate("hi", top_p=1.5)
    with pytest.raises(InvalidRequestError, match="unknown parameter"):
        eng.generate("hi", temprature=0.5)
    with pytest.raises(ContextLengthExceededError):
        eng.generate("hi " * 10, max_tokens=100_000)
    # still serving
    assert "Paris" in eng.generate("The capital of France is", max_tokens=16).text
