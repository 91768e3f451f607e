"""A real draft model for speculative-decoding tests: SmolLM2 cut down to its
first few blocks.  Same vocabulary and tokenizer, a fraction of the compute,
and drafts that agree with the full model often but not always — the shape
of a real draft model, built from the file we already have."""
from __future__ import annotations

import os

import gguf
import numpy as np


def write_truncated(src: str | os.PathLike, dst: str | os.PathLike, n_layer: int, *,
                    contrary: bool = False) -> str:
    """Copy `src` (a llama GGUF) to `dst` keeping blocks [0, n_layer).

    `contrary` negates the final norm's weights, so the copy's logits are the
    negated ones and its greedy pick is its least likely token: a drafter
    that (almost) never agrees with the model it was cut from, whatever the
    text, for tests of a policy that must stop paying for it."""
    r = gguf.GGUFReader(os.fspath(src))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(os.fspath(dst), arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == f"{arch}.block_count":
            w.add_uint32(name, n_layer)
            continue
        vtype = field.types[0]
        value = field.contents()
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(name, value)
        elif vtype == gguf.GGUFValueType.STRING:
            w.add_string(name, value)
        else:
            w.add_key_value(name, value, vtype)
    for t in r.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n_layer:
            continue
        data = np.asarray(t.data)
        if contrary and t.name == "output_norm.weight":
            if t.tensor_type != gguf.GGMLQuantizationType.F32:
                raise ValueError(f"output_norm.weight is {t.tensor_type.name}, not F32: cannot negate it")
            data = -data
        # quantized data comes as bytes [rows, row_bytes]; the writer maps it back to elements
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return os.fspath(dst)
