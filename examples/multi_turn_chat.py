"""A multi-turn chat with roles, streamed as it is written.

The program appends system / user / assistant messages; the runtime's chat template supplies the
markers around them, and `state.messages()` gives the conversation back as a list of dicts. Every
turn resends the whole conversation, yet only the new tokens are computed: the earlier turns are
found in the radix cache (see each answer's cached_tokens). Run with `stream=True`, the program
goes on in the background while `state.text_iter(name)` yields each answer as it is generated.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python examples/multi_turn_chat.py
"""

from __future__ import annotations

import time
from typing import Any

import radixrt as rx

SYSTEM = "You are a friendly assistant. Answer every question in one short sentence."
QUESTIONS = [
    "What is the capital of France?",
    "What is a famous tower in that city?",
    "How tall is it, roughly?",
]


@rx.function
def multi_turn(s, questions):
    s += rx.system(SYSTEM)
    for i, question in enumerate(questions):
        s += rx.user(question)
        s += rx.assistant(rx.gen(f"answer_{i}", max_tokens=40, stop="\n", temperature=0))


def main(backend: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    state = multi_turn.run(questions=QUESTIONS, backend=backend, stream=True)
    streamed = []
    for i, question in enumerate(QUESTIONS):
        print(f"User: {question}\nAssistant: ", end="", flush=True)
        pieces = []
        for piece in state.text_iter(f"answer_{i}"):  # pieces as the model writes them
            print(piece, end="", flush=True)
            pieces.append(piece)
        streamed.append("".join(pieces))
        print()
    elapsed = time.perf_counter() - t0

    messages = state.messages()
    print("\nstate.messages():")
    for m in messages:
        print(f"  {m['role']:>9}: {m['content']!r}")
    turns = [state.get_meta_info(f"answer_{i}") for i in range(len(QUESTIONS))]
    print("cached / prompt tokens per turn: "
          + ", ".join(f"{t['cached_tokens']}/{t['prompt_tokens']}" for t in turns)
          + f"; took {elapsed:.1f}s")
    return {
        "answers": [state[f"answer_{i}"] for i in range(len(QUESTIONS))],
        "streamed": streamed,
        "messages": messages,
        "cached_tokens": [t["cached_tokens"] for t in turns],
        "prompt_tokens": [t["prompt_tokens"] for t in turns],
        "seconds": elapsed,
    }


if __name__ == "__main__":
    with rx.Runtime(max_total_tokens=16384) as runtime:
        main(runtime)
