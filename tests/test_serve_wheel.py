"""The built wheel works outside the source tree.

Every other test runs on an editable install, which finds modules in the
checkout whatever pyproject.toml lists; a wheel holds only what setuptools
packaged (issue: `colibri_lab.server` was missing, so `python -m
colibri_lab.serve` and `colibri-lab` failed with ModuleNotFoundError).  Here
the wheel is built (without build isolation when the build tools are
installed, so the compiled objects in build/ are reused), installed with
--no-deps into a fresh venv whose dependencies come from this environment's
site-packages, and run from a directory outside the checkout.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.smollm2]
ROOT = Path(__file__).resolve().parents[1]


def _subpackages() -> set[str]:
    return {str(p.parent.relative_to(ROOT)).replace(os.sep, "/")
            for p in (ROOT / "colibri_lab").rglob("__init__.py")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)]
    if all(importlib.util.find_spec(m) for m in ("Cython", "setuptools", "wheel", "numpy")):
        cmd.insert(4, "--no-build-isolation")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (whl,) = out.glob("colibri_lab-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    py = root / "bin" / "python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                        "--no-index", str(wheel)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # dependencies (numpy, tokenizers, jinja2, ...) from this environment, after the
    # venv's own site-packages; a plain path line does not run this environment's
    # .pth files, so its editable install of the checkout stays out of sight
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site, "zz_test_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    return root


def _run(venv: Path, args, tmp_path, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env, **kw)


def test_wheel_file_list(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    pkgs = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    assert pkgs == _subpackages(), (sorted(pkgs), sorted(_subpackages()))
    for mod in (ROOT / "colibri_lab").rglob("*.py"):
        rel = str(mod.relative_to(ROOT)).replace(os.sep, "/")
        assert rel in names, rel
    assert any(n.startswith("colibri_lab/_engine.") and n.endswith(".so") for n in names), names
    assert any(n.startswith("colibri_lab/workloads/") and n.endswith(".json") for n in names)
    assert not [n for n in names if n.endswith((".c", ".pyx"))]
    entry = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert entry and "colibri-lab = colibri_lab.cli:main" in zipfile.ZipFile(wheel).read(entry[0]).decode()


def test_wheel_serve_help_and_generate(venv, tmp_path, smollm2_path):
    py = str(venv / "bin" / "python")
    r = _run(venv, [py, "-c", "import colibri_lab, colibri_lab.server; print(colibri_lab.__file__)"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(str(venv)), r.stdout   # the wheel's copy, not the checkout
    r = _run(venv, [py, "-m", "colibri_lab.serve", "--help"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "--max-connections" in r.stdout and "--request-timeout" in r.stdout
    r = _run(venv, [str(venv / "bin" / "colibri-lab"), "generate", "The capital of France is", "--model",
                    smollm2_path, "--max-tokens", "4", "--threads", "1", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["metrics"]["completion_tokens"] == 4 and out["text"].strip(), out
