"""Process 2: the scheduler. Takes requests from the tokenizer process (intake.py, as the
Engine does by direct calls), runs the step loop (loop.py) with overlap over the ZeroMQ link to
the worker process, and streams output deltas back.

While it waits for a step's result, the scheduler keeps taking in the tokenizer's messages (new
requests, aborts, stop-string finishes, control calls): the link's `take` polls both sockets.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Callable

import zmq

from radixrt.runtime.config import LOG_FORMAT, STOP_POLL_MS
from radixrt.runtime.ipc import (
    RESULTS_IN,
    SCHEDULER_IN,
    ServiceArgs,
    TypedSocket,
    pull,
    push,
)
from radixrt.runtime.messages import (
    SchedulerReady,
    StepPlan,
    StepResult,
    ToTokenizer,
    WorkerReady,
)
from radixrt.runtime.scheduler.intake import SchedulerIntake
from radixrt.runtime.scheduler.loop import StepLoop
from radixrt.runtime.scheduler.scheduler import Scheduler

LOG_INTERVAL_S = 10.0  # the scheduler's periodic status line

log = logging.getLogger("radixrt.scheduler")


class WorkerLink:
    """The StepExecutor over ZeroMQ: plans go out on one socket, results come back on another;
    while a result is awaited, `on_wait` handles whatever the inbox holds."""

    def __init__(self, plans: TypedSocket, results: TypedSocket, inbox: TypedSocket,
                 on_wait: Callable[[], None]) -> None:
        self.plans = plans
        self.results = results
        self.inbox = inbox
        self.on_wait = on_wait
        self._poller = zmq.Poller()
        self._poller.register(inbox.sock, zmq.POLLIN)
        self._poller.register(results.sock, zmq.POLLIN)

    def submit(self, plan: StepPlan) -> None:
        self.plans.send(plan)

    def take(self) -> StepResult:
        while True:
            ready = dict(self._poller.poll())
            if self.inbox.sock in ready:
                self.on_wait()
            if self.results.sock in ready:
                result = self.results.recv()
                assert isinstance(result, StepResult), result
                return result


class SchedulerService:
    def __init__(
        self,
        scheduler: Scheduler,
        ready: WorkerReady,
        inbox: TypedSocket,
        outbox: TypedSocket,
        plans: TypedSocket,
        results: TypedSocket,
    ) -> None:
        self.scheduler = scheduler
        self.intake = SchedulerIntake(scheduler, ready)
        self.inbox = inbox
        self.outbox = outbox
        link = WorkerLink(plans, results, inbox, lambda: self.drain_inbox(0))
        self.loop = StepLoop(scheduler, link, overlap=True,
                             check_integrity=scheduler.config.check_integrity)
        self._last_log = time.monotonic()
        self._last_generated = 0
        self._last_fallbacks = 0  # swap preemptions that fell back to recompute, as last logged

    # --- messages from the tokenizer -----------------------------------------------------
    def drain_inbox(self, timeout_ms: int) -> None:
        """Handle every queued message; wait up to timeout_ms for the first one."""
        msg = self.inbox.recv(timeout_ms=timeout_ms)
        while msg is not None:
            self._send(self.intake.handle(msg))
            msg = self.inbox.recv(timeout_ms=0)

    def _send(self, replies: list[ToTokenizer]) -> None:
        for reply in replies:
            self.outbox.send(reply)

    # --- the loop ------------------------------------------------------------------------
    def run(self) -> None:
        """The step loop with overlap; between turns, the tokenizer's messages (waiting for
        them only while there is nothing to do). With a disk KV tier, SIGTERM moves the cache to
        it first, then exits 0."""
        stopping: list[int] = []
        if self.scheduler.config.disk_cache_dir is not None:  # else SIGTERM ends it at once
            signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
        while True:
            self.drain_inbox(STOP_POLL_MS if self.loop.idle else 0)
            if stopping:
                self.loop.persist_cache()
                sys.exit(0)
            self._send(self.intake.deltas(self.loop.step()))
            self._maybe_log()

    def _maybe_log(self) -> None:
        now = time.monotonic()
        if now - self._last_log < LOG_INTERVAL_S:
            return
        s = self.scheduler.stats_dict()
        rate = (s["generated_tokens"] - self._last_generated) / (now - self._last_log)
        self._last_log, self._last_generated = now, s["generated_tokens"]
        if s["running"] or s["waiting"] or rate or s["pinned"]:
            used = 1.0 - (s["kv_free"] + s["kv_evictable"]) / s["kv_total"]
            log.info(
                "running %d, waiting %d, swapped %d | KV used %.1f%% (cached %d tokens) | "
                "pinned %d (%d tokens, %d refused) | preemptions %d (%d swaps, %d recomputed "
                "as the swap space was full) | cache hit rate %.1f%% | %.1f tokens/s",
                s["running"], s["waiting"], s["swapped"], 100 * used, s["kv_evictable"],
                s["pinned"], s["pinned_tokens"], s["pins_refused"], s["preemptions"], s["swaps"],
                s["swap_fallbacks"], 100 * s["cache_hit_rate"], rate,
            )
            if s["swap_fallbacks"] > self._last_fallbacks:
                log.warning("the host swap space (%d tokens) was full: %d preemptions fell back "
                            "to recompute so far", self.scheduler.config.swap_space_tokens,
                            s["swap_fallbacks"])
                self._last_fallbacks = s["swap_fallbacks"]


def run_scheduler(args: ServiceArgs) -> None:
    """Entry point of the scheduler process (a HelperProcess of the launcher; SIGTERM stops
    it, after moving the cache to disk where there is a disk tier)."""
    import setproctitle

    config, addrs = args.config, args.addrs
    setproctitle.setproctitle("radixrt::scheduler")
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    ctx = zmq.Context()
    inbox = pull(ctx, addrs.to_scheduler, SCHEDULER_IN)
    results = pull(ctx, addrs.from_worker, RESULTS_IN)
    outbox = push(ctx, addrs.to_tokenizer)
    plans = push(ctx, addrs.to_worker)
    ready = results.recv()
    assert isinstance(ready, WorkerReady), ready
    scheduler = Scheduler.for_worker(config, ready)
    service = SchedulerService(scheduler, ready, inbox, outbox, plans, results)
    outbox.send(SchedulerReady(info=service.intake.info()))
    log.info("scheduler ready: %s policy, %s preemption", config.schedule_policy,
             config.preemption)
    service.run()
