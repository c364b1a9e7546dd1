"""The DSL's tools and reasoning against a real DSL endpoint (ZeroMQ over loopback, in-process
on an engine whose integrity is checked after every step): gen(tools=...) gives rx.ToolCalls the
grammar made well-formed, the tool turn and tool prompt come from the runtime, separate_reasoning
splits a reasoning model's thinking from its answer (a DeepSeek-R1-style template the test
controls), and backends that cannot do these refuse them by name. The rest of the checks need
no model: schemas from signatures, the spec's refusals."""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any, Literal

import jsonschema
import pytest
from chat_templates import with_template

import radixrt as rx
from radixrt.frontend.backends.openai_backend import constraint_fields
from radixrt.frontend.lang.backend import BackendError
from radixrt.frontend.lang.tools import function_tool, json_type, tool_call_spec

SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
          "required": ["answer"]}


def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """The weather in a city.

    Args:
        city: where
        unit: how to write the temperature
    """
    return f"20 degrees {unit} in {city}"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


# --- no model ------------------------------------------------------------------------------------


def test_schemas_come_from_type_hints_and_docstrings() -> None:
    tool = function_tool(get_weather)["function"]
    assert tool["name"] == "get_weather" and tool["description"] == "The weather in a city."
    assert tool["parameters"]["required"] == ["city"]
    assert tool["parameters"]["properties"]["unit"] == {
        "enum": ["celsius", "fahrenheit"], "description": "how to write the temperature"}
    assert json_type(list[str], "x") == {"type": "array", "items": {"type": "string"}}
    assert json_type(int | None, "x") == {"type": "integer"}
    assert json_type(dict[str, int], "x") == {"type": "object"}
    with pytest.raises(ValueError, match="has no JSON schema"):
        json_type(complex, "f(z)")

    def star(*args: int) -> None: ...

    def positional(a: int, /) -> None: ...

    def untyped(n=3, flag=False, anything=None):  # type: ignore[no-untyped-def]
        return n, flag, anything

    with pytest.raises(ValueError, match=r"\*args"):
        function_tool(star)
    with pytest.raises(ValueError, match="cannot be passed by name"):
        function_tool(positional)
    with pytest.raises(TypeError, match="wrap it in a def"):
        function_tool(functools.partial(add, 1))
    assert function_tool(untyped)["function"]["parameters"]["properties"] == {
        "n": {"type": "integer"}, "flag": {"type": "boolean"}, "anything": {}}
    assert rx.ToolCall("untyped", {"flag": True}).run([untyped]) == (3, True, None)


def test_gen_with_tools_checks_its_options_where_the_program_names_them() -> None:
    with pytest.raises(ValueError, match="tool_choice='sometimes'"):
        rx.gen("x", tools=[add], tool_choice="sometimes")
    with pytest.raises(ValueError, match="duplicate"):
        rx.gen("x", tools=[add, add])
    with pytest.raises(ValueError, match="non-empty list"):
        rx.gen("x", tools=[])
    with pytest.raises(ValueError, match="at most one of"):
        rx.gen("x", tools=[add], regex="a")
    with pytest.raises(TypeError, match="separate_reasoning must be a bool"):
        rx.gen("x", separate_reasoning="yes")
    described, spec = tool_call_spec([add, get_weather], "add", parallel=False)
    assert [t["function"]["name"] for t in described] == ["add", "get_weather"]
    assert json.loads(spec) == {"mode": "required", "parallel": False, "tools": [
        {"name": "add", "parameters": function_tool(add)["function"]["parameters"]}]}


def test_completions_backends_refuse_tools_by_name() -> None:
    with pytest.raises(BackendError, match="gen\\(tools=...\\) needs rx.RuntimeEndpoint"):
        constraint_fields({"tool_calls": "{}"})


# --- on a DSL endpoint ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def endpoint(loaded_model: Any) -> Iterator[rx.RuntimeEndpoint]:
    """A DSL endpoint on its own loop thread, with a DeepSeek-R1-style template."""
    from radixrt import Engine
    from radixrt.runtime.server.dsl.dsl_endpoint import DslEndpoint
    from radixrt.runtime.server.openai.chat_tool_plan import ChatFeatures

    engine = Engine(model=loaded_model, max_total_tokens=8192, check_integrity=True)
    manager = engine.tokenizer_manager("smollm2")
    manager.tokenizer = with_template(manager.tokenizer,
                                      "{{ '<|im_start|>assistant\n<think>\n' }}")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    loop = asyncio.new_event_loop()
    stopped = asyncio.Event()

    async def serve() -> None:
        features = ChatFeatures.of(manager.tokenizer, reasoning_parser="deepseek-r1")
        dsl = DslEndpoint(manager, [f"tcp://127.0.0.1:{port}"], features=features)
        dsl.start()
        await stopped.wait()
        await dsl.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    backend = rx.RuntimeEndpoint(f"tcp://127.0.0.1:{port}")
    yield backend
    backend.close()
    loop.call_soon_threadsafe(stopped.set)
    thread.join(timeout=30)
    engine.check_integrity()


@rx.function
def call_a_tool(s: Any, question: str) -> None:
    s += rx.system("Use a tool.\n\n" + rx.tool_prompt([get_weather, add]))
    s += rx.user(question)
    s += rx.assistant(rx.gen("call", tools=[get_weather, add], temperature=0.8, seed=3,
                             max_tokens=80))
    s += rx.tool("\n".join(str(call.run([get_weather, add])) for call in s["call"]))


def test_gen_with_tools_gives_well_formed_calls(endpoint: rx.RuntimeEndpoint) -> None:
    state = call_a_tool.run(question="Weather in Paris?", backend=endpoint)
    calls = state["call"]
    assert calls and all(isinstance(c, rx.ToolCall) for c in calls)
    tools = {"get_weather": get_weather, "add": add}
    for call in calls:
        schema = function_tool(tools[call.name])["function"]["parameters"]
        jsonschema.validate(call.arguments, schema)
    text = state.text()
    assert "# Tools" in text and '"name": "get_weather"' in text  # the runtime's tool prompt
    assert "<tool_response>\n" in text and "\n</tool_response>" in text  # the tool turn
    assert state.get_meta_info("call")["finish_reason"] in ("stop", "length")


# The template opens the thinking in its generation prompt; a DSL program writes the text of
# its assistant turn itself, opener included. The bias makes this model close its thinking.
@rx.function
def think_then_call(s: Any) -> None:
    s += rx.user("Add 2 and 3.")
    s += rx.assistant("<think>\n" + rx.gen("call", tools=[add], separate_reasoning=True,
                                             temperature=0.0, max_tokens=60,
                                             logit_bias={9617: 8.0, 46: 8.0}))


def test_tool_calls_start_after_the_thinking(endpoint: rx.RuntimeEndpoint) -> None:
    state = think_then_call.run(backend=endpoint)
    calls = state["call"]
    assert [c.name for c in calls][:1] == ["add"]
    for call in calls:
        jsonschema.validate(call.arguments, function_tool(add)["function"]["parameters"])
    assert state.get_meta_info("call")["reasoning"] is not None
    assert "</think>" in state.text()  # the transcript keeps what the model wrote


@rx.function
def think_then_answer(s: Any) -> None:
    s += rx.user("Is Paris in France? Think first.")
    s += rx.assistant("<think>\n" + rx.gen("answer", json_schema=SCHEMA,
                                             separate_reasoning=True, temperature=0.0,
                                             max_tokens=40, logit_bias={9617: 8.0, 46: 8.0}))


def test_separate_reasoning_keeps_the_thinking_apart(endpoint: rx.RuntimeEndpoint) -> None:
    state = think_then_answer.run(backend=endpoint)
    jsonschema.validate(json.loads(state["answer"]), SCHEMA)  # the variable is the answer
    meta = state.get_meta_info("answer")
    assert meta["reasoning"] is not None and "</think>" not in meta["reasoning"]
    assert state.text().endswith(state["answer"] + "<|im_end|>\n")
