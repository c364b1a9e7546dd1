"""Process 3: the worker. Builds its worker (model, KV pool) with the one factory, reports
`WorkerReady`, then executes step plans in order. Under tensor parallelism it is rank 0: it
passes every plan's bytes on to the other ranks (worker/tp_ranks.py) before running it."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys

from radixrt.runtime.config import LOG_FORMAT, STOP_POLL_MS
from radixrt.runtime.ipc import WORKER_IN, ServiceArgs, pull, push
from radixrt.runtime.messages import StepPlan

log = logging.getLogger("radixrt.worker")


def run_worker(args: ServiceArgs) -> None:
    """Entry point of the worker process (a HelperProcess of the launcher). Under tensor
    parallelism, args.listen_fd is the bound socket rank 0 serves the ranks' store from.
    SIGTERM (the launcher's stop, or its lifeline's end): finish the step, stop the other
    ranks, exit 0."""
    import setproctitle
    import zmq

    from radixrt.runtime.worker.capacity import Capacity, typical_request_tokens
    from radixrt.runtime.worker.setup import build_worker
    from radixrt.runtime.worker.tp_ranks import TPLeader, join_group, settle, share_cpu_threads

    config, addrs = args.config, args.addrs
    setproctitle.setproctitle("radixrt::worker")
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    group = leader = None
    if config.tp_size > 1:
        share_cpu_threads(config)
        listen = socket.socket(fileno=args.listen_fd) if args.listen_fd >= 0 else None
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
    log.info("weights: %s", ", ".join(f"{fmt} {size / 2**20:.1f} MiB"
                                      for fmt, size in ready.weight_formats.items()))
    if ready.cpu is not None:
        log.info("CPU: %d threads, kernels %s; OpenMP waits: %s", ready.cpu.threads,
                 "on" if ready.cpu.kernels else "off", ready.cpu.openmp_wait)
    capacity = Capacity(ready.kv_bytes_per_token, ready.page_size, ready.num_pages,
                        ready.context_length)
    log.info("%s", capacity.describe(typical_request_tokens(ready.context_length)))
    stopping: list[int] = []  # SIGTERM: finish the step, tell the other ranks, exit 0
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    while not stopping:
        data = plans.recv_raw(timeout_ms=STOP_POLL_MS)
        if data is None:
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
