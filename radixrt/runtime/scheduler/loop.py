"""The step loop: the one driver of the scheduler, for the Engine (an in-process worker), the
scheduler process (a worker process over ZeroMQ) and the simulation (a simulated worker).

One turn (`step`):
1. If a step is in flight and the planner needs it folded in first (a preemption of a request
   whose token is in flight, or a fork: the ledger's `sync_reason`), fold it in and return: the
   next turn plans afresh.
2. Plan the next step and hand it to the executor (nothing to plan: take the requests that
   ended outside any step).
3. Fold in a result: without overlap, the step just handed over; with overlap, the step before
   it, so the worker computes step t+1 while step t's result is folded in and step t+2 planned.
   A plan made before the previous result is known carries placeholders for the tokens that
   result will bring; the worker knows them when it gets there.
4. With `check_integrity`, prove the KV invariants.

The executor hands over plans and gives back results in the same order; while it waits for a
result it may do other work (the scheduler process takes in the tokenizer's messages then).

The loop owns the in-flight ledger (in_flight.py): the plans handed over and not folded in yet,
and what their results are checked against; it hands the ledger to the scheduler each turn.
"""

from __future__ import annotations

from typing import Protocol

from radixrt.runtime.messages import DISK_TIER, StepPlan, StepResult
from radixrt.runtime.scheduler.in_flight import InFlightLedger
from radixrt.runtime.scheduler.request import Request
from radixrt.runtime.scheduler.scheduler import Scheduler

PERSIST_STEP_ID = -1  # the plan that moves the cache to disk before a shutdown


class StepExecutor(Protocol):
    def submit(self, plan: StepPlan) -> None:
        """Start executing a plan (returns at once, or once it ran)."""
        ...

    def take(self) -> StepResult:
        """The result of the oldest plan submitted and not yet taken (waits for it)."""
        ...


class StepLoop:
    def __init__(self, scheduler: Scheduler, executor: StepExecutor, overlap: bool,
                 check_integrity: bool = False) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.overlap = overlap
        self.check_integrity = check_integrity
        self.in_flight = InFlightLedger()  # plans submitted, results not folded in yet
        self.syncs = 0  # folds made early because the planner needed them

    @property
    def idle(self) -> bool:
        """Nothing in flight and nothing to do."""
        return not self.in_flight and not self.scheduler.has_work

    def step(self) -> list[Request]:
        """One turn; returns the requests that got tokens or ended (their deltas are due)."""
        sched = self.scheduler
        if self.in_flight and self.in_flight.needs_sync:
            self.in_flight.synced()
            self.syncs += 1
            touched = self._fold()
        else:
            plan = sched.schedule(self.in_flight)
            touched = []
            if plan is None:
                touched = sched.take_finished_outside_step()
            else:
                self.executor.submit(plan)
                self.in_flight.handed_over(plan)
            if len(self.in_flight) > (1 if self.overlap and plan is not None else 0):
                touched += self._fold()
        if self.check_integrity:
            sched.check_integrity()  # a violation raises: fail-stop
        return touched

    def persist_cache(self) -> None:
        """Before a shutdown: fold in what is in flight, then move the whole unlocked cache to
        the disk KV tier (a warm restart's) in one plan of page moves. Nothing without a disk
        tier."""
        tiers = self.scheduler.kv.tiers
        if tiers is None or tiers.pools[DISK_TIER] is None:
            return
        while self.in_flight:
            self._fold()
        tiers.persist()
        moves = self.scheduler.kv.take_moves()
        if moves:
            self.executor.submit(StepPlan(step_id=PERSIST_STEP_ID, moves=moves,
                                          flush_disk=True))
            self.executor.take()

    def _fold(self) -> list[Request]:
        result = self.executor.take()  # its plan counts as in flight until the result is here
        plan = self.in_flight.take_oldest()
        return self.scheduler.process_results(plan, result, self.in_flight)
