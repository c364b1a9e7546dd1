"""Process 3: the worker. Builds its worker (model, KV pool) with the one factory, reports
`WorkerReady`, then executes step plans in order."""

from __future__ import annotations

import logging
import sys

from radixrt.runtime.config import LOG_FORMAT, PARENT_POLL_MS, EngineConfig
from radixrt.runtime.ipc import WORKER_IN, Addresses, parent_alive, pull, push
from radixrt.runtime.messages import StepPlan

log = logging.getLogger("radixrt.worker")


def run_worker(config: EngineConfig, addrs: Addresses, parent_pid: int, log_level: str) -> None:
    """Entry point of the worker process (spawned by the launcher)."""
    import setproctitle
    import zmq

    from radixrt.runtime.worker.capacity import Capacity, typical_request_tokens
    from radixrt.runtime.worker.setup import build_worker

    setproctitle.setproctitle("radixrt::worker")
    logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT)
    worker, ready = build_worker(config, grammar_dir=addrs.grammar_dir)
    ctx = zmq.Context()
    plans = pull(ctx, addrs.to_worker, WORKER_IN)
    results = push(ctx, addrs.from_worker)
    results.send(ready)
    log.info("worker ready: %d KV pages of %d on %s", ready.num_pages, ready.page_size,
             ready.device)
    capacity = Capacity(ready.kv_bytes_per_token, ready.page_size, ready.num_pages,
                        ready.context_length)
    log.info("%s", capacity.describe(typical_request_tokens(ready.context_length)))
    while True:
        plan: StepPlan | None = plans.recv(timeout_ms=PARENT_POLL_MS)
        if plan is None:
            if not parent_alive(parent_pid):
                sys.exit(0)
            continue
        results.send(worker.execute(plan))
