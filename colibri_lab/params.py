"""`RequestParams`: everything a request asks of the engine, with its one set
of defaults and bounds and its one validation.

Built by `Engine.submit` from keywords, or by the server from a request body
(the server maps API field names onto these), and handed unchanged to the
binding, which copies it into cb_request_params.  The defaults are the C
engine's (cb_request_default_params); the bounds are the ones
cb_engine_submit enforces, so a value refused here would be refused there,
with the same words.  What only the engine can know (a slot beyond n_slots, a
token id beyond the vocabulary, a draft source the engine was not built
with) is checked by C and raised by the binding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from colibri_lab.errors import InvalidRequestError

MAX_STOP = 8            # CB_MAX_STOP
MAX_LOGPROBS = 20       # CB_MAX_LOGPROBS
SPEC_MAX_K = 16         # CB_SPEC_MAX_K
SPEC_SOURCES = ("grammar", "prompt_lookup", "draft", "layer_skip", "cross_vocab")   # cb_spec_source bit order


def _bad(name: str, message: str) -> InvalidRequestError:
    e = InvalidRequestError(f"{name} {message}")
    e.param = name
    return e


def _int(name, v, lo=None, hi=None):
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(name, f"must be an integer, got {v!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise _bad(name, f"must be in [{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}], got {v}")
    return v


def _num(name, v, lo, hi, lo_open=False):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        raise _bad(name, f"must be a number, got {v!r}")
    if v < lo or v > hi or (lo_open and v == lo):
        raise _bad(name, f"must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v:g}")
    return float(v)


def _bool(name, v):
    if not isinstance(v, bool):
        raise _bad(name, f"must be a boolean, got {v!r}")
    return v


@dataclass(frozen=True)
class Speculative:
    """cb_spec_params: draft sources (priority order as SPEC_SOURCES) and depth."""

    sources: tuple = ()
    k_max: int = 8          # most draft tokens per step
    adaptive: bool = True   # choose k from measured acceptance and cost; pause a source that does not pay
    ngram_max: int = 16     # prompt lookup: longest suffix compared
    ngram_min: int = 2      # prompt lookup: shortest

    def __post_init__(self):
        src = self.sources
        if isinstance(src, str):
            src = (src,)
        if not isinstance(src, (list, tuple)):
            raise _bad("speculative.sources", f"must be a list drawn from {list(SPEC_SOURCES)}, got {src!r}")
        for x in src:
            if x not in SPEC_SOURCES:
                raise _bad("speculative.sources", f"names an unknown speculative source {x!r}; expected one of "
                                                  f"{list(SPEC_SOURCES)}")
        object.__setattr__(self, "sources", tuple(dict.fromkeys(src)))
        _int("speculative.k_max", self.k_max, 1, SPEC_MAX_K)
        _bool("speculative.adaptive", self.adaptive)
        _int("speculative.ngram_min", self.ngram_min, 1, 64)
        _int("speculative.ngram_max", self.ngram_max, self.ngram_min, 64)

    @classmethod
    def of(cls, v) -> "Speculative | None":
        """From None, a Speculative, or a dict {"sources", "k_max", "adaptive", "ngram_max", "ngram_min"}."""
        if v is None or isinstance(v, cls):
            return v
        if not isinstance(v, dict):
            raise _bad("speculative", f"must be an object, got {v!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(v) - known)
        if unknown:
            raise _bad("speculative", f"has unknown speculative setting(s) {', '.join(unknown)} "
                                      f"(known: {', '.join(sorted(known))})")
        return cls(**v)


@dataclass(frozen=True)
class RequestParams:
    """One request's settings (cb_request_params without the prompt).  Frozen:
    validated once, at construction; use dataclasses.replace for a variant."""

    max_tokens: int = 16                 # completion tokens; 0 = prefill only
    slot: int = -1                       # KV slot, -1 = any (the free one with the longest common prefix)
    temperature: float = 0.0             # 0 = greedy
    top_k: int = 0                       # 0 = off
    top_p: float = 1.0                   # 1 = off
    min_p: float = 0.0                   # 0 = off
    repeat_penalty: float = 1.0          # 1 = off
    repeat_last_n: int = 64              # penalty window; -1 = whole context
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = 0                        # same seed + same inputs = same output
    n_logprobs: int = 0                  # top alternatives reported per token
    logit_bias: dict = field(default_factory=dict)   # {token id: bias}; -inf bans a token
    stop: tuple = ()                     # stop strings (bytes), matched on the output bytes
    ignore_eos: bool = False
    return_logits: bool = False          # token events carry the logits row
    copy_prefix: bool = False            # may copy a longer matching prefix from another slot
    score: bool = False                  # teacher-forced scoring of the prompt ("score" events)
    grammar: object = None               # a compiled _engine.Grammar
    speculative: Speculative | None = None

    def __post_init__(self):
        s = object.__setattr__
        _int("max_tokens", self.max_tokens, 0)
        _int("slot", self.slot, -1)
        s(self, "temperature", _num("temperature", self.temperature, 0.0, 1e4))
        _int("top_k", self.top_k, 0)
        s(self, "top_p", _num("top_p", self.top_p, 0.0, 1.0, lo_open=True))
        s(self, "min_p", _num("min_p", self.min_p, 0.0, 1.0))
        s(self, "repeat_penalty", _num("repeat_penalty", self.repeat_penalty, 0.0, 100.0, lo_open=True))
        _int("repeat_last_n", self.repeat_last_n, -1)
        s(self, "presence_penalty", _num("presence_penalty", self.presence_penalty, -100.0, 100.0))
        s(self, "frequency_penalty", _num("frequency_penalty", self.frequency_penalty, -100.0, 100.0))
        _int("seed", self.seed, 0, (1 << 64) - 1)
        _int("n_logprobs", self.n_logprobs, 0, MAX_LOGPROBS)
        bias = self.logit_bias or {}
        if not isinstance(bias, dict):
            raise _bad("logit_bias", f"must be a mapping of token ids to biases, got {bias!r}")
        clean = {}
        for k, v in bias.items():
            tok = _int("logit_bias", k, 0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v == math.inf:
                raise _bad("logit_bias", f"value for token {tok} must be finite or -inf, got {v!r}")
            clean[tok] = float(v)
        s(self, "logit_bias", clean)
        stop = self.stop
        if isinstance(stop, (str, bytes)):
            stop = (stop,)
        stop = tuple(x.encode() if isinstance(x, str) else x for x in (stop or ()))
        if any(not isinstance(x, bytes) for x in stop):
            raise _bad("stop", "must be strings")
        if len(stop) > MAX_STOP:
            raise _bad("stop", f"accepts at most {MAX_STOP} strings, got {len(stop)}")
        if any(not x for x in stop):
            raise _bad("stop", "must not contain empty strings")
        s(self, "stop", stop)
        for name in ("ignore_eos", "return_logits", "copy_prefix", "score"):
            _bool(name, getattr(self, name))
        s(self, "speculative", Speculative.of(self.speculative))

    NAMES = ()  # filled below: the keyword names Engine.submit passes through

    @classmethod
    def from_kwargs(cls, **kw) -> "RequestParams":
        unknown = sorted(set(kw) - set(cls.NAMES))
        if unknown:
            raise InvalidRequestError(f"unknown parameter(s): {', '.join(unknown)}")
        return cls(**kw)


RequestParams.NAMES = tuple(f.name for f in fields(RequestParams))
