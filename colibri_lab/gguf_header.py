"""What a GGUF file is, read from its header alone: architecture, name, licence, quant mix.

``models list`` shows this for every cached model, so it must not load (mmap,
validate and repack) the weights the way ``_engine.Model`` does: this reads
the metadata key/values and the tensor table, skips over array contents (a
262,144-entry vocabulary is skipped, not decoded) unless asked for them, and
never touches tensor data.  Every length is checked against the file size before it is used, so a
truncated or corrupt file gives a ModelLoadError, not a crash or a huge read.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections import Counter
from typing import Any

from .errors import ModelLoadError

__all__ = ["read_header", "GGML_TYPES", "quant_mix"]

# ggml_type ids (ggml.h) -> name.
GGML_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K",
    16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S",
    22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
    29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}

# GGUF value types: id -> struct format of a scalar (8 = string, 9 = array).
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 8


class _Cursor:
    def __init__(self, buf, path: str):
        self.buf, self.pos, self.path = buf, 0, path

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise ModelLoadError(f"{self.path}: GGUF header truncated or corrupt at byte {self.pos}")

    def unpack(self, fmt: str):
        n = struct.calcsize(fmt)
        self.need(n)
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return v

    def string(self, keep: bool = True) -> str | None:
        n = self.unpack("<Q")
        self.need(n)
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", "replace") if keep else None
        self.pos += n
        return s

    def value(self, vtype: int, arrays: bool) -> Any:
        """A scalar or string; an array is a list when ``arrays``, else skipped
        and standing as ('array', length)."""
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.unpack("<I")
            count = self.unpack("<Q")
            if etype in _SCALAR:
                fmt = _SCALAR[etype]
                size = struct.calcsize(fmt) * count
                self.need(size)
                items = (list(struct.unpack_from(f"<{count}{fmt[1]}", self.buf, self.pos))
                         if arrays else None)
                self.pos += size
            elif etype == _STRING:
                items = [self.string(keep=arrays) for _ in range(count)]
            else:
                raise ModelLoadError(f"{self.path}: unsupported GGUF array element type {etype}")
            return items if arrays else ("array", count)
        raise ModelLoadError(f"{self.path}: unsupported GGUF value type {vtype}")


def read_header(path: str | os.PathLike, arrays: bool = False) -> dict:
    """``{"version", "metadata": {key: value}, "tensors": [(name, type name, n_elements)]}``.

    Array values in ``metadata`` are lists when ``arrays`` (the vocabulary, for
    example), else ``("array", length)`` with their contents skipped.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise ModelLoadError(f"{path}: too small to be a GGUF file ({size} bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(_Cursor(buf, path), arrays)
    except OSError as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from e


def _parse(c: _Cursor, arrays: bool) -> dict:
    if bytes(c.buf[:4]) != b"GGUF":
        raise ModelLoadError(f"{c.path}: not a GGUF file (bad magic)")
    c.pos = 4
    version = c.unpack("<I")
    if version not in (2, 3):
        raise ModelLoadError(f"{c.path}: GGUF version {version} is not supported (2 or 3)")
    n_tensors = c.unpack("<Q")
    n_kv = c.unpack("<Q")
    # Each entry takes at least 8+4 bytes: bounds the loops by the file size.
    if (n_tensors + n_kv) * 12 > len(c.buf):
        raise ModelLoadError(f"{c.path}: GGUF header claims {n_kv} keys and {n_tensors} tensors")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = c.string()
        meta[key] = c.value(c.unpack("<I"), arrays)
    tensors = []
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.unpack("<I")
        if n_dims > _MAX_DIMS:
            raise ModelLoadError(f"{c.path}: tensor {name!r} has {n_dims} dimensions")
        n = 1
        for _ in range(n_dims):
            n *= c.unpack("<Q")
        ttype = c.unpack("<I")
        c.unpack("<Q")  # data offset: not needed here
        tensors.append((name, GGML_TYPES.get(ttype, f"type{ttype}"), n))
    return {"version": version, "metadata": meta, "tensors": tensors}


def quant_mix(tensors) -> list[tuple[str, float]]:
    """Share of the weights (by element count) stored in each type, largest first."""
    count: Counter = Counter()
    for _, ttype, n in tensors:
        count[ttype] += n
    total = sum(count.values()) or 1
    return [(t, n / total) for t, n in count.most_common()]
