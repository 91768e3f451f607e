"""JSON Schema -> GBNF: the grammar's language, checked with an independent
GBNF recognizer (tests/gbnf_ref.py) and the `jsonschema` validator.

(a) valid instances of each corpus schema are accepted, compact and pretty;
(b) invalid instances are rejected;
(c) random schemas -> random strings derived from the grammar -> they parse
    and validate (soundness);
plus unit tests of the pieces (integer ranges, regex subset, formats, errors).
"""
from __future__ import annotations

import functools
import glob
import json
import os
import random
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gbnf_ref
from colibri_lab.errors import InvalidRequestError
from colibri_lab.schema import (SchemaError, convert_schema, int_range_expr, json_object_gbnf,
                                json_value_gbnf, precheck, schema_to_gbnf)

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "fixtures", "schemas")
NAMES = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(CORPUS, "*.json")))
FORMAT_CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER


def load(name):
    with open(os.path.join(CORPUS, name + ".json"), encoding="utf-8") as f:
        schema = json.load(f)
    with open(os.path.join(CORPUS, "instances", name + ".json"), encoding="utf-8") as f:
        inst = json.load(f)
    return schema, inst["valid"], inst["invalid"]


def validator_for(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=FORMAT_CHECKER)


@functools.lru_cache(maxsize=None)
def grammar_for_text(text):
    return gbnf_ref.compile_gbnf(text)


def grammar(schema):
    return grammar_for_text(schema_to_gbnf(schema))


def compact(x):
    return json.dumps(x, ensure_ascii=False, separators=(",", ":"))


def pretty(x):
    return json.dumps(x, ensure_ascii=False, indent=2)


# ---------------------------------------------------------------------------
# Corpus

def test_corpus_size():
    assert len(NAMES) >= 50


@pytest.mark.parametrize("name", NAMES)
def test_corpus_schema(name):
    schema, valid, invalid = load(name)
    v = validator_for(schema)
    text = schema_to_gbnf(schema)
    g = gbnf_ref.compile_gbnf(text)
    assert not g.unproductive, g.unproductive
    assert valid, "every corpus schema has valid instances"
    for inst in valid:
        v.validate(inst)  # the fixture itself is right
        for s in (compact(inst), pretty(inst), json.dumps(inst, ensure_ascii=False)):
            assert gbnf_ref.accepts(g, s), "%s: grammar rejects valid %r" % (name, s)
    for inst in invalid:
        assert not v.is_valid(inst), "%s: fixture %r is not invalid" % (name, inst)
        s = compact(inst)
        assert not gbnf_ref.accepts(g, s), "%s: grammar accepts invalid %r" % (name, s)


@pytest.mark.parametrize("name", NAMES)
def test_corpus_generated_instances_validate(name):
    schema, _, _ = load(name)
    g = grammar(schema)
    v = validator_for(schema)
    rng = random.Random(name)
    for _ in range(8):
        s = gbnf_ref.generate(g, rng, max_depth=14)
        inst = json.loads(s)
        errs = list(v.iter_errors(inst))
        assert not errs, "%s: generated %r invalid: %s" % (name, s, errs[0].message)


# ---------------------------------------------------------------------------
# Generic grammars

def test_json_value_and_object():
    gv = grammar_for_text(json_value_gbnf())
    go = grammar_for_text(json_object_gbnf())
    for s in ['{}', '[]', '0', '-1.5e+10', '"a\\u00e9\\n"', 'true', 'null',
              '{"a": [1, {"b": null}], "c": "d"}', '{\n  "a": 1\n}']:
        assert gbnf_ref.accepts(gv, s), s
    for s in ['{}', '{"a": [1]}', '{ "x" : 1 , "y" : [ ] }']:
        assert gbnf_ref.accepts(go, s), s
    for s in ['[]', '1', '"x"', 'null']:
        assert not gbnf_ref.accepts(go, s), s
    for s in ['', '01', '1.', '.5', '[1,]', '{"a"}', "'a'", '"\x01"', 'tru', 'NaN',
              '{"a":1,}', '"\\x"', ' 1', '1' * 17, '1.' + '1' * 17]:
        assert not gbnf_ref.accepts(gv, s), s
    rng = random.Random(0)
    for _ in range(30):
        json.loads(gbnf_ref.generate(gv, rng))
        assert isinstance(json.loads(gbnf_ref.generate(go, rng)), dict)


def test_whitespace_is_bounded():
    g = grammar({"type": "array", "items": {"type": "integer"}})
    assert gbnf_ref.accepts(g, "[\n" + " " * 20 + "1]")
    assert not gbnf_ref.accepts(g, "[\n" + " " * 21 + "1]")
    assert not gbnf_ref.accepts(g, "[  1]")
    assert not gbnf_ref.accepts(g, "[\n\n1]")


def test_string_input_and_bool_schemas():
    assert schema_to_gbnf('{"type": "integer"}') == schema_to_gbnf({"type": "integer"})
    with pytest.raises(SchemaError):
        schema_to_gbnf("{not json")
    with pytest.raises(SchemaError, match="admits no value"):
        schema_to_gbnf(False)
    with pytest.raises(SchemaError):
        schema_to_gbnf(42)
    assert issubclass(SchemaError, InvalidRequestError)


def test_rule_names_are_llama_cpp_safe():
    for name in NAMES:
        text = schema_to_gbnf(load(name)[0])
        for line in text.splitlines():
            lhs = line.split(" ::= ")[0]
            assert re.fullmatch(r"[a-zA-Z0-9-]+", lhs), (name, lhs)
        assert text.startswith("root ::= ")


# ---------------------------------------------------------------------------
# Integer ranges

@pytest.mark.parametrize("lo,hi", [(0, 100), (-5, 2), (-5, 2 ** 31), (7, 7), (10, None),
                                   (None, -10), (None, 3), (-1000, -999), (99, 1001),
                                   (0, 0), (-2 ** 31, 2 ** 31 - 1), (123, 4567)])
def test_int_range_exact(lo, hi):
    g = grammar_for_text("root ::= " + int_range_expr(lo, hi) + "\n")
    probes = set(range(-1100, 1100))
    for b in (lo, hi):
        if b is not None:
            probes |= {b - 1, b, b + 1, b * 10, b // 10}
    probes |= {2 ** 31, 2 ** 31 - 1, -2 ** 31, -2 ** 31 - 1, 10 ** 15, 10 ** 16 - 1}
    for n in sorted(probes):
        want = (lo is None or n >= lo) and (hi is None or n <= hi) and len(str(abs(n))) <= 16
        assert gbnf_ref.accepts(g, str(n)) == want, (lo, hi, n)
    assert not gbnf_ref.accepts(g, "-0")
    assert not gbnf_ref.accepts(g, "007")


def test_int_range_empty():
    assert int_range_expr(5, 4) is None
    with pytest.raises(SchemaError, match="admits no value"):
        schema_to_gbnf({"type": "integer", "minimum": 5, "maximum": 4})


@settings(max_examples=40, deadline=None)
@given(st.integers(-10 ** 6, 10 ** 6), st.integers(0, 10 ** 6), st.data())
def test_int_range_hypothesis(lo, width, data):
    hi = lo + width
    g = grammar_for_text("root ::= " + int_range_expr(lo, hi) + "\n")
    for _ in range(12):
        n = data.draw(st.integers(lo - 50, hi + 50))
        assert gbnf_ref.accepts(g, str(n)) == (lo <= n <= hi), (lo, hi, n)


def test_number_bounds():
    g = grammar({"type": "number", "minimum": 0, "maximum": 100})
    for s in ["0", "0.0", "100", "100.000", "99.999", "50", "3.14159"]:
        assert gbnf_ref.accepts(g, s), s
    for s in ["-1", "-0.5", "100.001", "101", "1e2", "-0"]:
        assert not gbnf_ref.accepts(g, s), s
    g = grammar({"type": "number", "exclusiveMinimum": -3, "exclusiveMaximum": 3})
    for s in ["-2.99", "0", "2.9", "-2", "2"]:
        assert gbnf_ref.accepts(g, s), s
    for s in ["-3", "3", "3.0", "-3.0", "3.5", "-3.5"]:
        assert not gbnf_ref.accepts(g, s), s
    # a fractional bound is tightened to the integer inside it (narrower, sound)
    g = grammar({"type": "number", "minimum": 0.5, "exclusiveMaximum": 2.5})
    for s in ["1", "1.5", "2", "2.0"]:
        assert gbnf_ref.accepts(g, s), s
    for s in ["0.75", "2.25", "0", "3"]:
        assert not gbnf_ref.accepts(g, s), s
    with pytest.raises(SchemaError, match="'minimum'.*#/properties/x"):
        schema_to_gbnf({"properties": {"x": {"type": "number", "minimum": 0.5, "maximum": 0.7}}})


def test_integer_fractional_bounds():
    g = grammar({"type": "integer", "minimum": 0.5, "exclusiveMaximum": 3.5})
    assert [n for n in range(-3, 7) if gbnf_ref.accepts(g, str(n))] == [1, 2, 3]
    g = grammar({"type": "integer", "exclusiveMinimum": 1, "maximum": 4})
    assert [n for n in range(-3, 7) if gbnf_ref.accepts(g, str(n))] == [2, 3, 4]


# ---------------------------------------------------------------------------
# Strings, patterns, formats

def _string_grammar(**kw):
    return grammar(dict(type="string", **kw))


@pytest.mark.parametrize("pattern,good,bad", [
    (r"^\d{3}-\d{4}$", ["555-1234"], ["5551234", "555-12345", "a55-1234"]),
    (r"^[A-Z][a-z]+( [A-Z][a-z]+)*$", ["Ada", "Ada Lovelace"], ["ada", "Ada ", "A"]),
    (r"^(cat|dog|bird)s?$", ["cat", "dogs", "bird"], ["cow", "cats!"]),
    (r"^\w+@\w+\.com$", ["a_1@b.com"], ["a@b.org", "@b.com"]),
    (r"^[^@\s]+$", ["abc", "é"], ["a b", "a@b", ""]),
    (r"^a.c$", ["abc", "a\"c", "a\\c", "a\tc", "a😀c"], ["ac", "a\nc"]),
    (r"^\s*$", ["", "  ", "\t\n"], ["x"]),
    (r"^[\\\"]{2}$", ['\\"', '""', "\\\\"], ["ab"]),
    (r"^x{2,}$", ["xx", "xxxx"], ["x", ""]),
    (r"^(?:ab){1,2}c?$", ["ab", "ababc"], ["abababc", "c"]),
    (r"^[a-c-]+$", ["a-b"], ["d"]),
    (r"^\u00e9\x41$", ["éA"], ["eA"]),
    (r"[0-9]{5}", ["12345", "a12345b"], ["1234", "12a34"]),  # re.search semantics
    (r"^a|b$", ["a", "b", "ab", "ax", "xb"], ["", "c", "ba"]),
    (r"^\.\*\+\?\(\)\[\]\{\}\|\^\$\/$", [".*+?()[]{}|^$/"], ["x"]),
    (r"^\D\W\S$", ["a!a", "x#b", "a a"], ["1!a", "a  ", "aa a", "a!\u00a0"]),
    (r"^[^\s]\S$", ["ab", "é中"], ["a ", "a\u2028", "\u3000a"]),
])
def test_pattern(pattern, good, bad):
    g = _string_grammar(pattern=pattern)
    for s in good:
        assert re.search(pattern, s), (pattern, s)
        assert gbnf_ref.accepts(g, compact(s)), (pattern, s)
        assert gbnf_ref.accepts(g, json.dumps(s, ensure_ascii=False)), (pattern, s)
    for s in bad:
        assert not gbnf_ref.accepts(g, compact(s)), (pattern, s)
    rng = random.Random(pattern)
    for _ in range(20):
        s = json.loads(gbnf_ref.generate(g, rng))
        assert re.search(pattern, s), (pattern, s)


@pytest.mark.parametrize("pattern,what", [
    (r"^(?=a)a$", "lookahead"), (r"^(?!a).$", "negative lookahead"),
    (r"(?<=a)b", "lookbehind"), (r"^(a)\1$", "backreference"), (r"^a\bb$", r"\\b"),
    (r"(?i)^a$", "inline flags"), (r"a^b", "anchor"), (r"a$b", "anchor"),
    (r"^(?P<x>a)(?P=x)$", "backreference"), (r"a++", "possessive"),
])
def test_pattern_unsupported(pattern, what):
    with pytest.raises(SchemaError, match=what) as ei:
        schema_to_gbnf({"properties": {"p": {"type": "string", "pattern": pattern}}})
    assert "#/properties/p" in str(ei.value)


def test_unicode_space_list_matches_python():
    from colibri_lab.schema import UNICODE_SPACE
    got = [c for c in range(0x110000) if re.match(r"\s", chr(c))]
    want = [c for a, b in UNICODE_SPACE for c in range(a, b + 1)]
    assert got == want


def test_string_lengths_count_characters():
    g = _string_grammar(minLength=2, maxLength=3)
    for s in ["ab", "abc", "é中", "😀😀😀", 'a"', "\n\t"]:
        assert gbnf_ref.accepts(g, compact(s)), s
    for s in ["a", "abcd", "😀", "é中ab"]:
        assert not gbnf_ref.accepts(g, compact(s)), s
    assert not gbnf_ref.accepts(g, '"a\x01"')  # raw control character


def test_pattern_with_implied_lengths_and_conflicts():
    schema_to_gbnf({"type": "string", "pattern": "^[0-9]{5}$", "minLength": 5, "maxLength": 5})
    schema_to_gbnf({"type": "string", "format": "uuid", "maxLength": 36})
    with pytest.raises(SchemaError, match="'maxLength'.*'pattern'"):
        schema_to_gbnf({"type": "string", "pattern": "^[0-9]+$", "maxLength": 5})
    with pytest.raises(SchemaError, match="'pattern'.*'format'"):
        schema_to_gbnf({"type": "string", "pattern": "^a$", "format": "date"})


FORMAT_CASES = {
    "date": (["2024-02-28", "1999-12-31", "0001-01-01", "2024-04-30"],
             ["2024-02-30", "2024-13-01", "2024-1-01", "24-01-01", "2024-04-31", "2024-00-10"]),
    "time": (["00:00:00Z", "23:59:59.123+05:30", "12:00:00-01:00"],
             ["24:00:00Z", "12:60:00Z", "12:00:00", "1:00:00Z"]),
    "date-time": (["2024-05-01T09:00:00Z", "2000-01-31T23:59:59.999999-12:00"],
                  ["2024-05-01 09:00:00Z", "2024-05-01T09:00Z", "2024-05-01"]),
    "uuid": (["123e4567-e89b-12d3-a456-426614174000", "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF"],
             ["123e4567-e89b-12d3-a456-42661417400", "123e4567e89b12d3a456426614174000"]),
    "email": (["a@b.co", "first.last+tag@sub.example.org", "x_y@a-b.io"],
              ["plain", "@b.co", "a@", "a@b", "a b@c.de", "a@-b.co"]),
    "ipv4": (["0.0.0.0", "255.255.255.255", "10.2.30.199"],
             ["256.0.0.0", "1.2.3", "01.2.3.4", "1.2.3.4.5", "1.2.3.-4"]),
    "ipv6": (["::", "::1", "1::", "2001:db8::1", "1:2:3:4:5:6:7:8", "fe80::1:2:3:4:5:6",
              "::ffff:10.0.0.1", "1:2:3:4:5:6:1.2.3.4", "1::2:3:4:5:6:7", "1:2:3:4:5:6:7::"],
             ["1:2:3:4:5:6:7", "1::2::3", "12345::", ":1:2", "1:2:3:4:5:6:7:8:9", "g::1"]),
    "uri": (["https://example.com/a?b=c#d", "urn:isbn:123", "ftp://[::1]:21/x%20y"],
            ["no scheme", "1http://x", "http://a b", ""]),
}


@pytest.mark.parametrize("fmt", sorted(FORMAT_CASES))
def test_format(fmt):
    good, bad = FORMAT_CASES[fmt]
    schema = {"type": "string", "format": fmt}
    g = grammar(schema)
    v = validator_for(schema)
    for s in good:
        v.validate(s)
        assert gbnf_ref.accepts(g, compact(s)), (fmt, s)
    for s in bad:
        assert not gbnf_ref.accepts(g, compact(s)), (fmt, s)
    rng = random.Random(fmt)
    for _ in range(40):
        s = json.loads(gbnf_ref.generate(g, rng, max_depth=30))
        v.validate(s)  # checked formats: the validator agrees
        if fmt == "uri":
            assert re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", s)


def test_unknown_format_is_refused_unless_lenient():
    with pytest.raises(SchemaError, match="'format'.*'password'.*#/properties/p"):
        schema_to_gbnf({"properties": {"p": {"type": "string", "format": "password"}}})
    conv = convert_schema({"properties": {"p": {"type": "string", "format": "password"}}},
                          lenient=True)
    assert conv.ignored == [{"keyword": "format", "path": "#/properties/p",
                             "reason": "format 'password' is not enforced"}]
    assert gbnf_ref.accepts(grammar_for_text(conv.gbnf), '{"p":"anything"}')


# ---------------------------------------------------------------------------
# Objects

def test_optional_properties_any_subset_in_order():
    props = {k: {"type": "integer"} for k in "abcde"}
    schema = {"type": "object", "properties": props, "required": ["c"],
              "additionalProperties": False}
    g = grammar(schema)
    import itertools
    for r in range(0, 6):
        for keys in itertools.combinations("abcde", r):
            s = compact({k: 1 for k in keys})
            assert gbnf_ref.accepts(g, s) == ("c" in keys), s
    assert not gbnf_ref.accepts(g, '{"c":1,"a":1}')  # declared order only
    assert not gbnf_ref.accepts(g, '{"c":1,"c":1}')
    # the grammar is linear in the number of properties (no x? x? x? blowup)
    many = {"type": "object", "properties": {"p%d" % i: {"type": "integer"} for i in range(200)}}
    assert len(schema_to_gbnf(many)) < 200 * 400


def test_additional_properties_default_allowed_after_declared():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
              "required": ["a"]}
    g = grammar(schema)
    assert gbnf_ref.accepts(g, '{"a":1,"zz":[1,2],"b2":null}')
    assert gbnf_ref.accepts(g, '{"a":1,"b":"x","c":{}}')
    assert gbnf_ref.accepts(g, '{"a":1,"":0,"ab":0,"bb":1}')
    assert not gbnf_ref.accepts(g, '{"a":1,"b":2}')        # declared b must be a string
    assert not gbnf_ref.accepts(g, '{"a":1,"x":1,"b":"s"}')  # extras only after declared
    assert not gbnf_ref.accepts(g, '{"a":1,"a":2}')
    g = grammar({"type": "object", "properties": {"a": {"type": "integer"}},
                 "additionalProperties": {"type": "boolean"}})
    assert gbnf_ref.accepts(g, '{"a":1,"x":true}')
    assert not gbnf_ref.accepts(g, '{"a":1,"x":1}')
    assert not gbnf_ref.accepts(g, '{"x":true,"a":1}')


def test_required_not_declared_and_false_properties():
    g = grammar({"type": "object", "required": ["k"], "additionalProperties": {"type": "integer"}})
    assert gbnf_ref.accepts(g, '{"k":1}') and gbnf_ref.accepts(g, '{"k":1,"j":2}')
    assert not gbnf_ref.accepts(g, '{}')
    g = grammar({"type": "object", "properties": {"a": False, "b": {"type": "null"}}})
    assert gbnf_ref.accepts(g, '{"b":null}') and not gbnf_ref.accepts(g, '{"a":1}')
    with pytest.raises(SchemaError, match="admits no value"):
        schema_to_gbnf({"type": "object", "properties": {"a": False}, "required": ["a"]})
    with pytest.raises(SchemaError, match="admits no value"):
        schema_to_gbnf({"type": "object", "required": ["a"], "additionalProperties": False})


def test_keys_needing_escapes():
    schema = {"type": "object", "properties": {'q"uote': {"type": "integer"}, "é": {"type": "integer"},
                                               "a\\b": {"type": "integer"}},
              "additionalProperties": False}
    g = grammar(schema)
    inst = {'q"uote': 1, "é": 2, "a\\b": 3}
    assert gbnf_ref.accepts(g, compact(inst))
    assert gbnf_ref.accepts(g, pretty(inst))


# ---------------------------------------------------------------------------
# Arrays

def test_array_bounds_and_prefix():
    g = grammar({"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 4})
    for n in range(7):
        assert gbnf_ref.accepts(g, compact([True] * n)) == (2 <= n <= 4), n
    g = grammar({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                 "items": {"type": "null"}, "maxItems": 3})
    for inst, ok in [([], True), ([1], True), ([1, "a"], True), ([1, "a", None], True),
                     ([1, "a", None, None], False), (["a"], False), ([1, 2], False)]:
        assert gbnf_ref.accepts(g, compact(inst)) == ok, inst
    g = grammar({"type": "array", "prefixItems": [{"type": "integer"}], "minItems": 3})
    assert gbnf_ref.accepts(g, "[1,2,3]") and gbnf_ref.accepts(g, '[1,"x",{}]')
    assert not gbnf_ref.accepts(g, "[1,2]") and not gbnf_ref.accepts(g, '["x",2,3]')
    with pytest.raises(SchemaError, match="admits no value"):
        schema_to_gbnf({"type": "array", "items": False, "minItems": 1})


# ---------------------------------------------------------------------------
# Composition, refs, enums

def test_enum_const_type_filtering():
    g = grammar({"type": "string", "enum": ["a", 1, None, "b"]})
    assert gbnf_ref.accepts(g, '"a"') and gbnf_ref.accepts(g, '"b"')
    assert not gbnf_ref.accepts(g, "1") and not gbnf_ref.accepts(g, "null")
    g = grammar({"enum": [1, 2], "const": 2})
    assert gbnf_ref.accepts(g, "2") and not gbnf_ref.accepts(g, "1")
    g = grammar({"type": "integer", "enum": [1.0, 2.5, True]})
    assert gbnf_ref.accepts(g, "1.0") and not gbnf_ref.accepts(g, "2.5")
    assert not gbnf_ref.accepts(g, "true")
    g = grammar({"const": {"a": [1, "x"]}})
    assert gbnf_ref.accepts(g, '{"a":[1,"x"]}') and gbnf_ref.accepts(g, '{ "a" : [ 1 , "x" ] }')
    with pytest.raises(SchemaError, match="admits no value"):
        schema_to_gbnf({"type": "boolean", "enum": ["x"]})
    # other keywords filter the values
    with pytest.raises(SchemaError, match="admits no value"):
        schema_to_gbnf({"enum": ["x"], "minLength": 3})
    g = grammar({"enum": ["x", "abcd", 7, 12], "minLength": 3, "maximum": 10})
    assert gbnf_ref.accepts(g, '"abcd"') and gbnf_ref.accepts(g, "7")
    assert not gbnf_ref.accepts(g, '"x"') and not gbnf_ref.accepts(g, "12")


def test_allof_merging():
    g = grammar({"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 10}, {"type": "number"}]})
    assert gbnf_ref.accepts(g, "10") and not gbnf_ref.accepts(g, "11")
    assert not gbnf_ref.accepts(g, "1.5")
    # additionalProperties false on one side forbids the other's extra properties
    g = grammar({"allOf": [{"properties": {"a": {"type": "integer"}}, "additionalProperties": False},
                           {"properties": {"b": {"type": "integer"}}}]})
    assert gbnf_ref.accepts(g, '{"a":1}') and not gbnf_ref.accepts(g, '{"a":1,"b":1}')
    g = grammar({"allOf": [{"anyOf": [{"type": "string"}, {"type": "integer"}]},
                           {"anyOf": [{"type": "integer"}, {"type": "null"}]}]})
    assert gbnf_ref.accepts(g, "5")
    assert not gbnf_ref.accepts(g, '"s"') and not gbnf_ref.accepts(g, "null")
    with pytest.raises(SchemaError, match="'pattern'"):
        schema_to_gbnf({"allOf": [{"pattern": "^a"}, {"pattern": "^b"}]})
    with pytest.raises(SchemaError, match="admits no value"):
        schema_to_gbnf({"allOf": [{"type": "string"}, {"type": "integer"}]})


def test_anyof_with_siblings_distributes():
    g = grammar({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                 "additionalProperties": False,
                 "anyOf": [{"required": ["a"]}, {"required": ["b"]}]})
    assert gbnf_ref.accepts(g, '{"a":1}') and gbnf_ref.accepts(g, '{"b":1}')
    assert gbnf_ref.accepts(g, '{"a":1,"b":2}') and not gbnf_ref.accepts(g, "{}")


def test_refs():
    g = grammar({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"type": "integer"}},
                 "type": "array", "items": {"$ref": "#/$defs/a"}})
    assert gbnf_ref.accepts(g, "[1,2]") and not gbnf_ref.accepts(g, '["x"]')
    # a ref with sibling constraints
    g = grammar({"$defs": {"n": {"type": "integer"}},
                 "properties": {"x": {"$ref": "#/$defs/n", "minimum": 3}}})
    assert gbnf_ref.accepts(g, '{"x":3}') and not gbnf_ref.accepts(g, '{"x":2}')
    # mutual recursion
    g = grammar({"$defs": {"even": {"anyOf": [{"const": 0}, {"type": "array", "items": {"$ref": "#/$defs/odd"}, "minItems": 1, "maxItems": 1}]},
                           "odd": {"type": "array", "items": {"$ref": "#/$defs/even"}, "minItems": 1, "maxItems": 1}},
                 "$ref": "#/$defs/even"})
    assert gbnf_ref.accepts(g, "0") and gbnf_ref.accepts(g, "[[0]]")
    assert not gbnf_ref.accepts(g, "[0]") and not gbnf_ref.accepts(g, "[[[0]]]")
    with pytest.raises(SchemaError, match="'\\$ref'"):
        schema_to_gbnf({"$ref": "https://example.com/s.json"})
    with pytest.raises(SchemaError, match="unresolvable"):
        schema_to_gbnf({"$ref": "#/$defs/missing"})


@pytest.mark.parametrize("kw,value,why", [
    ("maxContains", {"contains": {"type": "integer"}, "maxContains": 1}, None),
    ("$dynamicRef", {"$dynamicRef": "#meta"}, "dynamic references"),
    ("oneOf", {"oneOf": [{"type": "integer"}, {"minimum": 2}]}, "branches 0 and 1 may overlap"),
    ("uniqueItems", {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
     "elements not from a finite set"),
    ("unevaluatedProperties", {"allOf": [{"properties": {"x": {}}}],
                               "unevaluatedProperties": False}, "together with applicators"),
    ("multipleOf", {"type": "number", "multipleOf": 0.5}, "only integer divisors"),
    ("format", {"type": "string", "format": "iri"}, "format 'iri' is not enforced"),
    ("pattern", {"type": "string", "pattern": "a", "format": "date"}, "together with 'format'"),
])
def test_refused_keywords_named_with_path(kw, value, why):
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": value}}}
    with pytest.raises(SchemaError) as ei:
        schema_to_gbnf(schema)
    msg = "unsupported JSON Schema keyword %r%s at #/properties/a/items" % (
        kw, " (%s)" % why if why else "")
    assert str(ei.value) == msg
    conv = convert_schema(schema, lenient=True)
    assert [(i["keyword"], i["path"]) for i in conv.ignored] == [(kw, "#/properties/a/items")]


# Keywords seen in real schemas that do not constrain validity: ignored.
IGNORED = ["id", "_format", "self", "readonly", "links", "name", "example", "version",
           "comment", "javaType", "preferredOrder", "x-vendor", "nullable", "discriminator",
           "$anchor", "$comment", "contentMediaType", "contentSchema", "deprecated", "markdownDescription"]


@pytest.mark.parametrize("kw", IGNORED)
def test_unknown_and_annotation_keywords_compile(kw):
    base = {"type": "object", "properties": {"a": {"type": "integer"}}}
    sch = dict(base, properties={"a": {"type": "integer", kw: {"x": 1}}}, **{kw: "v"})
    assert schema_to_gbnf(sch) == schema_to_gbnf(base)


def test_draft7_ref_siblings_ignored_2020_applied():
    defs = {"definitions": {"i": {"type": "integer"}}}
    d7 = dict(defs, **{"$schema": "http://json-schema.org/draft-07/schema#",
                       "$ref": "#/definitions/i", "maximum": 3})
    d2020 = dict(defs, **{"$ref": "#/definitions/i", "maximum": 3})
    assert gbnf_ref.accepts(grammar(d7), "5")
    assert not gbnf_ref.accepts(grammar(d2020), "5") and gbnf_ref.accepts(grammar(d2020), "3")


def test_precheck_bounds_bad_input_fast():
    import time
    for bad, what in [({"enum": list(range(100_000))}, "'enum' at # has 100000 values"),
                      ({"anyOf": [{"const": i} for i in range(10_000)]}, "'anyOf' at # has 10000"),
                      (functools.reduce(lambda a, _: {"items": a}, range(5000), {}), "nests too deeply")]:
        t = time.process_time()
        with pytest.raises(SchemaError, match=what):
            precheck(bad)
        with pytest.raises(SchemaError, match=what):
            schema_to_gbnf(bad)
        assert time.process_time() - t < 0.5
    # a deep $ref chain or a combinatorial allOf is bounded by the converter's deadline / sizes
    chain = {"$defs": {"d%d" % i: {"$ref": "#/$defs/d%d" % (i + 1)} for i in range(3000)}}
    chain["$defs"]["d3000"] = {"type": "integer"}
    chain["$ref"] = "#/$defs/d0"
    t = time.process_time()
    try:
        schema_to_gbnf(chain)
    except SchemaError:
        pass
    assert time.process_time() - t < 2.0


def test_lenient_reports_what_it_ignored():
    schema = {"type": "object", "properties": {
        "a": {"type": "string", "format": "color"},
        "b": {"oneOf": [{"type": "integer"}, {"type": "number"}]},
        "c": {"type": "array", "contains": {"const": 1}, "maxContains": 2}}}
    conv = convert_schema(schema, lenient=True)
    assert sorted((i["keyword"], i["path"]) for i in conv.ignored) == [
        ("format", "#/properties/a"), ("maxContains", "#/properties/c"), ("oneOf", "#/properties/b")]
    assert convert_schema({"type": "integer"}, lenient=True).ignored == []


def test_annotations_ignored():
    base = {"type": "integer"}
    ann = dict(base, title="t", description="d", examples=[1], default=2,
               **{"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "x",
                  "$comment": "c"})
    assert schema_to_gbnf(ann) == schema_to_gbnf(base)


# ---------------------------------------------------------------------------
# (c) Soundness on random schemas: strings derived from the grammar parse as
# JSON and validate.

NAMES_ST = st.sampled_from(["a", "b", "id", "name", "x y", "é", "n2", "q\"", "type"])
PATTERNS = [r"^[a-z]{1,5}$", r"^\d{3}-\d{2}$", r"^(ab|cd)+$", r"^[A-Z][a-z]*\.?$",
            r"^[^\s\"]{2,4}$", r"^x?y*z$"]
FORMATS = ["date", "time", "date-time", "uuid", "email", "ipv4", "ipv6"]


def _leaf():
    ints = st.builds(lambda lo, w, use_lo, use_hi: {
        "type": "integer", **({"minimum": lo} if use_lo else {}),
        **({"maximum": lo + w} if use_hi else {})},
        st.integers(-1000, 1000), st.integers(0, 3000), st.booleans(), st.booleans())
    nums = st.builds(lambda lo, w, xl, xh, use: {
        "type": "number", **({("exclusiveMinimum" if xl else "minimum"): lo} if use & 1 else {}),
        **({("exclusiveMaximum" if xh else "maximum"): lo + w} if use & 2 else {})},
        st.integers(-100, 100), st.integers(1, 200), st.booleans(), st.booleans(),
        st.integers(0, 3))
    strs = st.one_of(
        st.builds(lambda lo, w: {"type": "string", "minLength": lo, "maxLength": lo + w},
                  st.integers(0, 4), st.integers(0, 4)),
        st.just({"type": "string"}),
        st.sampled_from(PATTERNS).map(lambda p: {"type": "string", "pattern": p}),
        st.sampled_from(FORMATS).map(lambda f: {"type": "string", "format": f}),
    )
    enums = st.lists(st.one_of(st.integers(-5, 5), st.text(max_size=3), st.booleans(),
                               st.none()), min_size=1, max_size=4).map(lambda v: {"enum": v})
    return st.one_of(ints, nums, strs, enums, st.just({"type": "boolean"}),
                     st.just({"type": "null"}), st.just({}),
                     st.builds(lambda v: {"const": v}, st.text(max_size=3)))


def _extend(children):
    def mkobj(props, req_mask, addl):
        o = {"type": "object", "properties": props}
        names = list(props)
        req = [n for i, n in enumerate(names) if req_mask >> i & 1]
        if req:
            o["required"] = req
        if addl is not None:
            o["additionalProperties"] = addl
        return o

    def mkarr(items, lo, w, bounded):
        a = {"type": "array", "items": items, "minItems": lo}
        if bounded:
            a["maxItems"] = lo + w
        return a

    objs = st.builds(mkobj, st.dictionaries(NAMES_ST, children, max_size=4),
                     st.integers(0, 15), st.one_of(st.none(), st.just(False), children))
    arrs = st.builds(mkarr, children, st.integers(0, 2), st.integers(0, 3), st.booleans())
    tuples = st.builds(lambda p, it, lo: {"type": "array", "prefixItems": p, "items": it,
                                          "minItems": lo},
                       st.lists(children, min_size=1, max_size=3),
                       st.one_of(st.just(False), children), st.integers(0, 2))
    anyof = st.lists(children, min_size=1, max_size=3).map(lambda b: {"anyOf": b})
    # oneOf exclusivity is not enforced: only disjoint branches here
    oneof = st.lists(st.sampled_from(["string", "integer", "boolean", "null", "array"]),
                     min_size=1, max_size=3, unique=True).map(
        lambda ts: {"oneOf": [{"type": t} for t in ts]})
    allof = st.lists(children, min_size=2, max_size=2).map(lambda b: {"allOf": b})
    # the keywords compiled by rewriting or counting (issue 16)
    nots = children.map(lambda c: {"not": c})
    ifs = st.builds(lambda i, t, e: {"if": i, "then": t, "else": e}, children, children, children)
    deps = st.builds(lambda props, a, b: {"type": "object", "properties": props,
                                          "dependentRequired": {a: [b]}},
                     st.dictionaries(NAMES_ST, children, max_size=3), NAMES_ST, NAMES_ST)
    pats = st.builds(lambda p, v, addl, lo, w: {
        "type": "object", "patternProperties": {p: v}, "additionalProperties": addl,
        "minProperties": lo, "maxProperties": lo + w},
        st.sampled_from(["^x", "[0-9]$", "^[ab]+$"]), children, st.booleans(),
        st.integers(0, 2), st.integers(0, 2))
    counted = st.builds(lambda props, lo, w: {"type": "object", "properties": props,
                                              "minProperties": lo, "maxProperties": lo + w},
                        st.dictionaries(NAMES_ST, children, max_size=4),
                        st.integers(0, 3), st.integers(0, 2))
    contains = st.builds(lambda c, it, k: {"type": "array", "items": it, "contains": c,
                                           "minContains": k}, children, children, st.integers(0, 2))
    unique = st.lists(st.one_of(st.integers(-3, 3), st.booleans(), st.text(max_size=2)),
                      min_size=1, max_size=4).map(
        lambda vs: {"type": "array", "items": {"enum": vs}, "uniqueItems": True})
    mult = st.builds(lambda m, lo: {"type": "integer", "multipleOf": m,
                                    **({"minimum": lo, "maximum": lo + 50} if lo % 2 else {})},
                     st.integers(2, 12), st.integers(-40, 40))
    return st.one_of(objs, arrs, tuples, anyof, oneof, allof, nots, ifs, deps, pats, counted,
                     contains, unique, mult)


_TREES = st.recursive(_leaf(), _extend, max_leaves=8)
# $ref resolves against the document root: definitions live at the top
SCHEMAS = st.one_of(_TREES, _TREES.map(lambda c: {
    "$defs": {"d": c}, "type": "array", "items": {"$ref": "#/$defs/d"}, "maxItems": 2}))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(SCHEMAS, st.integers(0, 2 ** 32 - 1))
def test_random_schemas_sound(schema, seed):
    try:
        text = schema_to_gbnf(schema)
    except SchemaError as e:
        # refusals name the keyword (or say nothing is admitted)
        assert "admits no value" in str(e) or "unsupported JSON Schema keyword" in str(e) \
            or "too complex" in str(e), (schema, e)
        return
    g = gbnf_ref.compile_gbnf(text)
    v = validator_for(schema)
    rng = random.Random(seed)
    for _ in range(4):
        s = gbnf_ref.generate(g, rng, max_depth=12)
        inst = json.loads(s)
        errs = list(v.iter_errors(inst))
        assert not errs, "schema %s\ngenerated %r\n%s" % (json.dumps(schema), s, errs[0].message)
        if len(s) < 300:
            assert gbnf_ref.accepts(g, s), s


# ---------------------------------------------------------------------------
# Cross-check with llama.cpp's own GBNF parser (optional: needs the anchors
# extra `llama-cpp-python` and a local SmolLM2 GGUF for its vocabulary).

def _smollm2_path():
    p = os.environ.get("COLIBRI_LAB_SMOLLM2") or os.path.expanduser(
        "~/.cache/colibri-lab/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    return p if os.path.exists(p) else None


@pytest.mark.skipif(_smollm2_path() is None, reason="no local SmolLM2 GGUF")
def test_llama_cpp_parses_every_grammar():
    L = pytest.importorskip("llama_cpp").llama_cpp
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.vocab_only = True
    model = L.llama_model_load_from_file(_smollm2_path().encode(), mp)
    assert model
    try:
        vocab = L.llama_model_get_vocab(model)
        texts = [json_value_gbnf(), json_object_gbnf()]
        texts += [schema_to_gbnf(load(n)[0]) for n in NAMES]
        texts += [schema_to_gbnf({"type": "string", "pattern": p}) for p in
                  [r"^[^@\s]+\u00e9[\\\"]{2}.x*$", r"^\S\D\W$", r"^[\]\[-]\x7f$"]]
        texts.append(schema_to_gbnf({"properties": {"é": {}, 'q"': {"type": "integer"}}}))
        for t in texts:
            smpl = L.llama_sampler_init_grammar(vocab, t.encode(), b"root")
            assert smpl, "llama.cpp rejects grammar:\n" + t
            L.llama_sampler_free(smpl)
    finally:
        L.llama_model_free(model)


# Arbitrary JSON documents as schemas: the converter returns a grammar or
# raises SchemaError, nothing else, in bounded time (it runs on untrusted input).
_KEYS = st.sampled_from(["type", "properties", "items", "prefixItems", "required", "enum", "const",
                         "anyOf", "oneOf", "allOf", "not", "if", "then", "else", "$ref", "minimum",
                         "maximum", "exclusiveMinimum", "multipleOf", "minLength", "maxLength",
                         "pattern", "format", "minItems", "maxItems", "uniqueItems", "contains",
                         "minContains", "maxContains", "patternProperties", "additionalProperties",
                         "propertyNames", "minProperties", "maxProperties", "dependentRequired",
                         "dependentSchemas", "dependencies", "unevaluatedProperties", "$defs", "a"])
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-5, 5, allow_nan=False) |
    st.sampled_from(["string", "integer", "object", "array", "#", "#/$defs/a", "^a+$", "[", "date", "a"]),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(_KEYS, c, max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_JSON)
def test_converter_fuzz_only_schema_errors(doc):
    import time
    t = time.process_time()
    for lenient in (False, True):
        try:
            text = convert_schema(doc, lenient=lenient).gbnf
        except SchemaError:
            continue
        assert text.startswith("root ::= ")
    assert time.process_time() - t < 5
