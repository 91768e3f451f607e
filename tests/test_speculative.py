"""Speculative decoding (issue 5): lossless verification for every draft
source, reproducible sampling, a chi-square test that speculative sampling
keeps the target's next-token distribution, and the self-disabling policy."""
from __future__ import annotations

import numpy as np
import pytest

from colibri_lab import _engine
from colibri_lab.errors import InvalidRequestError

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
    m = res["metrics"]
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
def test_adaptive_policy_pauses_an_unprofitable_source(smol):
    """The full model as its own 'layer skip' with almost every layer skipped
    drafts garbage: the policy must stop paying for it."""
    model, _, prompts = smol
    n_layer = model.info["n_layer"]
    core = _engine.Engine(model, n_slots=1, n_ctx=512, n_threads=2, skip_layers=list(range(1, n_layer)))
    res = run_all(core, [(prompts[6], dict(max_tokens=96, ignore_eos=True,
                                           speculative={"sources": ["layer_skip"], "k_max": 6}))])[0]
    stats = core.spec_stats()["layer_skip"]
    m = res["metrics"]
    assert m["draft_steps"] < 40, (m, stats)  # far fewer than the ~95 decode steps
    assert stats["expected_gain"] < 1.5


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
