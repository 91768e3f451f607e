"""Tokenizer built from GGUF metadata vs llama.cpp's tokenization of the same file.

The expected ids in tests/fixtures/tokenize_smollm2.json were produced by
llama.cpp (scripts/make_tokenizer_fixture.py, through llama-cpp-python), never
by colibri_lab.  The model file is found through $COLIBRI_LAB_SMOLLM2 or the
`smollm2` alias (downloaded into the cache if needed); without it the
model-based tests are skipped and only the synthetic-vocabulary tests run.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from colibri_lab.errors import InvalidRequestError, ModelLoadError, UnsupportedModelError
from colibri_lab.tokenizer import PRE_TOKENIZERS, Tokenizer

FIXTURE = Path(__file__).parent / "fixtures" / "tokenize_smollm2.json"


# -- helpers -------------------------------------------------------------------


def gguf_metadata(path) -> dict:
    """GGUF metadata as a plain dict (key -> str/int/float/bool/list), read with
    the reference `gguf` package: the same shape the engine's Model.metadata() gives."""
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def smollm2_path() -> Path:
    env = os.environ.get("COLIBRI_LAB_SMOLLM2")
    if env:
        return Path(env)
    from colibri_lab.models import resolve

    return resolve("smollm2", pull=True)  # errors (never skips) when the model cannot be had


@pytest.fixture(scope="module")
def fixture_data() -> dict:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def meta(fixture_data) -> dict:
    path = smollm2_path()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != fixture_data["model_sha256"]:
        pytest.fail(f"{path} is not the model the fixture was recorded from")
    return gguf_metadata(path)


@pytest.fixture(scope="module")
def tok(meta) -> Tokenizer:
    return Tokenizer.from_metadata(meta)


def _mismatches(tk: Tokenizer, cases, **kw) -> list[str]:
    bad = []
    for c in cases:
        got = tk.encode(c["text"], add_special=False, **kw)
        if got != c["ids"]:
            bad.append(f"{c['text']!r}: got {got}, llama.cpp {c['ids']}")
    return bad


# -- against llama.cpp -----------------------------------------------------------


def test_fixture_is_large_and_varied(fixture_data):
    cases = fixture_data["cases"]
    assert len(cases) >= 220
    texts = [c["text"] for c in cases]
    assert "" in texts
    assert any("<|im_start|>" in t for t in texts)
    assert any("\u200d" in t for t in texts)  # ZWJ emoji
    # the special-token cases must actually exercise single-id matching
    im_start = fixture_data["vocab"]["bos"]
    assert any(im_start in c["ids"] for c in cases)


def test_ids_match_llama_cpp(tok, fixture_data):
    bad = _mismatches(tok, fixture_data["cases"])
    assert not bad, f"{len(bad)} mismatches, first: " + "\n".join(bad[:5])


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "gpt-2"])
def test_pre_tokenizer_variants_match_llama_cpp(meta, fixture_data, pre):
    # Same vocabulary and merges, another tokenizer.ggml.pre: llama.cpp
    # tokenized a vocabulary-only copy of the file with that value.
    tk = Tokenizer.from_metadata({**meta, "tokenizer.ggml.pre": pre})
    cases = fixture_data["pre_variants"][pre]
    bad = _mismatches(tk, cases)
    assert not bad, f"{pre}: {len(bad)} mismatches, first: " + "\n".join(bad[:5])
    # The variant must differ from smollm's split somewhere, or it tests nothing new.
    assert any(a["ids"] != b["ids"] for a, b in zip(cases, fixture_data["cases"]))


def test_parse_special_false_matches_llama_cpp(tok, fixture_data):
    cases = fixture_data["vocab"]["plain_cases"]
    assert cases
    bad = _mismatches(tok, cases, parse_special=False)
    assert not bad, "\n".join(bad[:5])


def test_special_ids_match_llama_cpp(tok, fixture_data):
    v = fixture_data["vocab"]
    assert tok.n_vocab == v["n_vocab"]
    assert tok.bos_id == v["bos"]
    assert tok.eos_id == v["eos"]
    assert sorted(tok.eog_ids) == v["eog"]
    assert sorted(tok.special_ids) == v["control"]
    for i in range(tok.n_vocab):
        assert tok.is_eog(i) == (i in v["eog"])


def test_token_to_piece_matches_llama_cpp(tok, fixture_data):
    pieces = fixture_data["vocab"]["pieces"]
    assert len(pieces) > 100
    for i, with_special, plain in pieces:
        assert tok.token_to_piece(i, special=True).hex() == with_special, i
        assert tok.token_to_piece(i, special=False).hex() == plain, i


# -- properties on the real vocabulary ---------------------------------------------


def test_round_trip(tok, fixture_data):
    for c in fixture_data["cases"]:
        s = c["text"]
        assert tok.decode(tok.encode(s)) == s
        assert tok.decode(tok.encode(s, parse_special=False)) == s


def test_decode_agrees_with_pieces(tok, fixture_data):
    for c in fixture_data["cases"]:
        joined = b"".join(tok.token_to_piece(i) for i in c["ids"])
        assert joined == c["text"].encode("utf-8")
        assert tok.decode(c["ids"]) == c["text"]


def test_decode_partial_utf8_is_replacement(tok):
    ids = tok.encode("😀")
    assert len(ids) > 1  # a 4-byte character is several byte-level tokens
    assert "\ufffd" in tok.decode(ids[:1])
    assert tok.decode(ids) == "😀"


def test_skip_special(tok):
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids, skip_special=True) == "user\nhi"


def test_add_special_follows_metadata(meta):
    assert meta["tokenizer.ggml.add_bos_token"] is False
    tk = Tokenizer.from_metadata(meta)
    assert tk.encode("hi") == tk.encode("hi", add_special=False)
    tk_bos = Tokenizer.from_metadata({**meta, "tokenizer.ggml.add_bos_token": True})
    plain = tk_bos.encode("hi", add_special=False)
    assert tk_bos.encode("hi") == [tk_bos.bos_id] + plain
    assert tk_bos.encode("hi", add_special=True) == [tk_bos.bos_id] + plain


def test_numpy_ids_accepted(tok):
    np = pytest.importorskip("numpy")
    ids = tok.encode("hello world")
    assert tok.decode(np.array(ids, dtype=np.int32)) == "hello world"


def test_bad_inputs(tok):
    with pytest.raises(InvalidRequestError):
        tok.encode(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="out of range"):
        tok.decode([tok.n_vocab])
    with pytest.raises(InvalidRequestError, match="out of range"):
        tok.decode([-1])
    with pytest.raises(InvalidRequestError):
        tok.decode([1.5])  # type: ignore[list-item]
    with pytest.raises(InvalidRequestError):
        tok.token_to_piece(tok.n_vocab)


# -- synthetic vocabulary (no model file needed) -------------------------------------


def _tiny_meta(pre="smollm", **extra) -> dict:
    from colibri_lab.tokenizer import _bytes_to_unicode

    byte_chars = list(_bytes_to_unicode().values())
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + byte_chars + ["he", "ll", "hell", "hello", "Ġw", "12"]
    types = [3, 3, 3] + [1] * (len(tokens) - 3)
    merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "1 2"]
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    meta.update(extra)
    return meta


def test_tiny_vocab_merges_digits_and_specials():
    meta = _tiny_meta()
    tk = Tokenizer.from_metadata(meta)
    tokens = meta["tokenizer.ggml.tokens"]
    ids = tk.encode("hello<|im_end|>")
    assert [tokens[i] for i in ids] == ["hello", "<|im_end|>"]
    # smollm splits every digit, so the "1 2" merge can never apply ...
    assert [tokens[i] for i in tk.encode("12")] == ["1", "2"]
    # ... while the gpt-2 split keeps digit runs together
    tk2 = Tokenizer.from_metadata(_tiny_meta(pre="gpt-2"))
    assert [tokens[i] for i in tk2.encode("12")] == ["12"]
    assert [tokens[i] for i in tk.encode(" w")] == ["Ġw"]
    # parse_special=False spells the control token out byte by byte
    assert len(tk.encode("<|im_end|>", parse_special=False)) == len("<|im_end|>")
    assert tk.eog_ids == {0, 2}  # <|endoftext|> by text, <|im_end|> as eos (and by text)


def test_unknown_pre_is_named():
    with pytest.raises(UnsupportedModelError, match="'no-such-pre'"):
        Tokenizer.from_metadata(_tiny_meta(pre="no-such-pre"))
    with pytest.raises(UnsupportedModelError, match="tokenizer.ggml.pre"):
        Tokenizer.from_metadata(_tiny_meta(pre="default"))
    assert {"smollm", "llama-bpe", "qwen2"} <= set(PRE_TOKENIZERS)


def test_unsupported_tokenizer_model():
    with pytest.raises(UnsupportedModelError, match="'llama'"):
        Tokenizer.from_metadata(_tiny_meta(**{"tokenizer.ggml.model": "llama"}))


def test_malformed_metadata():
    meta = _tiny_meta()
    del meta["tokenizer.ggml.merges"]
    with pytest.raises(ModelLoadError, match="merges"):
        Tokenizer.from_metadata(meta)
    with pytest.raises(ModelLoadError, match="token_type"):
        Tokenizer.from_metadata(_tiny_meta(**{"tokenizer.ggml.token_type": [1, 1]}))
    with pytest.raises(ModelLoadError, match="array"):
        Tokenizer.from_metadata(_tiny_meta(**{"tokenizer.ggml.tokens": "abc"}))
    with pytest.raises(ModelLoadError, match="left right"):
        Tokenizer.from_metadata(_tiny_meta(**{"tokenizer.ggml.merges": ["he"]}))


def test_out_of_range_special_ids_are_ignored():
    tk = Tokenizer.from_metadata(_tiny_meta(**{"tokenizer.ggml.bos_token_id": 10**6}))
    assert tk.bos_id is None
    assert tk.eos_id == 2


def test_engine_metadata_builds_the_same_tokenizer(meta, fixture_data):
    """The engine's Model.metadata() (the runtime source) must give the same dict
    as the reference gguf reader, and so the same tokenizer."""
    from colibri_lab import _engine
    engine_meta = _engine.Model(str(smollm2_path())).metadata()
    for key, value in meta.items():
        assert key in engine_meta, key
        assert engine_meta[key] == value, key
    tk = Tokenizer.from_metadata(engine_meta)
    bad = _mismatches(tk, fixture_data["cases"])
    assert not bad, "\n".join(bad[:5])
