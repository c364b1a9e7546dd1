"""The tool-call and reasoning parsers on pure text (no model): calls and content found whole and
streamed, malformed and cut-short blocks, and property tests that any chunking of an output
gives what the whole text gives (and, for well-formed outputs, exactly what was written)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixrt.runtime.config import MAX_NAME_CHARS
from radixrt.runtime.constrained.structural import (
    REASONING_FORMATS,
    TOOL_FORMATS,
    ReasoningFormat,
    ToolFormat,
    tool_format,
)
from radixrt.runtime.server.openai.reasoning_parsers import ReasoningParser, split_reasoning
from radixrt.runtime.server.openai.tool_call_deltas import CallDelta, Parsed, ToolCall
from radixrt.runtime.server.openai.tool_parsers import ToolCallParser, parse_tool_calls

HERMES = TOOL_FORMATS["hermes"]
LLAMA = TOOL_FORMATS["llama3_json"]
FORMATS = [HERMES, LLAMA]
QWEN3 = REASONING_FORMATS["qwen3"]
R1 = REASONING_FORMATS["deepseek-r1"]
WS = " \t\n\r"


def call_text(fmt: ToolFormat, name: str, arguments: Any, **dump: Any) -> str:
    """One call's JSON object as the format writes it."""
    return fmt.call_prefix(name) + json.dumps(arguments, **dump) + "}"


def block(fmt: ToolFormat, name: str, arguments: Any, **dump: Any) -> str:
    return fmt.opener + call_text(fmt, name, arguments, **dump) + fmt.closer


def calls_output(fmt: ToolFormat, calls: list[tuple[str, Any]]) -> str:
    """Several calls, joined as the format joins them."""
    return fmt.separator.join(block(fmt, n, a) for n, a in calls)


def stream(fmt: ToolFormat, chunks: list[str]) -> tuple[str, list[CallDelta], list[ToolCall]]:
    parser = ToolCallParser(fmt)
    content, deltas = [], []
    for chunk in [*chunks, None]:
        parsed = parser.feed(chunk) if chunk is not None else parser.finish()
        content.append(parsed.content)
        deltas.extend(parsed.calls)
    return "".join(content), deltas, parser.calls


def split_at(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(set(cuts)), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def check_deltas(deltas: list[CallDelta], calls: list[ToolCall]) -> None:
    """Each call's first delta names it, later ones do not; the fragments add up."""
    seen: dict[int, list[str]] = {}
    for delta in deltas:
        if delta.index not in seen:
            assert delta.index == len(seen), "calls start in order"
            assert delta.name == calls[delta.index].name
            seen[delta.index] = []
        else:
            assert delta.name is None
            assert delta.index == len(seen) - 1, "only the latest call grows"
        seen[delta.index].append(delta.arguments)
    assert [("".join(parts)) for parts in seen.values()] == [c.arguments for c in calls]


def assert_streams_alike(fmt: ToolFormat, text: str) -> tuple[str, list[ToolCall]]:
    """Whole, character by character and in random chunks: the same content and calls."""
    whole = parse_tool_calls(fmt, text)
    rng = random.Random(text)
    for chunks in ([text], list(text), split_at(text, rng.sample(range(len(text) + 1),
                                                                  min(len(text), 5)))):
        content, deltas, calls = stream(fmt, chunks)
        assert (content, calls) == whole
        check_deltas(deltas, calls)
    return whole


# --- tool calls: examples ---------------------------------------------------------------------

NESTED = {"city": {"name": "Paris", "tags": ["a", {"b": [1, 2.5, None, True]}]}, "n": -3}
TRICKY = {"s": 'close } ] " quote \\ backslash <tool_call> </tool_call> ; {"name": "x"}',
          "u": "héllo wörld ✓ 日本 🎉", "e": "", "nl": "a\nb\tc"}


def test_aliases_resolve() -> None:
    assert tool_format("qwen3") is HERMES and tool_format("llama3") is LLAMA


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("text", ["", "Hello, world.", "  two  spaces  \n", "a < b > c",
                                  "<b>bold</b>", "x = {1}; y"])
def test_plain_text_is_content(fmt: ToolFormat, text: str) -> None:
    assert assert_streams_alike(fmt, text) == (text, [])


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("arguments", [{}, {"x": 1}, NESTED, TRICKY, [1, [2, [3]]], "str", 7,
                                       None, True, -1.5e10])
def test_one_call(fmt: ToolFormat, arguments: Any) -> None:
    text = calls_output(fmt, [("get_weather", arguments)])
    content, calls = assert_streams_alike(fmt, text)
    assert content == ""
    assert calls == [ToolCall("get_weather", json.dumps(arguments))]
    assert json.loads(calls[0].arguments) == arguments


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_several_calls(fmt: ToolFormat) -> None:
    wanted = [("a", {"x": 1}), ("b", TRICKY), ("c", []), ("d", NESTED)]
    text = calls_output(fmt, wanted)
    content, calls = assert_streams_alike(fmt, text)
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == wanted


def test_llama_separators_and_whitespace() -> None:
    one, two = call_text(LLAMA, "a", {"x": 1}), call_text(LLAMA, "b", [])
    for joiner in ["; ", ";", " ; ", "\n;\n", " ", ""]:
        text = "\n  " + one + joiner + two + "\n"
        assert assert_streams_alike(LLAMA, text) == ("", [ToolCall("a", '{"x": 1}'),
                                                          ToolCall("b", "[]")])


def test_hermes_text_around_calls() -> None:
    text = ("Let me check.\n\n" + block(HERMES, "a", {"q": 1}) + "\n"
            + block(HERMES, "b", NESTED) + "\n\nDone: <b>ok</b>\n")
    content, calls = assert_streams_alike(HERMES, text)
    assert content == "Let me check.Done: <b>ok</b>\n"
    assert [c.name for c in calls] == ["a", "b"]


def test_hermes_whitespace_tolerance() -> None:
    text = ('<tool_call>  \n { "name" : "f" ,\n "arguments" :\n {"a": [1 , 2]} \n}'
            '</tool_call>x')
    assert assert_streams_alike(HERMES, text) == ("x", [ToolCall("f", '{"a": [1 , 2]}')])


def test_hermes_junk_before_closer_is_skipped() -> None:
    text = '<tool_call>{"name": "f", "arguments": {"a": 1}, "id": "</x>"}\n</tool_call>\nAfter'
    assert assert_streams_alike(HERMES, text) == ("After", [ToolCall("f", '{"a": 1}')])


def test_llama_text_after_calls_is_content() -> None:
    text = call_text(LLAMA, "a", {}) + "; Thanks!"
    assert assert_streams_alike(LLAMA, text) == ("Thanks!", [ToolCall("a", "{}")])
    text = call_text(LLAMA, "a", {}) + '; {"arguments": 1}'
    assert assert_streams_alike(LLAMA, text) == ('{"arguments": 1}', [ToolCall("a", "{}")])
    text = '{"name": "a", "parameters": {}, "id": 3}'
    assert assert_streams_alike(LLAMA, text) == (', "id": 3}', [ToolCall("a", "{}")])


def test_llama_text_first_is_all_content() -> None:
    text = 'Sure: {"name": "a", "parameters": {}}'
    assert assert_streams_alike(LLAMA, text) == (text, [])


def test_name_escapes_and_unicode() -> None:
    for fmt in FORMATS:
        for name in ["wëather", 'say "hi"', "a\\b", "日本"]:
            for ascii_only in (True, False):
                text = (fmt.opener + '{"name": ' + json.dumps(name, ensure_ascii=ascii_only)
                        + f', "{fmt.arguments_key}": {{}}}}' + fmt.closer)
                assert assert_streams_alike(fmt, text) == ("", [ToolCall(name, "{}")])


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("header", ['hello', '{"arguments": {}, "name": "f"}', '{"name": 3, '
                                    '"arguments": {}}', '{"name": "f", "args": {}}', "{'name'",
                                    '{"name": "f" "arguments": 1}', '{"name": "\\q"}',
                                    '{"name": "' + "n" * (MAX_NAME_CHARS + 1) + '"}'])
def test_malformed_blocks_are_content(fmt: ToolFormat, header: str) -> None:
    text = "Hi " + fmt.opener + header + fmt.closer + " bye"
    assert assert_streams_alike(fmt, text) == (text, [])
    if fmt is HERMES:  # a later well-formed block is still a call
        after = text + block(HERMES, "g", {})
        assert assert_streams_alike(fmt, after) == ("Hi " + fmt.opener + header + fmt.closer
                                                    + " bye", [ToolCall("g", "{}")])


def test_llama_malformed_first_block_is_all_content() -> None:
    for text in ['  {"arguments": {}}', ' {"name": 1}; {"name": "a", "parameters": {}}',
                 '\n{"name": "a"}']:
        assert assert_streams_alike(LLAMA, text) == (text, [])


def test_partial_opener_at_the_end_is_content() -> None:
    for tail in ["<", "<tool", "<tool_ca", "<tool_call"]:
        text = "Let me see... " + tail
        assert assert_streams_alike(HERMES, text) == (text, [])
        assert assert_streams_alike(HERMES, block(HERMES, "a", {}) + tail) == (
            tail, [ToolCall("a", "{}")])


def test_partial_opener_is_held_until_decided() -> None:
    parser = ToolCallParser(HERMES)
    assert parser.feed("So <tool_c").content == "So"
    assert parser.feed("x").content == " <tool_cx"
    assert parser.feed(" \n<tool_call>\n{").content == ""
    parsed = parser.feed('"name": "f", "arguments": {"a"')
    assert parsed.content == "" and parsed.calls == [CallDelta(0, "f", '{"a"')]
    assert parser.feed(": 1}").calls == [CallDelta(0, None, ": 1}")]
    assert parser.feed("}\n</tool_call>\n\n  ").calls == []
    assert parser.finish() == Parsed() and parser.finish() == Parsed()
    assert parser.calls == [ToolCall("f", '{"a": 1}')]


def test_name_comes_before_arguments() -> None:
    parser = ToolCallParser(HERMES)
    assert parser.feed('<tool_call>{"name": "f"').calls == []
    assert parser.feed(', "arguments":').calls == [CallDelta(0, "f", "")]
    assert parser.feed(" [1,").calls == [CallDelta(0, None, "[1,")]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_a_block_cut_short_in_its_header_is_dropped(fmt: ToolFormat) -> None:
    """max_tokens ran out before the call's name was known: neither a call nor content (the
    whitespace before its opener goes with it); a partial tag stays content."""
    for cut in [fmt.opener, fmt.opener + "{", fmt.opener + '{"name": "get_w',
                fmt.opener + '{"name": "f", "' + fmt.arguments_key[:3]]:
        text = "x " + cut if fmt.opener else cut
        assert assert_streams_alike(fmt, text) == ("x" if fmt.opener else "", [])
    if fmt.opener:
        assert assert_streams_alike(fmt, "x <tool_ca") == ("x <tool_ca", [])


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_arguments_cut_short_stay_a_call(fmt: ToolFormat) -> None:
    for arguments in ['', '{"a": "x}', '{"a": [1, {"b": ', '"abc\\', "12"]:
        text = fmt.opener + fmt.call_prefix("f") + arguments
        assert assert_streams_alike(fmt, text) == ("", [ToolCall("f", arguments)])


def test_later_calls_after_cut_short_arguments_are_not_seen() -> None:
    text = block(HERMES, "a", {}) + HERMES.opener + HERMES.call_prefix("b") + '{"x": "}'
    assert assert_streams_alike(HERMES, text)[1] == [ToolCall("a", "{}"),
                                                     ToolCall("b", '{"x": "}')]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_never_raises_on_noise(fmt: ToolFormat) -> None:
    rng = random.Random(0)
    alphabet = list('{}[]":,;\\ \n<>/_toolcalnmeargus0123é\x00') + [fmt.opener, fmt.closer or "}"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(60)))
        assert_streams_alike(fmt, text)
    blob = bytes(rng.randrange(256) for _ in range(2000)).decode("latin-1")
    assert_streams_alike(fmt, blob)


def test_long_streams_are_linear() -> None:
    import time

    arguments = {"items": [{"id": i, "text": "x" * 50 + '"}\\'} for i in range(300)]}
    text = "Intro. " * 300 + block(HERMES, "big", arguments) + " <x> " * 300
    parser = ToolCallParser(HERMES)
    started = time.perf_counter()
    for i in range(0, len(text), 3):
        parser.feed(text[i:i + 3])
    parser.finish()
    assert time.perf_counter() - started < 2.0
    assert json.loads(parser.calls[0].arguments) == arguments


# --- tool calls: properties -------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=4),
    max_leaves=12,
)
DUMPS = st.fixed_dictionaries({
    "separators": st.sampled_from([(",", ":"), (", ", ": "), (" ,", " : ")]),
    "indent": st.sampled_from([None, None, 0, 2, "\t"]),
    "ensure_ascii": st.booleans(),
})
NAMES = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
SOME_WS = st.text(alphabet=WS, max_size=3)
# content without an opener: words, whitespace, and things that look a little like calls
CONTENT = st.lists(st.sampled_from(["Hi", "there", " ", "\n", "é✓", "a < b", "<b>", "</b>", "{",
                                    "}", '"', ";", "<tool", "_call", "<tool_ca", ">", "name",
                                    '"arguments":', "\\"]) | st.text(max_size=5), max_size=6
                   ).map("".join).filter(lambda s: HERMES.opener.strip() not in s)


@st.composite
def a_call(draw: st.DrawFn, fmt: ToolFormat) -> tuple[str, Any, str]:
    """(name, arguments, the call's text) with random whitespace in the header."""
    name, arguments, dump = draw(NAMES), draw(JSON_VALUES), draw(DUMPS)
    ws = [draw(SOME_WS) for _ in range(9)]
    text = (f'{ws[0]}{{{ws[1]}"name"{ws[2]}:{ws[3]}{json.dumps(name)}{ws[4]},{ws[5]}'
            f'"{fmt.arguments_key}"{ws[6]}:{ws[7]}{json.dumps(arguments, **dump)}{ws[8]}}}')
    if fmt.opener:
        text = fmt.opener.strip() + text + draw(SOME_WS) + fmt.closer.strip()
    return name, arguments, text


def malformed(fmt: ToolFormat) -> st.SearchStrategy[str]:
    bodies = st.sampled_from(["hello", '{"arguments": {}, "name": "f"}', '{"name": 3}',
                              '{"name": "f", "x": 1}', '{"name": "f"', '{"na', "{", "",
                              '{"name": "f", "arguments": ', '{"name": "a\\', "}"])
    return bodies.map(lambda body: fmt.opener + body + fmt.closer)


def noisy_output(fmt: ToolFormat) -> st.SearchStrategy[str]:
    joiner = st.sampled_from([fmt.separator, "", " ", "; ", ";", "\n\n"])
    piece = (CONTENT | a_call(fmt).map(lambda c: c[2]) | malformed(fmt)
             | st.sampled_from([fmt.opener, fmt.closer, "<tool_ca", "; ", "{", "}"]))
    return st.lists(st.tuples(joiner, piece), max_size=6).map(
        lambda parts: "".join(j + p for j, p in parts))


@st.composite
def chunked(draw: st.DrawFn, texts: st.SearchStrategy[str]) -> tuple[str, list[str]]:
    text = draw(texts)
    cuts = draw(st.lists(st.integers(0, len(text)), max_size=12))
    return text, split_at(text, cuts)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_chunking_parses_alike(fmt: ToolFormat, data: st.DataObject) -> None:
    text, chunks = data.draw(chunked(noisy_output(fmt)))
    content, deltas, calls = stream(fmt, chunks)
    assert (content, calls) == parse_tool_calls(fmt, text)
    check_deltas(deltas, calls)


@st.composite
def hermes_output(draw: st.DrawFn) -> tuple[str, str, list[tuple[str, Any, str]]]:
    """(text, the content expected, the calls): content pieces around call blocks."""
    calls = draw(st.lists(a_call(HERMES), max_size=3))
    pieces = [draw(CONTENT) for _ in range(len(calls) + 1)]
    text = pieces[0] + "".join(c[2] + p for c, p in zip(calls, pieces[1:]))
    if not calls:
        return text, text, calls
    inner = [p.strip(WS) for p in pieces[1:-1]]
    return text, pieces[0].rstrip(WS) + "".join(inner) + pieces[-1].lstrip(WS), calls


@st.composite
def llama_output(draw: st.DrawFn) -> tuple[str, str, list[tuple[str, Any, str]]]:
    calls = draw(st.lists(a_call(LLAMA), min_size=1, max_size=3))
    joiners = [draw(SOME_WS)] + [draw(st.sampled_from(["; ", ";", " ; ", "\n", ""]))
                                 for _ in calls[1:]]
    tail = draw(st.sampled_from(["", " ", "; Done.", "\nThanks {x}", " ok; <b>"]))
    text = "".join(j + c[2] for j, c in zip(joiners, calls)) + tail
    return text, tail.lstrip(WS + ";").lstrip(WS), calls


@pytest.mark.parametrize(("fmt", "outputs"), [(HERMES, hermes_output()),
                                           (LLAMA, llama_output())], ids=["hermes", "llama"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_well_formed_outputs_parse_exactly(fmt: ToolFormat, outputs: Any, data: st.DataObject
                                           ) -> None:
    text, content, wanted = data.draw(outputs)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=10))
    streamed, deltas, calls = stream(fmt, split_at(text, cuts))
    assert streamed == content
    assert [c.name for c in calls] == [name for name, _, _ in wanted]
    assert [json.loads(c.arguments) for c in calls] == [arguments for _, arguments, _ in wanted]
    check_deltas(deltas, calls)


# --- reasoning --------------------------------------------------------------------------------


def stream_reasoning(fmt: ReasoningFormat, chunks: list[str]) -> tuple[str | None, str]:
    parser = ReasoningParser(fmt)
    reasoning, content = [], []
    for chunk in [*chunks, None]:
        delta = parser.feed(chunk) if chunk is not None else parser.finish()
        reasoning.append(delta.reasoning)
        content.append(delta.content)
    assert not parser.in_reasoning
    return ("".join(reasoning) if parser.reasoning_seen else None), "".join(content)


def assert_reasons_alike(fmt: ReasoningFormat, text: str) -> tuple[str | None, str]:
    whole = split_reasoning(fmt, text)
    for chunks in ([text], list(text)):
        assert stream_reasoning(fmt, chunks) == whole
    return whole


@pytest.mark.parametrize(("fmt", "text", "split"), [
    (QWEN3, "<think>\nHmm.\n</think>\n\nAnswer.", ("\nHmm.\n", "Answer.")),
    (QWEN3, "  <think>a</think>b", ("a", "b")),
    (QWEN3, "Answer <think>x</think>", (None, "Answer <think>x</think>")),
    (QWEN3, "  \nAnswer", (None, "  \nAnswer")),
    (QWEN3, "<thinking>", (None, "<thinking>")),
    (QWEN3, "<thi", (None, "<thi")),
    (QWEN3, "<think>still thinking </thi", ("still thinking </thi", "")),
    (QWEN3, "", (None, "")),
    (R1, "Let me think.\n</think>\n\nAnswer", ("Let me think.\n", "Answer")),
    (R1, "\n<think>\nx</think>y", ("\nx", "y")),
    (R1, "no closer at all <b>", ("no closer at all <b>", "")),
    (R1, "</think>Answer", ("", "Answer")),
    (R1, "<think></think>", ("", "")),
    (R1, "  <thi", ("  <thi", "")),
    (R1, "a </think> b </think> c", ("a ", "b </think> c")),
    (R1, "", ("", "")),
])
def test_reasoning_examples(fmt: ReasoningFormat, text: str, split: tuple[str | None, str]
                            ) -> None:
    assert assert_reasons_alike(fmt, text) == split


def test_reasoning_state() -> None:
    parser = ReasoningParser(QWEN3)
    assert not parser.in_reasoning and not parser.reasoning_seen
    assert parser.feed("<think>ab</th").reasoning == "ab"
    assert parser.in_reasoning and parser.reasoning_seen
    delta = parser.feed("ink>  The answer")
    assert (delta.reasoning, delta.content) == ("", "The answer")
    assert not parser.in_reasoning
    assert ReasoningParser(R1).in_reasoning and ReasoningParser(R1).reasoning_seen


REASONING_PIECES = st.sampled_from(["<think>", "</think>", "<thi", "</th", "<", "think>", " ",
                                    "\n", "x", "é", "<b>", "/"]) | st.text(max_size=4)
THOUGHT = st.text(max_size=12).filter(lambda s: "<think>" not in s and "</think>" not in s)


@pytest.mark.parametrize("fmt", [QWEN3, R1], ids=lambda f: f.name)
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_any_chunking_splits_reasoning_alike(fmt: ReasoningFormat, data: st.DataObject) -> None:
    text, chunks = data.draw(chunked(st.lists(REASONING_PIECES, max_size=8).map("".join)))
    assert stream_reasoning(fmt, chunks) == split_reasoning(fmt, text)


@pytest.mark.parametrize("fmt", [QWEN3, R1], ids=lambda f: f.name)
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_well_formed_reasoning_splits_exactly(fmt: ReasoningFormat, data: st.DataObject
                                              ) -> None:
    thought, answer, lead = data.draw(THOUGHT), data.draw(THOUGHT), data.draw(SOME_WS)
    opened = data.draw(st.booleans()) or not fmt.starts_inside
    closed = data.draw(st.booleans())
    if not fmt.starts_inside and data.draw(st.booleans()):  # no thinking at all
        text = answer
        expected: tuple[str | None, str] = (None, answer)
    else:  # a trailing partial closer (not closed) is still reasoning at the end
        text = (lead + fmt.opener if opened else "") + thought
        if closed:
            text += fmt.closer + data.draw(SOME_WS) + answer
        expected = (thought, answer.lstrip() if closed else "")
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=10))
    assert stream_reasoning(fmt, split_at(text, cuts)) == expected
