"""Malformed GGUF files must be refused with a ModelLoadError that names the
problem (DESIGN invariant 4: bad input never crashes anything).

Most files here are written byte by byte by the small writer below, which
records where each section and field starts, so a test can corrupt exactly
one thing: the magic, a count, a string length, a tensor's offset or type, or
cut the file inside a given section.  The architecture-level checks (a tensor
whose shape disagrees with the metadata, an unknown architecture, an
unsupported tensor type) use files written with the `gguf` package.

`colibri_lab._engine.Model(path)` loads (maps and validates) a GGUF file; on
failure it raises ModelLoadError carrying cb_model_load's message, which for
format errors is the GGUF reader's (native/src/gguf.c) message verbatim.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import pytest

import gguf
from colibri_lab.errors import ModelLoadError, UnsupportedModelError
from tinymodels import tiny_vocab, write_tiny_llama  # tests/ is on sys.path (conftest.py)

# GGUF value types.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i",
               F32: "<f", BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}
# GGML tensor types used here, with (elements per block, bytes per block).
T_F32, T_Q8_0, T_IQ4_XS = 0, 8, 23
_BLOCK = {T_F32: (1, 4), T_Q8_0: (32, 34), T_IQ4_XS: (256, 136)}


def _str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _value(vtype: int, value) -> bytes:
    if vtype == STR:
        return _str(value)
    if vtype == ARR:
        etype, items = value
        out = struct.pack("<IQ", etype, len(items))
        return out + b"".join(_value(etype, v) for v in items)
    return struct.pack(_SCALAR_FMT[vtype], value)


@dataclass
class Image:
    """A GGUF file's bytes and where its parts start (absolute offsets)."""
    data: bytes
    kv_start: int                       # first key/value pair
    kv_at: dict = field(default_factory=dict)      # key -> offset of its length field
    kv_value_at: dict = field(default_factory=dict)  # key -> offset of its value
    ti_start: int = 0                   # first tensor info
    ti_at: dict = field(default_factory=dict)      # tensor name -> offset of its info
    ti_type_at: dict = field(default_factory=dict)  # tensor name -> offset of its type field
    ti_offset_at: dict = field(default_factory=dict)  # tensor name -> offset of its offset field
    data_start: int = 0                 # start of the (aligned) data section
    tensor_data_at: dict = field(default_factory=dict)  # name -> (offset in data section, nbytes)

    def patch(self, at: int, fmt: str, value) -> bytes:
        """Bytes with the struct-packed `value` written at `at`."""
        b = bytearray(self.data)
        struct.pack_into(fmt, b, at, value)
        return bytes(b)


def build(kvs, tensors, *, version: int = 3, magic: bytes = b"GGUF", alignment: int = 32) -> Image:
    """kvs: [(key, type, value)]; tensors: [(name, ne, ggml_type)] with data
    generated here.  The file ends exactly at the end of the last tensor, so
    any truncation removes needed bytes."""
    out = bytearray(magic + struct.pack("<IQQ", version, len(tensors), len(kvs)))
    img = Image(data=b"", kv_start=len(out))
    for key, vtype, value in kvs:
        img.kv_at[key] = len(out)
        out += _str(key) + struct.pack("<I", vtype)
        img.kv_value_at[key] = len(out)
        out += _value(vtype, value)
    img.ti_start = len(out)
    off = 0
    sizes = []
    for name, ne, ttype in tensors:
        block, bbytes = _BLOCK[ttype]
        nbytes = int(np.prod(ne)) // block * bbytes
        img.ti_at[name] = len(out)
        out += _str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        img.ti_type_at[name] = len(out)
        out += struct.pack("<I", ttype)
        img.ti_offset_at[name] = len(out)
        out += struct.pack("<Q", off)
        img.tensor_data_at[name] = (off, nbytes)
        sizes.append(nbytes)
        off = (off + nbytes + alignment - 1) // alignment * alignment
    out += b"\0" * (-len(out) % alignment)
    img.data_start = len(out)
    rng = np.random.default_rng(1)
    for (name, _, _), nbytes in zip(tensors, sizes):
        toff, _ = img.tensor_data_at[name]
        out += b"\0" * (img.data_start + toff - len(out))
        out += rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    img.data = bytes(out)
    return img


N_EMBD = 64

BASE_KVS = [
    ("general.architecture", STR, "llama"),
    ("llama.block_count", U32, 1),
    ("llama.embedding_length", U32, N_EMBD),
    ("llama.attention.head_count", U32, 4),
    ("llama.rope.freq_base", F32, 10000.0),
    ("tokenizer.ggml.model", STR, "gpt2"),
    ("tokenizer.ggml.tokens", ARR, (STR, ["<s>", "</s>", "a", "b", "ab"])),
    ("tokenizer.ggml.token_type", ARR, (I32, [3, 3, 1, 1, 1])),
    ("tokenizer.ggml.add_bos_token", BOOL, 0),
]
BASE_TENSORS = [
    ("token_embd.weight", [N_EMBD, 5], T_F32),
    ("blk.0.attn_q.weight", [N_EMBD, N_EMBD], T_Q8_0),
    ("output_norm.weight", [N_EMBD], T_F32),
]


def base_image(**kw) -> Image:
    return build(BASE_KVS, BASE_TENSORS, **kw)


def write(tmp_path, data: bytes, name: str = "bad.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def load_error(path) -> ModelLoadError:
    """Load `path`, which must fail; return the ModelLoadError raised."""
    from colibri_lab import _engine
    with pytest.raises(ModelLoadError) as info:
        _engine.Model(str(path))
    return info.value


def assert_format_error(path, pattern: str):
    """A malformed file: ModelLoadError (not the 'well-formed but unsupported'
    subclass) whose message matches `pattern` (re.search, case-insensitive)."""
    import re
    err = load_error(path)
    assert not isinstance(err, UnsupportedModelError), f"format error reported as unsupported: {err}"
    assert re.search(pattern, str(err), re.IGNORECASE), f"message {str(err)!r} does not match {pattern!r}"
    return err


# --------------------------------------------------------------- header

def test_writer_produces_valid_gguf(tmp_path):
    """The baseline the corruptions start from is itself a valid GGUF (read
    back by the gguf package), so each test below breaks exactly one thing."""
    img = base_image()
    p = write(tmp_path, img.data, "base.gguf")
    r = gguf.GGUFReader(str(p))
    assert [t.name for t in r.tensors] == [t[0] for t in BASE_TENSORS]
    assert int(r.fields["llama.embedding_length"].parts[-1][0]) == N_EMBD
    for t in r.tensors:
        off, nbytes = img.tensor_data_at[t.name]
        assert t.data_offset == img.data_start + off
        assert t.n_bytes == nbytes


@pytest.mark.parametrize("magic", [b"GGML", b"gguf", b"\0\0\0\0", b"FUGG"])
def test_wrong_magic(tmp_path, magic):
    p = write(tmp_path, magic + base_image().data[4:])
    assert_format_error(p, r"magic")


def test_not_a_gguf_file(tmp_path):
    p = write(tmp_path, b"{\"this\": \"is json, not a model\"}\n" * 4)
    assert_format_error(p, r"magic")


@pytest.mark.parametrize("version", [1, 4, 0x03000000])
def test_bad_version(tmp_path, version):
    # Version 1 used 32-bit counts and is refused by name; others are unknown.
    p = write(tmp_path, base_image().patch(4, "<I", version))
    err = load_error(p)
    assert f"version {version}" in str(err), str(err)


@pytest.mark.parametrize("size", [0, 3, 12, 23])
def test_shorter_than_header(tmp_path, size):
    p = write(tmp_path, base_image().data[:size])
    assert_format_error(p, r"truncated|too small|smaller")


# --------------------------------------------------------------- truncation

def _cut_points(img: Image):
    """One cut inside each section of the file."""
    return {
        "header": 20,
        "first_key": img.kv_start + 10,
        "kv_middle": (img.kv_start + img.ti_start) // 2,
        "last_kv_value": img.kv_value_at["tokenizer.ggml.add_bos_token"],
        "tensor_infos": (img.ti_start + img.data_start) // 2,
        "before_data": img.data_start,
        "data_middle": (img.data_start + len(img.data)) // 2,
        "last_byte": len(img.data) - 1,
    }


@pytest.mark.parametrize("section", list(_cut_points(base_image())))
def test_truncated(tmp_path, section):
    img = base_image()
    cut = _cut_points(img)[section]
    assert 0 < cut < len(img.data)
    p = write(tmp_path, img.data[:cut])
    assert_format_error(p, r"truncated|past end|outside the file")


def test_truncated_data_names_the_tensor(tmp_path):
    img = base_image()
    p = write(tmp_path, img.data[:-1])
    # The last tensor in data order is the one that no longer fits.
    last = max(img.tensor_data_at, key=lambda n: img.tensor_data_at[n][0])
    err = assert_format_error(p, r"outside the file")
    assert last in str(err)


# --------------------------------------------------------------- counts

@pytest.mark.parametrize("field_at,value", [
    (8, 1 << 60),            # n_tensors
    (16, 1 << 60),           # n_kv
    (16, (1 << 64) - 1),     # n_kv
    (8, (1 << 64) - 1),      # n_tensors
])
def test_huge_counts(tmp_path, field_at, value):
    # Must fail on the count itself, fast, without trying to allocate.
    p = write(tmp_path, base_image().patch(field_at, "<Q", value))
    err = assert_format_error(p, r"too large")
    assert ("n_tensors" if field_at == 8 else "n_kv") in str(err)


def test_count_larger_than_present(tmp_path):
    # A plausible count with entries missing: the reader runs off the end.
    img = base_image()
    p = write(tmp_path, img.patch(16, "<Q", len(BASE_KVS) + 1))
    assert_format_error(p, r"truncated|past end|too large|type|length")


# --------------------------------------------------------------- strings

@pytest.mark.parametrize("length", [(1 << 64) - 1, 1 << 40, "file"])
def test_key_length_past_end(tmp_path, length):
    img = base_image()
    if length == "file":
        length = len(img.data)  # just past the end
    p = write(tmp_path, img.patch(img.kv_start, "<Q", length))
    err = assert_format_error(p, r"past end")
    assert str(length) in str(err)


def test_string_value_length_past_end(tmp_path):
    img = base_image()
    p = write(tmp_path, img.patch(img.kv_value_at["general.architecture"], "<Q", (1 << 64) - 1))
    assert_format_error(p, r"string.*past end")


def test_array_string_length_past_end(tmp_path):
    img = base_image()
    at = img.kv_value_at["tokenizer.ggml.tokens"] + 4 + 8  # after element type and count
    p = write(tmp_path, img.patch(at, "<Q", 1 << 50))
    assert_format_error(p, r"past end")


def test_tensor_name_length_past_end(tmp_path):
    img = base_image()
    p = write(tmp_path, img.patch(img.ti_at["output_norm.weight"], "<Q", 1 << 33))
    assert_format_error(p, r"tensor name.*past end")


def test_array_count_past_end(tmp_path):
    img = base_image()
    at = img.kv_value_at["tokenizer.ggml.token_type"] + 4  # the count
    p = write(tmp_path, img.patch(at, "<Q", 1 << 62))
    assert_format_error(p, r"past end")


# --------------------------------------------------------------- values

@pytest.mark.parametrize("kvs,pattern", [
    ([("x.unknown", 13, b"")], r"unknown value type 13"),
    ([("x.nested", ARR, (ARR, []))], r"nested array"),
    ([("x.flag", BOOL, 2)], r"bool value 2"),
    ([("llama.block_count", U32, 1)], r"duplicate key 'llama.block_count'"),
    ([("general.alignment", U32, 3)], r"general.alignment = 3 is not a power of two"),
    ([("general.alignment", U32, 0)], r"general.alignment = 0"),
    ([("general.alignment", U64, 32)], r"general.alignment has type u64"),
], ids=["unknown_type", "nested_array", "bad_bool", "duplicate_key", "alignment_3", "alignment_0",
        "alignment_u64"])
def test_bad_metadata(tmp_path, kvs, pattern):
    extra = []
    for key, vtype, value in kvs:
        if vtype == 13:  # unknown type: hand-encode a 4-byte payload after it
            extra.append((key, U32, 0))
        else:
            extra.append((key, vtype, value))
    img = build(BASE_KVS + extra, BASE_TENSORS)
    data = img.data
    if kvs[0][1] == 13:
        data = img.patch(img.kv_value_at[kvs[0][0]] - 4, "<I", 13)
    p = write(tmp_path, data)
    assert_format_error(p, pattern)


# --------------------------------------------------------------- tensors

@pytest.mark.parametrize("offset", [1 << 40, (1 << 64) - 32, "straddles_end"])
def test_tensor_offset_outside_file(tmp_path, offset):
    img = base_image()
    if offset == "straddles_end":  # starts inside the data section, ends past the file
        offset = (len(img.data) - img.data_start) - 32
    p = write(tmp_path, img.patch(img.ti_offset_at["output_norm.weight"], "<Q", offset))
    err = assert_format_error(p, r"outside the file")
    assert "output_norm.weight" in str(err)


def test_tensor_offset_misaligned(tmp_path):
    img = base_image()
    off, _ = img.tensor_data_at["output_norm.weight"]
    p = write(tmp_path, img.patch(img.ti_offset_at["output_norm.weight"], "<Q", off + 4))
    assert_format_error(p, r"output_norm.weight.*align")


def test_tensors_overlap(tmp_path):
    img = base_image()
    off, _ = img.tensor_data_at["blk.0.attn_q.weight"]
    p = write(tmp_path, img.patch(img.ti_offset_at["output_norm.weight"], "<Q", off))
    assert_format_error(p, r"overlap")


@pytest.mark.parametrize("ttype", [99, 4, 0xFFFFFFFF])
def test_unknown_tensor_type(tmp_path, ttype):
    img = base_image()
    p = write(tmp_path, img.patch(img.ti_type_at["token_embd.weight"], "<I", ttype))
    err = assert_format_error(p, rf"unknown type {ttype}")
    assert "token_embd.weight" in str(err)


@pytest.mark.parametrize("n_dims", [0, 5])
def test_bad_n_dims(tmp_path, n_dims):
    img = base_image()
    at = img.ti_at["output_norm.weight"] + 8 + len("output_norm.weight")
    p = write(tmp_path, img.patch(at, "<I", n_dims))
    assert_format_error(p, rf"{n_dims} dims|truncated")


def test_zero_dim(tmp_path):
    p = write(tmp_path, build(BASE_KVS, BASE_TENSORS[:2] + [("output_norm.weight", [N_EMBD, 0], T_F32)]).data)
    assert_format_error(p, r"output_norm.weight.*ne\[1\] = 0")


def test_row_not_multiple_of_block(tmp_path):
    # Q8_0 stores 32 elements per block: a 48-element row cannot be stored.
    # Written by hand because build() only writes whole blocks.
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 1, 1))
    out += _str("general.architecture") + struct.pack("<I", STR) + _str("llama")
    out += _str("blk.0.attn_q.weight") + struct.pack("<I", 2) + struct.pack("<QQ", 48, 2)
    out += struct.pack("<IQ", T_Q8_0, 0)
    out += b"\0" * (-len(out) % 32) + b"\x01" * 256
    p = write(tmp_path, bytes(out))
    assert_format_error(p, r"blk.0.attn_q.weight.*not a multiple")


def test_duplicate_tensor_name(tmp_path):
    tensors = BASE_TENSORS + [("output_norm.weight", [N_EMBD], T_F32)]
    p = write(tmp_path, build(BASE_KVS, tensors).data)
    assert_format_error(p, r"duplicate tensor name 'output_norm.weight'")


# --------------------------------------------- well-formed but not loadable

def test_unsupported_tensor_type(tmp_path):
    """IQ4_XS is a real GGML type the engine does not compute with: the file is
    well-formed, so this is UnsupportedModelError naming the tensor and type."""
    tensors = BASE_TENSORS + [("blk.0.ffn_down.weight", [256, 2], T_IQ4_XS)]
    p = write(tmp_path, build(BASE_KVS, tensors).data)
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.ffn_down\.weight.*IQ4_XS"):
        from colibri_lab import _engine
        _engine.Model(str(p))


def _llama_writer(path, arch="llama", *, q_shape=None, n_embd=64, n_ff=128, n_head=4,
                  n_head_kv=2, n_vocab=288):
    """A complete one-layer llama-family file written with gguf.GGUFWriter,
    F32 weights; q_shape overrides blk.0.attn_q.weight's numpy shape
    ([n_out, n_in]; GGUF ne is the reverse)."""
    rng = np.random.default_rng(0)
    head_dim = n_embd // n_head
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    # The tokenizer section of tests/tinymodels.py's files, so that the only
    # thing wrong with the file is what the test changes.
    tokens, types, merges = tiny_vocab(n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(256)
    w.add_eos_token_id(257)
    w.add_add_bos_token(False)

    def mat(n_out, n_in):
        return rng.standard_normal((n_out, n_in)).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(n_vocab, n_embd))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor("blk.0.attn_q.weight", mat(*(q_shape or (n_embd, n_embd))))
    w.add_tensor("blk.0.attn_k.weight", mat(n_head_kv * head_dim, n_embd))
    w.add_tensor("blk.0.attn_v.weight", mat(n_head_kv * head_dim, n_embd))
    w.add_tensor("blk.0.attn_output.weight", mat(n_embd, n_embd))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor("blk.0.ffn_gate.weight", mat(n_ff, n_embd))
    w.add_tensor("blk.0.ffn_up.weight", mat(n_ff, n_embd))
    w.add_tensor("blk.0.ffn_down.weight", mat(n_embd, n_ff))
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("q_shape", [(64, 96), (96, 64), (64, 32)],
                         ids=["n_in_wrong", "n_out_wrong", "n_in_short"])
def test_tensor_shape_disagrees_with_metadata(tmp_path, q_shape):
    """A valid GGUF whose blk.0.attn_q.weight does not fit
    llama.embedding_length = 64: the message names the tensor."""
    p = _llama_writer(tmp_path / "wrong_shape.gguf", q_shape=q_shape)
    r = gguf.GGUFReader(str(p))  # well-formed as GGUF
    assert [int(x) for x in r.tensors[2].shape] == [q_shape[1], q_shape[0]]
    assert_format_error(p, r"blk\.0\.attn_q\.weight")


@pytest.mark.parametrize("dim,value", [(0, 32), (1, 32)], ids=["ne0_short", "ne1_short"])
def test_tiny_llama_with_one_tensor_reshaped(tmp_path, dim, value):
    """tinymodels' valid tiny llama with only blk.0.attn_q.weight's ne[dim]
    changed from n_embd to `value` in the tensor info (its data shrinks, so
    it still lies inside the file and overlaps nothing: GGUF-valid)."""
    tw = write_tiny_llama(tmp_path / "tiny.gguf", wtype="F32", n_embd=64)
    data = bytearray(open(tw.path, "rb").read())
    name = b"blk.0.attn_q.weight"
    i = data.find(struct.pack("<Q", len(name)) + name)
    assert i > 0
    at = i + 8 + len(name)
    assert struct.unpack_from("<IQQ", data, at) == (2, 64, 64)
    struct.pack_into("<Q", data, at + 4 + 8 * dim, value)
    p = write(tmp_path, bytes(data), "reshaped.gguf")
    r = gguf.GGUFReader(str(p))  # still well-formed as GGUF
    assert len(r.tensors) == len(tw)
    assert_format_error(p, r"blk\.0\.attn_q\.weight")


def test_unknown_architecture(tmp_path):
    p = _llama_writer(tmp_path / "arch.gguf", arch="nosucharch")
    with pytest.raises(UnsupportedModelError, match=r"nosucharch"):
        from colibri_lab import _engine
        _engine.Model(str(p))


def test_head_dim_past_limit(tmp_path):
    """A head size past what the attention kernels take (512) is refused at
    load with the size named; one at the limit loads."""
    from colibri_lab import _engine
    p = tmp_path / "hd.gguf"
    write_tiny_llama(p, head_dim=520)
    with pytest.raises(UnsupportedModelError, match=r"head dimension 520 .* 512"):
        _engine.Model(str(p))
    ok = tmp_path / "hd512.gguf"
    write_tiny_llama(ok, head_dim=512)
    m = _engine.Model(str(ok))
    assert m.info["head_dim"] == 512
    for simd in _engine.simd_available():  # the scalar / AVX2 attention converts rows into a 512-float buffer
        e = _engine.Engine(m, n_ctx=16, n_threads=1, simd=simd)
        assert np.isfinite(e.forward(0, [1, 2, 3], 0)).all()
        e.close()
