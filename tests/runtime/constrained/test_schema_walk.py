"""The subschema walk: every keyword that holds a subschema (one, a list, a map) is visited,
data under other keywords never is, and skipped keywords are copied as they are."""

from __future__ import annotations

from typing import Any

from radixrt.runtime.constrained.schema_walk import map_subschemas


def test_every_subschema_keyword_is_visited_and_data_is_not() -> None:
    schema = {"properties": {"a": {"n": 1}}, "$defs": {"d": {"n": 2}},
              "anyOf": [{"n": 3}], "allOf": [{"n": 4}], "items": {"n": 5},
              "prefixItems": [{"n": 6}], "not": {"n": 7}, "additionalProperties": {"n": 8},
              "const": {"n": 9}, "default": {"n": 10}, "enum": [{"n": 11}]}
    seen: list[Any] = []

    def visit(sub: Any) -> Any:
        seen.append(sub["n"])
        return {"n": -sub["n"]}

    out = map_subschemas(schema, visit, skip=("allOf",))
    assert sorted(seen) == [1, 2, 3, 5, 6, 7, 8]
    assert out["properties"] == {"a": {"n": -1}} and out["items"] == {"n": -5}
    assert out["allOf"] == [{"n": 4}] and out["const"] == {"n": 9}
    assert out["enum"] == [{"n": 11}] and out["default"] == {"n": 10}
    assert schema["properties"] == {"a": {"n": 1}}  # a copy
    assert map_subschemas({"items": [{"n": 1}, {"n": 2}]}, visit)["items"] == [{"n": -1},
                                                                             {"n": -2}]
