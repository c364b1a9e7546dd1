"""`oneOf` as an engine without it can enforce it exactly: where every two branches are provably
disjoint (no document matches both), "exactly one matches" is "at least one matches", so the
oneOf compiles as an anyOf. Where disjointness cannot be proven the oneOf stays, and the engine
refuses it by name: never a silent loosening to anyOf (XGrammar's fallback, which lets documents
matching two branches through).

The proof is conservative and reads only keywords that shrink a schema's language, so any other
keyword beside them only makes the branches more disjoint: JSON types (`type`, or the types of
`const` / `enum` values), scalar `const` / `enum` values, and objects that both require a key
whose two subschemas are disjoint (tagged unions: `{"kind": {"const": "a"}}` against
`{"kind": {"const": "b"}}`), or where one branch closes its object (`additionalProperties:
false`, no `patternProperties`) and the other requires a key it does not list. Root-relative
`$ref` pointers are followed (a `$ref`'s siblings are not read: drafts before 2019-09 ignore
them); a schema whose subschemas set their own scope (`$id`, `id`, anchors), or that points a
`$ref` into a oneOf, is left as it is. A proof is bounded in steps (MAX_PROOF_STEPS)."""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import unquote

from radixrt.runtime.constrained.schema_walk import map_subschemas

MAX_REF_DEPTH = 16  # $ref hops followed in one proof (cycles end here: not proven)
MAX_PROOF_STEPS = 100_000  # disjointness questions asked per schema (past it: not proven)
# keywords that give a subschema its own base URI or a name to refer to: a `$ref` could then
# mean something a root-relative pointer does not, so nothing is proven in such a schema
SCOPE_KEYWORDS = ("$id", "id", "$anchor", "$dynamicAnchor", "$recursiveAnchor")
_NUMERIC = {"integer", "number"}


class _Proof:
    """What one schema's proofs share: its root (for `$ref`s) and the steps left."""

    def __init__(self, root: dict) -> None:
        self.root = root
        self.steps = MAX_PROOF_STEPS


def one_of_as_any_of(schema: dict) -> dict:
    """A copy of the schema where each oneOf whose branches are pairwise disjoint is an anyOf
    (a node that has an anyOf already keeps its oneOf). A schema with scoped subschemas
    (`$id`, anchors) or a `$ref` into a oneOf is returned as it is."""
    if _has_scopes(schema, top=True) or any("/oneOf" in ref for ref in _refs(schema)):
        return schema
    return _rewrite(schema, _Proof(schema))  # type: ignore[return-value]


def _rewrite(node: Any, proof: _Proof) -> Any:
    if not isinstance(node, dict):
        return node
    out = map_subschemas(node, lambda sub: _rewrite(sub, proof))
    branches = node.get("oneOf")  # the proof reads the branches as written
    if isinstance(branches, list) and "anyOf" not in out and all(
            disjoint(a, b, proof.root, proof=proof)
            for i, a in enumerate(branches) for b in branches[i + 1:]):
        out["anyOf"] = out.pop("oneOf")
    return out


def disjoint(a: Any, b: Any, root: dict, depth: int = 0, proof: _Proof | None = None) -> bool:
    """True only if no JSON document matches both schemas (False: maybe some does, or the
    proof ran out of steps)."""
    proof = proof or _Proof(root)
    proof.steps -= 1
    if depth > MAX_REF_DEPTH or proof.steps < 0:
        return False
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False  # true (anything), or not a schema
    if "$ref" in a or "$ref" in b:  # follow it; its siblings are not read
        ref_side, other = (a, b) if "$ref" in a else (b, a)
        target = _deref(ref_side, root)
        return target is not None and disjoint(target, other, root, depth + 1, proof)
    values_a, values_b = _values(a), _values(b)
    if values_a is not None and values_b is not None:
        return not any(_may_equal(x, y) for x in values_a for y in values_b)
    types_a, types_b = _types(a), _types(b)
    if types_a is not None and types_b is not None and not _types_overlap(types_a, types_b):
        return True
    return _objects_disjoint(a, b, root, depth, proof)


def _objects_disjoint(a: dict, b: dict, root: dict, depth: int, proof: _Proof) -> bool:
    """Object keywords bind objects only: one side must allow nothing else."""
    if not (_only_objects(a) or _only_objects(b)):
        return False
    req_a, req_b = _required(a), _required(b)
    props_a, props_b = _properties(a), _properties(b)
    for key in req_a & req_b:
        if key in props_a and key in props_b and disjoint(props_a[key], props_b[key], root,
                                                          depth + 1, proof):
            return True
    return any(_closed(closed) and _only_objects(closed) and req - set(props)
               for req, closed, props in ((req_a, b, props_b), (req_b, a, props_a)))


def _only_objects(node: dict) -> bool:
    types = _types(node)
    return types is not None and types <= {"object"}


def _deref(node: dict, root: dict) -> Any:
    """The target of a root-relative JSON pointer `$ref` ("#", "#/definitions/x", ...): its
    tokens percent-decoded, then unescaped (~1, ~0), empty ones kept. None for anything else
    (a name fragment, another document)."""
    ref = node.get("$ref")
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        return None
    target: Any = root
    for part in ref[2:].split("/") if ref != "#" else []:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            return None
    return target


def _has_scopes(node: Any, top: bool = False) -> bool:
    """Whether a subschema below the root names a scope (SCOPE_KEYWORDS)."""
    if not isinstance(node, dict):
        return False
    if not top and any(isinstance(node.get(k), str) for k in SCOPE_KEYWORDS):
        return True
    found: list[bool] = []
    map_subschemas(node, lambda sub: found.append(_has_scopes(sub)) or sub)
    return any(found)


def _refs(node: Any) -> list[str]:
    """Every `$ref` string anywhere in the document."""
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def _values(node: dict) -> list | None:
    """The only values the schema allows (const / enum), or None."""
    if "const" in node:
        return [node["const"]]
    enum = node.get("enum")
    return list(enum) if isinstance(enum, list) else None


def _types(node: dict) -> set[str] | None:
    """The JSON types the schema allows, or None (any)."""
    values = _values(node)
    if values is not None:
        return {_type_of(v) for v in values}
    declared = node.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list) and all(isinstance(t, str) for t in declared):
        return set(declared)
    return None


def _types_overlap(a: set[str], b: set[str]) -> bool:
    return bool(a & b) or bool(a & _NUMERIC and b & _NUMERIC)


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    return "array" if isinstance(value, list) else "object"


def _may_equal(x: Any, y: Any) -> bool:
    """Whether two JSON values may be equal as JSON Schema compares them (1 equals 1.0; true
    is not 1); containers of one type are taken as maybe equal."""
    tx, ty = _type_of(x), _type_of(y)
    if tx in _NUMERIC and ty in _NUMERIC:
        return math.isnan(x) or math.isnan(y) or x == y
    if tx != ty:
        return False
    if tx in ("array", "object"):
        return True
    return bool(x == y)


def _required(node: dict) -> set[str]:
    required = node.get("required")
    return {k for k in required if isinstance(k, str)} if isinstance(required, list) else set()


def _properties(node: dict) -> dict:
    props = node.get("properties")
    return props if isinstance(props, dict) else {}


def _closed(node: dict) -> bool:
    return node.get("additionalProperties") is False and "patternProperties" not in node and \
        "unevaluatedProperties" not in node and "allOf" not in node and "$ref" not in node
