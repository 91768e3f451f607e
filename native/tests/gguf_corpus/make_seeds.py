"""Regenerate the fuzz seed files in this directory (deterministic).

    python native/tests/gguf_corpus/make_seeds.py

Seeds are small valid GGUF files that reach every section of the reader:
metadata of every value type, string arrays, every supported tensor type,
a non-default alignment and a file without tensors.  fuzz_gguf (run from
native/) mutates them in addition to its built-in seeds; libFuzzer can take
this directory as its corpus.
"""
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf import quants

HERE = os.path.dirname(os.path.abspath(__file__))


def small_quant(path):
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_embedding_length(64)
    w.add_head_count(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_token_list(["<s>", "</s>", "a", "b", "ab"])
    w.add_token_types([3, 3, 1, 1, 1])
    w.add_token_merges(["a b"])
    w.add_bool("seed.flag", True)
    w.add_int8("seed.i8", -3)
    w.add_uint16("seed.u16", 65535)
    w.add_int16("seed.i16", -2)
    w.add_int64("seed.i64", -(1 << 40))
    w.add_uint64("seed.u64", 1 << 63)
    w.add_float64("seed.f64", 0.5)
    w.add_array("seed.floats", [0.25, -1.0])
    x = rng.standard_normal((2, 64)).astype(np.float32)
    w.add_tensor("f32", x)
    w.add_tensor("f16", x.astype(np.float16))
    for name, qt in (("q4_0", QT.Q4_0), ("q4_1", QT.Q4_1), ("q8_0", QT.Q8_0), ("bf16", QT.BF16)):
        w.add_tensor(name, quants.quantize(x, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def aligned_64(path):
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_custom_alignment(64)
    w.add_string("tokenizer.chat_template", "{{ messages }}")
    w.add_tensor("token_embd.weight", np.arange(96, dtype=np.float32).reshape(3, 32))
    w.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def no_tensors(path):
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("metadata only")
    w.add_array("seed.empty", [])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    small_quant(os.path.join(HERE, "small_quant.gguf"))
    aligned_64(os.path.join(HERE, "aligned_64.gguf"))
    no_tensors(os.path.join(HERE, "no_tensors.gguf"))
