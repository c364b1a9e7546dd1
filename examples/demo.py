"""`make demo`: a tour of the radixrt DSL on the embedded default model (SmolLM2-135M-Instruct).

Starts one local runtime (`rx.Runtime()`, which runs `radixrt serve` in a child process) and runs
the seven examples of this folder on it, one after the other:

  few_shot_qa      few-shot multiple choice with `select`, as one batch over a shared prefix
  tree_of_thought  fork at two levels, score the leaves with `select`, follow the best one
  react_agent      Thought / Action / Observation with real Python tools
  tool_agent       tool calls the grammar makes well-formed, run in Python, results fed back
  json_extraction  a JSON record built field by field with `gen` and `select`
  multi_turn_chat  a streamed conversation with system / user / assistant roles
  llm_judge        three reviewers forked from one article, joined, then a verdict

After each one it prints what the runtime's radix cache saved (its server_info counters: prompt
tokens that were found in the cache instead of being computed), then a summary. A model this
small makes mistakes; the point is how the programs are written and what the runtime reuses.

Run:  make demo   (or HF_HUB_OFFLINE=1 .venv/bin/python examples/demo.py); CPU is fine.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import radixrt as rx

HERE = Path(__file__).resolve().parent
EXAMPLES = [
    ("few_shot_qa", "few-shot multiple choice: select over a shared few-shot prefix"),
    ("tree_of_thought", "tree of thought: fork 2 x 2, score leaves, pick a branch"),
    ("react_agent", "ReAct agent: Thought / Action / Observation with Python tools"),
    ("tool_agent", "tool calls: gen(tools=...) over Python functions, results fed back"),
    ("json_extraction", "JSON extraction: by a JSON schema (constrained), then field by field"),
    ("multi_turn_chat", "multi-turn chat with roles, streamed"),
    ("llm_judge", "LLM judge: fork 3 reviewers, join, select a verdict"),
]


def load_example(name: str) -> ModuleType:
    """Import examples/<name>.py (this folder is not a package)."""
    spec = importlib.util.spec_from_file_location(f"radixrt_example_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def headline(name: str, result: dict[str, Any]) -> str:
    """One line of the summary: the example's key result."""
    if name == "few_shot_qa":
        return f"accuracy {result['accuracy']:.0%} on {len(result['answers'])} questions"
    if name == "tree_of_thought":
        i, j = result["best"]
        return f"best leaf {i}.{j} of {len(result['ideas'])}x{len(result['steps'][0])}"
    if name == "react_agent":
        return "; ".join(f"{r['question']!r} -> {r['answer']!r}" for r in result["results"])
    if name == "tool_agent":
        return "; ".join(f"{r['calls'][0][0]}({r['calls'][0][1]})" for r in result["rows"])
    if name == "json_extraction":
        first = result["records"][0]
        return f"{len(result['records'])} records, e.g. {first['name']!r}, age {first['age']!r}"
    if name == "multi_turn_chat":
        return f"{len(result['messages'])} messages, last: {result['answers'][-1].strip()!r}"
    if name == "llm_judge":
        return f"verdict {result['verdict']!r} after {len(result['opinions'])} opinions"
    return ""


def main() -> None:
    t_start = time.perf_counter()
    print("starting the runtime (radixrt serve in a child process) ...", flush=True)
    with rx.Runtime(max_total_tokens=16384) as rt:
        print(f"ready in {time.perf_counter() - t_start:.1f}s: model {rt.model}, "
              f"{rt.info()['kv_total']} KV tokens on {rt.info()['device']}\n", flush=True)
        rows = []
        for name, title in EXAMPLES:
            print(f"=== {name}: {title} ===", flush=True)
            module = load_example(name)
            before = rt.info()
            t0 = time.perf_counter()
            result = module.main(rt)
            elapsed = time.perf_counter() - t0
            after = rt.info()
            prompt = after["prompt_tokens"] - before["prompt_tokens"]
            cached = after["cached_tokens"] - before["cached_tokens"]
            rate = cached / prompt if prompt else 0.0
            print(f"--- {elapsed:.1f}s; this example: {cached}/{prompt} prompt tokens from the "
                  f"cache ({rate:.0%}); runtime so far: {after['cache_hit_rate']:.0%} hit rate, "
                  f"{after['generated_tokens']} tokens generated\n", flush=True)
            rows.append((name, elapsed, rate, headline(name, result)))

        info = rt.info()
    total = time.perf_counter() - t_start
    print("=== summary ===")
    for name, elapsed, rate, line in rows:
        print(f"{name:<16} {elapsed:6.1f}s  cache hit {rate:4.0%}  {line}")
    print(f"\nruntime: {info['cached_tokens']} of {info['prompt_tokens']} prompt tokens reused "
          f"(hit rate {info['cache_hit_rate']:.0%}), {info['computed_tokens']} computed, "
          f"{info['generated_tokens']} generated in {info['steps']} steps; "
          f"total {total:.0f}s including startup")


if __name__ == "__main__":
    main()
