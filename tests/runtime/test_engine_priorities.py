"""Priorities and fair share in the Engine, on the real model: an urgent request preempts less
urgent running ones and gets its first token within a few steps; a tenant under its share
preempts a tenant over it, within a bounded number of steps however long the other tenant's
requests are; the preempted requests resume and write exactly what they write alone (greedy);
the KV invariants hold after every step (make_engine's engines check them)."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from radixrt import SamplingParams

PROMPTS = [f"Write a list of {k} fruits:" for k in ("three", "four", "five", "six")]
BACKGROUND = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
URGENT = SamplingParams(max_tokens=6, temperature=0)


@pytest.fixture
def make_engine(make_engine: Any) -> Any:
    """Speculative decoding off: these bounds count steps, and preemptions that follow from each
    request writing a token a step (speculation with preemption: test_engine_speculative.py)."""
    return functools.partial(make_engine, speculative_algorithm=None)


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


def drain(engine: Any) -> None:
    while engine.scheduler.has_work or not engine.loop.idle:
        engine.step()


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("flood_tokens", [24, 512])
def test_a_tenant_under_its_share_gets_a_slot_within_a_quantum(
    make_engine: Any, flood_tokens: int, overlap: bool
) -> None:
    """Tenant A's requests fill every slot (just admitted: they have written less than their
    quantum);
    tenant B's first token comes within quantum + 3 steps (+1 with overlap: the victim's token
    in flight is folded in first), whether A's requests ask for 24 or 512 tokens."""
    quantum = 4
    engine = make_engine(max_running_requests=4, fair_share_quantum=quantum, overlap=overlap)
    flood = SamplingParams(max_tokens=flood_tokens, temperature=0, ignore_eos=True)
    a_rids = [engine.submit(f"Item {i}:", flood, tenant="A") for i in range(8)]
    engine.step()
    b = engine.submit("The capital of France is", URGENT, tenant="B")
    assert steps_to_first_token(engine, b) <= quantum + 3 + overlap
    stats = engine.stats()
    assert stats["preemptions_by_cause"]["fair_share"] >= 1
    assert stats["running_by_tenant"]["B"] == 1
    assert stats["preemptions_by_cause"]["priority"] == stats["priority_preemptions"] == 0
    for rid in a_rids:
        engine.abort(rid)
    drain(engine)
    engine.take_finished()


def test_without_fair_share_preemption_the_tenant_waits_for_a_slot(make_engine: Any) -> None:
    engine = make_engine(max_running_requests=4, fair_share_preemption=False)
    flood = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    for i in range(8):
        engine.submit(f"Item {i}:", flood, tenant="A")
    engine.step()
    b = engine.submit("The capital of France is", URGENT, tenant="B")
    assert steps_to_first_token(engine, b) >= flood.max_tokens - 2
    assert engine.stats()["preemptions"] == 0
    drain(engine)
    engine.take_finished()


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("overlap", [False, True])
def test_requests_preempted_for_fair_share_resume_unchanged(
    make_engine: Any, preemption: str, overlap: bool
) -> None:
    flood = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    calm = ["The capital of France is", "One, two, three,"]
    alone = make_engine().generate(PROMPTS + calm, [flood] * len(PROMPTS) + [URGENT] * 2)
    engine = make_engine(max_running_requests=4, preemption=preemption, overlap=overlap,
                         fair_share_quantum=2)
    rids = [engine.submit(p, flood, tenant="flood") for p in PROMPTS]
    for _ in range(4):
        engine.step()
    rids += [engine.submit(p, URGENT, tenant="calm") for p in calm]
    drain(engine)
    outputs = [engine.take_output(rid) for rid in rids]
    assert [o.token_ids for o in outputs] == [o.token_ids for o in alone]
    stats = engine.stats()
    assert stats["preemptions_by_cause"]["fair_share"] == stats["preemptions"] >= 2
    assert (stats["swaps"] >= 1) == (preemption == "swap")
