"""Making room in a step: preemption by memory, by priority and by fair share, and swapped-out
requests coming back.

The planner (planner.py) owns one `Preemptor` and calls it while it builds a step's plan (a
`StepDraft`, step_draft.py): `swap_back` first, then `preempt_for_urgent` (priority) and
`preempt_for_fair_share` (both through `_make_room`), before anything else is planned; `preempt`
also when a running request needs KV, for memory, of the victim the planner picked. A victim is
recomputed (its tokens stay in the radix tree) or swapped out to host memory
(`preemption="swap"`, while the swap space has room); one whose sampled token is still in flight
is preempted only once that step is folded in (the draft's `sync_reason`). Pure bookkeeping: no
tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from radixrt.runtime.config import EngineConfig
from radixrt.runtime.messages import Swap
from radixrt.runtime.scheduler.fair_share import Holdings, over_share_victim
from radixrt.runtime.scheduler.in_flight import SYNC_PREEMPT
from radixrt.runtime.scheduler.kv_manager import KVManager
from radixrt.runtime.scheduler.lora_table import LoraTable
from radixrt.runtime.scheduler.policy import SchedulePolicy
from radixrt.runtime.scheduler.queue_order import admission_order, most_urgent
from radixrt.runtime.scheduler.request import Request
from radixrt.runtime.scheduler.request_table import RequestTable
from radixrt.runtime.scheduler.stats import FAIR_SHARE, PRIORITY, SchedulerStats, count_capped
from radixrt.runtime.scheduler.step_draft import StepDraft


@dataclass(frozen=True)
class Preemptor:
    """Preempts running requests to make room in the step being planned, and swaps swapped-out
    requests back in; over the scheduler's own table, KV manager, policy and stats (the
    planner's)."""

    config: EngineConfig
    table: RequestTable
    kv: KVManager
    policy: SchedulePolicy
    stats: SchedulerStats
    lora: LoraTable | None = None  # LoRA adapters: a step mixes at most so many

    def preempt_for_urgent(self, draft: StepDraft) -> None:
        """Priority preemption, before anything is planned: make room for waiting requests by
        preempting running requests of a strictly less urgent priority, least urgent and most
        recently admitted first. Equal priorities never preempt each other here, so nothing
        ping-pongs; a preempted request (recompute keeps its tokens in the radix tree) resumes
        once the urgent ones leave room."""
        table = self.table
        least = max((r.priority for r in table.running), default=None)
        swapped = most_urgent(table.swapped)
        ceiling = least if swapped is None or least is None else min(least, swapped)
        if ceiling is None:
            return
        urgent = sorted((r for r in table.admittable() if r.priority < ceiling),
                        key=lambda r: (r.priority, r.arrival))
        self._make_room(draft, urgent,
                        lambda req, _holdings, _slot, _tokens: self._less_urgent_victim(req, draft),
                        free_adapters=True)

    def preempt_for_fair_share(self, draft: StepDraft, level: int) -> None:
        """Fair-share preemption, within the most urgent waiting priority `level`: make room for
        its waiting requests, in admission order, by preempting requests of tenants over their
        share (fair_share.over_share_victim). A request may be a victim only once it has
        written `fair_share_quantum` tokens since its admission: every admission makes
        progress, even where a preempted request computes everything again (no radix cache),
        and nothing ping-pongs. A waiting request no victim makes room for (its
        tenant already holds its share) is passed over for this plan, so that the room made
        goes to the request it was made for. Nothing to do with one tenant at that level, or
        while swapped-out requests of that level wait to come back (they go first)."""
        table, config = self.table, self.config
        swapped = most_urgent(table.swapped)
        if swapped is not None and swapped <= level:
            return
        waiting = [r for r in table.admittable() if r.priority == level]
        running = [r for r in table.running if r.priority == level]
        if len({r.tenant for r in waiting} | {r.tenant for r in running}) < 2:
            return
        if (len(table.running) < config.max_running_requests
                and self.kv.available_pages() >= sum(self.kv.pages_for(r.num_tokens)
                                                     for r in waiting)):
            return  # room for every waiting request: admission alone is fair
        ordered = admission_order(waiting, self.kv, self.policy, table.fair)
        quantum = config.fair_share_quantum

        def victim(req: Request, holdings: Holdings, slot: bool, tokens: int) -> Request | None:
            candidates = [r for r in table.running if r.priority == level
                          and r.num_known_outputs - r.outputs_at_start >= quantum
                          and r.rid not in draft.swapped_in]
            return over_share_victim(req.tenant, slot, tokens, holdings, candidates, table.fair,
                                     self.stats.steps + 1)

        self._make_room(draft, ordered, victim, Holdings(running, self.kv.page_size),
                        pass_over=True)

    def _make_room(self, draft: StepDraft, waiting: list[Request],
                   victim_for: Callable[[Request, Holdings, bool, int], Request | None],
                   holdings: Holdings | None = None, pass_over: bool = False,
                   free_adapters: bool = False) -> None:
        """Make room (a running slot, KV pages for its first chunk) for each of `waiting` in
        turn by preempting `victim_for(req, holdings, slot short, KV tokens short)`. A request
        no victim makes room for ends the walk (admission would stop there too), or with
        `pass_over` is left out of this plan's admissions, and so are its tenant's requests
        after it (a tenant's own order holds). `holdings`: what each tenant holds, updated with
        every move (fair share's rule reads it). A request whose LoRA adapter finds no adapter
        slot in the step (--max-loras-per-batch) first gets one with `free_adapters`
        (`_adapter_victims`: priority); without, or when none can be freed, it is passed by, as
        admission passes it by: no room is made for a request that cannot start."""
        table, kv = self.table, self.kv
        holdings = holdings or Holdings(table.running, kv.page_size)
        ps = kv.page_size
        pages = sum(1 for r in table.running if r.is_decoding and r.kv_len % ps == 0)
        budget = self.config.max_num_batched_tokens - sum(r.is_decoding for r in table.running)
        placed = 0  # running slots the requests made room for take
        adapters: list[str | None] = []  # and the adapters they run under
        wanted = {r.lora for r in waiting}  # adapters the waiting requests run under
        passed: set[str] = set()  # tenants with a request passed over
        for req in waiting:
            if budget <= 0:
                return
            if req.tenant in passed:
                draft.not_admitted.add(req.rid)
                continue
            if not self._adapter_fits(req, adapters):
                victims = (self._adapter_victims(req, draft, adapters, wanted)
                           if free_adapters else [])
                if not victims:
                    continue
                if any(v.pending for v in victims):  # their tokens are in flight: fold first
                    draft.sync_reason = draft.sync_reason or SYNC_PREEMPT
                    return
                for victim in victims:
                    holdings.remove(victim)
                    self._preempt_for(req, victim, draft)
            cached, unlocked = kv.cached_prefix(req)
            chunk = min(req.num_tokens - cached, budget)
            # its first chunk, a copy-on-write page, and its cached prefix (evictable now,
            # locked once it is admitted)
            need = kv.pages_for(chunk) + 1 + unlocked
            while True:
                short_slot = len(table.running) + placed + 1 > self.config.max_running_requests
                short_tokens = need * ps if kv.available_pages() < pages + need else 0
                if not (short_slot or short_tokens):
                    break
                victim = victim_for(req, holdings, short_slot, short_tokens)
                if victim is None and pass_over:
                    draft.not_admitted.add(req.rid)
                    passed.add(req.tenant)
                    break
                if victim is None or victim.pending:
                    if victim is not None:  # its token is in flight: fold that step in first
                        draft.sync_reason = draft.sync_reason or SYNC_PREEMPT
                    return
                holdings.remove(victim)
                self._preempt_for(req, victim, draft)
            if req.rid not in draft.not_admitted:
                budget -= chunk
                pages += need
                placed += 1
                adapters.append(req.lora)
                holdings.place(req.tenant, cached + chunk)

    def _less_urgent_victim(self, req: Request, draft: StepDraft) -> Request | None:
        """The least urgent, most recently admitted running request of a strictly less urgent
        priority than `req`."""
        victims = [r for r in self.table.running
                   if r.priority > req.priority and r.rid not in draft.swapped_in]
        return max(victims, key=lambda r: (r.priority, r.admitted_at), default=None)

    def _adapter_fits(self, req: Request, placed: list[str | None]) -> bool:
        """May `req`'s adapter join the running requests' and the `placed` ones in a step?"""
        return self.lora is None or self.lora.fits(
            [r.lora for r in self.table.running] + placed, req.lora)

    def _adapter_victims(self, req: Request, draft: StepDraft, placed: list[str | None],
                         wanted: Collection[str | None] = ()) -> list[Request]:
        """The running requests to preempt so that `req`'s adapter gets a slot in the step:
        every request under one other adapter, all of them strictly less urgent than `req` and
        none swapped in by this plan (one no other `wanted` request runs under, then the one
        whose most urgent request is least urgent, then the one with fewest requests); [] when
        no adapter can be freed so."""
        groups: dict[str, list[Request]] = {}
        for r in self.table.running:
            if r.lora is not None and r.lora not in placed:
                groups.setdefault(r.lora, []).append(r)
        freeable = [g for g in groups.values()
                    if all(r.priority > req.priority and r.rid not in draft.swapped_in
                           for r in g)]
        return max(freeable, key=lambda g: (g[0].lora not in wanted, min(r.priority for r in g),
                                            -len(g)), default=[])

    def _preempt_less_urgent(self, req: Request, draft: StepDraft) -> bool:
        """Priority preemption for `req`: a less urgent request, or every request holding the
        adapter slot it needs; False when there is no victim to preempt now (none, or a token
        is in flight: it is preempted once that step is folded in)."""
        if self._adapter_fits(req, []):
            victim = self._less_urgent_victim(req, draft)
            victims = [] if victim is None else [victim]
        else:
            victims = self._adapter_victims(req, draft, [])
        if not victims or any(v.pending for v in victims):
            if victims:
                draft.sync_reason = draft.sync_reason or SYNC_PREEMPT
            return False
        for victim in victims:
            self._preempt_for(req, victim, draft)
        return True

    def _preempt_for(self, req: Request, victim: Request, draft: StepDraft) -> None:
        """Preempt `victim` (no token of it in flight) to make room for waiting (or
        swapped-out) `req`: for its priority when the victim is less urgent, else for fair
        share."""
        if victim.priority > req.priority:
            self.preempt(victim, draft, PRIORITY)
            self.stats.priority_preemptions += 1
            count_capped(self.stats.preemptions_caused_by_priority, str(req.priority))
            count_capped(self.stats.preemptions_caused_by_tenant, req.tenant)
        else:
            self.preempt(victim, draft, FAIR_SHARE)
            self.table.fair.preempted(victim.tenant, self.stats.steps + 1)
        draft.not_admitted.add(victim.rid)

    def preempt(self, victim: Request, draft: StepDraft, cause: str) -> None:
        table = self.table
        self.stats.preemptions += 1
        self.stats.preemptions_by_cause[cause] += 1
        fits_swap = table.swap_used + victim.kv_len <= self.config.swap_space_tokens
        if self.config.preemption == "swap" and not fits_swap:
            self.stats.swap_fallbacks += 1  # the host swap space is full: recompute instead
        if self.config.preemption == "swap" and fits_swap and victim.kv_len > 0:
            self.stats.swaps += 1
            slots = self.kv.slots(victim, 0, victim.kv_len)
            draft.swap_out.append(Swap(rid=victim.rid, slots=slots))
            table.swap_out(victim)
            return
        table.preempt_recompute(victim)

    def _swap_in_room(self, req: Request) -> bool:
        """A running slot for `req`, pages to swap it back in plus one for each running
        request to grow by, and an adapter slot for its LoRA adapter."""
        table = self.table
        need = self.kv.pages_for(req.kv_len_swapped) + len(table.running)
        return (len(table.running) < self.config.max_running_requests
                and self.kv.available_pages() >= need and self._adapter_fits(req, []))

    def swap_back(self, draft: StepDraft, urgent: int | None) -> None:
        """Swapped-out requests come back, most urgent then oldest first, unless a more urgent
        request is waiting (it goes first); one that finds no running slot or not enough pages
        preempts running requests of a strictly less urgent priority (priority preemption)."""
        table = self.table
        for req in sorted(table.swapped, key=lambda r: (r.priority, r.admitted_at)):
            if urgent is not None and urgent < req.priority:
                break
            while not self._swap_in_room(req) and self.config.priority_preemption:
                if not self._preempt_less_urgent(req, draft):
                    break
            if not self._swap_in_room(req):
                break
            slots = self.kv.reserve(req, req.kv_len_swapped, draft.copies)
            if slots is None:
                break
            table.swap_in(req)
            draft.swap_in.append(Swap(rid=req.rid, slots=slots))
            draft.swapped_in.add(req.rid)
