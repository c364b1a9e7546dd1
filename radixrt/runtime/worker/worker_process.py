"""Process 3: the worker. Builds its worker (model, KV pool) with the one factory, reports
`WorkerReady`, then executes step plans in order. Under tensor parallelism it is rank 0: it
passes every plan's bytes on to the other ranks (worker/tp_ranks.py) before running it."""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

from radixrt.runtime.config import LOG_FORMAT, PARENT_POLL_MS, EngineConfig
from radixrt.runtime.ipc import WORKER_IN, Addresses, parent_alive, pull, push
from radixrt.runtime.messages import StepPlan

log = logging.getLogger("radixrt.worker")


def run_worker(config: EngineConfig, addrs: Addresses, parent_pid: int, log_level: str,
               listen: Any = None) -> None:
    """Entry point of the worker process (spawned by the launcher). listen: under tensor
    parallelism, the bound socket rank 0 serves the ranks' store from."""
    import setproctitle
    import zmq

    from radixrt.runtime.worker.capacity import Capacity, typical_request_tokens
    from radixrt.runtime.worker.setup import build_worker
    from radixrt.runtime.worker.tp_ranks import TPLeader, join_group, settle, share_cpu_threads

    setproctitle.setproctitle("radixrt::worker")
    logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT)
    group = leader = None
    if config.tp_size > 1:
        share_cpu_threads(config)
        group = join_group(config, 0, listen)
    worker, ready = build_worker(config, grammar_dir=addrs.grammar_dir, tp=group)
    if group is not None:
        settle(group)
        leader = TPLeader(worker, group, on_failure=_follower_lost)
        log.info("tensor parallelism: %s", ready.tp)
    ctx = zmq.Context()
    plans = pull(ctx, addrs.to_worker, WORKER_IN)
    results = push(ctx, addrs.from_worker)
    results.send(ready)
    log.info("worker ready: %d KV pages of %d on %s", ready.num_pages, ready.page_size,
             ready.device)
    capacity = Capacity(ready.kv_bytes_per_token, ready.page_size, ready.num_pages,
                        ready.context_length)
    log.info("%s", capacity.describe(typical_request_tokens(ready.context_length)))
    stopping: list[int] = []  # SIGTERM: finish the step, tell the other ranks, exit 0
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    while not stopping:
        data = plans.recv_raw(timeout_ms=PARENT_POLL_MS)
        if data is None:
            if not parent_alive(parent_pid):
                break
            continue
        plan: StepPlan = plans.decode(data)
        results.send(worker.execute(plan) if leader is None else leader.execute(plan, data))
    if leader is not None:
        leader.close()
    worker.close()  # the disk KV tier's pending writes finish
    sys.exit(0)


def _follower_lost(exc: BaseException) -> None:
    """A heartbeat found a follower rank gone: stop now (the launcher takes the server down)."""
    log.error("a tensor-parallel rank is gone (%s); the worker stops", exc)
    logging.shutdown()
    os._exit(1)
