"""JSON Schema -> GBNF (llama.cpp dialect), pure Python.

`schema_to_gbnf(schema)` returns grammar text whose start rule is `root`; the C
grammar engine compiles it and masks tokens so that the output is a JSON text
that validates against the schema.  `convert_schema(schema, lenient=...)`
also says what lenient mode left out; `precheck(schema)` bounds the work on
untrusted input with the limits in schema/limits.py, the one definition the
Engine and the server's routes share (both call it before anything else).

Policy
------
* Keywords that do not constrain validity (annotations such as `title`,
  `description`, `examples`, `default`, `readOnly`; identifiers `$id`, `id`,
  `$anchor`; containers `$defs`, `definitions`; vendor and unknown keywords
  such as `x-...`, `javaType`, `links`) are ignored, as the specification says
  an implementation must.
* Every keyword that constrains validity is either enforced exactly (or by a
  grammar narrower than the schema: every output still validates), or the
  schema is refused with `SchemaError` naming the keyword and its JSON
  pointer: "unsupported JSON Schema keyword 'maxContains' at #/items".
  Nothing that constrains validity is silently ignored.
* `format` is enforced for date-time, date, time, duration, email, hostname,
  ipv4, ipv6, uuid, uri, uri-reference; any other format is refused.
* `oneOf` is compiled to an alternation only when its branches are provably
  disjoint (different types, disjoint consts / enums, a required property
  another branch forbids or gives a disjoint value, disjoint numeric or length
  ranges); otherwise it is refused.
* `lenient=True` (Engine(lenient=True), or `lenient` in a request) leaves out
  what cannot be enforced instead of refusing, and reports each keyword left
  out ({keyword, path, reason}).
* Drafts 4, 6, 7, 2019-09 and 2020-12: `definitions` and `$defs`, `items` as
  an array and `prefixItems`, `additionalItems`, boolean and number forms of
  `exclusiveMinimum`/`exclusiveMaximum`, `dependencies` and
  `dependentRequired`/`dependentSchemas`; `$ref` siblings apply from 2019-09
  on and are ignored for a `$schema` of draft 7 or earlier; recursive `$ref`
  becomes a recursive rule.  `$dynamicRef`/`$recursiveRef` and remote `$ref`
  are refused.

Where the grammar is narrower than the schema (sound, documented so a caller
is not surprised):

* Object members appear in the order the schema declares them; any subset of
  the optional ones may be omitted.  Other members come after the declared
  ones and their names never equal a declared name.  With
  `patternProperties`, other names come only from the patterns (a value then
  satisfies every pattern's schema).
* Whitespace between tokens is bounded: nothing, one space, or a newline and up
  to 20 spaces/tabs (`space` rule).  So generation cannot loop on whitespace,
  and `json.dumps(x, indent=2)` output is accepted up to 10 nesting levels.
* Numbers have at most 16 integer digits, 16 fraction digits, 3 exponent digits;
  bounded numbers (minimum/maximum...) have no exponent and a fraction short
  enough that decimal->double rounding can never land on an exclusive bound; a
  fractional bound is tightened to the integer inside it.  Integers (and
  numbers under an integer `multipleOf`) are written without fraction or
  exponent.
* String constants (enum/const, pattern literals) are accepted in the form
  `json.dumps(..., ensure_ascii=False)` writes them, not in every escaped form.
* `pattern` has `re.search` semantics (an unanchored side may be preceded or
  followed by any text), except together with length bounds it does not
  imply, where full matches are generated; \\d \\w \\s are ASCII.
* `not` is exact for types, consts and enums of strings / booleans / null,
  `required`, `properties`, and numeric, length and count bounds; elsewhere it
  keeps only the instances the negated keyword does not apply to (e.g. `not`
  of a `pattern` admits every non-string).  `if`/`then`/`else` and the
  dependent* keywords are rewritten through `anyOf`.
* `contains` makes some element match (anywhere, when no other count bound is
  given; otherwise the first minContains elements); `maxContains` is refused.
  `uniqueItems` holds for elements from a finite set (written in the set's
  order) and for tuples of pairwise disjoint positions; otherwise refused.
* A `string` minLength/maxLength counts code points; a raw astral character is
  one, a `\\uD83D\\uDE00` escape pair counts two (it is one for the validator),
  so the bound holds for every raw-UTF-8 output.
* `hostname` has at most 3 labels.

A schema that admits no value at all is an error too.
"""
from ..errors import InvalidRequestError, SchemaError  # noqa: F401  (SchemaError re-exported)
from .charset import UNICODE_SPACE, charset_expr  # noqa: F401
from .convert import Conversion, convert_schema, json_object_gbnf, json_value_gbnf, schema_to_gbnf
from .limits import precheck
from .gbnf import SPACE_RULE
from .intrange import int_range_expr

__all__ = ["SchemaError", "Conversion", "convert_schema", "schema_to_gbnf", "precheck",
           "json_object_gbnf", "json_value_gbnf", "SPACE_RULE", "int_range_expr"]
