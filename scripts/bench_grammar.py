#!/usr/bin/env python
"""Grammar-constrained decoding (issue 4): per-token mask time and compile
time for realistic JSON schemas on SmolLM2's vocabulary, side by side with
xgrammar and llguidance, and end-to-end decode tok/s under a JSON schema vs
unconstrained.

    python scripts/bench_grammar.py [--model smollm2] [--threads 2] [--passes 3] [--quick]
                                    [--out docs/bench/grammar.md]

xgrammar and llguidance are optional imports (they need torch/transformers;
install them in a virtualenv with --system-site-packages: `pip install
torch==2.13.0` then `pip install xgrammar llguidance transformers`, and run
this script with that virtualenv's python).  A missing anchor is reported,
not fatal.

Mask benchmark.  For each schema, each valid instance in
tests/fixtures/schemas/instances/<name>.json is serialized with json.dumps and
tokenized by the model's tokenizer; every engine walks that same token
sequence: fill the next-token mask (timed with perf_counter_ns around the
one call), check the token is allowed, accept it; one more mask after the
last token (where EOS must be allowed).  Ours is called through ctypes on the
same C functions the engine uses (cb_matcher_fill_mask into a uint32 bitmask,
no numpy conversion); xgrammar through GrammarMatcher.fill_next_token_bitmask
into its int32 bitmask; llguidance through llguidance.numpy
.fill_next_token_bitmask.  Each walk is repeated --passes times, the engines
in rotating order; the per-position median over passes is the sample.  All
single-threaded.  Compile time: ours cb_grammar_compile (GBNF from
colibri_lab.schema.schema_to_gbnf; conversion time reported separately);
xgrammar GrammarCompiler(max_threads=1, cache off).compile_json_schema;
llguidance grammar_from_json_schema + LLMatcher construction.  Compile is
repeated --passes times, median taken per schema.
Targets: our p50 <= xgrammar's p50 and our p99 <= llguidance's p99.

End-to-end.  For a subset of schemas, a chat prompt asking for an instance;
constrained greedy decoding (json_schema) to completion, then unconstrained
greedy decoding of the same prompt for the same number of tokens
(ignore_eos); decode tok/s = completion tokens / decode time; paired by
prompt, arms ABBA over repeats.  Target: constrained/unconstrained >= 0.9.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil as bu  # noqa: E402

SCHEMA_DIR = os.path.join(bu.ROOT, "tests", "fixtures", "schemas")
# realistic schemas: tool calls, API objects, nested records (18)
SCHEMAS = ["address", "calendar_event", "chat_message", "code_interpreter_tool", "entities", "file_ops_tool",
           "movie_review", "multi_tool_call", "nested_config", "openai_strict_function", "order_items",
           "person", "product", "pydantic_invoice", "recipe", "search_tool", "send_email_tool", "weather_tool"]
E2E_SCHEMAS = ["person", "address", "movie_review", "weather_tool", "product", "calendar_event",
               "order_items", "recipe"]


class Ours:
    """The engine's grammar matcher called through ctypes (same C code as the engine)."""
    name = "colibri"

    def __init__(self, model_path, n_vocab):
        from colibri_lab import _engine
        self.lib = L = ctypes.CDLL(_engine.__file__)
        L.cb_model_load.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                    ctypes.c_char_p, ctypes.c_size_t]
        L.cb_grammar_compile.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                         ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_size_t]
        L.cb_grammar_free.argtypes = [ctypes.c_void_p]
        L.cb_matcher_new.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        L.cb_matcher_free.argtypes = [ctypes.c_void_p]
        L.cb_matcher_fill_mask.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        L.cb_matcher_accept.argtypes = [ctypes.c_void_p, ctypes.c_int]
        L.cb_matcher_is_accepting.argtypes = [ctypes.c_void_p]
        params = ctypes.c_int(0)  # cb_model_params {int validate_only}
        self.model = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        rc = L.cb_model_load(model_path.encode(), ctypes.byref(params), ctypes.byref(self.model), err, 512)
        if rc != 0:
            raise RuntimeError(err.value.decode())
        self.n_vocab = n_vocab
        self.mask = (ctypes.c_uint32 * ((n_vocab + 31) // 32))()
        self.mask_p = ctypes.cast(self.mask, ctypes.c_void_p)

    def compile(self, schema, gbnf):
        g = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        b = gbnf.encode()
        t0 = time.perf_counter_ns()
        rc = self.lib.cb_grammar_compile(self.model, b, len(b), ctypes.byref(g), err, 512)
        t = time.perf_counter_ns() - t0
        if rc != 0:
            raise RuntimeError(err.value.decode())
        return g, t

    def free(self, g):
        self.lib.cb_grammar_free(g)

    def walk(self, g, tokens, eos):
        m = ctypes.c_void_p()
        if self.lib.cb_matcher_new(g, ctypes.byref(m)) != 0:
            raise RuntimeError("cb_matcher_new failed")
        fill, acc, mp, mask = self.lib.cb_matcher_fill_mask, self.lib.cb_matcher_accept, self.mask_p, self.mask
        times, bad = [], None
        try:
            for i, t in enumerate(tokens + [eos]):
                t0 = time.perf_counter_ns()
                fill(m, mp)
                times.append(time.perf_counter_ns() - t0)
                if not (mask[t >> 5] >> (t & 31)) & 1:
                    bad = i
                    break
                if i < len(tokens) and acc(m, t) != 0:
                    bad = i
                    break
        finally:
            self.lib.cb_matcher_free(m)
        return times, bad


class XGrammar:
    name = "xgrammar"

    def __init__(self, hf_tok, n_vocab, eos):
        import xgrammar as xgr
        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(hf_tok, vocab_size=n_vocab, stop_token_ids=[eos])
        self.bitmask = xgr.allocate_token_bitmask(1, n_vocab)
        self.bm = self.bitmask.numpy()

    def compile(self, schema, gbnf):
        comp = self.xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        s = json.dumps(schema)
        t0 = time.perf_counter_ns()
        g = comp.compile_json_schema(s, any_whitespace=True, strict_mode=False)
        return g, time.perf_counter_ns() - t0

    def free(self, g):
        pass

    def walk(self, g, tokens, eos):
        m = self.xgr.GrammarMatcher(g)
        fill, bitmask, bm = m.fill_next_token_bitmask, self.bitmask, self.bm
        times, bad = [], None
        for i, t in enumerate(tokens + [eos]):
            t0 = time.perf_counter_ns()
            fill(bitmask)
            times.append(time.perf_counter_ns() - t0)
            if not (int(bm[0, t >> 5]) >> (t & 31)) & 1:
                bad = i
                break
            if i < len(tokens) and not m.accept_token(t):
                bad = i
                break
        return times, bad


class LLGuidance:
    name = "llguidance"

    def __init__(self, hf_tok, n_vocab, eos):
        import llguidance
        import llguidance.hf
        import llguidance.numpy as lln
        self.llg, self.lln = llguidance, lln
        self.tok = llguidance.hf.from_tokenizer(hf_tok, n_vocab=n_vocab, eos_token=eos)
        self.bitmask = lln.allocate_token_bitmask(1, n_vocab)

    def compile(self, schema, gbnf):
        L = self.llg.LLMatcher
        t0 = time.perf_counter_ns()
        grm = L.grammar_from_json_schema(schema, defaults={"whitespace_flexible": True})
        m = L(self.tok, grm, log_level=0)
        t = time.perf_counter_ns() - t0
        if m.is_error():
            raise RuntimeError(m.get_error())
        return grm, t

    def free(self, g):
        pass

    def walk(self, grm, tokens, eos):
        m = self.llg.LLMatcher(self.tok, grm, log_level=0)
        fill, bitmask = self.lln.fill_next_token_bitmask, self.bitmask
        times, bad = [], None
        for i, t in enumerate(tokens + [eos]):
            t0 = time.perf_counter_ns()
            fill(m, bitmask, 0)
            times.append(time.perf_counter_ns() - t0)
            if not (int(bitmask[0, t >> 5]) >> (t & 31)) & 1:
                bad = i
                break
            if i < len(tokens) and not m.consume_token(t):
                bad = i
                break
        return times, bad


def pct(xs, q):
    return bu.quantile(xs, q)


def run_one(core, ids, max_tokens, **kw):
    rid = core.submit(ids, max_tokens=max_tokens, **kw)
    toks, metrics = [], None
    while core.pending:
        for ev in core.step():
            if ev["id"] != rid:
                continue
            if ev["type"] == "token":
                toks.append(ev["token"])
            elif ev["type"] == "done":
                metrics = ev["metrics"]
            else:
                raise RuntimeError(ev["message"])
    return toks, metrics


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--e2e-repeats", type=int, default=4)
    ap.add_argument("--e2e-max-tokens", type=int, default=160)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(bu.ROOT, "docs", "bench", "grammar.md"))
    a = ap.parse_args(argv)
    schemas = SCHEMAS
    e2e_schemas = E2E_SCHEMAS
    if a.quick:
        schemas, e2e_schemas, a.passes, a.e2e_repeats = SCHEMAS[:3], E2E_SCHEMAS[:2], 1, 2

    from colibri_lab import _engine, models
    from colibri_lab.chat import render
    from colibri_lab.schema import schema_to_gbnf
    from colibri_lab.tokenizer import Tokenizer

    load0 = bu.loadavg()
    info = bu.machine_info(a.threads)
    path = str(models.resolve(a.model))
    model = _engine.Model(path)
    meta = model.metadata()
    tok = Tokenizer.from_metadata(meta)
    n_vocab = model.n_vocab
    eos = model.info["eos_id"]

    engines, missing = [Ours(path, n_vocab)], {}
    hf_tok = None
    try:
        from transformers import PreTrainedTokenizerFast
        hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok._tk, eos_token=tok.id_to_token(eos))
    except Exception as e:  # noqa: BLE001
        missing["transformers"] = f"{type(e).__name__}: {e}"
    versions = {}
    import importlib.metadata as md
    for cls, pkg in ((XGrammar, "xgrammar"), (LLGuidance, "llguidance")):
        if hf_tok is None:
            missing[pkg] = "no HF tokenizer (transformers missing)"
            continue
        try:
            engines.append(cls(hf_tok, n_vocab, eos))
            versions[pkg] = md.version(pkg)
        except Exception as e:  # noqa: BLE001
            missing[pkg] = f"{type(e).__name__}: {e}"
    for pkg in ("torch", "transformers"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    print("engines:", [e.name for e in engines], "missing:", missing, flush=True)

    # ------------------------------------------------------------- compile
    comp = {e.name: {} for e in engines}
    conv_ms = {}
    compiled = {e.name: {} for e in engines}
    failures = []
    for name in schemas:
        schema = json.load(open(os.path.join(SCHEMA_DIR, name + ".json")))
        t0 = time.perf_counter_ns()
        gbnf = schema_to_gbnf(schema)
        conv_ms[name] = (time.perf_counter_ns() - t0) / 1e6
        for p in range(a.passes):
            for e in engines[p % len(engines):] + engines[:p % len(engines)]:
                if name in compiled[e.name] and compiled[e.name][name] is None:
                    continue
                try:
                    g, t = e.compile(schema, gbnf)
                except Exception as ex:  # noqa: BLE001
                    failures.append(f"{e.name} cannot compile {name}: {type(ex).__name__}: {str(ex)[:160]}")
                    compiled[e.name][name] = None
                    continue
                comp[e.name].setdefault(name, []).append(t / 1e6)
                if name in compiled[e.name]:
                    e.free(g)
                else:
                    compiled[e.name][name] = g
    print("compiled", flush=True)

    # ---------------------------------------------------------------- masks
    walks = []  # (schema, instance index, tokens)
    for name in schemas:
        inst = json.load(open(os.path.join(SCHEMA_DIR, "instances", name + ".json")))
        for k, v in enumerate(inst["valid"]):
            walks.append((name, k, tok.encode(json.dumps(v), add_special=False)))
    samples = {e.name: [] for e in engines}  # per-position median over passes
    per_schema = {e.name: {} for e in engines}
    rejected = []
    for name, k, toks in walks:
        got = {}
        for p in range(a.passes):
            for e in engines[p % len(engines):] + engines[:p % len(engines)]:
                g = compiled[e.name].get(name)
                if g is None:
                    continue
                times, bad = e.walk(g, toks, eos)
                if bad is not None:
                    if p == 0:
                        where = "EOS at the end" if bad == len(toks) else f"token {bad} {tok.id_to_token(toks[bad])!r}"
                        rejected.append(f"{e.name} rejects {name} instance {k} at {where}")
                    got[e.name] = None
                    continue
                if got.get(e.name, 0) is not None:
                    got.setdefault(e.name, []).append(times)
        # compare engines on the same positions only: a walk any engine rejected is dropped for all
        if any(got.get(e.name) is None for e in engines if compiled[e.name].get(name) is not None):
            continue
        for e in engines:
            if e.name in got:
                med = [statistics.median(col) / 1e3 for col in zip(*got[e.name])]
                samples[e.name] += med
                per_schema[e.name].setdefault(name, []).extend(med)
    print("masks done", flush=True)

    # ------------------------------------------------------------- e2e
    core = _engine.Engine(model, n_slots=1, n_ctx=2048, n_threads=a.threads, prefix_reuse=False)
    tmpl = meta["tokenizer.chat_template"]
    e2e = []
    for name in e2e_schemas:
        schema = json.load(open(os.path.join(SCHEMA_DIR, name + ".json")))
        msgs = [{"role": "system", "content": "You answer with JSON only."},
                {"role": "user", "content": "Produce one realistic example that matches this JSON Schema:\n"
                                            + json.dumps(schema)}]
        ids = tok.encode(render(tmpl, msgs, add_generation_prompt=True), add_special=False)
        g = _engine.Grammar(model, schema_to_gbnf(schema))
        toks, m = run_one(core, ids, a.e2e_max_tokens, grammar=g)  # warm-up, fixes the token count
        e2e.append({"name": name, "ids": ids, "g": g, "n": max(len(toks), 1), "json": [], "free": [],
                    "mask_us": [], "valid": None, "text": model.detokenize_bytes(toks).decode("utf-8", "replace")})
    try:
        import jsonschema
    except ImportError:
        jsonschema = None
    for r in range(a.e2e_repeats):
        for arm in bu.abba(r, "json", "free"):
            for d in e2e:
                if arm == "json":
                    toks, m = run_one(core, d["ids"], a.e2e_max_tokens, grammar=d["g"])
                    d["mask_us"].append(m["grammar_mask_us"])
                    if d["valid"] is None:
                        try:
                            obj = json.loads(model.detokenize_bytes(toks).decode("utf-8"))
                            if jsonschema:
                                jsonschema.validate(obj, json.load(open(os.path.join(SCHEMA_DIR, d["name"] + ".json"))))
                            d["valid"] = True
                        except Exception as ex:  # noqa: BLE001
                            d["valid"] = f"{type(ex).__name__}: {str(ex)[:80]}"
                else:
                    toks, m = run_one(core, d["ids"], d["n"], ignore_eos=True)
                d[arm].append(m["completion_tokens"] / (m["decode_ms"] / 1e3) if m["decode_ms"] > 0 else 0.0)
        print(f"  e2e repeat {r} done", flush=True)
    core.close()
    load1 = bu.loadavg()

    # -------------------------------------------------------------- report
    out = [bu.header("Grammar-constrained decoding (issue 4)",
                     [os.path.relpath(sys.argv[0], bu.ROOT)] + sys.argv[1:], info, load0, load1)]
    out.append(f"- python: `{sys.executable}`; anchors: " +
               (", ".join(f"{k} {v}" for k, v in versions.items()) or "none"))
    for k, v in missing.items():
        out.append(f"- NOT AVAILABLE: {k}: `{v}`")
    out.append(f"- vocabulary: SmolLM2's {n_vocab} tokens (HF tokenizer object built from the GGUF by "
               "colibri_lab.tokenizer and handed to xgrammar/llguidance; EOS id "
               f"{eos}); {len(schemas)} schemas, {len(walks)} valid instances, {a.passes} passes\n")
    out.append("### Mask time per token (µs, one thread, same token walks for every engine)\n")
    out.append("| engine | masks | p50 | p90 | p99 | max | mean |")
    out.append("|---|---|---|---|---|---|---|")
    stats = {}
    for e in engines:
        s = samples[e.name]
        if not s:
            out.append(f"| {e.name} | 0 | | | | | |")
            continue
        stats[e.name] = {q: pct(s, q) for q in (0.5, 0.9, 0.99)} | {"max": max(s), "mean": statistics.mean(s)}
        st = stats[e.name]
        out.append(f"| {e.name} | {len(s)} | {st[0.5]:.1f} | {st[0.9]:.1f} | {st[0.99]:.1f} | {st['max']:.1f} | "
                   f"{st['mean']:.1f} |")
    out.append("\nTimes are perf_counter_ns around one Python-level call (ctypes for ours, the packages' "
               "own bindings for the anchors), so each includes ~0.1–1 µs of call overhead.\n")
    out.append("### Per schema: mask p50 / p99 (µs) and compile time (ms, median of passes)\n")
    hdr = "| schema | GBNF conversion ms | " + " | ".join(f"{e.name} p50 / p99 | {e.name} compile" for e in engines) + " |"
    out.append(hdr)
    out.append("|" + "---|" * (2 + 2 * len(engines)))
    for name in schemas:
        row = [name, f"{conv_ms[name]:.2f}"]
        for e in engines:
            ps = per_schema[e.name].get(name)
            row.append(f"{pct(ps, 0.5):.1f} / {pct(ps, 0.99):.1f}" if ps else "—")
            c = comp[e.name].get(name)
            row.append(f"{statistics.median(c):.2f}" if c else "failed")
        out.append("| " + " | ".join(row) + " |")
    out.append("\n| engine | compile p50 ms | compile max ms |")
    out.append("|---|---|---|")
    for e in engines:
        cs = [statistics.median(v) for v in comp[e.name].values()]
        if cs:
            out.append(f"| {e.name} | {pct(cs, 0.5):.2f} | {max(cs):.2f} |")
    if failures or rejected:
        out.append("\nProblems (walks any engine rejected are left out for all engines):\n")
        out += [f"- {x}" for x in failures + rejected]
    out.append("\n### End-to-end decode under a JSON schema vs unconstrained\n")
    out.append(f"Greedy, n_threads={a.threads}, batch 1; unconstrained arm decodes the same number of tokens with "
               f"ignore_eos; {a.e2e_repeats} repeats ABBA; decode tok/s = completion tokens / decode_ms.\n")
    out.append("| schema | tokens | JSON valid | json tok/s | free tok/s | ratio (median of repeats) | "
               "engine grammar_mask_us (mean per mask) |")
    out.append("|---|---|---|---|---|---|---|")
    ratios = []
    for d in e2e:
        rs = [x / y for x, y in zip(d["json"], d["free"]) if y > 0]
        ratios += rs
        out.append(f"| {d['name']} | {d['n']} | {d['valid']} | {bu.median(d['json']):.1f} | {bu.median(d['free']):.1f} "
                   f"| {bu.median(rs):.3f} | {bu.median(d['mask_us']):.1f} |")
    lo, hi = bu.bootstrap_ci(ratios)
    rmed = bu.median(ratios)
    out.append(f"\nAll pairs: median ratio {rmed:.3f} (95% bootstrap CI {lo:.3f}–{hi:.3f}, n={len(ratios)}).\n")
    out.append("### Verdict\n")
    if "xgrammar" in stats:
        ok = stats["colibri"][0.5] <= stats["xgrammar"][0.5]
        out.append(f"- mask p50: ours {stats['colibri'][0.5]:.1f} µs vs xgrammar {stats['xgrammar'][0.5]:.1f} µs — "
                   f"target p50 <= xgrammar's: **{'met' if ok else 'MISSED'}**")
    else:
        out.append("- mask p50 vs xgrammar: not measured (xgrammar unavailable)")
    if "llguidance" in stats:
        ok = stats["colibri"][0.99] <= stats["llguidance"][0.99]
        out.append(f"- mask p99: ours {stats['colibri'][0.99]:.1f} µs vs llguidance {stats['llguidance'][0.99]:.1f} µs — "
                   f"target p99 <= llguidance's: **{'met' if ok else 'MISSED'}**")
    else:
        out.append("- mask p99 vs llguidance: not measured (llguidance unavailable)")
    out.append(f"- e2e JSON/unconstrained decode tok/s: {rmed:.3f} (CI {lo:.3f}–{hi:.3f}) — target >= 0.9: "
               f"**{bu.verdict_ge(rmed, lo, 0.9)}**")
    text = "\n".join(out)
    print("\n" + text)
    if not a.quick or a.out != ap.get_default("out"):
        bu.write_doc(a.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
