"""Priorities, fair share between tenants, admission control and cache namespaces, on the
scheduler driven by the simulated worker (tests/sim_worker.py): every step cross-checks the
scheduler against the worker and runs the KV integrity check; every output is the oracle's, so a
preempted request that resumes must produce exactly what it would have alone."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_worker import Arrival, Sim, check_idle, check_outputs, make_sim, run, step

from radixrt.runtime.config import QUEUE_TIMEOUT
from radixrt.runtime.errors import QueueFull
from radixrt.runtime.messages import Scheduling
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.scheduler.fair_share import FairShare
from radixrt.runtime.scheduler.policy import make_policy
from radixrt.runtime.scheduler.queue_order import admission_order
from radixrt.runtime.scheduler.request import Request

LONG = SamplingParams(max_tokens=40, ignore_eos=True)
SHORT = SamplingParams(max_tokens=4, ignore_eos=True)


def prompt(i: int, n: int = 6) -> tuple[int, ...]:
    return tuple(1 + (i * 7 + k) % 20 for k in range(n))


def first_token_step(sim: Sim, req: Request, limit: int = 400) -> int:
    """Step until `req` has its first output token; the number of steps it took."""
    start = sim.steps
    while req.num_known_outputs == 0 and not req.finished:
        assert sim.steps - start < limit, "no first token"
        step(sim)
    return sim.steps - start


def drain(sim: Sim) -> None:
    while sim.sched.has_work or sim.in_flight is not None:
        step(sim)
    step(sim)


def fill_slots(sim: Sim, count: int, priority: int, params: SamplingParams = LONG) -> list:
    reqs = [sim.sched.add_request(list(prompt(i)), params, Scheduling(priority=priority))
            for i in range(count)]
    for _ in range(3):
        step(sim)
    assert all(r.num_known_outputs > 0 for r in reqs)
    return reqs


# --- priority ----------------------------------------------------------------------------------
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_an_urgent_request_preempts_less_urgent_ones_for_a_running_slot(
    overlap: bool, preemption: str
) -> None:
    sim = make_sim(512, overlap, max_running_requests=4, preemption=preemption)
    background = fill_slots(sim, 4, priority=1)
    arrivals = [Arrival(0, prompt(i), LONG, Scheduling(priority=1)) for i in range(4)]
    urgent = sim.sched.add_request([9, 9, 9, 9], SHORT, Scheduling(priority=0))
    # overlap: one more step, to fold in the victim's token in flight before preempting it
    assert first_token_step(sim, urgent) <= 3 + overlap
    assert sim.sched.stats.priority_preemptions >= 1
    drain(sim)
    check_idle(sim)
    # the preempted requests resumed and wrote what they would have alone
    check_outputs(sim, [*arrivals, Arrival(0, (9, 9, 9, 9), SHORT)], [*background, urgent])


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_an_urgent_request_preempts_for_kv_memory(preemption: str) -> None:
    # after 20 steps, 4 background requests of 6 + 40 tokens hold 4 x 29 of a 160-token pool:
    # the urgent 60-token prompt does not fit beside them
    sim = make_sim(160, max_running_requests=16, preemption=preemption)
    background = fill_slots(sim, 4, priority=5)
    for _ in range(17):
        step(sim)
    assert sim.sched.stats.preemptions == 0
    urgent_prompt = tuple(21 + k % 3 for k in range(60))  # shares nothing with them
    urgent = sim.sched.add_request(list(urgent_prompt), SHORT, Scheduling(priority=-3))
    assert first_token_step(sim, urgent) <= 3
    caused = sim.sched.stats.priority_preemptions
    assert caused >= 1
    assert sim.sched.stats.preemptions_caused_by_priority == {"-3": caused}
    drain(sim)
    check_idle(sim)
    arrivals = [Arrival(0, prompt(i), LONG) for i in range(4)]
    check_outputs(sim, [*arrivals, Arrival(0, urgent_prompt, SHORT)], [*background, urgent])


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_an_urgent_request_under_another_adapter_preempts_for_an_adapter_slot(
    overlap: bool, preemption: str
) -> None:
    # one adapter per step: l0's two running requests hold it; the urgent l1 request needs
    # them both gone, and no base-model request admitted meanwhile may take what was freed
    sim = make_sim(512, overlap, loras=2, max_loras_per_batch=1, max_running_requests=2,
                   preemption=preemption)
    background = [sim.sched.add_request(list(prompt(i)), LONG, Scheduling(lora="l0"))
                  for i in range(2)]
    for _ in range(3):
        step(sim)
    queued = [sim.sched.add_request(list(prompt(i + 2)), SHORT, Scheduling()) for i in range(3)]
    urgent = sim.sched.add_request([9, 9, 9, 9], SHORT, Scheduling(priority=-1, lora="l1"))
    assert first_token_step(sim, urgent) <= 3 + overlap
    assert sim.sched.stats.priority_preemptions == 2
    drain(sim)
    check_idle(sim)
    arrivals = [Arrival(0, prompt(i), LONG, Scheduling(lora="l0")) for i in range(2)]
    arrivals += [Arrival(0, prompt(i + 2), SHORT) for i in range(3)]
    check_outputs(sim, [*arrivals, Arrival(0, (9, 9, 9, 9), SHORT, Scheduling(lora="l1"))],
                  [*background, *queued, urgent])


def test_urgent_requests_free_the_adapter_none_of_them_needs() -> None:
    # two adapter slots: l0 (one request) and l1 (two) run; urgent requests under l2 and l0
    # arrive. Freeing l0 for l2 would preempt its request only for l0's urgent one to need it:
    # l1's two go, and l0's request keeps running beside l0's urgent one
    sim = make_sim(512, loras=3, max_loras_per_batch=2, max_running_requests=5)
    keep = sim.sched.add_request(list(prompt(0)), LONG, Scheduling(lora="l0"))
    others = [sim.sched.add_request(list(prompt(i)), LONG, Scheduling(lora="l1"))
              for i in (1, 2)]
    for _ in range(3):
        step(sim)
    urgent = [sim.sched.add_request([9, 9, 9, k], SHORT, Scheduling(priority=-1, lora=lora))
              for k, lora in ((1, "l2"), (2, "l0"))]
    for req in urgent:
        first_token_step(sim, req)
    assert sim.sched.stats.priority_preemptions == 2
    assert keep.num_preemptions == 0 and all(r.num_preemptions == 1 for r in others)
    drain(sim)
    check_idle(sim)


def test_running_prefills_go_before_admissions_of_their_priority() -> None:
    # an urgent request that cannot start (its adapter's slot is held by a request as urgent)
    # must not let new requests of priority 0 take the budget of priority-0 prompts in progress
    sim = make_sim(512, loras=2, max_loras_per_batch=1, max_running_requests=4,
                   max_num_batched_tokens=16, priority_preemption=True)
    holder = sim.sched.add_request(list(prompt(0)), LONG, Scheduling(priority=-1, lora="l0"))
    step(sim)
    long_prompt = [1 + k % 13 for k in range(64)]
    started = sim.sched.add_request(long_prompt, SHORT, Scheduling())
    step(sim)
    assert 0 < started.kv_len < len(long_prompt)  # mid-prompt
    sim.sched.add_request([9, 9, 9, 9], SHORT, Scheduling(priority=-1, lora="l1"))
    newcomers = [sim.sched.add_request(list(prompt(i + 3, 20)), SHORT, Scheduling())
                 for i in range(2)]
    before = started.kv_len
    step(sim)
    assert started.kv_len == before + 15, "the prompt in progress lost its chunk"  # 16 - 1
    assert all(r.kv_len <= 0 for r in newcomers)  # the budget was spent
    drain(sim)
    check_idle(sim)
    assert holder.finished


def test_equal_priorities_never_preempt_each_other() -> None:
    sim = make_sim(512, max_running_requests=4)
    background = fill_slots(sim, 4, priority=1)
    same = sim.sched.add_request([9, 9, 9, 9], SHORT, Scheduling(priority=1))
    waited = first_token_step(sim, same)
    assert sim.sched.stats.preemptions == 0
    assert waited >= LONG.max_tokens - 5  # it waited for a running request to finish
    drain(sim)
    assert all(r.num_preemptions == 0 for r in background)


def test_priority_preemption_can_be_switched_off() -> None:
    sim = make_sim(512, max_running_requests=4, priority_preemption=False)
    fill_slots(sim, 4, priority=1)
    urgent = sim.sched.add_request([9, 9, 9, 9], SHORT, Scheduling(priority=0))
    assert first_token_step(sim, urgent) >= LONG.max_tokens - 5
    assert sim.sched.stats.preemptions == 0


def test_the_queue_orders_by_priority_before_the_policy() -> None:
    sim = make_sim(512, max_running_requests=1, schedule_policy="fcfs")
    fill_slots(sim, 1, priority=-10, params=SHORT)
    order = []
    reqs = {p: sim.sched.add_request(list(prompt(p + 5)), SHORT, Scheduling(priority=p))
            for p in (3, 1, 2, 0)}
    while any(not r.finished for r in reqs.values()):
        step(sim)
        for p, r in reqs.items():
            if r.num_known_outputs and p not in order:
                order.append(p)
    assert order == [0, 1, 2, 3]


def test_priority_mix_with_tenants_keeps_every_invariant_in_random_streams() -> None:
    @settings(max_examples=120, deadline=None)
    @given(
        arrivals=st.lists(
            st.tuples(st.integers(0, 30), st.integers(0, 9), st.integers(1, 30),
                      st.sampled_from([-1, 0, 0, 2]), st.sampled_from(["", "a", "b"])),
            min_size=2, max_size=14),
        preemption=st.sampled_from(["recompute", "swap"]),
        overlap=st.booleans(),
        pool=st.integers(96, 256),
    )
    def check(arrivals: list, preemption: str, overlap: bool, pool: int) -> None:
        sim = make_sim(pool, overlap, max_running_requests=3, preemption=preemption,
                       max_num_batched_tokens=24)
        plan = [Arrival(at, prompt(i, 4 + i), SamplingParams(max_tokens=n, ignore_eos=True),
                        Scheduling(priority=p, tenant=t))
                for at, i, n, p, t in arrivals]
        top = run(sim, plan)
        check_idle(sim)
        check_outputs(sim, plan, top)

    check()


# --- fair share --------------------------------------------------------------------------------
def _flood(fair_share: bool) -> tuple[int, Sim]:
    sim = make_sim(4096, max_running_requests=4, fair_share=fair_share, schedule_policy="fcfs")
    for i in range(64):
        sim.sched.add_request(list(prompt(i)), SHORT, Scheduling(tenant="A"))
    step(sim)
    b = [sim.sched.add_request(list(prompt(100 + i)), SHORT, Scheduling(tenant="B"))
         for i in range(2)]
    steps = first_token_step(sim, b[0])
    drain(sim)
    check_idle(sim)
    return steps, sim


def test_a_flooding_tenant_does_not_delay_another_tenants_first_request() -> None:
    fair_steps, _ = _flood(fair_share=True)
    unfair_steps, _ = _flood(fair_share=False)
    # A's 4 running requests finish within SHORT.max_tokens steps; then B is next in line
    assert fair_steps <= SHORT.max_tokens + 3
    assert unfair_steps >= 60  # behind A's whole queue: 64 / 4 slots x 4 tokens
    assert fair_steps * 5 < unfair_steps


# --- fair-share preemption ----------------------------------------------------------------------
def tokens_of(sim: Sim, tenant: str) -> int:
    return sum(r.num_known_outputs for r in sim.sched.requests.values() if r.tenant == tenant)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("flood_tokens", [24, 240])  # 240: most of the simulated context
def test_a_tenant_under_its_share_preempts_within_a_quantum(
    flood_tokens: int, preemption: str, overlap: bool
) -> None:
    """A fills every slot with requests just admitted; B's first token comes within quantum + 3
    steps (+1 with overlap) however long A's requests are, and every output is the oracle's."""
    quantum = 6
    sim = make_sim(8192, overlap, max_running_requests=4, preemption=preemption,
                   fair_share_quantum=quantum)
    flood = SamplingParams(max_tokens=flood_tokens, ignore_eos=True)
    arrivals = [Arrival(0, prompt(i), flood, Scheduling(tenant="A")) for i in range(6)]
    top = [sim.sched.add_request(list(a.prompt), a.params, a.scheduling) for a in arrivals]
    step(sim)
    calm = Arrival(0, prompt(50), SHORT, Scheduling(tenant="B"))
    b = sim.sched.add_request(list(calm.prompt), calm.params, calm.scheduling)
    assert first_token_step(sim, b) <= quantum + 3 + overlap
    assert sim.sched.stats.preemptions_by_cause["fair_share"] >= 1
    drain(sim)
    check_idle(sim)
    check_outputs(sim, [*arrivals, calm], [*top, b])


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_a_tenant_short_of_kv_pages_preempts_the_tenant_holding_the_pool(preemption: str) -> None:
    """Slots to spare, but A's four long requests hold most of a 512-token pool: B's 100-token
    prompt does not fit, and B takes pages from A (one request is enough: A still holds more
    than B would); every output is the oracle's."""
    sim = make_sim(512, max_running_requests=16, fair_share_quantum=4, preemption=preemption)
    long = SamplingParams(max_tokens=200, ignore_eos=True)
    arrivals = [Arrival(0, prompt(i), long, Scheduling(tenant="A")) for i in range(4)]
    top = [sim.sched.add_request(list(a.prompt), a.params, a.scheduling) for a in arrivals]
    for _ in range(100):
        step(sim)
    assert sim.sched.kv.available_pages() < 100
    calm = Arrival(0, tuple(21 + k % 3 for k in range(100)), SHORT, Scheduling(tenant="B"))
    b = sim.sched.add_request(list(calm.prompt), calm.params, calm.scheduling)
    assert first_token_step(sim, b) <= 3
    assert sim.sched.stats.preemptions_by_cause == {"memory": 0, "priority": 0, "fair_share": 1}
    drain(sim)
    check_idle(sim)
    check_outputs(sim, [*arrivals, calm], [*top, b])


def test_a_prompt_shared_by_a_tenants_requests_counts_once_toward_its_share() -> None:
    """A's three requests read one 200-token document (the radix cache holds it once): A holds
    about 210 KV tokens, not 3 x 200. B holds 100 and asks for 150 more, which the pool lacks:
    that would leave B holding more than A, so B's request waits for room instead of taking
    pages from A, and nothing is preempted."""
    sim = make_sim(400, max_running_requests=16, fair_share_quantum=2)
    gen = SamplingParams(max_tokens=40, ignore_eos=True)
    doc = tuple(1 + (k * 7) % 19 for k in range(200))
    arrivals = [Arrival(0, doc + (20 + i, 21), gen, Scheduling(tenant="A")) for i in range(3)]
    arrivals.append(Arrival(0, tuple(21 + k % 3 for k in range(100)), gen,
                            Scheduling(tenant="B")))
    top = [sim.sched.add_request(list(arrivals[0].prompt), gen, arrivals[0].scheduling)]
    first_token_step(sim, top[0])  # the document is cached before the others arrive
    for a in arrivals[1:]:
        top.append(sim.sched.add_request(list(a.prompt), a.params, a.scheduling))
        first_token_step(sim, top[-1])
    more = Arrival(0, tuple(22 + k % 2 for k in range(150)), SHORT, Scheduling(tenant="B"))
    assert sim.sched.kv.available_pages() < len(more.prompt)  # it does not fit
    arrivals.append(more)
    top.append(sim.sched.add_request(list(more.prompt), more.params, more.scheduling))
    for _ in range(4):
        step(sim)
    assert sim.sched.stats.preemptions_by_cause == {"memory": 0, "priority": 0, "fair_share": 0}
    assert sim.sched.table.running_by_tenant() == {"A": 3, "B": 1}
    assert top[-1].num_known_outputs == 0  # it waits
    drain(sim)
    check_idle(sim)
    check_outputs(sim, arrivals, top)


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_without_the_radix_cache_every_admission_still_makes_progress(preemption: str) -> None:
    """One slot, two tenants, prompts that take more than a quantum of steps to prefill and no
    radix cache (a victim computes everything again): a request is never preempted before its
    prefill is done, so the two alternate and both finish (they used to take the slot from
    each other forever)."""
    sim = make_sim(4096, max_running_requests=1, max_num_batched_tokens=16,
                   disable_radix_cache=True, preemption=preemption, swap_space_tokens=0)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    arrivals = [Arrival(0, tuple(1 + (k + 3 * t) % 20 for k in range(200)), params,
                        Scheduling(tenant=f"t{t}")) for t in range(2)]
    top = run(sim, arrivals)  # asserts that it ends
    check_idle(sim)
    check_outputs(sim, arrivals, top)
    assert sim.sched.stats.preemptions_by_cause["fair_share"] >= 1


def test_a_tenant_with_no_slot_takes_the_pages_its_request_needs() -> None:
    """2 slots and a 256-token pool: A's two long requests hold 130 tokens and a third waits;
    B's 140-token prompt needs more than is free. B holds nothing: it takes a slot and the
    pages with it, at once, instead of waiting for A's 240-token generations."""
    sim = make_sim(256, max_running_requests=2, fair_share_quantum=8)
    long = SamplingParams(max_tokens=240, ignore_eos=True)
    arrivals = [Arrival(0, prompt(i), long, Scheduling(tenant="A")) for i in range(3)]
    top = [sim.sched.add_request(list(a.prompt), a.params, a.scheduling) for a in arrivals]
    for _ in range(60):
        step(sim)
    calm = Arrival(0, tuple(21 + k % 3 for k in range(140)), SHORT, Scheduling(tenant="B"))
    b = sim.sched.add_request(list(calm.prompt), calm.params, calm.scheduling)
    assert first_token_step(sim, b) <= 3
    drain(sim)
    check_idle(sim)
    check_outputs(sim, [*arrivals, calm], [*top, b])


def test_a_tenant_over_its_share_first_in_line_does_not_block_one_with_no_slot() -> None:
    """A fills the slots and has more waiting; B's first request (a long prompt) runs and ends,
    leaving B's clock ahead of A's: A's next request is first in the fair queue. B, holding no
    slot, still takes one within a quantum: A's request, which no victim is fair for, is
    passed over for that step."""
    sim = make_sim(4096, max_running_requests=4, max_num_batched_tokens=16,
                   fair_share_quantum=2, schedule_policy="fcfs")
    gen = SamplingParams(max_tokens=60, ignore_eos=True)
    for i in range(16):
        sim.sched.add_request([1 + (i * 5 + k) % 20 for k in range(4)], gen,
                              Scheduling(tenant="A"))
    for _ in range(4):
        step(sim)
    doc = [1 + (k * 7) % 19 for k in range(200)]
    first = sim.sched.add_request(doc + [5], SHORT, Scheduling(tenant="B"))
    second = sim.sched.add_request(doc + [6], SHORT, Scheduling(tenant="B"))
    while not first.finished:
        step(sim)
    assert second.num_known_outputs > 0 or first_token_step(sim, second) <= 2 + 3
    drain(sim)
    check_idle(sim)


def test_shares_settle_without_ping_pong() -> None:
    """4 slots, A and B each with more long requests than slots: A starts with all four; fair
    share moves two to B (4:0, 3:1, 2:2) and then nothing moves, over many quanta."""
    sim = make_sim(8192, max_running_requests=4, fair_share_quantum=2)
    for i in range(6):
        sim.sched.add_request(list(prompt(i)), LONG, Scheduling(tenant="A"))
    step(sim)
    for i in range(6):
        sim.sched.add_request(list(prompt(20 + i)), LONG, Scheduling(tenant="B"))
    for _ in range(30):
        step(sim)
    assert sim.sched.stats.preemptions_by_cause == {"memory": 0, "priority": 0, "fair_share": 2}
    assert sim.sched.table.running_by_tenant() == {"A": 2, "B": 2}
    drain(sim)
    check_idle(sim)


@pytest.mark.parametrize("slots", [1, 3])
def test_more_tenants_than_slots_rotate_a_quantum_at_a_time(slots: int) -> None:
    """slots + 1 tenants with long requests: the last one to arrive, holding no slot, takes
    one within quantum + 3 steps; the slots then rotate, one move a quantum, so every tenant
    progresses alike, and every request finishes."""
    quantum = 5
    sim = make_sim(8192, max_running_requests=slots, fair_share_quantum=quantum)
    long = SamplingParams(max_tokens=120, ignore_eos=True)
    arrivals = [Arrival(0, prompt(i), long, Scheduling(tenant=f"t{i}")) for i in range(slots)]
    top = [sim.sched.add_request(list(a.prompt), a.params, a.scheduling) for a in arrivals]
    step(sim)
    last = Arrival(0, prompt(40), long, Scheduling(tenant="late"))
    late = sim.sched.add_request(list(last.prompt), last.params, last.scheduling)
    assert first_token_step(sim, late) <= quantum + 3
    while sim.steps < 100:
        step(sim)
    progress = [r.num_known_outputs for r in [*top, late]]
    assert max(progress) - min(progress) <= 2 * quantum, progress
    drain(sim)
    check_idle(sim)
    check_outputs(sim, [*arrivals, last], [*top, late])
    # rotating, not thrashing: at most one preemption per quantum
    assert sim.sched.stats.preemptions_by_cause["fair_share"] <= sim.steps // quantum + 1


def record_plans(sim: Sim) -> list:
    """Every plan the scheduler makes from now on, in order."""
    plans: list = []
    schedule = sim.sched.schedule

    def record(*args: object, **kwargs: object) -> object:
        plan = schedule(*args, **kwargs)  # type: ignore[arg-type]
        plans.append(plan)
        return plan

    sim.sched.schedule = record  # type: ignore[method-assign]
    return plans


@pytest.mark.parametrize("weights", ["a:2", "a:1,b:0.5"])
def test_weights_two_to_one_give_served_tokens_two_to_one(weights: str) -> None:
    """A long run with both tenants backlogged throughout: the tokens computed for a (prompt
    chunks and decodes) are within 10% of twice b's."""
    sim = make_sim(1 << 14, max_running_requests=6, tenant_weights=weights,
                   schedule_policy="fcfs", fair_share_quantum=4)
    plans = record_plans(sim)
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    for i in range(60):
        for tenant in "ab":
            sim.sched.add_request(list(prompt(i + (tenant == "b") * 100)), params,
                                  Scheduling(tenant=tenant))
    for _ in range(200):
        step(sim)
    assert any(r.tenant == "b" and not r.finished for r in sim.sched.requests.values())
    served = {"a": 0, "b": 0}
    for plan in filter(None, plans):
        for run_ in plan.runs:
            served[sim.sched.requests[run_.rid].tenant] += run_.num_new
    assert 1.8 <= served["a"] / served["b"] <= 2.2, served
    drain(sim)
    check_idle(sim)


def test_with_one_tenant_fair_share_preemption_changes_nothing() -> None:
    """The same stream, preemption on and off: the same plans, step by step."""
    plans = []
    for on in (True, False):
        sim = make_sim(160, max_running_requests=3, fair_share_preemption=on,
                       fair_share_quantum=1)
        arrivals = [Arrival(i % 7, prompt(i, 4 + i), SamplingParams(max_tokens=6 + 5 * i,
                                                                     ignore_eos=True),
                            Scheduling(tenant="only")) for i in range(8)]
        recorded = record_plans(sim)
        top = run(sim, arrivals)
        check_idle(sim)
        check_outputs(sim, arrivals, top)
        assert sim.sched.stats.preemptions_by_cause["fair_share"] == 0
        plans.append(recorded)
    assert plans[0] == plans[1]


def test_tenants_weights_and_long_generations_finish_and_keep_every_invariant() -> None:
    @settings(max_examples=100, deadline=None)
    @given(
        arrivals=st.lists(
            st.tuples(st.integers(0, 40), st.integers(0, 9), st.sampled_from([2, 8, 30, 90]),
                      st.sampled_from([0, 0, 1]), st.sampled_from(["", "a", "b", "c"])),
            min_size=2, max_size=16),
        weights=st.sampled_from(["", "a:2", "a:0.5,b:3", "c:4"]),
        quantum=st.sampled_from([1, 3, 8]),
        preemption=st.sampled_from(["recompute", "swap"]),
        overlap=st.booleans(),
        pool=st.integers(128, 512),  # room for the longest request alone
        slots=st.sampled_from([2, 3, 6]),
    )
    def check(arrivals: list, weights: str, quantum: int, preemption: str, overlap: bool,
              pool: int, slots: int) -> None:
        sim = make_sim(pool, overlap, max_running_requests=slots, preemption=preemption,
                       max_num_batched_tokens=32, tenant_weights=weights,
                       fair_share_quantum=quantum)
        plan = [Arrival(at, prompt(i, 4 + i), SamplingParams(max_tokens=n, ignore_eos=True),
                        Scheduling(priority=p, tenant=t))
                for at, i, n, p, t in arrivals]
        top = run(sim, plan)  # every request finishes (run asserts no hang)
        check_idle(sim)
        check_outputs(sim, plan, top)
        assert all(r.finish_reason == "length" for r in top)

    check()


def test_with_one_tenant_the_order_is_the_policys() -> None:
    @settings(max_examples=80, deadline=None)
    @given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 12)), min_size=1, max_size=20),
           st.sampled_from(["fcfs", "lpm", "dfs-weight"]))
    def check(shapes: list, policy_name: str) -> None:
        sim = make_sim(1024, schedule_policy=policy_name)
        waiting = [Request(rid=i, prompt_ids=list(prompt(base, n)), params=SHORT, max_tokens=4,
                           arrival=i, tenant="only") for i, (base, n) in enumerate(shapes)]
        policy = make_policy(policy_name)
        fair = FairShare()
        fair.backlogged("only", [])
        fair.charge("only", 1000)
        assert admission_order(waiting, sim.sched.kv, policy, fair) == \
            policy.order(waiting, sim.sched.kv)

    check()


def test_fair_share_keeps_each_tenants_policy_order_and_interleaves_them() -> None:
    @settings(max_examples=80, deadline=None)
    @given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 9)), min_size=2,
                    max_size=24),
           st.dictionaries(st.sampled_from("abc"), st.integers(0, 50)))
    def check(shapes: list, served: dict) -> None:
        fair = FairShare()
        for tenant in "abc":
            fair.backlogged(tenant, [])
            fair.charge(tenant, served.get(tenant, 0))
        ordered = [Request(rid=i, prompt_ids=[1] * n, params=SHORT, max_tokens=4, arrival=i,
                           tenant=t)
                   for i, (t, n) in enumerate(shapes)]
        out = fair.interleave(ordered)
        assert sorted(r.rid for r in out) == list(range(len(ordered)))
        for tenant in "abc":  # each tenant's own requests keep their order
            assert [r for r in out if r.tenant == tenant] == \
                [r for r in ordered if r.tenant == tenant]
        # the first request placed is from a tenant with the least virtual time
        present = {r.tenant for r in ordered}
        least = min(fair.virtual[t] for t in present)
        assert fair.virtual[out[0].tenant] == least

    check()


def test_a_tenant_that_joins_the_queue_gets_no_credit_for_its_idle_time() -> None:
    fair = FairShare()
    fair.backlogged("a", [])
    fair.charge("a", 500)
    fair.backlogged("b", ["a"])  # joins at a's clock, not at zero
    assert fair.virtual["b"] == 500
    fair.idle()  # the queue emptied: the busy period ends
    fair.charge("a", 300)  # served while nobody waits: not counted
    assert fair.virtual == {}


def test_service_while_nobody_waits_is_not_owed_back() -> None:
    """A runs alone for a long while (nothing waits); then A and B queue at once: their
    admissions interleave, A's earlier service is not held against it."""
    sim = make_sim(4096, max_running_requests=2, schedule_policy="fcfs")
    long = sim.sched.add_request(list(prompt(1)), LONG, Scheduling(tenant="A"))
    for _ in range(10):
        step(sim)
    assert sim.sched.table.fair.virtual == {}
    drain(sim)
    assert long.finish_reason == "length"
    reqs = [sim.sched.add_request(list(prompt(10 + i)), SHORT, Scheduling(tenant=t))
            for i, t in enumerate("AAAABBBB")]
    assert "".join(first_token_order(sim, reqs)) == "ABABABAB"


def first_token_order(sim: Sim, reqs: list[Request]) -> list[str]:
    """Step until every request finished; their tenants in the order of their first tokens."""
    order: list[Request] = []
    while any(not r.finished for r in reqs):
        step(sim)
        order += [r for r in reqs if r.num_known_outputs and r not in order]
    return [r.tenant for r in order]


# --- admission control -------------------------------------------------------------------------
def test_the_queue_cap_refuses_with_queue_full_and_serves_on() -> None:
    sim = make_sim(512, max_running_requests=1, max_queued_requests=3)
    reqs = [sim.sched.add_request(list(prompt(i)), SHORT) for i in range(3)]
    with pytest.raises(QueueFull, match="max-queued-requests") as info:
        sim.sched.add_request(list(prompt(9)), SHORT)
    assert info.value.retry_after_s >= 1
    step(sim)  # one admitted: room for one more
    reqs.append(sim.sched.add_request(list(prompt(9)), SHORT))
    drain(sim)
    check_idle(sim)
    assert all(r.finish_reason == "length" for r in reqs)
    assert sim.sched.stats.queue_full == 1


def test_the_per_tenant_cap_leaves_other_tenants_alone() -> None:
    sim = make_sim(512, max_running_requests=1, max_queued_per_tenant=2)
    for i in range(2):
        sim.sched.add_request(list(prompt(i)), SHORT, Scheduling(tenant="a"))
    with pytest.raises(QueueFull, match="tenant 'a'"):
        sim.sched.add_request(list(prompt(5)), SHORT, Scheduling(tenant="a"))
    sim.sched.add_request(list(prompt(6)), SHORT, Scheduling(tenant="b"))
    drain(sim)
    check_idle(sim)


def test_a_request_waiting_past_its_timeout_ends_with_a_clear_error() -> None:
    sim = make_sim(512, max_running_requests=1)
    fill_slots(sim, 1, priority=0)
    late = sim.sched.add_request(list(prompt(7)), SHORT, Scheduling(timeout_s=0.05))
    patient = sim.sched.add_request(list(prompt(8)), SHORT, Scheduling(timeout_s=600))
    step(sim)
    assert not late.finished
    time.sleep(0.06)
    step(sim)
    step(sim)
    assert late.finish_reason is not None and late.finish_reason.startswith(
        f"error: {QUEUE_TIMEOUT}")
    assert "timeout=0.05s" in late.finish_reason and late.rid in sim.reported
    drain(sim)
    assert patient.finish_reason == "length"
    check_idle(sim)


def test_scheduling_fields_are_bounded() -> None:
    with pytest.raises(ValueError, match="priority"):
        Scheduling(priority=1 << 40)
    with pytest.raises(ValueError, match="cache_salt"):
        Scheduling(extra_key="x" * 1000)
    for bad in (0, -1, float("nan"), float("inf"), 1e9):
        with pytest.raises(ValueError, match="timeout"):
            Scheduling(timeout_s=bad)


# --- cache namespaces --------------------------------------------------------------------------
def test_requests_with_different_cache_salts_never_share_a_prefix() -> None:
    sim = make_sim(1024)
    shared = list(range(1, 40))
    first = sim.sched.add_request(shared + [1], SHORT, Scheduling(extra_key="tenant-a"))
    drain(sim)
    other = sim.sched.add_request(shared + [2], SHORT, Scheduling(extra_key="tenant-b"))
    drain(sim)
    same = sim.sched.add_request(shared + [3], SHORT, Scheduling(extra_key="tenant-a"))
    drain(sim)
    assert first.cached_len == 0
    assert other.cached_len == 0
    assert same.cached_len >= len(shared) - 1
    check_idle(sim)


def test_tenants_with_nothing_left_are_forgotten() -> None:
    sim = make_sim(512)
    for i in range(50):  # one request per tenant, one at a time: nothing ever waits long
        sim.sched.add_request(list(prompt(i)), SHORT, Scheduling(tenant=f"user-{i}"))
        drain(sim)
    assert len(sim.sched.table.fair.virtual) <= 1


def test_an_urgent_request_whose_prefix_is_cached_still_preempts() -> None:
    """The urgent request's cached prefix counts as evictable (available) until it is admitted
    and locks it: the room it needs must not count it."""
    sim = make_sim(300, max_running_requests=16)
    head = [2 + k % 19 for k in range(100)]
    sim.sched.add_request(head + [1], SHORT)  # caches the 100-token prefix
    drain(sim)
    fill_slots(sim, 4, priority=5)
    for _ in range(25):
        step(sim)
    urgent = sim.sched.add_request(head + [3 + k % 5 for k in range(120)], SHORT,
                                   Scheduling(priority=0))
    assert first_token_step(sim, urgent) <= 3
    assert urgent.cached_len >= 99 and sim.sched.stats.priority_preemptions >= 1
    drain(sim)
    check_idle(sim)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_victim_is_not_readmitted_ahead_of_the_urgent_request_it_made_room_for(
    overlap: bool,
) -> None:
    """Two urgent requests share a long prefix: the second waits a step for the first to put
    it in the tree; the slot preempted for it is kept for it, not taken back by its victim."""
    sim = make_sim(4096, overlap, max_running_requests=3)
    background = fill_slots(sim, 3, priority=1, params=SamplingParams(max_tokens=60,
                                                                       ignore_eos=True))
    head = [2 + k % 17 for k in range(64)]
    for j in range(2):
        sim.sched.add_request(head + [3 + j], SHORT, Scheduling(priority=0))
    drain(sim)
    assert sim.sched.stats.priority_preemptions == 2
    assert sorted(r.num_preemptions for r in background) == [0, 1, 1]
    check_idle(sim)
