"""The structure grammars (constrained/structural.py) on a small real tokenizer built in memory:
the avoid-regex, tool-call grammars in each mode, the reasoning prefix, the end marker that keeps
outlines-core from dropping tokens out of accepting states, and the spec's refusals. No model."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from toy_tokenizers import byte_level_bpe
from transformers import PreTrainedTokenizerFast

from radixrt.runtime.constrained.compiler import GrammarCompiler
from radixrt.runtime.constrained.grammar_engine import GrammarState, expand_bitmask, mask_words
from radixrt.runtime.constrained.outlines_regex import to_regex
from radixrt.runtime.constrained.structural import (
    TOOL_FORMATS,
    ToolCallSpec,
    avoid_regex,
    parse_tool_call_spec,
    reasoning_format,
    reasoning_regex,
    tool_calls_regex,
)
from radixrt.runtime.constrained.token_table import TokenTable, _byte_level_map
from radixrt.runtime.sampling_params import SamplingParams

HERMES = TOOL_FORMATS["hermes"]
LLAMA = TOOL_FORMATS["llama3_json"]
WEATHER = json.dumps({"type": "object", "properties": {"city": {"type": "string"}},
                      "required": ["city"]})
ADD = json.dumps({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
                                                         "maximum": 9}}, "required": ["a"]})
CORPUS = ["<tool_call>", "</tool_call>", "<think>", "</think>", '{"name": "get_weather", ',
          '"arguments": {"city":"Paris"}}', "Yes sir, the weather in Paris is fine.",
          "hello world"] * 4


@pytest.fixture(scope="module")
def table() -> TokenTable:
    tok = byte_level_bpe(CORPUS, 400)
    return TokenTable(tok, len(tok), [tok.eos_token_id])


@pytest.fixture(scope="module")
def outlines(table: TokenTable) -> Iterator[GrammarCompiler]:
    """outlines-core alone (its end marker)."""
    compiler = GrammarCompiler(table, backend="outlines")
    yield compiler
    compiler.close()


def spec(mode: str, fmt: str = "hermes", parallel: bool = True) -> str:
    return json.dumps({"format": fmt, "mode": mode, "parallel": parallel,
                       "tools": [{"name": "get_weather", "parameters": json.loads(WEATHER)},
                                 {"name": "add", "parameters": json.loads(ADD)}]})


def accepts(compiler: GrammarCompiler, constraint: tuple[str, str], text: str) -> bool:
    """Whether the compiled grammar takes `text` (the tokenizer's split) and may end there."""
    state = compiler.get(constraint).new_state()
    vocab = compiler.table.vocab_size
    for token in compiler.table.encode(text):
        words = torch.zeros(mask_words(vocab), dtype=torch.int32)
        state.write_mask(words)
        if not expand_bitmask(words[None], vocab)[0, token]:
            return False
        state.advance(token)
    return state.accepts_end()


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>'
CALL2 = '<tool_call>\n{"name": "add", "arguments": {"a":7}}\n</tool_call>'


# --- avoid_regex ---------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["<tool_call>", "</think>"]), st.data())
def test_avoid_regex_takes_exactly_the_texts_without_the_word(word: str, data: st.DataObject
                                                              ) -> None:
    pieces = st.sampled_from([word, word[:-1], word[:3], word[0], word[1:], "x", "\n", " ",
                              word[0] * 2])
    text = "".join(data.draw(st.lists(pieces, max_size=8)))
    assert bool(re.fullmatch(avoid_regex(word), text)) == (word not in text)


def test_avoid_regex_refuses_a_word_that_repeats_its_first_character() -> None:
    with pytest.raises(ValueError, match="repeats its first character"):
        avoid_regex("abca")


# --- tool-call grammars ---------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "text", "ok"), [
    ("required", CALL, True),
    ("required", CALL + "\n" + CALL2, True),
    ("required", "", False),
    ("required", "Sure. " + CALL, False),
    ("required", CALL.replace("Paris", 'Pa\\"ris'), True),  # an escaped quote
    ("required", CALL.replace('"city"', '"town"'), False),
    ("required", CALL2.replace("7", "12"), False),  # above the maximum
    ("auto", "", True),
    ("auto", "Yes sir, the weather in Paris is fine.", True),
    ("auto", "Let me check. " + CALL, True),
    ("auto", "<tool_call>hello world", False),  # the opener starts a call: it must be one
    ("auto", "a <tool_ca", True),  # a partial tag is text
    ("auto", CALL + " bye", False),  # nothing after the calls
    ("none", "Yes sir", True),
    ("none", CALL, False),
])
def test_tool_call_grammars_by_mode(compiler: GrammarCompiler, mode: str, text: str,
                                    ok: bool) -> None:
    assert accepts(compiler, ("tool_calls", spec(mode)), text) is ok


def test_parallel_false_allows_one_call(compiler: GrammarCompiler) -> None:
    one = ("tool_calls", spec("required", parallel=False))
    assert accepts(compiler, one, CALL)
    assert not accepts(compiler, one, CALL + "\n" + CALL2)


def test_llama3_json_calls_are_the_whole_output(compiler: GrammarCompiler) -> None:
    call = '{"name": "add", "parameters": {"a":3}}'
    required = ("tool_calls", spec("required", "llama3_json"))
    auto = ("tool_calls", spec("auto", "llama3_json"))
    assert accepts(compiler, required, call) and accepts(compiler, required, call + "; " + call)
    assert accepts(compiler, auto, "hello world") and accepts(compiler, auto, call)
    assert not accepts(compiler, auto, '{"hello": 1}')
    # the parser takes "{" after whitespace for a call: the grammar must not pass one unchecked
    assert not accepts(compiler, auto, ' {"name": "evil", "parameters": {}}')
    assert not accepts(compiler, auto, '\n{"hello": 1}')
    assert accepts(compiler, auto, "  hello world")


def test_the_fixed_text_of_a_call_is_forced(compiler: GrammarCompiler) -> None:
    """After the opener's tag, the keys, quotes and braces up to the tool's name are forced
    (jump-forward appends them without sampling)."""
    grammar = compiler.get(("tool_calls", spec("required")))
    forced = grammar.new_state().forced()
    text = b"".join(compiler.table.token_bytes[t] or b"" for t in forced).decode()
    assert text.startswith('<tool_call>\n{"name": "')


# --- the end marker ------------------------------------------------------------------------------


def test_a_token_out_of_an_accepting_state_is_allowed(outlines: GrammarCompiler) -> None:
    """outlines-core alone drops " " after "Yes" under `Yes( sir)?` (its DFA's matches are
    delayed by a byte); the end marker keeps it, and EOS is allowed exactly where the pattern
    is complete."""
    grammar = outlines.get(("regex", "Yes( sir)?"))
    table = outlines.table
    state = GrammarState.replay(grammar, table.encode("Yes"))
    assert state.accepts_end()
    assert table.byte_token[ord(" ")] in grammar.index.get_allowed_tokens(state.state)
    state.advance(table.byte_token[ord(" ")])
    assert not state.accepts_end()
    for token in table.encode("sir"):
        state.advance(token)
    assert state.accepts_end()


def test_the_marker_never_ends_a_pattern_that_takes_it_as_a_character(
        outlines: GrammarCompiler) -> None:
    grammar = outlines.get(("regex", "a.*b"))
    table = outlines.table
    assert not GrammarState.replay(grammar, table.encode("a")).accepts_end()
    assert GrammarState.replay(grammar, table.encode("axb")).accepts_end()
    with pytest.raises(ValueError, match="end marker"):
        GrammarState.replay(grammar, table.encode("a")).advance(grammar.end_token)


@pytest.mark.parametrize(("regex", "text"), [
    ("yes$", "yes"), ("yes\\z", "yes"), ("[a-z]+$", "yes"), ("(?x)abc # a comment", "abc")])
def test_a_pattern_the_marker_cannot_follow_is_indexed_as_it_is(
        outlines: GrammarCompiler, regex: str, text: str) -> None:
    """An end anchor or a trailing verbose-mode comment: no end marker, the pattern's own
    final states (as before the marker)."""
    grammar = outlines.get(("regex", regex))
    assert grammar.end_token is None
    assert GrammarState.replay(grammar, outlines.table.encode(text)).accepts_end()


def test_no_token_holding_the_marker_byte_is_ever_allowed() -> None:
    """A vocabulary with tokens that hold the marker byte besides its own ("yes\\x00"): none
    is in any mask, and advancing by one is refused."""
    char = {b: c for c, b in _byte_level_map().items()}  # byte -> its byte-level character
    vocab = {"<eos>": 0, **{char[b]: b + 1 for b in range(256)}}
    merges = [("y", "e"), ("ye", "s"), ("yes", char[0])]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
    table = TokenTable(tok, len(tok), [0])
    assert len(table.marker_tokens) > 1
    compiler = GrammarCompiler(table, backend="outlines")
    grammar = compiler.get(("choices", ("yes", "no")))
    state = grammar.new_state()
    words = torch.zeros(mask_words(len(tok)), dtype=torch.int32)
    state.write_mask(words)
    allowed = set(torch.nonzero(expand_bitmask(words[None], len(tok))[0]).flatten().tolist())
    assert allowed and not allowed & set(table.marker_tokens.tolist())
    with pytest.raises(ValueError, match="end marker"):
        state.advance(int(table.marker_tokens[-1]))
    compiler.close()


def test_bounds_must_be_finite_numbers() -> None:
    schema = json.dumps({"type": "object", "properties": {"a": {"type": "integer",
                                                                "minimum": float("inf")}}})
    with pytest.raises(ValueError, match="finite number"):
        to_regex(("json_schema", schema))
    with pytest.raises(ValueError, match="tool 'f'"):
        to_regex(("tool_calls", json.dumps({"format": "hermes", "tools": [
            {"name": "f", "parameters": json.loads(schema)}]})))


# --- reasoning -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("fmt", "text", "ok"), [
    ("qwen3", '{"a":3}', True),
    ("qwen3", '<think>hmm, three</think>\n\n{"a":3}', True),
    ("qwen3", "<think>anything at all, {not json}</think>\n\n{\"a\":3}", True),
    ("qwen3", "<think>hmm</think>\n\nthree", False),
    ("qwen3", "<think>hmm</think>\n\n\n\n{\"a\":3}", False),  # whitespace is bounded
    ("deepseek-r1", 'hmm</think>{"a":3}', True),
    ("deepseek-r1", '{"a":3}', False),  # the output starts inside the thinking
])
def test_constraints_apply_after_the_thinking(compiler: GrammarCompiler, fmt: str, text: str,
                                              ok: bool) -> None:
    params = SamplingParams(json_schema=ADD, reasoning_format=fmt)
    assert params.constraint is not None and params.constraint[0] == "reasoning"
    assert accepts(compiler, params.constraint, text) is ok
    assert bool(re.fullmatch(to_regex(params.constraint), text)) is ok


def test_reasoning_wraps_tool_calls_too(compiler: GrammarCompiler) -> None:
    params = SamplingParams(tool_calls=spec("required"), reasoning_format="qwen3")
    assert accepts(compiler, params.constraint, "<think>weather</think>\n" + CALL)
    assert reasoning_regex(reasoning_format("qwen3"), "x").endswith("(?:x)")


# --- the spec ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "message"), [
    ({"format": "xml"}, "tool-call format 'xml' is unknown"),
    ({"mode": "sometimes"}, "mode 'sometimes' is unknown"),
    ({"parallel": "yes"}, "parallel must be true or false"),
    ({"tools": []}, "needs tools"),
    ({"tools": [{"name": "a"}, {"name": "a"}]}, "duplicate tool names"),
    ({"tools": [{"name": ""}]}, "non-empty str name"),
    ({"tools": [{"name": "a", "parameters": []}]}, "must be a JSON schema object"),
    ({"tools": [{"name": f"t{i}"} for i in range(129)]}, "at most 128"),
    ({"extra": 1}, "unknown keys ['extra']"),
])
def test_bad_specs_are_refused_by_name(change: dict, message: str) -> None:
    base = json.loads(spec("required"))
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_tool_call_spec(json.dumps({**base, **change}))


def test_a_spec_round_trips_and_names_a_broken_schema() -> None:
    parsed = parse_tool_call_spec(spec("auto"))
    assert isinstance(parsed, ToolCallSpec) and parse_tool_call_spec(parsed.to_json()) == parsed
    assert tool_calls_regex(parsed).startswith(avoid_regex("<tool_call>"))
    broken = json.dumps({"format": "hermes", "tools": [
        {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "zzz"}}}}]})
    with pytest.raises(ValueError, match="tool 'f'"):
        to_regex(("tool_calls", broken))
    assert HERMES.block("f", "{}") == '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    assert LLAMA.block("f", "{}") == '{"name": "f", "parameters": {}}'
