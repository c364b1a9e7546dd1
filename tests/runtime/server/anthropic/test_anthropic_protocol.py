"""Anthropic Messages requests as the one chat request (no model): turns, blocks, tools and
tool_choice, output_config, prefill; the refusals; the stop reasons."""

from __future__ import annotations

from typing import Any

import pytest

from radixrt.runtime.server.anthropic.anthropic_protocol import (
    MessagesRequest,
    stop_reason_of,
    tool_input,
)
from radixrt.runtime.server.core.error_shapes import APIError, anthropic_error_body
from radixrt.runtime.server.openai.tool_protocol import NamedToolChoice

TOOL = {"name": "f", "description": "d", "input_schema": {"type": "object"}}


def chat(**body: Any) -> Any:
    body.setdefault("model", "default")
    body.setdefault("max_tokens", 8)
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return MessagesRequest.model_validate(body).to_chat_request()


def test_turns_and_blocks_become_chat_messages() -> None:
    out = chat(system=[{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}],
               messages=[
                   {"role": "user", "content": "hi"},
                   {"role": "assistant", "content": [
                       {"type": "thinking", "thinking": "hmm", "signature": "s"},
                       {"type": "text", "text": "calling"},
                       {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": [1]}}]},
                   {"role": "user", "content": [
                       {"type": "tool_result", "tool_use_id": "t1", "content": "42"},
                       {"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                        "content": [{"type": "text", "text": "boom"}]},
                       {"type": "text", "text": "thanks"}]}],
               tools=[TOOL], stop_sequences=["END"], metadata={"user_id": "u1"})
    got = [(m.role, m.content, m.tool_call_id) for m in out.messages]
    assert got == [("system", "be brief", None), ("user", "hi", None),
                   ("assistant", "calling", None), ("tool", "42", "t1"),
                   ("tool", "Error: boom", "t1"), ("user", "thanks", None)]
    assistant = out.messages[2]
    assert assistant.reasoning_content == "hmm"
    assert [(c.id, c.function.name, c.function.arguments) for c in assistant.tool_calls] == [
        ("t1", "f", '{"a":[1]}')]
    assert out.tools[0].function.parameters == {"type": "object"}
    assert out.stop == ["END"] and out.user == "u1" and out.max_tokens == 8
    assert not out.continue_final_message


@pytest.mark.parametrize(("choice", "expected"), [
    ({"type": "auto"}, ("auto", None)),
    ({"type": "any"}, ("required", None)),
    ({"type": "any", "disable_parallel_tool_use": True}, ("required", False)),
    ({"type": "none"}, ("none", None)),
    ({"type": "tool", "name": "f"}, ("f", True)),
    ({"type": "tool", "name": "f", "disable_parallel_tool_use": True}, ("f", False)),
])
def test_tool_choice(choice: dict[str, Any], expected: tuple[str, bool | None]) -> None:
    out = chat(tools=[TOOL], tool_choice=choice)
    name = out.tool_choice.function.name if isinstance(out.tool_choice, NamedToolChoice) \
        else out.tool_choice
    assert (name, out.parallel_tool_calls) == expected


def test_output_config_thinking_and_prefill() -> None:
    out = chat(output_config={"format": {"type": "json_schema", "schema": {"type": "object"}},
                              "effort": "high"},
               thinking={"type": "disabled"},
               messages=[{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "Sure:"}])
    assert out.response_format.json_schema == {"name": "output", "schema": {"type": "object"}}
    assert out.chat_template_kwargs == {"enable_thinking": False}
    assert out.continue_final_message


@pytest.mark.parametrize(("body", "needle"), [
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     "'document' is not supported"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}]},
     "'image' is not valid in a assistant turn"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png"}}]}]},
     "needs data"),
    ({"messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "x", "name": "f", "input": {}}]}]},
     "not valid in a user turn"),
    ({"tools": [{**TOOL, "type": "web_search_20250305"}]}, "server tools"),
    ({"tools": [TOOL], "tool_choice": {"type": "tool"}}, "needs the tool's"),
    ({"max_tokens": 0}, "max_tokens=0"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": f"t{i}", "name": "f", "input": {}} for i in range(129)]}]},
     "at most 128 tool_use blocks"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {"a": "x" * 70000}}]}]},
     "characters of JSON"),
])
def test_refusals_name_what_to_fix(body: dict[str, Any], needle: str) -> None:
    with pytest.raises(APIError) as info:
        chat(**body)
    assert needle in info.value.message


def test_stop_reasons_and_tool_inputs() -> None:
    assert stop_reason_of("length", None, True) == ("max_tokens", None)
    assert stop_reason_of("stop", None, True) == ("tool_use", None)
    assert stop_reason_of("stop", "END", False) == ("stop_sequence", "END")
    assert stop_reason_of("stop", None, False) == ("end_turn", None)
    assert stop_reason_of(None, None, False) == (None, None)
    assert tool_input('{"a": 1}') == {"a": 1}
    assert tool_input("[1]") == {"arguments": [1]}
    assert tool_input("{oops") == {"arguments": "{oops"}
    assert anthropic_error_body("m", 429) == {
        "type": "error", "error": {"type": "rate_limit_error", "message": "m"}}
