"""The C byte-level BPE (native/src/bpe.c) against the reference tokenizers.

The engine tokenizes grammar-forced byte spans (jump-forward, speculative
drafts) in C, without calling back into Python; those ids must be exactly the
ones the model's tokenizer gives for the same text, without special-token
parsing and without BOS.  Checked on the real SmolLM2 vocabulary against:

- colibri_lab.tokenizer.Tokenizer (HF `tokenizers`) with parse_special=False,
  on the 360 strings of tests/fixtures/tokenize_strings.json, JSON fragments,
  random text and long inputs;
- llama.cpp's own ids (tests/fixtures/tokenize_smollm2.json, produced with
  parse_special=True) for the fixture strings holding no control-token text,
  where the two settings agree.

Plus the property the engine relies on: the ids' bytes concatenate back to the
input exactly, for any bytes (invalid UTF-8 included); an input holding a byte
the vocabulary has no token for is refused (the reference silently drops it).

The C tokenizer is reached through the binding: Model.bpe_tokenize(data) if the
binding has it, else Engine.tokenize_bytes(data) (the same C call behind the
engine's canonical tokenizer).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from colibri_lab import _engine, errors
from colibri_lab.tokenizer import Tokenizer, _bytes_to_unicode

pytestmark = pytest.mark.smollm2

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def model(smollm2_path):
    return _engine.Model(smollm2_path)


@pytest.fixture(scope="module")
def c_tokenize(model):
    """bytes -> list[int] through the C tokenizer."""
    if hasattr(model, "bpe_tokenize"):
        return model.bpe_tokenize
    engine = _engine.Engine(model, n_slots=1, n_ctx=64, n_threads=1)
    return engine.tokenize_bytes


@pytest.fixture(scope="module")
def ref(model):
    return Tokenizer.from_metadata(model.metadata())


@pytest.fixture(scope="module")
def missing_bytes(model) -> set[int]:
    """Bytes with no single-byte token in the vocabulary (SmolLM2 has 21)."""
    vocab = set(model.metadata()["tokenizer.ggml.tokens"])
    return {b for b, ch in _bytes_to_unicode().items() if ch not in vocab}


def ref_ids(ref, text: str) -> list[int]:
    return ref.encode(text, add_special=False, parse_special=False)


def fixture_strings() -> list[str]:
    return json.loads((FIXTURES / "tokenize_strings.json").read_text(encoding="utf-8"))["strings"]


def test_fixture_strings_match_reference(c_tokenize, ref, missing_bytes):
    strings = fixture_strings()
    assert len(strings) == 360
    mismatches = []
    for s in strings:
        data = s.encode("utf-8")
        assert not set(data) & missing_bytes, f"fixture string {s!r} holds a byte without token"
        got, want = c_tokenize(data), ref_ids(ref, s)
        if got != want:
            mismatches.append((s, got, want))
    assert not mismatches, f"{len(mismatches)} of {len(strings)} differ, first: {mismatches[:3]}"


def test_llama_cpp_ids_without_special_text(c_tokenize, model):
    """llama.cpp's ids (parse_special=True) for texts with no control-token text in them."""
    cases = json.loads((FIXTURES / "tokenize_smollm2.json").read_text(encoding="utf-8"))["cases"]
    meta = model.metadata()
    special = [t for t, k in zip(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]) if k == 3]
    plain = [c for c in cases if not any(t in c["text"] for t in special)]
    assert len(plain) > 300  # the fixture is mostly plain text: the check must cover it
    bad = [(c["text"], c_tokenize(c["text"].encode()), c["ids"]) for c in plain
           if c_tokenize(c["text"].encode()) != c["ids"]]
    assert not bad, f"{len(bad)} differ from llama.cpp, first: {bad[:3]}"


JSONISH = [
    '{"name": "', '", "age": ', "}\n", "[1, 2, 3]", '{"a": [1, 2, {"b": null}], "c": true}',
    '"\\u00e9\\u4e2d\\ud83d\\ude00"', '{"emoji": "😀", "accent": "café", "cjk": "中文"}',
    '{\n  "key": "value",\n  "n": -12.5e+3\n}', '", "', '": ', '{"', '"}', '"\n}', "  ]\n",
    '{"text": "It\'s \\"quoted\\" and \\\\ back\\tslash\\n"}', "\t\t\t", "    \n    ",
    '{"id": 12345678901234567890}', "0.1 + 0.2 = 0.30000000000000004",
]


@pytest.mark.parametrize("text", JSONISH)
def test_json_fragments_match_reference(c_tokenize, ref, text):
    assert c_tokenize(text.encode()) == ref_ids(ref, text)


def test_random_text_matches_reference(c_tokenize, ref, missing_bytes):
    """Random text from a mix that stresses the split: contractions, digits,
    whitespace runs, non-breaking spaces, combining marks, CJK, emoji."""
    rnd = random.Random(1234)
    alphabet = list(" \t\n\r'sStTlLdDrevm0123456789aZé中ſ😀!.,-_{}\"\\") + [
        "\u00a0", "\u3000", "\u2028", "\u0301", "\u0663", "\u2167", "\u00bd", "\x85", "\x1c", "  ", "\n\n",
    ]
    alphabet = [a for a in alphabet if not set(a.encode()) & missing_bytes]
    bad = []
    for _ in range(1500):
        text = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 40)))
        got, want = c_tokenize(text.encode()), ref_ids(ref, text)
        if got != want:
            bad.append((text, got, want))
    assert not bad, f"{len(bad)} differ, first: {bad[:3]}"


def test_long_input_matches_reference(c_tokenize, ref):
    text = "".join(fixture_strings()) * 3  # ~ tens of KB, long whitespace and digit runs included
    text += " " * 3000 + "x" + "9" * 2000 + "a" * 3000
    assert c_tokenize(text.encode()) == ref_ids(ref, text)


def test_round_trip_random_bytes(c_tokenize, model, missing_bytes):
    """Any bytes: either the ids give the bytes back exactly, or the input holds
    a byte without token and is refused."""
    rnd = random.Random(99)
    pieces = [b" ", b"a", b"'s", b"7", b"\n", b"\xc3\xa9", b"\xc3", b"\xa9", b"\xe4\xb8\xad", b"\xf0\x9f\x98", b"\xed\xa0\x80"]
    n_ok = n_refused = 0
    for _ in range(2000):
        data = b"".join(
            bytes([rnd.randrange(256)]) if rnd.random() < 0.3 else rnd.choice(pieces)
            for _ in range(rnd.randint(0, 60))
        )
        if set(data) & missing_bytes:
            with pytest.raises(errors.ColibriError):
                c_tokenize(data)
            n_refused += 1
            continue
        ids = c_tokenize(data)
        assert model.detokenize_bytes(ids) == data, (data, ids)
        assert len(ids) <= len(data)
        n_ok += 1
    assert n_ok > 500 and n_refused > 100  # both paths really exercised


def test_byte_without_token_is_refused(c_tokenize, ref, missing_bytes):
    assert 0x04 in missing_bytes  # SmolLM2 has no token for U+0004
    # the reference drops the byte, which would lose text in a forced span
    assert ref.decode(ref_ids(ref, "a\x04b")) == "ab"
    with pytest.raises(errors.ColibriError):
        c_tokenize(b"a\x04b")
    assert c_tokenize(b"") == []
