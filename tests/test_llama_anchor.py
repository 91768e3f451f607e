"""How the llama.cpp anchor is run (colibri_lab.llama_anchor): its extra CPU buffer types off on
AMX CPUs only, the choice overridable, and the same choice in-process and for its server."""
from __future__ import annotations

import types

import pytest

from colibri_lab import llama_anchor


@pytest.mark.parametrize("flags, want", [("fpu avx2 avx512f amx_tile amx_int8", False), ("fpu avx2 avx512f", True),
                                         (None, True)])
def test_extra_bufts_are_off_on_amx_cpus_only(tmp_path, monkeypatch, flags, want):
    monkeypatch.delenv(llama_anchor.EXTRA_BUFTS_ENV, raising=False)
    info = tmp_path / "cpuinfo"
    if flags is not None:
        info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    monkeypatch.setattr(llama_anchor, "_cpu_has_amx", lambda: llama_anchor._cpu_has_amx_at(info))
    assert llama_anchor.extra_bufts() is want


@pytest.mark.parametrize("bad", ["yes", "true", " 1", "2"])
def test_an_unknown_override_is_refused_naming_the_variable(monkeypatch, bad):
    monkeypatch.setenv(llama_anchor.EXTRA_BUFTS_ENV, bad)
    with pytest.raises(ValueError, match=llama_anchor.EXTRA_BUFTS_ENV):
        llama_anchor.extra_bufts()


@pytest.mark.parametrize("forced", ["0", "1"])
def test_the_environment_overrides_the_choice(monkeypatch, forced):
    monkeypatch.setenv(llama_anchor.EXTRA_BUFTS_ENV, forced)
    assert llama_anchor.extra_bufts() is (forced == "1")
    cmd = llama_anchor.server_command("/py", ["--model", "m.gguf", "--port", "1"])
    if forced == "1":
        assert cmd == ["/py", "-m", "llama_cpp.server", "--model", "m.gguf", "--port", "1"]
        assert llama_anchor.prelude() == ""
    else:
        assert cmd[:2] == ["/py", "-c"] and cmd[3:] == ["--model", "m.gguf", "--port", "1"]
        compile(cmd[2], "<launcher>", "exec")
        assert "run_module('llama_cpp.server'" in cmd[2] and llama_anchor.prelude() in cmd[2]


def test_the_patch_turns_use_extra_bufts_off_once(monkeypatch):
    """The patch wraps llama_model_default_params of llama_cpp.llama_cpp (a stand-in module here)
    and applying it twice wraps once."""
    calls = []

    def defaults():
        calls.append(1)
        return types.SimpleNamespace(use_extra_bufts=True, n_gpu_layers=0)
    lc = types.ModuleType("llama_cpp.llama_cpp")
    lc.llama_model_default_params = defaults
    pkg = types.ModuleType("llama_cpp")
    pkg.llama_cpp = lc
    monkeypatch.setitem(__import__("sys").modules, "llama_cpp", pkg)
    monkeypatch.setitem(__import__("sys").modules, "llama_cpp.llama_cpp", lc)
    monkeypatch.setenv(llama_anchor.EXTRA_BUFTS_ENV, "0")
    assert llama_anchor.configure() is False
    assert llama_anchor.configure() is False
    p = lc.llama_model_default_params()
    assert p.use_extra_bufts is False and len(calls) == 1
    monkeypatch.setenv(llama_anchor.EXTRA_BUFTS_ENV, "1")
    lc.llama_model_default_params = defaults
    assert llama_anchor.configure() is True and lc.llama_model_default_params is defaults
