"""The grammar-engine interface, the same on both engines (a toy byte-level vocabulary, no
model): a walk through the masks stays in the language and ends only where it may; rollback
gives the state a replay gives; forced tokens are what every continuation starts with; EOS is
never in a mask and ends the grammar once; and the two engines accept the same texts."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from grammar_masks import allowed
from hypothesis import given, settings
from hypothesis import strategies as st
from toy_tokenizers import byte_level_bpe

from radixrt.runtime.constrained.compiler import GrammarCompiler, engine_for
from radixrt.runtime.constrained.grammar_engine import GrammarState
from radixrt.runtime.constrained.token_table import TokenTable

CORPUS = ['{"name": "Ada", "age": 36}', "red green blue", "2024-01-31", "abc abd abe",
          "yes no maybe"] * 4
REGEXES = [r"(red|green|blue)( (red|green|blue)){0,2}", r"20[0-9]{2}-(0[1-9]|1[0-2])",
           r"ab[c-e]( ab[c-e])*", r"[a-z]{1,4}"]
SCHEMA = ('{"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, '
          '"age": {"type": "integer", "minimum": 0, "maximum": 120}}, '
          '"required": ["name", "age"]}')


@pytest.fixture(scope="module")
def table() -> TokenTable:
    tok = byte_level_bpe(CORPUS, 320)
    return TokenTable(tok, len(tok), [tok.eos_token_id])


def text_of(table: TokenTable, tokens: list[int]) -> str:
    return b"".join(table.token_bytes[t] or b"" for t in tokens).decode("utf-8", "replace")


def random_walk(state: GrammarState, draw: st.DataObject, steps: int) -> list[int]:
    """Advance by tokens drawn from the mask (EOS where it may end); the tokens taken."""
    taken: list[int] = []
    for _ in range(steps):
        choices = allowed(state)
        if state.accepts_end():
            choices.append(state.grammar.table.eos_token_id)
        if not choices:
            break
        token = draw.draw(st.sampled_from(choices))
        state.advance(token)
        taken.append(token)
        if state.ended:
            break
    return taken


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(REGEXES), st.data())
def test_walks_stay_in_the_language_and_end_only_where_it_may(
        compiler: GrammarCompiler, regex: str, data: st.DataObject) -> None:
    table = compiler.table
    state = compiler.get(("regex", regex)).new_state()
    taken = random_walk(state, data, 24)
    assert table.eos_token_id not in allowed(state)  # EOS is accepts_end's, never the mask's
    if state.ended:
        assert re.fullmatch(regex, text_of(table, taken[:-1]))
        with pytest.raises(ValueError, match="after the grammar ended"):
            state.advance(taken[0])


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([("regex", r) for r in REGEXES] + [("json_schema", SCHEMA)]),
       st.data())
def test_rollback_gives_the_state_a_replay_gives(compiler: GrammarCompiler, constraint,
                                                 data: st.DataObject) -> None:
    grammar = compiler.get(constraint)
    state = grammar.new_state()
    taken = random_walk(state, data, 16)
    back = data.draw(st.integers(0, len(taken)))
    state.rollback(back)
    replayed = GrammarState.replay(grammar, taken[: len(taken) - back])
    assert allowed(state) == allowed(replayed)
    assert state.accepts_end() == replayed.accepts_end()
    assert state.forced() == replayed.forced()
    assert state.consumed == replayed.consumed == len(taken) - back
    with pytest.raises(ValueError, match="cannot roll back"):
        state.rollback(state.consumed + 1)


def test_forced_tokens_are_the_only_continuation(compiler: GrammarCompiler) -> None:
    """From the start of the schema, `{"name":"` is forced; each forced token is the only one
    the mask allows as it is taken (decoding with jump-forward off picks the same)."""
    state = compiler.get(("json_schema", SCHEMA)).new_state()
    forced = state.forced()
    assert text_of(compiler.table, list(forced)).startswith('{"')
    for token in forced:
        assert state.forced()[0] == token and token in allowed(state)
        state.advance(token)
    exact = compiler.get(("regex", "yes")).new_state()
    assert exact.forced()[-1] == compiler.table.eos_token_id  # only the end is left after it


@pytest.fixture(scope="module")
def both(table: TokenTable) -> Iterator[list[GrammarCompiler]]:
    compilers = [GrammarCompiler(table, backend=b) for b in ("outlines", "llguidance")]
    yield compilers
    for compiler in compilers:
        compiler.close()


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(REGEXES), st.text(alphabet="abcder gl-0129 ", max_size=12))
def test_both_engines_accept_the_same_texts(both: list[GrammarCompiler], regex: str,
                                            text: str) -> None:
    verdicts = []
    for compiler in both:
        state = compiler.get(("regex", regex)).new_state()
        ok = True
        for token in compiler.table.encode(text):
            if token not in allowed(state):
                ok = False
                break
            state.advance(token)
        verdicts.append(ok and state.accepts_end())
    assert verdicts[0] == verdicts[1] == bool(re.fullmatch(regex, text))


def test_eos_where_the_grammar_does_not_accept_is_refused(compiler: GrammarCompiler) -> None:
    state = compiler.get(("regex", "abc")).new_state()
    with pytest.raises(ValueError, match="does not accept"):
        state.advance(compiler.table.eos_token_id)


def test_the_engine_per_kind() -> None:
    assert engine_for("auto", "json_schema") == "llguidance"
    assert engine_for("auto", "regex") == engine_for("auto", "tool_calls") == "outlines"
    assert engine_for("outlines", "json_schema") == "outlines"
    assert engine_for("outlines", "lark") == engine_for("outlines", "ebnf") == "llguidance"
    assert engine_for("llguidance", "choices") == "llguidance"


def test_an_unknown_backend_is_refused(table: TokenTable) -> None:
    with pytest.raises(ValueError, match="grammar_backend 'xgrammar' is unknown"):
        GrammarCompiler(table, backend="xgrammar")
