#!/usr/bin/env python
"""Side-by-side benchmark of the colibri-lab engine against llama.cpp.

Both engines run the same GGUF file with the same thread count in the same
process (only one computes at a time), on the same token ids (tokenized once by
llama.cpp).  Measurements, each interleaved A B B A (ours, llama.cpp,
llama.cpp, ours) per round after a warm-up round:

  decode    single-stream greedy decode tok/s (timed around our step() and
            around llama_decode only), at each --threads value
  prefill   prompt of --prefill-tokens tokens, tok/s
  batched   llama-batched-bench shape: B sequences of PP prompt tokens each,
            then TG decode steps of one token per sequence with logits for
            every row; S_PP = B*PP/T_PP, S_TG = B*TG/T_TG (aggregate), and the
            per-stream time per output token T_TG/TG
  scaling   ours at B = --scaling-b streams vs ours at one stream, interleaved
            A B B A per round (the batched shape, S_TG of each): the
            8-vs-1 aggregate ratio with its own bootstrap interval, free of
            the machine's drift between the batched section's B values
  agree     greedy agreement over --agree-tokens tokens on 10 prompts: tokens
            equal until the first divergence, and total positions equal
  memory    resident set size (VmRSS) of a fresh process before/after model
            load, after engine/KV allocation and after a generation
  roofline  bytes of weights read per decode token / measured read bandwidth
            -> the fraction of the memory-bound limit each engine reaches

llama.cpp is driven through llama-cpp-python's low-level API (llama_batch_init,
llama_decode, llama_get_logits_ith), the most favourable way to time it: no
Python work inside the timed region.  Our engine is timed around
Engine.step(), which includes sampling and building the Python event list.

Usage (see docs/benchmarks.md for recorded runs):

  PYTHONPATH=/tmp/cb_perf python scripts/bench_engine.py --quick
  PYTHONPATH=/tmp/cb_perf python scripts/bench_engine.py --rounds 5 --json out.json

The script builds nothing: colibri_lab must import with its extension built.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil as bu  # noqa: E402

DEFAULT_MODEL = os.path.expanduser("~/.cache/colibri-lab/models/SmolLM2-135M-Instruct.Q4_1.gguf")

PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea.",
    "Explain why the sky is blue in two sentences.",
    "def fibonacci(n):",
    "List three uses of a paperclip:",
    "Once upon a time, in a small village,",
    "What is 17 times 23?",
    "Translate to French: I would like a cup of coffee.",
    "The three laws of thermodynamics are",
    "Summarize the plot of Romeo and Juliet.",
]

FILLER = ("In the early morning the harbour was quiet, and the fishermen checked their nets "
          "while the gulls circled above the grey water. The town had grown slowly over two "
          "centuries, first around the church, then along the road to the mill, and every "
          "family kept a story about the winter the river froze. ")


# ------------------------------------------------------------------ stats

def spread(xs):
    """(min, max) of a sample: the honest spread for a handful of repeats."""
    return (min(xs), max(xs)) if xs else (float("nan"), float("nan"))


def bootstrap_ratio(pairs, n_boot=2000, seed=0):
    """95% bootstrap interval of bu.median(a)/bu.median(b) over paired rounds."""
    if len(pairs) < 2:
        r = pairs[0][0] / pairs[0][1] if pairs else float("nan")
        return r, r
    rng = random.Random(seed)
    rs = []
    for _ in range(n_boot):
        s = [rng.choice(pairs) for _ in pairs]
        rs.append(bu.median([a for a, _ in s]) / bu.median([b for _, b in s]))
    rs.sort()
    return rs[int(0.025 * n_boot)], rs[int(0.975 * n_boot) - 1]


# ------------------------------------------------------------ llama.cpp

# llama.cpp opens the model with its default params (CPU weight repacking on)
# except on AMX CPUs, where it crashed (benchutil.llama_extra_bufts).
LLAMA_EXTRA_BUFTS = bu.llama_extra_bufts()


class LlamaCpp:
    """Minimal low-level llama.cpp driver: one context, explicit batches."""

    def __init__(self, path, n_threads, n_ctx, n_seq_max=1, n_batch=512, extra_bufts=None):
        if extra_bufts is None:
            extra_bufts = LLAMA_EXTRA_BUFTS
        import llama_cpp as L
        self.L = L
        L.llama_backend_init()
        self._log_cb = L.llama_log_callback(lambda level, text, user: None)
        L.llama_log_set(self._log_cb, ctypes.c_void_p())
        mp = L.llama_model_default_params()
        mp.use_extra_bufts = extra_bufts
        self.model = L.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = n_batch
        cp.n_seq_max = n_seq_max
        cp.n_threads = n_threads
        cp.n_threads_batch = n_threads
        cp.kv_unified = True
        cp.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_batch = n_batch
        self.batch = L.llama_batch_init(n_batch, 0, n_seq_max)

    def close(self):
        L = self.L
        if self.ctx:
            L.llama_batch_free(self.batch)
            L.llama_free(self.ctx)
            L.llama_model_free(self.model)
            self.ctx = None

    def tokenize(self, text, special=True):
        L = self.L
        b = text.encode()
        buf = (L.llama_token * (len(b) + 16))()
        n = L.llama_tokenize(self.vocab, b, len(b), buf, len(buf), False, special)
        if n < 0:
            raise RuntimeError("tokenize failed")
        return list(buf[:n])

    def clear(self):
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)

    def decode(self, rows):
        """rows: [(token, pos, seq, want_logits)]; returns seconds spent in llama_decode."""
        L, b = self.L, self.batch
        if len(rows) > self.n_batch:
            raise ValueError("batch too large")
        for i, (tok, pos, seq, lg) in enumerate(rows):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = 1 if lg else 0
        b.n_tokens = len(rows)
        t0 = time.perf_counter()
        rc = L.llama_decode(self.ctx, b)
        L.llama_synchronize(self.ctx)
        dt = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        return dt

    def argmax(self, i):
        """Greedy token from the logits of batch row i of the last decode (-1: last output)."""
        import numpy as np
        p = self.L.llama_get_logits_ith(self.ctx, i)
        return int(np.ctypeslib.as_array(p, shape=(self.n_vocab,)).argmax())

    def prefill(self, tokens, seq=0, pos0=0):
        """Prompt in n_batch chunks, logits on the last token; returns seconds."""
        t = 0.0
        for i in range(0, len(tokens), self.n_batch):
            chunk = tokens[i:i + self.n_batch]
            last = i + len(chunk) == len(tokens)
            t += self.decode([(tok, pos0 + i + j, seq, last and j == len(chunk) - 1)
                              for j, tok in enumerate(chunk)])
        return t


def llama_decode_run(lc, prompt, n_gen):
    """Greedy decode; returns (tokens, decode seconds)."""
    lc.clear()
    lc.prefill(prompt)
    tok = lc.argmax(-1)
    out, t = [tok], 0.0
    pos = len(prompt)
    for _ in range(n_gen - 1):
        t += lc.decode([(tok, pos, 0, True)])
        pos += 1
        tok = lc.argmax(-1)
        out.append(tok)
    return out, t


def llama_prefill_run(lc, prompt):
    lc.clear()
    return lc.prefill(prompt)


def llama_batched_run(lc, prompts, tg):
    """B sequences: all prompts in one batch (the context's n_batch must hold
    them), then tg steps of one token per sequence with logits for every row."""
    lc.clear()
    rows, last = [], []
    for s, p in enumerate(prompts):
        rows += [(tok, j, s, j == len(p) - 1) for j, tok in enumerate(p)]
        last.append(len(rows) - 1)
    t_pp = lc.decode(rows)
    B = len(prompts)
    toks = [lc.argmax(last[s]) for s in range(B)]
    pos = [len(p) for p in prompts]
    t_tg = 0.0
    for _ in range(tg):
        t_tg += lc.decode([(toks[s], pos[s], s, True) for s in range(B)])
        toks = [lc.argmax(s) for s in range(B)]
        pos = [p + 1 for p in pos]
    return t_pp, t_tg


# ----------------------------------------------------------------- ours

def make_engine(model, n_threads, n_slots=1, n_ctx=1024, n_batch=512):
    from colibri_lab import _engine
    # COLIBRI_LAB_SIMD=avx2|scalar forces our level (the header's simd is the CPU's best)
    return _engine.Engine(model, n_slots=n_slots, n_ctx=n_ctx, n_threads=n_threads,
                          n_batch=n_batch, prefix_reuse=False, simd=os.environ.get("COLIBRI_LAB_SIMD", "auto"))


PROFILE_KEYS = ("matmul_ms", "attention_ms", "lm_head_ms", "sampling_ms", "other_ms", "step_ms")


def ours_run(eng, prompts, max_tokens):
    """Submit every prompt (one per slot), step until done.  Returns
    (tokens per request, prefill seconds, decode seconds, decode steps,
    per-phase ms summed over decode steps)."""
    ids = [eng.submit(p, max_tokens=max_tokens, ignore_eos=True) for p in prompts]
    out = {i: [] for i in ids}
    t_pp = t_tg = 0.0
    n_tg = 0
    prof = dict.fromkeys(PROFILE_KEYS, 0.0)
    while eng.pending:
        t0 = time.perf_counter()
        evs = eng.step()
        dt = time.perf_counter() - t0
        s = eng.last_step()
        if s["rows_prefill"] > 0:
            t_pp += dt
        elif s["rows_decode"] > 0:
            t_tg += dt
            n_tg += 1
            for k in PROFILE_KEYS:
                prof[k] += s[k]
        for e in evs:
            if e["type"] == "token":
                out[e["id"]].append(e["token"])
            elif e["type"] == "error":
                raise RuntimeError(e["message"])
    return [out[i] for i in ids], t_pp, t_tg, n_tg, prof


# -------------------------------------------------------------- sections

def abba(rounds, run_a, run_b, warmup=1):
    """Interleave A B B A per round after `warmup` untimed rounds of each.
    Returns lists of per-run values for A and B and the per-round pairs."""
    for _ in range(warmup):
        run_a(); run_b()
    va, vb, pairs = [], [], []
    for _ in range(rounds):
        a1 = run_a(); b1 = run_b(); b2 = run_b(); a2 = run_a()
        va += [a1, a2]; vb += [b1, b2]
        pairs.append(((a1 + a2) / 2, (b1 + b2) / 2))
    return va, vb, pairs


def summarize(name, va, vb, pairs, unit):
    ma, mb = bu.median(va), bu.median(vb)
    lo, hi = bootstrap_ratio(pairs)
    print(f"  [{time.strftime('%H:%M:%S')}] {name}: ours {ma:.1f}, llama.cpp {mb:.1f}, ratio {ma / mb:.2f}"
          f" [{lo:.2f}, {hi:.2f}], load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    return {"name": name, "unit": unit, "ours_median": ma, "ours_spread": spread(va),
            "llama_median": mb, "llama_spread": spread(vb), "ratio": ma / mb,
            "ratio_ci95": (lo, hi), "ours_runs": va, "llama_runs": vb}


def section_decode(args, model, lc_by_t, prompt, results):
    for nt in args.threads:
        eng = make_engine(model, nt, n_ctx=len(prompt) + args.decode_tokens + 8)
        lc = lc_by_t[nt]
        prof_acc = []

        def run_a():
            _, _, t_tg, n_tg, prof = ours_run(eng, [prompt], args.decode_tokens + 1)
            prof_acc.append({k: v / max(n_tg, 1) for k, v in prof.items()})
            return n_tg / t_tg

        def run_b():
            _, t = llama_decode_run(lc, prompt, args.decode_tokens + 1)
            return args.decode_tokens / t

        va, vb, pairs = abba(args.rounds, run_a, run_b)
        r = summarize(f"decode tok/s, {nt} thread(s)", va, vb, pairs, "tok/s")
        r["profile_ms_per_token"] = {k: bu.median([p[k] for p in prof_acc[1:]]) for k in PROFILE_KEYS}
        results.append(r)
        eng.close()


def section_prefill(args, model, lc_by_t, prompt, results):
    for nt in args.threads:
        eng = make_engine(model, nt, n_ctx=len(prompt) + 8, n_batch=max(512, len(prompt)))
        lc = lc_by_t[nt]

        def run_a():
            _, t_pp, _, _, _ = ours_run(eng, [prompt], 1)
            return len(prompt) / t_pp

        def run_b():
            return len(prompt) / llama_prefill_run(lc, prompt)

        va, vb, pairs = abba(args.rounds, run_a, run_b)
        results.append(summarize(f"prefill {len(prompt)} tok, tok/s, {nt} thread(s)", va, vb, pairs, "tok/s"))
        eng.close()


def section_batched(args, model, path, prompts_pool, results, table):
    pp, tg = args.batched_pp, args.batched_tg
    for nt in args.batched_threads:
        for B in args.batch_sizes:
            prompts = [prompts_pool[s % len(prompts_pool)][:pp] for s in range(B)]
            eng = make_engine(model, nt, n_slots=B, n_ctx=pp + tg + 8, n_batch=max(512, B))
            lc = LlamaCpp(path, nt, n_ctx=B * (pp + tg + 8) + 64, n_seq_max=max(B, 1),
                          n_batch=max(512, B * pp))
            rec = {"a_pp": [], "a_tg": [], "b_pp": [], "b_tg": []}

            def run_a():
                _, t_pp, t_tg, n_tg, _ = ours_run(eng, prompts, tg + 1)
                rec["a_pp"].append(B * pp / t_pp)
                return B * n_tg / t_tg

            def run_b():
                t_pp, t_tg = llama_batched_run(lc, prompts, tg)
                rec["b_pp"].append(B * pp / t_pp)
                return B * tg / t_tg

            va, vb, pairs = abba(args.batched_rounds, run_a, run_b)
            r = summarize(f"batched decode S_TG, B={B}, {nt} thread(s)", va, vb, pairs, "tok/s")
            r.update(B=B, PP=pp, TG=tg, threads=nt,
                     ours_S_PP=bu.median(rec["a_pp"][1:]), llama_S_PP=bu.median(rec["b_pp"][1:]),
                     ours_ms_per_token_per_stream=1e3 * B / r["ours_median"],
                     llama_ms_per_token_per_stream=1e3 * B / r["llama_median"])
            results.append(r)
            table.append(r)
            eng.close()
            lc.close()


def section_scaling(args, model, prompts_pool, results):
    """Ours at B streams vs ours at one stream, ABBA-interleaved: the ratio of
    aggregate S_TG (the issue's "8 streams vs 1" target) from paired rounds."""
    pp, tg, B = args.batched_pp, args.batched_tg, args.scaling_b
    for nt in args.batched_threads:
        engs = {b: make_engine(model, nt, n_slots=b, n_ctx=pp + tg + 8, n_batch=max(512, b)) for b in (B, 1)}
        prompts = {b: [prompts_pool[s % len(prompts_pool)][:pp] for s in range(b)] for b in (B, 1)}
        prof = {B: [], 1: []}

        def run(b):
            _, _, t_tg, n_tg, p = ours_run(engs[b], prompts[b], tg + 1)
            prof[b].append({k: v / n_tg for k, v in p.items()})
            return b * n_tg / t_tg

        va, vb, pairs = abba(args.scaling_rounds, lambda: run(B), lambda: run(1))
        lo, hi = bootstrap_ratio(pairs)
        ma, mb = bu.median(va), bu.median(vb)
        print(f"  [{time.strftime('%H:%M:%S')}] aggregate decode, {B} streams vs 1 (ours, {nt} thread(s)):"
              f" {ma:.1f} vs {mb:.1f} tok/s, ratio {ma / mb:.2f} [{lo:.2f}, {hi:.2f}], load {os.getloadavg()[0]:.1f}",
              file=sys.stderr, flush=True)
        results.append({"name": f"scaling S_TG, B={B} vs B=1, {nt} thread(s)", "B": B, "threads": nt,
                        "PP": pp, "TG": tg, "b_median": ma, "b_spread": spread(va), "one_median": mb,
                        "one_spread": spread(vb), "scaling": ma / mb, "scaling_ci95": (lo, hi),
                        "b_runs": va, "one_runs": vb,
                        "profile_ms_per_step": {b: {k: bu.median([p[k] for p in prof[b]]) for k in PROFILE_KEYS}
                                                for b in (B, 1)}})
        for e in engs.values():
            e.close()


def llama_all_logits(lc, tokens):
    """Logits of every position (teacher forcing), [n, n_vocab] float32."""
    import numpy as np
    lc.clear()
    out = np.empty((len(tokens), lc.n_vocab), dtype=np.float32)
    for i in range(0, len(tokens), lc.n_batch):
        chunk = tokens[i:i + lc.n_batch]
        lc.decode([(t, i + j, 0, True) for j, t in enumerate(chunk)])
        for j in range(len(chunk)):
            p = lc.L.llama_get_logits_ith(lc.ctx, j)
            out[i + j] = np.ctypeslib.as_array(p, shape=(lc.n_vocab,))
    return out


def section_agree(args, model, lc, prompts, results):
    """Free-running greedy agreement, then a teacher-forced comparison on
    llama.cpp's own continuation: both engines score the same token sequence,
    so every position is compared (argmax equal?, max |logit difference|,
    and llama.cpp's top-1 minus top-2 margin where the argmax differs)."""
    import numpy as np
    eng = make_engine(model, args.threads[0], n_ctx=max(len(p) for p in prompts) + args.agree_tokens + 8)
    rows = []
    for p in prompts:
        ours, *_ = ours_run(eng, [p], args.agree_tokens)
        ref, _ = llama_decode_run(lc, p, args.agree_tokens)
        ours = ours[0]
        first = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
        eq = sum(a == b for a, b in zip(ours, ref))
        seq = list(p) + list(ref[:-1])
        lo = eng.forward(0, seq, 0)[len(p) - 1:]
        ll = llama_all_logits(lc, seq)[len(p) - 1:]
        eng.slot_clear(0)
        am_o, am_l = lo.argmax(1), ll.argmax(1)
        mism = np.nonzero(am_o != am_l)[0]
        srt = np.sort(ll, axis=1)
        margins = (srt[:, -1] - srt[:, -2])[mism]
        rows.append({"prompt_tokens": len(p), "prefix_equal": first, "positions_equal": eq,
                     "n": min(len(ours), len(ref)),
                     "tf_argmax_equal": int((am_o == am_l).sum()), "tf_positions": int(len(am_o)),
                     "tf_max_abs_logit_diff": float(np.abs(lo - ll).max()),
                     "tf_mean_abs_logit_diff": float(np.abs(lo - ll).mean()),
                     "tf_mismatch_llama_margins": [float(m) for m in margins]})
    eng.close()
    tf_eq = sum(r["tf_argmax_equal"] for r in rows)
    tf_n = sum(r["tf_positions"] for r in rows)
    results.append({"name": f"greedy agreement over {args.agree_tokens} tokens", "rows": rows,
                    "identical_prompts": sum(r["prefix_equal"] == r["n"] for r in rows),
                    "mean_prefix_equal": statistics.mean(r["prefix_equal"] for r in rows),
                    "tf_argmax_equal": tf_eq, "tf_positions": tf_n,
                    "tf_max_abs_logit_diff": max(r["tf_max_abs_logit_diff"] for r in rows),
                    "tf_max_mismatch_margin": max([m for r in rows for m in r["tf_mismatch_llama_margins"]] or [0.0])})


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def memory_child(which, path, n_ctx, n_threads):
    """Runs in a fresh process: prints a JSON line of RSS checkpoints."""
    import numpy  # noqa: F401  (import cost counted in 'start' for both)
    out = {"start": rss_mib()}
    prompt = list(range(100, 164))
    if which == "ours":
        from colibri_lab import _engine
        out["after_import"] = rss_mib()
        m = _engine.Model(path)
        out["after_load"] = rss_mib()
        e = _engine.Engine(m, n_slots=1, n_ctx=n_ctx, n_threads=n_threads)
        out["after_engine"] = rss_mib()
        I = m.info
        elt = 2 if e.params["kv_f16"] else 4  # bytes per cached element
        out["kv_mib"] = 2 * I["n_layer"] * n_ctx * I["n_head_kv"] * I["head_dim"] * elt / 2**20
        ours_run(e, [prompt], 64)
        out["after_generate"] = rss_mib()
    else:
        import llama_cpp  # noqa: F401
        out["after_import"] = rss_mib()
        lc = LlamaCpp(path, n_threads, n_ctx=n_ctx)
        out["after_engine"] = rss_mib()
        llama_decode_run(lc, prompt, 64)
        out["after_generate"] = rss_mib()
    with open(f"/proc/{os.getpid()}/status") as f:
        out["VmHWM"] = next(int(l.split()[1]) / 1024.0 for l in f if l.startswith("VmHWM:"))
    print(json.dumps(out))


def section_memory(args, path, results):
    rows = {}
    for which in ("ours", "llama"):
        cp = subprocess.run([sys.executable, __file__, "--_memory-child", which, "--model", path,
                             "--memory-ctx", str(args.memory_ctx)],
                            capture_output=True, text=True, env=os.environ.copy())
        if cp.returncode != 0:
            raise RuntimeError(cp.stderr[-2000:])
        rows[which] = json.loads(cp.stdout.strip().splitlines()[-1])
    file_mib = os.path.getsize(path) / 2**20
    o = rows["ours"]
    budget = file_mib + o["kv_mib"] + 64
    results.append({"name": f"resident memory, n_ctx={args.memory_ctx}, 1 slot", "file_mib": file_mib,
                    "ours": o, "llama": rows["llama"], "budget_mib": budget,
                    "ours_rss_minus_start": o["after_generate"] - o["start"],
                    "within_budget": o["after_generate"] - o["start"] <= budget})


_BANDWIDTH_CHILD = r"""
import sys, threading, time
import numpy as np
nbytes, threads, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
n = nbytes // 8 // threads
parts = [(np.ones(n, dtype=np.float32), np.ones(n, dtype=np.float32)) for _ in range(threads)]
c = np.empty(n * threads, dtype=np.float32)
src = np.ones(n * threads, dtype=np.float32)
start = threading.Barrier(threads + 1)
def reader(a, b):
    for _ in range(reps):
        start.wait(); float(np.dot(a, b)); start.wait()
ts = [threading.Thread(target=reader, args=ab) for ab in parts]
for t in ts: t.start()
best_r = best_c = 1e9
for _ in range(reps):
    start.wait(); t0 = time.perf_counter(); start.wait(); best_r = min(best_r, time.perf_counter() - t0)
for t in ts: t.join()
for _ in range(reps):
    t0 = time.perf_counter(); np.copyto(c, src); best_c = min(best_c, time.perf_counter() - t0)
print(2 * 4 * n * threads / best_r / 1e9, 2 * 4 * n * threads / best_c / 1e9)
"""


def measure_bandwidth(nbytes, threads=1, reps=5):
    """Read bandwidth of `threads` threads (each an np.dot of two float32
    halves of its own slice: a pure streaming read) and one thread's copy
    bandwidth (read + write counted), GB/s.  In a child with BLAS held to one
    thread per call (OpenBLAS would otherwise split a long dot over every
    core, and a "one-thread" read would be the machine's)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", _BANDWIDTH_CHILD, str(nbytes), str(threads), str(reps)],
                         capture_output=True, text=True, env=env, check=True).stdout.split()
    return float(out[0]), float(out[1])


def section_roofline(args, model, results, decode_results):
    info = model.info
    wbytes = info["weight_bytes"]
    # the embedding table is only gathered (one row per token); the tied head reads it whole
    rd_model, cp_model = measure_bandwidth(wbytes)          # a model-sized working set (may sit in L3)
    rd_dram, cp_dram = measure_bandwidth(1 << 30, reps=3)   # 1 GiB: beyond any cache
    rows = []
    read_by_threads = {1: rd_model}   # the read bandwidth of as many threads as a decode row used
    for r in decode_results:
        nt = int(r["name"].split(",")[1].split()[0])
        if nt not in read_by_threads:
            read_by_threads[nt] = measure_bandwidth(wbytes, threads=nt)[0]
        rd_t = read_by_threads[nt]
        rows.append({"threads": nt, "ours_tok_s": r["ours_median"], "llama_tok_s": r["llama_median"],
                     "read_GBps": rd_t, "limit_tok_s": rd_t * 1e9 / wbytes,
                     "ours_GBps": r["ours_median"] * wbytes / 1e9, "llama_GBps": r["llama_median"] * wbytes / 1e9})
    results.append({"name": "roofline", "weight_bytes_per_token": wbytes,
                    "read_GBps_model_sized_1thread": rd_model, "copy_GBps_model_sized": cp_model,
                    "read_GBps_1GiB_1thread": rd_dram, "copy_GBps_1GiB": cp_dram,
                    "limit_tok_s_model_sized": rd_model * 1e9 / wbytes,
                    "limit_tok_s_1GiB": rd_dram * 1e9 / wbytes,
                    "rows": rows})


# ------------------------------------------------------------------ main

def machine():
    """benchutil's machine header plus the load average at the start."""
    m = bu.machine_info(None)
    m["loadavg_start"] = os.getloadavg()
    return m


def fmt(x, nd=1):
    return f"{x:.{nd}f}"


def print_report(res, mach):
    print(f"\nmachine: {mach['cpu']}, {mach['cores']} cores, simd {mach['simd']}, commit {mach['commit'][:12]}, "
          f"{mach['date']}, load {mach['loadavg_start']} -> {mach.get('loadavg_end')}, "
          f"llama.cpp use_extra_bufts {LLAMA_EXTRA_BUFTS}, ours simd {os.environ.get('COLIBRI_LAB_SIMD', 'auto')}")
    print(f"{'measurement':48s} {'ours (min..max)':>24s} {'llama.cpp (min..max)':>24s} {'ratio [95% CI]':>20s}")
    for r in res:
        if "ratio" in r:
            oa, ob = r["ours_spread"], r["llama_spread"]
            print(f"{r['name']:48s} {fmt(r['ours_median']):>8s} ({fmt(oa[0])}..{fmt(oa[1])})"
                  f" {fmt(r['llama_median']):>8s} ({fmt(ob[0])}..{fmt(ob[1])})"
                  f"   {r['ratio']:.2f} [{r['ratio_ci95'][0]:.2f}, {r['ratio_ci95'][1]:.2f}]")
            if "profile_ms_per_token" in r:
                p = r["profile_ms_per_token"]
                print("    ours per decode token (ms): " + ", ".join(f"{k[:-3]} {v:.2f}" for k, v in p.items()))
            if "B" in r:
                print(f"    PP={r['PP']} TG={r['TG']}: S_PP ours {r['ours_S_PP']:.0f} llama {r['llama_S_PP']:.0f} tok/s;"
                      f" per-stream ms/token ours {r['ours_ms_per_token_per_stream']:.2f}"
                      f" llama {r['llama_ms_per_token_per_stream']:.2f}")
        elif "scaling" in r:
            print(f"{r['name']}: {fmt(r['b_median'])} ({fmt(r['b_spread'][0])}..{fmt(r['b_spread'][1])}) vs "
                  f"{fmt(r['one_median'])} ({fmt(r['one_spread'][0])}..{fmt(r['one_spread'][1])}) tok/s,"
                  f" ratio {r['scaling']:.2f} [{r['scaling_ci95'][0]:.2f}, {r['scaling_ci95'][1]:.2f}]")
            for b, p in r["profile_ms_per_step"].items():
                print(f"    B={b} per decode step (ms): " + ", ".join(f"{k[:-3]} {v:.2f}" for k, v in p.items()))
        elif r["name"] == "roofline":
            print(f"roofline: {r['weight_bytes_per_token'] / 1e6:.1f} MB of weights per token; one-thread read "
                  f"{r['read_GBps_model_sized_1thread']:.1f} GB/s (model-sized buffer), {r['read_GBps_1GiB_1thread']:.1f} GB/s (1 GiB)"
                  f" -> limit {r['limit_tok_s_model_sized']:.0f} / {r['limit_tok_s_1GiB']:.0f} tok/s")
            for row in r["rows"]:
                print(f"    {row['threads']} thread(s): read {row['read_GBps']:.1f} GB/s (limit {row['limit_tok_s']:.1f} tok/s);"
                      f" ours {row['ours_GBps']:.1f} GB/s ({100 * row['ours_tok_s'] / row['limit_tok_s']:.0f}% of the limit), "
                      f"llama.cpp {row['llama_GBps']:.1f} GB/s ({100 * row['llama_tok_s'] / row['limit_tok_s']:.0f}%)")
        elif "rows" in r and "identical_prompts" in r:
            print(f"{r['name']}: {r['identical_prompts']}/{len(r['rows'])} prompts identical; first divergence at "
                  + ", ".join(str(x["prefix_equal"]) for x in r["rows"])
                  + "; positions equal " + ", ".join(str(x["positions_equal"]) for x in r["rows"]))
            print(f"    teacher-forced on llama.cpp's continuation: argmax equal at {r['tf_argmax_equal']}/{r['tf_positions']} positions;"
                  f" max |logit diff| {r['tf_max_abs_logit_diff']:.3f}; where the argmax differs, llama.cpp's top-1/top-2 margin"
                  f" is at most {r['tf_max_mismatch_margin']:.3f}")
        elif "file_mib" in r:
            o, l = r["ours"], r["llama"]
            print(f"{r['name']}: file {r['file_mib']:.1f} MiB, our KV {o['kv_mib']:.1f} MiB, budget {r['budget_mib']:.1f} MiB")
            print(f"    ours RSS MiB: start {o['start']:.0f}, import {o['after_import']:.0f}, load {o['after_load']:.0f}, "
                  f"engine {o['after_engine']:.0f}, after generate {o['after_generate']:.0f} (growth {r['ours_rss_minus_start']:.0f}, "
                  f"{'within' if r['within_budget'] else 'OVER'} budget), peak {o['VmHWM']:.0f}")
            print(f"    llama.cpp RSS MiB: start {l['start']:.0f}, import {l['after_import']:.0f}, context {l['after_engine']:.0f}, "
                  f"after generate {l['after_generate']:.0f}, peak {l['VmHWM']:.0f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--quick", action="store_true", help="small CI-friendly run")
    ap.add_argument("--sections", default="decode,prefill,batched,scaling,agree,memory,roofline")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5, help="ABBA rounds per measurement")
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--batch-sizes", default="1,2,4,8,16")
    ap.add_argument("--batched-threads", default="2")
    ap.add_argument("--batched-pp", type=int, default=32)
    ap.add_argument("--batched-tg", type=int, default=64)
    ap.add_argument("--batched-rounds", type=int, default=3)
    ap.add_argument("--scaling-b", type=int, default=8, help="streams compared with one in the scaling section")
    ap.add_argument("--scaling-rounds", type=int, default=8)
    ap.add_argument("--agree-tokens", type=int, default=64)
    ap.add_argument("--memory-ctx", type=int, default=2048)
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--_memory-child", dest="memory_child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.memory_child:
        memory_child(args.memory_child, args.model, args.memory_ctx, 1)
        return 0
    if args.quick:
        args.rounds = min(args.rounds, 2)
        args.decode_tokens = min(args.decode_tokens, 32)
        args.prefill_tokens = min(args.prefill_tokens, 128)
        args.batch_sizes = "1,4"
        args.batched_tg = min(args.batched_tg, 16)
        args.batched_rounds = 1
        args.scaling_rounds = 1
        args.scaling_b = 4
        args.agree_tokens = min(args.agree_tokens, 16)
        args.memory_ctx = min(args.memory_ctx, 512)
    args.threads = [int(x) for x in args.threads.split(",")]
    args.batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
    args.batched_threads = [int(x) for x in args.batched_threads.split(",")]
    sections = set(args.sections.split(","))

    from colibri_lab import _engine, models
    args.model = str(models.resolve(args.model))  # an alias (qwen2.5-coder-1.5b) or a GGUF path
    mach = machine()
    model = _engine.Model(args.model)
    need_lc = sections & {"decode", "prefill", "agree", "roofline"}
    lc_by_t = {nt: LlamaCpp(args.model, nt, n_ctx=max(1024, args.prefill_tokens + 16)) for nt in args.threads} if need_lc else {}
    tok_lc = lc_by_t[args.threads[0]] if lc_by_t else LlamaCpp(args.model, 1, n_ctx=64)

    chat = [tok_lc.tokenize(f"<|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n") for p in PROMPTS]
    long_ids = tok_lc.tokenize(FILLER * 40)
    decode_prompt = chat[1]
    prefill_prompt = long_ids[:args.prefill_tokens]
    # distinct prompts per batched sequence: the long text at different offsets
    pool = [long_ids[37 * s: 37 * s + args.batched_pp] for s in range(16)]

    results, batched = [], []
    t_start = time.time()
    if "decode" in sections:
        section_decode(args, model, lc_by_t, decode_prompt, results)
    if "prefill" in sections:
        section_prefill(args, model, lc_by_t, prefill_prompt, results)
    if "batched" in sections:
        section_batched(args, model, args.model, pool, results, batched)
    if "scaling" in sections:
        section_scaling(args, model, pool, results)
    if "agree" in sections:
        section_agree(args, model, tok_lc, chat, results)
    if "memory" in sections:
        section_memory(args, args.model, results)
    if "roofline" in sections:
        dec = [r for r in results if r.get("name", "").startswith("decode tok/s")]
        section_roofline(args, model, results, dec)
    mach["loadavg_end"] = os.getloadavg()
    mach["wall_s"] = time.time() - t_start
    mach["args"] = {k: v for k, v in vars(args).items() if k != "memory_child"}
    print_report(results, mach)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": mach, "results": results}, f, indent=1, default=str)
    # llama.cpp contexts are left to process exit: freeing them here crashed
    # (SIGSEGV in llama_batch_free after other contexts were used).
    return 0


if __name__ == "__main__":
    sys.exit(main())
