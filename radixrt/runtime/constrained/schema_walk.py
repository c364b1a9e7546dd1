"""The one walk over a JSON schema's subschemas that the schema rewrites share (objects closed,
oneOf proven disjoint, ECMA patterns): which keywords hold a subschema, a list of them or a map
of them. Values under any other keyword (`const`, `enum`, `default`, `examples`, ...) are data,
never rewritten."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
SUBSCHEMA_ONE = ("items", "additionalItems", "additionalProperties", "contains", "not", "if",
                 "then", "else", "propertyNames", "unevaluatedProperties", "unevaluatedItems")


def map_subschemas(node: dict, fn: Callable[[Any], Any], skip: Collection[str] = ()) -> dict:
    """A copy of one schema object with `fn` applied to each direct subschema (not under the
    keywords in `skip`, which are copied as they are)."""
    out = dict(node)
    for key in SUBSCHEMA_MAPS:
        if key not in skip and isinstance(out.get(key), dict):
            out[key] = {name: fn(sub) for name, sub in out[key].items()}
    for key in SUBSCHEMA_LISTS:
        if key not in skip and isinstance(out.get(key), list):
            out[key] = [fn(sub) for sub in out[key]]
    for key in SUBSCHEMA_ONE:
        if key not in skip and isinstance(out.get(key), dict):
            out[key] = fn(out[key])
    return out
