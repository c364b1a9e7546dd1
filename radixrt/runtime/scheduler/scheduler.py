"""Continuous batching: every step, running decodes first, then prefill chunks within the token
budget, in policy order; preemption (recompute or swap) when KV runs out.

Pure policy and bookkeeping: no tensors. It plans a `StepPlan` for the worker and folds the
worker's `StepResult` back into its requests.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixrt.runtime.config import IN_BATCH_PREFIX_MIN, PLACEHOLDER_TOKEN
from radixrt.runtime.messages import (
    Run,
    RunResult,
    SlotCopy,
    StepPlan,
    StepResult,
    Swap,
    TokenLogprob,
    WorkerRequest,
)
from radixrt.runtime.scheduler.request import Phase, Request
from radixrt.runtime.scheduler.state import SchedulerState


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
    swapped_in: set[int]  # brought back this step: never preempted in the same plan
    prefilling: set[int]  # requests computing more than one token this step


class Scheduler(SchedulerState):
    """Plans each step's StepPlan and folds the worker's StepResult back in."""

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
            swapped_in=set(),
            prefilling=set(),
        )
        self._pending_free = []
        self._swap_back(draft)
        for req in [r for r in self.running if r.is_decoding and not self._awaits_end(r)]:
            if req.phase is Phase.RUNNING and req.rid not in draft.planned:
                self._plan_chunk(req, 1, draft, may_preempt=True)
        for req in [r for r in self.running if not r.is_decoding and r.remaining > 0]:
            if draft.budget <= 0:
                break
            if req.phase is Phase.RUNNING and req.rid not in draft.planned:
                chunk = min(req.remaining, draft.budget)
                self._plan_chunk(req, chunk, draft, may_preempt=True)
        self._admit(draft)
        self._move_onto_tree_pages(draft)
        if not (draft.runs or draft.free or draft.swap_out or draft.copies or draft.swap_in):
            return None
        self.stats.steps += 1
        self._run_epochs[self.stats.steps] = {
            run.rid: self.requests[run.rid].epoch for run in draft.runs
        }
        return StepPlan(
            step_id=self.stats.steps,
            swap_out=draft.swap_out,
            free=draft.free,
            new_requests=draft.new_requests,
            copies=draft.copies,
            swap_in=draft.swap_in,
            runs=draft.runs,
        )

    def _awaits_end(self, req: Request) -> bool:
        """The step in flight samples this request's last token: nothing more to plan."""
        return req.pending > 0 and (
            len(req.output_ids) >= req.params.max_tokens or req.num_tokens >= self.context_length
        )

    def _move_onto_tree_pages(self, draft: _StepDraft) -> None:
        """A prefix computed twice at once is held once: requests move onto the tree's pages.
        Done once the plan is made, so the pages freed here are not reused by it; a request
        preempted (or preempted and re-admitted) in this plan starts clean and is skipped."""
        pending, self._dedupe = self._dedupe, {}
        gone = set(draft.free) | {w.rid for w in draft.new_requests}
        gone |= {s.rid for s in draft.swap_out}
        for rid, num_pages in pending.items():
            req = self.requests.get(rid)
            if req is not None and req.phase is Phase.RUNNING and rid not in gone:
                self.kv.dedupe(req, num_pages, draft.copies)

    def _admit(self, draft: _StepDraft) -> None:
        if not self.waiting or self.swapped:
            return  # swapped-out requests come back before anything new starts
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
                # alone and nothing to free: it can never fit (unless pages it computed twice
                # are about to be handed back at the end of this plan)
                if not any(r is not req for r in self.running) and req.rid not in self._dedupe:
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
            fork_into = [next(self._child_rids) for _ in range(req.fork_count)]
            self.children[req.rid] = fork_into
            req.forking = True
            self.needs_sync = True  # overlap: fold the fork in before planning anything else
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
        if sample and not fork_into:  # plan the next step before this token is known
            req.output_ids.append(PLACEHOLDER_TOKEN)
            req.pending += 1
        draft.planned.add(req.rid)
        if chunk > 1:
            draft.prefilling.add(req.rid)
        draft.budget -= chunk

    # --- preemption ------------------------------------------------------------------------
    def _pick_victim(self, req: Request, draft: _StepDraft) -> Request | None:
        candidates = [
            r
            for r in self.running
            if r is not req and r.rid not in draft.planned and r.rid not in draft.swapped_in
        ]
        victim = max(candidates, key=lambda r: r.admitted_at, default=None)
        if victim is not None and victim.pending:
            # its sampled token is still in flight: preempt only once that step is folded in
            self.needs_sync = True
            return None
        return victim

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
        victim.epoch += 1  # results of its steps still in flight no longer apply
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
            draft.swapped_in.add(req.rid)
            req.phase = Phase.RUNNING
            self.running.append(req)
            self.running.sort(key=lambda r: r.admitted_at)

    # --- results ---------------------------------------------------------------------------
    def process_results(self, plan: StepPlan, result: StepResult) -> list[Request]:
        """Fold the worker's results in. Returns the requests that got tokens or finished."""
        by_rid: dict[int, RunResult] = {r.rid: r for r in result.results}
        touched = self.take_finished_outside_step()
        epochs = self._run_epochs.pop(plan.step_id, {})
        if plan.step_id == self.stats.steps:
            self.needs_sync = False  # nothing is in flight any more
        for run in plan.runs:
            req = self.requests.get(run.rid)
            if req is None or epochs.get(run.rid, req.epoch) != req.epoch:
                continue  # gone, or recomputed since: this run's results are stale
            if req.phase is Phase.SWAPPED and run.prompt_logprob_from >= 0 and run.rid in by_rid:
                req.prompt_logprobs.extend(by_rid[run.rid].prompt_logprobs)  # its KV was kept
                continue
            if req.phase is not Phase.RUNNING:
                continue
            self.stats.computed_tokens += run.num_new
            res = by_rid.get(run.rid)
            if run.prompt_logprob_from >= 0 and res is not None:
                req.prompt_logprobs.extend(res.prompt_logprobs)
                req.prompt_logprobs_done = run.sample
            if run.fork_into:
                self.kv.cache_prefix(req)
                touched += self._fork(req, run.fork_into, by_rid)
                continue
            if run.sample and req.presolved_step == plan.step_id:
                req.presolved_step = -1  # jump-forward already put this token in place
            elif run.sample:
                assert res is not None and res.token is not None, f"no token for {run.rid}"
                touched.append(req)
                if self._append(req, res) or self._append_forced(req, res.forced):
                    continue  # finished (and released)
            if run.num_new > 1 or not run.sample:
                # share the computed prompt from the next step on
                shared = self.kv.cache_prefix(req)
                if shared:
                    self._dedupe[req.rid] = shared
        return touched

    def _append(self, req: Request, res: RunResult) -> bool:
        """The sampled token replaces the oldest placeholder. True if the request finished."""
        assert res.token is not None and req.pending > 0
        index = len(req.output_ids) - req.pending
        req.output_ids[index] = res.token.token_id
        req.pending -= 1
        req.output_logprobs.append(res.token)
        self.stats.generated_tokens += 1
        reason = self._finish_reason(req, res.token.token_id)
        if reason is None:
            return False
        del req.output_ids[index + 1 :]  # a step planned past the end samples in vain
        self._end(req, reason)
        return True

    def _append_forced(self, req: Request, forced: list[int]) -> bool:
        """Jump-forward: tokens the grammar forces after the sampled one (logprob 0: certain
        under the grammar). A step in flight samples the first of them itself: its placeholder
        becomes that token now and the step's result for it is skipped. True if finished."""
        if not forced:
            return False
        if req.pending:  # overlap scheduling: at most the latest plan is in flight
            assert req.pending == 1 and req.output_ids[-1] == PLACEHOLDER_TOKEN
            req.output_ids.pop()
            req.pending = 0
            req.presolved_step = self.stats.steps
        start = len(req.output_ids)
        for i, token in enumerate(forced):
            req.output_ids.append(token)
            req.output_logprobs.append(TokenLogprob(token_id=token, logprob=0.0))
            self.stats.generated_tokens += 1
            reason = self._finish_reason_at(req, token, start + i + 1)
            if reason is not None:
                self._end(req, reason)
                return True
        return False

    def _end(self, req: Request, reason: str) -> None:
        req.pending = 0
        self.running.remove(req)
        if req.pin:
            self._pin(req)
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
                child.output_ids.append(PLACEHOLDER_TOKEN)
                child.pending = 1
                if not self._append(child, res):
                    self._append_forced(child, list(res.forced))
            touched.append(child)
        if parent.abort_requested:  # aborted while its fork was in flight
            for child in children:
                touched += self.abort(child.rid)
        return touched

    def _finish_reason(self, req: Request, token: int) -> str | None:
        return self._finish_reason_at(req, token, req.num_known_outputs)

    def _finish_reason_at(self, req: Request, token: int, num_out: int) -> str | None:
        """Why the request ends with `token` as its num_out-th output, or None."""
        p = req.params
        if num_out >= p.min_tokens:
            if token in p.stop_token_ids:
                return "stop"
            if not p.ignore_eos and token in self.eos_token_ids:
                return "stop"
        if num_out >= p.max_tokens or len(req.prompt_ids) + num_out >= self.context_length:
            return "length"
        return None
