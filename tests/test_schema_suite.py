"""JSON Schema converter + C matcher on the official JSON-Schema-Test-Suite
(tests/schema_suite.py): no invalid instance gets through a schema that
compiles, and at least 60% of the required draft 2020-12 instances pass."""
from __future__ import annotations

import pytest

import schema_suite as S
from colibri_lab.schema import schema_to_gbnf


@pytest.fixture(scope="module")
def setup(make_tiny):
    from colibri_lab import _engine
    model = _engine.Model(str(make_tiny().path))
    return model, S.Tokenizer(model)


@pytest.fixture(scope="module")
def results(setup):
    model, tok = setup
    return {d: [S.run_file(p, d, model, tok, schema_to_gbnf) for p in S.files(d)]
            for d in ("draft2020-12", "draft7")}


@pytest.mark.parametrize("draft", ["draft2020-12", "draft7"])
def test_no_invalid_instance_accepted(results, draft):
    for r in results[draft]:
        assert not r.invalid_accepted, "%s/%s: invalid instance accepted: %s" % (
            draft, r.name, r.invalid_accepted[0])


def test_pass_rate_draft2020(results):
    rs = results["draft2020-12"]
    n = sum(r.instances for r in rs)
    passed = sum(r.passed for r in rs)
    assert n > 1000
    assert passed / n >= 0.60, "%d / %d = %.1f%%" % (passed, n, 100 * passed / n)


def test_harness_detects_unsound_grammars(setup):
    """Control: a converter that ignores the schema is caught at once."""
    from colibri_lab.schema import json_value_gbnf
    model, tok = setup
    path = [p for p in S.files("draft2020-12") if p.endswith("/type.json")][0]
    r = S.run_file(path, "draft2020-12", model, tok, lambda s: json_value_gbnf(), stop_on_unsound=True)
    assert r.invalid_accepted
