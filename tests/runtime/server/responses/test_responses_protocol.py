"""Responses API requests as the one chat request (no model): input items, the earlier
conversation and the instructions, tools and tool_choice, text.format; the refusals."""

from __future__ import annotations

from typing import Any

import pytest

from radixrt.runtime.server.core.error_shapes import APIError
from radixrt.runtime.server.openai.openai_protocol import ChatMessage
from radixrt.runtime.server.openai.tool_protocol import NamedToolChoice
from radixrt.runtime.server.responses.responses_protocol import ResponseObject, ResponsesRequest

TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}


def request(**body: Any) -> ResponsesRequest:
    body.setdefault("model", "default")
    body.setdefault("input", "hi")
    return ResponsesRequest.model_validate(body)


def test_items_become_chat_messages() -> None:
    body = request(input=[
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text",
                                                          "text": "think"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "calling", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{\"a\":1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "two"}]},
        {"type": "function_call", "call_id": "c3", "name": "f", "arguments": "{}"},
    ])
    got = body.input_messages()
    assert [(m.role, m.content, m.tool_call_id) for m in got] == [
        ("user", "hi", None), ("assistant", "calling", None), ("tool", "one", "c1"),
        ("tool", "two", "c2"), ("assistant", None, None)]
    assert got[1].reasoning_content == "think"
    assert [c.id for c in got[1].tool_calls] == ["c1", "c2"]
    assert [c.id for c in got[4].tool_calls] == ["c3"]


def test_the_chat_request_of_a_turn() -> None:
    earlier = [ChatMessage(role="user", content="a"), ChatMessage(role="assistant", content="b")]
    out = request(instructions="be brief", tools=[TOOL],
                  tool_choice={"type": "function", "name": "f"}, parallel_tool_calls=False,
                  max_output_tokens=9, top_logprobs=2, reasoning={"effort": "minimal"},
                  text={"format": {"type": "json_schema", "name": "x",
                                   "schema": {"type": "object"}}}).to_chat_request(earlier)
    assert [(m.role, m.content) for m in out.messages] == [
        ("system", "be brief"), ("user", "a"), ("assistant", "b"), ("user", "hi")]
    assert isinstance(out.tool_choice, NamedToolChoice) and out.parallel_tool_calls is False
    assert out.max_tokens == 9 and out.logprobs and out.top_logprobs == 2
    assert out.chat_template_kwargs == {"enable_thinking": False}
    assert out.response_format.json_schema == {"name": "x", "schema": {"type": "object"}}
    assert request(text={"format": {"type": "json_object"}}).to_chat_request([]) \
        .response_format.type == "json_object"


def test_the_created_response_echoes_the_settings() -> None:
    body = request(tools=[TOOL], tool_choice={"type": "function", "name": "f"},
                   metadata={"k": "v"}, store=False)
    start = ResponseObject.start("resp_1", body).model_dump()
    assert start["status"] == "in_progress" and start["tool_choice"] == {
        "type": "function", "name": "f"}
    assert start["metadata"] == {"k": "v"} and start["store"] is False
    assert start["tools"] == [TOOL]


@pytest.mark.parametrize(("body", "needle"), [
    ({"background": True}, "background"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"tools": [{"type": "file_search"}]}, "'file_search'"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "'item_reference'"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "'input_file'"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "needs \"schema\""),
    ({"input": [{"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"}
                for i in range(129)]}, "at most 128 function_call items"),
])
def test_refusals_name_what_to_fix(body: dict[str, Any], needle: str) -> None:
    with pytest.raises(APIError) as info:
        request(**body).to_chat_request([])
    assert needle in info.value.message



def test_a_bound_only_the_chat_request_has_is_a_400() -> None:
    """translated(): a chat-request bound the other API's shape does not check is a 400."""
    from radixrt.runtime.server.core.error_shapes import translated

    with pytest.raises(APIError) as info:
        translated(lambda: ChatMessage(role="user", content="x", name="n" * 1000))
    assert info.value.status == 400 and "name" in info.value.message
