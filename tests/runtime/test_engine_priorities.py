"""Priorities and fair share in the Engine, on the real model: an urgent request preempts less
urgent running ones and gets its first token within a few steps; the preempted requests resume
and write exactly what they write alone (greedy); the KV invariants hold after every step
(make_engine's engines check them)."""

from __future__ import annotations

from typing import Any

import pytest

from radixrt import SamplingParams

PROMPTS = [f"Write a list of {k} fruits:" for k in ("three", "four", "five", "six")]
BACKGROUND = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
URGENT = SamplingParams(max_tokens=6, temperature=0)


def steps_to_first_token(engine: Any, rid: int, limit: int = 200) -> int:
    for steps in range(1, limit):
        chunks = engine.step()
        if any(c.rid == rid and c.token_ids for c in chunks):
            return steps
    raise AssertionError("no first token")


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("overlap", [False, True])
def test_an_urgent_request_preempts_and_the_preempted_resume_unchanged(
    make_engine: Any, preemption: str, overlap: bool
) -> None:
    alone = make_engine().generate(PROMPTS + ["The capital of France is"],
                                   [BACKGROUND] * len(PROMPTS) + [URGENT])
    engine = make_engine(max_running_requests=2, preemption=preemption, overlap=overlap)
    rids = [engine.submit(p, BACKGROUND, priority=1) for p in PROMPTS]
    for _ in range(4):
        engine.step()
    urgent = engine.submit("The capital of France is", URGENT, priority=0)
    assert steps_to_first_token(engine, urgent) <= 3 + overlap
    while engine.scheduler.has_work or not engine.loop.idle:
        engine.step()
    outputs = [engine.take_output(rid) for rid in [*rids, urgent]]
    assert [o.token_ids for o in outputs] == [o.token_ids for o in alone]
    stats = engine.stats()
    assert stats["priority_preemptions"] >= 1
    assert stats["preemptions_caused_by_priority"] == {"0": stats["priority_preemptions"]}
    assert (stats["swaps"] >= 1) == (preemption == "swap")


def test_equal_priorities_wait_their_turn(make_engine: Any) -> None:
    engine = make_engine(max_running_requests=2)
    for p in PROMPTS[:2]:
        engine.submit(p, BACKGROUND, priority=1)
    engine.step()
    same = engine.submit("The capital of France is", URGENT, priority=1)
    assert steps_to_first_token(engine, same) >= BACKGROUND.max_tokens - 2
    assert engine.stats()["preemptions"] == 0
    while not engine.loop.idle:
        engine.step()
    engine.take_finished()


def test_a_second_tenant_is_served_before_a_flooding_tenants_queue(make_engine: Any) -> None:
    short = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    engine = make_engine(max_running_requests=2, schedule_policy="fcfs")
    for i in range(16):
        engine.submit(f"Item {i}:", short, tenant="A")
    engine.step()
    b = engine.submit("The capital of France is", short, tenant="B")
    # A's two running requests finish within 4 steps; then B is next, not A's 14 waiting
    assert steps_to_first_token(engine, b) <= short.max_tokens + 3
    while not engine.loop.idle:
        engine.step()
    assert len(engine.take_finished()) == 17


def test_the_queue_cap_counts_requests_whose_grammar_is_compiling(make_engine: Any) -> None:
    from radixrt import QueueFull

    engine = make_engine(max_queued_requests=1)
    first = engine.submit("Pick a number:", SamplingParams(max_tokens=3, regex="[0-9]+"))
    with pytest.raises(QueueFull, match="max-queued-requests"):
        engine.submit("Pick a word:", SamplingParams(max_tokens=3, regex="[a-z]+"))
    while not engine.front.finished(first):  # idle while only its grammar compiles
        engine.step()
    assert engine.take_output(first).finish_reason in ("stop", "length")
