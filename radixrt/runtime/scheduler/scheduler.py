"""Continuous batching: every step, running decodes first, then prefill chunks within the token
budget, in policy order; preemption (recompute or swap) when KV runs out.

Pure policy and bookkeeping: no tensors. It plans a `StepPlan` for the worker and folds the
worker's `StepResult` back into its requests.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from radixrt.runtime.config import IN_BATCH_PREFIX_MIN, EngineConfig
from radixrt.runtime.messages import (
    Run,
    RunResult,
    SlotCopy,
    StepPlan,
    StepResult,
    Swap,
    WorkerRequest,
)
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.scheduler.kv_manager import KVManager
from radixrt.runtime.scheduler.policy import make_policy
from radixrt.runtime.scheduler.request import Phase, Request


@dataclass
class SchedulerStats:
    steps: int = 0
    prompt_tokens: int = 0  # prompt tokens of admitted requests (first admission)
    cached_tokens: int = 0  # of which served from the radix cache
    computed_tokens: int = 0  # tokens through the model (prefill + decode)
    generated_tokens: int = 0
    preemptions: int = 0
    swaps: int = 0


@dataclass
class _StepDraft:
    """What the current step plan accumulates while it is being built."""

    budget: int
    runs: list[Run]
    copies: list[SlotCopy]
    new_requests: list[WorkerRequest]
    swap_in: list[Swap]
    swap_out: list[Swap]
    free: list[int]
    planned: set[int]
    prefilling: set[int]  # requests computing more than one token this step


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        num_pages: int,
        context_length: int,
        eos_token_ids: Sequence[int],
    ) -> None:
        self.config = config
        self.context_length = context_length
        self.eos_token_ids = frozenset(eos_token_ids)
        self.kv = KVManager(num_pages, config.page_size, config.disable_radix_cache)
        self.policy = make_policy(config.schedule_policy)
        self.requests: dict[int, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []  # admission order
        self.swapped: list[Request] = []
        self.children: dict[int, list[int]] = {}  # n > 1 parent rid -> child rids
        self.stats = SchedulerStats()
        self.swap_used = 0  # host slots holding swapped-out KV
        self._rids = itertools.count()
        self._arrivals = itertools.count()
        self._admissions = itertools.count()
        self._pending_free: list[int] = []
        self._finished_outside_step: list[Request] = []

    # --- submission ------------------------------------------------------------------------
    def add_request(
        self, prompt_ids: Sequence[int], params: SamplingParams, extra_key: str | None = None
    ) -> Request:
        """Queue a request. Raises ValueError for a prompt that breaks the context limits; a
        request that can never fit the KV pool finishes at once with an error reason."""
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise ValueError("prompt is empty: give at least one token")
        limit = self.context_length
        if len(prompt_ids) >= limit:
            raise ValueError(
                f"prompt has {len(prompt_ids)} tokens but the context length is {limit}: "
                f"shorten the prompt to at most {limit - 1} tokens"
            )
        if len(prompt_ids) + params.max_tokens > limit:
            raise ValueError(
                f"max_tokens={params.max_tokens} plus the prompt's {len(prompt_ids)} tokens "
                f"exceeds the context length {limit}: lower max_tokens to at most "
                f"{limit - len(prompt_ids)}"
            )
        req = Request(
            rid=next(self._rids),
            prompt_ids=prompt_ids,
            params=params,
            arrival=next(self._arrivals),
            extra_key=extra_key,
        )
        self.requests[req.rid] = req
        need = len(prompt_ids) + params.n * (params.max_tokens + self.kv.page_size)
        if need > self.kv.capacity_tokens:
            self._finish(
                req,
                f"error: the request needs up to {need} KV slots (prompt {len(prompt_ids)} + "
                f"n={params.n} x max_tokens={params.max_tokens}) but the KV pool holds "
                f"{self.kv.capacity_tokens}; lower max_tokens or n, or raise max_total_tokens",
            )
            self._finished_outside_step.append(req)
            return req
        self.waiting.append(req)
        return req

    def abort(self, rid: int) -> list[Request]:
        """Abort a request at any stage (waiting, mid-prefill, decoding, swapped)."""
        req = self.requests.get(rid)
        if req is None:
            return []
        aborted = []
        for child in self.children.get(rid, []):
            aborted += self.abort(child)
        if not req.finished:
            self.finish(rid, "abort")
            aborted.append(req)
        return aborted

    def finish(self, rid: int, reason: str) -> None:
        """End a request from outside (an abort, a stop string seen by the detokenizer)."""
        req = self.requests.get(rid)
        if req is None or req.finished:
            return
        if req.phase is Phase.WAITING:
            self.waiting.remove(req)
        elif req.phase is Phase.SWAPPED:
            self.swapped.remove(req)
            self.swap_used -= req.kv_len_swapped
            self._pending_free.append(rid)
        elif req.phase is Phase.RUNNING:
            self.running.remove(req)
            self.kv.release(req)
            self._pending_free.append(rid)
        self._finish(req, reason)

    def forget(self, rid: int) -> None:
        """Drop a finished request's record (the engine calls this once it has the output)."""
        req = self.requests.get(rid)
        if req is not None and req.finished:
            del self.requests[rid]
            self.children.pop(rid, None)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped or self._pending_free)

    def take_finished_outside_step(self) -> list[Request]:
        out, self._finished_outside_step = self._finished_outside_step, []
        return out

    # --- planning --------------------------------------------------------------------------
    def schedule(self) -> StepPlan | None:
        draft = _StepDraft(
            budget=self.config.max_num_batched_tokens,
            runs=[],
            copies=[],
            new_requests=[],
            swap_in=[],
            swap_out=[],
            free=self._pending_free,
            planned=set(),
            prefilling=set(),
        )
        self._pending_free = []
        self._swap_back(draft)
        for req in [r for r in self.running if r.is_decoding]:
            if req.phase is Phase.RUNNING and req.rid not in draft.planned:
                self._plan_chunk(req, 1, draft, may_preempt=True)
        for req in [r for r in self.running if not r.is_decoding]:
            if draft.budget <= 0:
                break
            if req.phase is Phase.RUNNING and req.rid not in draft.planned:
                chunk = min(req.remaining, draft.budget)
                self._plan_chunk(req, chunk, draft, may_preempt=True)
        self._admit(draft)
        if not (draft.runs or draft.free or draft.swap_out):
            return None
        self.stats.steps += 1
        return StepPlan(
            step_id=self.stats.steps,
            swap_out=draft.swap_out,
            free=draft.free,
            new_requests=draft.new_requests,
            copies=draft.copies,
            swap_in=draft.swap_in,
            runs=draft.runs,
        )

    def _admit(self, draft: _StepDraft) -> None:
        if not self.waiting:
            return
        for req in self.policy.order(self.waiting, self.kv):
            if draft.budget <= 0 or len(self.running) >= self.config.max_running_requests:
                break
            if self._shares_prefill_in_progress(req, draft):
                continue  # next step its prefix is in the tree: compute it once
            self.kv.admit(req)
            chunk = min(req.remaining, draft.budget)
            room = self.kv.room(req)
            busy = bool(self.running or draft.runs)
            if room < chunk:
                if busy or room <= 0:  # wait for the running requests to free memory
                    self.kv.release(req, cache=False)
                    if not busy:
                        self.waiting.remove(req)
                        self._finish(req, "error: the KV pool is too small for this request")
                        self._finished_outside_step.append(req)
                    break
                chunk = room
            slots = self.kv.reserve(req, chunk, draft.copies)
            if slots is None:
                self.kv.release(req, cache=False)
                break
            if req.admitted_at < 0:
                self.stats.prompt_tokens += len(req.prompt_ids)
                self.stats.cached_tokens += req.kv_len - chunk
                req.cached_len = req.kv_len - chunk
            self.waiting.remove(req)
            req.phase = Phase.RUNNING
            req.admitted_at = next(self._admissions)
            self.running.append(req)
            draft.new_requests.append(
                WorkerRequest(
                    rid=req.rid,
                    prompt_ids=req.prompt_ids,
                    output_ids=list(req.output_ids),
                    params=req.params.to_dict(),
                    seed_offset=req.seed_offset,
                    prefix_slots=self.kv.slots(req, 0, req.kv_len - chunk),
                )
            )
            self._add_run(req, chunk, slots, draft)

    def _shares_prefill_in_progress(self, req: Request, draft: _StepDraft) -> bool:
        """True when a request prefilling now will put this one's next tokens in the tree."""
        if self.kv.disable_radix_cache:
            return False
        cached = self.kv.match_len(req)
        end = cached + IN_BATCH_PREFIX_MIN
        if end >= len(req.prompt_ids):
            return False
        head = req.prompt_ids[:end]
        return any(
            (other.remaining > 1 or other.rid in draft.prefilling)
            and other.extra_key == req.extra_key
            and other.prompt_ids[:end] == head
            for other in self.running
        )

    def _plan_chunk(self, req: Request, chunk: int, draft: _StepDraft, may_preempt: bool) -> None:
        room = self.kv.room(req)
        if 0 < room < chunk:
            chunk = room
        while True:
            slots = self.kv.reserve(req, chunk, draft.copies)
            if slots is not None:
                self._add_run(req, chunk, slots, draft)
                return
            victim = self._pick_victim(req, draft) if may_preempt else None
            if victim is None:
                if not any(r is not req for r in self.running):
                    self.running.remove(req)
                    self.kv.release(req)
                    draft.free.append(req.rid)
                    self._finish(req, "error: the KV pool is too small for this request")
                    self._finished_outside_step.append(req)
                return  # others hold the memory this step; they progress, then this one
            self._preempt(victim, draft)

    def _add_run(self, req: Request, chunk: int, slots: list[int], draft: _StepDraft) -> None:
        start = req.kv_len - chunk
        sample = req.kv_len == req.num_tokens
        fork_into: list[int] = []
        if sample and req.fork_count > 1:
            fork_into = [next(self._rids) for _ in range(req.fork_count)]
            self.children[req.rid] = fork_into
        draft.runs.append(
            Run(
                rid=req.rid,
                start=start,
                num_new=chunk,
                new_slots=slots,
                sample=sample,
                prompt_logprob_from=req.prompt_logprob_from(),
                fork_into=fork_into,
            )
        )
        draft.planned.add(req.rid)
        if chunk > 1:
            draft.prefilling.add(req.rid)
        draft.budget -= chunk

    # --- preemption ------------------------------------------------------------------------
    def _pick_victim(self, req: Request, draft: _StepDraft) -> Request | None:
        candidates = [r for r in self.running if r is not req and r.rid not in draft.planned]
        return max(candidates, key=lambda r: r.admitted_at, default=None)

    def _preempt(self, victim: Request, draft: _StepDraft) -> None:
        self.stats.preemptions += 1
        self.running.remove(victim)
        victim.num_preemptions += 1
        fits_swap = self.swap_used + victim.kv_len <= self.config.swap_space_tokens
        if self.config.preemption == "swap" and fits_swap and victim.kv_len > 0:
            self.stats.swaps += 1
            slots = self.kv.slots(victim, 0, victim.kv_len)
            draft.swap_out.append(Swap(rid=victim.rid, slots=slots))
            victim.kv_len_swapped = victim.kv_len
            self.swap_used += victim.kv_len
            self.kv.release(victim, cache=False)
            victim.phase = Phase.SWAPPED
            self.swapped.append(victim)
            return
        if not victim.prompt_logprobs_done:
            victim.prompt_logprobs.clear()  # gathered again on re-admission
        self.kv.release(victim)  # its tokens stay in the tree: re-prefill is mostly a cache hit
        draft.free.append(victim.rid)
        victim.phase = Phase.WAITING
        self.waiting.append(victim)

    def _swap_back(self, draft: _StepDraft) -> None:
        for req in sorted(self.swapped, key=lambda r: r.admitted_at):
            need = self.kv.pages_for(req.kv_len_swapped) + len(self.running)
            if self.kv.available_pages() < need:
                break
            slots = self.kv.reserve(req, req.kv_len_swapped, draft.copies)
            if slots is None:
                break
            self.swapped.remove(req)
            self.swap_used -= req.kv_len_swapped
            draft.swap_in.append(Swap(rid=req.rid, slots=slots))
            req.phase = Phase.RUNNING
            self.running.append(req)
            self.running.sort(key=lambda r: r.admitted_at)

    # --- results ---------------------------------------------------------------------------
    def process_results(self, plan: StepPlan, result: StepResult) -> list[Request]:
        """Fold the worker's results in. Returns the requests that got tokens or finished."""
        by_rid: dict[int, RunResult] = {r.rid: r for r in result.results}
        touched = self.take_finished_outside_step()
        for run in plan.runs:
            req = self.requests.get(run.rid)
            if req is None or req.phase is not Phase.RUNNING:
                continue
            self.stats.computed_tokens += run.num_new
            res = by_rid.get(run.rid)
            if run.prompt_logprob_from >= 0 and res is not None:
                req.prompt_logprobs.extend(res.prompt_logprobs)
                req.prompt_logprobs_done = run.sample
            if run.num_new > 1 or not run.sample:
                self.kv.cache_prefix(req)  # share the computed prompt from the next step on
            if not run.sample:
                continue
            if run.fork_into:
                touched += self._fork(req, run.fork_into, by_rid)
                continue
            if res is not None and res.token is not None:
                self._append(req, res)
                touched.append(req)
        return touched

    def _append(self, req: Request, res: RunResult) -> None:
        assert res.token is not None
        req.output_ids.append(res.token.token_id)
        req.output_logprobs.append(res.token)
        self.stats.generated_tokens += 1
        reason = self._finish_reason(req, res.token.token_id)
        if reason is not None:
            self.running.remove(req)
            self.kv.release(req)
            self._pending_free.append(req.rid)
            self._finish(req, reason)

    def _fork(self, parent: Request, child_rids: list[int], by_rid: dict) -> list[Request]:
        children = []
        position = self.running.index(parent)
        for i, rid in enumerate(child_rids):
            child = Request(
                rid=rid,
                prompt_ids=parent.prompt_ids,
                params=parent.params.with_(n=1),
                arrival=parent.arrival,
                extra_key=parent.extra_key,
                seed_offset=i,
                parent_rid=parent.rid,
                phase=Phase.RUNNING,
                admitted_at=parent.admitted_at,
                cached_len=parent.cached_len,
                prompt_logprobs_done=True,
            )
            self.requests[rid] = child
            self.kv.share(parent, child)
            self.running.insert(position + 1 + i, child)
            children.append(child)
        self.running.remove(parent)
        self.kv.release(parent, cache=False)  # the worker dropped the parent itself
        self._finish(parent, "forked")
        touched = [parent]
        for child in children:
            res = by_rid.get(child.rid)
            if res is not None and res.token is not None and child.phase is Phase.RUNNING:
                self._append(child, res)
            touched.append(child)
        return touched

    def _finish_reason(self, req: Request, token: int) -> str | None:
        p = req.params
        if len(req.output_ids) >= p.min_tokens:
            if token in p.stop_token_ids:
                return "stop"
            if not p.ignore_eos and token in self.eos_token_ids:
                return "stop"
        if len(req.output_ids) >= p.max_tokens or req.num_tokens >= self.context_length:
            return "length"
        return None

    def _finish(self, req: Request, reason: str) -> None:
        req.phase = Phase.FINISHED
        req.finish_reason = reason

    # --- accounting ------------------------------------------------------------------------
    def check_integrity(self) -> None:
        for req in self.waiting + self.swapped:
            if req.pages or req.tree_node is not None:
                raise RuntimeError(f"request {req.rid} holds KV while {req.phase.value}")
        self.kv.check_integrity(self.running)
        swapped = sum(r.kv_len_swapped for r in self.swapped)
        if swapped != self.swap_used:
            raise RuntimeError(f"swap accounting: {swapped} swapped != {self.swap_used} used")
