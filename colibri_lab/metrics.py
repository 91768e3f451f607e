"""The metric schema: every per-request, per-step and per-event field, once.

Each field has a name, a unit, a meaning and an origin:

    c        measured in C (cb_request_metrics, cb_step_stats, cb_event in
             native/include/colibri.h); the binding copies it unchanged
    python   measured by the scheduler (the Python submit time, token times)
    derived  computed from other fields, here and only here (`derive_request`)

Times of a request all start at the same instant: when the caller handed it
to the scheduler (`Scheduler.submit`).  C measures from its own submit; the
scheduler adds the wait before it (`py_queue_ms`) to every time that starts at
submit (queue, ttft, prefill, e2e), so queue_ms + (ttft_ms - queue_ms) is one
timeline, not two.

A step's phases are a partition of its wall time: every millisecond of
step_ms is in exactly one of PHASES (matmul, attention, LM head, drafting,
sampling, grammar masks, and "other": admission, norms, RoPE, batch building,
KV bookkeeping).  Finer details (norm_ms, rope_ms are parts of other_ms;
sync_ms is spread over the phases) are listed apart, so nothing stacks them.

Group summaries (SUMMARY: the prefix-cache hit rate and the speculation
metrics of a variant, a category or a server run) are ratios of sums, under
vLLM's names.

External names (OpenAI chat / completions and Responses usage, Anthropic
usage, llama.cpp `timings`, the
Prometheus families of /metrics, DataFrame columns) are one table each below,
every entry naming the schema fields it is computed from.  The server, the
experiment results, the plots and the CLI read these tables; a test walks
every name they emit back to this module.

Standard library only (the server imports it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping


@dataclass(frozen=True)
class Field:
    name: str
    unit: str        # "tokens", "ms", "us", "tok/s", "ratio", "id", "count", "" (labels)
    origin: str      # "c" | "python" | "derived"
    meaning: str


def _fields(*rows) -> dict[str, Field]:
    return {r[0]: Field(*r) for r in rows}


# ------------------------------------------------------------------ request
REQUEST: dict[str, Field] = _fields(
    ("prompt_tokens", "tokens", "c", "prompt length"),
    ("cached_tokens", "tokens", "c", "prompt tokens served from KV prefix reuse (not recomputed)"),
    ("completion_tokens", "tokens", "c", "tokens generated (an end-of-generation token is not counted)"),
    ("queue_ms", "ms", "c", "submit -> admitted to a KV slot (Python wait included)"),
    ("ttft_ms", "ms", "c", "submit -> first token event"),
    ("prefill_ms", "ms", "c", "submit -> end of the prompt's prefill (0 if it never ended)"),
    ("decode_ms", "ms", "c", "first token -> done"),
    ("e2e_ms", "ms", "c", "submit -> done"),
    ("tpot_ms", "ms", "c", "decode_ms / (completion_tokens - 1): mean time per output token after the first"),
    ("decode_tok_s", "tok/s", "c", "(completion_tokens - 1) / decode_ms"),
    ("draft_n", "tokens", "c", "draft tokens proposed and verified"),
    ("draft_accepted", "tokens", "c", "of those, accepted"),
    ("draft_steps", "count", "c", "steps that verified at least one draft (vLLM: drafts)"),
    ("draft_n_by_pos", "tokens", "c", "list: drafts verification reached at position i (0-based; all earlier "
                                      "ones accepted, so rates are conditional)"),
    ("draft_accepted_by_pos", "tokens", "c", "list: of those, accepted"),
    ("draft_n_by_source", "tokens", "c", "dict: draft tokens by source (grammar, prompt_lookup, draft, layer_skip, "
                                         "cross_vocab)"),
    ("draft_accepted_by_source", "tokens", "c", "dict: of those, accepted"),
    ("draft_ms", "ms", "c", "time spent producing this request's drafts"),
    ("grammar_mask_us", "us", "c", "mean time per grammar mask (0 without a grammar)"),
    ("experts_routed", "count", "c", "MoE: (token, layer, expert) routings of this request's rows"),
    ("experts_unique", "count", "c", "MoE: distinct (layer, expert) pairs this request touched"),
    ("slot", "id", "c", "KV slot it ran on (-1: never admitted)"),
    ("finish_reason", "", "c", "stop | length | cancelled | context | error"),
    ("stop_offset", "bytes", "c", "byte offset in the output where a matched stop string starts, else -1"),
    ("py_queue_ms", "ms", "python", "Scheduler.submit -> handed to the C engine (part of queue_ms)"),
    ("itl_ms", "ms", "python", "list: gaps between consecutive token events (one per token after the first)"),
    ("accept_rate", "ratio", "derived", "draft_accepted / draft_n (NaN when nothing was drafted)"),
    ("accept_len_mean", "tokens", "derived", "1 + draft_accepted / draft_steps: tokens per verify step "
                                             "(NaN when nothing was drafted)"),
    ("draft_time_share", "ratio", "derived", "draft_ms / decode_ms (0 without decoding)"),
)
# Fields that are lists / dicts: flattened for DataFrames (see flat_columns), never one cell.
REQUEST_LISTS = ("draft_n_by_pos", "draft_accepted_by_pos", "draft_n_by_source", "draft_accepted_by_source",
                 "itl_ms")
REQUEST_SCALARS = tuple(k for k in REQUEST if k not in REQUEST_LISTS)

# ------------------------------------------------------------------ step
STEP: dict[str, Field] = _fields(
    ("step", "id", "c", "step number of the engine"),
    ("rows_decode", "count", "c", "decode rows (one per running request, plus its drafts)"),
    ("rows_prefill", "count", "c", "prompt rows computed"),
    ("n_running", "count", "c", "requests holding a slot"),
    ("step_ms", "ms", "c", "wall time of the step; the sum of PHASES"),
    ("matmul_ms", "ms", "c", "phase: weight matmuls except the LM head"),
    ("attention_ms", "ms", "c", "phase: attention (with RoPE and KV stores when they ride in it)"),
    ("lm_head_ms", "ms", "c", "phase: the LM head (with its greedy argmax)"),
    ("draft_ms", "ms", "c", "phase: producing drafts (lookup, grammar-forced, drafter forwards)"),
    ("sampling_ms", "ms", "c", "phase: sampling, verification and events, grammar masks excluded"),
    ("grammar_ms", "ms", "c", "phase: grammar token masks"),
    ("other_ms", "ms", "c", "phase: the rest (admission, batch building, norms, RoPE, residuals, bookkeeping)"),
    ("norm_ms", "ms", "c", "detail: RMSNorms (part of other_ms)"),
    ("rope_ms", "ms", "c", "detail: RoPE and KV stores run on their own (part of other_ms)"),
    ("sync_ms", "ms", "c", "detail: the caller waiting for pool workers (spread over the phases)"),
    ("experts_unique", "count", "c", "MoE: expert FFNs computed (unique (layer, expert) pairs)"),
    ("experts_routed", "count", "c", "MoE: (row, layer, expert) routings"),
    ("t", "s", "python", "wall-clock time (time.time()) when the step returned"),
)
PHASES = ("matmul_ms", "attention_ms", "lm_head_ms", "draft_ms", "sampling_ms", "grammar_ms", "other_ms")

# ------------------------------------------------------------------ events
EVENT: dict[str, Field] = _fields(
    ("type", "", "c", "token | done | error"),
    ("id", "id", "c", "engine request id"),
    ("token", "id", "c", "token: the generated token id"),
    ("logprob", "nat", "c", "token: log-softmax of the chosen token (NaN for greedy rows that asked for none)"),
    ("top", "", "c", "token: [(id, logprob)] alternatives, when asked for"),
    ("logits", "", "c", "token: the raw logits row, when asked for"),
    ("drafted", "", "c", "token: True if this token was a draft that verified"),
    ("t", "s", "python", "token / done: time.perf_counter() when the step that made it returned"),
    ("metrics", "", "c", "done: the request's metrics (REQUEST)"),
    ("status", "", "c", "error: the cb_status"),
    ("message", "", "c", "error: what went wrong"),
)


# ------------------------------------------------------------------ summaries
# Metrics of a group of requests (a variant, a task category, a server run):
# ratios of sums over the group's requests, never means of per-request ratios,
# under vLLM's names (vLLM reports the pooled numbers too).  accept_rate,
# accept_len_mean and draft_time_share above are the same quantities for one
# request.
SUMMARY: dict[str, Field] = _fields(
    ("prefix_cache_hit_rate", "ratio", "derived", "sum cached_tokens / sum prompt_tokens (vLLM: prefix cache hits / "
                                                  "queries, in tokens; NaN without prompt tokens)"),
    ("spec_decode_num_drafts", "count", "derived", "sum draft_steps: verify steps that carried drafts"),
    ("spec_decode_num_draft_tokens", "tokens", "derived", "sum draft_n"),
    ("spec_decode_num_accepted_tokens", "tokens", "derived", "sum draft_accepted"),
    ("spec_decode_num_accepted_tokens_per_pos", "tokens", "derived", "list: sum draft_accepted_by_pos (0-based)"),
    ("acceptance_rate", "ratio", "derived", "accepted / draft tokens (NaN when nothing was drafted)"),
    ("mean_acceptance_length", "tokens", "derived", "1 + accepted / drafts: tokens per verify step of a drafting "
                                                    "request (NaN when nothing was drafted)"),
    ("acceptance_rate_per_pos", "ratio", "derived", "list: accepted at position i / drafts (vLLM's per-position "
                                                    "rate)"),
    ("conditional_acceptance_per_pos", "ratio", "derived", "list: accepted at i / drafts that reached i "
                                                           "(sum draft_n_by_pos)"),
    ("draft_time_share", "ratio", "derived", "sum draft_ms / sum decode_ms (NaN without decoding)"),
)
SUMMARY_LISTS = ("spec_decode_num_accepted_tokens_per_pos", "acceptance_rate_per_pos",
                 "conditional_acceptance_per_pos")
# The scalar speculation summary, one column each in speculative.spec_table
# (the per-position rate flattened as acceptance_rate_pos_<i>).
SPEC_SUMMARY_SCALARS = tuple(k for k in SUMMARY if k.startswith("spec_decode") and k not in SUMMARY_LISTS) + (
    "acceptance_rate", "mean_acceptance_length", "draft_time_share")
SPEC_POS_PREFIX = "acceptance_rate_pos_"

# Names earlier releases used for SUMMARY metrics: results saved under them
# read back under the new ones (experiments.results.load_results).
RENAMED = {"hit_ratio": "prefix_cache_hit_rate", "hit ratio": "prefix_cache_hit_rate",
           "spec_acceptance_rate": "acceptance_rate", "spec_mean_acceptance_length": "mean_acceptance_length"}


# ------------------------------------------------------------ derivations
def derive_request(raw: Mapping, py_queue_ms: float = 0.0, token_times: list | None = None) -> dict:
    """A request's metrics from the binding's C fields: the scheduler's wait
    added to every time that starts at submit, the inter-token gaps, and the
    derived ratios.  The one place these are computed."""
    m = dict(raw)
    m["py_queue_ms"] = float(py_queue_ms)
    for k in ("queue_ms", "e2e_ms"):
        m[k] = float(m.get(k, 0.0)) + py_queue_ms
    for k in ("ttft_ms", "prefill_ms"):   # 0 means "never happened": keep it 0
        if m.get(k, 0.0) > 0:
            m[k] = float(m[k]) + py_queue_ms
    ts = list(token_times or [])
    m["itl_ms"] = [(b - a) * 1e3 for a, b in zip(ts, ts[1:])]
    dn, da, steps = int(m.get("draft_n", 0)), int(m.get("draft_accepted", 0)), int(m.get("draft_steps", 0))
    m["accept_rate"] = da / dn if dn else math.nan
    m["accept_len_mean"] = 1.0 + da / steps if steps else math.nan
    dec = float(m.get("decode_ms", 0.0))
    m["draft_time_share"] = float(m.get("draft_ms", 0.0)) / dec if dec > 0 else 0.0
    return m


def empty_request(finish_reason: str, completion_tokens: int = 0) -> dict:
    """Metrics of a request that never reached the engine (cancelled or
    refused before submission): every field, zero."""
    m = {k: 0 for k in REQUEST_SCALARS}
    m.update({k: 0.0 for k, f in REQUEST.items() if f.unit in ("ms", "us", "tok/s") and k not in REQUEST_LISTS})
    m.update(draft_n_by_pos=[], draft_accepted_by_pos=[], draft_n_by_source={}, draft_accepted_by_source={},
             slot=-1, stop_offset=-1, finish_reason=finish_reason, completion_tokens=completion_tokens)
    return derive_request(m)




def prefix_cache_hit_rate(prompt_tokens: float, cached_tokens: float) -> float:
    """SUMMARY["prefix_cache_hit_rate"] from the summed token counts."""
    return cached_tokens / prompt_tokens if prompt_tokens else math.nan


def spec_summary(metrics: Iterable[Mapping]) -> dict:
    """The speculation metrics of SUMMARY over requests' metric dicts (the
    engine's per-request `metrics`: draft_steps, draft_n, draft_accepted,
    draft_n_by_pos, draft_accepted_by_pos, draft_ms, decode_ms)."""
    drafts = tokens = accepted = 0
    draft_ms = decode_ms = 0.0
    per_pos: list[int] = []
    reached: list[int] = []
    for m in metrics:
        drafts += int(m.get("draft_steps", 0) or 0)
        tokens += int(m.get("draft_n", 0) or 0)
        accepted += int(m.get("draft_accepted", 0) or 0)
        draft_ms += float(m.get("draft_ms", 0.0) or 0.0)
        decode_ms += float(m.get("decode_ms", 0.0) or 0.0)
        for name, acc in (("draft_accepted_by_pos", per_pos), ("draft_n_by_pos", reached)):
            for i, v in enumerate(m.get(name) or ()):
                if i >= len(acc):
                    acc.extend([0] * (i + 1 - len(acc)))
                acc[i] += int(v)
    return {
        "spec_decode_num_drafts": drafts,
        "spec_decode_num_draft_tokens": tokens,
        "spec_decode_num_accepted_tokens": accepted,
        "spec_decode_num_accepted_tokens_per_pos": per_pos,
        "acceptance_rate": accepted / tokens if tokens else math.nan,
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts else math.nan,
        "acceptance_rate_per_pos": [a / drafts for a in per_pos] if drafts else [],
        "conditional_acceptance_per_pos": [a / n if n else math.nan for a, n in zip(per_pos, reached)],
        "draft_time_share": draft_ms / decode_ms if decode_ms > 0 else math.nan,
    }


# The request fields /profile summarizes (mean and percentiles over its
# window): every numeric scalar of REQUEST.
PROFILE_FIELDS = tuple(k for k in REQUEST_SCALARS if REQUEST[k].unit in ("ms", "us", "tokens", "tok/s", "ratio",
                                                                          "count"))


def json_safe(v):
    """NaN / inf -> None, recursively (JSON has no NaN)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v


# ---------------------------------------------------- DataFrame columns
# Row context the experiment runner adds (not metrics: where and when a row ran).
ROW_CONTEXT = ("experiment", "variant", "repeat", "block", "workload", "item_index", "prompt_id", "group", "turn",
               "n_turns", "seed", "concurrency", "arrival", "client", "t_release_s", "t_submit_s", "t_done_s",
               "client_ms", "worker", "hostname", "cpu_model", "simd", "shard")
ROW_OUTPUT = ("prompt_hash", "output_hash", "output_tokens", "output_text", "error")
# Flattened list metrics: draft_n_pos_<i> / draft_accepted_pos_<i> (i 0-based, as
# Prometheus' position label), draft_n_src_<s> / draft_accepted_src_<s>.
POS_PREFIXES = ("draft_n_pos_", "draft_accepted_pos_")
SRC_PREFIXES = ("draft_n_src_", "draft_accepted_src_")
REQUEST_COLUMNS = REQUEST_SCALARS
# Serving runs (experiments.loadgen): one row per gap between two output chunks of a request.
GAP_COLUMNS = ("experiment", "variant", "repeat", "block", "prompt_id", "turn", "seed", "gap", "t_s", "itl_ms")
# Numerics pass (experiments.numerics): one row per (variant, item).
NUMERICS_COLUMNS = ("experiment", "variant", "item_index", "prompt_id", "group", "prompt_tokens", "reply_tokens",
                    "n_scored", "perplexity", "kl_mean", "kl_max", "top1_agree")
STEP_CONTEXT = ("experiment", "variant", "repeat", "block", "shard", "worker", "t_rel_s")
STEP_COLUMNS = tuple(k for k in STEP if k != "t")


def flat_columns(m: Mapping) -> dict:
    """The list / dict metrics of one request as scalar columns (one CSV cell
    per value): draft_n_pos_<i>, draft_accepted_pos_<i> for each position i
    (0-based), draft_n_src_<s>, draft_accepted_src_<s> for each source."""
    out: dict[str, int] = {}
    n_pos = list(m.get("draft_n_by_pos") or [])
    a_pos = list(m.get("draft_accepted_by_pos") or [])
    for i, n in enumerate(n_pos):
        out[f"{POS_PREFIXES[0]}{i}"] = int(n)
        out[f"{POS_PREFIXES[1]}{i}"] = int(a_pos[i]) if i < len(a_pos) else 0
    n_src = m.get("draft_n_by_source") or {}
    a_src = m.get("draft_accepted_by_source") or {}
    for s, n in n_src.items():
        out[f"{SRC_PREFIXES[0]}{s}"] = int(n)
        out[f"{SRC_PREFIXES[1]}{s}"] = int(a_src.get(s, 0))
    return out


def is_request_column(name: str) -> bool:
    """Whether a request-table column comes from this schema."""
    return (name in REQUEST_COLUMNS or name in ROW_CONTEXT or name in ROW_OUTPUT
            or name.startswith(POS_PREFIXES + SRC_PREFIXES))


def is_step_column(name: str) -> bool:
    return name in STEP_COLUMNS or name in STEP_CONTEXT


# ------------------------------------------------------- external names
@dataclass(frozen=True)
class External:
    name: str                      # the name outside (a JSON key, a Prometheus family)
    sources: tuple[str, ...]       # schema fields it is computed from (empty: a constant or server state)
    fn: Callable[[Mapping], object] | None = None
    kind: str = ""                 # Prometheus: counter | histogram | gauge
    help: str = ""
    prefix: str = ""               # Prometheus: the family's prefix


def _i(m, k):
    return int(m.get(k, 0) or 0)


def _f(m, k):
    return float(m.get(k, 0.0) or 0.0)


def _prompt_n(m):
    return max(0, _i(m, "prompt_tokens") - _i(m, "cached_tokens"))


def _per(num, den, scale=1.0):
    return scale * num / den if den else 0.0


OPENAI_USAGE = (
    External("prompt_tokens", ("prompt_tokens",), lambda m: _i(m, "prompt_tokens")),
    External("completion_tokens", ("completion_tokens",), lambda m: _i(m, "completion_tokens")),
    External("total_tokens", ("prompt_tokens", "completion_tokens"),
             lambda m: _i(m, "prompt_tokens") + _i(m, "completion_tokens")),
    External("prompt_tokens_details.cached_tokens", ("cached_tokens",), lambda m: _i(m, "cached_tokens")),
    External("completion_tokens_details.reasoning_tokens", (), lambda m: 0),
)
RESPONSES_USAGE = (   # OpenAI's Responses API
    External("input_tokens", ("prompt_tokens",), lambda m: _i(m, "prompt_tokens")),
    External("input_tokens_details.cached_tokens", ("cached_tokens",), lambda m: _i(m, "cached_tokens")),
    External("output_tokens", ("completion_tokens",), lambda m: _i(m, "completion_tokens")),
    External("output_tokens_details.reasoning_tokens", (), lambda m: 0),
    External("total_tokens", ("prompt_tokens", "completion_tokens"),
             lambda m: _i(m, "prompt_tokens") + _i(m, "completion_tokens")),
)
ANTHROPIC_USAGE = (
    External("input_tokens", ("prompt_tokens", "cached_tokens"), _prompt_n),
    External("output_tokens", ("completion_tokens",), lambda m: _i(m, "completion_tokens")),
    External("cache_read_input_tokens", ("cached_tokens",), lambda m: _i(m, "cached_tokens")),
    External("cache_creation_input_tokens", (), lambda m: 0),
)
LLAMACPP_TIMINGS = (
    External("cache_n", ("cached_tokens",), lambda m: _i(m, "cached_tokens")),
    External("prompt_n", ("prompt_tokens", "cached_tokens"), _prompt_n),
    External("prompt_ms", ("prefill_ms",), lambda m: _f(m, "prefill_ms")),
    External("prompt_per_token_ms", ("prefill_ms", "prompt_tokens", "cached_tokens"),
             lambda m: _per(_f(m, "prefill_ms"), _prompt_n(m))),
    External("prompt_per_second", ("prefill_ms", "prompt_tokens", "cached_tokens"),
             lambda m: _per(_prompt_n(m), _f(m, "prefill_ms"), 1e3)),
    External("predicted_n", ("completion_tokens",), lambda m: _i(m, "completion_tokens")),
    External("predicted_ms", ("decode_ms",), lambda m: _f(m, "decode_ms")),
    External("predicted_per_token_ms", ("decode_ms", "completion_tokens"),
             lambda m: _per(_f(m, "decode_ms"), _i(m, "completion_tokens"))),
    External("predicted_per_second", ("decode_ms", "completion_tokens"),
             lambda m: _per(_i(m, "completion_tokens"), _f(m, "decode_ms"), 1e3)),
    External("draft_n", ("draft_n",), lambda m: _i(m, "draft_n")),
    External("draft_n_accepted", ("draft_accepted",), lambda m: _i(m, "draft_accepted")),
)

# Prometheus families of /metrics: vLLM's names and types under vLLM's prefix
# (so tools that read a vLLM server read this one) for request metrics,
# observed once per finished request; the server's own series under
# "colibri:".
PROMETHEUS_PREFIX = "vllm:"
PROMETHEUS_OWN_PREFIX = "colibri:"


def _prom(name, sources, kind, help_, prefix=PROMETHEUS_PREFIX):
    return External(name, tuple(sources), kind=kind, help=help_, prefix=prefix)


PROMETHEUS = (
    _prom("num_requests_running", (), "gauge", "Requests holding a KV slot."),
    _prom("num_requests_waiting", (), "gauge", "Requests waiting for a slot."),
    _prom("kv_cache_usage_perc", (), "gauge", "Fraction of KV slots in use (0-1)."),
    _prom("prompt_tokens_total", ("prompt_tokens",), "counter", "Prompt tokens processed (cached included)."),
    _prom("generation_tokens_total", ("completion_tokens",), "counter", "Tokens generated."),
    _prom("prefix_cache_queries_total", ("prompt_tokens",), "counter", "Prompt tokens looked up in the prefix cache."),
    _prom("prefix_cache_hits_total", ("cached_tokens",), "counter", "Prompt tokens served from the prefix cache."),
    _prom("spec_decode_num_drafts_total", ("draft_steps",), "counter", "Speculative draft rounds."),
    _prom("spec_decode_num_draft_tokens_total", ("draft_n",), "counter", "Draft tokens proposed."),
    _prom("spec_decode_num_accepted_tokens_total", ("draft_accepted",), "counter", "Draft tokens accepted."),
    _prom("spec_decode_num_accepted_tokens_per_pos_total", ("draft_accepted_by_pos",), "counter",
          "Accepted draft tokens by draft position (0-based)."),
    _prom("request_success_total", ("finish_reason",), "counter", "Finished requests by finish reason."),
    _prom("time_to_first_token_seconds", ("ttft_ms",), "histogram", "Time to first token (from submit)."),
    _prom("inter_token_latency_seconds", ("itl_ms",), "histogram", "Time between two consecutive tokens of a request."),
    _prom("e2e_request_latency_seconds", ("e2e_ms",), "histogram", "End-to-end request latency."),
    _prom("request_queue_time_seconds", ("queue_ms",), "histogram", "Time waiting for a slot."),
    _prom("request_prefill_time_seconds", ("prefill_ms",), "histogram", "Time spent prefilling the prompt."),
    _prom("request_decode_time_seconds", ("decode_ms",), "histogram", "Time spent decoding."),
    _prom("request_prompt_tokens", ("prompt_tokens",), "histogram", "Prompt tokens per request."),
    _prom("request_generation_tokens", ("completion_tokens",), "histogram", "Generated tokens per request."),
    # the server's own
    _prom("http_responses_total", (), "counter", "HTTP responses by endpoint and status.", PROMETHEUS_OWN_PREFIX),
    _prom("connections_open", (), "gauge", "Open connections.", PROMETHEUS_OWN_PREFIX),
    _prom("connections_evicted_idle_total", (), "counter", "Idle keep-alive connections closed at the cap.",
          PROMETHEUS_OWN_PREFIX),
    _prom("connections_evicted_slow_total", (), "counter", "Slow senders closed at the cap.", PROMETHEUS_OWN_PREFIX),
    _prom("connections_refused_total", (), "counter", "Connections refused beyond the cap and its reserve.",
          PROMETHEUS_OWN_PREFIX),
)
PROMETHEUS_BY_NAME = {e.name: e for e in PROMETHEUS}


def _nest(table, m: Mapping) -> dict:
    out: dict = {}
    for e in table:
        d = out
        *path, leaf = e.name.split(".")
        for p in path:
            d = d.setdefault(p, {})
        d[leaf] = e.fn(m)
    return out


def openai_usage(m: Mapping) -> dict:
    """OpenAI `usage` from summed request metrics (prompt_tokens, cached_tokens, completion_tokens)."""
    return _nest(OPENAI_USAGE, m)


def responses_usage(m: Mapping) -> dict:
    return _nest(RESPONSES_USAGE, m)


def anthropic_usage(m: Mapping) -> dict:
    return _nest(ANTHROPIC_USAGE, m)


def llamacpp_timings(m: Mapping) -> dict:
    """llama.cpp's `timings` object from a request's metrics."""
    return _nest(LLAMACPP_TIMINGS, m)
