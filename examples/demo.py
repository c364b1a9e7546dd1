"""`make demo`: the engine on the embedded default model (SmolLM2-135M-Instruct, CPU is fine).

Runs a few chat questions that share a system prompt as one batch, then a second round that reuses
the cached prefix, streams one answer, and prints what the radix cache saved.
"""

from __future__ import annotations

import asyncio
import time

import radixrt
from radixrt import SamplingParams

SYSTEM = (
    "You are a concise assistant. Answer every question in one short sentence. "
    "Be accurate, and do not add any preamble or explanation."
)
QUESTIONS = [
    "What is the capital of France?",
    "What do bees make?",
    "How many legs does a spider have?",
    "What colour is a ripe banana?",
]


def chat(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def main() -> None:
    t0 = time.perf_counter()
    engine = radixrt.Engine()  # the default model; every option is an EngineConfig field
    print(f"loaded the default model in {time.perf_counter() - t0:.1f}s "
          f"(KV pool: {engine.stats()['kv_total']} tokens)\n")
    params = SamplingParams(max_tokens=32, temperature=0)

    t0 = time.perf_counter()
    outs = engine.generate([chat(q) for q in QUESTIONS], params)
    elapsed = time.perf_counter() - t0
    for q, out in zip(QUESTIONS, outs):
        print(f"Q: {q}\nA: {out.text.strip()}  [{out.finish_reason}, "
              f"{out.prompt_tokens} prompt tokens, {out.cached_tokens} cached]\n")
    tokens = sum(o.completion_tokens for o in outs)
    print(f"batch of {len(outs)}: {tokens} tokens in {elapsed:.2f}s ({tokens / elapsed:.1f} tok/s)")

    print("\nStreaming a follow-up turn (its whole history is already cached):")
    history = chat(QUESTIONS[0]) + [
        {"role": "assistant", "content": outs[0].text.strip()},
        {"role": "user", "content": "And what river runs through it?"},
    ]

    async def stream() -> None:
        async for chunk in engine.generate_stream(history, params):
            print(chunk.text, end="", flush=True)
        print()

    asyncio.run(stream())

    samples = engine.generate(
        chat("Invent a name for a cat."),
        SamplingParams(max_tokens=12, temperature=0.8, n=3, seed=1),
    )[0]
    print("\nn=3 samples sharing one prompt prefill:",
          [s.text.strip() for s in samples.samples])

    engine.check_integrity()
    st = engine.stats()
    print(f"\nradix cache: {st['cached_tokens']} of {st['prompt_tokens']} prompt tokens reused "
          f"(hit rate {st['cache_hit_rate']:.0%}); {st['steps']} forward steps; "
          f"KV pool free {st['kv_free']} / cached {st['kv_evictable']} / total {st['kv_total']}")


if __name__ == "__main__":
    main()
