"""The Lark side of the structural grammars: literals and regex terminals escaped, and JSON
schemas closed where they list properties, and JSON Schema's ECMA-262 patterns read by
llguidance as ECMA-262 reads them (the languages themselves run on both engines in
test_structural.py)."""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

import lark
import pytest
from grammar_masks import allowed
from hypothesis import given, settings
from hypothesis import strategies as st
from toy_tokenizers import byte_level_bpe

from radixrt.runtime.constrained.compiler import GrammarCompiler
from radixrt.runtime.constrained.structural_lark import (
    close_objects,
    ecma_patterns,
    ecma_to_rust_regex,
    json_schema_with_options,
    lark_literal,
    lark_regex,
)
from radixrt.runtime.constrained.token_table import TokenTable


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


CLASS_CHARS = st.sampled_from(["a", "b", "[", "&", "-", "~", "^", "a-b", "-a", "\\d", "\\W",
                               "/", "."])
ATOMS = st.one_of(
    st.sampled_from(["a", "b", "\\[", "\\]", "&", "~", "-", ".", "\\d", "\\w", "\\S"]),
    # never "[^]" nor "[]": ECMA-262 reads them as "any" and "nothing", Python's re (the
    # oracle here) as the start of a longer class
    st.builds(lambda neg, items: "[" + ("^" if neg else "") + ("a" if items[0] == "^" else "")
              + "".join(items) + "]", st.booleans(), st.lists(CLASS_CHARS, min_size=1,
                                                             max_size=4)),
)
PATTERNS = st.builds(lambda atoms: "".join(a + q for a, q in atoms),
                     st.lists(st.tuples(ATOMS, st.sampled_from(["", "*", "?"])), min_size=1,
                              max_size=4))
TEXTS = st.text(alphabet="ab[]&-~^/.0_\t", max_size=6)


@pytest.fixture(scope="module")
def llguidance_regexes() -> Any:
    tok = byte_level_bpe(["ab[]&-~^/.0_\t ab ab[ ]] \r é ٣"] * 4, 270)
    compiler = GrammarCompiler(TokenTable(tok, len(tok), [tok.eos_token_id]),
                               backend="llguidance")
    yield compiler
    compiler.close()


def accepts(compiler: Any, pattern: str, text: str) -> bool:
    """Whether llguidance, given the rewritten pattern, accepts the whole text."""
    state = compiler.get(("regex", ecma_to_rust_regex(pattern))).new_state()
    for token in compiler.table.tokenizer.encode(text, add_special_tokens=False):
        if token not in allowed(state):
            return False
        state.advance(token)
    return state.accepts_end()


@settings(max_examples=400, deadline=None)
@given(PATTERNS, st.lists(TEXTS, min_size=1, max_size=6))
def test_ecma_patterns_mean_in_rust_what_they_mean_in_ecma(llguidance_regexes: Any,
                                                            pattern: str,
                                                            texts: list[str]) -> None:
    """Python's re with ASCII classes reads these patterns as ECMA-262 does (a class's "[",
    "-", "&&", "~~" literal or ranges as ECMA parses them; \\d \\w \\s ASCII; "." past "\\t"):
    the rewritten pattern, run by llguidance, accepts exactly the texts re accepts."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # re: "possible nested set"
        try:
            ecma = re.compile(pattern, re.ASCII)
        except re.error:
            return  # e.g. a range out of order: ECMA refuses it too
    try:
        grammar = llguidance_regexes.get(("regex", ecma_to_rust_regex(pattern)))
    except ValueError as exc:
        raise AssertionError(f"{pattern!r} -> {ecma_to_rust_regex(pattern)!r}: {exc}") from exc
    assert grammar.key
    for text in texts + [m.group(0) for m in [ecma.search(t) for t in texts] if m]:
        assert accepts(llguidance_regexes, pattern, text) == bool(ecma.fullmatch(text)), (
            pattern, ecma_to_rust_regex(pattern), text)


@pytest.mark.parametrize(("pattern", "text", "ecma"), [
    (r"\d", "٣", False), (r"\d", "5", True), (r"\w", "é", False), (r"[\w]", "é", False),
    (".", "\r", False), (".", "a", True), (r"\s", "\t", True), (r"[^\s]", "\r", False),
    (r"\u00e9", "é", True), (r"[\u00e0-\u00ff]", "é", True), ("[--/]", ".", True),
    ("[--a]", "[", True), ("[a-c---e]", "b", True), ("[a-c---e]", "d", False),
    ("[]a]", "a]", False), ("[^]a]", "xa]", True), (r"[\b]", "\x08", True),
])
def test_ecma_semantics_where_rust_differs(llguidance_regexes: Any, pattern: str, text: str,
                                           ecma: bool) -> None:
    """What ECMA-262 (a JavaScript engine) answers, where Rust's or Python's own reading
    differs."""
    assert accepts(llguidance_regexes, pattern, text) == ecma


def test_patterns_in_schemas_are_rewritten_and_data_is_not() -> None:
    schema = {"type": "object", "properties": {"p": {"type": "string", "pattern": "[[a]"}},
              "patternProperties": {"^[[x]$": {"const": "[[a]"}},
              "default": {"pattern": "[[a]"}}
    out = ecma_patterns(schema)
    assert out["properties"]["p"]["pattern"] == "[\\[a]"
    assert out["patternProperties"] == {"^[\\[x]$": {"const": "[[a]"}}
    assert out["default"] == {"pattern": "[[a]"}  # data, not a schema
