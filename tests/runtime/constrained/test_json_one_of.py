"""oneOf as anyOf only where the branches are disjoint: whenever the proof says two schemas are
disjoint, no document matches both (hypothesis, judged by `jsonschema`); tagged unions, types
and closed objects are proven, overlapping branches are not (and the engine refuses them by
name); on llguidance a proven oneOf compiles and its outputs match exactly one branch."""

from __future__ import annotations

import json
import time
from typing import Any

import jsonschema
import pytest
from grammar_masks import allowed
from hypothesis import given, settings
from hypothesis import strategies as st
from toy_tokenizers import byte_level_bpe

from radixrt.runtime.constrained.compiler import GrammarCompiler
from radixrt.runtime.constrained.json_one_of import disjoint, one_of_as_any_of
from radixrt.runtime.constrained.token_table import TokenTable

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.sampled_from([1.0, 0.5]),
                    st.sampled_from(["a", "b", ""]))
TYPES = ["null", "boolean", "integer", "number", "string", "array", "object"]
KEYS = ["k", "m", "n"]


def leaf_schemas() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.just(True), st.just(False), st.just({}),
        st.builds(lambda v: {"const": v}, SCALARS),
        st.builds(lambda vs: {"enum": vs}, st.lists(SCALARS, min_size=1, max_size=3)),
        st.builds(lambda t: {"type": t}, st.sampled_from(TYPES)),
        st.builds(lambda ts: {"type": ts}, st.lists(st.sampled_from(TYPES), min_size=1,
                                                   max_size=3, unique=True)),
    )


def schemas() -> st.SearchStrategy[Any]:
    def objects(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.builds(
            lambda props, required, closed, typed: {
                **({"type": "object"} if typed else {}), "properties": props,
                "required": required, **({"additionalProperties": False} if closed else {})},
            st.dictionaries(st.sampled_from(KEYS), children, max_size=3),
            st.lists(st.sampled_from(KEYS), max_size=2, unique=True),
            st.booleans(), st.booleans())
    return st.recursive(leaf_schemas(), objects, max_leaves=6)


def documents() -> st.SearchStrategy[Any]:
    return st.recursive(SCALARS, lambda inner: st.one_of(
        st.lists(inner, max_size=2), st.dictionaries(st.sampled_from(KEYS + ["z"]), inner,
                                                     max_size=3)), max_leaves=6)


def valid(schema: Any, document: Any) -> bool:
    return jsonschema.Draft7Validator(schema).is_valid(document)


REPRESENTATIVES = [None, True, False, 0, 1, -1, 1.0, 0.5, "", "a", "b", [], [1], {}]


def witnesses(schema: Any, depth: int = 0) -> list[Any]:
    """Documents likely to match the schema, or to sit at its edges: every scalar type's
    representatives, its consts and enum values, and objects of its properties' witnesses with
    and without an unlisted key."""
    out = list(REPRESENTATIVES)
    if not isinstance(schema, dict) or depth > 2:
        return out
    out += [schema["const"]] if "const" in schema else []
    out += list(schema.get("enum", []))
    props = schema.get("properties", {})
    if props:
        keys = list(props)
        options = [witnesses(props[k], depth + 1)[-4:] + [1, "a"] for k in keys]
        for i in range(6):
            doc = {k: opts[(i + j) % len(opts)] for j, (k, opts) in enumerate(zip(keys, options))}
            out += [doc, {**doc, "z": 0}, dict(list(doc.items())[:1])]
    return out


@settings(max_examples=600, deadline=None)
@given(schemas(), schemas(), st.lists(documents(), max_size=4))
def test_no_document_matches_two_schemas_proven_disjoint(a: Any, b: Any, docs: list) -> None:
    if not disjoint(a, b, {}):
        return
    for document in docs + witnesses(a) + witnesses(b):
        assert not (valid(a, document) and valid(b, document)), (a, b, document)


LEAVES: list[Any] = [True, False, {}, {"const": 1}, {"const": 1.0}, {"const": True},
                     {"const": "a"}, {"enum": [1, "a"]}, {"enum": [None, 2]},
                     {"type": "integer"}, {"type": "number"}, {"type": "string"},
                     {"type": ["null", "boolean"]}, {"type": "object"}, {"type": "array"}]
OBJECT_PARTS = [{"const": 1}, {"const": "a"}, {"type": "string"}, {"type": "number"}, {}]


def universe() -> list[Any]:
    """Small schemas of every shape the proof reads: leaves, and objects with one listed key,
    required or not, typed or not, closed or not."""
    objects = [{**({"type": "object"} if typed else {}), "properties": {"k": part},
                "required": required, **({"additionalProperties": False} if closed else {})}
               for part in OBJECT_PARTS for required in ([], ["k"], ["m"])
               for typed in (True, False) for closed in (True, False)]
    return LEAVES + objects


def test_no_document_matches_two_small_schemas_proven_disjoint() -> None:
    """Every pair of a finite universe of small schemas (2,700 pairs), against every witness of
    either side: where the proof says disjoint, no witness matches both."""
    schemas_ = universe()
    validators = [jsonschema.Draft7Validator(s) for s in schemas_]
    docs = [witnesses(s) for s in schemas_]
    proven = 0
    for i, a in enumerate(schemas_):
        for j in range(i + 1, len(schemas_)):
            if not disjoint(a, schemas_[j], {}):
                continue
            proven += 1
            for document in docs[i] + docs[j]:
                assert not (validators[i].is_valid(document)
                            and validators[j].is_valid(document)), (a, schemas_[j], document)
    assert proven > 500  # the proof is not vacuous


@pytest.mark.parametrize(("a", "b"), [
    ({"type": "string"}, {"type": "integer"}),
    ({"const": 1}, {"enum": [2, 3]}),
    ({"const": True}, {"const": 1}),  # true is not 1
    ({"type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"]},
     {"type": "object", "properties": {"kind": {"const": "b"}, "x": {}}, "required": ["kind"]}),
    ({"type": "object", "properties": {"a": {}}, "required": ["a"]},
     {"type": "object", "properties": {"b": {}}, "additionalProperties": False}),
    ({"$ref": "#/$defs/s"}, {"type": "number"}),
])
def test_disjoint_schemas_are_proven(a: dict, b: dict) -> None:
    root = {"$defs": {"s": {"type": "string"}}}
    assert disjoint(a, b, root) and disjoint(b, a, root)


@pytest.mark.parametrize(("a", "b"), [
    ({"type": "integer"}, {"type": "number"}),
    ({"const": 1}, {"const": 1.0}),
    ({"required": ["a"]}, {"required": ["b"]}),  # {"a": 0, "b": 0} matches both
    ({"properties": {"kind": {"const": "a"}}, "required": ["kind"]},
     {"properties": {"kind": {"const": "b"}}, "required": ["kind"]}),  # "x" matches both
    ({"type": "object", "properties": {"a": {}}, "required": ["a"]},
     {"type": "object", "properties": {"b": {}}}),  # open: {"a": 0} matches both
    ({"$ref": "#/$defs/missing"}, {"type": "number"}),
    ({"$ref": "#/$defs/loop"}, {"type": "number"}),
])
def test_overlapping_or_unknown_schemas_are_not(a: dict, b: dict) -> None:
    root = {"$defs": {"loop": {"$ref": "#/$defs/loop"}}}
    assert not disjoint(a, b, root)


def test_only_proven_one_ofs_become_any_ofs() -> None:
    tagged = [{"type": "object", "properties": {"kind": {"const": k}, "v": {"type": "integer"}},
               "required": ["kind"]} for k in ("a", "b")]
    overlapping = [{"type": "integer"}, {"minimum": 3}]
    schema = {"type": "object", "properties": {"x": {"oneOf": tagged},
                                               "y": {"oneOf": overlapping}},
              "$defs": {"z": {"oneOf": [{"type": "string"}, {"type": "null"}]}}}
    out = one_of_as_any_of(schema)
    assert out["properties"]["x"] == {"anyOf": tagged}
    assert out["properties"]["y"] == {"oneOf": overlapping}
    assert out["$defs"]["z"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    assert schema["properties"]["x"] == {"oneOf": tagged}  # the input is not changed


@pytest.fixture(scope="module")
def compiler() -> Any:
    tok = byte_level_bpe(['{"kind":"circle","r":1}', '{"kind":"square","side":2}'] * 4, 300)
    compiler = GrammarCompiler(TokenTable(tok, len(tok), [tok.eos_token_id]),
                               backend="llguidance")
    yield compiler
    compiler.close()


def test_a_proven_one_of_compiles_and_holds_on_llguidance(compiler: GrammarCompiler) -> None:
    shapes = {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"},
                                          "r": {"type": "integer", "minimum": 1,
                                                "maximum": 9}}, "required": ["kind", "r"]},
        {"type": "object", "properties": {"kind": {"const": "square"},
                                          "side": {"type": "integer", "minimum": 1,
                                                   "maximum": 9}},
         "required": ["kind", "side"]}]}
    grammar = compiler.get(("json_schema", json.dumps(shapes)))
    table = compiler.table
    for text, ok in (('{"kind":"circle","r":1}', True), ('{"kind":"square","side":2}', True),
                     ('{"kind":"circle","side":2}', False)):
        state = grammar.new_state()
        accepted = True
        for token in table.tokenizer.encode(text, add_special_tokens=False):
            if token not in allowed(state):
                accepted = False
                break
            state.advance(token)
        assert (accepted and state.accepts_end()) == ok, text
        if ok:
            jsonschema.validate(json.loads(text), shapes)
    with pytest.raises(ValueError, match="oneOf whose branches may overlap"):
        compiler.get(("json_schema", json.dumps({"oneOf": [{"type": "integer"},
                                                           {"minimum": 3}]})))


@pytest.mark.parametrize("schema", [
    # a subschema with its own base URI: its "#/$defs/x" is its own string, not the root's integer
    {"$defs": {"x": {"type": "integer"}}, "oneOf": [
        {"$id": "http://e.com/s", "$defs": {"x": {"type": "string"}}, "$ref": "#/$defs/x"},
        {"type": "string"}]},
    # a plain-name fragment names an anchor, not a key of the root
    {"foo": {"type": "integer"}, "$defs": {"s": {"$anchor": "foo", "type": "string"}},
     "oneOf": [{"$ref": "#foo"}, {"type": "string"}]},
    {"foo": {"type": "integer"}, "oneOf": [{"$ref": "#foo"}, {"type": "string"}]},
    # an empty pointer token is a key "" (a string here), not skipped
    {"definitions": {"x": {"type": "integer"}, "": {"x": {"type": "string"}}},
     "oneOf": [{"$ref": "#/definitions//x"}, {"type": "string"}]},
    # a $ref into a oneOf would dangle once it is renamed
    {"properties": {"a": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                    "b": {"$ref": "#/properties/a/oneOf/0"}}},
])
def test_references_that_may_mean_otherwise_prove_nothing(schema: dict) -> None:
    assert '"anyOf"' not in json.dumps(one_of_as_any_of(schema))


def test_percent_encoded_pointers_are_followed() -> None:
    schema = {"definitions": {"a b": {"type": "integer"}},
              "oneOf": [{"$ref": "#/definitions/a%20b"}, {"type": "string"}]}
    assert "anyOf" in one_of_as_any_of(schema)


def test_a_proof_is_bounded_in_steps() -> None:
    """Recursive tags through $refs: exponential to prove in full; the proof gives up
    (not proven: the oneOf stays) well within a compile's time."""
    keys = [f"k{i}" for i in range(25)]
    node = {"type": "object", "required": keys,
            "properties": {k: {"$ref": "#/$defs/n"} for k in keys}}
    schema = {"$defs": {"n": node}, "oneOf": [{"$ref": "#/$defs/n"}, {"$ref": "#/$defs/n"}]}
    start = time.monotonic()
    assert "oneOf" in one_of_as_any_of(schema)
    assert time.monotonic() - start < 5.0
