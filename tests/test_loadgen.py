"""The HTTP load generator without a model: arrival schedules (seeded, fitting
the rate and distribution by a Kolmogorov-Smirnov test), the metric
definitions on hand-computed traces, goodput, /metrics deltas, SSE parsing
against a scripted server, and the llama.cpp helper's skip reason."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pandas as pd
import pytest

from colibri_lab.experiments import loadgen, servers
from colibri_lab.experiments.serve_bench import max_rate_meeting, percentile_ratio
from colibri_lab.experiments.workloads import Arrival

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------- schedules
def ks_pvalue(x, cdf) -> tuple[float, float]:
    """One-sample Kolmogorov-Smirnov statistic D and its asymptotic p-value
    (Kolmogorov's distribution, with Stephens' small-sample correction)."""
    x = np.sort(np.asarray(x, float))
    n = len(x)
    f = np.array([cdf(v) for v in x])
    i = np.arange(1, n + 1)
    d = max(np.max(i / n - f), np.max(f - (i - 1) / n))
    t = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * t * t) for k in range(1, 101))
    return float(d), float(min(1.0, max(0.0, p)))


def erlang_cdf(k: int, rate: float):
    return lambda x: 1.0 - sum(math.exp(-rate * x) * (rate * x) ** j / math.factorial(j) for j in range(k))


def gaps_of(arrival: Arrival, n: int) -> np.ndarray:
    return np.diff(np.concatenate([[0.0], arrival.start_times(n)]))


def test_schedule_is_reproducible_for_a_seed():
    a = Arrival(kind="poisson", rate=2.0, seed=7)
    assert np.array_equal(a.start_times(50), Arrival(kind="poisson", rate=2.0, seed=7).start_times(50))
    assert not np.array_equal(a.start_times(50), Arrival(kind="poisson", rate=2.0, seed=8).start_times(50))
    g = Arrival(kind="poisson", rate=2.0, seed=7, burstiness=0.5)
    assert np.array_equal(g.start_times(50), Arrival.from_dict(g.as_dict()).start_times(50))
    assert np.all(np.diff(a.start_times(50)) > 0)
    assert np.array_equal(Arrival(kind="poisson", rate=math.inf).start_times(4), np.zeros(4))


@pytest.mark.parametrize("rate", [0.5, 4.0])
def test_poisson_gaps_fit_the_exponential_at_the_rate(rate):
    g = gaps_of(Arrival(kind="poisson", rate=rate, seed=1), 2000)
    d, p = ks_pvalue(g, lambda x: 1.0 - math.exp(-rate * x))
    assert p > 0.01, (d, p)
    assert abs(g.mean() * rate - 1.0) < 0.08                 # mean gap 1/rate (sd of the mean ~2.2 %)
    # the test has power: the same gaps are not exponential at twice the rate
    assert ks_pvalue(g, lambda x: 1.0 - math.exp(-2 * rate * x))[1] < 1e-6


@pytest.mark.parametrize("burstiness", [2, 4])
def test_gamma_gaps_fit_the_burstiness(burstiness):
    rate = 3.0
    g = gaps_of(Arrival(kind="poisson", rate=rate, seed=2, burstiness=burstiness), 2000)
    # gamma(shape b, scale 1/(rate b)) with integer b is Erlang(b, rate b)
    d, p = ks_pvalue(g, erlang_cdf(burstiness, rate * burstiness))
    assert p > 0.01, (d, p)
    assert abs(g.mean() * rate - 1.0) < 0.05
    assert abs(g.std() / g.mean() - 1 / math.sqrt(burstiness)) < 0.06   # coefficient of variation 1/sqrt(b)
    assert ks_pvalue(g, lambda x: 1.0 - math.exp(-rate * x))[1] < 1e-6  # and it is not Poisson


def test_bursty_gamma_below_one_fits_too():
    rate, b = 2.0, 0.5
    g = gaps_of(Arrival(kind="poisson", rate=rate, seed=3, burstiness=b), 2000)
    # gamma(1/2, scale s) has CDF erf(sqrt(x / s))
    s = 1.0 / (rate * b)
    assert ks_pvalue(g, lambda x: math.erf(math.sqrt(x / s)))[1] > 0.01
    assert abs(g.mean() * rate - 1.0) < 0.1


def test_arrival_rejects_bad_settings():
    with pytest.raises(ValueError, match="burstiness"):
        Arrival(kind="poisson", rate=1.0, burstiness=0.0)
    with pytest.raises(ValueError, match="unknown arrival"):
        Arrival.from_dict({"rate": 1.0, "burst": 2})
    assert "burstiness 0.5" in Arrival(kind="poisson", rate=1.0, burstiness=0.5).label()


# --------------------------------------------------------------- metrics
def test_trace_metrics_equal_hand_computed_values():
    # sent at 10.0 s; output chunks at 10.5, 10.6, 10.8, 11.1; stream ends at 11.2; 4 tokens
    m = loadgen.trace_metrics(10.0, [10.5, 10.6, 10.8, 11.1], 11.2, completion_tokens=4)
    assert m["ttft_ms"] == pytest.approx(500.0)
    assert m["e2e_ms"] == pytest.approx(1200.0)
    assert m["tpot_ms"] == pytest.approx((1200.0 - 500.0) / 3)      # first token excluded
    assert m["itl_ms"] == pytest.approx([100.0, 200.0, 300.0])       # every gap
    # a server without usage: the chunks are the tokens
    assert loadgen.trace_metrics(0.0, [0.1, 0.3], 0.4)["completion_tokens"] == 2
    one = loadgen.trace_metrics(0.0, [0.25], 0.3, completion_tokens=1)
    assert one["ttft_ms"] == pytest.approx(250.0) and math.isnan(one["tpot_ms"]) and one["itl_ms"] == []
    none = loadgen.trace_metrics(0.0, [], 0.3, completion_tokens=0)
    assert math.isnan(none["ttft_ms"]) and none["e2e_ms"] == pytest.approx(300.0)


def test_summary_uses_vllm_names_and_definitions():
    rows = [dict(ttft_ms=100.0, tpot_ms=10.0, e2e_ms=200.0, prompt_tokens=5, completion_tokens=11, error=""),
            dict(ttft_ms=300.0, tpot_ms=30.0, e2e_ms=600.0, prompt_tokens=7, completion_tokens=11, error=""),
            dict(ttft_ms=float("nan"), tpot_ms=float("nan"), e2e_ms=50.0, prompt_tokens=-1, completion_tokens=0,
                 error="HTTP 500: x")]
    gaps = [dict(itl_ms=x) for x in (5.0, 10.0, 15.0, 20.0)]
    s = loadgen.summary(rows, gaps, duration_s=2.0, slo="ttft:200")
    assert s["completed"] == 2 and s["failed"] == 1
    assert s["total_input_tokens"] == 12 and s["total_output_tokens"] == 22
    assert s["request_throughput"] == pytest.approx(1.0) and s["output_throughput"] == pytest.approx(11.0)
    assert s["total_token_throughput"] == pytest.approx(17.0)
    assert s["mean_ttft_ms"] == pytest.approx(200.0) and s["median_ttft_ms"] == pytest.approx(200.0)
    assert s["p99_ttft_ms"] == pytest.approx(np.percentile([100, 300], 99))
    assert s["p90_e2el_ms"] == pytest.approx(np.percentile([200, 600], 90))
    assert s["mean_itl_ms"] == pytest.approx(12.5) and s["median_itl_ms"] == pytest.approx(12.5)
    assert s["good_requests"] == 1 and s["request_goodput"] == pytest.approx(0.5)


def test_goodput_counts_exactly_the_requests_within_every_slo():
    slo = loadgen.parse_slo("ttft:200 tpot:50 e2el:1000")
    assert slo == {"ttft_ms": 200.0, "tpot_ms": 50.0, "e2e_ms": 1000.0}
    assert loadgen.parse_slo("ttft:200,tpot:50") == {"ttft_ms": 200.0, "tpot_ms": 50.0}
    rows = pd.DataFrame([
        dict(ttft_ms=200.0, tpot_ms=50.0, e2e_ms=1000.0, completion_tokens=10, error=""),   # on every bound: good
        dict(ttft_ms=200.1, tpot_ms=10.0, e2e_ms=500.0, completion_tokens=10, error=""),    # TTFT over
        dict(ttft_ms=10.0, tpot_ms=50.1, e2e_ms=500.0, completion_tokens=10, error=""),     # TPOT over
        dict(ttft_ms=10.0, tpot_ms=10.0, e2e_ms=1000.1, completion_tokens=10, error=""),    # E2EL over
        dict(ttft_ms=10.0, tpot_ms=float("nan"), e2e_ms=20.0, completion_tokens=1, error=""),  # one token: TPOT 0
        dict(ttft_ms=10.0, tpot_ms=10.0, e2e_ms=20.0, completion_tokens=10, error="HTTP 429: busy"),  # failed
        dict(ttft_ms=float("nan"), tpot_ms=float("nan"), e2e_ms=20.0, completion_tokens=0, error=""),  # no token
        dict(ttft_ms=1.0, tpot_ms=1.0, e2e_ms=2.0, completion_tokens=3, error=""),           # good
    ])
    good = loadgen.good_requests(rows, slo)
    assert good.tolist() == [True, False, False, False, True, False, False, True]
    # each SLO alone counts only its own bound
    assert loadgen.good_requests(rows, "ttft:200").tolist() == [True, False, True, True, True, False, False, True]
    # (a reply of 0 or 1 tokens has no TPOT: vLLM counts it as 0, so it meets any TPOT bound)
    assert loadgen.good_requests(rows, "tpot:50").tolist() == [True, True, False, True, True, False, True, True]
    assert loadgen.good_requests(rows, {"e2el": 1000}).tolist() == [True, True, True, False, True, False, True, True]
    for bad in ("ttft", "ttft:abc", "latency:5", "ttft:0"):
        with pytest.raises(ValueError):
            loadgen.parse_slo(bad)


PROM_BEFORE = """# HELP colibri:prefix_cache_queries_total x
# TYPE colibri:prefix_cache_queries_total counter
colibri:prefix_cache_queries_total{model_name="m"} 100
colibri:prefix_cache_hits_total{model_name="m"} 40
colibri:spec_decode_num_drafts_total{model_name="m"} 10
colibri:spec_decode_num_draft_tokens_total{model_name="m"} 30
colibri:spec_decode_num_accepted_tokens_total{model_name="m"} 12
colibri:request_success_total{model_name="m",finished_reason="stop"} 3
colibri:request_success_total{model_name="m",finished_reason="length"} 2
colibri:time_to_first_token_seconds_bucket{le="0.1"} 4
colibri:time_to_first_token_seconds_count 5
"""


def test_prometheus_deltas_give_hit_rate_and_acceptance():
    before = loadgen.parse_prometheus(PROM_BEFORE)
    assert before["request_success"] == 5 and before["time_to_first_token_seconds_count"] == 5
    assert not any(k.endswith("_bucket") for k in before)
    after_text = (PROM_BEFORE.replace("} 100", "} 300").replace("} 40", "} 190").replace("} 10\n", "} 20\n")
                  .replace("} 30\n", "} 70\n").replace("} 12\n", "} 42\n").replace('"stop"} 3', '"stop"} 9')
                  .replace("colibri:", "vllm:"))   # any namespace
    d = loadgen.metrics_delta(before, loadgen.parse_prometheus(after_text))
    assert d["request_success"] == 6
    assert d["prefix_cache_hit_rate"] == pytest.approx(150 / 200)
    assert d["acceptance_rate"] == pytest.approx(30 / 40)
    assert d["mean_acceptance_length"] == pytest.approx(1 + 30 / 10)
    empty = loadgen.metrics_delta({}, {})
    assert math.isnan(empty["prefix_cache_hit_rate"]) and math.isnan(empty["request_success"])


def test_sustained_compares_completion_and_arrival_rates():
    rel = np.arange(10.0)
    keeps_up = pd.DataFrame({"turn": 0, "t_release_s": rel, "t_done_s": rel + 0.5})
    assert loadgen.sustained(keeps_up) == (True, pytest.approx(1.0))
    queued = pd.DataFrame({"turn": 0, "t_release_s": rel, "t_done_s": 1.0 + 2.0 * rel})   # served at half the rate
    ok, ratio = loadgen.sustained(queued)
    assert not ok and ratio == pytest.approx(0.5)


def test_percentile_ratio_and_max_rate():
    rng = np.random.default_rng(0)
    a = rng.exponential(100.0, 400)
    r = percentile_ratio(a, a * 0.5, q=99)
    assert r["ratio"] == pytest.approx(0.5) and r["verdict"] == "win"
    assert percentile_ratio(a, rng.exponential(100.0, 400), q=50)["verdict"] == "no clear difference"
    # a cluster bootstrap over groups: 40 requests of 10 gaps each, every gap of a request the same
    # value, is as wide as the bootstrap of the 40 values (the copies are no evidence), and the
    # gap-by-gap bootstrap of the copies is much narrower
    x, y = rng.exponential(100.0, 40), rng.exponential(100.0, 40)
    xr, yr = np.repeat(x, 10), np.repeat(y, 10)
    g = np.repeat(np.arange(40), 10)
    width = lambda c: c["ci_high"] - c["ci_low"]
    one = percentile_ratio(x, y, q=90)
    grouped = percentile_ratio(xr, yr, q=90, groups_a=g, groups_b=g + 100)
    flat = percentile_ratio(xr, yr, q=90)
    assert grouped["ratio"] == pytest.approx(float(np.percentile(yr, 90) / np.percentile(xr, 90)))
    assert grouped["n_a"] == grouped["n_b"] == 40 and flat["n_a"] == 400
    assert 0.6 < width(grouped) / width(one) < 1.6 and width(flat) < 0.6 * width(grouped)
    h = percentile_ratio(a, a * 0.5, q=99, groups_a=np.arange(400) // 4, groups_b=np.arange(400) // 4)
    assert h["ratio"] == pytest.approx(0.5) and h["verdict"] == "win"
    t = pd.DataFrame({"server": ["x"] * 4, "rate": [4.0, 1.0, 2.0, 8.0], "failed": [0, 0, 0, 0],
                      "sustained": [0.95, 1.0, 1.0, 0.97], "p99_ttft_ms": [1900, 100, 300, 2500],
                      "p99_tpot_ms": [150, 50, 60, 100]})
    assert max_rate_meeting(t, "x", {"p99_ttft_ms": 2000, "p99_tpot_ms": 200}) == 4.0
    assert max_rate_meeting(t, "x", {"p99_ttft_ms": 200}) == 1.0
    assert max_rate_meeting(t, "y", {"p99_ttft_ms": 200}) == 0.0


# --------------------------------------------------------- a scripted server
class _Scripted(BaseHTTPRequestHandler):
    """Streams a role chunk, a keep-alive comment, three content chunks 50 ms
    apart, a finish chunk and a usage chunk, like an OpenAI server."""

    protocol_version = "HTTP/1.1"
    bodies: list = []

    def log_message(self, *a):
        pass

    def do_GET(self):
        body = b"colibri:request_success_total 1\n" if self.path == "/metrics" else b"{}"
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers["Content-Length"])
        self.bodies.append(json.loads(self.rfile.read(n)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()

        def ev(obj):
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self.wfile.flush()

        ev({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
        time.sleep(0.1)
        self.wfile.write(b": keep-alive\n\n")
        for word in ("Hello", " there", "!"):
            ev({"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}], "usage": None})
            time.sleep(0.05)
        ev({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": None})
        ev({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3,
                                     "prompt_tokens_details": {"cached_tokens": 4}}})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


@pytest.fixture
def scripted():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    _Scripted.bodies = []
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def test_stream_chat_records_each_output_chunk(scripted):
    t = loadgen.Target(scripted, "m")
    tr = loadgen.stream_chat(t, loadgen.chat_body("m", [{"role": "user", "content": "hi"}], {"max_tokens": 3}))
    assert tr.error == "" and tr.status == 200 and tr.text == "Hello there!" and tr.finish_reason == "stop"
    assert len(tr.chunk_t) == 3                            # the role chunk and the comment are not tokens
    assert (tr.completion_tokens, tr.prompt_tokens, tr.cached_tokens) == (3, 9, 4)
    m = loadgen.trace_metrics(tr.t_send, tr.chunk_t, tr.t_done, tr.completion_tokens)
    assert m["ttft_ms"] >= 100.0                           # after the role chunk's 100 ms pause
    assert len(m["itl_ms"]) == 2 and all(40.0 <= x < 500.0 for x in m["itl_ms"])
    body = _Scripted.bodies[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True} and body["max_tokens"] == 3


def test_run_block_multi_turn_carries_history(scripted):
    from colibri_lab.experiments.workloads import load_workload

    wl = load_workload({"name": "w", "items": [{"id": "a", "turns": ["one", "two"], "system": "sys"},
                                               {"id": "b", "turns": ["three"]}]})
    blk = loadgen.run_block(loadgen.Target(scripted, "m"), wl, Arrival(kind="poisson", rate=20.0, seed=0),
                            {"max_tokens": 5, "temperature": 0.0}, seed=10, prefix="[tag] ", base={"variant": "v"})
    assert len(blk.rows) == 3 and all(r["error"] == "" for r in blk.rows)
    assert len(blk.gaps) == 3 * 2 and all(g["variant"] == "v" for g in blk.gaps)
    assert blk.metrics_delta["request_success"] == 0       # the scripted /metrics never moves
    by = {b["messages"][-1]["content"].removeprefix("[tag] "): b for b in _Scripted.bodies}
    two = by["two"]["messages"]
    assert [m["role"] for m in two] == ["system", "user", "assistant", "user"]
    assert two[0]["content"] == "[tag] sys" and two[2]["content"] == "Hello there!"
    assert by["three"]["messages"][0]["content"] == "[tag] three" and by["three"]["seed"] == 11
    turn1 = next(r for r in blk.rows if r["turn"] == 1)
    turn0 = next(r for r in blk.rows if r["prompt_id"] == "a" and r["turn"] == 0)
    assert turn1["t_submit_s"] >= turn0["t_done_s"]         # the next turn waits for the reply


def test_failed_request_is_a_row_with_its_error():
    t = loadgen.Target(f"http://127.0.0.1:{servers.free_port()}", "m", timeout_s=5)
    tr = loadgen.stream_chat(t, loadgen.chat_body("m", [{"role": "user", "content": "x"}], {}))
    assert "ConnectionRefused" in tr.error and tr.chunk_t == []
    with pytest.raises(ValueError, match="base_url"):
        loadgen.Target("localhost:8080", "m")


# ------------------------------------------------------------- llama.cpp
def test_llama_cpp_helper_says_why_it_is_unavailable(tmp_path):
    why = servers.llama_cpp_unavailable(str(tmp_path / "no-python"))
    assert "no interpreter" in why and servers.LLAMA_PYTHON_ENV in why
    with pytest.raises(servers.AnchorUnavailable, match="no interpreter"):
        servers.start_llama_cpp("unused.gguf", python=str(tmp_path / "no-python"))
    try:
        import llama_cpp.server  # noqa: F401
        have = True
    except ImportError:
        have = False
    if not have:   # this interpreter lacks the extra: the reason names it
        why = servers.llama_cpp_unavailable(sys.executable)
        assert "anchors" in why and sys.executable in why


def test_request_timeout_and_block_deadline_bound_the_time(scripted):
    from colibri_lab.experiments.workloads import load_workload

    slow = loadgen.Target(scripted, "m", timeout_s=0.12)      # the scripted stream takes ~0.25 s
    tr = loadgen.stream_chat(slow, loadgen.chat_body("m", [{"role": "user", "content": "x"}], {}))
    assert tr.error.startswith("timeout") and tr.t_done - tr.t_send < 1.0
    wl = load_workload({"name": "w", "items": [{"id": "a", "turns": ["1", "2"]}, {"id": "b", "turns": ["3"]}]})
    blk = loadgen.run_block(loadgen.Target(scripted, "m"), wl, Arrival(kind="poisson", rate=0.5, seed=0), {},
                            deadline_s=0.0, scrape=False)
    assert len(blk.rows) == 3 and all(r["error"].startswith("not sent") for r in blk.rows)
    assert loadgen.sustained(blk.rows) == (False, 0.0)
    assert loadgen.summary(blk.rows, blk.gaps, blk.duration_s)["failed"] == 3


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="no autogroup scheduling on this kernel")
def test_share_scheduling_group_gives_a_new_session_this_groups_weight():
    """A child in a session of its own gets the weight of its parent's scheduling group (nice 5 here:
    raising a group's nice needs no privilege), not the default nice 0 of a new session."""
    code = ("import subprocess, sys, pathlib\n"
            "pathlib.Path('/proc/self/autogroup').write_text('5')\n"
            "from colibri_lab.experiments.servers import share_scheduling_group\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'], start_new_session=True)\n"
            "before = pathlib.Path(f'/proc/{c.pid}/autogroup').read_text().split()[-1]\n"
            "ok = share_scheduling_group(c.pid)\n"
            "after = pathlib.Path(f'/proc/{c.pid}/autogroup').read_text().split()[-1]\n"
            "c.kill(); print(before, ok, after)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         start_new_session=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "True", "5"]
