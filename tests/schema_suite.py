"""The official JSON-Schema-Test-Suite (tests/fixtures/json-schema-test-suite:
the required tests of draft 2020-12 and draft 7, MIT) run through the
schema converter and the C grammar matcher, scored as MaskBench scores an
engine: a test instance passes when its schema compiles and the instance,
serialized by json.dumps (default separators, and indent=2; ensure_ascii=False
as a model writes text), is accepted token by token to an accepting state if
valid, and stopped somewhere if invalid.  A schema the converter refuses
fails all its instances.

Used by tests/test_schema_suite.py and scripts/bench_grammar.py (per-file
pass rates for docs/bench/grammar.md)."""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE = os.path.join(HERE, "fixtures", "json-schema-test-suite")
DRAFT_URI = {"draft2020-12": "https://json-schema.org/draft/2020-12/schema",
             "draft7": "http://json-schema.org/draft-07/schema#"}


@dataclass
class FileResult:
    name: str
    instances: int = 0
    passed: int = 0
    refused_instances: int = 0     # instances of schemas the converter refused
    invalid_accepted: list = field(default_factory=list)  # soundness failures
    valid_rejected: list = field(default_factory=list)


class Tokenizer:
    """Greedy longest-match over a model's vocabulary: a token sequence that
    spells the text (every byte is a token in byte-level vocabularies)."""

    def __init__(self, model):
        self.by_bytes = {}
        for i in range(model.n_vocab):
            b = bytes(model.token_bytes(i))
            if b and model.token_type(i) != 3 and not model.token_is_eog(i):
                self.by_bytes.setdefault(b, i)
        self.max_len = max(len(b) for b in self.by_bytes)

    def __call__(self, data: bytes) -> list:
        out, i = [], 0
        while i < len(data):
            for n in range(min(self.max_len, len(data) - i), 0, -1):
                t = self.by_bytes.get(data[i:i + n])
                if t is not None:
                    out.append(t)
                    i += n
                    break
            else:
                raise ValueError("byte %r has no token" % data[i:i + 1])
        return out


def accepts(grammar, tokens) -> bool:
    m = grammar.matcher()
    for t in tokens:
        try:
            m.accept(t)
        except Exception:  # noqa: BLE001 - InvalidRequestError: not allowed here
            return False
    return m.is_accepting


def serializations(data) -> list:
    return [json.dumps(data, ensure_ascii=False).encode(),
            json.dumps(data, ensure_ascii=False, indent=2).encode()]


def run_file(path: str, draft: str, model, tok, convert, stop_on_unsound=False) -> FileResult:
    """convert(schema) -> GBNF text or raises SchemaError."""
    from colibri_lab._engine import Grammar
    from colibri_lab.errors import GrammarError, SchemaError

    res = FileResult(os.path.basename(path)[:-5])
    with open(path, encoding="utf-8") as f:
        cases = json.load(f)
    for case in cases:
        schema = case["schema"]
        if isinstance(schema, dict) and "$schema" not in schema:
            schema = dict(schema, **{"$schema": DRAFT_URI[draft]})
        g = None
        try:
            g = Grammar(model, convert(schema))
        except (SchemaError, GrammarError):
            g = None
        for t in case["tests"]:
            res.instances += 1
            if g is None:
                res.refused_instances += 1
                continue
            ok = True
            for text in serializations(t["data"]):
                if accepts(g, tok(text)) != t["valid"]:
                    ok = False
                    what = "%s / %s: %s" % (case["description"], t["description"], text.decode())
                    (res.valid_rejected if t["valid"] else res.invalid_accepted).append(what)
                    if stop_on_unsound and not t["valid"]:
                        return res
                    break
            res.passed += ok
    return res


def files(draft: str) -> list:
    return sorted(glob.glob(os.path.join(SUITE, draft, "*.json")))
