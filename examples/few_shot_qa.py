"""Few-shot multiple-choice question answering with `select`, run as one batch.

Every program starts with the same few-shot prompt (a constant prefix): `run_batch` finds it by
tracing the program, computes it once and keeps it pinned in the runtime's radix cache, so each
question only costs its own few tokens. The answer is not generated but *selected*: the runtime
scores every option as the continuation of the prompt (one batched call) and the best one wins.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python examples/few_shot_qa.py
"""

from __future__ import annotations

import time
from typing import Any

import radixrt as rx

# The constant prefix shared by every question.
FEW_SHOT = """Answer each question with a short answer.

Question: What colour is the sky on a clear day?
Answer: blue

Question: How many legs does a dog have?
Answer: four

Question: Which animal says "moo"?
Answer: cow

Question: What do you use to write on paper?
Answer: pen

Question: Which season is the coldest?
Answer: winter

"""

# (question, options, correct answer)
QUESTIONS: list[tuple[str, list[str], str]] = [
    ("What is the capital of France?", ["London", "Paris", "Berlin", "Madrid"], "Paris"),
    ("Which animal can fly?", ["fish", "horse", "bird", "snake"], "bird"),
    ("What do bees make?", ["milk", "honey", "silk", "wool"], "honey"),
    ("What is frozen water called?", ["steam", "ice", "sand", "glass"], "ice"),
    ("Which planet do we live on?", ["Mars", "Venus", "Earth", "Jupiter"], "Earth"),
    ("What colour is a ripe banana?", ["purple", "yellow", "blue", "black"], "yellow"),
]


@rx.function
def few_shot_qa(s, question, options):
    s += FEW_SHOT  # constant: computed once for the whole batch
    s += "Question: " + question + "\nAnswer:"
    # The options are scored as the answer rather than listed in the prompt: a model this small
    # tends to copy the last option it was shown. The leading space matches the examples.
    s += rx.select("answer", [" " + o for o in options])


def main(backend: Any) -> dict[str, Any]:
    before = backend.info()
    t0 = time.perf_counter()
    states = few_shot_qa.run_batch(
        [{"question": q, "options": opts} for q, opts, _ in QUESTIONS],
        backend=backend,
        progress_bar=True,
    )
    elapsed = time.perf_counter() - t0
    after = backend.info()

    answers = [st["answer"].strip() for st in states]
    correct = [a == gold for a, (_, _, gold) in zip(answers, QUESTIONS)]
    for (q, _, gold), a, ok, st in zip(QUESTIONS, answers, correct, states):
        scores = st.get_meta_info("answer")["scores"]
        print(f"{'ok ' if ok else 'BAD'} {q:<34} -> {a:<8} (gold {gold}; "
              f"scores {', '.join(f'{x:.2f}' for x in scores)})")
    # This example's own share of the runtime's counters (the runtime may have served others).
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    cached = after["cached_tokens"] - before["cached_tokens"]
    hit_rate = cached / prompt if prompt else 0.0
    accuracy = sum(correct) / len(correct)
    print(f"accuracy {accuracy:.0%} on {len(QUESTIONS)} questions in {elapsed:.1f}s; "
          f"{cached} of {prompt} prompt tokens came from the radix cache (hit rate {hit_rate:.0%})")
    return {
        "questions": [q for q, _, _ in QUESTIONS],
        "choices": [opts for _, opts, _ in QUESTIONS],
        "answers": answers,
        "gold": [gold for _, _, gold in QUESTIONS],
        "accuracy": accuracy,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cache_hit_rate": hit_rate,
        "seconds": elapsed,
    }


if __name__ == "__main__":
    with rx.Runtime(max_total_tokens=16384) as runtime:
        main(runtime)
