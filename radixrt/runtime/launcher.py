"""`radixrt serve`: start the scheduler and worker processes, run the tokenizer process (HTTP)
here, and keep the three alive together (fail-stop) or shut them down together."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import uvicorn

from radixrt.runtime.config import (
    CHILD_WATCH_S,
    DEFAULT_MODEL,
    DRAIN_TIMEOUT_S,
    LOG_FORMAT,
    STARTUP_TIMEOUT_S,
    EngineConfig,
)
from radixrt.runtime.helper_process import HelperProcess
from radixrt.runtime.ipc import Addresses, ServiceArgs, parent_alive
from radixrt.runtime.server_options import ServerOptions
from radixrt.runtime.worker.cpu_waiting import model_process_env

if TYPE_CHECKING:
    from radixrt.runtime.server.core.tenants import ApiKeys

# At a stop with a disk KV tier, the scheduler gets this long to move the cache to disk.
PERSIST_TIMEOUT_S = 120.0

log = logging.getLogger("radixrt.serve")


def served_name(config: EngineConfig, options: ServerOptions) -> str:
    if options.served_model_name:
        return options.served_model_name
    if config.model == DEFAULT_MODEL:
        return DEFAULT_MODEL
    return os.path.basename(os.path.normpath(config.model))


def serve(config: EngineConfig, options: ServerOptions) -> int:
    """Run the server until SIGTERM/SIGINT (exit 0) or until a process dies (exit 1). One
    replica: `--dp-size N` runs N of these behind the router (runtime/replicas/)."""
    import setproctitle

    from radixrt.runtime.models.loader import load_processor, load_tokenizer
    from radixrt.runtime.scheduler.scheduler_process import run_scheduler
    from radixrt.runtime.server.core.tenants import api_keys, with_key_weights
    from radixrt.runtime.tokenizer.media_fetch import MediaPolicy
    from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager
    from radixrt.runtime.tokenizer.zmq_link import ZmqSchedulerLink
    from radixrt.runtime.worker.worker_process import run_worker

    logging.basicConfig(level=options.log_level.upper(), format=LOG_FORMAT)
    if config.node_rank > 0:
        return serve_worker_node(config, options)
    setproctitle.setproctitle("radixrt::tokenizer")
    keys = api_keys(options.api_key, options.api_key_file)
    media = MediaPolicy(allowed_domains=options.allowed_media_domains,  # what image URLs reach
                        allowed_local_path=options.allowed_local_media_path,
                        timeout_s=options.media_fetch_timeout)
    config = with_key_weights(config, keys)  # the scheduler weighs the tenants the keys name
    owner = os.getppid() if options.exit_with_parent else None
    addrs, ipc_dir = Addresses.in_private_dir()
    try:
        tokenizer = load_tokenizer(config.model)
        processor = load_processor(config.model)
        config, listen = _with_rendezvous(config)
        args = ServiceArgs(config, addrs, options.log_level)
        worker_args = args if listen is None else ServiceArgs(
            config, addrs, options.log_level, listen_fd=listen.fileno())
        procs = {
            "scheduler": HelperProcess(run_scheduler, args, name="radixrt-scheduler"),
            "worker": HelperProcess(run_worker, worker_args, name="radixrt-worker",
                                    pass_fds=() if listen is None else (listen.fileno(),),
                                    env=model_process_env()),
            **_follower_processes(config, options, addrs.grammar_dir),
        }
        if config.tp_size > 1:
            log.info("tensor parallelism: %d ranks over %d node(s), meeting at %s",
                     config.tp_size, config.nnodes, config.dist_init_addr)
        for proc in procs.values():
            proc.start()
        if listen is not None:
            listen.close()  # the worker process (rank 0) holds its duplicate
        try:
            # the manager's asyncio sockets must be made inside the loop that serves them
            name = served_name(config, options)
            dsl = [f"ipc://{os.path.join(ipc_dir, 'dsl')}"]
            if options.dsl_port is not None:
                dsl.append(f"tcp://{options.host}:{options.dsl_port}")
            return asyncio.run(
                _serve_http(lambda: TokenizerManager(ZmqSchedulerLink(tokenizer, addrs, processor),
                                                     name, media),
                            procs, options, keys, dsl, owner)
            )
        finally:
            _stop(procs, persist=config.disk_cache_dir is not None)
    finally:
        shutil.rmtree(ipc_dir, ignore_errors=True)


def _with_rendezvous(config: EngineConfig) -> tuple[EngineConfig, Any]:
    """Under tensor parallelism: the address the ranks meet at (a free loopback port unless
    --dist-init-addr names one) and its listening socket, bound here and handed to the worker
    process (rank 0 serves the store from it: no other process can take the port between)."""
    if config.tp_size == 1:
        return config, None
    from radixrt.runtime.worker.tp_ranks import rendezvous

    return rendezvous(config)


def _follower_processes(config: EngineConfig, options: ServerOptions,
                        grammar_dir: str | None) -> dict[str, HelperProcess]:
    """This node's tensor-parallel follower ranks (rank 0 is the worker process)."""
    from radixrt.runtime.worker.tp_ranks import follower_process, local_follower_ranks

    return {f"tensor-parallel rank {rank}": follower_process(config, rank, options.log_level,
                                                             grammar_dir)
            for rank in local_follower_ranks(config)}


def serve_worker_node(config: EngineConfig, options: ServerOptions) -> int:
    """`--node-rank` > 0: run this node's tensor-parallel ranks only, until they stop (exit 0
    when rank 0 closed the group, 1 when a rank failed) or SIGTERM/SIGINT (exit 0)."""
    import setproctitle

    setproctitle.setproctitle(f"radixrt::node{config.node_rank}")
    procs = _follower_processes(config, options, None)
    for proc in procs.values():
        proc.start()
    log.info("node %d of %d: tensor-parallel ranks %s, meeting at %s", config.node_rank,
             config.nnodes, ", ".join(p.name for p in procs.values()), config.dist_init_addr)
    stopping: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: stopping.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stopping:
            dead = [p for p in procs.values() if not p.is_alive()]
            if dead:
                failed = [p for p in dead if p.exitcode != 0]
                if failed:
                    log.error("%s", _dead({p.name: p for p in failed}))
                    return 1
                if len(dead) == len(procs):
                    log.info("rank 0 closed the group; node %d stops", config.node_rank)
                    return 0
            time.sleep(CHILD_WATCH_S)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _stop(procs)


async def _serve_http(
    make_manager: Callable[[], Any],
    procs: dict[str, HelperProcess],
    options: ServerOptions,
    keys: ApiKeys | None,
    dsl_addresses: list[str],
    owner: int | None,
) -> int:
    from radixrt.runtime.server.core.dashboard_auth import RedactKeys
    from radixrt.runtime.server.dsl.dsl_endpoint import DslEndpoint
    from radixrt.runtime.server.http_server import create_app
    from radixrt.runtime.server.openai.chat_tool_plan import ChatFeatures
    from radixrt.runtime.tokenizer.pin_leases import PinService

    def alive() -> bool:
        owner_alive = owner is None or parent_alive(owner)
        return owner_alive and all(p.is_alive() for p in procs.values())

    tracer = None
    if options.otlp_traces_endpoint is not None:
        from radixrt.runtime.tokenizer.request_tracer import RequestTracer

        try:
            tracer = RequestTracer(options.otlp_traces_endpoint)
        except (RuntimeError, ValueError) as exc:
            log.error("%s", exc)
            return 1
    manager = make_manager()
    if tracer is not None:
        manager.trace_with(tracer)
    try:
        await manager.wait_ready(alive, STARTUP_TIMEOUT_S)
    except (RuntimeError, TimeoutError) as exc:
        log.error("%s: %s", exc, _dead(procs) or "start-up timed out")
        return 1
    pins = PinService(manager, options.pin_lease_ttl_s)  # HTTP and DSL pins: the same leases
    features = ChatFeatures.of(manager.tokenizer, options.tool_call_parser,
                               options.reasoning_parser, options.tool_call_enforcement)
    app = create_app(manager, pins=pins, keys=keys, features=features,
                     replica=options.replica_name, openapi=not options.disable_openapi,
                     dashboard=not options.disable_dashboard,
                     dashboard_show_text=options.dashboard_show_text, tracer=tracer)
    dsl = DslEndpoint(manager, dsl_addresses, keys, pins, features)
    dsl.start()
    server = _Server(
        uvicorn.Config(
            app,
            host=options.host,
            port=options.port,
            log_level=options.log_level.lower(),
            timeout_graceful_shutdown=int(DRAIN_TIMEOUT_S),
        )
    )
    logging.getLogger("uvicorn.access").addFilter(RedactKeys())  # after uvicorn's log config
    exit_code = 0

    async def watch() -> None:
        nonlocal exit_code
        while not server.should_exit:
            await asyncio.sleep(CHILD_WATCH_S)
            dead = _dead(procs)
            if dead:
                log.error("%s; shutting the server down", dead)
                exit_code = 1
                server.should_exit = server.force_exit = True
            elif owner is not None and not parent_alive(owner):
                log.warning("the process that started the server (pid %d) is gone; stopping",
                            owner)
                server.should_exit = server.force_exit = True

    watcher = asyncio.create_task(watch())
    log.info("serving %s on http://%s:%d; DSL clients: %s", manager.model_name, options.host,
             options.port, ", ".join(dsl_addresses))
    await server.serve()
    watcher.cancel()
    await dsl.close()
    pins.close()
    await manager.close()
    if tracer is not None:
        tracer.shutdown()  # what is batched goes out
    if exit_code == 0 and _dead(procs):
        exit_code = 1
    return exit_code


def _dead(procs: dict[str, HelperProcess]) -> str:
    for name, proc in procs.items():
        if not proc.is_alive():
            return f"the {name} process died (exit code {proc.exitcode})"
    return ""


def _stop(procs: dict[str, HelperProcess], persist: bool = False) -> None:
    """persist (a disk KV tier): the scheduler first, given PERSIST_TIMEOUT_S to move the cache
    to disk through the worker (while the worker lives); then the rest."""
    scheduler, worker = procs.get("scheduler"), procs.get("worker")
    if persist and scheduler is not None and worker is not None and worker.is_alive():
        if scheduler.is_alive():
            scheduler.terminate()
        scheduler.join(timeout=PERSIST_TIMEOUT_S)
    for proc in procs.values():
        if proc.is_alive():
            proc.terminate()
    for proc in procs.values():
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)


class _Server(uvicorn.Server):
    """uvicorn.Server whose signal handling drains and returns instead of re-raising the signal
    (uvicorn re-raises it after shutdown, which would skip stopping the child processes)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        previous = {
            sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
