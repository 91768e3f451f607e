"""Workloads: the prompts an experiment sends, shipped as small JSON files we
wrote ourselves (colibri_lab/workloads/*.json), plus arrival patterns.

A workload is a list of `Item`s.  Every item is a chat conversation: an
optional system prompt and one or more user turns.  Turn t's prompt is the
whole history (system, user turns 0..t, the model's own replies to turns
0..t-1) rendered with the model's chat template, so multi-turn items exercise
prefix reuse across turns exactly like a chat client does.

    wl = load_workload("shared_prefix", n=6)
    wl.items[0].system, wl.items[0].turns

Arrivals decide when each item starts:
  - closed loop: `concurrency` client threads, each starts its next item as
    soon as its previous one finished (vLLM's --max-concurrency);
  - Poisson: items start at exponential inter-arrival times of mean 1/rate
    seconds, drawn from a seeded generator, whatever is still running;
    with a burstiness factor b != 1 the gaps are gamma(shape b, scale
    1/(rate b)) - same mean, coefficient of variation 1/sqrt(b) - as vLLM's
    `bench serve --burstiness` draws them (b < 1 burstier, b > 1 more regular).
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import numpy as np

# Names of the workloads shipped in colibri_lab/workloads/.
BUILTIN = ("shared_prefix", "shared_prefix_short", "multi_turn", "copy_edit", "json_extract", "open_chat",
           "conversation", "translation", "summarization", "qa", "math_reasoning", "rag", "code_editing",
           "code_generation")

# Speculative decoding's task categories (Spec-Bench's six plus two of code), each a workload above.
SPEC_CATEGORIES = ("conversation", "translation", "summarization", "qa", "math_reasoning", "rag",
                   "code_editing", "code_generation")


@dataclass(frozen=True)
class Item:
    """One conversation of a workload."""

    id: str                          # unique within the workload; the pairing key with the turn index
    turns: tuple[str, ...]           # user messages, one per turn (a single-turn item has one)
    system: str | None = None        # system prompt (None: the template's default)
    group: str = ""                  # items sharing a prefix (e.g. the same system prompt) share a group
    schema: dict | None = None       # JSON Schema of the expected answer (json_extract), for grammar variants
    max_tokens: int | None = None    # per-item cap on output tokens (None: the variant's max_tokens)

    def messages(self, turn: int, replies: Sequence[str]) -> list[dict]:
        """Chat messages for `turn`, given the assistant's replies to the earlier turns."""
        if not 0 <= turn < len(self.turns):
            raise IndexError(f"item {self.id!r} has {len(self.turns)} turn(s), asked for turn {turn}")
        if len(replies) < turn:
            raise ValueError(f"turn {turn} needs {turn} earlier replies, got {len(replies)}")
        msgs: list[dict] = []
        if self.system:
            msgs.append({"role": "system", "content": self.system})
        for t in range(turn):
            msgs.append({"role": "user", "content": self.turns[t]})
            msgs.append({"role": "assistant", "content": replies[t]})
        msgs.append({"role": "user", "content": self.turns[turn]})
        return msgs


@dataclass
class Workload:
    """A named list of items."""

    name: str
    items: list[Item]
    description: str = ""

    def __len__(self) -> int:
        return len(self.items)

    @property
    def n_requests(self) -> int:
        """Requests one pass over the workload sends (one per turn)."""
        return sum(len(it.turns) for it in self.items)

    def take(self, n: int | None = None, turns: int | None = None, order: str | None = None) -> "Workload":
        """The first n items, each cut to at most `turns` turns (None: all).
        order="grouped" then sorts them by group (stable; groups in order of
        first appearance), so that a group's requests arrive back to back."""
        items = self.items if n is None else self.items[:n]
        if order not in (None, "as_is", "grouped"):
            raise ValueError(f"order must be 'as_is' or 'grouped', got {order!r}")
        if order == "grouped":
            first = {g: i for i, g in reversed(list(enumerate(it.group for it in items)))}
            items = sorted(items, key=lambda it: first[it.group])
        if turns is not None:
            if turns < 1:
                raise ValueError("turns must be >= 1")
            items = [_replace_turns(it, it.turns[:turns]) for it in items]
        return Workload(self.name, list(items), self.description)


def _replace_turns(it: Item, turns) -> Item:
    return Item(id=it.id, turns=tuple(turns), system=it.system, group=it.group, schema=it.schema,
                max_tokens=it.max_tokens)


def workload_from_dict(d: dict) -> Workload:
    """Build a Workload from its JSON form:
    {"name", "description", "systems": {ref: text}, "items": [{"id", "turns", "system" | "system_ref",
     "group", "schema", "max_tokens"}]}."""
    if not isinstance(d, dict) or "items" not in d:
        raise ValueError("a workload is an object with an 'items' list")
    systems = d.get("systems") or {}
    items, seen = [], set()
    for i, raw in enumerate(d["items"]):
        if not isinstance(raw, dict):
            raise ValueError(f"item {i} is not an object")
        iid = str(raw.get("id", i))
        if iid in seen:
            raise ValueError(f"duplicate item id {iid!r}")
        seen.add(iid)
        turns = raw.get("turns")
        if isinstance(turns, str):
            turns = [turns]
        if not turns or not all(isinstance(t, str) and t for t in turns):
            raise ValueError(f"item {iid!r} needs a non-empty list of non-empty 'turns'")
        system = raw.get("system")
        if raw.get("system_ref") is not None:
            ref = raw["system_ref"]
            if ref not in systems:
                raise ValueError(f"item {iid!r}: unknown system_ref {ref!r}")
            system = systems[ref]
        items.append(Item(id=iid, turns=tuple(turns), system=system, group=str(raw.get("group", "")),
                          schema=raw.get("schema"), max_tokens=raw.get("max_tokens")))
    return Workload(str(d.get("name", "workload")), items, str(d.get("description", "")))


def load_workload(name_or_path: str | Path | dict | Workload, n: int | None = None,
                  turns: int | None = None, order: str | None = None) -> Workload:
    """A built-in workload by name (see BUILTIN), a JSON / JSONL file, a dict,
    or a Workload; optionally cut to n items and `turns` turns per item.

    A JSONL file holds one item per line (name = file stem)."""
    if isinstance(name_or_path, Workload):
        wl = name_or_path
    elif isinstance(name_or_path, dict):
        wl = workload_from_dict(name_or_path)
    else:
        s = str(name_or_path)
        if s in BUILTIN:
            text = resources.files("colibri_lab").joinpath("workloads", s + ".json").read_text("utf-8")
            wl = workload_from_dict(json.loads(text))
        else:
            p = Path(s)
            if not p.is_file():
                raise FileNotFoundError(f"no workload {s!r}: not one of {', '.join(BUILTIN)} and not a file")
            text = p.read_text("utf-8")
            if p.suffix == ".jsonl":
                items = [json.loads(line) for line in text.splitlines() if line.strip()]
                wl = workload_from_dict({"name": p.stem, "items": items})
            else:
                wl = workload_from_dict(json.loads(text))
    return wl.take(n, turns, order)


# ------------------------------------------------------------------ arrivals
@dataclass(frozen=True)
class Arrival:
    """When items start.  kind "closed": `concurrency` clients back to back;
    kind "poisson": start times with gaps of mean 1/rate seconds drawn from
    numpy's default_rng(seed) - exponential (a Poisson process) when
    burstiness is 1, gamma(burstiness, 1/(rate*burstiness)) otherwise; rate
    inf releases every item at once; concurrency still caps how many items
    run at once (0 = no cap)."""

    kind: str = "closed"          # "closed" | "poisson"
    concurrency: int = 1          # client threads (closed) or cap on items in flight (poisson; 0 = none)
    rate: float = 0.0             # items per second (poisson); inf = all at once
    seed: int = 0                 # seed of the arrival times
    burstiness: float = 1.0       # gamma shape of the gaps (1 = Poisson)

    def __post_init__(self):
        if self.kind not in ("closed", "poisson"):
            raise ValueError(f"arrival kind must be 'closed' or 'poisson', got {self.kind!r}")
        if self.kind == "closed" and self.concurrency < 1:
            raise ValueError("a closed loop needs concurrency >= 1")
        if self.kind == "poisson" and not self.rate > 0:
            raise ValueError("Poisson arrivals need rate > 0")
        if self.concurrency < 0:
            raise ValueError("concurrency must be >= 0")
        if not (self.burstiness > 0 and np.isfinite(self.burstiness)):
            raise ValueError(f"burstiness must be a positive number, got {self.burstiness!r}")

    @classmethod
    def from_dict(cls, d: dict | None) -> "Arrival":
        d = dict(d or {})
        unknown = set(d) - {"kind", "concurrency", "rate", "seed", "burstiness"}
        if unknown:
            raise ValueError(f"unknown arrival setting(s): {', '.join(sorted(unknown))}")
        if "kind" not in d:
            d["kind"] = "poisson" if d.get("rate") else "closed"
        if d["kind"] == "poisson":
            d.setdefault("concurrency", 0)
        return cls(**d)

    def start_times(self, n: int) -> np.ndarray:
        """Offsets in seconds from the start of a block at which each of n items
        is released (all zeros for a closed loop: clients pace themselves)."""
        if self.kind == "closed" or np.isinf(self.rate):
            return np.zeros(n)
        rng = np.random.default_rng(self.seed)
        if self.burstiness == 1.0:
            gaps = rng.exponential(1.0 / self.rate, size=n)
        else:
            gaps = rng.gamma(self.burstiness, 1.0 / (self.rate * self.burstiness), size=n)
        return np.cumsum(gaps)

    def workers(self, n_items: int) -> int:
        """Client threads to run n_items."""
        if self.kind == "closed":
            return max(1, min(self.concurrency, n_items))
        return max(1, n_items if self.concurrency == 0 else min(self.concurrency, n_items))

    def label(self) -> str:
        if self.kind == "closed":
            return f"closed c={self.concurrency}"
        cap = f", cap {self.concurrency}" if self.concurrency else ""
        burst = f", burstiness {self.burstiness:g}" if self.burstiness != 1.0 else ""
        return f"poisson {self.rate:g}/s{burst}{cap}"

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "concurrency": self.concurrency, "rate": self.rate, "seed": self.seed,
                "burstiness": self.burstiness}


class ReleaseQueue:
    """The jobs of one block handed to its client threads in order, each when
    its release time on `arrival`'s schedule comes (offsets from `t0`, a
    time.perf_counter() reading).  take(stop) returns (item index, item,
    release time) or None when the jobs are gone or `stop` was set while
    waiting; open-loop (poisson) jobs are timed from their scheduled release,
    closed-loop ones from when a client took them."""

    def __init__(self, jobs: Sequence[tuple[int, Any]], arrival: Arrival, t0: float):
        self._jobs = list(jobs)
        self._release = arrival.start_times(len(self._jobs))
        self._open_loop = arrival.kind == "poisson"
        self._t0 = t0
        self._next = 0
        self._lock = threading.Lock()

    def take(self, stop: threading.Event) -> tuple[int, Any, float] | None:
        with self._lock:
            j = self._next
            self._next += 1
        if j >= len(self._jobs):
            return None
        idx, item = self._jobs[j]
        wait = self._t0 + self._release[j] - time.perf_counter()
        if wait > 0 and stop.wait(wait):
            return None
        t_release = self._t0 + self._release[j] if self._open_loop else time.perf_counter()
        return idx, item, t_release


