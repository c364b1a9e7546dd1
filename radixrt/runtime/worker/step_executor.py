"""Step executors over an in-process Worker (the StepExecutor protocol of scheduler/loop.py):
`InlineExecutor` runs each plan as it is submitted; `ThreadExecutor` runs plans on one worker
thread, so the scheduler plans step t+1 while the worker computes step t (overlap). The
scheduler process's executor is the ZeroMQ link to the worker process instead."""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from radixrt.runtime.messages import StepPlan, StepResult


class PlanRunner(Protocol):
    """What runs a plan: the Worker, or rank 0's TPLeader (worker/tp_ranks.py)."""

    def execute(self, plan: StepPlan) -> StepResult: ...


class InlineExecutor:
    def __init__(self, worker: PlanRunner) -> None:
        self.worker = worker
        self._results: deque[StepResult] = deque()

    def submit(self, plan: StepPlan) -> None:
        self._results.append(self.worker.execute(plan))

    def take(self) -> StepResult:
        return self._results.popleft()

    def close(self) -> None:
        """Nothing to stop: plans run on the caller's thread."""


class ThreadExecutor:
    def __init__(self, worker: PlanRunner) -> None:
        self.worker = worker
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="radixrt-worker")
        self._results: deque[Future[StepResult]] = deque()

    def submit(self, plan: StepPlan) -> None:
        self._results.append(self._pool.submit(self.worker.execute, plan))

    def take(self) -> StepResult:
        return self._results.popleft().result()  # re-raises the worker's exception

    def close(self) -> None:
        self._pool.shutdown(wait=True)
