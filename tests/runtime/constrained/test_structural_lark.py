"""The Lark side of the structural grammars: literals and regex terminals escaped, and JSON
schemas closed where they list properties (the languages themselves run on both engines in
test_structural.py)."""

from __future__ import annotations

import json

import lark
import pytest

from radixrt.runtime.constrained.structural_lark import (
    close_objects,
    json_schema_with_options,
    lark_literal,
    lark_regex,
)


@pytest.mark.parametrize("text", ['say "hi"', "back\\slash", "new\nline", "é ü"])
def test_literals_read_back_as_the_text(text: str) -> None:
    parser = lark.Lark(f"start: {lark_literal(text)}")
    assert parser.parse(text) is not None


def test_regex_terminals_escape_the_slash() -> None:
    parser = lark.Lark(f"start: X\nX: {lark_regex('a/b+')}")
    assert parser.parse("a/bbb") is not None


def test_objects_are_closed_where_the_schema_lists_properties() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}},
                       "properties": {"type": "string"}},  # a property with that name
        "$defs": {"d": {"type": "object", "properties": {"x": {}}}},
        "anyOf": [{"properties": {"y": {}}}],
        "items": {"type": "object", "properties": {"z": {}}},
    }
    closed = close_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["properties"]["properties"]
    assert closed["$defs"]["d"]["additionalProperties"] is False
    assert closed["anyOf"][0]["additionalProperties"] is False
    assert closed["items"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # a copy


@pytest.mark.parametrize("schema", [
    {"properties": {"a": {}}, "additionalProperties": True},
    {"properties": {"a": {}}, "patternProperties": {"^x": {}}},
    {"properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}]},
    {"properties": {"a": {}}, "required": ["a", "id"]},  # closing it would refuse every value
])
def test_schemas_that_say_how_other_keys_go_stay_as_they_are(schema: dict) -> None:
    assert close_objects(schema).get("additionalProperties") == schema.get(
        "additionalProperties")


def test_options_ride_along_and_non_objects_are_refused() -> None:
    with_options = json_schema_with_options(json.dumps({"type": "integer"}))
    assert with_options["x-guidance"]["whitespace_flexible"] is False
    assert json_schema_with_options("true")["x-guidance"]
    with pytest.raises(ValueError, match="must be an object"):
        json_schema_with_options("[1]")
