"""The llguidance engine (a toy byte-level vocabulary, no model): context-free grammars in GBNF
and Lark whose sampled outputs an independent parser (Lark itself) takes; bad grammars refused
with their position; JSON-schema keywords it cannot enforce refused by name, never dropped;
special tokens never allowed."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator

import lark
import pytest
from cfg_grammars import GRAMMARS, PARSERS
from grammar_masks import allowed
from toy_tokenizers import byte_level_bpe

from radixrt.runtime.constrained.compiler import GrammarCompiler
from radixrt.runtime.constrained.grammar_engine import GrammarState
from radixrt.runtime.constrained.token_table import TokenTable

CORPUS = ["SELECT name, age FROM people WHERE age = 30", "(12+3)*4-5/6", "[ab,[cd,ef],[]]",
          '{"name": "Ada", "tags": ["x"]}'] * 4

@pytest.fixture(scope="module")
def table() -> TokenTable:
    tok = byte_level_bpe(CORPUS, 360)
    return TokenTable(tok, len(tok), [tok.eos_token_id])


@pytest.fixture(scope="module")
def compiler(table: TokenTable) -> Iterator[GrammarCompiler]:
    compiler = GrammarCompiler(table, backend="llguidance")
    yield compiler
    compiler.close()


def sample(state: GrammarState, rng: random.Random, limit: int = 80) -> str | None:
    """A random output: a token from the mask each step (jump-forward's forced tokens taken
    as they come), EOS with probability 0.3 where the grammar may end. None: cut at limit."""
    table = state.grammar.table
    out: list[int] = []
    for _ in range(limit):
        if state.accepts_end() and (rng.random() < 0.3 or not allowed(state)):
            state.advance(table.eos_token_id)
            return b"".join(table.token_bytes[t] or b"" for t in out).decode()
        forced = [t for t in state.forced() if t != table.eos_token_id]
        token = forced[0] if forced else rng.choice(allowed(state))
        state.advance(token)
        out.append(token)
    return None


@pytest.mark.parametrize(("kind", "grammar", "language"), GRAMMARS,
                         ids=[f"{k}-{lang}" for k, _, lang in GRAMMARS])
def test_sampled_outputs_parse_with_an_independent_parser(compiler: GrammarCompiler, kind: str,
                                                          grammar: str, language: str) -> None:
    parser = lark.Lark(PARSERS[language], parser="earley")
    compiled = compiler.get((kind, grammar))
    rng = random.Random(7)
    outputs = [sample(compiled.new_state(), rng) for _ in range(40)]
    finished = [o for o in outputs if o is not None]
    assert len(finished) >= 30  # every grammar here is finite: walks end
    for text in finished:
        parser.parse(text)  # raises on a text outside the language
    assert len(set(finished)) > 5  # the masks let the walks differ


@pytest.mark.parametrize(("kind", "grammar", "fragment"), [
    ("lark", 'start: foo\nfoo: "a" bar', "at 2(6): unknown name"),
    ("lark", 'start: "a" (', "1(13): Expected token ')'"),
    ("ebnf", 'root ::= ("a"', "Expected ')' at line 1"),
    ("ebnf", "root ::= foo", "Rule 'foo' not found"),
])
def test_bad_grammars_are_refused_with_their_position(compiler: GrammarCompiler, kind: str,
                                                      grammar: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=f"^{kind} is invalid: .*{re.escape(fragment)}"):
        compiler.compile_async((kind, grammar))


@pytest.mark.parametrize(("schema", "keyword"), [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "object", "properties": {"a": {"type": "string"}},
      "dependencies": {"a": ["b"]}}, "dependencies"),
])
def test_schema_keywords_it_cannot_enforce_are_refused_by_name(
        compiler: GrammarCompiler, schema: dict, keyword: str) -> None:
    with pytest.raises(ValueError, match=f"cannot enforce.*{keyword}"):
        compiler.compile_async(("json_schema", json.dumps(schema)))


def test_objects_are_closed_unless_the_schema_opens_them(compiler: GrammarCompiler,
                                                         table: TokenTable) -> None:
    closed = {"type": "object", "properties": {"a": {"type": "integer"}}}
    opened = {**closed, "additionalProperties": {"type": "integer"}}

    def accepts(schema: dict, text: str) -> bool:
        state = compiler.get(("json_schema", json.dumps(schema))).new_state()
        for token in table.encode(text):
            if token not in allowed(state):
                return False
            state.advance(token)
        return state.accepts_end()

    assert accepts(closed, '{"a":1}') and not accepts(closed, '{"a":1,"b":2}')
    assert accepts(opened, '{"a":1,"b":2}') and not accepts(opened, '{"a":1,"b":"x"}')
    assert not accepts(closed, '{"a": 1}')  # compact, as the outlines-core path writes it


def test_special_tokens_are_never_allowed(table: TokenTable, compiler: GrammarCompiler) -> None:
    state = compiler.get(("regex", r"[\s\S]{0,8}")).new_state()
    specials = {t for t in range(table.vocab_size) if table.token_bytes[t] is None}
    assert specials and not specials & set(allowed(state))
