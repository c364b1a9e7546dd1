"""The scheduler against a simulated worker (tests/sim_worker.py): no model, no tensors.

Random request streams under random configurations, with and without overlap scheduling and with
jump-forward (constrained requests whose simulated grammar forces tokens), check after every step
the scheduler's integrity, the worker's invariants (every KV slot a run reads holds the right
token's KV) and that both views agree; at the end, that nothing leaked and every output is the
oracle's and what the worker produced.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import replace

import msgspec
import pytest
import sim_worker
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st
from sim_worker import (
    EOS,
    JUMP,
    LORA_NAMES,
    POOL_TOO_SMALL,
    TOLERATE_SWAP_IN_PREEMPTED,
    VOCAB,
    Arrival,
    Sim,
    SwapInPreempted,
    check_idle,
    check_outputs,
    check_sample,
    cross_check,
    make_sim,
    oracle,
    oracle_logprobs,
    run,
    step,
)

from radixrt.runtime.messages import Scheduling, StepPlan, StepResult
from radixrt.runtime.pooling_params import Pooling
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.scheduler.request import Phase, Request

# --- strategies --------------------------------------------------------------------------------
prompt_tokens = st.integers(1, 8)
POOLINGS = (Pooling("embed"), Pooling("embed", mode="mean"), Pooling("embed", mode="cls"),
            Pooling("classify", label_tokens=(1, 2)))


@st.composite
def request_sets(draw: st.DrawFn, max_requests: int = 10, min_requests: int = 2,
                 pooling_odds: int = 20) -> list[Arrival]:
    """pooling_odds: a request is a pooling request once in 1 + pooling_odds / len(POOLINGS)."""
    bases = draw(st.lists(st.lists(prompt_tokens, min_size=8, max_size=48), min_size=1, max_size=3))
    arrivals = []
    for _ in range(draw(st.integers(min_requests, max_requests))):
        base = bases[draw(st.integers(0, len(bases) - 1))]
        prompt = tuple(base) + tuple(draw(st.lists(prompt_tokens, min_size=1, max_size=12)))
        max_tokens = draw(st.integers(1, 24))
        # constrained (jump-forward) requests: no min_tokens, no ignore_eos (SamplingParams)
        regex = draw(st.sampled_from([None, None, f"{JUMP}1", f"{JUMP}2", f"{JUMP}3"]))
        min_tokens = draw(st.integers(0, max_tokens)) if draw(st.booleans()) else 0
        params = SamplingParams(
            max_tokens=max_tokens,
            min_tokens=0 if regex else min_tokens,
            n=draw(st.sampled_from([1, 1, 1, 2, 3])),
            stop_token_ids=draw(st.lists(st.integers(0, VOCAB - 1), max_size=2)),
            ignore_eos=draw(st.booleans()) and not regex,
            prompt_logprobs_start=draw(st.none() | st.integers(0, 12)),
            regex=regex,
        )
        # pooling requests (embeddings, scores): prefill only; mean pooling reads every row
        pooling = draw(st.sampled_from([None] * pooling_odds + list(POOLINGS)))
        if pooling is not None:
            params = SamplingParams(max_tokens=0, pooling=pooling)
        scheduling = Scheduling(priority=draw(st.sampled_from([0, 0, 0, 1, -1])),
                                tenant=draw(st.sampled_from(["", "", "a", "b"])),
                                lora=draw(st.sampled_from([None, None, *LORA_NAMES])))
        arrivals.append(Arrival(draw(st.integers(0, 20)), prompt, params, scheduling))
    return arrivals


@st.composite
def configs(draw: st.DrawFn) -> dict:
    config = dict(
        page_size=draw(st.sampled_from([1, 4, 16])),
        schedule_policy=draw(st.sampled_from(["fcfs", "lpm", "dfs-weight"])),
        preemption=draw(st.sampled_from(["recompute", "swap"])),
        disable_radix_cache=draw(st.booleans()),
        max_num_batched_tokens=draw(st.integers(16, 64)),
        max_running_requests=draw(st.sampled_from([4, 256, 2])),
        swap_space_tokens=draw(st.sampled_from([1 << 16, 48, 0])),
        overlap=draw(st.booleans()),
        priority_preemption=draw(st.booleans()),
        fair_share=draw(st.booleans()),
        fair_share_preemption=draw(st.booleans()),
        fair_share_quantum=draw(st.sampled_from([1, 4])),
        tenant_weights=draw(st.sampled_from(["", "a:3", "a:0.5,b:2"])),
        # cascade groups as soon as two requests share a few tokens: the worker checks each
        cascade_min_saved_reads=draw(st.sampled_from([1, 16, 2048])),
        # speculative decoding: drafts from the tree and the request's own tokens, accepted
        # where the simulated samples match them (often: prompts share bases, vocab is small)
        speculative_algorithm=draw(st.sampled_from([None, "radix", "radix"])),
        speculative_num_draft_tokens=draw(st.sampled_from([1, 3, 8])),
        speculative_max_batch_size=draw(st.sampled_from([1, 4, 256])),
        # KV tiers: evicted prefixes demoted to host / disk and loaded back on a match
        host_cache_tokens=draw(st.sampled_from([0, 0, 32, 256])),
        disk_tier_tokens=draw(st.sampled_from([0, 0, 64, 512])),
        # LoRA adapters: each its own namespace of the tree (the simulated KV of a token
        # depends on the adapter), at most max_loras_per_batch of them in a step
        loras=draw(st.sampled_from([0, len(LORA_NAMES), len(LORA_NAMES)])),
        max_loras_per_batch=draw(st.sampled_from([1, 2, 8])),
    )
    if config["disable_radix_cache"]:  # tiers hold the radix cache's pages: none without it
        config.update(host_cache_tokens=0, disk_tier_tokens=0)
    return config


SIM_SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


aborts_at = st.tuples(st.integers(0, 40), st.integers(0, 99), st.booleans())


def check_scenario(arrivals: list[Arrival], config: dict, pool_tokens: int, aborts: list) -> Sim:
    if not config.get("loras"):  # no adapters served: every request on the base model
        arrivals = [replace(a, scheduling=msgspec.structs.replace(a.scheduling, lora=None))
                    for a in arrivals]
    sim = make_sim(max(pool_tokens, 2 * config["page_size"]), **config)
    try:
        top = run(sim, arrivals, aborts)
    except SwapInPreempted:
        if not TOLERATE_SWAP_IN_PREEMPTED:
            raise
        reject()
    check_idle(sim)
    check_outputs(sim, arrivals, top)
    record_coverage(sim)
    return sim


@SIM_SETTINGS
@given(
    arrivals=request_sets(),
    config=configs(),
    pool_tokens=st.integers(64, 192),
    aborts=st.lists(aborts_at, max_size=3),
)
def test_random_streams_keep_every_invariant(
    arrivals: list[Arrival], config: dict, pool_tokens: int, aborts: list
) -> None:
    """Every step: the scheduler's integrity check, the worker's invariants, the two views agree.
    At the end: idle, nothing leaked, every output the oracle's (a prefix of it if aborted)."""
    check_scenario(arrivals, config, pool_tokens, aborts)


def record_coverage(sim: Sim) -> None:
    """What the example exercised (pytest --hypothesis-show-statistics)."""
    stats = sim.sched.stats
    reasons = {r.finish_reason for r in sim.sched.requests.values()}
    event("preempted" if stats.preemptions else "no preemption")
    event("swapped" if stats.swaps else "no swap")
    event("cache hit" if stats.cached_tokens else "no cache hit")
    event("copy-on-write" if sim.worker.copies else "no copy")
    event("forked" if "forked" in reasons else "no fork")
    event("aborted" if "abort" in reasons else "no abort")
    event("error" if any(r and r.startswith("error") for r in reasons) else "no error")
    event("overlap" if sim.overlap else "no overlap")
    event("jump-forward" if sim.worker.forced else "no jump-forward")
    event("cascade" if sim.worker.shared_reads_saved else "no cascade")
    loaded = any(dst == 0 for _src, dst in sim.worker.moved)
    event("tiers: loaded back" if loaded else "tiers: demoted only" if sim.worker.moved
          else "tiers: nothing moved")
    if sim.worker.drafted:
        event("drafts accepted" if sim.worker.accepted else "drafts all rejected")
        event("draft tree, branch taken" if sim.worker.branch_accepted
              else "draft tree" if sim.worker.trees else "chains only")
        some_rejected = sim.worker.accepted < sim.worker.drafted
        event("drafts rejected" if some_rejected else "every draft accepted")
    else:
        event("no drafts")
    event("priority preemption" if stats.priority_preemptions else "no priority preemption")
    fair = stats.preemptions_by_cause["fair_share"]
    event("fair-share preemption" if fair else "no fair-share preemption")
    if sim.overlap:
        event("presolved in flight" if sim.worker.known else "nothing presolved")
        event("preempted while presolved" if sim.presolved_preempted else "no presolved victim")
        event("sync for a preemption" if sim.syncs else "no sync")
    forced_stop = any(r.finish_reason == "stop" and r.output_logprobs[-1].logprob == 0.0
                      for r in sim.sched.requests.values())
    event("forced stop" if forced_stop else "no forced stop")
    event("adapters mixed in a step" if sim.worker.adapters_per_batch > 1
          else "one adapter a step" if sim.worker.adapters_per_batch else "no adapter")


def test_tight_pools_with_swapping_keep_every_invariant() -> None:
    """The same checks where memory is short: 8 to 16 requests arrive within a few steps into
    the least pool that refuses none of them (plus a few slots), so preemption by swap happens
    on most examples; the test checks that it does."""
    swapped: list[bool] = []

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        arrivals=request_sets(max_requests=16, min_requests=8),
        config=configs(),
        spare=st.integers(0, 32),
        aborts=st.lists(aborts_at, max_size=2),
    )
    def example(arrivals: list[Arrival], config: dict, spare: int, aborts: list) -> None:
        ps = config["page_size"]
        arrivals = [Arrival(a.step // 4, a.prompt, a.params) for a in arrivals]
        # Scheduler.add_request refuses a request whose prompt + n * (max_tokens + page_size)
        # exceeds the pool: the largest such need, in whole pages, is the least pool
        least = max(len(a.prompt) + a.params.n * (a.params.max_tokens + ps) for a in arrivals)
        pool_tokens = -(-(least + spare) // ps) * ps
        sim = check_scenario(arrivals, dict(config, preemption="swap", swap_space_tokens=1 << 16),
                             pool_tokens, aborts)
        swapped.append(sim.sched.stats.swaps > 0)

    example()
    # about 70% swap; a pool or scheduler change that takes the pressure away fails here
    assert sum(swapped) >= 0.4 * len(swapped), f"{sum(swapped)} of {len(swapped)} swapped"


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("page_size", [1, 16])
def test_draft_trees_are_verified_down_the_branch_the_samples_take(overlap: bool,
                                                                  page_size: int) -> None:
    """Two prompts end in the same 40 tokens, so the draft index finds both answers after them
    and prefers the newer (their matches tie at MAX_BACK_MATCH): the first prompt asked again
    drafts a tree whose main line is the other's answer and a branch its own. Verification
    follows the branch the samples take, the KV of the accepted branch is where a chain's would
    be (the simulated worker checks every slot), and outputs are the oracle's."""
    rng = random.Random(5)
    shared = tuple(rng.randrange(1, VOCAB) for _ in range(40))
    first, other = (3, 3) + shared, (4, 4) + shared
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    arrivals = [Arrival(0, first, params), Arrival(40, other, params), Arrival(80, first, params)]
    sim = make_sim(1024, page_size=page_size, overlap=overlap, speculative_algorithm="radix",
                   speculative_num_draft_tokens=8, speculative_max_batch_size=256)
    top = run(sim, arrivals)
    check_idle(sim)
    check_outputs(sim, arrivals, top)
    assert sim.worker.trees and sim.worker.branch_accepted, (sim.worker.trees,
                                                             sim.worker.branch_accepted)


def test_fork_of_a_prompt_computed_again_fits() -> None:
    """An n = 2 request that needs the whole pool computes a prompt the tree already holds again
    (prompt logprobs bypass the cache). At its fork, result folding used to drop the count of
    duplicate pages KVManager.cache_prefix returns (a chunk's was kept for dedupe), so both
    children stayed on the duplicates while the tree's copy was locked: the pool was full, and
    one child ended with "the KV pool is too small" although the request fits."""
    prompt = tuple(range(1, 9)) * 4
    again = SamplingParams(max_tokens=15, n=2, ignore_eos=True, prompt_logprobs_start=0)
    assert len(prompt) + again.n * (again.max_tokens + 1) == 64  # fits a pool of 64 exactly
    check_run(make_sim(64, page_size=1, max_num_batched_tokens=64),
              [Arrival(0, prompt, SamplingParams(max_tokens=1)), Arrival(2, prompt, again)])


# --- output equivalence ------------------------------------------------------------------------
def outputs_of(arrivals: list[Arrival], pool_tokens: int, config: dict) -> list:
    sim = make_sim(pool_tokens, **config)
    try:
        top = run(sim, arrivals)
    except SwapInPreempted:
        if not TOLERATE_SWAP_IN_PREEMPTED:
            raise
        reject()
    check_idle(sim)
    assert not sim.aborted
    return check_outputs(sim, arrivals, top)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arrivals=request_sets(max_requests=8),
    variants=st.lists(st.tuples(configs(), st.integers(0, 160)), min_size=3, max_size=3),
)
def test_outputs_are_identical_across_configurations(
    arrivals: list[Arrival], variants: list[tuple[dict, int]]
) -> None:
    """Page size, radix cache on/off, policy, preemption mode, budget, pool size, overlap
    scheduling and the adapter slots change how a request set is run, never what it
    produces."""
    def need(a: Arrival) -> int:
        return len(a.prompt) + a.params.n * (a.params.max_tokens + 16)

    fits = max(need(a) for a in arrivals)
    fits = max(-(-fits // 16) * 16, 32)  # whole pages of every page size
    served = dict(loras=len(LORA_NAMES))  # the adapters the requests name, in every run
    reference = outputs_of(arrivals, 1 << 12, dict(page_size=1, disable_radix_cache=True,
                                                   **served))
    for config, extra in variants:
        got = outputs_of(arrivals, fits + extra, {**config, **served})
        for i, (want, have) in enumerate(zip(reference, got)):
            reasons = {r for sample in have[:-1] for r in sample[1:]} | {have[-1]}
            if sim_worker.TOLERATE_POOL_TOO_SMALL and POOL_TOO_SMALL in reasons:
                continue
            assert have == want, f"request {i} under {config}, pool {fits + extra}"


# --- n > 1 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("disable_radix_cache", [False, True])
@pytest.mark.parametrize("prompt_len", [10, 12, 42, 140])
def test_fork_shares_prompt_pages_and_copies_only_a_partial_last_page(
    prompt_len: int, disable_radix_cache: bool
) -> None:
    sim = make_sim(256, page_size=4, disable_radix_cache=disable_radix_cache,
                   cascade_min_saved_reads=256)
    prompt = [1 + i % 7 for i in range(prompt_len)]
    params = SamplingParams(max_tokens=6, n=3, ignore_eos=True)
    parent = sim.sched.add_request(prompt, params)
    step(sim)  # the whole prompt in one chunk, then the fork
    assert parent.finish_reason == "forked" and not parent.pages
    children = [sim.sched.requests[c] for c in sim.sched.children[parent.rid]]
    pages = list(children[0].pages)
    assert len(children) == 3 and all(c.pages == pages for c in children)
    for child in children:
        assert sim.worker.states[child.rid].slots == sim.sched.kv.slots(child, 0, prompt_len)
    full, partial = divmod(prompt_len, 4)
    in_tree = 0 if disable_radix_cache else 1
    refcount = sim.sched.kv.pool.refcount
    assert [refcount(p) for p in pages[:full]] == [3 + in_tree] * full
    if partial:
        assert refcount(pages[-1]) == 3  # the tree holds whole pages only
    plan = sim.sched.schedule(sim.loop.in_flight)
    assert plan is not None and [r.rid for r in plan.runs] == [c.rid for c in children]
    if partial:  # the first two children copy the shared partial page; the last one owns it
        assert [c.rid for c in plan.copies] == [c.rid for c in children[:2]]
        old = pages[-1] * 4
        for copy in plan.copies:
            assert copy.start == full * 4 and copy.src == list(range(old, old + partial))
            assert copy.dst[0] // 4 not in pages and copy.dst[0] % 4 == 0
        assert children[2].pages == pages
    else:
        assert plan.copies == []
    # the children's decodes read their common whole pages once (the partial page is copied)
    if (3 - 1) * full * 4 >= 256:
        assert [(g.rids, g.length) for g in plan.prefix_groups] == [
            ([c.rid for c in children], full * 4)]
    else:
        assert plan.prefix_groups == []
    sim.sched.process_results(plan, sim.worker.execute(plan), sim.loop.in_flight)
    cross_check(sim)
    assert all(refcount(c.pages[-1]) == 1 for c in children)
    top = run(sim, [])
    assert top == []
    check_idle(sim)
    for i, child in enumerate(children):
        assert (child.output_ids, child.finish_reason) == oracle(prompt, params, i)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("cascade", [True, False])
def test_decodes_sharing_a_system_prompt_form_one_prefix_group(page_size: int,
                                                                 cascade: bool) -> None:
    """Requests behind one system prompt decode as one group holding the prompt's cached pages
    (the first computes it; the others, held back a step, take it from the tree); a request
    with another prompt is in no group; the outputs are the oracle's either way."""
    sim = make_sim(1024, page_size=page_size, cascade_attention=cascade,
                   cascade_min_saved_reads=256)
    system = tuple(1 + i % 11 for i in range(128))
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    prompts = [system + (2 + i, 3 + i, 5) for i in range(4)] + [(7,) * 140]
    arrivals = [Arrival(0, p, params) for p in prompts]
    groups: list = []
    execute = sim.worker.execute

    def recording(plan: StepPlan) -> StepResult:
        groups.extend(plan.prefix_groups)
        return execute(plan)

    sim.worker.execute = recording  # type: ignore[method-assign]
    top = run(sim, arrivals)
    check_idle(sim)
    check_outputs(sim, arrivals, top)
    first = min(r.rid for r in sim.sched.requests.values())
    family = {first + i for i in range(4)}
    if not cascade:
        assert groups == [] and sim.worker.shared_reads_saved == 0
        return
    assert all(set(g.rids) <= family for g in groups)  # while all decode, all four together
    assert any(set(g.rids) == family for g in groups)
    shared = 128 // page_size * page_size  # the tree holds whole pages
    assert {g.length for g in groups} == {shared}


# --- aborts at every stage ---------------------------------------------------------------------
def test_abort_at_every_stage_leaves_nothing_behind() -> None:
    """Abort a request while waiting, mid-prefill, decoding, swapped out, and an n > 1 request
    before and after its fork; the others finish as the oracle says and nothing leaks."""
    sim = make_sim(64, page_size=4, max_num_batched_tokens=16, preemption="swap")
    sched = sim.sched
    params = SamplingParams(max_tokens=20, ignore_eos=True)

    def add(prompt: list[int], p: SamplingParams = params) -> Request:
        return sched.add_request(prompt, p)

    def abort(req: Request, phase: Phase) -> None:
        assert req.phase is phase, (req.rid, req.phase)
        done = sched.abort(req.rid)
        assert req in done and req.finish_reason == "abort"
        sim.reported |= {r.rid for r in done}
        sim.aborted |= {r.rid for r in done}
        cross_check(sim)

    keep = add([1, 2, 3, 4, 5, 6])
    waiting = add([2] * 30)
    abort(waiting, Phase.WAITING)
    prefilling = add([3] * 40)
    step(sim)
    step(sim)
    assert 0 < prefilling.kv_len < 40
    abort(prefilling, Phase.RUNNING)
    decoding = add([4, 4, 4])
    parent = add([5] * 9, SamplingParams(max_tokens=4, n=2, ignore_eos=True))
    for _ in range(3):
        step(sim)
    assert decoding.output_ids and parent.finish_reason == "forked"
    abort(decoding, Phase.RUNNING)
    forked = add([6] * 9, SamplingParams(max_tokens=4, n=2, ignore_eos=True))
    abort(forked, Phase.WAITING)  # before its fork: no children ever
    assert forked.rid not in sched.children
    long = SamplingParams(max_tokens=30, ignore_eos=True)
    hog, victim = add([7] * 8, long), add([8] * 8, long)  # 76 slots at the end: one must go
    while victim.phase is not Phase.SWAPPED:
        step(sim)
        assert sim.steps < 100 and not victim.finished
    abort(victim, Phase.SWAPPED)
    run(sim, [])
    check_idle(sim)
    for req in (keep, hog):
        assert (req.output_ids, req.finish_reason) == oracle(req.prompt_ids, req.params, 0)
    for i, rid in enumerate(sched.children[parent.rid]):
        child = sched.requests[rid]
        want = oracle(parent.prompt_ids, parent.params, i)
        assert (child.output_ids, child.finish_reason) == want
    for req in (prefilling, decoding, victim):
        want, _ = oracle(req.prompt_ids, req.params, 0)
        assert req.output_ids == want[: len(req.output_ids)]


# --- regressions: bugs this suite found (fixed in KVManager.cache_prefix and _pick_victim) ---
@pytest.mark.parametrize("prompt_logprobs", [False, True])
def test_duplicate_prefix_does_not_double_a_requests_footprint(prompt_logprobs: bool) -> None:
    sim = make_sim(64, page_size=1, max_num_batched_tokens=64)
    sim.sched.add_request([1] * 31, SamplingParams(max_tokens=1, ignore_eos=True))
    start = 0 if prompt_logprobs else None  # with prompt logprobs, no cache match at all
    params = SamplingParams(max_tokens=25, ignore_eos=True, prompt_logprobs_start=start)
    req = sim.sched.add_request([1] * 31, params)  # needs 31 + 25 (+1) <= 64 slots
    run(sim, [])
    check_idle(sim)
    assert (req.output_ids, req.finish_reason) == oracle([1] * 31, params, 0)


@pytest.mark.parametrize("case", ["prompt logprobs", "jump-forward"])
def test_request_swapped_in_is_not_preempted_in_the_same_step(case: str) -> None:
    """A plan that swaps a request back in must not pick it as the victim of a preemption too
    (the sim worker raises SwapInPreempted). The first set of requests found that bug; the
    scheduler has changed since and it no longer reaches the case (it only swaps once), so the
    second (jump-forward decodes outgrow the pages kept free for decodes) does."""
    once = SamplingParams(max_tokens=1)
    if case == "prompt logprobs":
        sim = make_sim(64, page_size=1, max_num_batched_tokens=16, preemption="swap")
        logprobs = once.with_(prompt_logprobs_start=0)
        arrivals = [
            Arrival(0, (1,) * 42, SamplingParams(max_tokens=9)),
            Arrival(0, (1,) * 32, logprobs),
            Arrival(0, (2,) + (1,) * 12 + (6,), once),
            Arrival(0, (2,) + (1,) * 13, once),
            Arrival(1, (1,) * 18, logprobs),
            Arrival(7, (2,) + (1,) * 15, once),
        ]
    else:
        sim = make_sim(64, page_size=1, max_num_batched_tokens=32, preemption="swap")
        arrivals = [
            Arrival(0, (1,) * 5 + (3, 1, 2) + (1,) * 5, SamplingParams(max_tokens=12, n=2,
                                                                     regex=f"{JUMP}3")),
            Arrival(0, (1,) * 5 + (2,) + (1,) * 7 + (3, 2, 1, 1),
                    SamplingParams(max_tokens=11, regex=f"{JUMP}3")),
            Arrival(2, (1, 1, 2) + (1,) * 20, once.with_(ignore_eos=True)),
        ]
    top = run(sim, arrivals)
    check_idle(sim)
    check_outputs(sim, arrivals, top)
    assert sim.sched.stats.swaps >= (1 if case == "prompt logprobs" else 2)


# --- jump-forward ------------------------------------------------------------------------------
def find_prompt(params: SamplingParams, wanted: Callable[..., bool], index: int = 0) -> list[int]:
    """The first of a fixed series of prompts whose oracle output (tokens, reason, logprobs)
    satisfies `wanted`."""
    for k in range(4096):
        prompt = [1 + i % 7 for i in range(10)] + [1 + (k >> (3 * j)) % 8 for j in range(4)]
        if wanted(*oracle_logprobs(prompt, params, index)):
            return prompt
    raise AssertionError("no such prompt in the series")


def jump_workload() -> list[Arrival]:
    """Constrained requests (one n = 2) and an unconstrained hog, arriving over three steps."""
    arrivals = [Arrival(0, (7,) * 20, SamplingParams(max_tokens=24, ignore_eos=True))]
    for i in range(6):
        prompt = tuple([1 + (i + j) % 5 for j in range(12)] + [i + 1])
        params = SamplingParams(max_tokens=20, regex=f"{JUMP}3", n=2 if i == 3 else 1)
        arrivals.append(Arrival(i // 2, prompt, params))
    return arrivals


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("overlap", [False, True])
def test_jump_forward_under_preemption(overlap: bool, preemption: str, page_size: int) -> None:
    """Forced tokens join the outputs (logprob 0) under preemption; with overlap, the step in
    flight when they arrive samples a token already known and its result is skipped."""
    sim = make_sim(64 if page_size == 1 else 96, overlap=overlap, page_size=page_size,
                   preemption=preemption, max_num_batched_tokens=32)
    arrivals = jump_workload()
    top = run(sim, arrivals)
    check_idle(sim)
    check_outputs(sim, arrivals, top)
    assert sim.sched.stats.preemptions > 0 and sim.worker.forced > 0
    assert (sim.sched.stats.swaps > 0) == (preemption == "swap")
    assert (sim.worker.known > 0) == overlap  # the presolved case happens with overlap only
    reasons = [(r.finish_reason, r.output_logprobs[-1].logprob)
               for r in sim.sched.requests.values() if r.output_logprobs]
    assert ("stop", 0.0) in reasons and ("length", 0.0) in reasons  # ended by forced tokens


@pytest.mark.parametrize("overlap", [False, True])
def test_forced_eos_finishes_with_stop(overlap: bool) -> None:
    params = SamplingParams(max_tokens=16, regex=f"{JUMP}3")
    prompt = find_prompt(params, lambda out, reason, lps: (
        reason == "stop" and out[-1] == EOS and lps[-1] == 0.0 and len(out) < 12))
    sim = make_sim(256, overlap=overlap)
    req = sim.sched.add_request(prompt, params)
    run(sim, [])
    check_idle(sim)
    assert req.finish_reason == "stop" and req.output_ids[-1] == EOS
    assert req.output_logprobs[-1].logprob == 0.0
    check_sample(sim, req, prompt, params, 0)


@pytest.mark.parametrize("overlap", [False, True])
def test_forced_tokens_are_cut_at_max_tokens(overlap: bool) -> None:
    """The first sampled token forces 2+ tokens, but max_tokens=2 leaves room for one."""
    params = SamplingParams(max_tokens=2, regex=f"{JUMP}3")
    longer = params.with_(max_tokens=8)
    prompt = find_prompt(longer, lambda out, reason, lps: lps[:3] == [-1.0, 0.0, 0.0]
                         and EOS not in out[:3])
    sim = make_sim(256, overlap=overlap)
    req = sim.sched.add_request(prompt, params)
    run(sim, [])
    check_idle(sim)
    assert (req.output_ids, req.finish_reason) == (oracle(prompt, longer, 0)[0][:2], "length")
    assert [t.logprob for t in req.output_logprobs] == [-1.0, 0.0]
    check_sample(sim, req, prompt, params, 0)


# --- regressions: scheduler bugs the sim found ----------------------------------------------------
def check_run(sim: Sim, arrivals: list[Arrival], aborts: Sequence[tuple] = ()) -> None:
    top = run(sim, arrivals, aborts)
    check_idle(sim)
    check_outputs(sim, arrivals, top)


@pytest.mark.parametrize("overlap", [False, True])
def test_forced_tokens_after_a_fork_reach_the_outputs(overlap: bool, monkeypatch) -> None:
    """The worker jump-forwards after each child's first token; Scheduler._fork used to append
    the token but not the forced ones, so the two views of the child's tokens parted."""
    params = SamplingParams(max_tokens=8, n=2, regex=f"{JUMP}3")
    prompt = find_prompt(params, lambda out, reason, lps: lps[:2] == [-1.0, 0.0])
    check_run(make_sim(256, overlap=overlap), [Arrival(0, tuple(prompt), params)])


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("case", ["re-point", "recompute", "swap", "abort"])
def test_parent_forking_in_flight_is_left_alone(case: str, overlap: bool, monkeypatch) -> None:
    """With step t (an n > 1 parent's last prefill chunk, which forks it) in flight, plan t+1
    used to re-point the parent's slots, preempt it, or abort it without its children. Now a
    fork step is folded in before the next plan, and an abort waits for the children."""
    once, aborts = SamplingParams(max_tokens=1), []
    if case == "re-point":
        sim = make_sim(64, overlap=overlap, page_size=1, max_num_batched_tokens=16)
        arrivals = [Arrival(0, (1,) * 9, once), Arrival(0, (1,) * 9, once.with_(n=2))]
    elif case == "abort":
        sim = make_sim(64, overlap=overlap, page_size=1)
        arrivals = [Arrival(0, (1,) * 8, SamplingParams(max_tokens=4, n=2, ignore_eos=True))]
        aborts = [(1, 0)]
    else:
        sim = make_sim(16, overlap=overlap, page_size=1, preemption=case)
        arrivals = [Arrival(0, (2,) * 4, SamplingParams(max_tokens=8, ignore_eos=True)),
                    Arrival(4, (1,) * 8, SamplingParams(max_tokens=2, n=2, ignore_eos=True))]
    check_run(sim, arrivals, aborts)
    if case in ("recompute", "swap"):  # the pool of 16 forces a preemption of that kind
        stats = sim.sched.stats
        assert stats.preemptions > 0 and (stats.swaps > 0) == (case == "swap")


@pytest.mark.parametrize("overlap", [False, True])
def test_prompt_logprobs_of_a_chunk_in_flight_at_a_preemption(overlap: bool, monkeypatch) -> None:
    """The prompt-logprobs request is preempted (recompute) and re-admitted by the plan made
    while its chunk is in flight; that chunk's results are stale (the request's epoch moved on)
    and must not be folded in (they were: 27 prompt logprobs for 23 prompt tokens)."""
    sim = make_sim(28, overlap=overlap, page_size=1, max_num_batched_tokens=16)
    check_run(sim, [Arrival(0, (2,) * 4, SamplingParams(max_tokens=8, ignore_eos=True)),
                    Arrival(0, (1,) * 24, SamplingParams(max_tokens=1, prompt_logprobs_start=0))])


@pytest.mark.parametrize("overlap, first, second", [(False, 40, 41), (True, 16, 33)])
def test_a_duplicate_prefix_is_deduped_before_a_request_fails(
    overlap: bool, first: int, second: int, monkeypatch
) -> None:
    """B (second + 1 slots of 48) computes part of A's prefix again (admitted while A prefills
    it). The dedupe that hands its duplicate pages back runs at the end of a later plan; B's next
    chunk, which cannot get a page before that, now waits instead of failing with 'the KV pool is
    too small'."""
    once = SamplingParams(max_tokens=1)
    sim = make_sim(48, overlap=overlap, page_size=1, max_num_batched_tokens=16)
    check_run(sim, [Arrival(0, (1,) * first, once), Arrival(0, (1,) * second, once)])
