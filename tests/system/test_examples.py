"""The examples under examples/ run end to end on one real runtime (the default model, KV integrity
checked after every step) and return what they promise. The model is tiny: these tests check the
structure of the results and what the runtime did, not how clever the answers are."""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest

import radixrt as rx

pytestmark = pytest.mark.slow  # starts real processes

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"


def load(name: str) -> ModuleType:
    """Import examples/<name>.py by path (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rt() -> Iterator[rx.Runtime]:
    runtime = rx.Runtime(max_total_tokens=16384, check_integrity=True, log_level="warning")
    try:
        yield runtime
        # An integrity violation stops the server: it must still be up after every example.
        assert runtime.proc.poll() is None, runtime.log_tail()
    finally:
        runtime.close()


@pytest.fixture
def idle_after(rt: rx.Runtime) -> Iterator[rx.Runtime]:
    """After the example: no pinned prefix left behind (forks joined, batches unpinned) and,
    once the last requests are retired, no KV held by anything but the cache."""
    yield rt
    deadline = time.monotonic() + 10
    while True:
        info = rt.info()
        idle = info["running"] == 0 and info["waiting"] == 0 and info["kv_locked"] == 0
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert info["pinned"] == 0
    assert idle, info
    assert info["kv_free"] + info["kv_evictable"] == info["kv_total"]


def nonempty(text: Any) -> bool:
    return isinstance(text, str) and text.strip() != ""


def test_few_shot_qa(idle_after: rx.Runtime) -> None:
    mod = load("few_shot_qa")
    out = mod.main(idle_after)
    assert len(out["answers"]) == len(mod.QUESTIONS) >= 6
    for answer, choices in zip(out["answers"], out["choices"]):
        assert answer in choices
    assert out["accuracy"] == sum(a == g for a, g in zip(out["answers"], out["gold"])) / 6
    # The few-shot prefix is pinned once for the batch; every question finds it cached.
    assert out["prompt_tokens"] > 0
    assert out["cache_hit_rate"] > 0.3


def test_tree_of_thought(idle_after: rx.Runtime) -> None:
    mod = load("tree_of_thought")
    out = mod.main(idle_after)
    n = mod.BRANCHES
    assert len(out["ideas"]) == n and all(nonempty(i) for i in out["ideas"])
    # Nested joins: the parent sees one list per idea, one value per leaf.
    assert len(out["steps"]) == n and all(len(row) == n for row in out["steps"])
    assert all(nonempty(step) for row in out["steps"] for step in row)
    assert all(w in ("yes", "no") for row in out["works"] for w in row)
    i, j = out["best"]
    assert out["scores"][i][j] == max(x for row in out["scores"] for x in row)
    assert nonempty(out["answer"])


def test_react_agent_calls_its_tools(idle_after: rx.Runtime) -> None:
    mod = load("react_agent")
    out = mod.main(idle_after)
    assert len(out["results"]) == len(mod.QUESTIONS)
    for result in out["results"]:
        trace = result["trace"]
        assert 1 <= len(trace) <= 3
        assert trace[0]["action"] in mod.TOOLS  # the first step must call a tool
        calls = [t for t in trace if t["action"] != "finish"]
        assert calls
        for call in calls:
            # The tool really ran on the model's input, and the model saw what it returned.
            assert call["observation"] == mod.TOOLS[call["action"]](call["input"])
            assert f"Observation: {call['observation']}\n" in result["text"]
        assert all(t["action"] == "finish" for t in trace if "observation" not in t)
        assert isinstance(result["answer"], str)


def test_react_tools_are_safe() -> None:
    mod = load("react_agent")
    assert mod.calculator("17 * 23 + 4") == "395"
    assert mod.calculator("(1 + 2) / 4") == "0.75"
    assert mod.calculator("2 ** 10") == "1024"
    for bad in ("__import__('os').system('true')", "open('x')", "2 ** 100000", "1 / 0", "abc"):
        assert mod.calculator(bad).startswith("error"), bad
    assert mod.lookup("capital of Italy") == "The capital of Italy is Rome."
    assert "59 million" in mod.lookup("Italy") and "Rome" in mod.lookup("Italy")
    assert mod.lookup("Atlantis").startswith("no facts")


def test_tool_agent_makes_valid_calls_and_feeds_back_results(idle_after: rx.Runtime) -> None:
    mod = load("tool_agent")
    out = mod.main(idle_after)
    tools = {tool.__name__: tool for tool in mod.TOOLS}
    assert len(out["rows"]) == len(mod.QUESTIONS)
    for row in out["rows"]:
        assert len(row["calls"]) == 1  # parallel_tool_calls=False
        for (name, arguments), result in zip(row["calls"], row["results"]):
            schema = rx.function_tool(tools[name])["function"]["parameters"]
            jsonschema.validate(arguments, schema)  # the grammar's promise
            assert result == str(tools[name](**arguments))  # the function really ran
        assert f"<tool_response>\n{row['results'][0]}\n</tool_response>" in row["text"]
        assert isinstance(row["answer"], str)


def test_separate_reasoning_needs_a_reasoning_parser(idle_after: rx.Runtime) -> None:
    @rx.function
    def think(s: Any) -> None:
        s += rx.user("Hi") + rx.assistant(rx.gen("a", max_tokens=2, separate_reasoning=True))

    with pytest.raises(rx.BackendError, match="--reasoning-parser"):
        think.run(backend=idle_after).text()


def test_tool_schemas_come_from_signatures() -> None:
    mod = load("tool_agent")
    weather = rx.function_tool(mod.get_weather)["function"]
    assert weather["description"] == "The current temperature in a city."
    assert weather["parameters"] == {
        "type": "object", "required": ["city"],
        "properties": {"city": {"type": "string", "description": "the city's name, e.g. Paris"},
                       "unit": {"enum": ["celsius", "fahrenheit"],
                                "description": "the temperature unit"}}}
    assert rx.ToolCall("multiply", {"a": 2, "b": 3}).run(mod.TOOLS) == 6


def test_json_extraction(idle_after: rx.Runtime) -> None:
    mod = load("json_extraction")
    out = mod.main(idle_after)
    schema = mod.PERSON_SCHEMA
    assert len(out["records"]) == len(out["texts"]) == len(mod.PASSAGES)
    for text, record in zip(out["texts"], out["records"]):
        assert json.loads(text) == record
        assert isinstance(record, dict) and list(record) == schema["required"]
        assert nonempty(record["name"]) and nonempty(record["city"]) and nonempty(record["job"])
        assert isinstance(record["age"], int) and not isinstance(record["age"], bool)
        assert record["status"] in schema["properties"]["status"]["enum"]
        assert isinstance(record["has_pet"], bool)
        jsonschema.validate(record, schema)


def test_multi_turn_chat(idle_after: rx.Runtime) -> None:
    mod = load("multi_turn_chat")
    out = mod.main(idle_after)
    n = len(mod.QUESTIONS)
    messages = out["messages"]
    assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * n
    assert messages[0]["content"] == mod.SYSTEM
    assert [m["content"] for m in messages[1::2]] == mod.QUESTIONS
    assert [m["content"] for m in messages[2::2]] == out["answers"]
    assert all(nonempty(a) for a in out["answers"])
    assert out["streamed"] == out["answers"]  # the streamed pieces add up to each answer
    # Each turn finds the whole previous turn's prompt in the radix cache.
    for i in range(1, n):
        assert out["cached_tokens"][i] >= out["prompt_tokens"][i - 1]


def test_llm_judge(idle_after: rx.Runtime) -> None:
    mod = load("llm_judge")
    out = mod.main(idle_after)
    assert len(out["opinions"]) == len(mod.ASPECTS) == 3
    assert all(nonempty(o) for o in out["opinions"])
    assert out["verdict"] in mod.VERDICTS
    scores = out["verdict_scores"]
    assert set(scores) == set(mod.VERDICTS) and max(scores, key=scores.get) == out["verdict"]
    # The parent's own conversation: the forks' questions stay in the children.
    assert [m["role"] for m in out["messages"]] == ["system", "user", "user", "assistant"]
    assert out["messages"][-1]["content"] == out["verdict"]


def test_demo_tours_every_example() -> None:
    demo = load("demo")
    names = {name for name, _ in demo.EXAMPLES}
    files = {p.stem for p in EXAMPLES_DIR.glob("*.py")} - {"demo"}
    assert names == files
