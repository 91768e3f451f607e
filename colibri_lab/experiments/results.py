"""Results: a tidy per-request DataFrame, a per-step DataFrame and the run's
metadata; saved as CSV + JSON (no heavy dependencies) and loaded back equal.

Layout of a saved run (experiments/results/<name>/<timestamp>/):
    requests.csv   one row per request
    steps.csv      one row per engine step (slices of scheduler.step_log);
                   steps.csv.gz instead with save(steps="gz"), none with steps="none"
    gaps.csv.gz    serving runs only: one row per gap between output tokens
    numerics.csv   one row per (variant, item) of the numerics pass (specs with numerics = true)
    meta.json      metadata + the column dtypes, so that load_results()
                   restores exactly the frames that were saved
"""
from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from colibri_lab import metrics as schema

# Column layout (colibri_lab.metrics): row context first, then the metrics, then the outputs.
ID_COLUMNS = list(schema.ROW_CONTEXT)
METRIC_COLUMNS = list(schema.REQUEST_COLUMNS)
TAIL_COLUMNS = list(schema.ROW_OUTPUT)
POS_PREFIXES = schema.POS_PREFIXES
SRC_PREFIXES = schema.SRC_PREFIXES
GAP_COLUMNS = list(schema.GAP_COLUMNS)
NUMERICS_COLUMNS = list(schema.NUMERICS_COLUMNS)
STEP_COLUMNS = list(schema.STEP_CONTEXT[:4]) + list(schema.STEP_COLUMNS) + ["t_rel_s"]


def _order(df: pd.DataFrame, lead: list[str], tail: list[str] = ()) -> pd.DataFrame:
    first = [c for c in lead if c in df.columns]
    last = [c for c in tail if c in df.columns and c not in first]
    mid = [c for c in df.columns if c not in first and c not in last]
    return df[first + mid + last]


def _count_columns(cols) -> list[str]:
    """The flattened per-position / per-source count columns, positions in numeric order."""
    pos = [c for c in cols if c.startswith(POS_PREFIXES)]
    pos.sort(key=lambda c: (int(c.rsplit("_", 1)[1]), c.startswith("draft_accepted")))
    src = sorted(c for c in cols if c.startswith(SRC_PREFIXES))
    return pos + src


def _tidy(df: pd.DataFrame) -> pd.DataFrame:
    """Make a frame CSV-stable: text columns hold str (never None / NaN)."""
    df = df.reset_index(drop=True)
    for c in df.columns:
        if df[c].dtype == object:
            df[c] = df[c].map(lambda x: "" if x is None or (isinstance(x, float) and np.isnan(x)) else str(x))
    return df


@dataclass
class Results:
    """What a run produced.  `requests`: one row per request; `steps`: one row
    per engine step; `meta`: provenance (git commit and dirty flag, CPU, SIMD,
    threads, model sha256, engine / server settings, package versions, load
    average before and after, blocks).  `path`: where it was saved or loaded
    from.  `gaps` (serving runs): one row per inter-token gap.  `numerics`:
    one row per (variant, item) of the numerics pass (empty unless the spec
    asked for it; see experiments.numerics)."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    meta: dict = field(default_factory=dict)
    path: Path | None = None
    gaps: pd.DataFrame | None = None     # serving runs: one row per inter-token gap (loadgen)
    numerics: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=NUMERICS_COLUMNS))

    def __post_init__(self):
        # the frames carry where they came from, so a plot of res.requests can say it (plots._stamp)
        line = provenance_line(self.meta)
        for df in (self.requests, self.steps, self.gaps):
            if df is not None and line:
                df.attrs["provenance"] = line

    @staticmethod
    def numerics_frame(rows: list[dict]) -> pd.DataFrame:
        """The numerics table from the numerics pass's rows."""
        df = pd.DataFrame(rows) if rows else pd.DataFrame(columns=NUMERICS_COLUMNS)
        return _tidy(_order(df, NUMERICS_COLUMNS))

    @classmethod
    def from_rows(cls, rows: list[dict], steps: list[dict], meta: dict,
                  gaps: list[dict] | None = None) -> "Results":
        req = pd.DataFrame(rows)
        if len(req):
            counts = _count_columns(req.columns)
            if counts:  # a request that never drafted at position i drafted 0 there
                req[counts] = req[counts].fillna(0).astype("int64")
            req = _order(req, ID_COLUMNS + METRIC_COLUMNS + counts, TAIL_COLUMNS)
        else:
            req = pd.DataFrame(columns=ID_COLUMNS + METRIC_COLUMNS + TAIL_COLUMNS)
        st = pd.DataFrame(steps)
        st = _order(st, STEP_COLUMNS) if len(st) else pd.DataFrame(columns=STEP_COLUMNS)
        gp = None if gaps is None else _tidy(pd.DataFrame(gaps, columns=None if gaps else GAP_COLUMNS))
        return cls(_tidy(req), _tidy(st), meta, gaps=gp)

    @property
    def name(self) -> str:
        return self.meta.get("experiment", {}).get("name", "experiment")

    @property
    def interrupted(self) -> bool:
        return bool(self.meta.get("interrupted", False))

    def __repr__(self) -> str:
        nv = self.requests["variant"].nunique() if "variant" in self.requests else 0
        return (f"Results({self.name!r}: {len(self.requests)} requests, {len(self.steps)} steps, {nv} variants"
                f"{', interrupted' if self.interrupted else ''}{', at ' + str(self.path) if self.path else ''})")

    def variant_settings(self) -> pd.DataFrame:
        """One row per variant, its engine/request/arrival settings flattened to
        columns "engine.n_slots", "request.max_tokens", ... (merge onto requests)."""
        recs = []
        for v in self.meta.get("variants", []):
            rec = {"variant": v["name"]}
            for grp in ("engine", "request", "arrival"):
                for k, val in (v.get(grp) or {}).items():
                    rec[f"{grp}.{k}"] = json.dumps(val) if isinstance(val, (dict, list)) else val
            recs.append(rec)
        return pd.DataFrame(recs)

    # ------------------------------------------------------------- storage
    def save(self, path: str | os.PathLike | None = None, root: str | os.PathLike | None = None,
             steps: str = "csv") -> Path:
        """Write requests.csv, steps.csv and meta.json into `path`, or into
        <root>/<name>/<timestamp>/ (root default: ./experiments/results).

        steps: "csv" (steps.csv), "gz" (steps.csv.gz: the per-step table is
        the large one - one row per engine step; float columns are rounded to
        4 decimals, which with gzip makes it ~8x smaller; results meant to be
        committed use it) or "none" (not written; loads back empty)."""
        if steps not in ("csv", "gz", "none"):
            raise ValueError(f"steps must be 'csv', 'gz' or 'none', got {steps!r}")
        if path is None:
            root = Path(root) if root is not None else Path("experiments") / "results"
            stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
            path = root / self.name / stamp
            n = 1
            while path.exists():
                path = root / self.name / f"{stamp}-{n}"
                n += 1
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        meta = dict(self.meta)
        meta["dtypes"] = {"requests": {c: str(t) for c, t in self.requests.dtypes.items()},
                          "steps": {c: str(t) for c, t in self.steps.dtypes.items()}}
        (path / "gaps.csv.gz").unlink(missing_ok=True)
        if self.gaps is not None:
            # one row per output token: rounded like the steps (0.1 µs), gzipped
            gp = self.gaps.copy()
            for c in gp.columns:
                if gp[c].dtype.kind == "f":
                    gp[c] = gp[c].round(4)
            gp.to_csv(path / "gaps.csv.gz", index=False, compression={"method": "gzip", "mtime": 0})
            meta["dtypes"]["gaps"] = {c: str(t) for c, t in self.gaps.dtypes.items()}
        self.requests.to_csv(path / "requests.csv", index=False)
        (path / "numerics.csv").unlink(missing_ok=True)
        if len(self.numerics):
            meta["dtypes"]["numerics"] = {c: str(t) for c, t in self.numerics.dtypes.items()}
            self.numerics.to_csv(path / "numerics.csv", index=False)
        for stale in ("steps.csv", "steps.csv.gz"):  # re-saving into the same folder: one steps file only
            (path / stale).unlink(missing_ok=True)
        if steps == "csv":
            self.steps.to_csv(path / "steps.csv", index=False)
        elif steps == "gz":
            # times rounded to 0.1 µs (ms columns) / 0.1 ms (t_rel_s): finer digits are noise, and
            # 17-digit floats do not compress; the rest of the table is saved exactly
            st = self.steps.copy()
            for c in st.columns:
                if st[c].dtype.kind == "f":
                    st[c] = st[c].round(4)
            st.to_csv(path / "steps.csv.gz", index=False, compression={"method": "gzip", "mtime": 0})
            meta["steps_rounded"] = 4
        else:
            meta["dtypes"]["steps"] = {}
        with open(path / "meta.json", "w") as f:
            json.dump(meta, f, indent=1, default=_json_default)
            f.write("\n")
        self.path = path
        return path


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (Path,)):
        return str(o)
    if isinstance(o, (set, tuple)):
        return list(o)
    return repr(o)


def _read_frame(p: Path, dtypes: dict[str, str]) -> pd.DataFrame:
    text_cols = [c for c, t in dtypes.items() if t in ("object", "str", "string")]
    na = {c: [""] for c in dtypes if c not in text_cols}
    kw = {} if int(pd.__version__.split(".")[0]) >= 3 else {"float_precision": "round_trip"}  # pandas 3: exact by default
    df = pd.read_csv(p, dtype={c: str for c in text_cols}, keep_default_na=False, na_values=na, **kw)
    for c, t in dtypes.items():
        if c in df.columns and str(df[c].dtype) != t:
            df[c] = df[c].astype(t)
    return df[[c for c in dtypes if c in df.columns]]


def load_results(path: str | os.PathLike) -> Results:
    """Load a run saved by Results.save (the folder holding meta.json)."""
    p = Path(path)
    with open(p / "meta.json") as f:
        meta = json.load(f)
    dtypes = meta.pop("dtypes", {})
    req = _read_frame(p / "requests.csv", dtypes.get("requests", {}))
    sd = dtypes.get("steps", {})
    if (p / "steps.csv").is_file():
        st = _read_frame(p / "steps.csv", sd)
    elif (p / "steps.csv.gz").is_file():
        st = _read_frame(p / "steps.csv.gz", sd)
    else:  # saved with steps="none"
        st = pd.DataFrame(columns=STEP_COLUMNS)
    gp = _read_frame(p / "gaps.csv.gz", dtypes["gaps"]) if (p / "gaps.csv.gz").is_file() else None
    for b in meta.get("blocks") or []:   # serving blocks' /metrics deltas: SUMMARY metrics under their old names
        if isinstance(b.get("metrics_delta"), dict):
            b["metrics_delta"] = {schema.RENAMED.get(k, k): v for k, v in b["metrics_delta"].items()}
    req = req.rename(columns=schema.RENAMED)
    res = Results(req, st, meta, path=p, gaps=gp)
    if (p / "numerics.csv").is_file():
        res.numerics = _read_frame(p / "numerics.csv", dtypes.get("numerics", {}))
    return res


def latest_results(name: str, root: str | os.PathLike = Path("experiments") / "results") -> Results:
    """The most recent saved run of experiment `name` under root."""
    d = Path(root) / name
    runs = sorted(x for x in d.iterdir() if (x / "meta.json").is_file()) if d.is_dir() else []
    if not runs:
        raise FileNotFoundError(f"no saved runs of {name!r} under {d}")
    return load_results(runs[-1])


# ------------------------------------------------------------ metadata
def _git(*args: str) -> str:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() if out.returncode == 0 else ""
    except Exception:
        return ""


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=16)
def _sha256_cached(path: str, size: int, mtime: float) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path) -> str:
    """sha256 of a file (cached per path, size and mtime)."""
    st = os.stat(path)
    return _sha256_cached(os.fspath(path), st.st_size, st.st_mtime)


def engine_metadata(eng) -> dict:
    """What an engine was: its actual params, the model file and its sha256."""
    d: dict[str, Any] = {}
    try:
        d["params"] = dict(eng.params)
    except Exception:
        pass
    path = getattr(eng, "model_path", None)
    if path is not None:
        d["model_path"] = str(path)
        try:
            d["model_sha256"] = file_sha256(path)
        except OSError:
            d["model_sha256"] = ""
    info = getattr(eng, "info", None)
    if isinstance(info, dict):
        d["model_info"] = {k: info[k] for k in ("arch", "n_params", "n_layer", "n_embd", "n_vocab", "file_type")
                           if k in info}
    return d


def load_average() -> dict:
    """The machine's load now: os.getloadavg() and the `uptime` line."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        one = five = fifteen = float("nan")
    try:
        up = subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except Exception:
        up = ""
    return {"loadavg": [one, five, fifteen], "uptime": up,
            "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


# Packages whose versions a result records (those installed; llama-cpp-python for the anchor).
VERSION_PACKAGES = ("numpy", "pandas", "matplotlib", "tokenizers", "jinja2", "ipywidgets", "dask", "distributed",
                    "llama_cpp_python", "Cython")


def package_versions() -> dict:
    from importlib import metadata

    out = {"python": sys.version.split()[0], "colibri_lab": _pkg_version()}
    for name in VERSION_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def git_state() -> dict:
    """The commit of the package's source tree and whether tracked files differ from it."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": _git("rev-parse", "HEAD"), "dirty": bool(status)}


def provenance(meta: dict) -> dict:
    """The few facts that say where a result came from, from its metadata:
    commit (short) and dirty flag, model file(s) and sha256 prefix, CPU,
    SIMD path(s), threads, date."""
    meta = meta or {}
    git = meta.get("git") or {}
    engines = meta.get("engines") or {}
    models = sorted({Path(e["model_path"]).name for e in engines.values() if e.get("model_path")})
    shas = sorted({e["model_sha256"][:12] for e in engines.values() if e.get("model_sha256")})
    simd = sorted({str((e.get("params") or {}).get("simd")) for e in engines.values() if (e.get("params") or {}).get("simd")})
    threads = sorted({int((e.get("params") or {}).get("n_threads")) for e in engines.values()
                      if isinstance((e.get("params") or {}).get("n_threads"), (int, float))})
    return {"commit": (git.get("commit") or "")[:10], "dirty": bool(git.get("dirty")), "models": models,
            "model_sha256": shas, "cpu": (meta.get("machine") or {}).get("cpu", ""), "simd": simd,
            "n_threads": threads, "date": meta.get("date", "")}


def provenance_line(meta: dict) -> str:
    """One line for figure footers and table captions: "commit 1a2b3c4d5e (dirty) | model X.gguf | ..."."""
    if not meta or not (meta.get("git") or meta.get("engines")):
        return ""
    p = provenance(meta)
    parts = [f"commit {p['commit'] or '?'}{' (dirty)' if p['dirty'] else ''}"]
    if p["models"]:
        parts.append("model " + ", ".join(p["models"]))
    if p["simd"] or p["n_threads"]:
        parts.append(" ".join(filter(None, ["/".join(p["simd"]),
                                            "/".join(map(str, p["n_threads"])) + " threads" if p["n_threads"] else ""])))
    if p["cpu"]:
        parts.append(p["cpu"])
    if p["date"]:
        parts.append(p["date"][:10])
    return " | ".join(parts)


def machine_info() -> dict:
    """The machine this process runs on: CPU model, CPU count, platform and the engine's SIMD
    levels (detected, available, AMX tiles on, panel prefetch mode); recorded with every run and every Dask worker."""
    try:
        from colibri_lab import _engine

        simd = {"detected": _engine.simd_detect(), "available": list(_engine.simd_available()),
                "amx": _engine.amx_active(), "prefetch": _engine.prefetch_mode()}
    except Exception as exc:  # the extension may be missing when only analysing
        simd = {"error": str(exc)}
    return {"cpu": cpu_model(), "n_cpus": os.cpu_count(), "platform": platform.platform(), "simd": simd}


def collect_metadata(spec, variants, engines: dict, load_before: dict | None = None) -> dict:
    """Provenance of a run: experiment spec, resolved variants, engines (params,
    model file and sha256), git commit and dirty flag, machine, SIMD path,
    package versions, date and the load average before (`load_before`, taken
    by the caller when the run started) and after (now)."""
    return {
        "experiment": spec.as_dict(),
        "variants": [v.as_dict() for v in variants],
        "engines": engines,
        "git": git_state(),
        "machine": machine_info(),
        "versions": package_versions(),
        "load": {"before": load_before, "after": load_average()},
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _pkg_version() -> str:
    try:
        import colibri_lab

        return colibri_lab.__version__
    except Exception:
        return ""
