"""An agent with tool calls: `gen(tools=...)` over plain Python functions.

The tools are ordinary functions; their JSON schemas come from the signatures, type hints and
docstrings (`rx.function_tool`). The system message lists them with the runtime's tool prompt
(`rx.tool_prompt`). Each question goes:

  assistant: gen("call", tools=TOOLS)   the runtime's grammar makes the output a well-formed
                                        call of one of the tools, its arguments valid under
                                        that tool's schema; s["call"] is [rx.ToolCall, ...]
  tool:      the functions' results     the program runs the calls in Python and feeds the
                                        results back as a tool turn
  assistant: gen("answer")              the model answers from what the tool returned

Questions are a batch (`run_batch`): they share the system prompt with the tool listing, which
the radix cache computes once.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python examples/tool_agent.py
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

import radixrt as rx

FACTS = {
    "france": {"capital": "Paris", "population": "68 million"},
    "japan": {"capital": "Tokyo", "population": "124 million"},
    "italy": {"capital": "Rome", "population": "59 million"},
}
WEATHER = {"paris": 18, "tokyo": 24, "rome": 27}


def lookup(country: str, attribute: Literal["capital", "population"]) -> str:
    """Look up a fact about a country.

    Args:
        country: the country's name, e.g. Japan
        attribute: which fact
    """
    facts = FACTS.get(country.strip().lower())
    if facts is None:
        return f"no facts about {country!r}; known: {', '.join(c.title() for c in FACTS)}"
    return f"The {attribute} of {country.strip().title()} is {facts[attribute]}."


def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """The current temperature in a city.

    Args:
        city: the city's name, e.g. Paris
        unit: the temperature unit
    """
    celsius = WEATHER.get(city.strip().lower())
    if celsius is None:
        return f"no weather for {city!r}"
    value = celsius if unit == "celsius" else round(celsius * 9 / 5 + 32)
    return f"{value} degrees {unit} in {city.strip().title()}"


def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a * b


TOOLS = [lookup, get_weather, multiply]
QUESTIONS = [
    "What is the capital of Japan?",
    "How warm is it in Rome right now?",
    "What is 12.5 times 4?",
]


@rx.function
def tool_agent(s, question):
    s += rx.system("You are a helpful assistant. Use a tool to answer.\n\n"
                   + rx.tool_prompt(TOOLS))
    s += rx.user(question)
    s += rx.assistant(rx.gen("call", tools=TOOLS, parallel_tool_calls=False, temperature=0,
                             max_tokens=64))
    results = [str(call.run(TOOLS)) for call in s["call"]]  # real Python calls
    s.set_var("results", results)
    s += rx.tool("\n".join(results))
    s += rx.assistant(rx.gen("answer", max_tokens=32, temperature=0, stop="\n"))


def main(backend: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    states = tool_agent.run_batch([{"question": q} for q in QUESTIONS], backend=backend)
    elapsed = time.perf_counter() - t0
    rows = []
    for question, state in zip(QUESTIONS, states):
        calls = state["call"]
        print(f"Question: {question}")
        for call in calls:
            print(f"  call   {call.name}({json.dumps(call.arguments)})")
        print(f"  result {state['results']}")
        print(f"  answer {state['answer'].strip()!r}\n")
        rows.append({"question": question, "calls": [(c.name, c.arguments) for c in calls],
                     "results": state["results"], "answer": state["answer"],
                     "text": state.text()})
    print(f"{len(QUESTIONS)} questions in {elapsed:.1f}s")
    return {"questions": QUESTIONS, "rows": rows, "seconds": elapsed}


if __name__ == "__main__":
    with rx.Runtime(max_total_tokens=16384) as runtime:
        main(runtime)
