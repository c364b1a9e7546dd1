"""A ReAct agent: Thought / Action / Observation steps that call real Python tools.

Each step the model writes a thought (`gen`), *selects* its action among the tool names (so it can
only name a tool that exists), and writes the tool's input (`gen` up to the end of the line). The
program itself then runs the tool in Python and appends the observation to the text, and the
model carries on from there, until it selects `finish` or runs out of steps. Reading a variable
(`s["action_0"]`) waits for the model, so the program's control flow can depend on what it wrote.

The tools: a calculator that evaluates arithmetic safely (with `ast`, never `eval`), and a lookup
in a small table of facts.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python examples/react_agent.py
"""

from __future__ import annotations

import ast
import operator
import time
from collections.abc import Callable
from typing import Any

import radixrt as rx

_OPS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos,
}


def calculator(expression: str) -> str:
    """Evaluate + - * / // % ** and parentheses over numbers; anything else is an error."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 100:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"unsupported: {ast.dump(node)[:40]}")

    try:
        value = ev(ast.parse(expression.strip().replace("x", "*"), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
        return f"error: {exc}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


FACTS = {
    "france": {"capital": "Paris", "population": "68 million"},
    "japan": {"capital": "Tokyo", "population": "124 million"},
    "italy": {"capital": "Rome", "population": "59 million"},
    "brazil": {"capital": "Brasilia", "population": "216 million"},
}


def lookup(topic: str) -> str:
    """A fact such as "capital of Italy": every fact known about the country when the topic names
    no attribute."""
    words = topic.lower()
    for country, facts in FACTS.items():
        if country in words:
            asked = [attr for attr in facts if attr in words] or list(facts)
            return " ".join(f"The {attr} of {country.title()} is {facts[attr]}." for attr in asked)
    return f"no facts about {topic.strip()!r}; known: {', '.join(c.title() for c in FACTS)}"


TOOLS: dict[str, Callable[[str], str]] = {"calculate": calculator, "lookup": lookup}

SYSTEM = """Answer the question with the help of tools.
calculate: computes an arithmetic expression, for example 3 * (4 + 5)
lookup: looks up a fact about a country, for example capital of Japan
finish: gives the final answer"""

# Two worked examples, as earlier turns of the conversation: a model this small follows a format
# far better when it has seen it used. Each thought names the tool it leads to. Even the order
# matters: the model leans towards the tool of the last example.
EXAMPLES = [
    ("What is the capital of Brazil?", """Thought: This is a fact about Brazil, so I use lookup.
Action: lookup
Input: capital of Brazil
Observation: The capital of Brazil is Brasilia.
Thought: The capital is Brasilia.
Action: finish
Input: Brasilia"""),
    ("Calculate 6 * 8 - 5.", """Thought: This is arithmetic, so I use calculate.
Action: calculate
Input: 6 * 8 - 5
Observation: 43
Thought: The result is 43.
Action: finish
Input: 43"""),
]

QUESTIONS = [
    "Calculate 17 * 23 + 4.",
    "What is the capital of Italy?",
]


@rx.function
def react(s, question, trace, max_steps=3):
    """`trace` (a list) receives one dict per step: what the agent did and what it observed."""
    s += rx.system(SYSTEM)
    for example_question, example_answer in EXAMPLES:
        s += rx.user("Question: " + example_question) + rx.assistant(example_answer)
    s += rx.user("Question: " + question)
    with s.assistant():
        for step in range(max_steps):
            s += "Thought:" + rx.gen(f"thought_{step}", max_tokens=24, stop="\n", temperature=0)
            # The first step must use a tool, so that the answer rests on an observation.
            actions = list(TOOLS) if step == 0 else [*TOOLS, "finish"]
            s += "\nAction: " + rx.select(f"action_{step}", actions)
            s += "\nInput:" + rx.gen(f"input_{step}", max_tokens=16, stop="\n", temperature=0)
            action, arg = s[f"action_{step}"], s[f"input_{step}"].strip()  # waits for the model
            if action == "finish":
                trace.append({"action": "finish", "input": arg})
                break
            observation = TOOLS[action](arg)  # a real Python call
            trace.append({"action": action, "input": arg, "observation": observation})
            s += "\nObservation: " + observation + "\n"


def main(backend: Any) -> dict[str, Any]:
    results = []
    for question in QUESTIONS:
        t0 = time.perf_counter()
        trace: list[dict[str, str]] = []
        state = react.run(question=question, trace=trace, backend=backend)
        elapsed = time.perf_counter() - t0
        finished = bool(trace) and trace[-1]["action"] == "finish"
        # Without a `finish`, the last observation is the best answer there is.
        answer = trace[-1]["input"] if finished else trace[-1]["observation"]
        print(f"Question: {question}")
        print("  " + state.messages()[-1]["content"].replace("\n", "\n  "))
        print(f"=> {answer}  ({len(trace)} steps, "
              f"{sum(t['action'] != 'finish' for t in trace)} tool calls, {elapsed:.1f}s)\n")
        results.append({
            "question": question,
            "answer": answer,
            "finished": finished,
            "trace": trace,
            "text": state.text(),
            "seconds": elapsed,
        })
    return {"questions": QUESTIONS, "results": results}


if __name__ == "__main__":
    with rx.Runtime(max_total_tokens=16384) as runtime:
        main(runtime)
