"""A simulated worker and a driver for the scheduler simulation
(tests/runtime/scheduler/test_scheduler_sim.py).

`SimWorker` keeps what the real worker keeps (each request's token ids and slot table, host copies
of swapped-out KV), applies a plan's parts in StepPlan field order and checks every invariant it
can on the way. Its "KV" is a dict slot -> hash of the token prefix ending at that position, so a
run that reads a wrongly shared, wrongly copied or wrongly swapped slot is caught. It "samples" a
token that is a pure function of the token sequence, so the outputs of a request set are the same
under every configuration and equal an oracle computed without any scheduler.

Jump-forward: a request whose params carry a `regex` of the form "sim-jf-<d>" is "constrained";
after each sampled token its simulated grammar may force 1..4 more tokens (with probability d/4,
the last one sometimes EOS), again a pure function of the token sequence. The worker appends them
at once and reports them in RunResult.forced, exactly as Worker._sample / after_sample do; a run
that ends before the worker's last token (overlap: the scheduler planned it before it knew the
forced tokens) "samples" the token already known and appends nothing.

The driver runs the production step loop (radixrt/runtime/scheduler/loop.py), the one the
Engine and the scheduler process run, with the simulated worker as its executor, overlap on or
off. Aborts "while a step is in flight" happen where the scheduler process takes them in: while
the loop waits for a result.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from radixrt.runtime.config import PLACEHOLDER_TOKEN, EngineConfig
from radixrt.runtime.messages import (
    DEVICE_TIER,
    Run,
    RunResult,
    Scheduling,
    StepPlan,
    StepResult,
    TokenLogprob,
    WorkerRequest,
)
from radixrt.runtime.models.lora_format import module_shapes
from radixrt.runtime.pooling_params import pack_floats
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.scheduler.loop import StepLoop
from radixrt.runtime.scheduler.planner import POOL_TOO_SMALL as PLANNER_POOL_TOO_SMALL
from radixrt.runtime.scheduler.request import Phase, Request
from radixrt.runtime.scheduler.scheduler import Scheduler

VOCAB = 24
LORA_NAMES = ("l0", "l1", "l2")  # make_sim(loras=k): the first k, Scheduling(lora=name)
SIM_LORA_RANK = 2
SIM_LORA_SHAPES = module_shapes(hidden=8, q_rows=8, kv_rows=4, intermediate=16,
                                dense_mlp_layers=[0], num_layers=1)
EOS = 0
CONTEXT = 256
MAX_STEPS = 3000
POOL_MODULUS = 1_000_003  # a pooled "vector": the prompt's last prefix hash, mod this
SAMPLED = -1.0  # logprob the simulated sampler reports (forced tokens: 0.0)
SCORED = -2.0  # logprob of a token scored, not sampled (the scheduler must skip that result)
JUMP = "sim-jf-"  # regex prefix marking a constrained request; the digit is its forcing density
# Switches for scheduler bugs the sim found (all fixed; kept so a regression can be studied with
# the old workaround on): the simulated grammar forces tokens right after a fork; a request that
# fits never ends with "KV pool is too small"; prompt logprobs are checked for requests preempted
# with overlap.
FORCE_AFTER_FORK = True
TOLERATE_POOL_TOO_SMALL = False
POOL_TOO_SMALL = f"error: {PLANNER_POOL_TOO_SMALL}"
# A request swapped in by a plan is never also swapped out (or freed) by the same plan.
TOLERATE_SWAP_IN_PREEMPTED = False
TOLERATE_STALE_PROMPT_LOGPROBS = False


class SwapInPreempted(AssertionError):
    """A plan swaps a request in and also swaps it out or frees it."""


_MASK = (1 << 61) - 1


def _mix(h: int, token: int) -> int:
    return (h * 1_000_003 + token + 7) & _MASK


BASE_SEED = 0x9E3779B9  # the hash of the empty sequence under the base model


def lora_seed(key: str | None) -> int:
    """The hash of the empty sequence under LoRA adapter `key`: another adapter's KV of the
    same tokens is other KV (and samples other tokens)."""
    return BASE_SEED if key is None else _mix(BASE_SEED, int(key[:12], 16))


def prefix_hashes(ids: Sequence[int], into: list[int], seed: int = BASE_SEED) -> list[int]:
    """into[p] = hash of ids[:p + 1] (extended in place: only the new positions are hashed);
    seed: the hash before the first token (the adapter's, lora_seed)."""
    h = into[-1] if into else seed
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


def forced_chain(last_hash: int, num_out: int, seed_offset: int, params: SamplingParams) -> list:
    """The simulated grammar: the tokens it forces after a sampled token (last_hash covers it;
    num_out outputs exist), cut at max_tokens as after_sample does. Nothing after EOS."""
    density = int(params.regex[len(JUMP) :]) if params.regex else 0
    h = _mix(last_hash, 2000 + seed_offset)
    if h % 4 >= density:
        return []
    chain = [1 + (h >> (8 + 5 * i)) % (VOCAB - 1) for i in range(1 + (h >> 2) % 4)]
    if (h >> 40) % 4 == 0:
        chain[-1] = EOS
    return chain[: max(params.max_tokens - num_out, 0)]


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


def oracle_logprobs(
    prompt: list[int], params: SamplingParams, seed_offset: int, seed: int = BASE_SEED
) -> tuple[list[int], str, list[float]]:
    """What sample `seed_offset` of `prompt` must produce (tokens, finish reason, logprobs: 0.0
    where forced), computed without a scheduler. max_tokens 0 (prefill only): nothing."""
    if params.max_tokens == 0:
        return [], "length", []
    ids, lps = list(prompt), []
    hashes: list[int] = []
    while True:
        prefix_hashes(ids, hashes, seed)
        ids.append(sample_token(hashes[-1], len(ids) - len(prompt), seed_offset, params))
        lps.append(SAMPLED)
        forced = []
        if ids[-1] != EOS and (params.n == 1 or len(lps) > 1 or FORCE_AFTER_FORK):
            forced = forced_chain(prefix_hashes(ids, hashes, seed)[-1], len(lps), seed_offset,
                                  params)
        for token in [None, *forced]:
            if token is not None:
                ids.append(token)
                lps.append(0.0)
            reason = finish_reason(ids[len(prompt) :], len(ids), params)
            if reason is not None:
                return ids[len(prompt) :], reason, lps


def pooled_value(last_hash: int) -> bytes:
    return pack_floats([float(last_hash % POOL_MODULUS)])


def oracle(prompt: list[int], params: SamplingParams, seed_offset: int) -> tuple[list[int], str]:
    return oracle_logprobs(prompt, params, seed_offset)[:2]


# --- the simulated worker ----------------------------------------------------------------------
@dataclass
class SimState:
    params: SamplingParams
    token_ids: list[int]
    prompt_len: int
    seed_offset: int
    slots: list[int]
    hashes: list[int] = field(default_factory=list)
    forced_at: int = -1  # where the last forced chain starts, until the request's next run
    seed: int = BASE_SEED  # its LoRA adapter's (lora_seed)
    lora: str | None = None  # its LoRA adapter's key
    pooled_rows: int = 0  # a pooling request: the prompt rows this state computed

    def expected(self, end: int) -> list[int]:
        """The KV content positions 0 .. end-1 must hold."""
        return prefix_hashes(self.token_ids, self.hashes, self.seed)[:end]


class SimWorker:
    def __init__(self, num_slots: int, page_size: int = 1) -> None:
        self.num_slots = num_slots
        self.page_size = page_size
        self.kv: dict[int, int] = {}  # slot -> prefix hash of the position written there
        # KV tiers: (tier, slot) -> what the lower tier's slot holds; pages moved, by direction
        self.lower: dict[tuple[int, int], int | None] = {}
        self.moved: dict[tuple[int, int], int] = {}
        self.states: dict[int, SimState] = {}
        self.host: dict[int, list[int]] = {}  # swapped-out KV by rid
        self.produced: dict[int, list[TokenLogprob]] = {}  # every token reported, by rid
        self.tokens_computed = 0
        self.copies = 0
        self.repoints = 0
        self.forced = 0  # tokens appended by jump-forward
        self.known = 0  # runs that "sampled" a token jump-forward had appended already
        self.shared_reads_saved = 0  # prefix positions cascade attention reads once, not twice
        self.drafted = 0  # speculative decoding: tokens drafted, and accepted
        self.accepted = 0
        self.trees = 0  # drafts with branches, and tokens accepted off their main line
        self.branch_accepted = 0
        self.loras: set[str] = set()  # LoRA adapters the plans registered (keys)
        self.max_loras_per_batch = 0  # 0: no adapters
        self.adapters_per_batch = 0  # the most one plan's runs mixed

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
        self._move(plan)
        self.loras |= {a.key for a in plan.lora_loads}
        for key in plan.lora_unloads:
            assert not any(st.lora == key for st in self.states.values()), f"{key} in use"
            self.loras.discard(key)
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

    def _move(self, plan: StepPlan) -> None:
        """KV tiers: each PageMove in order, copying what the source pages hold (a page one move
        frees may be the page a later one fills). A load-back never lands on a live slot (one
        of a request this plan frees is not live: its pages went back to the pool)."""
        if not plan.moves:
            return
        freed = set(plan.free)
        owners = {slot: owner for slot, owner in self._owners().items() if owner[0] not in freed}
        ps = self.page_size
        for move in plan.moves:
            assert len(move.src) == len(move.dst) > 0 and move.src_tier != move.dst_tier
            src = [p * ps + i for p in move.src for i in range(ps)]
            dst = [p * ps + i for p in move.dst for i in range(ps)]
            if move.src_tier == DEVICE_TIER:
                values = [self.kv.get(s) for s in src]
            else:
                values = [self.lower.get((move.src_tier, s)) for s in src]
            for slot, value in zip(dst, values, strict=True):
                if move.dst_tier == DEVICE_TIER:
                    assert slot not in owners, (f"a load-back into live slot {slot} of "
                                                f"{owners[slot]}, free {plan.free}")
                    if value is None:
                        self.kv.pop(slot, None)
                    else:
                        self.kv[slot] = value
                else:
                    self.lower[(move.dst_tier, slot)] = value
            key = (move.src_tier, move.dst_tier)
            self.moved[key] = self.moved.get(key, 0) + len(move.src)

    def _new_request(self, new: WorkerRequest) -> None:
        assert new.rid not in self.states and new.rid not in self.host, f"{new.rid} known"
        assert PLACEHOLDER_TOKEN not in new.output_ids, f"{new.rid}: placeholder sent"
        ids = list(new.prompt_ids) + list(new.output_ids)
        assert len(new.prefix_slots) < len(ids), f"{new.rid}: prefix leaves nothing to compute"
        resolved = new.params.resolved_max_tokens(len(new.prompt_ids), CONTEXT)
        assert new.max_tokens == resolved, f"{new.rid}: max_tokens {new.max_tokens} != {resolved}"
        assert new.lora is None or new.lora in self.loras, f"{new.rid}: adapter not loaded"
        self.states[new.rid] = SimState(
            new.params, ids, len(new.prompt_ids), new.seed_offset, list(new.prefix_slots),
            seed=lora_seed(new.lora), lora=new.lora,
        )
        self._check_table(new.rid)

    def _forward(self, plan: StepPlan, owners: dict[int, tuple[int, int]]) -> StepResult:
        written: set[int] = set()
        assert len({r.rid for r in plan.runs}) == len(plan.runs), "a request runs twice"
        adapters = {self.states[r.rid].lora for r in plan.runs} - {None}
        assert len(adapters) <= self.max_loras_per_batch, f"{len(adapters)} adapters in a step"
        self.adapters_per_batch = max(self.adapters_per_batch, len(adapters))
        for run in plan.runs:
            state = self.states.get(run.rid)
            assert state is not None and run.rid not in self.host, f"run of {run.rid}"
            assert len(state.slots) == run.start, (
                f"run of {run.rid} starts at {run.start}, its slot table has {len(state.slots)}"
            )
            assert run.num_new == len(run.new_slots) >= 1
            end = run.start + run.num_new - len(run.draft)
            assert end <= len(state.token_ids), f"run of {run.rid} past its known tokens"
            if run.draft:  # speculative: a decode or a prompt's last chunk, then the drafts
                assert run.sample and not run.fork_into and end == len(state.token_ids) \
                    and end > run.start, f"run of {run.rid}: a draft on no sampling run"
            if run.sample and end < len(state.token_ids):  # planned before a jump-forward
                assert end == state.forced_at and not run.fork_into, f"run of {run.rid}: known"
            else:
                reaches = end == len(state.token_ids)  # prefill only (max_tokens 0): no sample
                assert run.sample == (reaches and state.params.max_tokens != 0), (
                    f"{run.rid}: sample flag")
            assert not run.fork_into or run.sample
            for slot in run.new_slots:
                assert 0 <= slot < self.num_slots, f"run of {run.rid}: slot {slot} out of range"
                assert slot not in owners, f"run of {run.rid} writes slot {slot} of {owners[slot]}"
                assert slot not in written, f"run of {run.rid}: slot {slot} written twice"
                written.add(slot)
            self._check_table(run.rid)
        self._check_prefix_groups(plan)
        results: list[RunResult] = []
        for run in plan.runs:
            state = self.states[run.rid]
            state.slots.extend(run.new_slots)
            known = run.known_end - run.start
            hashes = prefix_hashes(state.token_ids, list(state.expected(run.start)), state.seed)
            for i, slot in enumerate(run.new_slots[:known]):
                self.kv[slot] = hashes[run.start + i]
            for i, slot in enumerate(run.new_slots[known:]):  # a draft node: its path's KV
                self.kv[slot] = prefix_hashes(state.token_ids + _path(run, i), list(hashes),
                                               state.seed)[-1]
            self.tokens_computed += run.num_new
            results += self._results(run, state)
        return StepResult(plan.step_id, results, sum(r.num_new for r in plan.runs))

    def _check_prefix_groups(self, plan: StepPlan) -> None:
        """Cascade attention reads a group's prefix from its first member's slots for all of
        them: every member must be a decode run whose table starts with those very slots."""
        runs = {run.rid: run for run in plan.runs}
        grouped: set[int] = set()
        for group in plan.prefix_groups:
            assert len(group.rids) >= 2 and group.length > 0, f"prefix group {group}"
            head = self.states[group.rids[0]].slots[: group.length]
            for rid in group.rids:
                run = runs.get(rid)
                assert run is not None and run.num_new == 1, f"group member {rid}: not a decode"
                assert group.length <= run.start, f"group of {group.length} past {rid}'s prefix"
                slots = self.states[rid].slots
                assert slots[: group.length] == head, f"group member {rid}: other slots"
                assert rid not in grouped, f"{rid} in two prefix groups"
                grouped.add(rid)
            self.shared_reads_saved += (len(group.rids) - 1) * group.length

    def _jump(self, rid: int, state: SimState) -> list[int]:
        """after_sample: the grammar's forced tokens after the one just appended."""
        if state.token_ids[-1] == EOS:
            return []
        last_hash = prefix_hashes(state.token_ids, state.hashes, state.seed)[-1]
        num_out = len(state.token_ids) - state.prompt_len
        forced = forced_chain(last_hash, num_out, state.seed_offset, state.params)
        state.forced_at = len(state.token_ids)
        state.token_ids += forced
        self.forced += len(forced)
        self.produced[rid] += [TokenLogprob(t, 0.0) for t in forced]
        return forced

    def _pooled(self, run: Run, state: SimState, whole_prompt: bool) -> list[RunResult]:
        """A pooling request: no sampling; its prompt's end returns the pooled "vector" (the
        last prefix hash), and a mean / CLS pooling must have computed every row itself."""
        assert not run.sample and not run.draft and not run.fork_into, f"{run.rid} samples"
        state.pooled_rows += run.num_new
        if run.start + run.num_new < state.prompt_len:
            return []
        if whole_prompt:
            assert state.pooled_rows == state.prompt_len, (
                f"{run.rid}: pooled {state.pooled_rows} of {state.prompt_len} rows (a cached "
                "prefix skipped rows that mean / CLS pooling reads)")
        return [RunResult(run.rid, pooled=pooled_value(state.hashes[state.prompt_len - 1]))]

    def _verify(self, run: Run, state: SimState, prompt: list[TokenLogprob]) -> RunResult:
        """Speculative decoding, as the worker verifies (worker/draft_verifier.py), written anew:
        sample after the last known token and after each drafted one while the samples match the
        draft; end at a mismatch, a stop token, or a token the simulated grammar forces after."""
        stops = {*state.params.stop_token_ids, *(() if state.params.ignore_eos else (EOS,))}
        ids = list(state.token_ids)
        hashes = list(state.hashes[: len(ids)])
        drawn: list[int] = []
        nodes: list[int] = []  # the accepted path through the draft tree
        parents = run.draft_parents or list(range(-1, len(run.draft) - 1))
        while True:
            token = sample_token(prefix_hashes(ids, hashes, state.seed)[-1],
                                 len(ids) - state.prompt_len, state.seed_offset, state.params)
            ids.append(token)
            drawn.append(token)
            at = nodes[-1] if nodes else -1
            child = next((i for i, (p, t) in enumerate(zip(parents, run.draft, strict=True))
                          if p == at and t == token), None)
            if child is None or token in stops:
                break
            after = forced_chain(prefix_hashes(ids, hashes, state.seed)[-1],
                                 len(ids) - state.prompt_len, state.seed_offset, state.params)
            if after:
                break
            nodes.append(child)
        self.drafted += len(run.draft)
        self.accepted += len(nodes)
        self.trees += bool(run.draft_parents)
        if nodes != list(range(len(nodes))):  # not the first nodes: a branch was taken
            self.branch_accepted += len(nodes)
        end = run.known_end
        for depth, node in enumerate(nodes):  # the accepted branch's KV moves to the chain's
            self.kv[state.slots[end + depth]] = self.kv[state.slots[end + node]]
        del state.slots[end + len(nodes) :]
        state.token_ids += drawn
        tokens = [TokenLogprob(t, SAMPLED) for t in drawn]
        self.produced.setdefault(run.rid, []).extend(tokens)
        return RunResult(run.rid, tokens[-1], prompt, self._jump(run.rid, state),
                         accepted=tokens[:-1])

    def _results(self, run: Run, state: SimState) -> list[RunResult]:
        pooling = state.params.pooling
        if pooling is not None:
            return self._pooled(run, state, pooling.whole_prompt)
        prompt: list[TokenLogprob] = []
        if run.prompt_logprob_from >= 0:
            first = max(run.start, run.prompt_logprob_from - 1)
            last = min(run.start + run.num_new, state.prompt_len - 1)
            prompt = [TokenLogprob(t, 0.0) for t in state.token_ids[first + 1 : last + 1]]
        forced_at, state.forced_at = state.forced_at, -1
        if not run.sample:
            return [RunResult(run.rid, prompt_logprobs=prompt)] if prompt else []
        end = run.start + run.num_new
        if end < len(state.token_ids):  # jump-forward appended it: score it, append nothing
            assert end == forced_at
            self.known += 1
            return [RunResult(run.rid, TokenLogprob(state.token_ids[end], SCORED), prompt)]
        last_hash = state.hashes[len(state.token_ids) - 1]
        num_out = len(state.token_ids) - state.prompt_len
        if run.draft:
            return [self._verify(run, state, prompt)]
        if not run.fork_into:
            token = TokenLogprob(sample_token(last_hash, num_out, state.seed_offset, state.params),
                                 SAMPLED)
            state.token_ids.append(token.token_id)
            self.produced.setdefault(run.rid, []).append(token)
            return [RunResult(run.rid, token, prompt, self._jump(run.rid, state))]
        del self.states[run.rid]
        results = []
        for i, child in enumerate(run.fork_into):
            assert child not in self.states and child not in self.host, f"fork into {child}"
            params = state.params.with_(n=1)
            token = TokenLogprob(sample_token(last_hash, num_out, i, params), SAMPLED)
            ids = state.token_ids + [token.token_id]
            self.states[child] = SimState(params, ids, state.prompt_len, i, list(state.slots),
                                          seed=state.seed, lora=state.lora)
            self.produced[child] = [token]
            forced = self._jump(child, self.states[child]) if FORCE_AFTER_FORK else []
            results.append(RunResult(child, token, forced=forced))
        return results + [RunResult(run.rid, prompt_logprobs=prompt)]


# --- driving the scheduler ---------------------------------------------------------------------
@dataclass(frozen=True)
class Arrival:
    step: int
    prompt: tuple[int, ...]
    params: SamplingParams
    scheduling: Scheduling = Scheduling()  # priority, tenant


class SimExecutor:
    """The StepExecutor over the simulated worker: a plan runs when it is submitted; `take`
    first runs the hook set for this turn (aborts while the step is in flight), as the scheduler
    process handles the tokenizer's messages while it waits for a result."""

    def __init__(self, worker: SimWorker) -> None:
        self.worker = worker
        self.results: list[StepResult] = []
        self.on_wait: Callable[[], None] | None = None

    def submit(self, plan: StepPlan) -> None:
        self.results.append(self.worker.execute(plan))

    def take(self) -> StepResult:
        hook, self.on_wait = self.on_wait, None
        if hook is not None:
            hook()
        return self.results.pop(0)


@dataclass
class Sim:
    sched: Scheduler
    worker: SimWorker
    loop: StepLoop
    executor: SimExecutor
    reported: set[int] = field(default_factory=set)  # finished requests the engine was told of
    aborted: set[int] = field(default_factory=set)
    steps: int = 0
    presolved_preempted: set[int] = field(default_factory=set)  # preempted, presolved in flight

    @property
    def overlap(self) -> bool:
        return self.loop.overlap

    @property
    def syncs(self) -> int:
        """overlap: folds forced by needs_sync before planning again."""
        return self.loop.syncs

    @property
    def in_flight(self) -> StepPlan | None:
        """The plan whose result the loop has not folded in yet (overlap)."""
        return self.loop.in_flight.oldest


def make_sim(pool_tokens: int, overlap: bool = False, disk_tier_tokens: int = 0,
             loras: int = 0, **options: object) -> Sim:
    """disk_tier_tokens: a disk KV tier of this size (its pages are bookkeeping and the
    simulated worker's dict, no directory; the host tier is config.host_cache_tokens).
    loras: LoRA adapters served (LORA_NAMES' first ones; real PEFT folders, tiny, checked
    against SIM_LORA_SHAPES), at most config.max_loras_per_batch in a step.
    Speculative decoding is off unless asked for (EngineConfig's default is on): tests that
    assert plans run for run check other mechanisms; the simulation's properties draw it."""
    options.setdefault("speculative_algorithm", None)
    if loras:
        folders = lora_folders()
        options["lora_paths"] = tuple(f"{n}={folders[n]}" for n in LORA_NAMES[:loras])
    config = EngineConfig(max_total_tokens=pool_tokens, **options)  # type: ignore[arg-type]
    num_pages = max(pool_tokens // config.page_size, 2)
    tiers = (config.host_cache_tokens // config.page_size, disk_tier_tokens // config.page_size)
    sched = Scheduler(config, num_pages, CONTEXT, [EOS], tier_pages=tiers,
                      lora_shapes=SIM_LORA_SHAPES if loras else None, lora_max_rank=SIM_LORA_RANK)
    sched.kv.tree._clock = lambda: 0.0  # LRU by access order only: reproducible runs
    worker = SimWorker(num_pages * config.page_size, config.page_size)
    worker.max_loras_per_batch = config.max_loras_per_batch if loras else 0
    executor = SimExecutor(worker)
    return Sim(sched, worker, StepLoop(sched, executor, overlap), executor)


@functools.lru_cache(maxsize=1)
def lora_folders() -> dict[str, str]:
    """LORA_NAMES as PEFT adapter folders (rank SIM_LORA_RANK on layer 0's q_proj of a model
    of SIM_LORA_SHAPES, each with its own weights: its own digest), in a directory that lives
    as long as the test process."""
    import torch
    from safetensors.torch import save_file

    root = tempfile.mkdtemp(prefix="radixrt-sim-lora-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    folders = {}
    for i, name in enumerate(LORA_NAMES):
        folder = os.path.join(root, name)
        os.makedirs(folder)
        with open(os.path.join(folder, "adapter_config.json"), "w") as f:
            json.dump({"peft_type": "LORA", "r": SIM_LORA_RANK, "lora_alpha": 4}, f)
        key = "base_model.model.model.layers.0.self_attn.q_proj.lora_{}.weight"
        save_file({key.format("A"): torch.full((SIM_LORA_RANK, 8), float(i)),
                   key.format("B"): torch.full((8, SIM_LORA_RANK), float(i))},
                  os.path.join(folder, "adapter_model.safetensors"))
        folders[name] = folder
    return folders


def forking_in_flight(sim: Sim) -> dict[int, list[int]]:
    """overlap: parent rid -> child rids of the forks the step in flight has made."""
    plan = sim.in_flight
    return {r.rid: r.fork_into for r in plan.runs if r.fork_into} if plan else {}


def cross_check(sim: Sim) -> None:
    """The scheduler's view of every request agrees with the worker's (which, with overlap, has
    run the step in flight too: its sampled and forced tokens are not folded in yet)."""
    sched, worker = sim.sched, sim.worker
    sched.check_integrity()
    forks = forking_in_flight(sim)
    plan = sim.in_flight
    drafts = {r.rid: r for r in plan.runs if r.draft} if plan else {}
    for req in sched.running:
        state = worker.states.get(req.rid)
        if req.rid in forks:
            assert state is None, f"{req.rid} forks in flight"
            continue
        assert state is not None and req.rid not in worker.host, f"running {req.rid} unknown"
        known = req.num_known
        assert state.token_ids[:known] == req.all_ids[:known], f"request {req.rid}: token ids"
        assert req.pending <= 1 and (sim.overlap or not req.pending), f"{req.rid} pending"
        if req.pending:
            assert len(state.token_ids) >= req.num_tokens, f"request {req.rid}: token ids"
        else:
            assert len(state.token_ids) == req.num_tokens, f"request {req.rid}: token ids"
        slots = sched.kv.slots(req, 0, req.kv_len)
        drafted = drafts.get(req.rid)
        if drafted is not None:  # verified in flight: the worker kept a prefix of the drafts
            kept = len(state.slots)
            assert drafted.start < kept <= len(slots), f"request {req.rid}: drafts kept"
            slots = slots[:kept]
        assert state.slots == slots, f"request {req.rid}: slots"
    for req in sched.swapped:
        assert len(worker.host.get(req.rid, ())) == req.kv_len_swapped, f"swapped {req.rid}"
        assert worker.states[req.rid].token_ids == req.all_ids and not req.pending
    live = {r.rid for r in sched.running} | {r.rid for r in sched.swapped}
    live |= {c for children in forks.values() for c in children}
    for rid in set(worker.states) | set(worker.host):
        req = sched.requests.get(rid)
        assert rid in live or (req and req.finished), f"worker holds {rid} ({req and req.phase})"


def step(sim: Sim, between: Callable[[], None] | None = None) -> None:
    """One turn of the production step loop over the simulated worker; `between` runs while
    the loop waits for a result (if it waits for one this turn)."""

    def waiting() -> None:  # the next plan is made, the step in flight not folded in yet
        note_presolved_preempted(sim)
        if between is not None:
            between()

    sim.executor.on_wait = waiting
    touched = sim.loop.step()
    sim.executor.on_wait = None
    assert sim.overlap or not sim.loop.in_flight.needs_sync, "needs_sync without a step in flight"
    sim.reported |= {r.rid for r in touched if r.finished}
    note_presolved_preempted(sim)
    sim.steps += 1
    cross_check(sim)


def note_presolved_preempted(sim: Sim) -> None:
    """Coverage: requests preempted (re-admitted since, maybe) while a step in flight samples a
    token already known."""
    for req in sim.sched.requests.values():
        if any(req.phase in (Phase.WAITING, Phase.SWAPPED) or step.is_stale(req)
               for step in sim.loop.in_flight.presolving(req.rid)):
            sim.presolved_preempted.add(req.rid)


def run(sim: Sim, arrivals: Sequence[Arrival], aborts: Sequence[tuple] = ()) -> list:
    """Submit at the planned steps, abort at the planned steps (before the step or, with a third
    element True, while its plan is in flight), step until idle (pending frees included).
    Returns the top-level requests in arrival order."""
    top: list[Request] = []
    queue = sorted(arrivals, key=lambda a: a.step)

    def abort(mid: bool) -> bool:
        aborted = False
        for when, pick, *rest in aborts:
            live = [r for r in sim.sched.requests.values() if not r.finished]
            in_flight = bool(rest and rest[0]) and sim.overlap  # only overlap has a gap there
            if when == sim.steps and in_flight == mid and live:
                done = sim.sched.abort(live[pick % len(live)].rid)
                sim.reported |= {r.rid for r in done}
                sim.aborted |= {r.rid for r in done}
                aborted = True
        return aborted

    while True:
        while queue and queue[0].step <= sim.steps:
            a = queue.pop(0)
            top.append(sim.sched.add_request(list(a.prompt), a.params, a.scheduling))
        if abort(False):
            cross_check(sim)
        if not queue and not sim.sched.has_work and sim.in_flight is None:
            break
        assert sim.steps < MAX_STEPS, f"hang: {describe(sim)}"
        step(sim, lambda: abort(True))
    step(sim)  # nothing left: a no-op step must stay a no-op
    return top


def describe(sim: Sim) -> str:
    s = sim.sched
    phases = {r.rid: (r.phase.value, r.kv_len, r.num_tokens) for r in s.requests.values()}
    return f"waiting/running/swapped {len(s.waiting)}/{len(s.running)}/{len(s.swapped)}: {phases}"


def check_idle(sim: Sim) -> None:
    sched = sim.sched
    assert not (sched.waiting or sched.running or sched.swapped) and sched.table.swap_used == 0
    assert sim.in_flight is None
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


def check_sample(sim: Sim, sample: Request, prompt: list[int], params: SamplingParams,
                 index: int) -> None:
    """One sample's outputs (those known: an abort may leave a placeholder) are what the worker
    produced and the oracle's (a prefix of it if aborted or failed), logprobs included."""
    want, want_reason, want_lps = oracle_logprobs(prompt, params, index, lora_seed(sample.lora))
    got, reason = sample.output_ids[: sample.num_known_outputs], sample.finish_reason or ""
    lps = sample.output_logprobs
    assert len(got) <= params.max_tokens, f"request {sample.rid}: past max_tokens"
    assert [t.token_id for t in lps] == got, f"request {sample.rid}: logprobs' tokens"
    assert sim.worker.produced.get(sample.rid, [])[: len(got)] == lps, f"{sample.rid}: produced"
    if reason == "abort" or reason.startswith("error"):
        assert got == want[: len(got)], f"request {sample.rid}: output is not the oracle's"
    else:
        assert (got, reason) == (want, want_reason), f"request {sample.rid}"
        assert not sample.pending and len(sample.output_ids) == len(got)
    assert [t.logprob for t in lps] == want_lps[: len(got)], f"request {sample.rid}: logprobs"


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
            got_reason = sample.finish_reason or ""
            if sample is not req and got_reason.startswith("error"):
                assert TOLERATE_POOL_TOO_SMALL and got_reason == POOL_TOO_SMALL, got_reason
            check_sample(sim, sample, list(a.prompt), a.params, i)
        if a.params.pooling is not None and reason == "length":
            want = pooled_value(prefix_hashes(list(a.prompt), [], lora_seed(req.lora))[-1])
            assert req.pooled == want, f"request {req.rid}: pooled {req.pooled!r} != {want!r}"
        start = a.params.prompt_logprobs_start
        stale = TOLERATE_STALE_PROMPT_LOGPROBS and sim.overlap and req.num_preemptions
        if start is not None and reason in ("length", "stop", "forked") and not stale:
            got_lps = [t.token_id for t in req.prompt_logprobs]
            assert got_lps == list(a.prompt[max(start, 1) :]), f"request {req.rid}: prompt lps"
        outputs.append([(s.output_ids, s.finish_reason) for s in samples] + [reason])
    return outputs


def _path(run: Run, node: int) -> list[int]:
    """The drafted tokens from the root's child down to `node` of the run's draft tree."""
    parents = run.draft_parents or list(range(-1, len(run.draft) - 1))
    tokens: list[int] = []
    while node >= 0:
        tokens.append(run.draft[node])
        node = parents[node]
    return tokens[::-1]
