"""Process 3: the worker. Loads the model, sizes the KV pool, then executes step plans."""

from __future__ import annotations

import logging
import sys

from radixrt.runtime.config import LOG_FORMAT, PARENT_POLL_MS, EngineConfig
from radixrt.runtime.ipc import WORKER_IN, Addresses, parent_alive, pull, push
from radixrt.runtime.messages import StepPlan, WorkerReady

log = logging.getLogger("radixrt.worker")


def run_worker(config: EngineConfig, addrs: Addresses, parent_pid: int, log_level: str) -> None:
    """Entry point of the worker process (spawned by the launcher)."""
    import setproctitle
    import zmq

    from radixrt.runtime.engine import pool_pages, resolve_device_dtype
    from radixrt.runtime.forward.kv_cache import KVCache
    from radixrt.runtime.models.loader import load_model
    from radixrt.runtime.worker.worker import Worker

    setproctitle.setproctitle("radixrt::worker")
    logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT)
    device, dtype = resolve_device_dtype(config)
    backend = config.attention_backend
    if backend == "auto":
        backend = "triton" if device.type == "cuda" else "torch"
    loaded = load_model(
        config.model, dtype=dtype, device=device, load_format=config.load_format,
        attention_backend=backend,
    )
    per_token = KVCache.bytes_per_token_for(loaded.config, dtype)
    num_pages = pool_pages(config, per_token, device)
    worker = Worker(
        loaded, num_pages * config.page_size, seed=config.seed,
        cuda_graph_max_bs=config.cuda_graph_max_bs, grammar_dir=addrs.grammar_dir,
        jump_forward=not config.disable_jump_forward,
    )
    ctx = zmq.Context()
    plans = pull(ctx, addrs.to_worker, WORKER_IN)
    results = push(ctx, addrs.from_worker)
    results.send(
        WorkerReady(
            num_pages=num_pages,
            page_size=config.page_size,
            context_length=config.context_length or loaded.config.max_position_embeddings,
            vocab_size=loaded.config.vocab_size,
            eos_token_ids=list(loaded.config.eos_token_ids),
            device=str(device),
            dtype=str(dtype).removeprefix("torch."),
        )
    )
    log.info("worker ready: %d KV pages of %d on %s", num_pages, config.page_size, device)
    while True:
        plan: StepPlan | None = plans.recv(timeout_ms=PARENT_POLL_MS)
        if plan is None:
            if not parent_alive(parent_pid):
                sys.exit(0)
            continue
        results.send(worker.execute(plan))
