"""Anthropic's Messages API on the default model, through the official `anthropic` client over a
real socket: the same answers as /v1/chat/completions on the same conversation (one chat path),
streams that add up to the whole message, a tool round trip with calls valid under their schema,
tool_choice any / tool / none, stop sequences, prefill, cached tokens, count_tokens, and errors in
Anthropic's shape. One engine (integrity checked after every step)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest
from http_serving import serve_in_thread

KEY = "sk-test-anthropic"
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 24},
                          "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
TOOLS = [{"name": "get_weather", "description": "The weather in a city",
          "input_schema": WEATHER},
         {"name": "add", "description": "Adds two integers",
          "input_schema": {"type": "object", "properties": {"a": {"type": "integer"},
                                                           "b": {"type": "integer"}},
                           "required": ["a", "b"]}}]
SYSTEM = "You are a helpful assistant."
ASK = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0.0}


class Served:
    def __init__(self, engine: Any, port: int) -> None:
        self.engine = engine
        url = f"http://127.0.0.1:{port}"
        self.client = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0)
        self.openai = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        self.http = httpx.Client(base_url=url, timeout=120)


@pytest.fixture(scope="module")
def served(loaded_model: Any) -> Iterator[Served]:
    from radixrt import Engine
    from radixrt.runtime.server.http_server import create_app

    engine = Engine(model=loaded_model, max_total_tokens=8192, check_integrity=True)
    ports, stop = serve_in_thread([create_app(engine.tokenizer_manager("smollm2"),
                                              api_key=KEY)])
    srv = Served(engine, ports[0])
    yield srv
    srv.http.close()
    stop()
    engine.check_integrity()


def create(srv: Served, **kwargs: Any) -> Any:
    kwargs.setdefault("model", "default")
    kwargs.setdefault("max_tokens", 24)
    kwargs.setdefault("messages", ASK)
    # sampling fields: in the body (this client's create() no longer names them)
    extra = {name: kwargs.pop(name) for name in ("temperature", "top_p", "top_k")
             if name in kwargs}
    extra.setdefault("temperature", 0.0)
    return srv.client.messages.create(**kwargs, extra_body=extra)


def test_a_message_is_the_chat_completion_of_the_same_conversation(served: Served) -> None:
    """One chat path: the same template, params and output as /v1/chat/completions."""
    msg = create(served, system=SYSTEM)
    chat = served.openai.chat.completions.create(
        model="default", max_tokens=24, temperature=0.0,
        messages=[{"role": "system", "content": SYSTEM}, *ASK])
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == chat.choices[0].message.content
    expected = {"stop": "end_turn", "length": "max_tokens"}[chat.choices[0].finish_reason]
    assert msg.stop_reason == expected and msg.stop_sequence is None
    usage = msg.usage
    assert usage.output_tokens == chat.usage.completion_tokens
    assert usage.input_tokens + usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert chat.usage.prompt_tokens_details.cached_tokens > 0  # the message's prompt, cached
    again = create(served, system=SYSTEM)
    assert again.usage.cache_read_input_tokens > 0
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == \
        chat.usage.prompt_tokens


def test_the_stream_adds_up_to_the_message(served: Served) -> None:
    whole = create(served, max_tokens=32)
    with served.client.messages.stream(model="default", max_tokens=32, messages=ASK,
                                       extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.cache_read_input_tokens > 0


def test_raw_stream_events_are_anthropics_sequence(served: Served) -> None:
    events = [e.type for e in create(served, max_tokens=8, stream=True)]
    assert events[0] == "message_start" and events[1] == "content_block_start"
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(events[2:-3]) == {"content_block_delta"}


def test_a_tool_round_trip(served: Served) -> None:
    """any: only calls, valid under their schema; their results go back as tool_result blocks
    and the model answers in text."""
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    msg = create(served, messages=ask, tools=TOOLS, tool_choice={"type": "any"}, max_tokens=64)
    calls = [b for b in msg.content if b.type == "tool_use"]
    assert calls and msg.stop_reason in ("tool_use", "max_tokens")
    first = calls[0]
    assert first.name in ("get_weather", "add")
    if first.name == "get_weather":
        jsonschema.validate(first.input, WEATHER)
    follow = [*ask, {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": first.id,
                                            "content": "18 degrees and sunny"}]}]
    answer = create(served, messages=follow, tools=TOOLS, max_tokens=24)
    assert answer.content and answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    none = create(served, messages=follow, tools=TOOLS, tool_choice={"type": "none"})
    assert [b.type for b in none.content] == ["text"] and none.stop_reason != "tool_use"


def test_a_named_tool_follows_disable_parallel_tool_use(served: Served) -> None:
    choice = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    for seed_text in ("Paris", "Tokyo", "Lima"):
        msg = create(served, tools=TOOLS, tool_choice=choice, temperature=1.0, max_tokens=64,
                     messages=[{"role": "user", "content": f"Weather in {seed_text}?"}])
        calls = [b for b in msg.content if b.type == "tool_use"]
        assert len(calls) == 1 and calls[0].name == "get_weather", msg.content
        assert msg.stop_reason == "tool_use"
        jsonschema.validate(calls[0].input, WEATHER)


def test_streamed_tool_use_equals_the_whole_one(served: Served) -> None:
    kwargs = {"tools": TOOLS, "tool_choice": {"type": "tool", "name": "get_weather",
                                              "disable_parallel_tool_use": True},
              "max_tokens": 64}
    whole = create(served, **kwargs)
    with served.client.messages.stream(model="default", messages=ASK, extra_body=GREEDY,
                                       **kwargs) as stream:
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "name", None), getattr(b, "input", None))
            for b in final.content] == [
        (b.type, getattr(b, "name", None), getattr(b, "input", None)) for b in whole.content]
    assert final.stop_reason == whole.stop_reason == "tool_use"


def test_a_stop_sequence_is_reported(served: Served) -> None:
    text = create(served, max_tokens=24).content[0].text
    words = text.split()
    assert len(words) >= 3, text
    stop = words[2]
    msg = create(served, max_tokens=24, stop_sequences=["zzqx", stop])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop
    assert msg.content[0].text == text[:text.index(stop)]


def test_a_final_assistant_turn_is_continued(served: Served) -> None:
    """Anthropic's prefill: the output continues the last assistant turn's text."""
    prefill = "The capital of France is"
    msg = create(served, messages=[*ASK, {"role": "assistant", "content": prefill}],
                 max_tokens=6)
    chat = served.openai.chat.completions.create(
        model="default", max_tokens=6, temperature=0.0,
        messages=[*ASK, {"role": "assistant", "content": prefill}],
        extra_body={"continue_final_message": True})
    assert msg.content[0].text == chat.choices[0].message.content
    assert "Paris" in msg.content[0].text


def test_output_config_format_makes_json_valid_under_the_schema(served: Served) -> None:
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}},
              "required": ["capital"], "additionalProperties": False}
    msg = create(served, max_tokens=48, output_config={"format": {"type": "json_schema",
                                                                  "schema": schema}})
    assert msg.stop_reason == "end_turn", msg
    jsonschema.validate(json.loads(msg.content[0].text), schema)


def test_count_tokens_is_the_prompt_the_message_reads(served: Served) -> None:
    counted = served.client.messages.count_tokens(model="default", messages=ASK, system=SYSTEM,
                                                  tools=TOOLS)
    msg = create(served, system=SYSTEM, tools=TOOLS, max_tokens=1)
    assert counted.input_tokens == msg.usage.input_tokens + msg.usage.cache_read_input_tokens


def test_refusals_are_in_anthropics_shape(served: Served) -> None:
    cases = [
        ({"max_tokens": 0}, "max_tokens"),
        ({"model": "claude-x"}, "not served"),
        ({"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AA=="}}]}]}, "takes no images"),
        ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": TOOLS}, "nope"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result",
                                                     "tool_use_id": "x", "content": "1"}]}]},
         "answers no earlier"),
        ({"temperature": -1.0}, "temperature"),
    ]
    for kwargs, needle in cases:
        with pytest.raises(anthropic.BadRequestError) as info:
            create(served, **kwargs)
        body = info.value.body
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert needle in body["error"]["message"], body
    bad = anthropic.Anthropic(base_url=str(served.http.base_url), api_key="wrong",
                              max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        bad.messages.create(model="default", max_tokens=4, messages=ASK)
    assert info.value.body["error"]["type"] == "authentication_error"
    response = served.http.post("/v1/messages", json={"model": "default", "messages": ASK},
                                headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"})
    assert response.status_code == 400 and "max_tokens" in response.json()["error"]["message"]
    # OpenAI's routes keep OpenAI's shape
    response = served.http.post("/v1/chat/completions", json={"model": "x", "messages": ASK},
                                headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "model"
