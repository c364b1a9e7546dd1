"""An LLM judge with fork/join: three reviewers share one article, then a verdict is selected.

`s.fork(3)` makes three states that continue from the same text. That shared prefix (the system
prompt and the article) is computed once and pinned in the runtime's radix cache while the three
children each write an opinion on one aspect, concurrently. `join()` waits for them and gives the
parent every new variable as a list (`s["opinion"]` is three strings). Finally the parent
*selects* a verdict from two choices, and `get_meta_info` shows the score of each.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python examples/llm_judge.py
"""

from __future__ import annotations

import time
from typing import Any

import radixrt as rx

ASPECTS = ["clarity", "accuracy", "style"]
VERDICTS = ["good", "bad"]

ARTICLE = (
    "The Moon is Earth's only natural satellite. It is about one quarter the size of Earth and "
    "takes about 27 days to orbit it. The Moon has no air, so its sky is always black. People "
    "first walked on the Moon in 1969."
)


@rx.function
def judge(s, article):
    s += rx.system("You are a careful reviewer. Answer in one short sentence.")
    s += rx.user("Article:\n" + article)
    forks = s.fork(len(ASPECTS))  # the text so far is computed once and shared by the children
    for f, aspect in zip(forks, ASPECTS):
        f += rx.user(f"Rate the {aspect} of the article in one sentence.")
        f += rx.assistant(rx.gen("opinion", max_tokens=32, stop="\n", temperature=0))
    forks.join()  # now s["opinion"] == [clarity, accuracy, style]
    s += rx.user("Is the article good or bad overall? Answer with one word.")
    s += rx.assistant(rx.select("verdict", VERDICTS))


def main(backend: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    state = judge.run(article=ARTICLE, backend=backend)
    elapsed = time.perf_counter() - t0

    print("Article:", ARTICLE, "\n")
    for aspect, child in zip(ASPECTS, state.forks):
        print(f"  {aspect:>8}: {child['opinion'].strip()}")
    scores = state.get_meta_info("verdict")["scores"]
    print(f"verdict: {state['verdict']}  (scores "
          + ", ".join(f"{v}={x:.2f}" for v, x in zip(VERDICTS, scores)) + ")")
    print(f"took {elapsed:.1f}s; the parent's transcript has {len(state.messages())} messages")
    return {
        "aspects": ASPECTS,
        "opinions": list(state["opinion"]),
        "verdict": state["verdict"],
        "verdict_scores": dict(zip(VERDICTS, scores)),
        "messages": state.messages(),
        "text": state.text(),
        "seconds": elapsed,
    }


if __name__ == "__main__":
    with rx.Runtime(max_total_tokens=16384) as runtime:
        main(runtime)
