"""Shared pytest fixtures: tiny random GGUF models, the SmolLM2 path, SIMD levels.

Tiny models are written once per session per parameter set (they are a few
tens of KB and deterministic in their seed) and handed out as TinyWeights:
a dict of the stored float32 weights with `.path` and `.hparams`.

Use them either through the `tiny_model` fixture, parametrized indirectly:

    @pytest.mark.parametrize("tiny_model", [{"wtype": "Q4_0", "tied": False}],
                             indirect=True)
    def test_x(tiny_model): ...

or by calling the `make_tiny` factory fixture with write_tiny_llama()'s
keyword arguments: make_tiny(wtype="F16", rope_scale=4.0).
"""
from __future__ import annotations

import json
import os
import sys

import pytest

# Make the helper modules (tinymodels, reference) importable as top-level
# modules whatever the rootdir / import mode.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from tinymodels import write_tiny_llama  # noqa: E402

SIMD_LEVELS = ("scalar", "avx2", "avx512")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "smollm2: needs the SmolLM2-135M GGUF (env COLIBRI_LAB_SMOLLM2 or "
        "colibri_lab.models.resolve('smollm2')); errors if it cannot be found",
    )


@pytest.fixture(scope="session")
def make_tiny(tmp_path_factory):
    """Factory: make_tiny(**write_tiny_llama kwargs) -> TinyWeights, cached per session."""
    cache: dict = {}
    root = tmp_path_factory.mktemp("tiny_models")

    def make(**kw):
        key = tuple(sorted(kw.items()))
        if key not in cache:
            name = "tiny-" + "-".join(f"{k}_{v}" for k, v in key) + ".gguf" if key else "tiny-default.gguf"
            cache[key] = write_tiny_llama(root / name, **kw)
        return cache[key]

    return make


@pytest.fixture
def tiny_model(request, make_tiny):
    """A tiny llama model; request.param (if parametrized) is a dict of
    write_tiny_llama kwargs, default F32 tied."""
    kw = getattr(request, "param", None) or {}
    return make_tiny(**kw)


@pytest.fixture(params=SIMD_LEVELS)
def simd(request):
    """Every SIMD level; a level this CPU lacks is skipped with the reason."""
    from colibri_lab import _engine
    avail = list(_engine.simd_available())
    assert "scalar" in avail, f"simd_available() must always contain 'scalar': {avail}"
    if request.param not in avail:
        pytest.skip(f"this CPU lacks {request.param} (has {avail})")
    return request.param


@pytest.fixture(scope="session")
def real_model():
    """Factory: real_model(alias) -> Path of a registered model's GGUF, pulled
    into the cache on first use (as smollm2 is).  For tests marked
    ``realmodels``; never skips: a model that cannot be had is an error."""
    from colibri_lab import models

    def get(alias: str):
        return models.resolve(alias)

    return get


@pytest.fixture(scope="session")
def smollm2_path():
    """Path of the SmolLM2-135M-Instruct GGUF.  Never skips: a test that asks
    for it errors if the file cannot be found."""
    p = os.environ.get("COLIBRI_LAB_SMOLLM2")
    if p:
        if not os.path.isfile(p):
            raise FileNotFoundError(f"COLIBRI_LAB_SMOLLM2={p!r} is not a file")
        return p
    from colibri_lab import models  # imported lazily: optional for tiny-model tests
    p = os.fspath(models.resolve("smollm2"))
    if not os.path.isfile(p):
        raise FileNotFoundError(f"models.resolve('smollm2') gave {p!r}, which is not a file")
    return p


# A SmolLM2 engine and a live server on it, one per test module (the server
# tests share these; a module that needs other settings overrides
# `engine_kwargs` or `server_kwargs`, or the fixture itself).
@pytest.fixture(scope="module")
def engine_kwargs():
    """Keyword arguments for the module's `engine` beyond test_serve_util.make_engine's defaults."""
    return {}


@pytest.fixture(scope="module")
def engine(smollm2_path, engine_kwargs):
    from test_serve_util import make_engine

    eng = make_engine(smollm2_path, **engine_kwargs)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def server_kwargs():
    """Keyword arguments for the module's `server` (colibri_lab.server.Server) beyond port and model id."""
    return {}


@pytest.fixture(scope="module")
def server(engine, server_kwargs):
    from colibri_lab.server import Server

    srv = Server(engine, port=0, model_id="smollm2", **server_kwargs).start()
    yield srv
    srv.stop()


@pytest.fixture
def toml_spec(tmp_path):
    """Factory: write `workload` (a workload dict) to tmp_path/w.json and an
    experiment spec over its first `n` items to tmp_path/x.toml (name "x",
    one repeat, a 1-thread scalar engine on `model`), with variant "a" at
    `max_tokens` and, unless b_max_tokens is None, variant "b" at
    b_max_tokens; returns the spec's path."""
    def write(model, workload, n, max_tokens=3, b_max_tokens=2):
        (tmp_path / "w.json").write_text(json.dumps(workload))
        variant_b = "" if b_max_tokens is None else f"""[[variants]]
name = "b"
request = {{ max_tokens = {b_max_tokens} }}
"""
        spec = tmp_path / "x.toml"
        spec.write_text(f"""
name = "x"
workload = {{ name = "{tmp_path / 'w.json'}", n = {n} }}
repeats = 1
[engine]
model = "{model}"
n_threads = 1
n_ctx = 256
simd = "scalar"
[request]
max_tokens = {max_tokens}
[[variants]]
name = "a"
{variant_b}""")
        return spec
    return write
