"""What the scheduler remembers only because steps are in flight: the in-flight ledger.

Overlap scheduling plans step t+1 while the worker runs step t, so every plan is made before the
results of the steps ahead of it are known, and is folded in a turn after it was made. The
ledger keeps, per step in flight, what its result must be checked against when it arrives:

- When a plan is made (`record_plan`, by the planner): the epoch of each run's request, and the
  requests whose prompt chunks the step computes. Later plans read the latter (`prefilling`): a
  request that shares such a prompt waits for it to reach the radix tree rather than compute it
  a second time.
- When jump-forward makes a token known early (`presolve`, by the folder): the token that the
  newest step in flight samples for that request is already in place, so that step's result for
  it is skipped.
- When a result is folded in (`fold`, by the folder): the step's record is taken out and checked
  against. A run whose request was preempted by recompute after it was planned carries an older
  epoch than the request's (`StepInFlight.is_stale`). That request gave up its KV, is queued
  again and will compute those tokens afresh, so the stale result is dropped whole and cannot
  touch its new state: that is why a preemption need not wait for the steps in flight. A swap
  keeps the epoch: the swapped request's KV and tokens survive; it is just not running to take
  the result.

Some changes cannot be made while a step is in flight: a running request whose sampled token is
still in flight is not preempted (that token is not known yet, and a preempted request keeps
every token it has), an n > 1 parent's children exist only once its fork is folded in, and a
request whose drafts are verified in flight goes on from wherever the verification stops
(speculator.py). The planner then asks for a sync (`request_sync`, with the reason), and the
step loop folds the step in flight in before it plans again. Folding the newest plan in leaves
nothing in flight, which settles any sync asked for.

The step loop (loop.py) owns the ledger: it hands plans to the executor (`handed_over`) and takes
the oldest back when its result comes (`take_oldest`); each turn it passes the ledger to
`Scheduler.schedule` and `Scheduler.process_results`, which hand it to the planner and the
folder. Without overlap a plan is folded in before the next one is made: each record lives for
one turn, nothing is stale, nothing is presolved and no sync is asked for.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from radixrt.runtime.messages import StepPlan
from radixrt.runtime.scheduler.request import Request

# why the step loop must fold the step in flight in before it plans again
SYNC_FORK = "an n > 1 request forks in the step in flight"
SYNC_PREEMPT = "the request to preempt samples a token in the step in flight"
SYNC_SPECULATE = "drafts are verified in the step in flight: where decoding goes on depends on it"


@dataclass
class StepInFlight:
    """What one planned step's result is checked against when it is folded in."""

    epochs: dict[int, int] = field(default_factory=dict)  # rid -> its request's epoch at plan
    prefilling: set[int] = field(default_factory=set)  # rids whose prompt chunks it computes
    presolved: set[int] = field(default_factory=set)  # rids whose sampled token is known already
    planned_at: float = field(default_factory=time.time)  # wall clock (traced requests' chunks)

    def is_stale(self, req: Request) -> bool:
        """The request was preempted by recompute after this step was planned."""
        return self.epochs.get(req.rid, req.epoch) != req.epoch


class InFlightLedger:
    """The plans in flight and, per step, what its result is checked against (see above)."""

    def __init__(self) -> None:
        self._handed_over: deque[StepPlan] = deque()  # to the executor, result not folded in
        self._steps: dict[int, StepInFlight] = {}  # step id -> its record, until folded in
        self._newest = 0  # id of the newest plan made
        self.sync_reason: str | None = None  # why the loop must fold before planning again

    # --- the step loop -----------------------------------------------------------------------
    def __len__(self) -> int:
        """Plans handed to the executor whose results are not folded in yet."""
        return len(self._handed_over)

    def handed_over(self, plan: StepPlan) -> None:
        self._handed_over.append(plan)

    @property
    def oldest(self) -> StepPlan | None:
        """The plan whose result the executor gives back next."""
        return self._handed_over[0] if self._handed_over else None

    def take_oldest(self) -> StepPlan:
        return self._handed_over.popleft()

    @property
    def needs_sync(self) -> bool:
        """Fold the step in flight in before planning again (see `sync_reason`)."""
        return self.sync_reason is not None

    def synced(self) -> None:
        self.sync_reason = None

    # --- the planner -------------------------------------------------------------------------
    def record_plan(self, step_id: int, epochs: dict[int, int], prefilling: set[int]) -> None:
        self._steps[step_id] = StepInFlight(epochs, prefilling)
        self._newest = step_id

    def prefilling(self) -> set[int]:
        """Requests whose prompt chunks the steps in flight compute."""
        return set().union(*(step.prefilling for step in self._steps.values()))

    def request_sync(self, reason: str) -> None:
        """The plan being made needs the step in flight folded in first (the first reason
        asked for is kept)."""
        if self.sync_reason is None:
            self.sync_reason = reason

    # --- the folder --------------------------------------------------------------------------
    def presolve(self, rid: int) -> None:
        """The token the newest step in flight samples for `rid` is known already."""
        self._steps[self._newest].presolved.add(rid)

    def fold(self, step_id: int) -> StepInFlight:
        """Take out the record of the step whose result is being folded in."""
        if step_id == self._newest:
            self.synced()  # nothing is in flight any more
        return self._steps.pop(step_id, StepInFlight())

    # --- inspection --------------------------------------------------------------------------
    def presolving(self, rid: int) -> list[StepInFlight]:
        """The steps in flight that sample a token for `rid` that is known already."""
        return [step for step in self._steps.values() if rid in step.presolved]
