#!/usr/bin/env python
"""Grammar-constrained decoding: per-token mask time and compile time for
realistic JSON schemas on each model's vocabulary (SmolLM2 49k, Qwen2.5 152k),
side by side with xgrammar and llguidance; the JSON-Schema-Test-Suite pass
rate per keyword file; end-to-end decode tok/s under a JSON schema vs
unconstrained.

    python scripts/bench_grammar.py [--models smollm2,PATH.gguf] [--e2e-model PATH] [--threads 2]
                                    [--passes 3] [--quick] [--out docs/bench/grammar.md]

xgrammar and llguidance are optional imports (the `anchors` extra; xgrammar
needs torch: `pip install torch==2.13.0` first so pip does not fetch a CUDA
build).  A missing anchor is reported, not fatal.

Mask benchmark.  For each schema, each valid instance in
tests/fixtures/schemas/instances/<name>.json is serialized by json.dumps
(default separators, and indent=2) and tokenized by the model's tokenizer;
every engine walks that same token sequence: fill the next-token mask (timed
with perf_counter_ns around the one call), check the token is allowed,
accept it; one more mask after the last token (where EOS must be allowed).
Ours through the package (`Matcher.fill_mask_words` into one uint32 bitmask,
no conversion), xgrammar through GrammarMatcher.fill_next_token_bitmask,
llguidance through llguidance.numpy.fill_next_token_bitmask.  Each walk is
repeated --passes times, the engines in rotating order, each pass cold (a
fresh matcher; ours also a fresh grammar, whose mask cache is shared by its
matchers); the per-position median over passes is the sample.  All
single-threaded.

Compile time: ours = JSON Schema -> GBNF (colibri_lab.schema) + Grammar(model,
gbnf) (the model's vocabulary trie is built once, before timing, as a
serving process does); xgrammar GrammarCompiler(max_threads=1, cache off)
.compile_json_schema; llguidance grammar_from_json_schema + LLMatcher
construction.  Median over --passes per schema.

Targets (issue 16): compile p50 <= 1 ms and p99 <= 20 ms; mask p50 <= 10 us
and p99 <= 500 us; no mask above 1 ms on the 152k vocabulary; decode under a
schema >= 0.95x unconstrained.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil as bu  # noqa: E402

SCHEMA_DIR = os.path.join(bu.ROOT, "tests", "fixtures", "schemas")
# every fixture schema with valid instances (tool calls, API objects, nested
# records, patterns, formats, recursion: 67); --quick takes the first 3
SCHEMAS = sorted(f[:-5] for f in os.listdir(SCHEMA_DIR)
                 if f.endswith(".json") and os.path.exists(os.path.join(SCHEMA_DIR, "instances", f)))
E2E_SCHEMAS = ["person", "movie_review", "calendar_event", "recipe"]


class Ours:
    """The engine's grammar through the package (same C code as the engine)."""
    name = "colibri"

    def __init__(self, model):
        import numpy as np
        from colibri_lab import _engine
        from colibri_lab.schema import schema_to_gbnf
        self._engine, self.to_gbnf, self.model = _engine, schema_to_gbnf, model
        self.words = np.zeros((model.n_vocab + 31) // 32, dtype=np.uint32)
        _engine.Grammar(model, 'root ::= "a"')  # builds the model's vocabulary trie once

    def compile(self, schema, gbnf):
        t0 = time.perf_counter_ns()
        g = self._engine.Grammar(self.model, self.to_gbnf(schema))
        return g, time.perf_counter_ns() - t0

    def free(self, g):
        pass

    def walk(self, g, tokens, eos):
        # a fresh grammar (untimed, ~0.5 ms): its shared mask cache would
        # otherwise answer every pass after the first, and the walk would
        # measure cache hits, not the first mask of each state
        m = self._engine.Grammar(self.model, g.text).matcher()
        fill, acc, words = m.fill_mask_words, m.accept, self.words
        times, bad = [], None
        for i, t in enumerate(tokens + [eos]):
            t0 = time.perf_counter_ns()
            fill(words)
            times.append(time.perf_counter_ns() - t0)
            if not (int(words[t >> 5]) >> (t & 31)) & 1:
                bad = i
                break
            if i < len(tokens):
                try:
                    acc(t)
                except Exception:  # noqa: BLE001
                    bad = i
                    break
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


def vocab_bench(path, a, schemas, versions, missing):
    """Compile and mask times of every engine on one model's vocabulary.
    Returns (report lines, {engine: mask stats}, {engine: compile ms list})."""
    from colibri_lab import _engine
    from colibri_lab.schema import schema_to_gbnf
    from colibri_lab.tokenizer import Tokenizer

    model = _engine.Model(path)
    meta = model.metadata()
    tok = Tokenizer.from_metadata(meta)
    n_vocab = model.n_vocab
    eos = model.info["eos_id"]
    engines = [Ours(model)]
    hf_tok = None
    try:
        import copy

        import tokenizers
        from transformers import PreTrainedTokenizerFast
        # our tokenizer decodes in C (llama.cpp's pieces); the anchors read the
        # vocabulary type from the HF decoder: byte-level BPE
        tk = copy.deepcopy(tok._tk)
        tk.decoder = tokenizers.decoders.ByteLevel()
        hf_tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=tok.id_to_token(eos))
    except Exception as e:  # noqa: BLE001
        missing["transformers"] = f"{type(e).__name__}: {e}"
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
    print(os.path.basename(path), "engines:", [e.name for e in engines], "missing:", missing, flush=True)

    comp = {e.name: {} for e in engines}
    compiled = {e.name: {} for e in engines}
    conv_ms = {}
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
                if name not in compiled[e.name]:
                    compiled[e.name][name] = g

    walks = []  # (schema, instance index, serialization, tokens)
    for name in schemas:
        inst = json.load(open(os.path.join(SCHEMA_DIR, "instances", name + ".json")))
        for k, v in enumerate(inst["valid"]):
            for ser, text in (("compact", json.dumps(v, ensure_ascii=False)),
                              ("indent=2", json.dumps(v, ensure_ascii=False, indent=2))):
                walks.append((name, k, ser, tok.encode(text, add_special=False)))
    samples = {e.name: [] for e in engines}
    per_schema = {e.name: {} for e in engines}
    rejected = []
    for name, k, ser, toks in walks:
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
                        rejected.append(f"{e.name} rejects {name} instance {k} ({ser}) at {where}")
                    got[e.name] = None
                    continue
                if got.get(e.name, 0) is not None:
                    got.setdefault(e.name, []).append(times)
        if any(got.get(e.name) is None for e in engines if compiled[e.name].get(name) is not None):
            continue  # same positions for every engine: a walk any engine rejected is dropped for all
        for e in engines:
            if e.name in got:
                med = [statistics.median(col) / 1e3 for col in zip(*got[e.name])]
                samples[e.name] += med
                per_schema[e.name].setdefault(name, []).extend(med)

    out = [f"\n## Vocabulary: `{os.path.basename(path)}` ({n_vocab} tokens, EOS id {eos})\n",
           f"{len(schemas)} schemas, {len(walks)} walks (valid instances, compact and indent=2), "
           f"{a.passes} passes.\n",
           "### Mask time per token (µs, one thread, same token walks for every engine)\n",
           "| engine | masks | p50 | p90 | p99 | p99.9 | max | mean |", "|---|---|---|---|---|---|---|---|"]
    stats = {}
    for e in engines:
        xs = samples[e.name]
        if not xs:
            out.append(f"| {e.name} | 0 | | | | | | |")
            continue
        st = stats[e.name] = {q: bu.quantile(xs, q) for q in (0.5, 0.9, 0.99, 0.999)} | {
            "max": max(xs), "mean": statistics.mean(xs)}
        out.append(f"| {e.name} | {len(xs)} | {st[0.5]:.1f} | {st[0.9]:.1f} | {st[0.99]:.1f} | {st[0.999]:.1f} | "
                   f"{st['max']:.1f} | {st['mean']:.1f} |")
    out.append("\nTimes are perf_counter_ns around one Python-level call into each package's own binding, "
               "so each includes ~0.1–1 µs of call overhead.\n")
    out.append("### Per schema: mask p50 / max (µs), compile ms (median of passes)\n")
    out.append("| schema | GBNF conversion ms | " + " | ".join(f"{e.name} mask p50 / max | {e.name} compile ms"
                                                       for e in engines) + " |")
    out.append("|" + "---|" * (2 + 2 * len(engines)))
    for name in schemas:
        row = [name, f"{conv_ms[name]:.2f}"]
        for e in engines:
            ps = per_schema[e.name].get(name)
            row.append(f"{bu.quantile(ps, 0.5):.1f} / {max(ps):.1f}" if ps else "—")
            c = comp[e.name].get(name)
            row.append(f"{statistics.median(c):.2f}" if c else "failed")
        out.append("| " + " | ".join(row) + " |")
    out.append("\n| engine | compile p50 ms | compile p99 ms | compile max ms |")
    out.append("|---|---|---|---|")
    cstats = {}
    for e in engines:
        cs = [statistics.median(v) for v in comp[e.name].values()]
        if cs:
            cstats[e.name] = cs
            out.append(f"| {e.name} | {bu.quantile(cs, 0.5):.2f} | {bu.quantile(cs, 0.99):.2f} | {max(cs):.2f} |")
    if failures or rejected:
        out.append("\nProblems (walks any engine rejected are left out for all engines):\n")
        out += [f"- {x}" for x in failures + rejected]
    return out, stats, cstats


def suite_section():
    """Per keyword file pass rates on the JSON-Schema-Test-Suite (tests/schema_suite.py)."""
    import tempfile
    sys.path.insert(0, os.path.join(bu.ROOT, "tests"))
    import schema_suite as S
    from tinymodels import write_tiny_llama
    from colibri_lab import _engine
    from colibri_lab.schema import schema_to_gbnf
    with tempfile.TemporaryDirectory() as d:
        write_tiny_llama(os.path.join(d, "tiny.gguf"))
        model = _engine.Model(os.path.join(d, "tiny.gguf"))
        tok = S.Tokenizer(model)
        out = ["\n## JSON-Schema-Test-Suite (required tests; tests/test_schema_suite.py)\n",
               "An instance passes when its schema compiles and the instance, serialized by json.dumps "
               "(default separators, and indent=2; ensure_ascii=False), is accepted token by token if valid "
               "and stopped if invalid; a refused schema fails all its instances.  `invalid accepted` is the "
               "soundness count (must be 0).\n"]
        summary = {}
        for draft in ("draft2020-12", "draft7"):
            rows = [S.run_file(p, draft, model, tok, schema_to_gbnf) for p in S.files(draft)]
            n, ok = sum(r.instances for r in rows), sum(r.passed for r in rows)
            bad = sum(len(r.invalid_accepted) for r in rows)
            summary[draft] = (ok, n, bad)
            out.append(f"\n### {draft}: {ok} / {n} instances pass ({100 * ok / n:.1f}%), "
                       f"{bad} invalid accepted\n")
            out.append("| file | instances | pass | pass % | in refused schemas | valid rejected | invalid accepted |")
            out.append("|---|---|---|---|---|---|---|")
            for r in rows:
                out.append(f"| {r.name} | {r.instances} | {r.passed} | {100 * r.passed / max(r.instances, 1):.0f} | "
                           f"{r.refused_instances} | {len(r.valid_rejected)} | {len(r.invalid_accepted)} |")
    return out, summary


def e2e_section(path, a):
    from colibri_lab import _engine
    from colibri_lab.chat import render
    from colibri_lab.schema import schema_to_gbnf
    from colibri_lab.tokenizer import Tokenizer
    model = _engine.Model(path)
    meta = model.metadata()
    tok = Tokenizer.from_metadata(meta)
    core = _engine.Engine(model, n_slots=1, n_ctx=2048, n_threads=a.threads, prefix_reuse=False)
    tmpl = meta["tokenizer.chat_template"]
    e2e = []
    for name in a.e2e_schemas:
        schema = json.load(open(os.path.join(SCHEMA_DIR, name + ".json")))
        msgs = [{"role": "system", "content": "You answer with JSON only."},
                {"role": "user", "content": "Produce one realistic example that matches this JSON Schema:\n"
                                            + json.dumps(schema)}]
        ids = tok.encode(render(tmpl, msgs, add_generation_prompt=True), add_special=False)
        g = _engine.Grammar(model, schema_to_gbnf(schema))
        toks, m = run_one(core, ids, a.e2e_max_tokens, grammar=g)  # warm-up, fixes the token count
        e2e.append({"name": name, "ids": ids, "g": g, "n": max(len(toks), 1), "json": [], "free": [],
                    "mask_us": [], "valid": None})
    import jsonschema
    for r in range(a.e2e_repeats):
        for arm in bu.abba(r, "json", "free"):
            for d in e2e:
                if arm == "json":
                    toks, m = run_one(core, d["ids"], a.e2e_max_tokens, grammar=d["g"])
                    d["mask_us"].append(m["grammar_mask_us"])
                    if d["valid"] is None:
                        try:
                            obj = json.loads(model.detokenize_bytes(toks).decode("utf-8"))
                            jsonschema.validate(obj, json.load(open(os.path.join(SCHEMA_DIR, d["name"] + ".json"))),
                                                format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
                            d["valid"] = True
                        except Exception as ex:  # noqa: BLE001
                            d["valid"] = f"{type(ex).__name__}: {str(ex)[:80]}"
                else:
                    toks, m = run_one(core, d["ids"], d["n"], ignore_eos=True)
                d[arm].append(m["completion_tokens"] / (m["decode_ms"] / 1e3) if m["decode_ms"] > 0 else 0.0)
        print(f"  e2e repeat {r} done", flush=True)
    core.close()
    out = [f"\n## End-to-end decode under a JSON schema vs unconstrained (`{os.path.basename(path)}`)\n",
           f"Greedy, n_threads={a.threads}, batch 1; the unconstrained arm decodes the same number of tokens with "
           f"ignore_eos; {a.e2e_repeats} repeats ABBA; decode tok/s = completion tokens / decode_ms.\n",
           "| schema | tokens | JSON valid | json tok/s | free tok/s | ratio (median of repeats) | "
           "engine grammar_mask_us (mean per mask) |", "|---|---|---|---|---|---|---|"]
    ratios = []
    for d in e2e:
        rs = [x / y for x, y in zip(d["json"], d["free"]) if y > 0]
        ratios += rs
        out.append(f"| {d['name']} | {d['n']} | {d['valid']} | {bu.median(d['json']):.1f} | {bu.median(d['free']):.1f} "
                   f"| {bu.median(rs):.3f} | {bu.median(d['mask_us']):.1f} |")
    lo, hi = bu.bootstrap_ci(ratios)
    rmed = bu.median(ratios)
    out.append(f"\nAll pairs: median ratio {rmed:.3f} (95% bootstrap CI {lo:.3f}–{hi:.3f}, n={len(ratios)}).\n")
    return out, (rmed, lo, hi)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cache = os.path.expanduser("~/.cache/colibri-lab/models/")
    ap.add_argument("--models", default="smollm2," + cache + "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--e2e-model", default=cache + "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--e2e-repeats", type=int, default=2)
    ap.add_argument("--e2e-max-tokens", type=int, default=96)
    ap.add_argument("--no-e2e", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(bu.ROOT, "docs", "bench", "grammar.md"))
    a = ap.parse_args(argv)
    schemas = SCHEMAS
    a.e2e_schemas = E2E_SCHEMAS
    if a.quick:
        schemas, a.e2e_schemas, a.passes, a.e2e_repeats = SCHEMAS[:3], E2E_SCHEMAS[:1], 1, 1

    from colibri_lab import models
    load0 = bu.loadavg()
    info = bu.machine_info(a.threads)
    versions, missing = {}, {}
    import importlib.metadata as md
    for pkg in ("torch", "transformers"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    body, verdicts = [], []
    for m in a.models.split(","):
        path = str(models.resolve(m)) if not m.endswith(".gguf") else m
        out, stats, cstats = vocab_bench(path, a, schemas, versions, missing)
        body += out
        ours, cs = stats.get("colibri"), cstats.get("colibri", [])
        if ours and cs:
            tag = os.path.basename(path)
            verdicts.append(f"- {tag}: compile p50 {bu.quantile(cs, 0.5):.2f} ms (target <= 1), p99 "
                            f"{bu.quantile(cs, 0.99):.2f} ms (<= 20); mask p50 {ours[0.5]:.1f} µs (<= 10), "
                            f"p99 {ours[0.99]:.1f} µs (<= 500), max {ours['max']:.1f} µs (<= 1000)")
    sout, summary = suite_section()
    body += sout
    ok, n, bad = summary["draft2020-12"]
    verdicts.append(f"- JSON-Schema-Test-Suite draft 2020-12: {100 * ok / n:.1f}% of instances pass "
                    f"(target >= 60%), {bad} invalid accepted (target 0)")
    if not a.no_e2e:
        eout, (rmed, lo, hi) = e2e_section(a.e2e_model, a)
        body += eout
        verdicts.append(f"- decode under a schema / unconstrained: {rmed:.3f} (CI {lo:.3f}–{hi:.3f}) — target >= 0.95: "
                        f"**{bu.verdict_ge(rmed, lo, 0.95)}**")
    load1 = bu.loadavg()
    out = [bu.header("Grammar-constrained decoding and JSON Schema (issue 16)",
                     [os.path.relpath(sys.argv[0], bu.ROOT)] + sys.argv[1:], info, load0, load1)]
    out.append(f"- python: `{sys.executable}`; anchors: " +
               (", ".join(f"{k} {v}" for k, v in versions.items()) or "none"))
    for k, v in missing.items():
        out.append(f"- NOT AVAILABLE: {k}: `{v}`")
    out.append("\n### Verdict\n")
    out += verdicts
    out += body
    text = "\n".join(out)
    print("\n" + text)
    if not a.quick or a.out != ap.get_default("out"):
        bu.write_doc(a.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
