"""Process 2: the scheduler. Takes requests from the tokenizer process, runs the step loop
(loop.py) with overlap over the ZeroMQ link to the worker process, and streams output deltas
back.

While it waits for a step's result, the scheduler keeps taking in the tokenizer's messages (new
requests, aborts, stop-string finishes, control calls): the link's `take` polls both sockets.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from radixrt.runtime.config import LOG_FORMAT, PARENT_POLL_MS, EngineConfig
from radixrt.runtime.errors import QueueFull
from radixrt.runtime.ipc import (
    RESULTS_IN,
    SCHEDULER_IN,
    Addresses,
    TypedSocket,
    parent_alive,
    pull,
    push,
)
from radixrt.runtime.messages import (
    AbortRequest,
    ControlReply,
    ControlRequest,
    DeltaBatch,
    SchedulerReady,
    StepPlan,
    StepResult,
    SubmitError,
    SubmitRequest,
    UnpinRequest,
    WorkerReady,
)
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.scheduler.loop import StepLoop
from radixrt.runtime.scheduler.request import Request
from radixrt.runtime.scheduler.scheduler import Scheduler

LOG_INTERVAL_S = 10.0  # the scheduler's periodic status line

log = logging.getLogger("radixrt.scheduler")


class WorkerLink:
    """The StepExecutor over ZeroMQ: plans go out on one socket, results come back on another;
    while a result is awaited, `on_wait` handles whatever the inbox holds."""

    def __init__(self, plans: TypedSocket, results: TypedSocket, inbox: TypedSocket,
                 on_wait: Callable[[], None], parent_pid: int) -> None:
        self.plans = plans
        self.results = results
        self.inbox = inbox
        self.on_wait = on_wait
        self.parent_pid = parent_pid
        self._poller = zmq.Poller()
        self._poller.register(inbox.sock, zmq.POLLIN)
        self._poller.register(results.sock, zmq.POLLIN)

    def submit(self, plan: StepPlan) -> None:
        self.plans.send(plan)

    def take(self) -> StepResult:
        while True:
            ready = dict(self._poller.poll(PARENT_POLL_MS))
            if self.inbox.sock in ready:
                self.on_wait()
            if self.results.sock in ready:
                result = self.results.recv()
                assert isinstance(result, StepResult), result
                return result
            if not parent_alive(self.parent_pid):
                sys.exit(0)


class SchedulerService:
    def __init__(
        self,
        scheduler: Scheduler,
        ready: WorkerReady,
        inbox: TypedSocket,
        outbox: TypedSocket,
        plans: TypedSocket,
        results: TypedSocket,
        parent_pid: int,
    ) -> None:
        self.scheduler = scheduler
        self.ready = ready
        self.inbox = inbox
        self.outbox = outbox
        self.parent_pid = parent_pid
        link = WorkerLink(plans, results, inbox, lambda: self.drain_inbox(0), parent_pid)
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
            self.handle(msg)
            msg = self.inbox.recv(timeout_ms=0)

    def handle(self, msg: Any) -> None:
        if isinstance(msg, SubmitRequest):
            self._submit(msg)
        elif isinstance(msg, AbortRequest):
            if msg.reason == "abort":
                self._send(self.scheduler.abort(msg.rid))
            else:
                self._send(self.scheduler.finish(msg.rid, msg.reason))
        elif isinstance(msg, UnpinRequest):
            self.scheduler.unpin(msg.rid)
        elif isinstance(msg, ControlRequest):
            self.outbox.send(ControlReply(call_id=msg.call_id, result=self._control(msg.op)))

    def _submit(self, msg: SubmitRequest) -> None:
        try:
            params = SamplingParams.from_dict(msg.params)
            params.validate_for_vocab(self.ready.vocab_size)
            bad = [t for t in msg.prompt_ids if not 0 <= t < self.ready.vocab_size]
            if bad:
                raise ValueError(
                    f"prompt token ids {bad[:5]} are outside the vocabulary "
                    f"[0, {self.ready.vocab_size})"
                )
            self.scheduler.add_request(msg.prompt_ids, params, msg.scheduling, rid=msg.rid,
                                       pin=msg.pin)
        except QueueFull as exc:
            self.outbox.send(SubmitError(rid=msg.rid, message=str(exc),
                                         retry_after_s=exc.retry_after_s))
        except (ValueError, TypeError) as exc:
            self.outbox.send(SubmitError(rid=msg.rid, message=str(exc)))

    def _control(self, op: str) -> dict:
        if op == "flush_cache":
            return {"freed_tokens": self.scheduler.flush_cache()}
        if op == "check_integrity":
            try:
                self.scheduler.check_integrity()
            except RuntimeError as exc:
                return {"ok": False, "error": str(exc)}
            return {"ok": True}
        info = self.scheduler.stats_dict()
        info.update(
            device=self.ready.device,
            dtype=self.ready.dtype,
            context_length=self.scheduler.context_length,
            schedule_policy=self.scheduler.config.schedule_policy,
            preemption=self.scheduler.config.preemption,
            disable_radix_cache=self.scheduler.config.disable_radix_cache,
            vocab_size=self.ready.vocab_size,
            eos_token_ids=list(self.ready.eos_token_ids),
            tensor_parallel=msgspec.to_builtins(self.ready.tp) if self.ready.tp else None,
        )
        return info

    def _send(self, touched: list[Request]) -> None:
        deltas = self.scheduler.take_deltas(touched)
        if deltas:
            self.outbox.send(DeltaBatch(deltas=deltas))

    # --- the loop ------------------------------------------------------------------------
    def run(self) -> None:
        """The step loop with overlap; between turns, the tokenizer's messages (waiting for
        them only while there is nothing to do)."""
        while True:
            self.drain_inbox(PARENT_POLL_MS if self.loop.idle else 0)
            if not parent_alive(self.parent_pid):
                sys.exit(0)
            self._send(self.loop.step())
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


def run_scheduler(config: EngineConfig, addrs: Addresses, parent_pid: int, log_level: str) -> None:
    """Entry point of the scheduler process (spawned by the launcher)."""
    import setproctitle

    setproctitle.setproctitle("radixrt::scheduler")
    logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT)
    ctx = zmq.Context()
    inbox = pull(ctx, addrs.to_scheduler, SCHEDULER_IN)
    results = pull(ctx, addrs.from_worker, RESULTS_IN)
    outbox = push(ctx, addrs.to_tokenizer)
    plans = push(ctx, addrs.to_worker)
    ready = None
    while ready is None:
        ready = results.recv(timeout_ms=PARENT_POLL_MS)
        if not parent_alive(parent_pid):
            sys.exit(0)
    assert isinstance(ready, WorkerReady), ready
    scheduler = Scheduler.for_worker(config, ready)
    service = SchedulerService(scheduler, ready, inbox, outbox, plans, results, parent_pid)
    outbox.send(SchedulerReady(info=service._control("info")))
    log.info("scheduler ready: %s policy, %s preemption", config.schedule_policy,
             config.preemption)
    service.run()
