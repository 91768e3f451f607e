"""The JSON Schema converter: a schema becomes GBNF text whose start rule is
`root` (the policy and the places where the grammar is narrower than the
schema are in the package docstring, colibri_lab/schema/__init__.py)."""
from __future__ import annotations

import json
import math
import re
import time
from typing import Any, Optional

from ..errors import SchemaError
from .charset import _complement, charset_expr
from .formats import FORMAT_LENGTHS, FORMATS
from .gbnf import (FRAC_DIGITS, PRIMITIVE_DEPS, PRIMITIVES, _group, _json_dumps, _lit,
                   _ptr_escape, _join, _rep)
from .intrange import _nonneg_range, int_range_expr
from .limits import MAX_SCHEMA_BYTES, precheck
from .regex import _RegexParser, _regex_len, _regex_to_gbnf

ALL_TYPES = ("string", "number", "integer", "boolean", "null", "object", "array")

# Keywords that constrain validity, per type they apply to (None: every
# instance).  Every other keyword (annotations, identifiers, containers such
# as $defs, vendor and unknown keywords) is ignored, as the specification
# says an implementation must.
VALIDATION = {
    None: {"type", "enum", "const", "allOf", "anyOf", "oneOf", "not", "if", "then", "else",
           "$ref", "$dynamicRef", "$recursiveRef"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "array": {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems",
              "contains", "minContains", "maxContains", "unevaluatedItems"},
    "object": {"properties", "patternProperties", "additionalProperties", "required",
               "dependentRequired", "dependentSchemas", "dependencies", "propertyNames",
               "minProperties", "maxProperties", "unevaluatedProperties"},
}
KEYWORD_TYPE = {k: t for t, ks in VALIDATION.items() for k in ks}
# Internal keyword written by `not`: values the instance must not equal.
NOT_ENUM = "\x00not-enum"
KEYWORD_TYPE[NOT_ENUM] = None
# Drafts up to 7 ignore the siblings of `$ref`.
OLD_DRAFTS = ("draft-03", "draft-04", "draft-06", "draft-07")
# Work bounds (see precheck): the converter refuses what would exceed them.
MAX_RULES = 20000
MAX_GBNF_BYTES = 4 << 20
DEADLINE_S = 0.5

# ----------------------------------------------------------------------------

def _type_of(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    raise SchemaError("unsupported constant %r" % (v,))


def _type_matches(v, types) -> bool:
    t = _type_of(v)
    return t in types or (t == "integer" and "number" in types)


def _json_eq(a, b) -> bool:
    """JSON equality as the validator sees it: 1 == 1.0, but True != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_eq(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_eq(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _types_of(s) -> set:
    """Types an instance of (merged, ref-free) schema s can have; integer is
    listed on its own and also whenever number is."""
    if s is False:
        return set()
    if not isinstance(s, dict):
        return set(ALL_TYPES)
    t = set(ALL_TYPES)
    if "type" in s:
        ty = [s["type"]] if isinstance(s["type"], str) else list(s["type"])
        t = set(ty) | ({"integer"} if "number" in ty else set())
    for k in ("enum", "const"):
        if k in s:
            vals = s[k] if k == "enum" and isinstance(s[k], list) else [s[k]]
            vt = set()
            for v in vals:
                ty = _type_of(v)
                vt |= {"integer", "number"} if ty == "integer" else {ty}
            t &= vt
    return t


def _num_range(s):
    """(lo, lo_excl, hi, hi_excl) of a schema's numeric bounds (None = open)."""
    lo = s.get("minimum")
    hi = s.get("maximum")
    lx = hx = False
    em, eM = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
    if isinstance(em, bool):
        lx = em
    elif isinstance(em, (int, float)) and (lo is None or em >= lo):
        lo, lx = em, True
    if isinstance(eM, bool):
        hx = eM
    elif isinstance(eM, (int, float)) and (hi is None or eM <= hi):
        hi, hx = eM, True
    ok = lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
    return (lo, lx, hi, hx) if ok(lo) and ok(hi) else (None, False, None, False)


def _check(v, s):
    """Does JSON value v validate against schema s?  True / False, or None
    when s uses a keyword this small checker does not decide."""
    if s is True:
        return True
    if s is False:
        return False
    if not isinstance(s, dict):
        return None
    for k, x in s.items():
        if k not in KEYWORD_TYPE:
            continue
        applies = KEYWORD_TYPE[k]
        ty = _type_of(v)
        if applies == "number" and ty not in ("integer", "number"):
            continue
        if applies not in (None, "number") and ty != applies:
            continue
        if k == "type":
            ts = [x] if isinstance(x, str) else x
            if not _type_matches(v, ts):
                return False
        elif k == "enum":
            if not any(_json_eq(v, y) for y in x):
                return False
        elif k == "const" and not _json_eq(v, x):
            return False
        elif k == NOT_ENUM and any(_json_eq(v, y) for y in x):
            return False
        elif k in ("minLength", "maxLength"):
            n = len(v)
            if (k == "minLength" and n < x) or (k == "maxLength" and n > x):
                return False
        elif k == "pattern":
            try:
                if not re.search(x, v):
                    return False
            except (re.error, TypeError):
                return None
        elif k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            lo, lx, hi, hx = _num_range(s)
            if (lo is not None and (v < lo or (lx and v == lo))) or \
                    (hi is not None and (v > hi or (hx and v == hi))):
                return False
        elif k == "multipleOf":
            if not isinstance(x, int) or isinstance(x, bool) or x <= 0:
                return None
            if not float(v).is_integer() or int(v) % x:
                return False
        elif k in ("minItems", "maxItems", "minProperties", "maxProperties"):
            n = len(v)
            if (k.startswith("min") and n < x) or (k.startswith("max") and n > x):
                return False
        elif k == "required":
            if any(r not in v for r in x):
                return False
        elif k == "properties":
            for pk, ps in x.items():
                if pk in v:
                    r = _check(v[pk], ps)
                    if r is not True:
                        return r
        elif k == "additionalProperties":
            if s.get("patternProperties"):
                return None
            extra = [pk for pk in v if pk not in s.get("properties", {})]
            for pk in extra:
                r = _check(v[pk], x)
                if r is not True:
                    return r
        elif k == "items" and isinstance(x, (dict, bool)) and "prefixItems" not in s:
            for it in v:
                r = _check(it, x)
                if r is not True:
                    return r
        elif k in ("anyOf", "oneOf", "allOf"):
            rs = [_check(v, b) for b in x]
            if None in rs:
                return None
            n = sum(rs)
            if (k == "anyOf" and n == 0) or (k == "oneOf" and n != 1) or (k == "allOf" and n != len(rs)):
                return False
        else:
            return None
    return True


def _disjoint(a, b) -> bool:
    """True when no instance can validate against both (merged, ref-free)
    schemas; False when that is not proven."""
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    common = _types_of(a) & _types_of(b)
    if not common:
        return True
    for x, y in ((a, b), (b, a)):
        vals = x["enum"] if isinstance(x.get("enum"), list) else [x["const"]] if "const" in x else None
        if vals is not None and all(_check(v, y) is False for v in vals):
            return True
    if common <= {"object"}:
        pa, pb = a.get("properties", {}), b.get("properties", {})
        if isinstance(pa, dict) and isinstance(pb, dict):
            for x, y, px, py in ((a, b, pa, pb), (b, a, pb, pa)):
                for k in x.get("required", []) if isinstance(x.get("required"), list) else []:
                    if not isinstance(k, str):
                        continue
                    if k in py:
                        if py[k] is False or (k in px and _disjoint(px[k], py[k])):
                            return True
                    elif y.get("additionalProperties") is False and not y.get("patternProperties"):
                        return True
    if common <= {"number", "integer"}:
        la, lax, ha, hax = _num_range(a)
        lb, lbx, hb, hbx = _num_range(b)
        for lo, lx, hi, hx in ((la, lax, hb, hbx), (lb, lbx, ha, hax)):
            if lo is not None and hi is not None and (lo > hi or (lo == hi and (lx or hx))):
                return True
    if common <= {"string"}:
        for x, y in ((a, b), (b, a)):
            mx, mn = x.get("maxLength"), y.get("minLength")
            if isinstance(mx, int) and isinstance(mn, int) and mx < mn:
                return True
    if common <= {"array"}:
        for x, y in ((a, b), (b, a)):
            mx, mn = x.get("maxItems"), y.get("minItems")
            if isinstance(mx, int) and isinstance(mn, int) and mx < mn:
                return True
    return False


_COUNTS = {"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
           "minContains", "maxContains"}
_SCHEMA_MAPS = {"properties", "patternProperties", "dependentSchemas"}
_ONE_SCHEMA = {"additionalProperties", "additionalItems", "contains", "propertyNames", "not", "if",
               "then", "else", "unevaluatedProperties", "unevaluatedItems"}


def _is_schema(v) -> bool:
    return isinstance(v, (dict, bool))


def _checked_value(k, v, path):
    """The value of validity keyword k, checked for the shape the
    specification gives it (counts normalized to int); SchemaError otherwise."""
    def bad():
        raise SchemaError("bad value of JSON Schema keyword %r at %s" % (k, path))
    num = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if k in _COUNTS:
        if not num or v < 0 or not float(v).is_integer():
            bad()
        return int(v)
    if k in ("minimum", "maximum"):
        return v if num else bad()
    if k in ("exclusiveMinimum", "exclusiveMaximum"):
        return v if num or isinstance(v, bool) else bad()
    if k == "multipleOf":
        return v if num and v > 0 else bad()
    if k in ("pattern", "format", "$ref", "$dynamicRef", "$recursiveRef"):
        return v if isinstance(v, str) else bad()
    if k == "uniqueItems":
        return v if isinstance(v, bool) else bad()
    if k == "required":
        return v if isinstance(v, list) and all(isinstance(x, str) for x in v) else bad()
    if k in _SCHEMA_MAPS:
        return v if isinstance(v, dict) and all(_is_schema(x) for x in v.values()) else bad()
    if k in _ONE_SCHEMA:
        return v if _is_schema(v) else bad()
    if k == "items":
        return v if _is_schema(v) or (isinstance(v, list) and all(_is_schema(x) for x in v)) else bad()
    if k == "prefixItems":
        return v if isinstance(v, list) and all(_is_schema(x) for x in v) else bad()
    if k in ("allOf", "anyOf", "oneOf"):
        return v if isinstance(v, list) and v and all(_is_schema(x) for x in v) else bad()
    if k == "type":
        ts = [v] if isinstance(v, str) else v
        if not isinstance(ts, list) or not ts or any(not isinstance(t, str) or t not in ALL_TYPES for t in ts):
            raise SchemaError("unsupported 'type' %r at %s" % (v, path))
        return v
    if k in ("enum", NOT_ENUM):
        return v if isinstance(v, list) else bad()
    if k == "dependentRequired":
        return v if isinstance(v, dict) and all(isinstance(x, list) and all(isinstance(y, str) for y in x)
                                                for x in v.values()) else bad()
    if k == "dependencies":
        return v if isinstance(v, dict) and all(
            _is_schema(x) or (isinstance(x, list) and all(isinstance(y, str) for y in x))
            for x in v.values()) else bad()
    return v


class _Converter:
    def __init__(self, root, lenient: bool = False):
        self.root = root
        self.lenient = lenient
        self.ignored: list = []        # what lenient mode dropped: {keyword, path, reason}
        self.rules: dict = {}          # name -> body, in emission order
        self.bodies: dict = {}         # body -> name, to share identical rules
        self.ref_names: dict = {}      # JSON pointer -> rule name (recursion)
        self.prim_used: set = set()
        sch = root.get("$schema", "") if isinstance(root, dict) else ""
        self.old_draft = isinstance(sch, str) and any(d in sch for d in OLD_DRAFTS)
        self.deadline = time.perf_counter() + DEADLINE_S
        self.n_steps = 0

    def refuse(self, kw: str, path: str, why: str = "") -> None:
        """A validity keyword that cannot be enforced here: SchemaError naming
        it and its JSON pointer, or (lenient) recorded; the caller then drops it."""
        if not self.lenient:
            raise SchemaError("unsupported JSON Schema keyword %r%s at %s"
                              % (kw, " (%s)" % why if why else "", path))
        self.ignored.append({"keyword": kw, "path": path, "reason": why or "not supported"})

    def tick(self, path: str) -> None:
        self.n_steps += 1
        if self.n_steps & 63 == 0 and time.perf_counter() > self.deadline:
            raise SchemaError("JSON Schema too complex to convert in %.1f s (at %s)" % (DEADLINE_S, path))
        if len(self.rules) > MAX_RULES:
            raise SchemaError("JSON Schema too large: more than %d grammar rules (at %s)"
                              % (MAX_RULES, path))

    # -- rule bookkeeping
    def add_rule(self, name: str, body: str) -> str:
        name = re.sub(r"[^a-zA-Z0-9-]+", "-", name).strip("-") or "r"
        if body in self.bodies and name != "root":
            return self.bodies[body]
        if name in PRIMITIVES and name != "root":
            name = name + "-r"
        key = name
        i = 0
        while key in self.rules and self.rules[key] != body:
            i += 1
            key = "%s-%d" % (name, i)
        self.rules[key] = body
        self.bodies.setdefault(body, key)
        return key

    def prim(self, name: str) -> str:
        todo = [name]
        while todo:
            n = todo.pop()
            if n not in self.prim_used:
                self.prim_used.add(n)
                todo.extend(PRIMITIVE_DEPS[n])
        return name

    # -- entry
    def convert(self) -> str:
        # reserved, so that no other rule (e.g. one for a property whose name
        # sanitizes to nothing) can take the name
        self.rules["root"] = "<pending>"
        e = self.visit(self.root, "#", "root")
        if e is None:
            raise SchemaError("schema admits no value at #")
        self.rules["root"] = e
        out = ["root ::= " + self.rules["root"]]
        for k, v in self.rules.items():
            if k != "root":
                out.append("%s ::= %s" % (k, v))
        for k in PRIMITIVES:
            if k in self.prim_used:
                out.append("%s ::= %s" % (k, PRIMITIVES[k]))
        text = "\n".join(out) + "\n"
        if len(text) > MAX_GBNF_BYTES:
            raise SchemaError("JSON Schema too large: its grammar exceeds %d bytes" % MAX_GBNF_BYTES)
        return text

    # -- $ref
    def resolve(self, ref: str, path: str):
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError("unsupported JSON Schema keyword '$ref' (only local "
                              "'#/...' references) at %s" % path)
        node = self.root
        frag = ref[1:]
        if frag and not frag.startswith("/"):
            raise SchemaError("unsupported JSON Schema keyword '$ref' (anchor %r) at %s"
                              % (ref, path))
        from urllib.parse import unquote
        for part in frag.split("/")[1:] if frag else []:
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise SchemaError("unresolvable '$ref' %r at %s" % (ref, path))
        return node

    # -- policy: the keywords that constrain validity
    def validity(self, s: dict, path: str) -> dict:
        """s without annotations and unknown keywords (and without keywords
        that mean nothing where they are, e.g. `then` without `if`)."""
        if "$ref" in s and self.old_draft:
            return {"$ref": s["$ref"]}
        out = {k: v for k, v in s.items() if k in KEYWORD_TYPE}
        for k in list(out):
            out[k] = _checked_value(k, out[k], path)
        if "if" not in out:
            out.pop("then", None)
            out.pop("else", None)
        if "contains" not in out:
            out.pop("minContains", None)
            out.pop("maxContains", None)
        if "additionalItems" in out and not isinstance(out.get("items"), list):
            out.pop("additionalItems")
        for k in ("$dynamicRef", "$recursiveRef"):
            if k in out:
                out.pop(k)
                self.refuse(k, path, "dynamic references")
        return out

    def rewrite(self, s: dict, path: str) -> dict:
        """Keywords expressed through others: `not` (negate), `if`/`then`/
        `else`, the dependent* keywords, and unevaluated* where they equal
        their additional* counterpart.  Returns s itself or {"allOf": [...]}."""
        if not any(k in s for k in ("not", "if", "dependentRequired", "dependentSchemas",
                                    "dependencies", "unevaluatedProperties", "unevaluatedItems")):
            return s
        s = dict(s)
        applicators = any(k in s for k in ("allOf", "anyOf", "oneOf", "if", "$ref",
                                           "dependentSchemas", "dependencies"))
        extra = []
        if "not" in s:
            extra.append(self.negate(s.pop("not"), path + "/not"))
        if "if" in s:
            i, t, e = s.pop("if"), s.pop("then", True), s.pop("else", True)
            if t is not True or e is not True:
                extra.append({"anyOf": [{"allOf": [i, t]},
                                        {"allOf": [self.negate(i, path + "/if"), e]}]})
        for kw in ("dependentRequired", "dependentSchemas", "dependencies"):
            if kw not in s:
                continue
            d = s.pop(kw)
            if not isinstance(d, dict):
                raise SchemaError("'%s' must be an object at %s" % (kw, path))
            for k, v in d.items():
                if isinstance(v, list):
                    if not all(isinstance(x, str) for x in v):
                        raise SchemaError("'%s/%s' must list property names at %s" % (kw, k, path))
                    if not v:
                        continue
                    dep = {"required": [k] + [x for x in v if x != k]}
                elif v is True or v == {}:
                    continue
                else:
                    dep = {"allOf": [{"required": [k]}, v]}
                extra.append({"anyOf": [{"properties": {k: False}}, dep]})
        if "unevaluatedProperties" in s:
            u = s.pop("unevaluatedProperties")
            if u is True or "additionalProperties" in s:
                pass  # every property is evaluated already
            elif applicators:
                self.refuse("unevaluatedProperties", path, "together with applicators")
            else:
                s["additionalProperties"] = u
        if "unevaluatedItems" in s:
            u = s.pop("unevaluatedItems")
            items = s.get("items")
            if u is True or isinstance(items, (dict, bool)) or "additionalItems" in s:
                pass
            elif applicators or "contains" in s:
                self.refuse("unevaluatedItems", path, "together with applicators")
            elif isinstance(items, list):
                s["additionalItems"] = u
            else:
                s["items"] = u
        if not extra:
            return s
        return {"allOf": ([s] if s else []) + extra}

    def negate(self, n, path: str, depth: int = 0):
        """A schema matching only instances that do NOT validate against n.
        Exact where it can be; elsewhere narrower (a subset of the negation,
        e.g. "not a string" for a `pattern`), which keeps the grammar sound.
        The result contains no `not`, so narrowing never flips into widening."""
        if depth > 32:
            raise SchemaError("'not' nests too deeply at %s" % path)
        if n is True:
            return False
        if n is False:
            return True
        if not isinstance(n, dict):
            raise SchemaError("schema must be an object or a boolean at %s" % path)
        n = self.validity(n, path)
        if not n:
            return False
        alts = []
        if "$ref" in n:
            alts.append(self.negate(self.resolve(n.pop("$ref"), path), path, depth + 1))
        if "type" in n:
            ty = n["type"]
            ts = [ty] if isinstance(ty, str) else ty
            if not isinstance(ts, list) or any(t not in ALL_TYPES for t in ts):
                raise SchemaError("unsupported 'type' %r at %s" % (ty, path))
            keep = [t for t in ALL_TYPES if t not in ts]
            if "integer" in ts and "number" in keep:
                keep.remove("number")  # non-integer numbers alone are not written: narrower
            if "number" in ts and "integer" in keep:
                keep.remove("integer")
            if keep:
                alts.append({"type": keep})
        if "enum" in n or "const" in n:
            vals = list(n["enum"]) if isinstance(n.get("enum"), list) else None
            if "const" in n:
                vals = [n["const"]] if vals is None else [v for v in vals if _json_eq(v, n["const"])]
            if vals is None:
                raise SchemaError("'enum' must be an array at %s" % path)
            alts.append({NOT_ENUM: vals} if vals else True)
        if NOT_ENUM in n:
            alts.append({"enum": list(n[NOT_ENUM])})
        for i, b in enumerate(n.get("allOf", []) if isinstance(n.get("allOf"), list) else []):
            alts.append(self.negate(b, "%s/allOf/%d" % (path, i), depth + 1))
        for kw in ("anyOf", "oneOf"):  # oneOf: "none matches" (narrower than "not exactly one")
            if isinstance(n.get(kw), list):
                alts.append({"allOf": [self.negate(b, "%s/%s/%d" % (path, kw, i), depth + 1)
                                       for i, b in enumerate(n[kw])]})
        if "not" in n:
            alts.append(n["not"])
        if "if" in n:
            i, t, e = n["if"], n.get("then", True), n.get("else", True)
            alts.append({"anyOf": [{"allOf": [i, self.negate(t, path + "/then", depth + 1)]},
                                   {"allOf": [self.negate(i, path + "/if", depth + 1),
                                              self.negate(e, path + "/else", depth + 1)]}]})
        for ty in ("string", "number", "array", "object"):
            ks = [k for k in n if KEYWORD_TYPE.get(k) == ty]
            if not ks:
                continue
            applies = ("number", "integer") if ty == "number" else (ty,)
            alts.append({"type": [t for t in ALL_TYPES if t not in applies]})
            alts.extend(self._negate_typed(n, ty, ks, path, depth))
        return {"anyOf": alts} if alts else False

    def _negate_typed(self, n, ty, ks, path, depth):
        """Instances of type ty that fail one of n's keywords ks (narrower
        where not exact: then nothing)."""
        out = []
        nat = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0
        if ty == "string":
            if nat(n.get("minLength")) and n["minLength"] > 0:
                out.append({"type": "string", "maxLength": n["minLength"] - 1})
            if nat(n.get("maxLength")):
                out.append({"type": "string", "minLength": n["maxLength"] + 1})
        elif ty == "number":
            lo, lx, hi, hx = _num_range(n)
            if "multipleOf" not in n or True:
                if lo is not None:
                    out.append({"type": "number", ("maximum" if lx else "exclusiveMaximum"): lo})
                if hi is not None:
                    out.append({"type": "number", ("minimum" if hx else "exclusiveMinimum"): hi})
        elif ty == "array":
            if nat(n.get("minItems")) and n["minItems"] > 0:
                out.append({"type": "array", "maxItems": n["minItems"] - 1})
            if nat(n.get("maxItems")):
                out.append({"type": "array", "minItems": n["maxItems"] + 1})
            it = n.get("items")
            if isinstance(it, (dict, bool)) and "prefixItems" not in n and it is not True:
                out.append({"type": "array", "contains": self.negate(it, path + "/items", depth + 1)})
        else:
            req = n.get("required")
            if isinstance(req, list):
                out += [{"type": "object", "properties": {r: False}} for r in req if isinstance(r, str)]
            props = n.get("properties")
            if isinstance(props, dict) and "additionalProperties" not in n and \
                    "patternProperties" not in n:
                for k, v in props.items():
                    neg = self.negate(v, "%s/properties/%s" % (path, _ptr_escape(k)), depth + 1)
                    if neg is not False:
                        out.append({"type": "object", "required": [k], "properties": {k: neg}})
            if nat(n.get("minProperties")) and n["minProperties"] > 0:
                out.append({"type": "object", "maxProperties": n["minProperties"] - 1})
            if nat(n.get("maxProperties")):
                out.append({"type": "object", "minProperties": n["maxProperties"] + 1})
        return out

    # -- main dispatch: returns a GBNF expression (a rule name or a small
    # expression, every value alternative ending in `space`), None = no value.
    def visit(self, s, path: str, name: str) -> Optional[str]:
        self.tick(path)
        if s is True:
            return self.prim("value")
        if s is False:
            return None
        if not isinstance(s, dict):
            raise SchemaError("schema must be an object or a boolean at %s" % path)
        s = self.validity(s, path)
        if not s:
            return self.prim("value")
        if "$ref" in s:
            rest = {k: v for k, v in s.items() if k != "$ref"}
            if rest:
                return self.visit({"allOf": [{"$ref": s["$ref"]}, rest]}, path, name)
            ref = s["$ref"]
            target = self.resolve(ref, path)
            if ref in self.ref_names:
                return self.ref_names[ref]
            rname = ref.split("/")[-1] if ref != "#" else "root-ref"
            rname = re.sub(r"[^a-zA-Z0-9-]+", "-", rname).strip("-") or "ref"
            if rname in PRIMITIVES or rname == "root":
                rname += "-ref"
            base, i = rname, 0
            while rname in self.rules or rname in self.ref_names.values():
                i += 1
                rname = "%s-%d" % (base, i)
            self.ref_names[ref] = rname
            self.rules[rname] = "<pending>"
            body = self.visit(target, ref, rname)
            if body is None:
                raise SchemaError("'$ref' %r admits no value at %s" % (ref, path))
            self.rules[rname] = body
            return rname
        s = self.rewrite(s, path)
        if "allOf" in s:
            m = self.merge_allof(s, path)
            return None if m is False else self.visit(m, path, name)
        for kw in ("anyOf", "oneOf"):
            if kw in s:
                branches = s[kw]
                if not isinstance(branches, list) or not branches:
                    raise SchemaError("'%s' must be a non-empty array at %s" % (kw, path))
                rest = {k: v for k, v in s.items() if k != kw}
                merged = []
                for i, b in enumerate(branches):
                    bp = "%s/%s/%d" % (path, kw, i)
                    merged.append((bp, self.merge([rest, b], bp) if rest or
                                   (isinstance(b, dict) and ("$ref" in b or "allOf" in b)) else b))
                if kw == "oneOf":
                    merged = [(bp, b) for bp, b in merged if b is not False]
                    if len(merged) > 64:
                        self.refuse("oneOf", path, "more than 64 branches to prove disjoint")
                    else:
                        for i in range(len(merged)):
                            for j in range(i + 1, len(merged)):
                                if not _disjoint(merged[i][1], merged[j][1]):
                                    self.refuse("oneOf", path, "branches %s and %s may overlap"
                                                % (merged[i][0].rsplit("/", 1)[1],
                                                   merged[j][0].rsplit("/", 1)[1]))
                                    break
                            else:
                                continue
                            break
                alts = []
                for i, (bp, b) in enumerate(merged):
                    e = self.visit(b, bp, "%s-%d" % (name, i))
                    if e is not None and e not in alts:
                        alts.append(e)
                if not alts:
                    return None
                if len(alts) == 1:
                    return alts[0]
                return self.add_rule(name, " | ".join(alts))
        types = s.get("type", list(ALL_TYPES))
        if isinstance(types, str):
            types = [types]
        if not isinstance(types, list) or any(t not in ALL_TYPES for t in types):
            raise SchemaError("unsupported 'type' %r at %s" % (s.get("type"), path))
        if "integer" in types and "number" in types:
            types = [t for t in types if t != "integer"]
        if "enum" in s or "const" in s:
            return self.visit_enum(s, types, path, name)
        excl = s.get(NOT_ENUM, [])
        alts = []
        for t in types:
            # `not` with values of a type other than string and boolean: that
            # type is left out (narrower, sound)
            if excl and t not in ("string", "boolean") and any(_type_matches(v, [t]) for v in excl):
                continue
            e = getattr(self, "visit_" + t)(s, path, name if len(types) == 1 else name + "-" + t)
            if e is not None:
                alts.append(e)
        if not alts:
            return None
        if len(alts) == 1:
            return alts[0]
        return self.add_rule(name, " | ".join(alts))

    # -- allOf merging
    def merge_allof(self, s, path):
        parts = s["allOf"]
        if not isinstance(parts, list) or not parts:
            raise SchemaError("'allOf' must be a non-empty array at %s" % path)
        rest = {k: v for k, v in s.items() if k != "allOf"}
        return self.merge(list(parts) + ([rest] if rest else []), path + "/allOf")

    def merge(self, parts, path):
        out: dict = {}
        for i, p in enumerate(parts):
            self.tick(path)
            seen = 0
            while isinstance(p, dict):
                p = self.validity(p, path)
                if "$ref" not in p:
                    break
                seen += 1
                if seen > 32:
                    raise SchemaError("'$ref' cycle inside 'allOf' at %s" % path)
                extra = {k: v for k, v in p.items() if k != "$ref"}
                tgt = self.resolve(p["$ref"], path)
                p = self.merge([tgt, extra], path) if extra else tgt
            if p is True:
                continue
            if p is False:
                return False
            if not isinstance(p, dict):
                raise SchemaError("schema must be an object or a boolean at %s/%d" % (path, i))
            p = self.rewrite(p, "%s/%d" % (path, i))
            if "allOf" in p:
                p = self.merge_allof(p, path)
                if p is False:
                    return False
            out = self.merge2(out, p, "%s/%d" % (path, i))
            if out is False:
                return False
        return out

    def merge2(self, a: dict, b: dict, path):
        out = dict(a)
        for k, v in b.items():
            if k not in KEYWORD_TYPE:
                continue
            if k not in out:
                out[k] = v
                continue
            u = out[k]
            if k == "type":
                ta = [u] if isinstance(u, str) else list(u)
                tb = [v] if isinstance(v, str) else list(v)
                inter = [t for t in ta if t in tb or (t == "integer" and "number" in tb)]
                inter += [t for t in tb if t == "integer" and "number" in ta and t not in inter]
                if not inter:
                    return False
                out[k] = inter
            elif k == "required":
                out[k] = list(u) + [x for x in v if x not in u]
            elif k in ("minItems", "minLength", "minimum", "exclusiveMinimum", "minProperties",
                       "minContains"):
                if isinstance(u, bool) or isinstance(v, bool):
                    self.refuse(k, path, "boolean form in 'allOf'")
                    continue
                out[k] = max(u, v)
            elif k in ("maxItems", "maxLength", "maximum", "exclusiveMaximum", "maxProperties",
                       "maxContains"):
                if isinstance(u, bool) or isinstance(v, bool):
                    self.refuse(k, path, "boolean form in 'allOf'")
                    continue
                out[k] = min(u, v)
            elif k == "enum":
                out[k] = [x for x in u if any(_json_eq(x, y) for y in v)]
            elif k == NOT_ENUM:
                out[k] = list(u) + list(v)
            elif k == "const":
                if not _json_eq(u, v):
                    return False
            elif k == "uniqueItems":
                out[k] = bool(u) or bool(v)
            elif k == "multipleOf":
                if all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (u, v)):
                    out[k] = u * v // math.gcd(u, v)
                elif u != v:
                    self.refuse(k, path, "two different values in 'allOf'")
            elif k in ("items", "additionalItems", "propertyNames", "contains"):
                if k == "contains" and u != v:
                    self.refuse(k, path, "two different values in 'allOf'")
                    continue
                if k == "items" and (isinstance(u, list) or isinstance(v, list)):
                    self.refuse("items", path, "array form in 'allOf'")
                    continue
                out[k] = {"allOf": [u, v]}
            elif k == "properties":
                props = dict(u)
                for pk, pv in v.items():
                    props[pk] = {"allOf": [props[pk], pv]} if pk in props else pv
                out[k] = props
            elif k in ("anyOf", "oneOf"):
                # (A1|A2) & (B1|B2): the cross product, when small
                if len(u) * len(v) > 16:
                    raise SchemaError("unsupported JSON Schema keyword %r (two large "
                                      "'%s' in 'allOf') at %s" % (k, k, path))
                out[k] = [{"allOf": [x, y]} for x in u for y in v]
            elif k == "prefixItems":
                pass  # merged below, with the items of both sides
            elif u != v:
                # pattern, format, additionalProperties, patternProperties, $ref, ...
                self.refuse(k, path, "two different values in 'allOf'")
        # items of one side applies to the other side's prefixItems positions
        if "prefixItems" in a or "prefixItems" in b:
            if isinstance(a.get("items"), list) or isinstance(b.get("items"), list):
                self.refuse("items", path, "array form in 'allOf'")
                return out
            xa, xb = a.get("prefixItems", []), b.get("prefixItems", [])
            ia, ib = a.get("items", True), b.get("items", True)
            pre = []
            for i in range(max(len(xa), len(xb))):
                sa = xa[i] if i < len(xa) else ia
                sb = xb[i] if i < len(xb) else ib
                pre.append({"allOf": [sa, sb]})
            out["prefixItems"] = pre
            out["items"] = {"allOf": [ia, ib]}
        # additionalProperties of one side restricts the other side's properties
        if "properties" in a or "properties" in b or "additionalProperties" in a \
                or "additionalProperties" in b:
            if (a.get("patternProperties") or b.get("patternProperties")) and \
                    ("additionalProperties" in a or "additionalProperties" in b):
                self.refuse("patternProperties", path, "with additionalProperties in 'allOf'")
                return out
            pa, pb = a.get("properties", {}), b.get("properties", {})
            aa, ab = a.get("additionalProperties", True), b.get("additionalProperties", True)
            props = {}
            for pk in list(pa) + [x for x in pb if x not in pa]:
                sa = pa.get(pk, aa)
                sb = pb.get(pk, ab)
                if sa is False or sb is False:
                    props[pk] = False
                elif sa is True or sa == {}:
                    props[pk] = sb
                elif sb is True or sb == {}:
                    props[pk] = sa
                else:
                    props[pk] = {"allOf": [sa, sb]}
            if props:
                out["properties"] = props
            if aa is False or ab is False:
                out["additionalProperties"] = False
            elif aa is True or aa == {}:
                if ab is not True:
                    out["additionalProperties"] = ab
            elif ab is True or ab == {}:
                out["additionalProperties"] = aa
            else:
                out["additionalProperties"] = {"allOf": [aa, ab]}
        return out

    # -- enum / const
    def visit_enum(self, s, types, path, name):
        values = None
        if "enum" in s:
            if not isinstance(s["enum"], list):
                raise SchemaError("'enum' must be an array at %s" % path)
            values = list(s["enum"])
        if "const" in s:
            c = s["const"]
            values = [c] if values is None else [v for v in values if _json_eq(v, c)]
        # every other keyword filters the values: decided here, value by value
        others = {k: v for k, v in s.items() if k not in ("enum", "const", "type")}
        if others:
            kept = []
            for v in values:
                ok = _check(v, others)
                if ok is None:
                    kw = next(k for k in others if _check(v, {k: others[k]}) is None)
                    self.refuse(kw, path, "together with 'enum'/'const'")
                    ok = True
                if ok:
                    kept.append(v)
            values = kept
        alts = []
        for v in values:
            if not _type_matches(v, types):
                continue
            e = self.const_expr(v, path)
            if e not in alts:
                alts.append(e)
        if not alts:
            return None
        return self.add_rule(name, " | ".join(alts) if len(alts) > 1 else alts[0]) \
            if len(alts) > 1 or " " in alts[0] else alts[0]

    def const_expr(self, v, path) -> str:
        sp = self.prim("space")
        if isinstance(v, dict):
            if not v:
                return '"{" %s "}" %s' % (sp, sp)
            members = ['%s %s ":" %s %s' % (_lit(_json_dumps(str(k))), sp, sp,
                                            self.const_expr(x, path)) for k, x in v.items()]
            return '"{" %s %s "}" %s' % (sp, (' "," %s ' % sp).join(members), sp)
        if isinstance(v, list):
            if not v:
                return '"[" %s "]" %s' % (sp, sp)
            items = [self.const_expr(x, path) for x in v]
            return '"[" %s %s "]" %s' % (sp, (' "," %s ' % sp).join(items), sp)
        if isinstance(v, float) and not math.isfinite(v):
            raise SchemaError("non-finite number in 'enum'/'const' at %s" % path)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer() \
                and abs(v) < 2 ** 53:
            # 1 and 1.0 are one JSON number: both spellings
            i = int(v)
            return '("%d" | "%d.0") %s' % (i, i, sp)
        return "%s %s" % (_lit(_json_dumps(v)), sp)

    # -- scalar types
    def visit_null(self, s, path, name):
        if any(v is None for v in s.get(NOT_ENUM, [])):
            return None
        return self.prim("null")

    def visit_boolean(self, s, path, name):
        excl = [v for v in s.get(NOT_ENUM, []) if isinstance(v, bool)]
        if not excl:
            return self.prim("boolean")
        left = [b for b in (True, False) if b not in excl]
        return "%s %s" % (_lit(_json_dumps(left[0])), self.prim("space")) if left else None

    def _bound(self, s, k, path):
        v = s.get(k)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise SchemaError("unsupported value of JSON Schema keyword %r at %s" % (k, path))
        return v

    def _bounds(self, s, path):
        """(lo, lo_exclusive, hi, hi_exclusive), handling draft-4 boolean exclusives."""
        lo = self._bound(s, "minimum", path)
        hi = self._bound(s, "maximum", path)
        lo_x = hi_x = False
        em, eM = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
        if isinstance(em, bool):
            lo_x = em and lo is not None
        elif em is not None:
            v = self._bound(s, "exclusiveMinimum", path)
            if lo is None or v >= lo:
                lo, lo_x = v, True
        if isinstance(eM, bool):
            hi_x = eM and hi is not None
        elif eM is not None:
            v = self._bound(s, "exclusiveMaximum", path)
            if hi is None or v <= hi:
                hi, hi_x = v, True
        return lo, lo_x, hi, hi_x

    def _multiple_of(self, s, path):
        """multipleOf as a positive int (1 = no constraint), or None: refused."""
        m = s.get("multipleOf")
        if m is None:
            return 1
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not m > 0 or \
                not math.isfinite(m):
            raise SchemaError("bad value of JSON Schema keyword 'multipleOf' at %s" % path)
        if float(m).is_integer() and m < 2 ** 53:
            return int(m)
        self.refuse("multipleOf", path, "only integer divisors")
        return 1

    def multiples_expr(self, m, lo, hi, name) -> Optional[str]:
        """The integers in [lo, hi] (None = open) divisible by m > 1."""
        if lo is not None and hi is not None and (hi - lo) // m <= 256:
            first = -(-lo // m) * m
            vals = list(range(first, hi + 1, m))
            return _group(['"%d"' % v for v in vals]) if vals else None
        if lo is not None or hi is not None:
            self.refuse("multipleOf", name, "together with a one-sided bound")
            return None
        if m > 64:
            self.refuse("multipleOf", name, "a divisor above 64 without bounds")
            return None
        # The decimal digits of a multiple of m, read left to right: a finite
        # automaton over remainders (r -> (10 r + d) mod m), each state a rule,
        # at most INT_DIGITS digits (depth k).
        from .gbnf import INT_DIGITS
        memo = {}

        def rest(r, k):  # digits still to come from remainder r, at most k more
            key = (r, k)
            if key in memo:
                return memo[key]
            alts = ['""'] if r == 0 else []
            if k > 0:
                by_next: dict = {}
                for d in range(10):
                    by_next.setdefault((10 * r + d) % m, []).append(d)
                for t, ds in sorted(by_next.items()):
                    nxt = rest(t, k - 1)
                    if nxt is None:
                        continue
                    cls = "[%s]" % "".join(str(d) for d in ds)
                    alts.append(cls + ("" if nxt == '""' else " " + nxt))
            if not alts:
                memo[key] = None
                return None
            body = " | ".join(alts)
            memo[key] = body if body == '""' else self.add_rule("%s-mod%d-r%d-k%d" % (name, m, r, k), body)
            return memo[key]

        heads = []
        for d in range(1, 10):
            nxt = rest(d % m, INT_DIGITS - 1)
            if nxt is not None:
                heads.append('"%d"' % d + ("" if nxt == '""' else " " + nxt))
        pos = _group(heads)
        return '("0" | "-"? %s)' % pos

    def visit_integer(self, s, path, name):
        lo, lo_x, hi, hi_x = self._bounds(s, path)
        m = self._multiple_of(s, path)
        if m > 1:
            ilo = None if lo is None else (math.floor(lo) + 1 if lo_x and float(lo).is_integer()
                                           else math.ceil(lo))
            ihi = None if hi is None else (math.ceil(hi) - 1 if hi_x and float(hi).is_integer()
                                           else math.floor(hi))
            e = self.multiples_expr(m, ilo, ihi, path)
            if e is None:
                if self.lenient:
                    m = 1
                else:
                    return None
            else:
                return self.add_rule(name, e + " " + self.prim("space"))
        if lo is None and hi is None:
            return self.prim("integer")
        ilo = ilhi = None
        if lo is not None:
            ilo = math.floor(lo) + 1 if lo_x and float(lo).is_integer() else math.ceil(lo)
            if lo_x and not float(lo).is_integer():
                ilo = math.ceil(lo)
        if hi is not None:
            ilhi = math.ceil(hi) - 1 if hi_x and float(hi).is_integer() else math.floor(hi)
        e = int_range_expr(ilo, ilhi)
        if e is None:
            return None
        return self.add_rule(name, e + " " + self.prim("space"))

    def visit_number(self, s, path, name):
        if "multipleOf" in s:
            # an integer divisor: the number is an integer multiple (written
            # as an integer: narrower than the schema, which also admits 4.0)
            return self.visit_integer(s, path, name)
        lo, lo_x, hi, hi_x = self._bounds(s, path)
        if lo is None and hi is None:
            return self.prim("number")
        for k, v in (("minimum" if not lo_x else "exclusiveMinimum", lo),
                     ("maximum" if not hi_x else "exclusiveMaximum", hi)):
            if v is not None and abs(v) >= 2 ** 53:
                self.refuse(k, path, "a number bound must be below 2**53")
                return self.prim("number")
        # A fractional bound is tightened to the integer inside it (narrower:
        # 0.75 is not written under minimum 0.5; sound).
        olo, ohi = lo, hi
        if lo is not None and not float(lo).is_integer():
            lo, lo_x = math.ceil(lo), False
        if hi is not None and not float(hi).is_integer():
            hi, hi_x = math.floor(hi), False
        if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_x or hi_x))) \
                and (olo != lo or ohi != hi):
            self.refuse("minimum", path, "fractional bounds with no integer between them")
            return self.prim("number")
        lo = None if lo is None else int(lo)
        hi = None if hi is None else int(hi)
        digits = max(len(str(abs(v))) for v in (lo, hi) if v is not None)
        k = min(FRAC_DIGITS, 15 - digits)  # fraction digits: see module docstring
        alts = []
        # non-negative part: magnitudes m = x
        if hi is None or hi > 0 or (hi == 0 and not hi_x):
            if lo is None or lo < 0:
                a, ax = 0, False
            else:
                a, ax = lo, lo_x
            alts += self._magnitude(a, ax, hi, hi_x, k)
        # negative part: x = -m, m > 0
        if lo is None or lo < 0:
            if hi is None or hi >= 0:
                a, ax = 0, True
            else:
                a, ax = -hi, hi_x
            b, bx = (None, False) if lo is None else (-lo, lo_x)
            neg = self._magnitude(a, ax, b, bx, k)
            if neg:
                alts.append('"-" ' + _group(neg))
        if not alts:
            return None
        return self.add_rule(name, _group(alts) + " " + self.prim("space"))

    @staticmethod
    def _magnitude(a, ax, b, bx, k):
        """Alternatives for decimal magnitudes m (no exponent) with a <(=) m <(=) b,
        integer bounds; fractions have at most k digits."""
        any_f = '("." [0-9]{1,%d})?' % k if k >= 1 else ""
        zero_f = '("." "0"{1,%d})?' % k if k >= 1 else ""
        nz_f = '"." "0"{0,%d} [1-9] [0-9]{0,%d}' % (k - 1, k - 1) if k >= 1 else None
        alts = []
        if b is not None and (b < a or (b == a and (ax or bx))):
            return alts
        if b is not None and b == a:
            return [_join(_group(_nonneg_range(a, a)), zero_f)]
        # integer part strictly inside (a, b)
        mid = _nonneg_range(a + 1, None if b is None else b - 1)
        if mid:
            alts.append(_join(_group(mid), any_f))
        ia = _group(_nonneg_range(a, a))
        if ax:
            if nz_f:
                alts.append(ia + " " + nz_f)
        else:
            alts.append(_join(ia, any_f))
        if b is not None and not bx:
            alts.append(_join(_group(_nonneg_range(b, b)), zero_f))
        return alts

    def visit_string(self, s, path, name):
        lo = s.get("minLength", 0)
        hi = s.get("maxLength")
        for kw, v in (("minLength", lo), ("maxLength", hi)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise SchemaError("bad value of JSON Schema keyword %r at %s" % (kw, path))
        if hi is not None and hi < lo:
            return None
        fmt = s.get("format")
        if fmt is not None and fmt not in FORMATS:
            self.refuse("format", path, "format %r is not enforced" % (fmt,))
            fmt = None
        pat = s.get("pattern")
        if pat is not None and fmt is not None:
            self.refuse("pattern", path, "together with 'format'")
            pat = None
        excl = [v for v in s.get(NOT_ENUM, []) if isinstance(v, str)]
        sp = self.prim("space")
        if pat is not None or fmt is not None:
            if excl:
                # the excluded strings must not be writable under these constraints
                chk = {k: s[k] for k in ("minLength", "maxLength", "pattern") if k in s}
                if fmt is not None or any(_check(v, chk) is not False for v in excl):
                    return None  # no string at all: narrower, sound
            if pat is not None:
                if not isinstance(pat, str):
                    raise SchemaError("bad value of JSON Schema keyword 'pattern' at %s" % path)
                try:
                    re.compile(pat)
                except re.error as exc:
                    raise SchemaError("invalid regex in 'pattern' at %s: %s" % (path, exc))
                try:
                    ast = _RegexParser(pat, path + "/pattern").parse(search=True)
                    plo, phi = _regex_len(ast)
                    if lo > plo or (hi is not None and (phi is None or phi > hi)):
                        # lengths not implied by the search form: try full matches
                        ast = _RegexParser(pat, path + "/pattern").parse()
                        plo, phi = _regex_len(ast)
                except SchemaError as exc:
                    if not self.lenient:
                        raise
                    self.ignored.append({"keyword": "pattern", "path": path, "reason": str(exc)})
                    return self.visit_string({k: v for k, v in s.items() if k != "pattern"},
                                             path, name)
                body = _regex_to_gbnf(ast)
                if body is None:
                    return None
                kw = "pattern"
            else:
                plo, phi = FORMAT_LENGTHS.get(fmt, (1, None))
                body = FORMATS[fmt]
                kw = "format"
            if lo > plo or (hi is not None and (phi is None or phi > hi)):
                if hi is not None and hi < plo or (phi is not None and lo > phi):
                    return None
                bad = "minLength" if lo > plo else "maxLength"
                self.refuse(bad, path, "together with %r, not implied by it" % kw)
            inner = self.add_rule(name + ("-" + fmt if fmt else "-pattern"), body)
            return self.add_rule(name, '"\\"" %s "\\"" %s' % (inner, sp))
        if excl:
            if lo or hi is not None:
                chk = {k: s[k] for k in ("minLength", "maxLength") if k in s}
                if any(_check(v, chk) is not False for v in excl):
                    return None  # narrower, sound
            else:
                return self.add_rule(name, self.not_strings_rule(excl, name + "-not") + " " + sp)
        if lo == 0 and hi is None:
            return self.prim("string")
        ch = self.prim("char")
        if hi is None:
            rep = "%s{%d,}" % (ch, lo)
        elif lo == hi:
            rep = "%s{%d}" % (ch, lo)
        else:
            rep = "%s{%d,%d}" % (ch, lo, hi)
        return self.add_rule(name, '"\\"" %s "\\"" %s' % (rep, sp))

    # -- arrays
    def visit_array(self, s, path, name):
        lo = s.get("minItems", 0)
        hi = s.get("maxItems")
        for kw, v in (("minItems", lo), ("maxItems", hi)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise SchemaError("bad value of JSON Schema keyword %r at %s" % (kw, path))
        items = s.get("items", True)
        prefix = s.get("prefixItems", [])
        if isinstance(items, list):  # draft 4-7 tuple form
            prefix, items = items, s.get("additionalItems", True)
            ip = path + "/additionalItems"
        else:
            ip = path + "/items"
        if not isinstance(prefix, list):
            raise SchemaError("'prefixItems' must be an array at %s" % path)
        if "contains" in s:
            k = s.get("minContains", 1)
            if isinstance(k, bool) or not isinstance(k, int) or k < 0:
                raise SchemaError("bad value of JSON Schema keyword 'minContains' at %s" % path)
            c = s["contains"]
            if "maxContains" in s:
                self.refuse("maxContains", path)
            elif k == 1 and not prefix and lo <= 1 and hi is None and items is not False:
                # some element matches: (item ",")* match ("," item)*
                it = self.visit(items, ip, name + "-item")
                ic = self.visit({"allOf": [items, c]}, path + "/contains", name + "-contains")
                if ic is None:
                    return None
                sp = self.prim("space")
                body = '(%s "," %s)* %s ("," %s %s)*' % (it, sp, ic, sp, it) if it else ic
                return self.add_rule(name, '"[" %s %s "]" %s' % (sp, body, sp))
            elif k > 0:
                # narrower: the first k elements are the matches
                if k > 64:
                    self.refuse("minContains", path, "more than 64")
                else:
                    prefix = [{"allOf": [prefix[i] if i < len(prefix) else items, c]}
                              for i in range(k)] + list(prefix[k:])
                    lo = max(lo, k)
        if s.get("uniqueItems") is True and (hi is None or hi > 1):
            u = self.unique_array(s, prefix, items, lo, hi, path, name)
            if u != "refused":
                return u
        pre = []
        for i, p in enumerate(prefix):
            e = self.visit(p, "%s/prefixItems/%d" % (path, i), "%s-%d" % (name, i))
            if e is None:  # positions from i on can't exist
                hi = i if hi is None else min(hi, i)
                break
            pre.append(e)
        it = self.visit(items, ip, name + "-item")
        if it is None:
            hi = len(pre) if hi is None else min(hi, len(pre))
        if hi is not None and hi < lo:
            return None
        sp = self.prim("space")

        def elems(i):
            """Elements from index i on, `i` already written; "" = nothing more."""
            if hi is not None and i >= hi:
                return ""
            sep = "" if i == 0 else '"," %s ' % sp
            if i < len(pre):
                tail = elems(i + 1)
                e = sep + pre[i] + (" " + tail if tail else "")
                return e if i < lo else "(" + e + ")?"
            if it is None:
                return ""
            rlo = max(0, lo - i)
            rhi = None if hi is None else hi - i
            if i == 0:
                more = _rep('"," %s %s' % (sp, it), max(0, rlo - 1),
                            None if rhi is None else rhi - 1)
                e = it + (" " + more if more else "")
                return e if rlo >= 1 else "(" + e + ")?"
            return _rep('"," %s %s' % (sp, it), rlo, rhi)

        body = elems(0)
        return self.add_rule(name, '"[" %s %s"]" %s' % (sp, body + " " if body else "", sp))

    def unique_array(self, s, prefix, items, lo, hi, path, name):
        """uniqueItems where it is decidable: elements from a finite set
        (written in the set's order, each at most once: narrower, sound), or
        a tuple whose positions are pairwise disjoint."""
        sp = self.prim("space")
        if not prefix and isinstance(items, dict):
            it = self.merge([items], path + "/items")
            vals = None
            if isinstance(it, dict):
                ty = it.get("type")
                if "enum" in it or "const" in it:
                    vals = list(it["enum"]) if isinstance(it.get("enum"), list) else []
                    if "const" in it:
                        vals = [it["const"]] if "enum" not in it else \
                            [v for v in vals if _json_eq(v, it["const"])]
                    rest = {k: v for k, v in it.items() if k not in ("enum", "const")}
                    if rest and any(_check(v, rest) is None for v in vals):
                        vals = None
                    elif rest:
                        vals = [v for v in vals if _check(v, rest)]
                elif ty == "boolean" and len(it) == 1:
                    vals = [True, False]
                elif ty == "null" and len(it) == 1:
                    vals = [None]
            if vals is not None:
                uniq = []
                for v in vals:
                    if not any(_json_eq(v, w) for w in uniq):
                        uniq.append(v)
                if len(uniq) > 16:
                    self.refuse("uniqueItems", path, "more than 16 distinct values")
                    return "refused"
                exprs = [self.const_expr(v, path) for v in uniq]
                top = len(exprs) if hi is None else min(hi, len(exprs))
                if top < lo:
                    return None
                memo = {}

                def seq(j, c, first):  # choose from exprs[j:], c chosen so far
                    key = (j, c, first)
                    if key in memo:
                        return memo[key]
                    alts = ['""'] if c >= lo else []
                    if c < top:
                        for t in range(j, len(exprs)):
                            nxt = seq(t + 1, c + 1, False)
                            if nxt is None:
                                continue
                            e = ("" if first else '"," %s ' % sp) + exprs[t]
                            alts.append(e + ("" if nxt == '""' else " " + nxt))
                    r = None if not alts else (" | ".join(alts) if alts != ['""'] else '""')
                    if r not in (None, '""'):
                        r = self.add_rule("%s-u%d-%d" % (name, j, c), r)
                    memo[key] = r
                    return r

                body = seq(0, 0, True)
                if body is None:
                    return None
                return self.add_rule(name, '"[" %s %s"]" %s'
                                     % (sp, "" if body == '""' else body + " ", sp))
        if prefix and (items is False or (hi is not None and hi <= len(prefix))):
            ms = [self.merge([p], "%s/prefixItems/%d" % (path, i)) for i, p in enumerate(prefix)]
            if all(_disjoint(ms[i], ms[j]) for i in range(len(ms)) for j in range(i + 1, len(ms))):
                return self._plain_array(s, path, name)
        self.refuse("uniqueItems", path, "elements not from a finite set")
        return "refused"

    def _plain_array(self, s, path, name):
        return self.visit_array({k: v for k, v in s.items() if k != "uniqueItems"}, path, name)

    # -- objects
    def visit_object(self, s, path, name):
        props = s.get("properties", {})
        if not isinstance(props, dict):
            raise SchemaError("'properties' must be an object at %s" % path)
        required = s.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError("'required' must be an array of strings at %s" % path)
        required = list(dict.fromkeys(required))
        addl = s.get("additionalProperties", True)
        pats = s.get("patternProperties") or {}
        if not isinstance(pats, dict):
            raise SchemaError("'patternProperties' must be an object at %s" % path)
        pnames = s.get("propertyNames", True)
        lo_p = s.get("minProperties", 0)
        hi_p = s.get("maxProperties")
        for kw, v in (("minProperties", lo_p), ("maxProperties", hi_p)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise SchemaError("bad value of JSON Schema keyword %r at %s" % (kw, path))
        sp = self.prim("space")
        if not props and not required and not pats and (addl is True or addl == {}) \
                and pnames in (True, {}) and lo_p == 0 and hi_p is None:
            return self.prim("object")
        for p in pats:
            try:
                re.compile(p)
            except re.error as exc:
                raise SchemaError("invalid regex in 'patternProperties' at %s: %s" % (path, exc))

        def matching(k):  # the pattern schemas that apply to property name k
            return [pats[p] for p in pats if re.search(p, k)]

        def name_ok(k):  # does k satisfy propertyNames?
            r = _check(k, pnames)
            if r is None:
                self.refuse("propertyNames", path, "cannot decide for %r" % k)
                return True
            return r

        # (key, value expr, required) for the declared and the required names
        members = []
        declared = list(props) + [k for k in required if k not in props]
        for k in declared:
            vs = ([props[k]] if k in props else []) + matching(k)
            if k not in props and not vs:
                vs = [addl]
            v = vs[0] if len(vs) == 1 else {"allOf": vs}
            e = None
            if name_ok(k):
                e = self.visit(v, "%s/properties/%s" % (path, _ptr_escape(k)), "%s-%s" % (name, k))
            if e is None:
                if k in required:
                    return None
                continue
            members.append((k, e, k in required))
        # other names: one per pattern (its value satisfies every pattern's
        # schema: a name may match several; narrower), then the rest under
        # additionalProperties (only when no pattern constrains anything: a
        # name that is not declared and matches no pattern cannot be written
        # as such; narrower)
        key_base = {"type": "string", NOT_ENUM: declared}
        if pnames is not True:
            key_base = {"allOf": [key_base, pnames]}
        extras = []
        pvals = [v for v in pats.values() if v is not True and v != {}]
        for i, p in enumerate(pats):
            vs = pvals if pvals else [True]
            ve = self.visit(vs[0] if len(vs) == 1 else {"allOf": vs},
                            "%s/patternProperties/%s" % (path, _ptr_escape(p)), "%s-pp%d" % (name, i))
            ke = self.visit({"allOf": [key_base, {"pattern": p}]}, path + "/patternProperties",
                            "%s-pp%d-key" % (name, i)) if ve is not None else None
            if ve is not None and ke is not None:
                extras.append('%s ":" %s %s' % (ke, sp, ve))
        if not pvals:
            addl_e = self.visit(addl, path + "/additionalProperties", name + "-additional")
            if addl_e is not None:
                if pnames is True:
                    key = self.not_strings_rule(declared, name + "-additional-key") + " " + sp
                else:
                    key = self.visit(key_base, path + "/propertyNames", name + "-additional-key")
                if key is not None:
                    extras.append('%s ":" %s %s' % (key, sp, addl_e))
        extra = None
        if extras:
            extra = self.add_rule(name + "-additional-kv", " | ".join(extras))
        kvs = [("%s %s \":\" %s %s" % (_lit(_json_dumps(k)), sp, sp, e), req) for k, e, req in members]
        n = len(kvs)
        # Counting members for min/maxProperties: c = members written so far,
        # saturated at minProperties when there is no maximum.
        top = hi_p if hi_p is not None else lo_p
        if n * (top + 1) > 4000:
            self.refuse("maxProperties" if hi_p is not None else "minProperties", path,
                        "too many members to count")
            lo_p, hi_p, top = 0, None, 0

        def sat(c):
            return min(c, top) if hi_p is None else c

        def extras_after(c, first):
            """Extra members once c were written; None = cannot satisfy the
            counts.  Extras never count towards minProperties: their names
            may repeat (a grammar cannot keep them distinct), and a parser
            keeps one member per name."""
            if c < lo_p:
                return None
            e_lo = 0
            e_hi = None if hi_p is None else hi_p - c
            if e_hi is not None and e_hi < 0:
                return None
            if extra is None or e_hi == 0:
                return "" if e_lo == 0 else None
            sep = '"," %s %s' % (sp, extra)
            if not first:
                return _rep(sep, e_lo, e_hi)
            more = _rep(sep, max(0, e_lo - 1), None if e_hi is None else e_hi - 1)
            e = extra + (" " + more if more else "")
            return e if e_lo >= 1 else "(" + e + ")?"

        memo = {}

        def tail(j, c):
            """Members j.. after c (>= 1) were written (each with a comma)."""
            key = ("t", j, c)
            if key in memo:
                return memo[key]
            if j == n:
                r = extras_after(c, False)
            else:
                kv, req = kvs[j]
                alts = []
                if hi_p is None or c < hi_p:
                    nxt = tail(j + 1, sat(c + 1))
                    if nxt is not None:
                        alts.append(('"," %s %s' % (sp, kv) + (" " + nxt if nxt else "")))
                if not req:
                    nxt = tail(j + 1, c)
                    if nxt is not None:
                        alts.append(nxt)
                if not alts:
                    r = None
                elif len(alts) == 1:
                    r = alts[0]
                else:
                    r = self.add_rule("%s-tail-%d-%d" % (name, j, c),
                                      " | ".join(a if a else '""' for a in alts))
            memo[key] = r
            return r

        def head(i):
            """Members i.. with nothing written yet."""
            key = ("h", i)
            if key in memo:
                return memo[key]
            if i == n:
                r = extras_after(0, True)
            else:
                kv, req = kvs[i]
                alts = []
                if hi_p is None or hi_p > 0:
                    t = tail(i + 1, sat(1))
                    if t is not None:
                        alts.append(kv + (" " + t if t else ""))
                if not req:
                    h = head(i + 1)
                    if h is not None:
                        alts.append(h)
                if not alts:
                    r = None
                elif len(alts) == 1:
                    r = alts[0]
                else:
                    r = self.add_rule("%s-head-%d" % (name, i),
                                      " | ".join(a if a else '""' for a in alts))
            memo[key] = r
            return r

        body = head(0)
        if body is None:
            if extra is not None and lo_p > 0:
                self.refuse("minProperties", path, "met only with undeclared names")
                return self.visit_object({k: v for k, v in s.items() if k != "minProperties"},
                                         path, name)
            return None
        return self.add_rule(name, '"{" %s %s"}" %s' % (sp, body + " " if body else "", sp))

    def not_strings_rule(self, words, name) -> str:
        """A JSON string (with quotes, without trailing space) whose value is none of
        `words`."""
        ch = self.prim("char")
        if not words:
            return '"\\"" %s* "\\""' % ch
        trie: dict = {}
        for w in words:
            node = trie
            for c in w:
                node = node.setdefault(c, {})
            node[None] = True
        counter = [0]

        # every continuation must end with a closing quote
        def close(node):
            kids = sorted(c for c in node if c is not None)
            alts = []
            for c in kids:
                alts.append("%s %s" % (_lit(_json_dumps(c)[1:-1]), close(node[c])))
            ex = [(ord(c), ord(c)) for c in kids]
            div = charset_expr(_complement(ex + [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]))
            alts.append('%s %s* "\\""' % (div, ch))
            if None not in node:
                alts.append('"\\""')
            counter[0] += 1
            return self.add_rule("%s-%d" % (name, counter[0]), " | ".join(alts))

        return '"\\"" ' + close(trie)



# -- bad input: bounded work before anything is converted

class Conversion:
    """A converted schema: `gbnf` (text, start rule `root`) and `ignored`,
    what lenient mode left unenforced ({keyword, path, reason} dicts; empty
    when strict)."""
    __slots__ = ("gbnf", "ignored")

    def __init__(self, gbnf: str, ignored: list):
        self.gbnf = gbnf
        self.ignored = ignored

    def __repr__(self):
        return "Conversion(%d bytes of GBNF, %d ignored)" % (len(self.gbnf), len(self.ignored))


def _parse(schema):
    if isinstance(schema, (str, bytes)):
        if len(schema) > MAX_SCHEMA_BYTES:
            raise SchemaError("JSON Schema too large: %d bytes serialized (at most %d)" % (len(schema), MAX_SCHEMA_BYTES))
        try:
            schema = json.loads(schema)
        except (ValueError, RecursionError) as exc:
            raise SchemaError("JSON Schema is not valid JSON: %s" % exc) from None
    if not isinstance(schema, (dict, bool)):
        raise SchemaError("JSON Schema must be an object or a boolean, got %s"
                          % type(schema).__name__)
    precheck(schema)
    return schema


def convert_schema(schema, lenient: bool = False) -> Conversion:
    """Convert a JSON Schema (dict, bool, or JSON text).  Strict (default):
    SchemaError for any validity keyword that cannot be enforced, naming it
    and its JSON pointer.  lenient=True: such keywords are left out and
    listed in the result's `ignored`."""
    schema = _parse(schema)
    conv = _Converter(schema, lenient=lenient)
    try:
        text = conv.convert()
    except RecursionError:
        raise SchemaError("JSON Schema nests too deeply") from None
    return Conversion(text, conv.ignored)


def schema_to_gbnf(schema, lenient: bool = False) -> str:
    """Convert a JSON Schema (dict, bool, or JSON text) to GBNF text with a
    `root` rule (see convert_schema)."""
    return convert_schema(schema, lenient).gbnf


def json_value_gbnf() -> str:
    """Any JSON value (bounded whitespace, bounded number digits)."""
    return schema_to_gbnf(True)


def json_object_gbnf() -> str:
    """Any JSON object: OpenAI's response_format {"type": "json_object"}."""
    return schema_to_gbnf({"type": "object"})
