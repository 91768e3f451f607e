"""How colibri-lab runs llama.cpp (llama-cpp-python) as its anchor, in one place.

The anchor opens a model with llama-cpp-python's default model params, i.e.
with its extra CPU buffer types on (`use_extra_bufts`: its weight repacking,
the configuration its users run), except on CPUs with AMX tiles.  There
llama-cpp-python 0.3.36 picks its AMX buffer type, and every batch of more
than one token crashes the process with SIGSEGV inside llama_decode (Intel
Xeon VMs with `amx_tile`: a prompt of two tokens is enough, in-process or
through `python -m llama_cpp.server`; a one-token prompt runs).  On those
CPUs, and only there, the anchor runs with the extra buffer types off: its
plain AVX-512 kernels.  COLIBRI_LAB_LLAMA_EXTRA_BUFTS=0|1 overrides the
choice.

This module imports nothing outside the standard library: the benchmark
scripts load it under the anchors' interpreter, which need not have
colibri-lab's dependencies.
"""
from __future__ import annotations

import os

EXTRA_BUFTS_ENV = "COLIBRI_LAB_LLAMA_EXTRA_BUFTS"


def _cpu_has_amx_at(cpuinfo) -> bool:
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_tile" in line.split()
    except OSError:
        pass
    return False


def _cpu_has_amx() -> bool:
    return _cpu_has_amx_at("/proc/cpuinfo")


def extra_bufts() -> bool:
    """Whether the anchor opens models with use_extra_bufts on (see the module doc)."""
    forced = os.environ.get(EXTRA_BUFTS_ENV, "")
    if forced in ("0", "1"):
        return forced == "1"
    if forced:   # a typo would otherwise measure the anchor in the setting nobody asked for
        raise ValueError(f"{EXTRA_BUFTS_ENV}={forced!r}: use 0 (off), 1 (on) or leave it unset (automatic)")
    return not _cpu_has_amx()


# Python source that turns use_extra_bufts off in a llama-cpp-python process:
# Llama() has no argument for it and reads llama_model_default_params() from
# the module llama_cpp.llama_cpp, so that function is wrapped (once).
_DISABLE_SOURCE = """
import llama_cpp.llama_cpp as _lc
if not getattr(_lc.llama_model_default_params, "no_extra_bufts", False):
    def _wrap(defaults):
        def params():
            p = defaults()
            p.use_extra_bufts = False
            return p
        params.no_extra_bufts = True
        return params
    _lc.llama_model_default_params = _wrap(_lc.llama_model_default_params)
"""


def configure() -> bool:
    """Make the llama_cpp.Llama models this process opens later anchor models (use_extra_bufts off
    where extra_bufts() says so); returns extra_bufts()."""
    on = extra_bufts()
    if not on:
        exec(compile(_DISABLE_SOURCE, "<llama_anchor>", "exec"), {})
    return on


def prelude() -> str:
    """Python source to run first in a llama-cpp-python child process (`python -c`) so that it opens
    anchor models: the use_extra_bufts patch where extra_bufts() is off here, else nothing."""
    return "" if extra_bufts() else _DISABLE_SOURCE


def server_command(python: str, args: list[str]) -> list[str]:
    """The argv that runs llama-cpp-python's OpenAI server under `python` with `args`, with the
    extra buffer types off where extra_bufts() says so."""
    if extra_bufts():
        return [python, "-m", "llama_cpp.server", *args]
    launch = prelude() + "import runpy\nrunpy.run_module('llama_cpp.server', run_name='__main__', alter_sys=True)\n"
    return [python, "-c", launch, *args]
