"""The step plan being built: what the planner (planner.py) and the room it makes by preemption
(preemption.py) add to it while one step is planned. Pure bookkeeping: no tensors."""

from __future__ import annotations

from dataclasses import dataclass, field

from radixrt.runtime.messages import Run, SlotCopy, Swap, WorkerRequest


@dataclass
class StepDraft:
    """What the current step plan accumulates while it is being built."""

    budget: int
    runs: list[Run] = field(default_factory=list)
    copies: list[SlotCopy] = field(default_factory=list)
    new_requests: list[WorkerRequest] = field(default_factory=list)
    swap_in: list[Swap] = field(default_factory=list)
    swap_out: list[Swap] = field(default_factory=list)
    planned: set[int] = field(default_factory=set)
    swapped_in: set[int] = field(default_factory=set)  # never preempted in the same plan
    prefilling: set[int] = field(default_factory=set)  # computing more than one token
    prefilling_in_flight: set[int] = field(default_factory=set)  # ... in steps not folded in
    # preempted for waiting requests (priority, fair share), or passed over by fair share: not
    # admitted by this plan
    not_admitted: set[int] = field(default_factory=set)
    sync_reason: str | None = None  # the step in flight must be folded in first (in_flight.py)
    # requests that decode after this step (its decodes, then prompts whose last chunk it
    # computes): how many speculative decoding counts when a prompt's last chunk may draft
    decoders: int = 0
