"""Variants and experiment specs.

A `Variant` is a named set of settings in three groups:
  engine:  Engine(...) keywords: model, n_threads, n_ctx, n_slots, n_batch,
           n_chunk, simd, prefix_reuse, kv_f16 (one engine per distinct engine group);
  request: Engine.submit keywords: temperature, top_p, top_k, max_tokens,
           grammar (GBNF text), json_schema, speculative = {...}, ... passed
           through as they are (the Engine rejects what it does not know), plus
           one workbench switch:
             use_schema = true   -> pass each item's JSON Schema as json_schema=
  arrival: closed loop concurrency or Poisson rate (see workloads.Arrival).

An `ExperimentSpec` is a workload, variants, repeats and seeds.  Specs are
TOML files (experiments/*.toml):

    name = "tour"
    description = "prefix reuse on vs off"
    workload = { name = "shared_prefix", n = 6 }
    repeats = 2
    warmup = 1
    seed = 0
    baseline = "reuse-off"
    lossless = true                      # outputs must be identical across variants
    numerics = false                     # true: also compare distributions (KL, top-1) with the baseline
    [engine]                              # shared by every variant
    model = "smollm2"
    n_threads = 2
    [request]
    max_tokens = 16
    [arrival]
    concurrency = 1
    [[variants]]
    name = "reuse-off"
    engine = { prefix_reuse = false }
    [[variants]]
    name = "reuse-on"
    engine = { prefix_reuse = true }
    [small]                               # overrides when COLIBRI_LAB_SMALL=1 (CI)
    workload = { n = 3 }
    repeats = 1

A `[sweep]` table builds one variant per value instead of (or on top of) the
list:  [sweep] key = "arrival.concurrency", values = [1, 2, 4, 8].  On top of
a list, every listed variant gets every value ("<name> <key>=<value>"),
ordered value by value so that the listed variants interleave at each value.

Serving experiments (colibri_lab.experiments.serve_bench) send the workload
over HTTP to OpenAI-compatible servers instead of driving an engine in this
process.  A `[serve]` table makes a spec one; its keys (and a variant's
`serve = {...}`, which overrides them) say which server each variant talks to:

    [serve]
    kind = "colibri"        # "colibri": start our server (python -m colibri_lab.serve) on loopback
                            # "llama.cpp": start llama-cpp-python's server (the anchor) on loopback
                            # "url": an already running server at base_url
    label = "colibri"       # the `server` column of the rows (default: kind); tells apart two
                            # variants of one kind, e.g. llama.cpp at 2 threads and at 1
    base_url = "http://127.0.0.1:8080"     # kind = "url" only
    model_id = "smollm2"    # the model name sent in requests (default: the engine model's alias / file stem)
    slo = "ttft:2000 tpot:200"             # goodput SLO (ms; vLLM's --goodput syntax)
    args = []               # extra command-line flags for the started server
    python = ""             # interpreter for llama.cpp (default: env COLIBRI_LAB_LLAMA_PYTHON, else this one)
    metrics = true          # scrape /metrics before and after every block
    timeout_s = 600         # per request, sending to the end of its stream
    block_timeout_s = 0     # > 0: send nothing later than this into a block (the rest: "not sent" rows)
    startup_timeout_s = 300

The `[engine]` settings (model, n_threads, n_ctx, n_slots) are the started
server's: both kinds get the same GGUF file, threads and context.  Arrivals:
`arrival = { rate = 2.0, burstiness = 1.0, concurrency = 0 }` (open loop,
concurrency = cap) or `{ concurrency = 4 }` (closed loop); a sweep over
"arrival.rate", "serve.kind" or "engine.model" is one more [sweep] key.
"""
from __future__ import annotations

import copy
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from colibri_lab.experiments.workloads import Arrival

# Engine settings known today; others are passed to Engine(...) as they are, so
# that future engine features work (or are rejected by the Engine) without changes here.
ENGINE_KEYS = ("model", "n_threads", "n_ctx", "n_slots", "n_batch", "n_chunk", "simd", "prefix_reuse", "kv_f16",
               "max_queue")
DEFAULT_ENGINE = {"model": "smollm2", "n_threads": 0, "n_ctx": 2048, "n_slots": 1, "simd": "auto",
                  "prefix_reuse": True}
DEFAULT_REQUEST = {"max_tokens": 32, "temperature": 0.0}


def _merge(base: dict, over: dict | None) -> dict:
    """Recursive dict merge: tables merge, anything else replaces."""
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


@dataclass
class Variant:
    """A named set of engine, request and arrival settings."""

    name: str
    engine: dict = field(default_factory=dict)
    request: dict = field(default_factory=dict)
    arrival: dict = field(default_factory=dict)
    serve: dict = field(default_factory=dict)     # serving experiments: the server (see [serve] above)

    def resolved(self, engine: dict | None = None, request: dict | None = None,
                 arrival: dict | None = None, serve: dict | None = None) -> "Variant":
        """This variant on top of experiment-wide defaults."""
        return Variant(self.name,
                       _merge(_merge(DEFAULT_ENGINE, engine), self.engine),
                       _merge(_merge(DEFAULT_REQUEST, request), self.request),
                       _merge(arrival or {}, self.arrival),
                       _merge(serve or {}, self.serve))

    def engine_key(self) -> tuple:
        """Hashable key of the engine settings: variants with equal keys share an engine."""
        return tuple(sorted((k, repr(v)) for k, v in self.engine.items()))

    def arrival_obj(self) -> Arrival:
        return Arrival.from_dict(self.arrival)

    def as_dict(self) -> dict:
        d = {"name": self.name, "engine": dict(self.engine), "request": dict(self.request),
             "arrival": dict(self.arrival)}
        if self.serve:
            d["serve"] = dict(self.serve)
        return d


GROUPS = ("engine", "request", "arrival", "serve")


def _set_dotted(d: dict, dotted: str, value) -> None:
    parts = dotted.split(".")
    if parts[0] not in GROUPS or len(parts) != 2:
        raise ValueError(f"sweep key must be engine.X, request.X, arrival.X or serve.X, got {dotted!r}")
    d.setdefault(parts[0], {})[parts[1]] = value


def sweep(key: str, values, base: Variant | None = None, name: str | None = None) -> list[Variant]:
    """One variant per value of a dotted setting ("arrival.concurrency"), named
    "<short key>=<value>" unless `name` is a format string with {value}."""
    base = base or Variant("base")
    out = []
    short = key.split(".")[-1]
    for v in values:
        d = base.as_dict()
        _set_dotted(d, key, v)
        vname = name.format(value=v) if name else f"{short}={v}"
        out.append(Variant(vname, d["engine"], d["request"], d["arrival"], d.get("serve", {})))
    return out


@dataclass
class ExperimentSpec:
    """Everything a run needs except the engines."""

    name: str
    variants: list[Variant]
    workload: Any = "shared_prefix"        # name, path, dict or Workload (see load_workload)
    workload_n: int | None = None          # first n items (None: all)
    workload_turns: int | None = None      # at most this many turns per item
    workload_order: str | None = None      # None / "as_is": file order; "grouped": a group's items back to back
    repeats: int = 2                       # measured passes over the workload per variant
    warmup: int = 1                        # unrecorded warm-up requests per engine before measuring
    seed: int = 0                          # request seed of item i is seed + i (same in every variant)
    engine: dict = field(default_factory=dict)    # engine settings shared by all variants
    request: dict = field(default_factory=dict)   # request settings shared by all variants
    arrival: dict = field(default_factory=dict)   # arrival shared by all variants
    baseline: str | None = None            # variant the others are compared with (default: the first)
    lossless: bool = False                 # variants must produce identical outputs (A/B changes speed only)
    fresh_cache: bool = True               # clear every KV slot before each block, so blocks start alike
                                           # (serving: tag each block's prompts so no block hits another's cache)
    serve: dict | None = None              # [serve]: a serving experiment (HTTP), settings shared by variants
    numerics: bool = False                 # after the blocks, a numerics pass: KL / top-1 agreement / perplexity
                                           # of every variant against the baseline (experiments.numerics)
    description: str = ""
    source: str | None = None              # path of the TOML file, if any

    def __post_init__(self):
        if not self.variants:
            raise ValueError("an experiment needs at least one variant")
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError(f"variant names must be unique: {names}")
        if self.repeats < 1:
            raise ValueError("repeats must be >= 1")
        if self.baseline is not None and self.baseline not in names:
            raise ValueError(f"baseline {self.baseline!r} is not a variant ({names})")
        if self.numerics and self.serve is not None:
            raise ValueError("numerics compares in-process engines; a [serve] experiment cannot run it")

    @property
    def baseline_name(self) -> str:
        return self.baseline or self.variants[0].name

    @property
    def is_serving(self) -> bool:
        """A serving experiment: sent over HTTP (serve_bench), not to an engine in this process."""
        return self.serve is not None or any(v.serve for v in self.variants)

    def resolved_variants(self) -> list[Variant]:
        return [v.resolved(self.engine, self.request, self.arrival, self.serve) for v in self.variants]

    def as_dict(self) -> dict:
        wl = self.workload if isinstance(self.workload, (str, dict)) else getattr(self.workload, "name", str(self.workload))
        return {"name": self.name, "description": self.description, "workload": wl, "workload_n": self.workload_n,
                "workload_turns": self.workload_turns, "workload_order": self.workload_order, "repeats": self.repeats, "warmup": self.warmup,
                "seed": self.seed, "engine": self.engine, "request": self.request, "arrival": self.arrival,
                "baseline": self.baseline_name, "lossless": self.lossless, "fresh_cache": self.fresh_cache,
                "numerics": self.numerics,
                "variants": [v.as_dict() for v in self.variants], "source": self.source,
                **({"serve": self.serve} if self.serve is not None else {})}


_TOP_KEYS = {"name", "description", "workload", "repeats", "warmup", "seed", "engine", "request", "arrival",
             "baseline", "lossless", "fresh_cache", "numerics", "variants", "sweep", "small", "serve"}


def small_mode() -> bool:
    """True when COLIBRI_LAB_SMALL=1: specs apply their [small] overrides (CI sizes)."""
    return os.environ.get("COLIBRI_LAB_SMALL", "0") == "1"


def spec_from_dict(d: dict, small: bool | None = None, source: str | None = None,
                   overrides: dict | None = None) -> ExperimentSpec:
    """Build a spec from its TOML/dict form; `small` (default: COLIBRI_LAB_SMALL)
    applies the [small] table; `overrides` is merged last (same shape)."""
    unknown = set(d) - _TOP_KEYS
    if unknown:
        raise ValueError(f"unknown experiment key(s): {', '.join(sorted(unknown))}")
    if small is None:
        small = small_mode()
    if small and d.get("small"):
        d = _merge(d, d["small"])
    if overrides:
        d = _merge(d, overrides)
    wl = d.get("workload", "shared_prefix")
    n = turns = order = None
    if isinstance(wl, dict) and "items" not in wl:
        wl = dict(wl)
        n, turns, order = wl.pop("n", None), wl.pop("turns", None), wl.pop("order", None)
        if set(wl) - {"name"}:
            raise ValueError(f"unknown workload key(s): {', '.join(sorted(set(wl) - {'name'}))}")
        wl = wl.get("name", "shared_prefix")
    variants = []
    for raw in d.get("variants", []):
        raw = dict(raw)
        vname = raw.pop("name", None)
        if not vname:
            raise ValueError("every variant needs a name")
        bad = set(raw) - set(GROUPS)
        if bad:
            raise ValueError(f"variant {vname!r}: unknown key(s) {', '.join(sorted(bad))} "
                             "(settings go in engine / request / arrival / serve tables)")
        variants.append(Variant(vname, raw.get("engine", {}), raw.get("request", {}), raw.get("arrival", {}),
                                raw.get("serve", {})))
    if d.get("sweep"):
        sw = d["sweep"]
        bases = variants or [Variant("base")]
        per_base = []
        for b in bases:
            prefix = f"{b.name} " if variants else ""
            per_base.append(sweep(sw["key"], sw["values"], base=b,
                                  name=prefix + sw.get("name", sw["key"].split(".")[-1] + "={value}")))
        # value-major: at each value the base variants are adjacent, so their blocks interleave (A B at
        # value 1, A B at value 2, ...; reversed on odd repeats) and drift hits an A/B pair alike
        variants = [vs[i] for i in range(len(sw["values"])) for vs in per_base]
    return ExperimentSpec(
        name=d.get("name") or (Path(source).stem if source else "experiment"),
        variants=variants, workload=wl, workload_n=n, workload_turns=turns, workload_order=order,
        repeats=int(d.get("repeats", 2)), warmup=int(d.get("warmup", 1)), seed=int(d.get("seed", 0)),
        engine=d.get("engine", {}), request=d.get("request", {}), arrival=d.get("arrival", {}),
        baseline=d.get("baseline"), lossless=bool(d.get("lossless", False)),
        fresh_cache=bool(d.get("fresh_cache", True)), serve=_serve_table(d.get("serve")),
        numerics=bool(d.get("numerics", False)),
        description=d.get("description", ""), source=source)


SERVE_KEYS = ("kind", "label", "base_url", "model_id", "slo", "args", "python", "metrics", "timeout_s",
              "startup_timeout_s", "api_key", "block_timeout_s")


def _serve_table(t) -> dict | None:
    if t is None:
        return None
    if not isinstance(t, dict):
        raise ValueError("[serve] must be a table")
    bad = set(t) - set(SERVE_KEYS)
    if bad:
        raise ValueError(f"unknown [serve] key(s): {', '.join(sorted(bad))} (known: {', '.join(SERVE_KEYS)})")
    return dict(t)


def load_spec(path: str | Path, small: bool | None = None, overrides: dict | None = None) -> ExperimentSpec:
    """Read an experiment spec from a TOML file."""
    p = Path(path)
    with open(p, "rb") as f:
        d = tomllib.load(f)
    return spec_from_dict(d, small=small, source=str(p), overrides=overrides)
