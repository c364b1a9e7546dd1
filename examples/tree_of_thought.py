"""Tree of thought: fork at two levels, score every leaf with `select`, follow the best branch.

The program forks the question into 2 ideas; each idea forks again into 2 first steps, giving 4
leaves. Every level's shared text is computed once and pinned in the runtime's radix cache while
its children run concurrently. Each leaf then asks the model whether its plan will work and
*selects* yes or no; the leaf's score is how much more likely "yes" was than "no"
(`get_meta_info(...)["scores"]`). Joining the inner groups, then the outer one, gives the parent
nested lists (`s["step"] == [[step, step], [step, step]]`), and the parent writes a final answer
from the best branch.

Sampling with temperature > 0 and a seed per branch makes the branches differ, yet reproducibly.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python examples/tree_of_thought.py
"""

from __future__ import annotations

import time
from typing import Any

import radixrt as rx

QUESTION = "How can I keep my houseplants alive while I am away for two weeks?"
BRANCHES = 2  # ideas, and first steps per idea


def _gen(name: str, seed: int) -> Any:
    return rx.gen(name, max_tokens=20, stop="\n", temperature=0.7, top_p=0.9, seed=seed)


@rx.function
def tree_of_thought(s, question):
    s += rx.system("You are a practical assistant. Answer in one short sentence.")
    s += rx.user(question)
    ideas = s.fork(BRANCHES)  # level 1
    for i, idea in enumerate(ideas):  # queue work on every child before waiting on any
        idea += rx.user("Suggest one idea.") + rx.assistant(_gen("idea", seed=i))
    groups = []
    for i, idea in enumerate(ideas):
        steps = idea.fork(BRANCHES)  # level 2 (waits for this idea's text)
        for j, leaf in enumerate(steps):
            leaf += rx.user("What is the first step to do it?")
            leaf += rx.assistant(_gen("step", seed=10 * i + j))
            leaf += rx.user("Will this plan work? Answer yes or no.")
            leaf += rx.assistant(rx.select("works", ["yes", "no"]))
        groups.append(steps)
    for steps in groups:  # inner joins first: each idea gets its leaves' variables as lists
        steps.join()
    ideas.join()  # then s["idea"] == [idea0, idea1], s["step"] == [[..], [..]], ...

    _, (bi, bj) = best_leaf(groups)
    s += rx.user(f"Idea: {s['idea'][bi].strip()} First step: {s['step'][bi][bj].strip()}\n"
                 "Summarize this plan in one sentence.")
    s += rx.assistant(rx.gen("answer", max_tokens=32, stop="\n", temperature=0))


def best_leaf(groups: Any) -> tuple[list[list[float]], tuple[int, int]]:
    """Each leaf's score (the log-probability margin of "yes" over "no") and the best leaf."""
    scores = []
    for steps in groups:
        row = []
        for leaf in steps:
            yes, no = leaf.get_meta_info("works")["scores"]
            row.append(yes - no)
        scores.append(row)
    cells = [(i, j) for i, row in enumerate(scores) for j in range(len(row))]
    return scores, max(cells, key=lambda ij: scores[ij[0]][ij[1]])


def main(backend: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    state = tree_of_thought.run(question=QUESTION, backend=backend)
    elapsed = time.perf_counter() - t0

    ideas, steps = state["idea"], state["step"]
    scores, best = best_leaf([idea.forks for idea in state.forks])  # the states of the leaves
    print(f"Question: {QUESTION}")
    for i, idea in enumerate(ideas):
        print(f"  idea {i}: {idea.strip()}")
        for j, step in enumerate(steps[i]):
            mark = "*" if (i, j) == best else " "
            print(f"   {mark} step {i}.{j}: {step.strip()}  "
                  f"(works: {state['works'][i][j]}, yes-no margin {scores[i][j]:+.2f})")
    print(f"Answer: {state['answer'].strip()}\ntook {elapsed:.1f}s")
    return {
        "ideas": ideas,
        "steps": steps,
        "works": state["works"],
        "scores": scores,
        "best": best,
        "answer": state["answer"],
        "seconds": elapsed,
    }


if __name__ == "__main__":
    with rx.Runtime(max_total_tokens=16384) as runtime:
        main(runtime)
