"""Planning one step: running decodes first, then prefill chunks within the token budget, then
new admissions in policy order; preemption (recompute or swap) when KV runs out.

Order within a plan (`schedule`): swapped-out requests come back first (oldest admission first),
then every running decode gets its one token, then running prefills get chunks while the budget
lasts, then waiting requests are admitted (none while any request is swapped out); a waiting
request more urgent than a running prefill is admitted before it. Pages that a
prefix computed twice at once holds are handed back last, once nothing in this plan can reuse
them. Making room in a step (preemption by memory, priority and fair share; swapped-out requests
coming back) is the `Preemptor`'s (preemption.py), which the planner owns and calls; the planner
picks the victim of a preemption for memory (`_pick_victim`). Pure bookkeeping: no tensors.
"""

from __future__ import annotations

import time

from radixrt.runtime.config import PLACEHOLDER_TOKEN, QUEUE_TIMEOUT, EngineConfig
from radixrt.runtime.messages import LoraAdapter, PrefixGroup, Run, StepPlan, WorkerRequest
from radixrt.runtime.models.lora_format import lora_namespace_of
from radixrt.runtime.scheduler.image_blocks import cut_runs, whole_runs
from radixrt.runtime.scheduler.in_flight import (
    SYNC_FORK,
    SYNC_PREEMPT,
    SYNC_SPECULATE,
    InFlightLedger,
)
from radixrt.runtime.scheduler.kv_manager import KVManager
from radixrt.runtime.scheduler.lora_table import LoraTable
from radixrt.runtime.scheduler.policy import SchedulePolicy
from radixrt.runtime.scheduler.preemption import Preemptor
from radixrt.runtime.scheduler.prefix_groups import prefix_groups
from radixrt.runtime.scheduler.queue_order import admission_order, most_urgent
from radixrt.runtime.scheduler.request import Phase, Request
from radixrt.runtime.scheduler.request_table import RequestTable
from radixrt.runtime.scheduler.speculator import Draft, Speculator
from radixrt.runtime.scheduler.stats import MEMORY, SchedulerStats
from radixrt.runtime.scheduler.step_draft import StepDraft

# A waiting request is held back one step when a request being prefilled right now shares at least
# this many not-yet-cached tokens with it: next step those tokens are in the radix tree.
IN_BATCH_PREFIX_MIN = 32
# Cascade attention: decode requests whose slot tables begin with at least this many common slots
# (a radix-tree prefix they hold) read that prefix once per step, together, when the group saves
# at least `cascade_min_saved_reads` position reads per layer ((members - 1) x prefix). Measured
# on the CPU path (docs/design-notes.md): 32 requests behind a 512-token prefix (15,872
# saved) decode 17% faster; 8 behind 420 (2,940) 3%; groups of up to 7 behind 400 (<= 2,400) a
# little slower than without.
CASCADE_MIN_PREFIX = 32
# KV tiers: the waiting requests (most urgent, oldest first) whose prefixes on disk each step
# brings up to the host tier ahead of their admission
PREFETCH_REQUESTS = 4

POOL_TOO_SMALL = "the KV pool is too small for this request"


class Planner:
    def __init__(
        self,
        config: EngineConfig,
        table: RequestTable,
        kv: KVManager,
        policy: SchedulePolicy,
        stats: SchedulerStats,
        context_length: int,
        speculator: Speculator | None = None,
        lora: LoraTable | None = None,
        image_blocks: bool = False,
    ) -> None:
        """speculator: drafts for decoding requests (speculative decoding; None: off); lora:
        the LoRA adapters (how many one step may mix; what the worker must be told);
        image_blocks: an image's run is computed in one chunk (image_blocks.py: Gemma 3)."""
        self.config = config
        self.image_blocks = image_blocks
        self.table = table
        self.kv = kv
        self.policy = policy
        self.stats = stats
        self.context_length = context_length
        self.preemptor = Preemptor(config, table, kv, policy, stats, lora)  # room in a step
        self.speculator = speculator
        self.lora = lora

    def schedule(self, in_flight: InFlightLedger) -> StepPlan | None:
        """The next step's plan, or None when there is nothing to do. `in_flight`: the steps
        planned and not folded in yet; the plan is recorded in it."""
        table = self.table
        draft = StepDraft(budget=self.config.max_num_batched_tokens,
                           prefilling_in_flight=in_flight.prefilling())
        self._expire_waiting()
        urgent = most_urgent(table.admittable())  # the most urgent priority waiting
        self.preemptor.swap_back(draft, urgent)
        if urgent is not None and self.config.priority_preemption:
            self.preemptor.preempt_for_urgent(draft)
        if (urgent is not None and self.config.fair_share and self.config.fair_share_preemption
                and not draft.not_admitted):
            self.preemptor.preempt_for_fair_share(draft, urgent)
        decodes = [r for r in table.running if r.is_decoding and not self._awaits_end(r)]
        spec = self.speculator
        drafting = spec is not None and spec.drafts_in(len(decodes))
        draft.decoders = len(decodes)
        for i, req in enumerate(decodes):
            if req.phase is Phase.RUNNING and req.rid not in draft.planned:
                others = len(decodes) - i - 1  # decodes still to plan: a token each first
                draft_ids = self._draft(req, 1, draft, others) if drafting else Draft()
                self._plan_chunk(req, 1, draft, draft_ids)
                if draft_ids or (drafting and spec.drafts_next(req)):  # type: ignore[union-attr]
                    # where it goes on, or the token it drafts after, is in this step's result
                    draft.sync_reason = draft.sync_reason or SYNC_SPECULATE
        prefills = sorted((r for r in table.running if not r.is_decoding and r.remaining > 0),
                          key=lambda r: r.priority)  # stable: admission order within a level
        for level in sorted({r.priority for r in prefills}):
            if urgent is not None and urgent < level:  # more urgent waiting requests go first
                self._admit(draft, before=level)
            self._plan_prefills([r for r in prefills if r.priority == level], draft)
        self._admit(draft)
        self._prefetch()
        free = table.take_pending_free()  # ends during planning are in it too
        self._move_onto_tree_pages(draft, free)
        if draft.sync_reason is not None:
            in_flight.request_sync(draft.sync_reason)
        moves = self.kv.take_moves()
        if not (draft.runs or free or draft.swap_out or draft.copies or draft.swap_in or moves):
            return None
        self.stats.steps += 1
        in_flight.record_plan(self.stats.steps,
                              {run.rid: table.requests[run.rid].epoch for run in draft.runs},
                              draft.prefilling)
        loads, unloads = self._lora_changes()
        return StepPlan(
            lora_loads=loads,
            lora_unloads=unloads,
            step_id=self.stats.steps,
            swap_out=draft.swap_out,
            moves=moves,
            free=free,
            new_requests=draft.new_requests,
            copies=draft.copies,
            swap_in=draft.swap_in,
            runs=draft.runs,
            prefix_groups=self._prefix_groups(draft),
        )

    def _lora_changes(self) -> tuple[list[LoraAdapter], list[str]]:
        """Adapters the worker must know from this plan on, and unloaded ones no request uses
        any more (their cached KV dropped here)."""
        if self.lora is None:
            return [], []
        unloads = self.lora.take_unloads(r.lora for r in self.table.requests.values())
        for key in unloads:
            self.stats.lora_dropped_tokens += self.kv.drop_namespaces(lora_namespace_of(key))
        return self.lora.take_loads(), unloads

    def _prefix_groups(self, draft: StepDraft) -> list[PrefixGroup]:
        """Decode runs that share a prefix of pages (after this plan's copies), for cascade
        attention."""
        if not self.config.cascade_attention:
            return []
        decodes = [self.table.requests[run.rid] for run in draft.runs
                   if run.num_new == 1 and run.start > 0 and not run.fork_into]
        return prefix_groups(decodes, self.kv.page_size, CASCADE_MIN_PREFIX,
                             self.config.cascade_min_saved_reads)

    def _plan_prefills(self, requests: list[Request], draft: StepDraft) -> None:
        for req in requests:
            if draft.budget <= 0:
                break
            if req.phase is Phase.RUNNING and req.rid not in draft.planned:
                chunk = self._whole(req, min(req.remaining, draft.budget))
                self._plan_chunk(req, chunk, draft, self._prompt_draft(req, chunk, draft))

    def _expire_waiting(self) -> None:
        """Requests never admitted by their deadline end with an error."""
        now = time.monotonic()
        for req in [r for r in self.table.waiting
                    if r.deadline_s is not None and r.admitted_at < 0 and now >= r.deadline_s]:
            self.stats.timeouts += 1
            timeout = req.deadline_s - req.submitted_s  # type: ignore[operator]
            self.table.fail(req, f"{QUEUE_TIMEOUT}: the request was not started within its "
                                 f"timeout={timeout:g}s ({len(self.table.waiting)} requests were "
                                 "waiting): retry later, give a longer timeout, or a more urgent "
                                 "(lower) priority")

    def _awaits_end(self, req: Request) -> bool:
        """The step in flight samples this request's last token: nothing more to plan."""
        return req.pending > 0 and (
            len(req.output_ids) >= req.max_tokens or req.num_tokens >= self.context_length
        )

    def _move_onto_tree_pages(self, draft: StepDraft, free: list[int]) -> None:
        """A prefix computed twice at once is held once: requests move onto the tree's pages.
        Done once the plan is made, so the pages freed here are not reused by it; a request
        preempted (or preempted and re-admitted) in this plan starts clean and is skipped."""
        pending = self.table.take_dedupe()
        gone = set(free) | {w.rid for w in draft.new_requests} | {s.rid for s in draft.swap_out}
        for rid, num_pages in pending.items():
            req = self.table.requests.get(rid)
            if req is not None and req.phase is Phase.RUNNING and rid not in gone:
                self.kv.dedupe(req, num_pages, draft.copies)

    def _prefetch(self) -> None:
        """KV tiers: the next few waiting requests' prefixes on disk come up to the host tier
        while they wait (their admission then loads them from host memory)."""
        if self.kv.tiers is None:
            return
        waiting = sorted(self.table.admittable(), key=lambda r: (r.priority, r.arrival))
        for req in waiting[:PREFETCH_REQUESTS]:
            self.stats.prefetched_tokens += self.kv.prefetch(req)

    # --- admission ---------------------------------------------------------------------------
    def _admit(self, draft: StepDraft, before: int | None = None) -> None:
        """Admit waiting requests in admission order while the budget, the running slots and
        the KV pool allow; `before`: only those more urgent than that priority."""
        table = self.table
        fair = table.fair if self.config.fair_share else None
        admittable = table.admittable()
        if not admittable:
            return
        # swapped-out requests come back first, but one swapped out for a waiting request in
        # this plan does not hold back the request it made room for
        swapped = most_urgent([r for r in table.swapped if r.rid not in draft.not_admitted])
        held: list[Request] = []  # held back a step to share a prefix being computed
        for req in admission_order(admittable, self.kv, self.policy, fair):
            if swapped is not None and req.priority >= swapped:
                break  # swapped-out requests come back before anything as urgent starts
            if before is not None and req.priority >= before:
                break
            if req.rid in draft.not_admitted:
                continue  # preempted or passed over for a waiting request in this very plan
            # a more urgent request held back keeps its running slot: nothing less urgent
            # takes it (it would be preempted again next step)
            reserved = sum(1 for h in held if h.priority < req.priority)
            if (draft.budget <= 0
                    or len(table.running) + reserved >= self.config.max_running_requests):
                break
            if self.lora is not None and not self.lora.fits(
                    [r.lora for r in table.running], req.lora):
                continue  # every adapter slot is taken by other adapters' running requests
            if self._shares_prefill_in_progress(req, draft):
                held.append(req)
                continue  # next step its prefix is in the tree: compute it once
            self.kv.admit(req)
            chunk = self._whole(req, min(req.remaining, draft.budget))
            room = self.kv.room(req)
            busy = bool(table.running or draft.runs)
            if room < chunk:
                fit = cut_runs(req.images, req.kv_len, room) if self.image_blocks else room
                if busy or fit <= 0:  # wait for the running requests to free memory
                    if busy:
                        self.kv.release(req, cache=False)
                    else:
                        table.fail(req, POOL_TOO_SMALL)
                    break
                chunk = fit
            draft_ids = self._prompt_draft(req, chunk, draft)  # within the free pages left
            slots = self.kv.reserve(req, chunk + len(draft_ids), draft.copies)
            if slots is None:
                self.kv.release(req, cache=False)
                break
            self.kv.admitted(req, first=req.admitted_at < 0)  # (not per try)
            if req.admitted_at < 0:
                req.admitted_s = time.monotonic()
                if req.trace is not None:
                    req.trace.admitted_at = time.time()
                self.stats.prompt_tokens += len(req.prompt_ids)
                self.stats.cached_tokens += req.kv_len - len(slots)
                req.cached_len = req.kv_len - len(slots)
            table.start(req)
            draft.new_requests.append(
                WorkerRequest(
                    rid=req.rid,
                    prompt_ids=req.prompt_ids,
                    output_ids=list(req.output_ids),
                    params=req.params,
                    max_tokens=req.max_tokens,
                    seed_offset=req.seed_offset,
                    prefix_slots=self.kv.slots(req, 0, req.kv_len - len(slots)),
                    lora=req.lora,
                    images=req.images,
                )
            )
            self._add_run(req, len(slots), slots, draft, draft_ids)

    def _shares_prefill_in_progress(self, req: Request, draft: StepDraft) -> bool:
        """True when a request prefilling now (in this plan, in a step still in flight, or in
        chunks still to come) will put this one's next tokens in the tree."""
        if self.kv.disable_radix_cache:
            return False
        end = self.kv.match_len(req) + IN_BATCH_PREFIX_MIN
        if end >= len(req.prompt_ids) or end > len(self.kv.match_key(req)):
            return False  # nothing to gain: the tree could not give it those tokens (mean
            # pooling, prompt logprobs read rows a match would skip)
        head = req.prompt_ids[:end]
        return any(
            (other.remaining > 1 or other.rid in draft.prefilling
             or other.rid in draft.prefilling_in_flight)
            and other.extra_key == req.extra_key
            and other.prompt_ids[:end] == head
            for other in self.table.running
        )

    # --- running requests --------------------------------------------------------------------
    def _draft(self, req: Request, chunk: int, draft: StepDraft, others: int) -> Draft:
        """Speculative decoding: what the request drafts after the `chunk` tokens it computes
        this step (a decode's last token, or a prompt's last chunk), within its max_tokens and
        the context (the token sampled after the draft counts), the step's token budget and the
        free pages, leaving a token and a page to each of the `others` decodes still to plan (a
        draft never evicts nor preempts)."""
        assert self.speculator is not None
        free = self.kv.room(req, evict=False) - others * self.kv.page_size - chunk
        room = min(req.max_tokens - len(req.output_ids) - 1,
                   self.context_length - req.num_tokens - 1, draft.budget - others - chunk, free)
        return self.speculator.draft(req, room)

    def _prompt_draft(self, req: Request, chunk: int, draft: StepDraft) -> Draft:
        """Speculative decoding on a prompt's last chunk: the tokens that followed the prompt's
        end elsewhere are verified in the prefill's own forward pass, after its first sample,
        so an answer copied from the tree is drafted from its first token on. Not on a prompt
        that forks (n > 1) or asks for prompt logprobs, and only while the step's decoders, this
        request one of them, are few enough to draft."""
        spec = self.speculator
        if (spec is None or chunk != req.remaining or req.max_tokens <= 0
                or req.fork_count > 1 or req.prompt_logprob_from() >= 0):
            return Draft()
        draft.decoders += 1
        if not spec.drafts_in(draft.decoders):
            return Draft()
        draft_ids = self._draft(req, chunk, draft, 0)
        if draft_ids:  # where it goes on is in this step's result
            draft.sync_reason = draft.sync_reason or SYNC_SPECULATE
        return draft_ids

    def _whole(self, req: Request, chunk: int) -> int:
        """The chunk, its end at no image run's inside where images are computed whole."""
        return whole_runs(req.images, req.kv_len, chunk) if self.image_blocks else chunk

    def _plan_chunk(self, req: Request, chunk: int, draft: StepDraft,
                    draft_ids: Draft | None = None) -> None:
        """Plan `chunk` more tokens of a running request, then its draft_ids (speculative)."""
        draft_ids = draft_ids or Draft()
        known = chunk
        chunk += len(draft_ids)
        room = self.kv.room(req)
        if 0 < room < chunk:
            fit = cut_runs(req.images, req.kv_len, room) if self.image_blocks else room
            if fit > 0:  # (0: an image's run that room cannot hold: free room for it below)
                draft_ids.cut(max(fit - known, 0))
                chunk = min(fit, known + len(draft_ids))
        while True:
            slots = self.kv.reserve(req, chunk, draft.copies)
            if slots is not None:
                self._add_run(req, chunk, slots, draft, draft_ids)
                return
            if draft_ids:  # a draft never preempts anyone
                chunk -= len(draft_ids)
                draft_ids = Draft()
                continue
            victim = self._pick_victim(req, draft)
            if victim is None:
                # alone and nothing to free: it can never fit (unless pages it computed twice
                # are about to be handed back at the end of this plan)
                alone = not any(r is not req for r in self.table.running)
                if alone and req.rid not in self.table.dedupe:
                    self.table.fail(req, POOL_TOO_SMALL)
                return  # others hold the memory this step; they progress, then this one
            self.preemptor.preempt(victim, draft, MEMORY)

    def _add_run(self, req: Request, chunk: int, slots: list[int], draft: StepDraft,
                 draft_ids: Draft | None = None) -> None:
        draft_ids = draft_ids or Draft()
        start = req.kv_len - chunk
        known_end = req.kv_len - len(draft_ids)  # the drafts' positions are reserved too
        sample = known_end == req.num_tokens and req.max_tokens > 0  # 0: prefill only
        fork_into: list[int] = []
        if sample and req.fork_count > 1:
            fork_into = self.table.plan_fork(req)
            draft.sync_reason = draft.sync_reason or SYNC_FORK  # fold it in before planning more
        draft.runs.append(
            Run(
                rid=req.rid,
                start=start,
                num_new=chunk,
                new_slots=slots,
                sample=sample,
                prompt_logprob_from=req.prompt_logprob_from(),
                fork_into=fork_into,
                draft=draft_ids.tokens,
                draft_parents=draft_ids.parents,
            )
        )
        if sample and not fork_into:  # plan the next step before this token is known
            req.output_ids.append(PLACEHOLDER_TOKEN)
            req.pending += 1
        draft.planned.add(req.rid)
        self.table.fair.charge(req.tenant, chunk)
        if chunk - len(draft_ids) > 1:
            draft.prefilling.add(req.rid)
        draft.budget -= chunk

    # --- preemption for memory (the Preemptor preempts the victim) ---------------------------
    def _pick_victim(self, req: Request, draft: StepDraft) -> Request | None:
        """For a running request that needs KV: the least urgent, then most recently admitted
        running request not planned in this step yet, never one more urgent than `req`."""
        candidates = [
            r
            for r in self.table.running
            if r is not req and r.rid not in draft.planned and r.rid not in draft.swapped_in
            and r.priority >= req.priority
        ]
        victim = max(candidates, key=lambda r: (r.priority, r.admitted_at), default=None)
        if victim is not None and victim.pending:
            # its sampled token is still in flight: preempt only once that step is folded in
            draft.sync_reason = draft.sync_reason or SYNC_PREEMPT
            return None
        return victim
