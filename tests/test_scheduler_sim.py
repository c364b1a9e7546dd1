"""The scheduler against a simulated worker: no model, no tensors.

`SimWorker` keeps what the real worker keeps (each request's token ids and slot table, host copies
of swapped-out KV), applies a plan's parts in StepPlan field order and checks every invariant it
can on the way. Its "KV" is a dict slot -> hash of the token prefix ending at that position, so a
run that reads a wrongly shared, wrongly copied or wrongly swapped slot is caught. It "samples" a
token that is a pure function of the token sequence, so the outputs of a request set are the same
under every configuration and equal an oracle computed without any scheduler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st

from radixrt.runtime.config import EngineConfig
from radixrt.runtime.messages import (
    Run,
    RunResult,
    StepPlan,
    StepResult,
    TokenLogprob,
    WorkerRequest,
)
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.scheduler.request import Phase, Request
from radixrt.runtime.scheduler.scheduler import Scheduler

VOCAB = 24
EOS = 0
CONTEXT = 256
MAX_STEPS = 3000
# Known bug (see test_duplicate_prefix_does_not_double_a_requests_footprint): a request whose
# prefix was computed twice (by a concurrent prefill, or because prompt logprobs kept it from the
# cache) locks the tree's copy and keeps its own, and can end with "KV pool is too small" though it
# fits. While True the random tests accept that error (and skip those samples' outputs); set it to
# False once the bug is fixed.
TOLERATE_POOL_TOO_SMALL = False
POOL_TOO_SMALL = "error: the KV pool is too small for this request"
# Known bug (see test_request_swapped_in_is_not_preempted_in_the_same_step): a request swapped in
# by a plan is also swapped out (or freed) by the same plan. While True the random tests discard
# such examples instead of failing; set it to False once the bug is fixed.
TOLERATE_SWAP_IN_PREEMPTED = False


class SwapInPreempted(AssertionError):
    """A plan swaps a request in and also swaps it out or frees it."""


_MASK = (1 << 61) - 1


def _mix(h: int, token: int) -> int:
    return (h * 1_000_003 + token + 7) & _MASK


def prefix_hashes(ids: Sequence[int], into: list[int]) -> list[int]:
    """into[p] = hash of ids[:p + 1] (extended in place: only the new positions are hashed)."""
    h = into[-1] if into else 0x9E3779B9
    for t in ids[len(into) :]:
        h = _mix(h, t)
        into.append(h)
    return into


def sample_token(last_hash: int, num_out: int, seed_offset: int, params: SamplingParams) -> int:
    """The simulated model: a token from the whole sequence's hash; stop tokens masked while
    fewer than min_tokens exist, as the real sampler does."""
    token = _mix(last_hash, 1000 + seed_offset) % VOCAB
    banned = set(params.stop_token_ids) | {EOS} if num_out < params.min_tokens else set()
    while token in banned:
        token = (token + 1) % VOCAB
    return token


def finish_reason(output: list[int], num_tokens: int, params: SamplingParams) -> str | None:
    """The stopping rule, written independently of Scheduler._finish_reason."""
    token = output[-1]
    if len(output) >= params.min_tokens and (
        token in params.stop_token_ids or (token == EOS and not params.ignore_eos)
    ):
        return "stop"
    if len(output) >= params.max_tokens or num_tokens >= CONTEXT:
        return "length"
    return None


def oracle(prompt: list[int], params: SamplingParams, seed_offset: int) -> tuple[list[int], str]:
    """What sample `seed_offset` of `prompt` must produce, computed without a scheduler."""
    ids = list(prompt)
    hashes: list[int] = []
    while True:
        prefix_hashes(ids, hashes)
        ids.append(sample_token(hashes[-1], len(ids) - len(prompt), seed_offset, params))
        reason = finish_reason(ids[len(prompt) :], len(ids), params)
        if reason is not None:
            return ids[len(prompt) :], reason


# --- the simulated worker ----------------------------------------------------------------------
@dataclass
class SimState:
    params: SamplingParams
    token_ids: list[int]
    prompt_len: int
    seed_offset: int
    slots: list[int]
    hashes: list[int] = field(default_factory=list)

    def expected(self, end: int) -> list[int]:
        """The KV content positions 0 .. end-1 must hold."""
        return prefix_hashes(self.token_ids, self.hashes)[:end]


class SimWorker:
    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.kv: dict[int, int] = {}  # slot -> prefix hash of the position written there
        self.states: dict[int, SimState] = {}
        self.host: dict[int, list[int]] = {}  # swapped-out KV by rid
        self.tokens_computed = 0
        self.copies = 0
        self.repoints = 0

    def _check_table(self, rid: int, upto: int | None = None) -> None:
        state = self.states[rid]
        end = len(state.slots) if upto is None else upto
        got = [self.kv.get(s) for s in state.slots[:end]]
        want = state.expected(end)
        bad = [p for p in range(end) if got[p] != want[p]]
        assert not bad, f"request {rid}: KV of positions {bad[:8]} holds the wrong tokens"

    def _owners(self) -> dict[int, tuple[int, int]]:
        """slot -> (rid, position) over every live slot table; a slot shared by several tables
        (radix prefix, fork) must sit at the same position in each."""
        owners: dict[int, tuple[int, int]] = {}
        for rid, state in self.states.items():
            assert len(set(state.slots)) == len(state.slots), f"request {rid}: slot used twice"
            for pos, slot in enumerate(state.slots):
                assert 0 <= slot < self.num_slots, f"request {rid}: slot {slot} out of range"
                other = owners.setdefault(slot, (rid, pos))
                where = f"slot {slot}: position {pos} of {rid}, {other[1]} of {other[0]}"
                assert other[1] == pos, where
        return owners

    def execute(self, plan: StepPlan) -> StepResult:
        swapped_in = {s.rid for s in plan.swap_in}
        both = swapped_in & ({s.rid for s in plan.swap_out} | set(plan.free))
        if both:
            raise SwapInPreempted(f"step {plan.step_id} swaps in and preempts {sorted(both)}")
        for swap in plan.swap_out:
            state = self.states.get(swap.rid)
            assert state is not None and swap.rid not in self.host, f"swap_out of {swap.rid}"
            assert swap.slots == state.slots, f"swap_out of {swap.rid}: not its slot table"
            self._check_table(swap.rid)
            self.host[swap.rid] = [self.kv[s] for s in swap.slots]
            state.slots = []
        for rid in plan.free:
            assert rid in self.states or rid in self.host, f"free of unknown request {rid}"
            self.states.pop(rid, None)
            self.host.pop(rid, None)
        for new in plan.new_requests:
            self._new_request(new)
        owners = self._owners()
        for copy in plan.copies:
            table = self.states[copy.rid].slots
            assert len(copy.src) == len(copy.dst) > 0
            if copy.src == copy.dst:  # re-point onto shared pages holding the same tokens
                end = copy.start + len(copy.dst)
                expected = self.states[copy.rid].expected(end)[copy.start :]
                assert [self.kv.get(d) for d in copy.dst] == expected, f"re-point {copy.rid}"
                table[copy.start : end] = copy.dst
                self.repoints += 1
                owners = self._owners()
                continue
            assert table[copy.start :] == copy.src, f"copy for {copy.rid}: src is not its tail"
            for slot in copy.dst:
                assert slot not in owners, f"copy for {copy.rid} into live slot {slot}"
            self.copies += 1
            for s, d in zip(copy.src, copy.dst):
                self.kv[d] = self.kv[s]
            table[copy.start :] = copy.dst
            owners = self._owners()
        for swap in plan.swap_in:
            data = self.host.pop(swap.rid, None)
            state = self.states.get(swap.rid)
            assert data is not None and state is not None, f"swap_in of {swap.rid}: not swapped"
            assert not state.slots and len(swap.slots) == len(data), f"swap_in of {swap.rid}"
            assert data == state.expected(len(data)), f"swap_in of {swap.rid}: data changed"
            for slot in swap.slots:
                assert slot not in owners, f"swap_in of {swap.rid} into live slot {slot}"
            for slot, value in zip(swap.slots, data):
                self.kv[slot] = value
            state.slots = list(swap.slots)
            owners = self._owners()
        return self._forward(plan, owners)

    def _new_request(self, new: WorkerRequest) -> None:
        assert new.rid not in self.states and new.rid not in self.host, f"{new.rid} known"
        ids = list(new.prompt_ids) + list(new.output_ids)
        assert len(new.prefix_slots) < len(ids), f"{new.rid}: prefix leaves nothing to compute"
        params = SamplingParams.from_dict(new.params)
        self.states[new.rid] = SimState(
            params, ids, len(new.prompt_ids), new.seed_offset, list(new.prefix_slots)
        )
        self._check_table(new.rid)

    def _forward(self, plan: StepPlan, owners: dict[int, tuple[int, int]]) -> StepResult:
        written: set[int] = set()
        assert len({r.rid for r in plan.runs}) == len(plan.runs), "a request runs twice"
        for run in plan.runs:
            state = self.states.get(run.rid)
            assert state is not None and run.rid not in self.host, f"run of {run.rid}"
            assert len(state.slots) == run.start, (
                f"run of {run.rid} starts at {run.start}, its slot table has {len(state.slots)}"
            )
            assert run.num_new == len(run.new_slots) >= 1
            end = run.start + run.num_new
            assert end <= len(state.token_ids), f"run of {run.rid} past its known tokens"
            assert run.sample == (end == len(state.token_ids)), f"run of {run.rid}: sample flag"
            assert not run.fork_into or run.sample
            for slot in run.new_slots:
                assert 0 <= slot < self.num_slots, f"run of {run.rid}: slot {slot} out of range"
                assert slot not in owners, f"run of {run.rid} writes slot {slot} of {owners[slot]}"
                assert slot not in written, f"run of {run.rid}: slot {slot} written twice"
                written.add(slot)
            self._check_table(run.rid)
        results: list[RunResult] = []
        for run in plan.runs:
            state = self.states[run.rid]
            state.slots.extend(run.new_slots)
            hashes = state.expected(run.start + run.num_new)
            for i, slot in enumerate(run.new_slots):
                self.kv[slot] = hashes[run.start + i]
            self.tokens_computed += run.num_new
            results += self._results(run, state)
        return StepResult(plan.step_id, results, sum(r.num_new for r in plan.runs))

    def _results(self, run: Run, state: SimState) -> list[RunResult]:
        prompt: list[TokenLogprob] = []
        if run.prompt_logprob_from >= 0:
            first = max(run.start, run.prompt_logprob_from - 1)
            last = min(run.start + run.num_new, state.prompt_len - 1)
            prompt = [TokenLogprob(t, 0.0) for t in state.token_ids[first + 1 : last + 1]]
        if not run.sample:
            return [RunResult(run.rid, prompt_logprobs=prompt)] if prompt else []
        last_hash = state.hashes[len(state.token_ids) - 1]
        num_out = len(state.token_ids) - state.prompt_len
        if not run.fork_into:
            token = sample_token(last_hash, num_out, state.seed_offset, state.params)
            state.token_ids.append(token)
            return [RunResult(run.rid, TokenLogprob(token, 0.0), prompt)]
        del self.states[run.rid]
        results = []
        for i, child in enumerate(run.fork_into):
            assert child not in self.states and child not in self.host, f"fork into {child}"
            params = state.params.with_(n=1)
            token = sample_token(last_hash, num_out, i, params)
            ids = state.token_ids + [token]
            self.states[child] = SimState(params, ids, state.prompt_len, i, list(state.slots))
            results.append(RunResult(child, TokenLogprob(token, 0.0)))
        return results + [RunResult(run.rid, prompt_logprobs=prompt)]


# --- driving the scheduler ---------------------------------------------------------------------
@dataclass(frozen=True)
class Arrival:
    step: int
    prompt: tuple[int, ...]
    params: SamplingParams


@dataclass
class Sim:
    sched: Scheduler
    worker: SimWorker
    reported: set[int] = field(default_factory=set)  # finished requests the engine was told of
    aborted: set[int] = field(default_factory=set)
    steps: int = 0


def make_sim(pool_tokens: int, **options: object) -> Sim:
    config = EngineConfig(max_total_tokens=pool_tokens, **options)  # type: ignore[arg-type]
    num_pages = max(pool_tokens // config.page_size, 2)
    sched = Scheduler(config, num_pages, CONTEXT, [EOS])
    sched.kv.tree._clock = lambda: 0.0  # LRU by access order only: reproducible runs
    return Sim(sched, SimWorker(num_pages * config.page_size))


def cross_check(sim: Sim) -> None:
    """The scheduler's view of every request agrees with the worker's."""
    sched, worker = sim.sched, sim.worker
    sched.check_integrity()
    for req in sched.running:
        state = worker.states.get(req.rid)
        assert state is not None and req.rid not in worker.host, f"running {req.rid} unknown"
        assert state.token_ids == req.all_ids, f"request {req.rid}: token ids differ"
        assert state.slots == sched.kv.slots(req, 0, req.kv_len), f"request {req.rid}: slots"
    for req in sched.swapped:
        assert len(worker.host.get(req.rid, ())) == req.kv_len_swapped, f"swapped {req.rid}"
        assert worker.states[req.rid].token_ids == req.all_ids
    live = {r.rid for r in sched.running} | {r.rid for r in sched.swapped}
    for rid in set(worker.states) | set(worker.host):
        req = sched.requests[rid]
        assert rid in live or req.finished, f"worker holds {rid} ({req.phase.value})"


def step(sim: Sim) -> None:
    """One Engine.step: schedule -> worker -> process_results, then every check."""
    plan = sim.sched.schedule()
    if plan is None:
        touched = sim.sched.take_finished_outside_step()
    else:
        touched = sim.sched.process_results(plan, sim.worker.execute(plan))
    sim.reported |= {r.rid for r in touched if r.finished}
    sim.steps += 1
    cross_check(sim)


def run(sim: Sim, arrivals: Sequence[Arrival], aborts: Sequence[tuple[int, int]] = ()) -> list:
    """Submit at the planned steps, abort at the planned steps, step until idle (pending frees
    included). Returns the top-level requests in arrival order."""
    top: list[Request] = []
    queue = sorted(arrivals, key=lambda a: a.step)
    while True:
        while queue and queue[0].step <= sim.steps:
            a = queue.pop(0)
            top.append(sim.sched.add_request(list(a.prompt), a.params))
        for when, pick in aborts:
            live = [r for r in sim.sched.requests.values() if not r.finished]
            if when == sim.steps and live:
                done = sim.sched.abort(live[pick % len(live)].rid)
                sim.reported |= {r.rid for r in done}
                sim.aborted |= {r.rid for r in done}
                cross_check(sim)
        if not queue and not sim.sched.has_work:
            break
        assert sim.steps < MAX_STEPS, f"hang: {describe(sim)}"
        step(sim)
    step(sim)  # nothing left: a no-op step must stay a no-op
    return top


def describe(sim: Sim) -> str:
    s = sim.sched
    phases = {r.rid: (r.phase.value, r.kv_len, r.num_tokens) for r in s.requests.values()}
    return f"waiting/running/swapped {len(s.waiting)}/{len(s.running)}/{len(s.swapped)}: {phases}"


def check_idle(sim: Sim) -> None:
    sched = sim.sched
    assert not (sched.waiting or sched.running or sched.swapped) and sched.swap_used == 0
    counters = sched.kv.counters([])
    assert counters.private == 0 and counters.locked == 0
    assert counters.free + counters.evictable == counters.total
    assert not sim.worker.states and not sim.worker.host, "the worker still holds requests"
    for req in sched.requests.values():
        assert req.finished and req.rid in sim.reported, f"request {req.rid} never reported"


def never_fits(sim: Sim, a: Arrival) -> bool:
    p = a.params
    need = len(a.prompt) + p.n * (p.max_tokens + sim.sched.kv.page_size)
    return need > sim.sched.kv.capacity_tokens


def check_outputs(sim: Sim, arrivals: Sequence[Arrival], top: list[Request]) -> list:
    """Every sample equals the oracle (a prefix of it when aborted); returns the outputs."""
    outputs = []
    for a, req in zip(sorted(arrivals, key=lambda x: x.step), top):
        assert tuple(req.prompt_ids) == a.prompt
        reason = req.finish_reason or ""
        assert (reason == "abort") == (req.rid in sim.aborted), (req.rid, reason)
        if reason != "abort" and not (TOLERATE_POOL_TOO_SMALL and reason == POOL_TOO_SMALL):
            assert reason.startswith("error") == never_fits(sim, a), (req.rid, reason)
        samples = [req] if a.params.n == 1 else []
        if reason == "forked":
            samples = [sim.sched.requests[c] for c in sim.sched.children[req.rid]]
            assert len(samples) == a.params.n
        elif a.params.n > 1:
            assert reason == "abort" or reason.startswith("error"), (req.rid, reason)
        for i, sample in enumerate(samples):
            want, want_reason = oracle(list(a.prompt), a.params, i)
            got, got_reason = sample.output_ids, sample.finish_reason or ""
            if sample is not req and got_reason.startswith("error"):
                assert TOLERATE_POOL_TOO_SMALL and got_reason == POOL_TOO_SMALL, got_reason
            if got_reason == "abort" or got_reason.startswith("error"):
                assert got == want[: len(got)], f"request {sample.rid}: output is not the oracle's"
            else:
                assert (got, got_reason) == (want, want_reason), f"request {sample.rid}"
        start = a.params.prompt_logprobs_start
        if start is not None and reason in ("length", "stop", "forked"):
            assert [t.token_id for t in req.prompt_logprobs] == list(a.prompt[max(start, 1) :])
        outputs.append([(s.output_ids, s.finish_reason) for s in samples] + [reason])
    return outputs


# --- strategies --------------------------------------------------------------------------------
prompt_tokens = st.integers(1, 8)


@st.composite
def request_sets(draw: st.DrawFn, max_requests: int = 10) -> list[Arrival]:
    bases = draw(st.lists(st.lists(prompt_tokens, min_size=8, max_size=48), min_size=1, max_size=3))
    arrivals = []
    for _ in range(draw(st.integers(2, max_requests))):
        base = bases[draw(st.integers(0, len(bases) - 1))]
        prompt = tuple(base) + tuple(draw(st.lists(prompt_tokens, min_size=1, max_size=12)))
        max_tokens = draw(st.integers(1, 24))
        params = SamplingParams(
            max_tokens=max_tokens,
            min_tokens=draw(st.integers(0, max_tokens)) if draw(st.booleans()) else 0,
            n=draw(st.sampled_from([1, 1, 1, 2, 3])),
            stop_token_ids=draw(st.lists(st.integers(0, VOCAB - 1), max_size=2)),
            ignore_eos=draw(st.booleans()),
            prompt_logprobs_start=draw(st.none() | st.integers(0, 12)),
        )
        arrivals.append(Arrival(draw(st.integers(0, 20)), prompt, params))
    return arrivals


@st.composite
def configs(draw: st.DrawFn) -> dict:
    return dict(
        page_size=draw(st.sampled_from([1, 4, 16])),
        schedule_policy=draw(st.sampled_from(["fcfs", "lpm", "dfs-weight"])),
        preemption=draw(st.sampled_from(["recompute", "swap"])),
        disable_radix_cache=draw(st.booleans()),
        max_num_batched_tokens=draw(st.integers(16, 64)),
        max_running_requests=draw(st.sampled_from([4, 256, 2])),
        swap_space_tokens=draw(st.sampled_from([1 << 16, 48, 0])),
    )


SIM_SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def check_scenario(
    arrivals: list[Arrival], config: dict, pool_tokens: int, aborts: list[tuple[int, int]]
) -> None:
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


@SIM_SETTINGS
@given(
    arrivals=request_sets(),
    config=configs(),
    pool_tokens=st.integers(64, 192),
    aborts=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 99)), max_size=3),
)
def test_random_streams_keep_every_invariant(
    arrivals: list[Arrival], config: dict, pool_tokens: int, aborts: list[tuple[int, int]]
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


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arrivals=request_sets(),
    config=configs(),
    pool_tokens=st.integers(48, 128),
    aborts=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 99)), max_size=2),
)
def test_tight_pools_with_swapping_keep_every_invariant(
    arrivals: list[Arrival], config: dict, pool_tokens: int, aborts: list[tuple[int, int]]
) -> None:
    """The same checks where memory is short: preemption by swap on almost every example."""
    check_scenario(arrivals, dict(config, preemption="swap", swap_space_tokens=1 << 16),
                   pool_tokens, aborts)


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
    """Page size, radix cache on/off, policy, preemption mode, budget and pool size change how a
    request set is run, never what it produces."""
    def need(a: Arrival) -> int:
        return len(a.prompt) + a.params.n * (a.params.max_tokens + 16)

    fits = max(need(a) for a in arrivals)
    fits = max(-(-fits // 16) * 16, 32)  # whole pages of every page size
    reference = outputs_of(arrivals, 1 << 12, dict(page_size=1, disable_radix_cache=True))
    for config, extra in variants:
        got = outputs_of(arrivals, fits + extra, config)
        for i, (want, have) in enumerate(zip(reference, got)):
            reasons = {r for sample in have[:-1] for r in sample[1:]} | {have[-1]}
            if TOLERATE_POOL_TOO_SMALL and POOL_TOO_SMALL in reasons:
                continue
            assert have == want, f"request {i} under {config}, pool {fits + extra}"


# --- n > 1 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("disable_radix_cache", [False, True])
@pytest.mark.parametrize("prompt_len", [10, 12])
def test_fork_shares_prompt_pages_and_copies_only_a_partial_last_page(
    prompt_len: int, disable_radix_cache: bool
) -> None:
    sim = make_sim(256, page_size=4, disable_radix_cache=disable_radix_cache)
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
    plan = sim.sched.schedule()
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
    sim.sched.process_results(plan, sim.worker.execute(plan))
    cross_check(sim)
    assert all(refcount(c.pages[-1]) == 1 for c in children)
    top = run(sim, [])
    assert top == []
    check_idle(sim)
    for i, child in enumerate(children):
        assert (child.output_ids, child.finish_reason) == oracle(prompt, params, i)


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


def test_request_swapped_in_is_not_preempted_in_the_same_step() -> None:
    sim = make_sim(64, page_size=1, max_num_batched_tokens=16, preemption="swap")
    once = SamplingParams(max_tokens=1)
    logprobs = once.with_(prompt_logprobs_start=0)
    arrivals = [
        Arrival(0, (1,) * 42, SamplingParams(max_tokens=9)),
        Arrival(0, (1,) * 32, logprobs),
        Arrival(0, (2,) + (1,) * 12 + (6,), once),
        Arrival(0, (2,) + (1,) * 13, once),
        Arrival(1, (1,) * 18, logprobs),
        Arrival(7, (2,) + (1,) * 15, once),
    ]
    top = run(sim, arrivals)  # step 12 swaps requests 1, 4, 5 in, then 5 out again
    check_idle(sim)
    check_outputs(sim, arrivals, top)
