"""Tensor-parallel worker ranks: one scheduler, tp_size workers that run the same plans.

Rank 0 (the worker process, or the Engine's own process) takes each step plan and, before it
runs it, broadcasts the plan's msgspec bytes to the other ranks over the gloo group (a length,
then a uint8 tensor: never a pickled object). Every rank then applies the same plan to its own
per-request state and KV shard, runs its shard of the model (the layers' collectives keep the
ranks in step) and samples from the same full logits with the same seeds, so every rank appends
the same tokens; only rank 0's results go back to the scheduler.

The length says what follows: > 0 a plan of that many bytes, HEARTBEAT (0) nothing (rank 0
sends one when no plan went out for TP_HEARTBEAT_S, so idle followers never reach the
collective timeout), STOP (-1) the group is closing. A rank that fails (its peer died, a
collective timed out, a step raised) exits non-zero: fail-stop, the launcher takes the server
down.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import torch

from radixrt.runtime.config import LOG_FORMAT, EngineConfig
from radixrt.runtime.distributed.group import TPGroup, bind_listener
from radixrt.runtime.helper_process import HelperProcess
from radixrt.runtime.messages import StepPlan, StepResult
from radixrt.runtime.worker.cpu_waiting import model_process_env
from radixrt.runtime.worker.worker import Worker

# A collective that waits longer than this fails (the rank exits and the server with it); idle
# ranks never reach it: the leader broadcasts a heartbeat plan when no plan went out for
# TP_HEARTBEAT_S.
TP_COLLECTIVE_TIMEOUT_S = 120.0
TP_HEARTBEAT_S = 5.0
TP_STARTUP_TIMEOUT_S = 600.0  # every rank must join the group (and load its shard) within this

log = logging.getLogger("radixrt.worker")

HEARTBEAT = 0
STOP = -1
FOLLOWER_STOP_S = 10.0  # followers told to STOP get this long to exit before they are killed


class TPLeader:
    """Rank 0's plan runner: the StepExecutor's worker under tensor parallelism."""

    def __init__(self, worker: Worker, group: TPGroup,
                 on_failure: Callable[[BaseException], None] | None = None,
                 heartbeat_s: float = TP_HEARTBEAT_S) -> None:
        """on_failure: called (on the heartbeat thread) when a heartbeat fails, i.e. a
        follower is gone; the worker process exits there, the Engine raises at its next step."""
        self.worker = worker
        self.group = group
        self._encoder = msgspec.msgpack.Encoder()
        self._lock = threading.Lock()  # one broadcast (and the step after it) at a time
        self._last_sent = time.monotonic()
        self._failed: BaseException | None = None
        self._closed = threading.Event()
        self._on_failure = on_failure
        self._heartbeat_s = heartbeat_s
        self._thread = threading.Thread(target=self._heartbeats, name="radixrt-tp-heartbeat",
                                        daemon=True)
        self._thread.start()

    def execute(self, plan: StepPlan, data: bytes | None = None) -> StepResult:
        """Broadcast the plan (its bytes as received, when the caller has them) and run it."""
        if self._failed is not None:
            raise RuntimeError(f"a tensor-parallel rank failed: {self._failed}")
        payload = self._encoder.encode(plan) if data is None else bytes(data)
        with self._lock:
            try:
                self.group.broadcast_bytes(payload)
                self._last_sent = time.monotonic()
                result = self.worker.execute(plan)
                if plan.flush_disk:  # every rank's disk writes are done before it answers
                    self.group.barrier()
                return result
            except BaseException as exc:
                # the ranks may now stand at different collectives of this step: the group is
                # unusable (no heartbeat, no STOP: either would pair with a step's collective)
                self._failed = exc
                raise

    def _heartbeats(self) -> None:
        while not self._closed.wait(self._heartbeat_s / 2):
            with self._lock:
                if self._failed is not None:
                    return
                if self._closed.is_set() or time.monotonic() - self._last_sent < self._heartbeat_s:
                    continue
                try:
                    self.group.broadcast_bytes(b"", header=HEARTBEAT)
                except Exception as exc:  # noqa: BLE001 - a follower is gone: fail-stop
                    self._failed = exc
                    if self._on_failure is not None:
                        self._on_failure(exc)
                    return
                self._last_sent = time.monotonic()

    @property
    def failed(self) -> bool:
        return self._failed is not None

    def close(self) -> None:
        """Tell the followers to stop (they exit 0) and stop the heartbeat; after a failure
        the followers are left to the caller (EngineRanks kills them)."""
        self._closed.set()
        with self._lock:
            if self._failed is None:
                with contextlib.suppress(Exception):  # a follower already gone
                    self.group.broadcast_bytes(b"", header=STOP)
        self._thread.join(timeout=self._heartbeat_s)


def follow(worker: Worker, group: TPGroup) -> None:
    """A follower's loop: run every plan rank 0 broadcasts, until STOP."""
    decoder = msgspec.msgpack.Decoder(StepPlan)
    while True:
        length, data = group.broadcast_bytes(None)
        if length == STOP:
            return
        if length == HEARTBEAT:
            continue
        plan = decoder.decode(data)
        worker.execute(plan)
        if plan.flush_disk:
            group.barrier()


def join_group(config: EngineConfig, rank: int, listen: Any = None) -> TPGroup:
    """Meet the other ranks at config.dist_init_addr; the startup timeout covers loading every
    rank's shard, then collectives get TP_COLLECTIVE_TIMEOUT_S (see TPGroup.settle)."""
    from radixrt.runtime.worker.setup import dist_backend

    assert config.dist_init_addr is not None
    return TPGroup.join(rank, config.tp_size, config.dist_init_addr, dist_backend(config),
                        TP_STARTUP_TIMEOUT_S, listen)


def settle(group: TPGroup) -> None:
    """After start-up: a step's collective that waits past TP_COLLECTIVE_TIMEOUT_S fails."""
    group.set_timeout(TP_COLLECTIVE_TIMEOUT_S)


def share_cpu_threads(config: EngineConfig) -> int:
    """On the CPU, give this rank its share of the node's cores (at least 1 thread): ranks
    that each used every core would spin against each other. An explicit OMP_NUM_THREADS
    wins. Returns the previous count."""
    from radixrt.runtime.worker.setup import resolve_device

    previous = torch.get_num_threads()
    if "OMP_NUM_THREADS" in os.environ:
        return previous
    if config.tp_size > 1 and resolve_device(config.device).type == "cpu":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        torch.set_num_threads(max(1, cores // (config.tp_size // config.nnodes)))
    return previous


class FollowerArgs(msgspec.Struct, frozen=True):
    """A follower rank's start argument."""

    config: EngineConfig
    rank: int
    log_level: str
    grammar_dir: str | None = None  # where rank 0's compiled grammars are left


def follower_process(config: EngineConfig, rank: int, log_level: str,
                     grammar_dir: str | None) -> HelperProcess:
    """A follower rank's process, not started yet (its lifeline ends it with its starter)."""
    return HelperProcess(run_follower, FollowerArgs(config, rank, log_level, grammar_dir),
                         name=f"radixrt-tp{rank}", env=model_process_env())


def run_follower(args: FollowerArgs) -> None:
    """Entry point of a follower rank's process (started by the launcher or the Engine)."""
    import setproctitle

    from radixrt.runtime.worker.setup import build_worker

    config, rank = args.config, args.rank
    setproctitle.setproctitle(f"radixrt::tp{rank}")
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    share_cpu_threads(config)
    if config.disk_cache_dir:  # stop on rank 0's STOP only: its last plan may write the disk
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    grammar_dir = args.grammar_dir
    try:
        group = join_group(config, rank)
        worker, _ = build_worker(config, grammar_dir=grammar_dir, tp=group)
        settle(group)
        follow(worker, group)
        worker.close()
    except Exception as exc:  # noqa: BLE001 - any failure of a rank stops the server
        log.error("tensor-parallel rank %d failed: %s", rank, exc)
        sys.exit(1)
    log.info("tensor-parallel rank %d stopped", rank)


def rendezvous(config: EngineConfig) -> tuple[EngineConfig, Any]:
    """The config every rank starts from: with dist_init_addr as given, or a free loopback
    port, bound here (the returned socket; rank 0 serves the store from it if it runs in this
    process, else the caller closes it just before starting rank 0)."""
    if config.dist_init_addr is not None:
        if config.node_rank != 0:
            return config, None
        host, port = config.dist_init_addr.rsplit(":", 1)
        return config, bind_listener(host, int(port))
    listen = bind_listener("127.0.0.1", 0)
    return config.with_(dist_init_addr=f"127.0.0.1:{listen.getsockname()[1]}"), listen


class EngineRanks:
    """The Engine's tensor-parallel group: this process is rank 0, the followers are helper
    processes. A follower that dies during start-up fails the Engine at once; close() stops
    them (STOP, then terminate whatever is left)."""

    def __init__(self, config: EngineConfig, log_level: str = "warning",
                 grammar_dir: str | None = None) -> None:
        """grammar_dir: where the Engine's compiler leaves compiled grammars (the followers load
        them from there)."""
        self.config, listen = rendezvous(config)
        self.leader: TPLeader | None = None
        self.group: TPGroup | None = None
        self.previous_threads = share_cpu_threads(config)
        self.threads = torch.get_num_threads()
        self.procs = [follower_process(self.config, rank, log_level, grammar_dir)
                      for rank in local_follower_ranks(self.config)]
        for proc in self.procs:
            proc.start()
        self.group = self._join_watching(listen)

    def _join_watching(self, listen: Any) -> TPGroup:
        result: dict[str, Any] = {}

        def join() -> None:
            try:
                result["group"] = join_group(self.config, 0, listen)
            except Exception as exc:  # noqa: BLE001 - reported below
                result["error"] = exc

        thread = threading.Thread(target=join, name="radixrt-tp-join", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(timeout=0.2)
            dead = [p for p in self.procs if p.exitcode is not None]
            if dead and thread.is_alive():
                self.close()
                raise RuntimeError(f"tensor-parallel rank process {dead[0].name} exited with "
                                   f"code {dead[0].exitcode} during start-up")
        if "error" in result:
            self.close()
            raise RuntimeError(f"the tensor-parallel ranks did not meet: {result['error']}")
        return result["group"]

    def lead(self, worker: Worker) -> TPLeader:
        assert self.group is not None
        settle(self.group)
        self.leader = TPLeader(worker, self.group)
        return self.leader

    def close(self) -> None:
        """STOP the followers (kill them at once after a failure) and release the group."""
        failed = self.leader is None or self.leader.failed
        if self.leader is not None:
            self.leader.close()
            self.leader = None
        deadline = time.monotonic() + (0 if failed else FOLLOWER_STOP_S)
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        if self.group is not None:
            self.group.close()
        if torch.get_num_threads() == self.threads:  # nobody changed it since: put it back
            torch.set_num_threads(self.previous_threads)


def local_follower_ranks(config: EngineConfig) -> list[int]:
    """The follower ranks this node runs: node 0 runs ranks 1 .. per_node - 1 (rank 0 is its
    worker), node k runs k * per_node .. (k + 1) * per_node - 1."""
    per_node = config.tp_size // config.nnodes
    first = config.node_rank * per_node
    return [r for r in range(first, first + per_node) if r != 0]
