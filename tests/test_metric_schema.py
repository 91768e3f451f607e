"""One metric vocabulary (colibri_lab.metrics) and one set of request bounds
(colibri_lab.params), checked where they leave the package: the step profile,
/metrics, OpenAI and Anthropic usage, llama.cpp timings, DataFrame columns,
and the same out-of-range value through Engine, the OpenAI route and the
Anthropic route."""
from __future__ import annotations

import json

import pytest

from colibri_lab import metrics as schema
from colibri_lab.errors import InvalidRequestError
from colibri_lab.server.metrics import Histogram
from test_serve_util import raw, sse_events, wait_idle

pytestmark = pytest.mark.smollm2

MSG = [{"role": "user", "content": "Repeat after me: the cat sat on the mat, the cat sat on the mat."}]


@pytest.fixture(scope="module")
def engine_kwargs():
    return dict(layer_skip=True)


def _steps_of(engine, after: int):
    return [s for s in list(engine.scheduler.step_log) if s["step"] > after]


def _last_step(engine) -> int:
    log = engine.scheduler.step_log
    return log[-1]["step"] if log else -1


# ------------------------------------------------------------------ phases
@pytest.mark.parametrize("kind", ["plain", "grammar", "speculative"])
def test_phases_partition_step_ms(engine, kind):
    """Every millisecond of a step is in exactly one phase: the phases are
    non-negative and add up to step_ms (within 1%), drafting and grammar masks
    included."""
    kw = {"plain": {}, "grammar": {"grammar": 'root ::= "the cat" (" sat" | " ran")+'},
          "speculative": {"speculative": {"sources": ["layer_skip"], "adaptive": False, "k_max": 4}}}[kind]
    wait_idle(engine)
    after = _last_step(engine)
    engine.generate(MSG[0]["content"], max_tokens=24, ignore_eos=kind != "grammar", **kw)
    steps = [s for s in _steps_of(engine, after) if s["rows_decode"] + s["rows_prefill"] > 0]
    assert len(steps) >= 5
    for s in steps:
        parts = [s[p] for p in schema.PHASES]
        assert min(parts) >= -1e-3, (kind, s)
        assert abs(sum(parts) - s["step_ms"]) <= 0.01 * s["step_ms"] + 1e-6, (kind, s)
    tot = {p: sum(s[p] for s in steps) for p in schema.PHASES + ("step_ms",)}
    if kind == "grammar":
        assert tot["grammar_ms"] > 0, tot
    if kind == "speculative":   # the drafter's forwards are real time: a double count would show
        assert tot["draft_ms"] > 0.05 * tot["step_ms"], tot


# --------------------------------------------------------------------- ITL
def _histogram(text: str, name: str) -> dict:
    out = {}
    for ln in text.splitlines():
        if ln.startswith(schema.PROMETHEUS_PREFIX + name):
            key, val = ln.rsplit(" ", 1)
            out[key[len(schema.PROMETHEUS_PREFIX):]] = float(val)
    return out


def test_itl_histogram_equals_recorded_gaps(engine, server):
    """/metrics' inter-token histogram observes every gap between a request's
    token events, not its mean TPOT once per gap."""
    wait_idle(engine)
    _, _, before = raw(server, "GET", "/metrics")
    st, _, data = raw(server, "POST", "/v1/completions",
                      {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0,
                       "stream": True})
    assert st == 200 and sse_events(data)
    wait_idle(engine)
    gaps = [m for m in engine.scheduler.finished][-1]["itl_ms"]
    assert len(gaps) >= 20
    _, _, after = raw(server, "GET", "/metrics")
    h0 = _histogram(before.decode(), "inter_token_latency_seconds")
    h1 = _histogram(after.decode(), "inter_token_latency_seconds")
    want = Histogram(Histogram_buckets())
    for g in gaps:
        want.observe(g / 1e3)
    lines: list[str] = []
    want.render("inter_token_latency_seconds", lines, 'model_name="smollm2"')
    for ln in lines:
        key, val = ln.rsplit(" ", 1)
        assert h1[key] - h0.get(key, 0.0) == pytest.approx(float(val), abs=2e-6), key


def Histogram_buckets():
    from colibri_lab.server import metrics as m

    return m._ITL_BUCKETS


# ------------------------------------------------------ names from the schema
def _keys(d: dict, prefix: str = "") -> set:
    out = set()
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _keys(v, f"{prefix}{k}.")
        else:
            out.add(prefix + k)
    return out


def test_schema_tables_refer_to_schema_fields():
    for table in (schema.OPENAI_USAGE, schema.RESPONSES_USAGE, schema.ANTHROPIC_USAGE, schema.LLAMACPP_TIMINGS,
                  schema.PROMETHEUS):
        for e in table:
            assert set(e.sources) <= set(schema.REQUEST), e
    assert set(schema.PHASES) <= set(schema.STEP)


def test_every_external_name_comes_from_the_schema(engine, server, make_tiny):
    chat = {"model": "smollm2", "messages": MSG, "max_tokens": 4, "temperature": 0}
    st, _, data = raw(server, "POST", "/v1/chat/completions", chat)
    body = json.loads(data)
    assert st == 200 and _keys(body["usage"]) == {e.name for e in schema.OPENAI_USAGE}
    assert set(body["timings"]) == {e.name for e in schema.LLAMACPP_TIMINGS}
    st, _, data = raw(server, "POST", "/v1/chat/completions",
                      dict(chat, stream=True, stream_options={"include_usage": True}))
    evs = [json.loads(d) for _, d in sse_events(data) if d != "[DONE]"]
    assert _keys(evs[-1]["usage"]) == {e.name for e in schema.OPENAI_USAGE}
    assert set(next(e for e in evs if "timings" in e)["timings"]) == {e.name for e in schema.LLAMACPP_TIMINGS}
    st, _, data = raw(server, "POST", "/v1/messages", {"model": "smollm2", "messages": MSG, "max_tokens": 4,
                                                       "stream": True})
    evs = [json.loads(d) for _, d in sse_events(data)]
    assert set(evs[0]["message"]["usage"]) == {e.name for e in schema.ANTHROPIC_USAGE}
    md = next(e for e in evs if e["type"] == "message_delta")
    assert set(md["usage"]) == {e.name for e in schema.ANTHROPIC_USAGE}
    st, _, data = raw(server, "POST", "/v1/messages", {"model": "smollm2", "messages": MSG, "max_tokens": 4})
    body = json.loads(data)
    assert st == 200 and set(body["usage"]) == {e.name for e in schema.ANTHROPIC_USAGE}
    assert set(body["timings"]) == {e.name for e in schema.LLAMACPP_TIMINGS}
    st, _, data = raw(server, "POST", "/v1/responses", {"model": "smollm2", "input": "Hi", "max_output_tokens": 4})
    body = json.loads(data)
    assert st == 200 and _keys(body["usage"]) == {e.name for e in schema.RESPONSES_USAGE}, body
    assert set(body["timings"]) == {e.name for e in schema.LLAMACPP_TIMINGS}
    # /profile: the request fields it summarizes and the hit rate
    st, _, data = raw(server, "GET", "/profile")
    prof = json.loads(data)
    assert st == 200 and set(prof["summary"]) <= set(schema.PROFILE_FIELDS) <= set(schema.REQUEST)
    assert {"ttft_ms", "tpot_ms", "e2e_ms", "cached_tokens"} <= set(prof["summary"])
    assert 0.0 <= prof["prefix_cache_hit_rate"] <= 1.0 and "prefix_cache_hit_rate" in schema.SUMMARY
    # /metrics: every family
    _, _, data = raw(server, "GET", "/metrics")
    families = {ln.split()[2] for ln in data.decode().splitlines() if ln.startswith("# TYPE")}
    known = {e.prefix + e.name for e in schema.PROMETHEUS}
    assert families <= known, families - known
    assert {e.prefix + e.name for e in schema.PROMETHEUS if e.sources} <= families
    # DataFrames of an experiment
    from colibri_lab.experiments import ExperimentSpec, Variant, run

    tiny = make_tiny()
    spec = ExperimentSpec(name="names", workload={"name": "w", "items": [{"id": "a", "turns": ["Hi?"]}]},
                          repeats=1, warmup=0, engine={"model": str(tiny.path), "n_threads": 1, "n_ctx": 128},
                          request={"max_tokens": 4, "speculative": {"sources": ["prompt_lookup"]}},
                          variants=[Variant("a"), Variant("b")])
    res = run(spec, progress=False)
    bad = [c for c in res.requests.columns if not schema.is_request_column(c)]
    assert not bad, bad
    bad = [c for c in res.steps.columns if not schema.is_step_column(c)]
    assert not bad, bad
    # group summaries: summary_table, stats, spec_table, the serving tables' /metrics deltas
    from colibri_lab.experiments import metrics_delta, prefix_cache_hit_rate, summary_table
    from colibri_lab.experiments.loadgen import parse_prometheus
    from colibri_lab.speculative import spec_table

    assert "prefix_cache_hit_rate" in summary_table(res).columns
    assert "prefix_cache_hit_rate" in prefix_cache_hit_rate(res.requests).columns
    st_cols = set(spec_table(res.requests).columns) - {"variant"}
    bad = [c for c in st_cols if c not in schema.SUMMARY and not c.startswith(schema.SPEC_POS_PREFIX)]
    assert not bad and set(schema.SPEC_SUMMARY_SCALARS) <= st_cols, (bad, st_cols)
    before = parse_prometheus(raw(server, "GET", "/metrics")[2].decode())
    raw(server, "POST", "/v1/chat/completions", chat)
    wait_idle(engine)
    delta = metrics_delta(before, parse_prometheus(raw(server, "GET", "/metrics")[2].decode()))
    counters = {e.name.removesuffix("_total") for e in schema.PROMETHEUS if e.kind == "counter"}
    bad = [k for k in delta if k not in schema.SUMMARY and k not in counters]
    assert not bad, bad
    assert {"prefix_cache_hit_rate", "acceptance_rate", "mean_acceptance_length"} <= set(delta)


# ---------------------------------------------------------------- bounds
@pytest.mark.parametrize("field,value", [
    ("top_p", 1.5),
    ("temperature", -0.5),
    ("speculative", {"sources": ["prompt_lookup"], "k_max": 100}),
])
def test_one_set_of_bounds(engine, server, field, value):
    with pytest.raises(InvalidRequestError) as ei:
        engine.generate("Hi", max_tokens=2, **{field: value})
    want = str(ei.value)
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, field: value}
    st, _, data = raw(server, "POST", "/v1/chat/completions", body)
    err = json.loads(data)["error"]
    assert st == 400 and err["message"] == want and err["param"].startswith(field), err
    st, _, data = raw(server, "POST", "/v1/messages", body)
    err = json.loads(data)["error"]
    assert st == 400 and err["message"] == want, err
