"""OpenAI's Responses API on the default model, through the official `openai` client (and the
OpenAI Agents SDK) over a real socket: the same answers as /v1/chat/completions on the same
conversation (one chat path), the streamed event sequence adding up to the whole response,
function tools with tool_choice, previous_response_id over several turns with the earlier
conversation a cache hit by construction (its KV pinned), stored responses scoped to the API
key's tenant, cancel, and the refusals. One engine (integrity checked after every step)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from http_serving import serve_in_thread

KEYS = {"alice": "sk-alice", "bob": "sk-bob"}
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 24},
                          "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
          "parameters": WEATHER}]
SYSTEM = "You are a helpful assistant."
ASK = "What is the capital of France?"


class Served:
    def __init__(self, engine: Any, port: int) -> None:
        self.engine = engine
        self.url = f"http://127.0.0.1:{port}"
        self.client = self.client_of("alice")
        self.other = self.client_of("bob")
        self.http = httpx.Client(base_url=self.url, timeout=120,
                                 headers={"Authorization": f"Bearer {KEYS['alice']}"})

    def client_of(self, tenant: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=KEYS[tenant], max_retries=0)

    def pins(self) -> int:
        return self.http.get("/server_info").json()["pin_leases"]


@pytest.fixture(scope="module")
def served(loaded_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from radixrt import Engine
    from radixrt.runtime.server.core.tenants import ApiKeys
    from radixrt.runtime.server.http_server import create_app

    key_file = Path(tmp_path_factory.mktemp("keys")) / "keys.txt"
    key_file.write_text("".join(f"{name}:{key}\n" for name, key in KEYS.items()))
    engine = Engine(model=loaded_model, max_total_tokens=8192, check_integrity=True)
    app = create_app(engine.tokenizer_manager("smollm2"), keys=ApiKeys.from_file(str(key_file)))
    ports, stop = serve_in_thread([app])
    srv = Served(engine, ports[0])
    yield srv
    srv.http.close()
    stop()
    engine.check_integrity()


def create(client: openai.OpenAI, **kwargs: Any) -> Any:
    kwargs.setdefault("model", "default")
    kwargs.setdefault("input", ASK)
    kwargs.setdefault("max_output_tokens", 24)
    kwargs.setdefault("temperature", 0.0)
    return client.responses.create(**kwargs)


def test_a_response_is_the_chat_completion_of_the_same_conversation(served: Served) -> None:
    resp = create(served.client, instructions=SYSTEM, store=False)
    chat = served.client.chat.completions.create(
        model="default", max_tokens=24, temperature=0.0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}])
    assert resp.object == "response" and resp.id.startswith("resp_")
    assert resp.output_text == chat.choices[0].message.content
    assert [item.type for item in resp.output] == ["message"]
    finish = chat.choices[0].finish_reason
    assert resp.status == {"stop": "completed", "length": "incomplete"}[finish]
    if finish == "length":
        assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.usage.output_tokens == chat.usage.completion_tokens
    assert resp.instructions == SYSTEM and resp.store is False


def test_the_stream_is_the_event_sequence_the_client_parses(served: Served) -> None:
    whole = create(served.client, max_output_tokens=32, store=False)
    events = list(create(served.client, max_output_tokens=32, store=False, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:5] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added",
                         "response.output_text.delta"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done",
                          "response.completed" if whole.status == "completed"
                          else "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text == whole.output_text == final.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens
    if whole.status == "completed":  # the client's helper reads only a completed response
        with served.client.responses.stream(model="default", input=ASK, max_output_tokens=32,
                                            temperature=0.0, store=False) as stream:
            assert stream.get_final_response().output_text == whole.output_text


def test_function_tools_with_tool_choice(served: Served) -> None:
    """required: only calls, valid under the schema; a named function: exactly one call;
    streamed calls equal the whole ones."""
    ask = "What is the weather in Paris?"
    resp = create(served.client, input=ask, tools=TOOLS, tool_choice="required",
                  max_output_tokens=64, store=False)
    calls = [item for item in resp.output if item.type == "function_call"]
    assert calls and all(c.name == "get_weather" for c in calls)
    if resp.status == "completed":
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), WEATHER)
    named = {"type": "function", "name": "get_weather"}
    for seed_city in ("Paris", "Lima", "Oslo"):
        one = create(served.client, input=f"Weather in {seed_city}?", tools=TOOLS,
                     tool_choice=named, temperature=1.0, max_output_tokens=64, store=False)
        calls = [item for item in one.output if item.type == "function_call"]
        assert one.status == "completed" and len(calls) == 1, one.output
        assert calls[0].call_id.startswith("call_") and calls[0].id.startswith("fc_")
        jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    whole = create(served.client, input=ask, tools=TOOLS, tool_choice=named,
                   max_output_tokens=64, store=False)
    events = list(create(served.client, input=ask, tools=TOOLS, tool_choice=named,
                         max_output_tokens=64, store=False, stream=True))
    arguments = "".join(e.delta for e in events
                        if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == arguments == whole.output[0].arguments


def test_previous_response_id_makes_each_turn_a_cache_hit(served: Served) -> None:
    """Four turns: each prompt holds the whole earlier conversation, pinned, so the cached
    tokens grow turn by turn and cover the previous turn's prompt; the conversation holds one
    pin (each turn takes over its predecessor's)."""
    pins_before = served.pins()
    previous = None
    usages = []
    for question in ("Name a fruit.", "Name a colour.", "Name an animal.", "Name a city."):
        resp = create(served.client, input=question, previous_response_id=previous,
                      instructions=SYSTEM, max_output_tokens=12)
        usages.append((resp.usage.input_tokens, resp.usage.input_tokens_details.cached_tokens))
        previous = resp.id
        assert served.pins() == pins_before + 1
    for (earlier_input, _), (now_input, now_cached) in zip(usages, usages[1:]):
        assert now_input > earlier_input
        assert now_cached >= earlier_input, usages  # the earlier prompt: all of it cached
    assert [c for _, c in usages] == sorted(c for _, c in usages) and usages[-1][1] > 0
    stored = served.client.responses.retrieve(previous)
    assert stored.id == previous and stored.previous_response_id is not None
    served.client.responses.delete(previous)
    assert served.pins() == pins_before
    with pytest.raises(openai.NotFoundError):
        served.client.responses.retrieve(previous)


def test_a_tool_round_trip_over_previous_response_id(served: Served) -> None:
    first = create(served.client, input="What is the weather in Paris?", tools=TOOLS,
                   tool_choice={"type": "function", "name": "get_weather"},
                   max_output_tokens=64)
    call = next(item for item in first.output if item.type == "function_call")
    second = create(served.client, previous_response_id=first.id, tools=TOOLS,
                    input=[{"type": "function_call_output", "call_id": call.call_id,
                            "output": "18 degrees and sunny"}])
    assert second.output and second.usage.input_tokens_details.cached_tokens >= \
        first.usage.input_tokens
    # the same turn with the whole conversation sent back (as stateless clients do)
    again = create(served.client, tools=TOOLS, store=False, input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        *[item.model_dump() for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id,
         "output": "18 degrees and sunny"}])
    assert again.output_text == second.output_text


def test_stored_responses_are_the_tenants_own(served: Served) -> None:
    mine = create(served.client, max_output_tokens=4)
    assert served.client.responses.retrieve(mine.id).output_text == mine.output_text
    with pytest.raises(openai.NotFoundError):
        served.other.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        create(served.other, previous_response_id=mine.id)
    with pytest.raises(openai.NotFoundError):
        served.other.responses.delete(mine.id)
    unstored = create(served.client, max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        served.client.responses.retrieve(unstored.id)
    served.client.responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError):
        served.client.responses.delete(mine.id)


def test_text_format_json_schema(served: Served) -> None:
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}},
              "required": ["capital"], "additionalProperties": False}
    resp = create(served.client, max_output_tokens=48, store=False, text={"format": {
        "type": "json_schema", "name": "answer", "schema": schema, "strict": True}})
    assert resp.status == "completed"
    jsonschema.validate(json.loads(resp.output_text), schema)


def test_cancel_stops_a_response_in_progress(served: Served) -> None:
    stream = create(served.client, max_output_tokens=400, stream=True,
                    input="Write a long story about a dragon.", extra_body={"ignore_eos": True})
    first = next(iter(stream))
    rid = first.response.id
    cancelled = served.client.responses.cancel(rid)
    assert cancelled.status == "cancelled"
    last = list(stream)[-1]
    assert last.response.status == "cancelled"
    assert last.response.usage.output_tokens < 400
    with pytest.raises(openai.BadRequestError):  # finished: nothing to cancel
        served.client.responses.cancel(rid)
    with pytest.raises(openai.NotFoundError):
        served.client.responses.cancel("resp_unknown")


def test_refusals(served: Served) -> None:
    cases = [
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "web_search"),
        ({"input": [{"role": "user", "content": [{"type": "input_image",
                                                   "image_url": "http://x/y.png"}]}]},
         "takes no images"),  # a text model: nothing is fetched
        ({"input": [{"role": "user", "content": [{"type": "input_image",
                                                   "file_id": "file-1"}]}]}, "input_image"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "item_reference"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"tool_choice": "required"}, "tool_choice needs tools"),
        ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "1"}]},
         "answers no earlier"),
    ]
    for kwargs, needle in cases:
        with pytest.raises(openai.BadRequestError) as info:
            create(served.client, store=False, **kwargs)
        assert needle in info.value.message, info.value.message
    with pytest.raises(openai.NotFoundError):
        create(served.client, previous_response_id="resp_never")


def test_the_agents_sdk_runs_a_tool_calling_agent(served: Served) -> None:
    """The OpenAI Agents SDK with its default (Responses) model: the agent calls the tool,
    reads its result and ends with a final answer."""
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"It is 18 degrees and sunny in {city}."

    def run() -> Any:
        client = openai.AsyncOpenAI(base_url=served.url + "/v1", api_key=KEYS["alice"],
                                    max_retries=0)
        agent = Agent(name="weather", instructions=SYSTEM, tools=[get_weather],
                      model=OpenAIResponsesModel(model="default", openai_client=client),
                      model_settings=ModelSettings(tool_choice="required", temperature=0.0,
                                                   parallel_tool_calls=False, max_tokens=160))
        return asyncio.run(Runner.run(agent, "What is the weather in Paris?", max_turns=4))

    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(run()))  # its own event loop
    thread.start()
    thread.join(timeout=300)
    assert results, "the agent did not finish"
    result = results[0]
    assert seen, "the tool was never called"
    assert isinstance(result.final_output, str)
    kinds = [item.type for item in result.new_items]
    assert "tool_call_item" in kinds and "tool_call_output_item" in kinds
    assert kinds[-1] == "message_output_item"
