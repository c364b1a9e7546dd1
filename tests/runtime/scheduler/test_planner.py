"""What the scheduler decides, pinned with small exact scenarios (no model, no tensors).

tests/runtime/scheduler/test_scheduler_sim.py checks that whatever the scheduler decides is carried
out correctly (every KV slot right, outputs equal an oracle, nothing leaks). These tests check the
decisions themselves: which request is admitted first under each policy, how many tokens a step
computes, which request is preempted, when a request waits, what the radix cache serves and keeps.
Each test names the rule it pins; most drive the simulated worker of tests/sim_worker.py and look at
the plans it was handed, a few ask the scheduler for a plan and inspect it before it runs.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sim_worker import (
    CONTEXT,
    EOS,
    JUMP,
    Arrival,
    Sim,
    check_idle,
    check_outputs,
    make_sim,
    oracle,
    run,
    step,
)

from radixrt.runtime.config import PLACEHOLDER_TOKEN, EngineConfig
from radixrt.runtime.messages import (
    Run,
    RunResult,
    Scheduling,
    StepPlan,
    StepResult,
    TokenLogprob,
)
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.scheduler.in_flight import InFlightLedger
from radixrt.runtime.scheduler.planner import IN_BATCH_PREFIX_MIN
from radixrt.runtime.scheduler.request import Request
from radixrt.runtime.scheduler.scheduler import Scheduler

ONCE = SamplingParams(max_tokens=1, ignore_eos=True)


def long(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def tokens(start: int, n: int) -> list[int]:
    """n prompt tokens of series `start`: 1..7 cycling from start + 1 for start < 7, else start + 1
    repeated. Series with different starts differ from their first token on."""
    return [1 + (start + i) % 7 for i in range(n)] if start < 7 else [start + 1] * n


# --- watching the plans --------------------------------------------------------------------------
@dataclass
class Planned:
    """A plan the worker was handed, with what the scheduler's queues held once it was made."""

    plan: StepPlan
    waiting: list[int]
    swapped: list[int]
    running: list[int]

    @property
    def runs(self) -> list[tuple[int, int]]:
        return [(r.rid, r.num_new) for r in self.plan.runs]

    @property
    def num_tokens(self) -> int:
        return sum(r.num_new for r in self.plan.runs)

    @property
    def admitted(self) -> list[int]:
        return [w.rid for w in self.plan.new_requests]

    @property
    def preempted(self) -> list[int]:
        """Requests this plan took off the KV pool to make room (recompute or swap)."""
        gone = list(self.plan.free) + [s.rid for s in self.plan.swap_out]
        return [rid for rid in gone if rid in self.waiting or rid in self.swapped]


def watch(sim: Sim) -> list[Planned]:
    """Record every plan the simulated worker executes from now on."""
    planned: list[Planned] = []
    execute = sim.worker.execute
    sched = sim.sched

    def recording(plan: StepPlan) -> StepResult:
        queues = ([r.rid for r in q] for q in (sched.waiting, sched.swapped, sched.running))
        planned.append(Planned(plan, *queues))
        return execute(plan)

    sim.worker.execute = recording  # type: ignore[method-assign]
    return planned


def finish_all(sim: Sim) -> None:
    run(sim, [])
    check_idle(sim)


def warm(sim: Sim, *prompts: list[int]) -> None:
    """Run one-token requests to the end so that their prompts sit in the radix cache."""
    for prompt in prompts:
        sim.sched.add_request(prompt, ONCE)
    finish_all(sim)


def check_oracle(*requests: Request) -> None:
    for req in requests:
        assert (req.output_ids, req.finish_reason) == oracle(req.prompt_ids, req.params, 0)


# --- admission order under each policy -----------------------------------------------------------
@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_lpm_admits_the_longest_cached_prefix_first(policy: str) -> None:
    """A cold request arrives before one whose whole prompt but its last token is cached. With a
    16-token budget, lpm runs the cached one first (1 token) and the cold one in what is left;
    fcfs runs the cold one alone."""
    sim = make_sim(256, schedule_policy=policy, max_num_batched_tokens=16)
    hot = tokens(0, 24)
    warm(sim, hot)
    cold = sim.sched.add_request(tokens(7, 20), ONCE)
    cached = sim.sched.add_request(hot + [5], ONCE)
    planned = watch(sim)
    step(sim)
    if policy == "lpm":
        assert planned[0].runs == [(cached.rid, 1), (cold.rid, 15)]
    else:
        assert planned[0].runs == [(cold.rid, 16)]
    finish_all(sim)
    assert sim.sched.stats.cached_tokens == 24
    check_oracle(cold, cached)


def test_lpm_orders_by_match_length_then_arrival() -> None:
    """Three cached prefixes of different lengths, requests arriving shortest match first: lpm
    admits them longest match first, equal matches in arrival order."""
    sim = make_sim(256, schedule_policy="lpm")
    base = tokens(0, 30)
    warm(sim, base)
    short = sim.sched.add_request(base[:8] + [8, 8, 8], ONCE)
    none = sim.sched.add_request(tokens(9, 5), ONCE)
    longest = sim.sched.add_request(base + [9], ONCE)
    middle = sim.sched.add_request(base[:20] + [8], ONCE)
    middle2 = sim.sched.add_request(base[:20] + [9], ONCE)
    plan = sim.sched.schedule(sim.loop.in_flight)
    assert plan is not None
    admitted = [w.rid for w in plan.new_requests]
    assert admitted == [longest.rid, middle.rid, middle2.rid, short.rid, none.rid]
    assert [len(w.prefix_slots) for w in plan.new_requests] == [30, 20, 20, 8, 0]


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "dfs-weight"])
def test_dfs_weight_runs_the_heaviest_subtree_first(policy: str) -> None:
    """Two prefixes are cached: a long one that one waiting request extends (it arrived first)
    and a short one that two later requests extend. dfs-weight walks the subtree with the most
    waiting requests first; lpm takes the longest match; fcfs the arrival order. The 16-token
    budget makes the order visible: the last one admitted gets what is left."""
    sim = make_sim(256, schedule_policy=policy, max_num_batched_tokens=16)
    deep, wide = tokens(0, 24), tokens(8, 12)
    warm(sim, deep, wide)
    x = sim.sched.add_request(deep + tokens(3, 10), ONCE)  # 10 tokens to compute
    y1 = sim.sched.add_request(wide + tokens(1, 5), ONCE)  # 5 each
    y2 = sim.sched.add_request(wide + tokens(2, 5), ONCE)
    plan = sim.sched.schedule(sim.loop.in_flight)
    assert plan is not None
    runs = [(r.rid, r.num_new) for r in plan.runs]
    expected = {
        "dfs-weight": [(y1.rid, 5), (y2.rid, 5), (x.rid, 6)],
        "lpm": [(x.rid, 10), (y1.rid, 5), (y2.rid, 1)],
        "fcfs": [(x.rid, 10), (y1.rid, 5), (y2.rid, 1)],
    }[policy]
    assert runs == expected


def test_dfs_weight_keeps_a_subtree_together() -> None:
    """Requests of two prompt families arrive interleaved; dfs-weight admits them family by
    family, the larger family first, each family in arrival order."""
    sim = make_sim(512, schedule_policy="dfs-weight")
    a, b = tokens(0, 16), tokens(10, 16)
    warm(sim, a, b)
    family = {}
    for i, (base, name) in enumerate([(a, "a"), (b, "b"), (a, "a"), (b, "b"), (b, "b")]):
        family[sim.sched.add_request(base + [1 + i, 2], ONCE).rid] = name
    plan = sim.sched.schedule(sim.loop.in_flight)
    assert plan is not None
    order = [w.rid for w in plan.new_requests]
    assert [family[rid] for rid in order] == ["b", "b", "b", "a", "a"]
    assert order == sorted(order[:3]) + sorted(order[3:])


@pytest.mark.parametrize("extra_key", [None, "user"])
def test_dfs_weight_serves_uncached_requests_in_arrival_order(extra_key: str | None) -> None:
    """Nothing cached in the requests' namespace: dfs-weight has no subtree to prefer and must
    keep arrival order (as it does once the namespace has a root). The tree hands back a fresh
    detached root per request; each used to become a subtree of weight 1, popped newest first,
    so the last request to arrive started first."""
    sim = make_sim(256, schedule_policy="dfs-weight", max_num_batched_tokens=16)
    reqs = [sim.sched.add_request(tokens(7 + i, 10), ONCE,
                                  Scheduling(extra_key=extra_key))
            for i in range(3)]
    plan = sim.sched.schedule(sim.loop.in_flight)
    assert plan is not None
    assert [(r.rid, r.num_new) for r in plan.runs] == [(reqs[0].rid, 10), (reqs[1].rid, 6)]


# --- preemption victim ---------------------------------------------------------------------------
def three_decoders(preemption: str) -> tuple[Sim, list[Planned], list[Request]]:
    """Three requests with 4-token prompts decode 16 tokens each in a 32-slot pool: 60 slots at
    the end. The pool runs dry at step 8."""
    sim = make_sim(32, page_size=1, preemption=preemption)
    planned = watch(sim)
    reqs = [sim.sched.add_request(tokens(7 + i, 4), long(16)) for i in range(3)]
    finish_all(sim)
    return sim, planned, reqs


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_preemption_takes_the_most_recently_admitted(preemption: str) -> None:
    """Step 8: the last admitted cannot get a slot and, with no one after it to preempt, waits.
    Step 9: the first one needs a slot and preempts the most recently admitted (not the oldest,
    which has made the most progress). Step 14: it takes the second one. The oldest is never
    preempted and finishes first."""
    sim, planned, (a, b, c) = three_decoders(preemption)
    assert planned[7].runs == [(a.rid, 1), (b.rid, 1)]  # c waits for memory
    victims = [(p.plan.step_id, p.preempted) for p in planned if p.preempted]
    assert victims == [(9, [c.rid]), (14, [b.rid])]
    assert sim.sched.stats.preemptions == 2
    assert (a.num_preemptions, b.num_preemptions, c.num_preemptions) == (0, 1, 1)
    check_oracle(a, b, c)


# --- the per-step token budget -------------------------------------------------------------------
def test_decodes_are_planned_before_prefill_chunks() -> None:
    """A long prompt arrives while two requests decode, budget 16: every step's decodes get
    their token first and the prefill chunk takes only what is left, so no step computes more
    than the budget."""
    sim = make_sim(512, page_size=1, max_num_batched_tokens=16)
    d1 = sim.sched.add_request(tokens(0, 4), long(8))
    d2 = sim.sched.add_request(tokens(1, 4), long(8))
    step(sim)  # both prompts: 8 tokens
    planned = watch(sim)
    big = sim.sched.add_request(tokens(9, 40), ONCE)
    for _ in range(3):
        step(sim)
    assert [p.runs for p in planned] == [
        [(d1.rid, 1), (d2.rid, 1), (big.rid, 14)],
        [(d1.rid, 1), (d2.rid, 1), (big.rid, 14)],
        [(d1.rid, 1), (d2.rid, 1), (big.rid, 12)],
    ]
    finish_all(sim)
    assert all(p.num_tokens <= 16 for p in planned)
    check_oracle(d1, d2, big)


@pytest.mark.parametrize("budget", [16, 24])
def test_prefill_chunks_share_the_step_budget(budget: int) -> None:
    """Two 40-token prompts (fcfs): the first is chunked to the budget, the second starts only in
    what its last chunk leaves. Every step computes at most the budget."""
    sim = make_sim(512, page_size=1, schedule_policy="fcfs", max_num_batched_tokens=budget)
    planned = watch(sim)
    a = sim.sched.add_request(tokens(0, 40), ONCE)
    b = sim.sched.add_request(tokens(9, 40), ONCE)
    finish_all(sim)
    runs = [p.runs for p in planned if p.runs]
    if budget == 16:
        assert runs == [[(a.rid, 16)], [(a.rid, 16)], [(a.rid, 8), (b.rid, 8)],
                        [(b.rid, 16)], [(b.rid, 16)]]
    else:
        assert runs == [[(a.rid, 24)], [(a.rid, 16), (b.rid, 8)], [(b.rid, 24)],
                        [(b.rid, 8)]]
    assert max(p.num_tokens for p in planned) == budget
    assert sim.sched.stats.computed_tokens == 80
    check_oracle(a, b)


def test_many_small_prompts_fill_the_budget_and_wait() -> None:
    """Ten 5-token prompts, budget 16: three start whole and the fourth gets the last token of
    the budget; the rest wait, they do not each get a chunk."""
    sim = make_sim(512, page_size=1, schedule_policy="fcfs", max_num_batched_tokens=16)
    reqs = [sim.sched.add_request([1 + i, 2, 3, 4, 5], long(3)) for i in range(10)]
    plan = sim.sched.schedule(sim.loop.in_flight)
    assert plan is not None
    assert [(r.rid, r.num_new) for r in plan.runs] == [(q.rid, 5) for q in reqs[:3]] + [
        (reqs[3].rid, 1)
    ]
    assert [r.rid for r in sim.sched.waiting] == [q.rid for q in reqs[4:]]


timed_streams = st.lists(
    st.tuples(
        st.integers(0, 20),  # arrival step
        st.sampled_from([0, 1, 2]),  # prompt family
        st.integers(1, 24),  # own tokens after the family prefix
        st.integers(1, 24),  # max_tokens
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    stream=timed_streams,
    budget=st.sampled_from([16, 24]),
    max_running=st.sampled_from([1, 2, 3, 256]),
    pool_tokens=st.integers(48, 128),
    preemption=st.sampled_from(["recompute", "swap"]),
    policy=st.sampled_from(["fcfs", "lpm", "dfs-weight"]),
)
def test_every_plan_keeps_the_budget_the_batch_cap_and_swap_order(
    stream: list[tuple[int, int, int, int]], budget: int, max_running: int, pool_tokens: int,
    preemption: str, policy: str,
) -> None:
    """Random request streams: a step computes at most the budget (decodes alone may exceed
    it: each running decode gets its token), never more than max_running_requests requests
    hold KV, no request starts while another is swapped out, and the outputs are the
    oracle's."""
    sim = make_sim(pool_tokens, page_size=1, max_num_batched_tokens=budget,
                   max_running_requests=max_running, preemption=preemption,
                   schedule_policy=policy)
    planned = watch(sim)
    bases = [tokens(0, 12), tokens(9, 7), tokens(3, 20)]
    arrivals = [Arrival(at, tuple(bases[family] + tokens(own % 10, own)), long(max_tokens))
                for at, family, own, max_tokens in stream]
    top = run(sim, arrivals)
    check_idle(sim)
    check_outputs(sim, arrivals, top)
    event("swapped" if sim.sched.stats.swaps else "no swap")
    event("preempted" if sim.sched.stats.preemptions else "no preemption")
    for p in planned:
        assert p.num_tokens <= max(budget, len(p.plan.runs)), p.runs
        assert len(p.running) <= max_running
        assert not (p.admitted and p.swapped), (p.admitted, p.swapped)


# --- max_running_requests ------------------------------------------------------------------------
def test_max_running_requests_caps_the_batch() -> None:
    """Five requests, at most two at a time: the third starts only once one has finished, and no
    plan ever runs more than two."""
    sim = make_sim(512, page_size=1, max_running_requests=2)
    planned = watch(sim)
    reqs = [sim.sched.add_request(tokens(i, 4), long(3 + i)) for i in range(5)]
    step(sim)
    assert planned[0].admitted == [reqs[0].rid, reqs[1].rid]
    assert planned[0].waiting == [r.rid for r in reqs[2:]]
    finish_all(sim)
    assert max(len(p.plan.runs) for p in planned) == 2
    assert max(len(p.running) for p in planned) == 2
    starts = [p.plan.step_id for r in reqs for p in planned if r.rid in p.admitted]
    assert starts == [1, 1, 4, 5, 9]  # as places free up (outputs of 3, 4, 5, ... tokens)
    check_oracle(*reqs)


# --- swapped-out requests come back before new ones start ----------------------------------------
def test_new_requests_wait_while_a_request_is_swapped_out() -> None:
    """Swap preemption parks the most recent decoder in host memory at step 9. A one-token
    request arriving then must not start before the swapped ones are back (it would take the
    memory they need): it starts in the plan that swaps them in, and no plan admits a new
    request while one is swapped out."""
    sim = make_sim(32, page_size=1, preemption="swap")
    planned = watch(sim)
    reqs = [sim.sched.add_request(tokens(7 + i, 4), long(16)) for i in range(3)]
    while not sim.sched.swapped:
        step(sim)
    assert planned[-1].plan.step_id == 9
    late = sim.sched.add_request([20], long(2))
    finish_all(sim)
    back = next(p.plan.step_id for p in planned if p.plan.swap_in)
    start = next(p.plan.step_id for p in planned if late.rid in p.admitted)
    assert (back, start) == (17, 17)
    assert all(not p.swapped for p in planned if p.admitted)
    assert sim.sched.stats.swaps == 2
    check_oracle(*reqs, late)


def test_a_full_swap_space_falls_back_to_recompute_and_says_so() -> None:
    """The same load with no host swap space: every swap preemption is a recompute instead,
    counted as a fallback (it used to happen silently), and the outputs are still right."""
    sim = make_sim(32, page_size=1, preemption="swap", swap_space_tokens=0)
    reqs = [sim.sched.add_request(tokens(7 + i, 4), long(16)) for i in range(3)]
    finish_all(sim)
    s = sim.sched.stats_dict()
    assert s["preemptions"] > 0 and s["swaps"] == 0
    assert s["swap_fallbacks"] == s["preemptions"]
    check_oracle(*reqs)


# --- in-batch prefix sharing ---------------------------------------------------------------------
@pytest.mark.parametrize("page_size", [1, 4])
def test_two_requests_with_one_long_prompt_compute_it_once(page_size: int) -> None:
    """Two requests with the same 64-token prompt arrive together. The second waits one step and
    then finds the prompt in the radix cache: the prompt is computed once."""
    sim = make_sim(512, page_size=page_size)
    planned = watch(sim)
    prompt = tokens(0, 64)
    a = sim.sched.add_request(prompt, long(4))
    b = sim.sched.add_request(prompt, long(4))
    finish_all(sim)
    cached = 60 if page_size == 4 else 63  # whole pages, never the last prompt token
    assert planned[0].runs == [(a.rid, 64)]
    assert planned[1].runs == [(a.rid, 1), (b.rid, 64 - cached)]
    assert sim.sched.stats.cached_tokens == cached
    assert sim.sched.stats.computed_tokens == 64 + (64 - cached) + 2 * 3
    check_oracle(a, b)


@pytest.mark.parametrize("page_size", [1, 4])
def test_with_overlap_a_prompt_in_flight_is_still_computed_once(page_size: int) -> None:
    """Overlap: the plan after A's prefill is made while that prefill is in flight, so A's
    prompt is not in the tree yet and A no longer counts as prefilling (its chunk is planned).
    B must still wait for it rather than compute the same 64 tokens again (it did not: the
    server, which always overlaps, lost in-batch prefix sharing)."""
    sim = make_sim(512, overlap=True, page_size=page_size)
    planned = watch(sim)
    prompt = tokens(0, 64)
    a = sim.sched.add_request(prompt, long(4))
    b = sim.sched.add_request(prompt, long(4))
    finish_all(sim)
    cached = 60 if page_size == 4 else 63
    assert planned[0].runs == [(a.rid, 64)]
    assert (b.rid, 64) not in [run for p in planned for run in p.runs]
    assert sim.sched.stats.cached_tokens == cached
    assert sim.sched.stats.computed_tokens == 64 + (64 - cached) + 2 * 3
    check_oracle(a, b)


def test_prompts_sharing_less_than_the_threshold_are_not_held_back() -> None:
    """Sharing fewer than IN_BATCH_PREFIX_MIN uncached tokens is not worth a step's wait: both
    start at once. Sharing that many, the second waits."""
    sim = make_sim(512, page_size=1)
    shared = tokens(0, IN_BATCH_PREFIX_MIN - 1)
    a = sim.sched.add_request(shared + [1, 1], ONCE)
    b = sim.sched.add_request(shared + [2, 2], ONCE)
    c = sim.sched.add_request(shared + [1, 2], ONCE)  # shares IN_BATCH_PREFIX_MIN with a
    plan = sim.sched.schedule(sim.loop.in_flight)
    assert plan is not None
    assert [(r.rid, r.num_new) for r in plan.runs] == [(a.rid, 33), (b.rid, 33)]
    assert [r.rid for r in sim.sched.waiting] == [c.rid]


# --- prefill chunks enter the radix cache as they are computed -----------------------------------
def test_a_computed_chunk_is_shared_before_the_prompt_is_done() -> None:
    """A's 40-token prompt runs in chunks of 16. B shares A's first 20 tokens and starts in the
    budget A's last chunk leaves (step 3): A's first two chunks are in the cache by then, so B
    computes only its own 4 tokens."""
    sim = make_sim(512, page_size=1, schedule_policy="fcfs", max_num_batched_tokens=16)
    planned = watch(sim)
    prompt = tokens(0, 40)
    a = sim.sched.add_request(prompt, ONCE)
    b = sim.sched.add_request(prompt[:20] + tokens(3, 4), ONCE)
    finish_all(sim)
    assert [p.runs for p in planned[:3]] == [[(a.rid, 16)], [(a.rid, 16)], [(a.rid, 8), (b.rid, 4)]]
    assert planned[2].plan.new_requests[0].prefix_slots == sim_slots_of(planned, a.rid)[:20]
    assert sim.sched.stats.cached_tokens == 20
    check_oracle(a, b)


def sim_slots_of(planned: Sequence[Planned], rid: int) -> list[int]:
    """The slots the plans gave request `rid`, in position order."""
    return [s for p in planned for r in p.plan.runs if r.rid == rid for s in r.new_slots]


# --- a prefix in use stays cached ----------------------------------------------------------------
def test_a_prefix_in_use_is_not_evicted_under_pressure() -> None:
    """R reuses a cached 16-token prompt (15 tokens shared, 1 computed) and decodes; X, a cold
    30-token prompt, prefills beside it in a 40-slot pool. R's shared pages must stay locked
    in the tree while R runs: they are not evictable, so room for X is what is really free (plus
    the cold last page of the cached prompt), X's chunk at step 2 is cut to it (8 tokens), and
    one preemption (X's) is enough. Were R's pages evictable, the scheduler would count them as
    room, evict them for nothing (R still holds them), stall X's chunk and preempt again and
    again; and the prompt R shares would drop out of the cache while R uses it."""
    sim = make_sim(40, page_size=1, schedule_policy="fcfs", max_num_batched_tokens=16)
    prompt = tokens(0, 16)
    warm(sim, prompt)
    planned = watch(sim)
    r = sim.sched.add_request(prompt, long(10))
    x = sim.sched.add_request(tokens(9, 30), ONCE)
    kept = []
    while not r.finished:
        step(sim)
        kept.append(sim.sched.kv.match_len(r) >= 15 or r.finished)
    assert all(kept), "the prefix a running request shares left the cache"
    assert [p.runs for p in planned[:2]] == [[(r.rid, 1), (x.rid, 15)], [(r.rid, 1), (x.rid, 8)]]
    assert planned[2].preempted == [x.rid]
    finish_all(sim)
    stats = sim.sched.stats
    # warm-up 16; R 1 + 9 decodes; X 15 + 8, then 15 once back (R's decodes evicted 8 of the
    # 23 tokens X had left in the cache)
    assert (stats.preemptions, stats.computed_tokens) == (1, 16 + 10 + 23 + 15)
    check_oracle(r, x)


def test_a_request_on_a_cached_prefix_that_fits_the_pool_finishes() -> None:
    """R reuses a cached 16-token prompt and decodes 20 tokens (37 slots of 40); Q runs beside it
    and finishes, leaving its prompt cached after R's. When the pool fills up, R's decodes must
    evict Q's cold prompt, not the pages R itself shares (evicting those frees nothing: R holds
    them). R finishes with its 20 tokens, not with "the KV pool is too small"."""
    sim = make_sim(40, page_size=1)
    prompt = tokens(0, 16)
    warm(sim, prompt)
    r = sim.sched.add_request(prompt, long(20))
    q = sim.sched.add_request(tokens(9, 18), ONCE)
    finish_all(sim)
    assert (r.finish_reason, q.finish_reason) == ("length", "length")
    assert sim.sched.stats.preemptions == 0
    check_oracle(r, q)


# --- room() is what reserve can give -------------------------------------------------------------
def reservable(sim: Sim, req: Request, n: int) -> bool:
    """Whether the KV manager would give `req` n more positions now (tried on a copy)."""
    kv, probe = copy.deepcopy((sim.sched.kv, req))
    return kv.reserve(probe, n, []) is not None


def check_room(sim: Sim) -> None:
    """KVManager.room(req), which chunk sizes and admission rely on, is exactly the most
    positions reserve() can give each running request (evicting what it may)."""
    for req in sim.sched.running:
        room = sim.sched.kv.room(req)
        assert room >= 0
        if room:
            assert reservable(sim, req, room), f"request {req.rid}: room {room} overstated"
        assert not reservable(sim, req, room + 1), f"request {req.rid}: room {room} too small"


@pytest.mark.parametrize("prompt_len", [10, 12])
def test_room_counts_the_copy_on_write_page_of_forked_children(prompt_len: int) -> None:
    """After an n = 2 fork the children share the prompt's pages, a partial last one too (10
    tokens in pages of 4); a child's first token past it needs a fresh copy of that page, so
    its room is one page less than the free pages suggest. A 12-token prompt leaves no partial
    page: nothing to copy."""
    sim = make_sim(32, page_size=4)
    hog = sim.sched.add_request(tokens(9, 4), long(2))
    parent = sim.sched.add_request(tokens(0, prompt_len), SamplingParams(max_tokens=2, n=2,
                                                                         ignore_eos=True))
    step(sim)
    assert parent.finish_reason == "forked" and not hog.finished
    children = [sim.sched.requests[c] for c in sim.sched.children[parent.rid]]
    free = sim.sched.kv.pool.num_free + sim.sched.kv.tree.evictable_pages
    rooms = [sim.sched.kv.room(c) for c in children]
    if prompt_len % 4:
        assert rooms == [(free - 1) * 4 + 4 - prompt_len % 4] * 2
    else:
        assert rooms == [free * 4] * 2
    check_room(sim)
    finish_all(sim)


def test_a_forked_childs_chunk_is_cut_to_its_room_not_a_siblings_kv() -> None:
    """Jump-forward after a fork: the simulated grammar forces tokens right after each child's
    first one, so in step 2 B's three children have 4, 5 and 2 tokens to compute, beside three
    decodes, with 7 pages (of 2 slots) free. A child writing past its prompt first copies the
    prompt's shared partial last page. The chunks are cut to each child's room, which counts that
    copy: 4, 3 and 1 (the last child owns the page by then and fills its one free slot), and no
    one is preempted. Counting the copy's page as room, the second child's chunk (5) would not
    fit and its sibling would be preempted to make room for it."""
    sim = make_sim(30, page_size=2)
    planned = watch(sim)
    spec = [([1, 1], 2, 2, 2), ([2, 6, 7, 2, 1], 6, 3, 3), ([2, 7, 1, 1, 5, 7, 8], 2, 1, 3)]
    a, b, c = [sim.sched.add_request(prompt, SamplingParams(max_tokens=m, n=n,
                                                            regex=f"{JUMP}{d}"))
               for prompt, m, n, d in spec]
    step(sim)
    a1, a2 = sim.sched.children[a.rid]
    b1, b2, b3 = (sim.sched.requests[rid] for rid in sim.sched.children[b.rid])
    assert [r.num_tokens - r.kv_len for r in (b1, b2, b3)] == [4, 5, 2]  # the sim's grammar
    step(sim)
    assert planned[1].runs == [(a1, 1), (a2, 1), (c.rid, 1), (b1.rid, 4), (b2.rid, 3),
                               (b3.rid, 1)]
    assert [cow.rid for cow in planned[1].plan.copies] == [b1.rid, b2.rid]
    finish_all(sim)
    assert sim.sched.stats.preemptions == 0


request_streams = st.lists(
    st.tuples(
        st.sampled_from([0, 1, 2]),  # prompt family
        st.integers(1, 20),  # own tokens after the family prefix
        st.integers(1, 12),  # max_tokens
        st.sampled_from([1, 1, 2, 3]),  # n
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    stream=request_streams,
    page_size=st.sampled_from([1, 2, 4]),
    pool_tokens=st.integers(48, 128),
    preemption=st.sampled_from(["recompute", "swap"]),
)
def test_room_is_what_reserve_can_give_at_every_step(
    stream: list[tuple[int, int, int, int]], page_size: int, pool_tokens: int, preemption: str
) -> None:
    """Random streams of requests with shared prefixes, forks and preemption under tight pools:
    after every step, each running request's room is exact (shared prefixes stay locked, a
    shared partial last page costs a copy), and the outputs are the oracle's."""
    sim = make_sim(pool_tokens, page_size=page_size, preemption=preemption,
                   max_num_batched_tokens=16)
    bases = [tokens(0, 12), tokens(9, 7), tokens(3, 20)]
    arrivals = []
    for family, own, max_tokens, n in stream:
        params = SamplingParams(max_tokens=max_tokens, n=n, ignore_eos=True)
        prompt = tuple(bases[family] + tokens(family + own, own))
        arrivals.append(Arrival(0, prompt, params))
        sim.sched.add_request(list(prompt), params)
    top = [sim.sched.requests[rid] for rid in sorted(sim.sched.requests)]
    for _ in range(2000):
        if not (sim.sched.waiting or sim.sched.running or sim.sched.swapped):
            break
        step(sim)
        check_room(sim)
    finish_all(sim)
    check_outputs(sim, arrivals, top)


# --- the cache holds known tokens only -----------------------------------------------------------
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("abort_at", [3, 4, 6])
def test_an_abort_while_a_step_is_in_flight_caches_known_tokens_only(
    page_size: int, abort_at: int
) -> None:
    """Overlap scheduling: the step in flight computes the position of a token not sampled yet
    (a placeholder). A client abort then must cache the request's known tokens (whole pages) and
    not the placeholder's position; a request continuing the known tokens finds exactly them."""
    sim = make_sim(256, overlap=True, page_size=page_size)
    params = long(12)
    prompt = tokens(0, 9)
    [req] = run(sim, [Arrival(0, tuple(prompt), params)], aborts=[(abort_at, 0, True)])
    check_idle(sim)
    assert req.finish_reason == "abort"
    assert req.num_known_outputs < len(req.output_ids)  # tokens were in flight
    known = req.prompt_ids + req.output_ids[: req.num_known_outputs]
    assert PLACEHOLDER_TOKEN not in known
    whole = len(known) // page_size * page_size
    tree = sim.sched.kv.tree
    assert tree.total_pages * page_size == whole  # nothing but the known tokens
    assert tree.match_prefix(known + [PLACEHOLDER_TOKEN]).length == whole
    want, _ = oracle(prompt, params, 0)
    assert known[len(prompt):] == want[: len(known) - len(prompt)]
    follow = sim.sched.add_request(known + [3], ONCE)
    finish_all(sim)
    assert sim.sched.stats.cached_tokens == whole
    check_oracle(follow)


# --- speculative decoding ------------------------------------------------------------------------
def deepest_draft(run: Run) -> int:
    """How many drafted tokens the run's longest draft path holds (0: no draft)."""
    parents = run.draft_parents or list(range(-1, len(run.draft) - 1))
    depth: list[int] = []
    for parent in parents:
        depth.append(1 + (depth[parent] if parent >= 0 else 0))
    return max(depth, default=0)


@pytest.mark.parametrize("max_tokens", [1, 2, 5])
def test_a_draft_never_runs_past_max_tokens(max_tokens: int) -> None:
    """A request whose answer the radix tree holds drafts it, but never past its max_tokens:
    the token sampled after the draft counts too. The last output is sampled, never computed,
    so no planned run of the request reaches position prompt + max_tokens - 1 (nor reserves
    KV for it); its outputs are the oracle's."""
    sim = make_sim(512, speculative_algorithm="radix", speculative_num_draft_tokens=8,
                   speculative_max_batch_size=256)
    prompt = list(range(1, 13))
    sim.sched.add_request(prompt, long(16))
    finish_all(sim)  # its answer is cached
    planned = watch(sim)
    req = sim.sched.add_request(prompt, long(max_tokens))
    finish_all(sim)
    runs = [r for p in planned for r in p.plan.runs if r.rid == req.rid]
    assert any(r.draft for r in runs) == (max_tokens > 1)  # room for a draft and its sample
    for r in runs:
        assert r.known_end + deepest_draft(r) <= len(prompt) + max_tokens - 1, r
    check_oracle(req)


# --- min_tokens ----------------------------------------------------------------------------------
def scripted(outputs: Sequence[int], params: SamplingParams) -> Request:
    """One request through the scheduler with a worker that samples `outputs` in order (no
    masking: this checks the scheduler's own stopping rule)."""
    config = EngineConfig(max_total_tokens=256, page_size=1, speculative_algorithm=None)
    sched = Scheduler(config, 256, CONTEXT, [EOS])
    in_flight = InFlightLedger()  # each plan is folded in before the next is made
    req = sched.add_request([1, 2, 3], params)
    script = iter(outputs)
    while not req.finished:
        plan = sched.schedule(in_flight)
        assert plan is not None and len(plan.runs) == 1
        token = TokenLogprob(next(script), -1.0)
        result = StepResult(plan.step_id, [RunResult(req.rid, token)])
        sched.process_results(plan, result, in_flight)
    return req


@pytest.mark.parametrize("stop", [EOS, 7])
@pytest.mark.parametrize("min_tokens", [1, 2, 5])
def test_min_tokens_lets_a_stop_token_end_the_request_from_the_min_tokens_th_output(
    min_tokens: int, stop: int
) -> None:
    """With min_tokens = m, a stop token (EOS or a stop_token_id) as output m ends the request
    with m outputs; as output m - 1 it is just a token."""
    params = SamplingParams(max_tokens=8, min_tokens=min_tokens, stop_token_ids=[7])
    filler = [5] * 10
    at_m = scripted(filler[: min_tokens - 1] + [stop] + filler, params)
    assert (len(at_m.output_ids), at_m.finish_reason) == (min_tokens, "stop")
    assert at_m.output_ids[-1] == stop
    early = filler[: min_tokens - 2] + [stop] + filler if min_tokens > 1 else filler
    before = scripted(early, params)
    assert (len(before.output_ids), before.finish_reason) == (8, "length")
    assert before.output_ids == early[:8]


# --- pins and their budget --------------------------------------------------------------------
def finish_pinned(sim: Sim, prompt: list[int]) -> tuple[Request, object]:
    """A pin=True request run to its end; returns it and its final output delta."""
    req = sim.sched.add_request(prompt, ONCE, pin=True)
    while not req.finished:
        step(sim)
    deltas = sim.sched.take_deltas([req])
    assert len(deltas) == 1 and deltas[0].finish_reason == "length"
    return req, deltas[0]


def settle(sim: Sim) -> None:
    """Step until the worker was told of every finished request."""
    while sim.sched.has_work:
        step(sim)


def test_pins_are_refused_past_the_pin_budget_and_shared_tokens_count_once() -> None:
    """max_pinned_fraction 0.3 of a 100-token pool: pins may lock 30 tokens. A 20-token pin
    fits; a second, unrelated 20-token pin would make 40 and is refused (with a message, its
    prefix left cached and evictable); one that extends the first by 5 tokens shares its 20
    and fits (25). Each final delta says which; unpinning leaves nothing locked."""
    sim = make_sim(100, max_pinned_fraction=0.3)
    sched = sim.sched
    first, d1 = finish_pinned(sim, tokens(0, 20))
    assert d1.pinned and d1.pin_error is None
    assert sched.stats_dict()["pinned_tokens"] == 20
    other, d2 = finish_pinned(sim, tokens(7, 20))
    assert not d2.pinned and "past the pin budget of 30" in d2.pin_error
    assert other.rid not in sched.table.pins
    longer, d3 = finish_pinned(sim, tokens(0, 20) + tokens(9, 5))
    assert d3.pinned
    s = sched.stats_dict()
    assert (s["pinned"], s["pinned_tokens"], s["pins_refused"]) == (2, 25, 1)
    assert sched.kv.counters([]).locked == 25
    assert sched.unpin(first.rid) and sched.unpin(longer.rid) and not sched.unpin(other.rid)
    settle(sim)
    check_idle(sim)


def test_a_zero_pin_budget_refuses_every_pin_and_the_request_still_finishes() -> None:
    sim = make_sim(100, max_pinned_fraction=0.0)
    req, delta = finish_pinned(sim, tokens(0, 10))
    assert not delta.pinned and "not pinned" in delta.pin_error
    assert req.output_ids and sim.sched.stats_dict()["pinned"] == 0
    settle(sim)
    check_idle(sim)
