"""Speculative decoding: lossless verification for every draft
source, reproducible sampling, a chi-square test that speculative sampling
keeps the target's next-token distribution, and the self-disabling policy."""
from __future__ import annotations

import numpy as np
import pytest

from colibri_lab import _engine
from colibri_lab.errors import InvalidRequestError
from colibri_lab.metrics import derive_request

SOURCES = ["prompt_lookup", "layer_skip", "draft"]


def run_all(core, reqs, window=512):
    """Submit (prompt, kwargs) pairs (at most `window` pending at once: the
    engine's request table is bounded); step until done; tokens + metrics per request."""
    ids, out, it = [], {}, iter(reqs)
    while True:
        while core.pending < window:
            nxt = next(it, None)
            if nxt is None:
                break
            rid = core.submit(nxt[0], **nxt[1])
            ids.append(rid)
            out[rid] = {"tokens": [], "metrics": None, "error": None}
        if not core.pending:
            break
        for ev in core.step():
            o = out[ev["id"]]
            if ev["type"] == "token":
                o["tokens"].append(ev["token"])
            elif ev["type"] == "done":
                o["metrics"] = ev["metrics"]
            else:
                o["error"] = ev["message"]
    return [out[i] for i in ids]


# ------------------------------------------------------------------ SmolLM2

PROMPTS = [
    "Rewrite this sentence in the past tense: I walk to the store and buy some bread.",
    "def add(a, b):\n    return a + b\n\n# Rewrite the function above with type hints:\n",
    "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox",
    "List the days of the week.",
    "The capital of France is",
    "Once upon a time, in a village by the sea,",
    "Write a haiku about autumn leaves.",
    "Summarize: Hummingbirds are small birds that can hover in mid-air by rapidly flapping their wings.",
    "Translate to French: Good morning, how are you?",
    "Explain what a prime number is.",
    "<|im_start|>user\nWhat is 12 times 12?<|im_end|>\n<|im_start|>assistant\n",
    "Quote the first line: 'To be, or not to be, that is the question.'",
    "JSON for a person named Ana aged 31: {\"name\": \"Ana\", \"age\":",
    "for i in range(10):\n    print(i)\n# The same loop in C:\n",
    "The three primary colors are",
    "Count from one to ten: one, two, three,",
    "A recipe for pancakes needs",
    "Correct the spelling: Teh cat sat on teh mat.",
    "The largest planet in the solar system is",
    "import numpy as np\narr = np.arange(10)\n# Print the sum of arr:\n",
]


@pytest.fixture(scope="module")
def smol(smollm2_path, tmp_path_factory):
    from draftmodel import write_truncated
    from colibri_lab.tokenizer import Tokenizer

    model = _engine.Model(smollm2_path)
    draft_path = write_truncated(smollm2_path, tmp_path_factory.mktemp("draft") / "smollm2-8layers.gguf", 8)
    draft = _engine.Model(draft_path)
    tok = Tokenizer.from_metadata(model.metadata())
    prompts = [tok.encode(p, add_special=False) for p in PROMPTS]
    return model, draft, prompts


@pytest.mark.smollm2
def test_greedy_output_identical_for_every_source(smol):
    model, draft, prompts = smol
    plain = _engine.Engine(model, n_slots=4, n_ctx=512, n_threads=2)
    ref = run_all(plain, [(p, dict(max_tokens=128)) for p in prompts])
    core = _engine.Engine(model, n_slots=4, n_ctx=512, n_threads=2, draft_model=draft, layer_skip=True)
    configs = [[s] for s in SOURCES] + [SOURCES]
    for sources in configs:
        # mixed batches: every other request speculates, the rest decode plainly
        reqs = []
        for i, p in enumerate(prompts):
            kw = dict(max_tokens=128)
            if i % 4 != 3:
                kw["speculative"] = {"sources": sources, "k_max": 4, "adaptive": False}
            reqs.append((p, kw))
        res = run_all(core, reqs)
        for i, (a, b) in enumerate(zip(ref, res)):
            assert b["error"] is None, b["error"]
            assert a["tokens"] == b["tokens"], f"{sources}: prompt {i} differs from plain greedy"
        drafted = sum(r["metrics"]["draft_n"] for r in res)
        accepted = sum(r["metrics"]["draft_accepted"] for r in res)
        assert drafted > 0, sources
        assert 0 < accepted <= drafted, sources
        m = res[0]["metrics"]
        assert m["draft_n"] == sum(m["draft_n_by_source"].values())
        assert sum(m["draft_accepted_by_pos"]) == m["draft_accepted"]


@pytest.mark.smollm2
def test_combined_lookup_and_draft_model_is_identical_to_plain_greedy(smol):
    """Lookup and the draft model priced per step, a draft-model draft continued by lookup where it
    reaches copied text, in mixed batches of four slots (the rows left for continuations are shared)."""
    model, draft, prompts = smol
    plain = _engine.Engine(model, n_slots=4, n_ctx=512, n_threads=2)
    ref = run_all(plain, [(p, dict(max_tokens=96)) for p in prompts])
    core = _engine.Engine(model, n_slots=4, n_ctx=512, n_threads=2, draft_model=draft)
    spec = {"sources": ["prompt_lookup", "draft"], "k_max": 8}
    res = run_all(core, [(p, dict(max_tokens=96, speculative=spec) if i % 4 != 3 else dict(max_tokens=96))
                         for i, p in enumerate(prompts)])
    for i, (a, b) in enumerate(zip(ref, res)):
        assert b["error"] is None, b["error"]
        assert a["tokens"] == b["tokens"], f"prompt {i} differs from plain greedy"
    for r in res:
        m = r["metrics"]
        assert m["draft_n"] == sum(m["draft_n_by_source"].values())
        assert m["draft_accepted"] == sum(m["draft_accepted_by_source"].values()) == sum(m["draft_accepted_by_pos"])
        assert all(m["draft_accepted_by_source"][s] <= n for s, n in m["draft_n_by_source"].items())
    assert sum(r["metrics"]["draft_n"] for r in res) > 0


@pytest.mark.smollm2
def test_prompt_lookup_accepts_on_copy_heavy_prompt(smol):
    model, _, _ = smol
    from colibri_lab.chat import render
    from colibri_lab.tokenizer import Tokenizer

    meta = model.metadata()
    text = render(meta["tokenizer.chat_template"], [{"role": "user", "content": (
        "Copy this text exactly:\nThe quick brown fox jumps over the lazy dog. A journey of a thousand "
        "miles begins with a single step. All that glitters is not gold.")}])
    prompt = Tokenizer.from_metadata(meta).encode(text, add_special=False)
    core = _engine.Engine(model, n_slots=1, n_ctx=512, n_threads=2)
    res = run_all(core, [(prompt, dict(max_tokens=60, speculative={"sources": ["prompt_lookup"], "adaptive": False}))])[0]
    m = derive_request(res["metrics"])   # the binding reports C's fields; the ratios are derived
    assert m["draft_accepted"] >= 10 and m["accept_len_mean"] > 2.0, m


@pytest.mark.smollm2
def test_fixed_seed_reproduces_speculative_sampling(smol):
    model, _, prompts = smol
    core = _engine.Engine(model, n_slots=2, n_ctx=512, n_threads=2, layer_skip=True)
    kw = dict(max_tokens=48, temperature=0.8, top_p=0.95, seed=1234,
              speculative={"sources": ["prompt_lookup", "layer_skip"], "k_max": 4, "adaptive": False})
    a = run_all(core, [(prompts[5], kw)])[0]
    b = run_all(core, [(prompts[5], kw)])[0]
    c = run_all(core, [(prompts[5], dict(kw, seed=99))])[0]
    assert a["tokens"] == b["tokens"]
    assert a["tokens"] != c["tokens"]


@pytest.mark.smollm2
def test_adaptive_policy_pauses_an_unprofitable_source(smol, smollm2_path, tmp_path):
    """A drafter that never agrees (one block of the model with its logits
    negated, so it drafts its least likely token) cannot pay on any machine:
    each draft costs drafter time plus a verify row and buys nothing.  The
    policy must stop paying for it after a few tries.

    (An earlier version used the model with every layer but the first
    skipped.  Its drafts are accepted ~6% of the time at ~0.1 of a step a
    token, priced at 0.9-1.1 depending on the machine's step times, so on a
    fast machine the policy rightly drafted for most of the run.)"""
    from draftmodel import write_truncated

    model, _, prompts = smol
    contrary = _engine.Model(write_truncated(smollm2_path, tmp_path / "contrary.gguf", 1, contrary=True))
    core = _engine.Engine(model, n_slots=1, n_ctx=512, n_threads=2, draft_model=contrary)
    res = run_all(core, [(prompts[6], dict(max_tokens=96, ignore_eos=True,
                                           speculative={"sources": ["draft"], "k_max": 6}))])[0]
    stats = core.spec_stats()["draft"]
    m = res["metrics"]
    assert stats["accept_rate"] < 0.1, stats  # the drafter is what it claims to be
    # warm-up drafts, then probes after pauses that double: far fewer than the ~95 decode steps
    assert m["draft_steps"] < 20, (m, stats)
    assert stats["expected_gain"] < 1.0 and stats["paused"], stats


def test_speculative_settings_are_validated(make_tiny):
    model = _engine.Model(str(make_tiny(wtype="F32").path))
    core = _engine.Engine(model, n_slots=1, n_ctx=64, n_threads=1)
    with pytest.raises(InvalidRequestError, match="unknown speculative source"):
        core.submit([1, 2, 3], speculative={"sources": ["medusa"]})
    with pytest.raises(InvalidRequestError, match="draft model"):
        core.submit([1, 2, 3], speculative={"sources": ["draft"]})
    with pytest.raises(InvalidRequestError, match="layer_skip"):
        core.submit([1, 2, 3], speculative={"sources": ["layer_skip"]})
    with pytest.raises(InvalidRequestError, match="k_max"):
        core.submit([1, 2, 3], speculative={"sources": ["prompt_lookup"], "k_max": 99})
    with pytest.raises(InvalidRequestError, match="unknown speculative setting"):
        core.submit([1, 2, 3], speculative={"sources": ["prompt_lookup"], "depth": 3})


# --------------------------------------------------------------- chi-square

def _softmax(x):
    z = np.exp(x.astype(np.float64) - x.max())
    return z / z.sum()


def _chi2_ok(counts: dict, probs: np.ndarray, n: int) -> tuple[float, float]:
    """Chi-square statistic and p-value (Wilson-Hilferty) of observed counts
    against probabilities, pooling cells with expected count < 5."""
    exp = probs * n
    big = exp >= 5
    obs = np.array([counts.get(i, 0) for i in range(len(probs))], dtype=np.float64)
    o = np.concatenate([obs[big], [obs[~big].sum()]])
    e = np.concatenate([exp[big], [exp[~big].sum()]])
    keep = e > 0
    stat = float(((o[keep] - e[keep]) ** 2 / e[keep]).sum())
    dof = int(keep.sum()) - 1
    # upper tail of chi2(dof) via the Wilson-Hilferty cube-root normal approximation
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / np.sqrt(2 / (9 * dof))
    from math import erfc, sqrt
    return stat, 0.5 * erfc(z / sqrt(2))


def test_speculative_sampling_preserves_the_next_token_distribution(make_tiny):
    """Prompt lookup on a repetitive prompt drafts the continuation; sampling
    at temperature 1 with speculation must still give the target's exact
    conditional distributions for the 2nd and 3rd tokens."""
    # Unit residual gains (the tiny models of earlier versions): their
    # next-token distributions are spread over many tokens, so a sampler at
    # the wrong temperature is told apart (the check at the end).  The
    # residual-dominated default puts most of the mass on one token.
    w = make_tiny(wtype="F32", n_vocab=288, attn_out_gain=1.0, ffn_down_gain=1.0)
    model = _engine.Model(str(w.path))
    prompt = [10, 20, 30, 40, 10, 20, 30, 40, 10, 20, 30, 40, 10, 20]
    spec = {"sources": ["prompt_lookup"], "k_max": 3, "adaptive": False, "ngram_min": 1}
    core = _engine.Engine(model, n_slots=16, n_ctx=64, n_threads=1)
    n = 3000
    res = run_all(core, [(prompt, dict(max_tokens=3, temperature=1.0, seed=s, ignore_eos=True, speculative=spec))
                         for s in range(n)])
    seqs = [tuple(r["tokens"]) for r in res]
    assert all(len(s) == 3 for s in seqs)
    drafted = sum(r["metrics"]["draft_n"] for r in res)
    accepted = sum(r["metrics"]["draft_accepted"] for r in res)
    assert drafted > 0 and accepted > 0, "the test must exercise accepted drafts"
    ref = _engine.Engine(model, n_slots=1, n_ctx=64, n_threads=1)
    # second token given the most common first token
    t1 = max(set(s[0] for s in seqs), key=lambda t: sum(1 for s in seqs if s[0] == t))
    sub = [s for s in seqs if s[0] == t1]
    logits2 = ref.forward(0, prompt + [t1], 0)[-1]
    p2 = _softmax(logits2)
    counts = {}
    for s in sub:
        counts[s[1]] = counts.get(s[1], 0) + 1
    stat, pval = _chi2_ok(counts, p2, len(sub))
    assert pval > 1e-3, (stat, pval, len(sub))
    # third token given the most common (t1, t2)
    pairs = {}
    for s in seqs:
        pairs[s[:2]] = pairs.get(s[:2], 0) + 1
    t12 = max(pairs, key=pairs.get)
    sub3 = [s for s in seqs if s[:2] == t12]
    assert len(sub3) >= 100
    p3 = _softmax(ref.forward(0, prompt + list(t12), 0)[-1])
    counts3 = {}
    for s in sub3:
        counts3[s[2]] = counts3.get(s[2], 0) + 1
    stat3, pval3 = _chi2_ok(counts3, p3, len(sub3))
    assert pval3 > 1e-3, (stat3, pval3, len(sub3))
    # a wrong distribution must fail the same check (the test can fail)
    wrong = _softmax(logits2 * 1.5)  # the same logits at temperature 2/3
    assert _chi2_ok(counts, wrong, len(sub))[1] < 1e-3


# ------------------------------------------------------- issue 17: real pairs, cross-vocabulary drafts

def test_a_draft_model_with_another_vocabulary_is_refused(make_tiny):
    target = _engine.Model(str(make_tiny(wtype="F32", n_vocab=320).path))
    other = _engine.Model(str(make_tiny(wtype="F32", n_vocab=288).path))
    with pytest.raises(InvalidRequestError) as ei:
        _engine.Engine(target, n_ctx=64, n_threads=1, draft_model=other)
    msg = str(ei.value)
    # both sizes and the first token that differs (token 288 exists only in the target)
    assert "288 tokens" in msg and "320 tokens" in msg and "first difference at token 288" in msg, msg
    assert "no token" in msg and "cross-vocabulary" in msg, msg
    # the same vocabulary is accepted
    same = _engine.Model(str(make_tiny(wtype="F32", n_vocab=320, seed=5).path))
    _engine.Engine(target, n_ctx=64, n_threads=1, draft_model=same).close()


@pytest.mark.realmodels
def test_real_pair_vocabulary_check(real_model, smollm2_path):
    q15 = _engine.Model(str(real_model("qwen2.5-coder-1.5b")))
    q05 = _engine.Model(str(real_model("qwen2.5-coder-0.5b")))
    _engine.Engine(q15, n_ctx=64, n_threads=1, draft_model=q05).close()  # one vocabulary: accepted
    with pytest.raises(InvalidRequestError, match=r"\(49152 tokens\) differs from the target's \(151936 tokens\): "
                                                  r"first difference at token 0"):
        _engine.Engine(q15, n_ctx=64, n_threads=1, draft_model=_engine.Model(smollm2_path))


@pytest.fixture(scope="module")
def tiny_cross_pair(tmp_path_factory):
    """A target and a drafter with different vocabularies and pre-tokenizers:
    a tiny llama (320 tokens, smollm pre-tokenizer) drafted for by a tiny
    qwen2 (288 tokens, qwen2 pre-tokenizer)."""
    from tinymodels import write_tiny_model
    from colibri_lab.tokenizer import Tokenizer

    root = tmp_path_factory.mktemp("xvocab")
    t = write_tiny_model(root / "target.gguf", arch="llama", n_vocab=320, attn_out_gain=1.0, ffn_down_gain=1.0)
    d = write_tiny_model(root / "draft.gguf", arch="qwen2", n_vocab=288, seed=3)
    target, draft = _engine.Model(t.path), _engine.Model(d.path)
    return target, draft, Tokenizer.from_metadata(target.metadata())


# 50 prompts: prose, Unicode of many scripts, code, whitespace runs, special tokens
CROSS_PROMPTS = [
    "The capital of France is", "Once upon a time", "Summarize: the quick brown fox jumps over the lazy dog.",
    "Translate to German: good morning", "List three colors:", "Q: What is 7 times 8?\nA:",
    "Grüße aus Köln — schön, dass du da bist!", "Ça va très bien, merci. Et toi ?", "¿Dónde está la estación?",
    "日本語で自己紹介してください。", "用一句话解释什么是机器学习。", "Привет, как дела? Расскажи о себе.",
    "Καλημέρα σας, τι κάνετε;", "مرحبا بالعالم", "नमस्ते दुनिया", "한국어로 대답해 주세요.",
    "Emoji: 😀🚀🌍 — what do they mean?", "Mixed: naïve café façade coöperate résumé",
    "def add(a, b):\n    return a + b\n\n", "for (int i = 0; i < n; i++) {\n    sum += a[i];\n}\n",
    "{\"name\": \"Ana\", \"age\": 31, \"tags\": [\"x\", \"y\"]}", "SELECT id, name FROM users WHERE age > 30;",
    "<div class=\"box\">\n  <p>Hello</p>\n</div>\n", "x = [i * i for i in range(10) if i % 2 == 0]",
    "#include <stdio.h>\nint main(void) {\n\tprintf(\"hi\\n\");\n}\n", "fn main() { println!(\"{}\", 1 + 2); }",
    "a    b\t\tc\n\n\n  d", "        deeply indented line", "trailing spaces   \n   \n", "\n\n\n\nfour newlines",
    "tabs\tand\tspaces  mixed \t here", "| a | b |\n|---|---|\n| 1 | 2 |\n", "    \n\t\n    def f():\n        pass",
    "numbers 1234567890 and 3.14159 and -42", "2024-01-15T10:30:00Z is a timestamp", "e = mc^2, a^2 + b^2 = c^2",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n", "<|im_start|>user\nWrite code<|im_end|>\n",
    "URL: https://example.com/path?q=1&r=2#frag", "email me at someone@example.org please",
    "ALL CAPS SENTENCE HERE", "snake_case_name and camelCaseName and kebab-case-name", "repeat repeat repeat repeat",
    "\"quoted\" 'single' `backtick`", "path/to/file.txt and C:\\Windows\\System32", "50% off — only $9.99!",
    "line one\r\nline two\r\n", "ÀÉÎÕÜ àéîõü ßñçø", "∑∫√∞≈≠ math symbols", "End."]
assert len(CROSS_PROMPTS) == 50


def test_cross_vocabulary_greedy_is_identical_to_plain_greedy_tiny(tiny_cross_pair):
    target, draft, tok = tiny_cross_pair
    prompts = [tok.encode(p, add_special=False) for p in CROSS_PROMPTS]
    plain = _engine.Engine(target, n_slots=4, n_ctx=256, n_threads=1)
    ref = run_all(plain, [(p, dict(max_tokens=24, ignore_eos=True)) for p in prompts])
    core = _engine.Engine(target, n_slots=4, n_ctx=256, n_threads=1, xdraft_model=draft)
    spec = {"sources": ["cross_vocab"], "k_max": 6, "adaptive": False}
    res = run_all(core, [(p, dict(max_tokens=24, ignore_eos=True, speculative=spec)) for p in prompts])
    for i, (a, b) in enumerate(zip(ref, res)):
        assert b["error"] is None, b["error"]
        assert a["tokens"] == b["tokens"], f"prompt {i} {CROSS_PROMPTS[i]!r} differs from plain greedy"
    drafted = sum(r["metrics"]["draft_n"] for r in res)
    assert drafted > 0 and all(set(r["metrics"]["draft_n_by_source"]) <= {"cross_vocab"} for r in res)
    assert sum(r["metrics"]["draft_ms"] for r in res) > 0


def test_cross_vocabulary_sampling_keeps_the_target_distribution(tiny_cross_pair):
    """The cross-vocabulary draft is a deterministic function of the history
    (greedy drafter, canonical tokenization), so accepting a draft token when
    the target's sample equals it is speculative sampling with a point-mass
    proposal: the distribution of a token that may come from a verified draft
    row (the third: the second step verifies a draft after the second) must
    be the target's."""
    target, draft, tok = tiny_cross_pair
    prompt = tok.encode("the cat sat on the mat. the cat sat on", add_special=False)
    core = _engine.Engine(target, n_slots=16, n_ctx=64, n_threads=1, xdraft_model=draft)
    spec = {"sources": ["cross_vocab"], "k_max": 3, "adaptive": False}
    n = 4000
    res = run_all(core, [(prompt, dict(max_tokens=3, temperature=1.0, seed=s, ignore_eos=True, speculative=spec))
                         for s in range(n)])
    seqs = [tuple(r["tokens"]) for r in res]
    assert all(len(s) == 3 for s in seqs)
    assert sum(r["metrics"]["draft_n"] for r in res) > 0
    assert sum(r["metrics"]["draft_accepted"] for r in res) > 0, "the test must exercise accepted drafts"
    ref = _engine.Engine(target, n_slots=1, n_ctx=64, n_threads=1)
    pairs = {}
    for s in seqs:
        pairs[s[:2]] = pairs.get(s[:2], 0) + 1
    t12 = max(pairs, key=pairs.get)
    sub = [s for s in seqs if s[:2] == t12]
    assert len(sub) >= 100, len(sub)
    logits3 = ref.forward(0, prompt + list(t12), 0)[-1]
    c3 = {}
    for s in sub:
        c3[s[2]] = c3.get(s[2], 0) + 1
    stat, pval = _chi2_ok(c3, _softmax(logits3), len(sub))
    assert pval > 1e-3, (stat, pval, len(sub))
    # and the first token, sampled at the end of the prompt
    c1 = {}
    for s in seqs:
        c1[s[0]] = c1.get(s[0], 0) + 1
    logits1 = ref.forward(0, prompt, 0)[-1]
    assert _chi2_ok(c1, _softmax(logits1), n)[1] > 1e-3
    assert _chi2_ok(c1, _softmax(logits1 * 1.5), n)[1] < 1e-3  # a wrong distribution fails the same check


def test_cross_vocabulary_source_needs_its_model(make_tiny):
    core = _engine.Engine(_engine.Model(str(make_tiny(wtype="F32").path)), n_ctx=64, n_threads=1)
    with pytest.raises(InvalidRequestError, match="cross-vocabulary draft model"):
        core.submit([1, 2, 3], speculative={"sources": ["cross_vocab"]})


# ------------------------------------------------------------- layer-skip calibration

@pytest.mark.smollm2
def test_forward_argmax_matches_the_logits_and_calibration_measures_layers(smollm2_path):
    from colibri_lab.speculative import CALIBRATION_TEXT, calibrate_layer_skip
    from colibri_lab.tokenizer import Tokenizer

    model = _engine.Model(smollm2_path)
    toks = Tokenizer.from_metadata(model.metadata()).encode(CALIBRATION_TEXT, add_special=False)[:48]
    core = _engine.Engine(model, n_slots=1, n_ctx=128, n_threads=2)
    full = core.forward_argmax(0, toks, 0)
    assert (full == core.forward(0, toks, 0).argmax(axis=1)).all()
    n_layer = model.info["n_layer"]
    skipped = core.forward_argmax(0, toks, 0, skip=list(range(1, n_layer)))
    assert (skipped != full).mean() > 0.5  # one block left: mostly different tokens
    with pytest.raises(InvalidRequestError, match="out of range"):
        core.forward_argmax(0, toks, 0, skip=[n_layer])
    cal = calibrate_layer_skip(core, toks, max_skip=4, k_max=4)
    assert sorted(cal.order) == list(range(n_layer)) and len(cal.layer_agreement) == n_layer
    assert all(0.0 <= a <= 1.0 for a in cal.layer_agreement)
    assert cal.layer_agreement[cal.order[0]] >= cal.layer_agreement[cal.order[-1]]
    assert 1 <= len(cal.skip_layers) <= 4 and set(cal.skip_layers) <= set(cal.order[:4])
    assert all(0 < c["cost"] <= 1.0 for c in cal.curve) and len(cal.verify_cost) == 5
    assert cal.expected_speedup == max(c["expected_speedup"] for c in cal.curve)


# ------------------------------------------------- every source on the real pair, every category

def _category_prompts(tok, template, n_per=1):
    from colibri_lab.chat import render
    from colibri_lab.experiments import load_workload
    from colibri_lab.experiments.workloads import SPEC_CATEGORIES

    out = []
    for cat in SPEC_CATEGORIES:
        for it in load_workload(cat, n=n_per).items:
            out.append((cat, tok.encode(render(template, it.messages(0, []), add_generation_prompt=True),
                                        add_special=False)))
    return out


@pytest.mark.realmodels
def test_every_source_on_the_real_pair_is_identical_to_plain_greedy(real_model, smollm2_path):
    from colibri_lab.speculative import CALIBRATION_TEXT, calibrate_layer_skip
    from colibri_lab.tokenizer import Tokenizer

    q15 = _engine.Model(str(real_model("qwen2.5-coder-1.5b")))
    q05 = _engine.Model(str(real_model("qwen2.5-coder-0.5b")))
    smol = _engine.Model(smollm2_path)
    meta = q15.metadata()
    tok = Tokenizer.from_metadata(meta)
    prompts = _category_prompts(tok, meta["tokenizer.chat_template"])
    # layer skip chosen by a (short) measured calibration
    cal_core = _engine.Engine(q15, n_slots=1, n_ctx=64, n_threads=2)
    cal = calibrate_layer_skip(cal_core, tok.encode(CALIBRATION_TEXT, add_special=False)[:32], max_skip=4, k_max=4)
    cal_core.close()
    # a slot per prompt: every configuration after the first reuses the prompt's KV
    kw = dict(n_slots=len(prompts), n_ctx=1024, n_threads=2)
    ref = run_all(_engine.Engine(q15, **kw), [(p, dict(max_tokens=16)) for _, p in prompts])
    core = _engine.Engine(q15, draft_model=q05, xdraft_model=smol, skip_layers=cal.skip_layers, **kw)
    configs = [["prompt_lookup"], ["draft"], ["cross_vocab"], ["layer_skip"], ["prompt_lookup", "draft"],
               ["prompt_lookup", "draft", "cross_vocab", "layer_skip"]]
    for sources in configs:
        spec = {"sources": sources, "k_max": 4, "adaptive": len(sources) > 1}
        res = run_all(core, [(p, dict(max_tokens=16, speculative=spec)) for _, p in prompts])
        for (cat, _), a, b in zip(prompts, ref, res):
            assert b["error"] is None, b["error"]
            assert a["tokens"] == b["tokens"], f"{sources}: {cat} differs from plain greedy"
        if len(sources) == 1 and sources != ["prompt_lookup"]:
            assert sum(r["metrics"]["draft_n"] for r in res) > 0, sources
    # the 0.5B drafts well for the 1.5B: a real draft pair
    st = core.spec_stats()["draft"]
    assert st["accept_rate"] > 0.3, st


@pytest.mark.realmodels
def test_combined_source_on_code_edits_continues_draft_model_drafts_by_lookup(real_model):
    """The combined source (prompt lookup and qwen2.5-coder-0.5b) on code edits: identical to plain
    greedy, both sources' drafts accepted, and draft-model drafts that reached copied text continued by
    lookup (each such draft is recorded once for each source, so the policy holds more drafts than the
    requests had draft steps)."""
    from colibri_lab.speculative import CATEGORY_ARMS, category_prompts
    from colibri_lab.tokenizer import Tokenizer

    q15 = _engine.Model(str(real_model("qwen2.5-coder-1.5b")))
    q05 = _engine.Model(str(real_model("qwen2.5-coder-0.5b")))
    meta = q15.metadata()
    tok = Tokenizer.from_metadata(meta)
    prompts = category_prompts(tok, meta["tokenizer.chat_template"], ["code_editing"], 3)["code_editing"]
    ref = run_all(_engine.Engine(q15, n_slots=1, n_ctx=1024, n_threads=2),
                  [(p, dict(max_tokens=64)) for _, p in prompts])
    core = _engine.Engine(q15, n_slots=1, n_ctx=1024, n_threads=2, draft_model=q05)
    res = run_all(core, [(p, dict(max_tokens=64, speculative=CATEGORY_ARMS["combined"])) for _, p in prompts])
    for (item, _), a, b in zip(prompts, ref, res):
        assert b["error"] is None, b["error"]
        assert a["tokens"] == b["tokens"], f"{item} differs from plain greedy"
    acc = {s: sum(r["metrics"]["draft_accepted_by_source"].get(s, 0) for r in res) for s in ("prompt_lookup", "draft")}
    assert acc["prompt_lookup"] > 0 and acc["draft"] > 0, acc
    st = core.spec_stats()
    steps = sum(r["metrics"]["draft_steps"] for r in res)
    assert st["prompt_lookup"]["drafts"] + st["draft"]["drafts"] > steps, (st, steps)


@pytest.mark.realmodels
def test_cross_vocabulary_on_the_real_pair_is_identical_on_50_prompts(real_model, smollm2_path):
    from colibri_lab.chat import render
    from colibri_lab.tokenizer import Tokenizer

    q15 = _engine.Model(str(real_model("qwen2.5-coder-1.5b")))
    meta = q15.metadata()
    tok = Tokenizer.from_metadata(meta)
    prompts = [tok.encode(render(meta["tokenizer.chat_template"], [{"role": "user", "content": p}],
                                 add_generation_prompt=True) if i % 2 else p, add_special=False)
               for i, p in enumerate(CROSS_PROMPTS)]
    kw = dict(n_slots=4, n_ctx=512, n_threads=2)
    ref = run_all(_engine.Engine(q15, **kw), [(p, dict(max_tokens=12)) for p in prompts])
    core = _engine.Engine(q15, xdraft_model=_engine.Model(smollm2_path), **kw)
    spec = {"sources": ["cross_vocab"], "k_max": 4, "adaptive": False}
    res = run_all(core, [(p, dict(max_tokens=12, speculative=spec)) for p in prompts])
    for i, (a, b) in enumerate(zip(ref, res)):
        assert b["error"] is None, b["error"]
        assert a["tokens"] == b["tokens"], f"prompt {i} {CROSS_PROMPTS[i]!r} differs from plain greedy"
    st = core.spec_stats()["cross_vocab"]
    assert st["draft_tokens"] > 0 and st["accepted_tokens"] > 0, st


def test_spec_summary_uses_vllm_names():
    from colibri_lab.speculative import spec_summary

    ms = [dict(draft_steps=4, draft_n=10, draft_accepted=6, draft_n_by_pos=[4, 3, 2, 1], draft_accepted_by_pos=[3, 2, 1, 0],
               draft_ms=5.0, decode_ms=50.0),
          dict(draft_steps=0, draft_n=0, draft_accepted=0, draft_ms=0.0, decode_ms=50.0)]
    s = spec_summary(ms)
    assert s["spec_decode_num_drafts"] == 4 and s["spec_decode_num_draft_tokens"] == 10
    assert s["spec_decode_num_accepted_tokens"] == 6 and s["spec_decode_num_accepted_tokens_per_pos"] == [3, 2, 1, 0]
    assert s["acceptance_rate"] == 0.6 and s["mean_acceptance_length"] == 2.5
    assert s["acceptance_rate_per_pos"] == [0.75, 0.5, 0.25, 0.0]
    assert s["conditional_acceptance_per_pos"] == [0.75, 2 / 3, 0.5, 0.0]
    assert s["draft_time_share"] == 0.05


@pytest.mark.realmodels
def test_cross_vocabulary_drafts_after_a_history_that_ends_mid_word(real_model, smollm2_path):
    """The undecided tail of the history (here a prompt that stops inside a word) is fed to the drafter as its
    canonical tokens in the catch-up forward; the draft continues the word from there.  On copied text the
    drafts are accepted, and the output is plain greedy's."""
    from colibri_lab.tokenizer import Tokenizer

    q15 = _engine.Model(str(real_model("qwen2.5-coder-1.5b")))
    tok = Tokenizer.from_metadata(q15.metadata())
    text = "numbers = [1, 2, 3]\ntotal = sum(numbers)\nprint(total)\n" * 3 + "numbers = [1, 2, 3]\ntotal = su"
    prompt = tok.encode(text, add_special=False)
    kw = dict(n_slots=1, n_ctx=512, n_threads=2)
    ref = run_all(_engine.Engine(q15, **kw), [(prompt, dict(max_tokens=24, ignore_eos=True))])
    core = _engine.Engine(q15, xdraft_model=_engine.Model(smollm2_path), **kw)
    spec = {"sources": ["cross_vocab"], "k_max": 4, "adaptive": False}
    res = run_all(core, [(prompt, dict(max_tokens=24, ignore_eos=True, speculative=spec))])
    assert res[0]["error"] is None and res[0]["tokens"] == ref[0]["tokens"]
    m = res[0]["metrics"]
    assert m["draft_n"] > 0 and m["draft_accepted"] >= 0.5 * m["draft_n"], m
    assert m["draft_accepted_by_pos"][0] >= 0.5 * m["draft_steps"], m
