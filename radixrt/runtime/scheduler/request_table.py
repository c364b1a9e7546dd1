"""Every request the scheduler holds, the queue each one is in, and every transition of its
life: the planner and the folder move requests only through these methods.

Lifecycle (`Phase`), each transition one method:

    (new) --enqueue--> WAITING --start--> RUNNING --end--> FINISHED
    RUNNING --preempt_recompute--> WAITING
    RUNNING --swap_out--> SWAPPED --swap_in--> RUNNING
    WAITING or SWAPPED --end--> FINISHED

- `enqueue`: a new request joins the waiting queue (`requeue` is the queue's one way in).
- `start`: WAITING -> RUNNING, once the planner admitted and reserved its KV.
- `preempt_recompute`: RUNNING -> WAITING. Its KV is released into the radix tree (its re-prefill
  is mostly a cache hit), the worker forgets it in the next plan, and its epoch moves on, so the
  results of its steps still in flight are dropped (in_flight.py).
- `swap_out`: RUNNING -> SWAPPED; the worker copies its KV to host memory (the planner puts the
  copy in the plan). `swap_in`: SWAPPED -> RUNNING, into its place in admission order.
- `plan_fork` (planning the step that samples an n > 1 parent's first token) names its children;
  `fork` (folding that step in) makes them, RUNNING on the parent's KV, and ends the parent.
- Every ending, whatever its cause (a finished output, an abort, a stop string, an error, an
  n > 1 parent handing over to its children), goes through `end`, which undoes exactly what the
  request's phase holds:
  - WAITING: it leaves the queue; KV it was given by an admission that then failed is released
    uncached (nothing new was computed).
  - SWAPPED: it leaves the swap list; its host KV is dropped by the worker (a free in the next
    plan).
  - RUNNING: it leaves the running list; a pinned request that ended normally keeps its prefix
    locked; its KV is released into the radix tree; the worker forgets it in the next plan (a
    "forked" parent excepted: the worker dropped it itself when it forked).

The table also carries what the next plan owes the worker whether or not steps are in flight:
the frees (`take_pending_free`) and the pages computed twice at once, to de-duplicate
(`mark_for_dedupe`, `take_dedupe`). What exists only because steps are in flight is the step
loop's (in_flight.py).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Sequence

from radixrt.runtime.messages import OutputDelta
from radixrt.runtime.scheduler.fair_share import FairShare
from radixrt.runtime.scheduler.kv_manager import KVManager
from radixrt.runtime.scheduler.radix_cache import RadixNode
from radixrt.runtime.scheduler.request import Phase, Request
from radixrt.runtime.scheduler.stats import count_capped
from radixrt.runtime.trace_messages import RequestTrace

FORKED = "forked"  # finish reason of an n > 1 parent once its children exist
NORMAL_ENDINGS = ("stop", "length")  # endings that keep a pinned request's prefix


class RequestTable:
    def __init__(self, kv: KVManager, pin_budget_tokens: int, fair: FairShare) -> None:
        self.kv = kv
        self.pin_budget_tokens = pin_budget_tokens  # pins may keep at most this many locked
        self.pins_refused = 0
        self.requests: dict[int, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []  # admission order
        self.swapped: list[Request] = []
        self.children: dict[int, list[int]] = {}  # n > 1 parent rid -> child rids
        self.pins: dict[int, RadixNode] = {}  # rid -> node its finished prefix keeps locked
        self.swap_used = 0  # host slots holding swapped-out KV
        self.pending_free: list[int] = []  # rids the worker forgets in the next plan
        self.finished_outside_step: list[Request] = []  # ended with no step to report them
        self.dedupe: dict[int, int] = {}  # rid -> pages that may duplicate the tree's
        self.fair = fair  # tenants' weights and virtual times
        self.waiting_by_tenant: Counter[str] = Counter()
        self._rids = itertools.count()
        self._child_rids = itertools.count(-1, -1)  # n > 1 samples: never clash with clients'
        self._arrivals = itertools.count()
        self._admissions = itertools.count()

    # --- ids ---------------------------------------------------------------------------------
    def new_rid(self) -> int:
        return next(self._rids)

    def new_child_rid(self) -> int:
        return next(self._child_rids)

    def next_arrival(self) -> int:
        return next(self._arrivals)

    # --- transitions -------------------------------------------------------------------------
    def enqueue(self, req: Request) -> None:
        """A new request joins the waiting queue."""
        if req.rid < 0 or req.rid in self.requests:
            raise ValueError(f"request id {req.rid} is negative or already in use")
        self.requests[req.rid] = req
        req.submitted_s = time.monotonic()
        self.requeue(req)

    def requeue(self, req: Request) -> None:
        """Into the waiting queue (new, or preempted by recompute)."""
        if not self.waiting_by_tenant[req.tenant]:  # the tenant becomes backlogged
            self.fair.backlogged(req.tenant, +self.waiting_by_tenant)
        self.waiting_by_tenant[req.tenant] += 1
        req.phase = Phase.WAITING
        self.waiting.append(req)

    def _unqueue(self, req: Request) -> None:
        self.waiting.remove(req)
        self.waiting_by_tenant[req.tenant] -= 1
        if not self.waiting:
            self.fair.idle()  # the busy period ends
            self.waiting_by_tenant.clear()

    def admittable(self) -> list[Request]:
        """Waiting requests that may be admitted: those whose grammar is still compiling wait
        (and count against the queue caps) but are not admitted yet."""
        return [r for r in self.waiting if r.grammar_ready]

    def queued(self, tenant: str | None = None) -> int:
        """Waiting requests (of `tenant` only, when given)."""
        return len(self.waiting) if tenant is None else self.waiting_by_tenant[tenant]

    def running_by_tenant(self) -> dict[str, int]:
        """Running requests per tenant (at most MAX_METRIC_LABELS tenants; the rest "other")."""
        counts: dict[str, int] = {}
        for req in self.running:
            count_capped(counts, req.tenant)
        return counts

    def start(self, req: Request) -> None:
        """WAITING -> RUNNING (its KV was admitted and reserved by the planner)."""
        self._unqueue(req)
        req.phase = Phase.RUNNING
        req.outputs_at_start = req.num_known_outputs
        req.admitted_at = next(self._admissions)
        self.running.append(req)

    def preempt_recompute(self, req: Request) -> None:
        """RUNNING -> WAITING: its KV is released, its tokens stay in the radix tree (the
        re-prefill is mostly a cache hit), and results planned before now no longer apply."""
        self.running.remove(req)
        req.num_preemptions += 1
        req.epoch += 1  # results of its steps still in flight no longer apply
        if not req.prompt_logprobs_done:
            req.prompt_logprobs.clear()  # gathered again on re-admission
        self.kv.release(req)
        self.pending_free.append(req.rid)
        self.requeue(req)

    def swap_out(self, req: Request) -> None:
        """RUNNING -> SWAPPED: its KV goes to host memory (the plan carries the copy)."""
        self.running.remove(req)
        req.num_preemptions += 1
        req.kv_len_swapped = req.kv_len
        self.swap_used += req.kv_len
        self.kv.release(req, cache=False)
        req.phase = Phase.SWAPPED
        self.swapped.append(req)

    def swap_in(self, req: Request) -> None:
        """SWAPPED -> RUNNING, back in its place in admission order (its KV was reserved by
        the planner; the plan carries the copy back)."""
        self.swapped.remove(req)
        self.swap_used -= req.kv_len_swapped
        req.phase = Phase.RUNNING
        req.outputs_at_start = req.num_known_outputs
        self.running.append(req)
        self.running.sort(key=lambda r: r.admitted_at)

    def plan_fork(self, parent: Request) -> list[int]:
        """n > 1: the step that samples the parent's first token forks it; its children's ids,
        recorded now so that an abort finds them."""
        child_rids = [self.new_child_rid() for _ in range(parent.fork_count)]
        self.children[parent.rid] = child_rids
        parent.forking = True
        return child_rids

    def fork(self, parent: Request, children: Sequence[Request]) -> None:
        """The forking step is folded in: the children (RUNNING) start on the parent's KV, right
        after it in admission order, and the parent ends as "forked"."""
        position = self.running.index(parent)
        for i, child in enumerate(children):
            self.requests[child.rid] = child
            self.kv.share(parent, child)
            self.running.insert(position + 1 + i, child)
        self.end(parent, FORKED)  # the worker dropped the parent itself

    def end(self, req: Request, reason: str) -> None:
        """The one way a request ends (see the module docstring)."""
        if req.finished:
            return
        if req.phase is Phase.WAITING:
            self._unqueue(req)
            if req.pages or req.tree_node is not None:
                self.kv.release(req, cache=False)
        elif req.phase is Phase.SWAPPED:
            self.swapped.remove(req)
            self.swap_used -= req.kv_len_swapped
            self.pending_free.append(req.rid)
        elif req.phase is Phase.RUNNING:
            self.running.remove(req)
            if req.pin and reason in NORMAL_ENDINGS:
                self._pin(req)
            self.kv.release(req, cache=reason != FORKED)
            if reason != FORKED:
                self.pending_free.append(req.rid)
        req.phase = Phase.FINISHED
        req.finish_reason = reason

    def _pin(self, req: Request) -> None:
        node = self.kv.pin(req, self.pins.values(), self.pin_budget_tokens)
        if node is not None:
            self.pins[req.rid] = node
        elif req.tree_node is not None:  # cached, but past the budget
            self.pins_refused += 1
            req.pin_error = (
                f"not pinned: the pinned prefixes would hold "
                f"{self.kv.pinned_tokens([*self.pins.values(), req.tree_node])} KV tokens, past "
                f"the pin budget of {self.pin_budget_tokens} (--max-pinned-fraction of the "
                f"{self.kv.capacity_tokens}-token pool); the prefix stays cached but evictable. "
                "Unpin (join) earlier pins, or raise --max-pinned-fraction")

    def fail(self, req: Request, message: str) -> None:
        """End with an error outside any step's results (reported by the next step)."""
        self.end(req, f"error: {message}")
        self.finished_outside_step.append(req)

    def abort(self, rid: int) -> list[Request]:
        """Abort a request at any stage, its n > 1 samples too. Returns the requests ended."""
        req = self.requests.get(rid)
        if req is None:
            return []
        if req.forking and not req.finished:  # its children exist once the fork is folded in
            req.abort_requested = True
            return []
        aborted = []
        for child in self.children.get(rid, []):
            aborted += self.abort(child)
        if not req.finished:
            self.end(req, "abort")
            aborted.append(req)
        return aborted

    def unpin(self, rid: int) -> bool:
        """Release the prefix a pinned request kept locked; False when nothing was pinned."""
        node = self.pins.pop(rid, None)
        if node is None:
            return False
        self.kv.unpin(node)
        return True

    def forget(self, rid: int) -> None:
        """Drop a finished request's record once its last output was taken."""
        req = self.requests.get(rid)
        if req is not None and req.finished:
            del self.requests[rid]
            self.children.pop(rid, None)

    def mark_for_dedupe(self, rid: int, num_pages: int) -> None:
        """Its first `num_pages` pages may hold a prefix the tree holds in others (computed twice
        at once): the next plan moves it onto the tree's pages."""
        self.dedupe[rid] = num_pages

    def take_dedupe(self) -> dict[int, int]:
        out, self.dedupe = self.dedupe, {}
        return out

    def take_pending_free(self) -> list[int]:
        out, self.pending_free = self.pending_free, []
        return out

    def take_finished_outside_step(self) -> list[Request]:
        out, self.finished_outside_step = self.finished_outside_step, []
        return out

    @property
    def has_work(self) -> bool:
        """Anything to plan: a request waiting only for its grammar is not (the scheduler
        process then waits for messages instead of spinning)."""
        return bool(self.running or self.swapped or self.pending_free
                    or any(r.grammar_ready for r in self.waiting))

    # --- outputs -----------------------------------------------------------------------------
    def take_deltas(self, touched: Sequence[Request]) -> list[OutputDelta]:
        """What each touched sample gained since it was last reported; a finished request's
        record (and, once all its samples are done, its parent's) is dropped after its last
        delta. In-flight placeholders are never reported."""
        deltas: list[OutputDelta] = []
        for req in touched:
            if req.finish_reason == FORKED:
                continue  # its children carry the outputs from here on
            known = req.num_known_outputs
            if req.num_sent == known and not req.finished:
                continue
            owner = req.parent_rid if req.parent_rid is not None else req.rid
            first = req.num_sent == 0
            new = req.output_ids[req.num_sent : known]
            lps = req.output_logprobs[req.num_sent : known] if req.params.wants_logprobs else []
            req.num_sent = known
            parent = self.requests.get(owner) if req.parent_rid is not None else req
            timed = parent if parent is not None else req
            timings = first and new and timed.admitted_s >= 0
            index = req.seed_offset if req.parent_rid is not None or req.params.n == 1 else -1
            deltas.append(
                OutputDelta(
                    rid=req.rid,
                    owner=owner,
                    index=index,
                    token_ids=new,
                    logprobs=list(lps),
                    finish_reason=req.finish_reason,
                    cached_tokens=parent.cached_len if parent is not None else req.cached_len,
                    prompt_logprobs=list(parent.prompt_logprobs) if first and parent else [],
                    queue_s=timed.admitted_s - timed.submitted_s if timings else -1.0,
                    prefill_s=time.monotonic() - timed.admitted_s if timings else -1.0,
                    pinned=req.finished and req.rid in self.pins,
                    pin_error=req.pin_error if req.finished else None,
                    pooled=req.pooled if req.finished else b"",
                    trace=self._final_trace(req) if req.finished else None,
                )
            )
            if req.finished:
                self._forget_sample(req)
        return deltas

    @staticmethod
    def _final_trace(req: Request) -> RequestTrace | None:
        if req.trace is None:
            return None
        req.trace.preemptions += req.num_preemptions  # (a fork's: its parent's, before it)
        return req.trace

    def _forget_sample(self, req: Request) -> None:
        self.forget(req.rid)
        if req.parent_rid is None:
            return
        siblings = self.children.get(req.parent_rid, [])
        if all(rid not in self.requests for rid in siblings):
            self.forget(req.parent_rid)

    # --- accounting --------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise RuntimeError on any KV leak, double free or miscount."""
        for req in self.waiting + self.swapped:
            if req.pages or req.tree_node is not None:
                raise RuntimeError(f"request {req.rid} holds KV while {req.phase.value}")
        self.kv.check_integrity(self.running)
        swapped = sum(r.kv_len_swapped for r in self.swapped)
        if swapped != self.swap_used:
            raise RuntimeError(f"swap accounting: {swapped} swapped != {self.swap_used} used")
