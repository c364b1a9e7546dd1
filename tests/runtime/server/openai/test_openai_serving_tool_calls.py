"""OpenAI tool calls on the default model, through the official openai client over a real socket:
calls the grammar makes well-formed (required, a named function, auto with its trigger), their
arguments valid under each tool's schema, streamed as OpenAI's deltas; the follow-up turn; the
refusals. One engine (integrity checked after every step) behind an app with enforcement and
one without (for the comparison the benchmark measures)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from http_serving import serve_in_thread, wait_idle

SCHEMAS: dict[str, dict[str, Any]] = {
    "get_weather": {  # a string and an enum
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24},
                       "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
    },
    "add": {  # numbers with bounds
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": -50, "maximum": 50},
                       "b": {"type": "number", "minimum": 0, "maximum": 10}},
        "required": ["a", "b"],
    },
    "search": {  # an array of strings
        "type": "object",
        "properties": {"terms": {"type": "array", "items": {"type": "string", "maxLength": 16},
                                 "minItems": 1, "maxItems": 3}},
        "required": ["terms"],
    },
    "book": {  # a nested object
        "type": "object",
        "properties": {"guest": {"type": "object",
                                 "properties": {"name": {"type": "string", "maxLength": 20},
                                                "nights": {"type": "integer", "minimum": 1,
                                                           "maximum": 14}},
                                 "required": ["name", "nights"]},
                       "breakfast": {"type": "boolean"}},
        "required": ["guest", "breakfast"],
    },
}
TOOLS = [{"type": "function", "function": {"name": name, "description": f"the {name} tool",
                                            "parameters": schema}}
         for name, schema in SCHEMAS.items()]
ASK = [{"role": "system", "content": "You are a helpful assistant with tools."},
       {"role": "user", "content": "What is the weather in Paris?"}]
OPENER_BIAS = {"44": 4.0, "19324": 4.0, "46": 5.0}  # "<", "tool", ">": the model opens calls


class Apps:
    def __init__(self, engine: Any, ports: list[int]) -> None:
        self.engine = engine
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{ports[0]}", timeout=120)
        self.client, self.unenforced = (
            openai.OpenAI(base_url=f"http://127.0.0.1:{p}/v1", api_key="x", max_retries=0)
            for p in ports)


@pytest.fixture(scope="module")
def apps(loaded_model: Any) -> Iterator[Apps]:
    from radixrt import Engine
    from radixrt.runtime.server.http_server import create_app
    from radixrt.runtime.server.openai.chat_tool_plan import ChatFeatures

    engine = Engine(model=loaded_model, max_total_tokens=8192, check_integrity=True)
    manager = engine.tokenizer_manager("smollm2")
    tok = manager.tokenizer
    ports, stop = serve_in_thread([
        create_app(manager, features=ChatFeatures.of(tok)),
        create_app(manager, features=ChatFeatures.of(tok, enforce_tool_calls=False)),
    ])
    served = Apps(engine, ports)
    yield served
    served.http.close()
    stop()
    engine.check_integrity()


def chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    kwargs.setdefault("model", "default")
    kwargs.setdefault("messages", ASK)
    kwargs.setdefault("tools", TOOLS)
    kwargs.setdefault("max_tokens", 96)
    return client.chat.completions.create(**kwargs)


def check_calls(calls: list[Any], allowed: set[str]) -> None:
    """Every call names an allowed tool and its arguments validate against its schema."""
    assert calls, "no tool call"
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in allowed
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def streamed_calls(stream: Any) -> tuple[dict[int, dict[str, Any]], str, str | None]:
    """Calls assembled from OpenAI's deltas (checking their shape), the content, the reason."""
    calls: dict[int, dict[str, Any]] = {}
    content, reason = "", None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reason = chunk.choices[0].finish_reason or reason
        for piece in delta.tool_calls or []:
            if piece.index not in calls:  # a call's first delta: id, type and name
                assert piece.id and piece.type == "function" and piece.function.name
                calls[piece.index] = {"id": piece.id, "name": piece.function.name,
                                      "arguments": piece.function.arguments or ""}
            else:  # then only fragments of its arguments
                assert piece.id is None and piece.function.name is None
                calls[piece.index]["arguments"] += piece.function.arguments or ""
    return calls, content, reason


# --- enforced calls -----------------------------------------------------------------------------


@pytest.mark.parametrize("tool", list(SCHEMAS))
def test_required_calls_are_valid_for_every_schema(apps: Apps, tool: str) -> None:
    """Sampled calls of a named function, and required over all tools, always parse and
    validate against the schema (nested objects, enums, arrays, bounded numbers)."""
    named = {"type": "function", "function": {"name": tool}}
    out = chat(apps.client, tool_choice=named, parallel_tool_calls=False, n=3,
               temperature=1.0, seed=7)
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        check_calls(choice.message.tool_calls, {tool})
    out = chat(apps.client, tool_choice="required", n=2, temperature=1.0, seed=11)
    for choice in out.choices:
        check_complete_calls(choice)
    assert out.usage.completion_tokens > 0 and out.usage.prompt_tokens > 0


def check_complete_calls(choice: Any) -> None:
    """A choice that made parallel calls: all valid, or (cut by max_tokens) all but the last."""
    calls = choice.message.tool_calls
    if choice.finish_reason == "length":
        calls = calls[:-1]
    else:
        assert choice.finish_reason == "tool_calls"
    if calls:
        check_calls(calls, set(SCHEMAS))


@pytest.mark.parametrize("tool_choice", ["required", "book"])
def test_streamed_calls_equal_the_non_streamed_ones(apps: Apps, tool_choice: str) -> None:
    choice = tool_choice if tool_choice == "required" else {
        "type": "function", "function": {"name": tool_choice}}
    whole = chat(apps.client, tool_choice=choice, temperature=0.0)
    calls, content, reason = streamed_calls(chat(apps.client, tool_choice=choice,
                                                 temperature=0.0, stream=True))
    expected = whole.choices[0].message.tool_calls
    check_complete_calls(whole.choices[0])  # greedy repeats its call until max_tokens
    assert reason == whole.choices[0].finish_reason
    assert content == ""
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in expected]


def test_a_named_function_is_called_exactly_once(apps: Apps) -> None:
    """A forced function makes one call, whatever parallel_tool_calls says (it was often two
    identical calls, the second cut at max_tokens)."""
    for parallel in (None, True):
        extra = {} if parallel is None else {"parallel_tool_calls": parallel}
        out = chat(apps.client, tool_choice={"type": "function", "function": {"name": "book"}},
                   n=4, temperature=1.0, seed=5, **extra)
        for choice in out.choices:
            assert choice.finish_reason == "tool_calls", choice
            assert len(choice.message.tool_calls) == 1
            check_calls(choice.message.tool_calls, {"book"})


def test_parallel_tool_calls_false_allows_exactly_one_call(apps: Apps) -> None:
    out = chat(apps.client, tool_choice="required", parallel_tool_calls=False, n=4,
               temperature=1.0, seed=3)
    for choice in out.choices:
        assert len(choice.message.tool_calls) == 1
        check_calls(choice.message.tool_calls, set(SCHEMAS))


def test_parallel_calls_are_all_returned(apps: Apps) -> None:
    """With parallel calls allowed (the default), each block after the first is another call
    (this small model likes to repeat its call)."""
    out = chat(apps.client, tool_choice="required", n=4, temperature=1.0, seed=7,
               max_tokens=160)
    counts = [len(c.message.tool_calls or []) for c in out.choices]
    for choice in out.choices:
        check_complete_calls(choice)
    assert max(counts) >= 2, counts


def test_auto_with_its_trigger_never_emits_a_broken_call(apps: Apps) -> None:
    """auto: the model writes freely; once it writes the opener, the call's grammar holds. Over
    a sampled batch nudged to open calls, every call is well-formed and no opener is left in
    the content; without enforcement the same batch breaks calls."""
    kwargs = dict(tool_choice="auto", n=16, temperature=1.0, seed=3, max_tokens=64,
                  logit_bias=OPENER_BIAS,
                  messages=[{"role": "system", "content": "Always answer by calling a tool."},
                            ASK[1]])
    out = chat(apps.client, **kwargs)
    made = [c for c in out.choices if c.message.tool_calls]
    assert len(made) >= 3, "the nudge should make some calls"
    for choice in out.choices:
        assert "<tool_call>" not in (choice.message.content or "")
        if choice.message.tool_calls and choice.finish_reason != "length":
            check_calls(choice.message.tool_calls, set(SCHEMAS))
            assert choice.finish_reason == "tool_calls"
    loose = chat(apps.unenforced, **kwargs)
    broken = [c for c in loose.choices if "<tool_call>" in (c.message.content or "")]
    assert broken, "without the grammar this model writes broken calls"


def test_tool_choice_none_keeps_the_prompt_and_calls_nothing(apps: Apps) -> None:
    out = chat(apps.client, tool_choice="none", n=4, temperature=1.0, seed=2, max_tokens=32,
               logit_bias=OPENER_BIAS)
    for choice in out.choices:
        assert choice.message.tool_calls is None
        assert "<tool_call>" not in choice.message.content
    auto = chat(apps.client, tool_choice="auto", max_tokens=4, temperature=0.0)
    assert auto.usage.prompt_tokens == out.usage.prompt_tokens  # the same tool prompt


def test_logprobs_and_usage_with_tools(apps: Apps) -> None:
    out = chat(apps.client, tool_choice="required", temperature=0.0, logprobs=True,
               top_logprobs=2)
    choice = out.choices[0]
    check_calls(choice.message.tool_calls, set(SCHEMAS))
    assert len(choice.logprobs.content) == out.usage.completion_tokens
    sampled = [item for item in choice.logprobs.content if item.top_logprobs]
    forced = [item for item in choice.logprobs.content if not item.top_logprobs]
    assert all(len(item.top_logprobs) == 2 for item in sampled) and sampled
    assert forced and all(item.logprob == 0.0 for item in forced)  # jump-forward: certain


# --- the conversation ---------------------------------------------------------------------------


def test_round_trip_call_result_answer(apps: Apps) -> None:
    """call -> the tool's result as a `tool` message -> a final answer; the second turn's prompt
    starts with the first (the built-in prompt writes the call back as the grammar wrote it),
    so the radix cache serves it."""
    first = chat(apps.client, tool_choice={"type": "function",
                                           "function": {"name": "get_weather"}},
                 temperature=0.0)
    call = first.choices[0].message.tool_calls[0]
    follow = [*ASK,
              {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
              {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp": 21})}]
    answer = chat(apps.client, messages=follow, temperature=0.0, max_tokens=24,
                  tool_choice="none")
    message = answer.choices[0].message
    assert message.tool_calls is None and message.content
    cached = answer.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens  # the whole first prompt, at least
    again = chat(apps.client, messages=follow, temperature=0.0, max_tokens=24,
                 tool_choice="none")
    assert again.choices[0].message.content == message.content
    wait_idle(apps)  # type: ignore[arg-type]


REFUSALS = [
    ({"tool_choice": "required", "tools": None}, "tool_choice needs tools"),
    ({"parallel_tool_calls": False, "tools": None}, "parallel_tool_calls needs tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "not in tools"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "duplicate function names"),
    ({"tools": [{"type": "retrieval"}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "nonsense"}}}}}],
      "tool_choice": "required"}, "'f'"),
    ({"response_format": {"type": "json_object"}, "tool_choice": "required"},
     "both constrain the output"),
    ({"functions": [{"name": "f"}]}, "functions not supported"),
    ({"chat_template_kwargs": {"tools": []}}, "may not set ['tools']"),
    ({"chat_template_kwargs": {"chat_template": "{{ 'x' * 1000000000 }}"}},
     "may not set ['chat_template']"),
    ({"chat_template_kwargs": {"padding": "max_length", "max_length": 10**6}},
     "may not set ['max_length', 'padding']"),
    ({"chat_template_kwargs": {"note": "x" * 300}}, "at most 256 characters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": "RAW:1e400"}}}}}],
      "tool_choice": "required"}, "finite number"),
    ({"messages": [{"role": "user", "content": None}]}, "content is null"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "text": "x"}]}]},
     "image_url"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "http://127.0.0.1:9/never-fetched.png"}}]}]}, "takes no images"),
    ({"messages": [*ASK, {"role": "tool", "content": "21"}]}, "needs tool_call_id"),
    ({"messages": [*ASK, {"role": "tool", "tool_call_id": "call_x", "content": "21"}]},
     "answers no earlier assistant tool call"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
     "only assistant messages carry tool_calls"),
    ({"tools": [TOOLS[0]] * 129}, "tools"),
]


@pytest.mark.parametrize(("change", "message"), REFUSALS)
def test_bad_tool_requests_get_a_400_that_says_what_to_fix(apps: Apps, change: dict[str, Any],
                                                           message: str) -> None:
    body = {"model": "default", "messages": ASK, "tools": TOOLS, "max_tokens": 4, **change}
    body = {k: v for k, v in body.items() if v is not None}
    text = json.dumps(body).replace('"RAW:1e400"', "1e400")  # JSON's number past a double
    response = apps.http.post("/v1/chat/completions", content=text,
                              headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"], response.json()
    ok = apps.http.post("/v1/chat/completions", json={"model": "default", "messages": ASK,
                                                      "max_tokens": 2})
    assert ok.status_code == 200  # everyone else is still served


def test_server_info_shows_the_chat_features(apps: Apps) -> None:
    info = apps.http.get("/server_info").json()
    assert info["chat_features"] == {"tool_call_parser": "hermes", "reasoning_parser": None,
                                     "tool_call_enforcement": True,
                                     "template_renders_tools": False}
    assert info["chat"]["roles"]["tool"][0].endswith("<tool_response>\n")
    assert "{tools}" in info["chat"]["tool_prompt"]
