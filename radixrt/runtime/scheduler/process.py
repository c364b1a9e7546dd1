"""Process 2: the scheduler. Takes requests from the tokenizer process, plans steps for the
worker process, and streams output deltas back.

Overlap scheduling: the plan for step t+1 is made and sent while the worker runs step t, and
while it waits for a result the scheduler keeps taking in the tokenizer's messages (new
requests, aborts, stop-string finishes, control calls).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import zmq

from radixrt.runtime.config import LOG_FORMAT, LOG_INTERVAL_S, PARENT_POLL_MS, EngineConfig
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
from radixrt.runtime.scheduler.output_deltas import collect_deltas
from radixrt.runtime.scheduler.request import Request
from radixrt.runtime.scheduler.scheduler import Scheduler

log = logging.getLogger("radixrt.scheduler")


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
        self.plans = plans
        self.results = results
        self.parent_pid = parent_pid
        self._last_log = time.monotonic()
        self._last_generated = 0
        self._poller = zmq.Poller()
        self._poller.register(inbox.sock, zmq.POLLIN)
        self._poller.register(results.sock, zmq.POLLIN)

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
                self.scheduler.finish(msg.rid, msg.reason)
                req = self.scheduler.requests.get(msg.rid)
                self._send([req] if req is not None else [])
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
            self.scheduler.add_request(msg.prompt_ids, params, msg.extra_key, rid=msg.rid,
                                       pin=msg.pin)
        except (ValueError, TypeError) as exc:
            self.outbox.send(SubmitError(rid=msg.rid, message=str(exc)))

    def _control(self, op: str) -> dict:
        if op == "flush_cache":
            return {"freed_tokens": self.scheduler.kv.flush()}
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
        )
        return info

    def _send(self, touched: list[Request]) -> None:
        deltas = collect_deltas(self.scheduler, touched)
        if deltas:
            self.outbox.send(DeltaBatch(deltas=deltas))

    # --- the loop ------------------------------------------------------------------------
    def run(self) -> None:
        """Overlap: step t+1 is planned and sent while the worker still runs step t (tokens
        sampled in t are placeholders in the plan; the worker knows them when it gets there);
        then t's result is folded in."""
        in_flight: StepPlan | None = None
        while True:
            idle = in_flight is None and not self.scheduler.has_work
            self.drain_inbox(PARENT_POLL_MS if idle else 0)
            if not parent_alive(self.parent_pid):
                sys.exit(0)
            if in_flight is not None and self.scheduler.needs_sync:
                self.scheduler.needs_sync = False  # a preemption waits for the step in flight
                self._fold(in_flight)
                in_flight = None
                continue
            plan = self.scheduler.schedule()
            if plan is not None:
                self.plans.send(plan)
            else:
                self._send(self.scheduler.take_finished_outside_step())
            if in_flight is not None:
                self._fold(in_flight)
            in_flight = plan
            self._maybe_log()

    def _fold(self, plan: StepPlan) -> None:
        """Wait for the step's result (handling the tokenizer's messages meanwhile), fold it in
        and send the outputs."""
        result: StepResult | None = None
        while result is None:
            ready = dict(self._poller.poll(PARENT_POLL_MS))
            if self.inbox.sock in ready:
                self.drain_inbox(0)
            if self.results.sock in ready:
                result = self.results.recv()
            elif not parent_alive(self.parent_pid):
                sys.exit(0)
        self._send(self.scheduler.process_results(plan, result))
        if self.scheduler.config.check_integrity:
            self.scheduler.check_integrity()  # a violation kills the process: fail-stop

    def _maybe_log(self) -> None:
        now = time.monotonic()
        if now - self._last_log < LOG_INTERVAL_S:
            return
        s = self.scheduler.stats_dict()
        rate = (s["generated_tokens"] - self._last_generated) / (now - self._last_log)
        self._last_log, self._last_generated = now, s["generated_tokens"]
        if s["running"] or s["waiting"] or rate:
            used = 1.0 - (s["kv_free"] + s["kv_evictable"]) / s["kv_total"]
            log.info(
                "running %d, waiting %d, swapped %d | KV used %.1f%% (cached %d tokens) | "
                "cache hit rate %.1f%% | %.1f tokens/s",
                s["running"], s["waiting"], s["swapped"], 100 * used, s["kv_evictable"],
                100 * s["cache_hit_rate"], rate,
            )


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
    scheduler = Scheduler(config, ready.num_pages, ready.context_length, ready.eos_token_ids)
    service = SchedulerService(scheduler, ready, inbox, outbox, plans, results, parent_pid)
    outbox.send(SchedulerReady(info=service._control("info")))
    log.info("scheduler ready: %s policy, %s preemption", config.schedule_policy,
             config.preemption)
    service.run()
