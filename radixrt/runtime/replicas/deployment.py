"""`radixrt serve --dp-size N`: start N replicas, wait until each answers /health, put the router
in front, and watch them all until SIGTERM/SIGINT (exit 0) or until any of them dies (exit 1,
everything else stopped: fail-stop, as for the processes of one server).

Order of events:
  1. refusals (no router installed, a plan that cannot work): exit 2 before anything starts;
  2. the replicas, spawned at once (they load the model in parallel), each a complete
     `radixrt serve` on a free port of --host, with exit_with_parent set;
  3. once every replica answers /health: the router on --host/--port, ready when its
     /readiness lists all N replicas healthy; then the "serving" line is logged;
  4. the watch: every CHILD_WATCH_S, a replica or router that has exited stops the deployment;
  5. stop (always, in a finally): SIGTERM to the router and every replica together (each drains
     its in-flight requests for up to DRAIN_TIMEOUT_S), SIGKILL to any still up
     REPLICA_STOP_GRACE_S later. A replica's own scheduler and worker stop with it, as ever.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from radixrt.runtime.config import (
    CHILD_WATCH_S,
    DRAIN_TIMEOUT_S,
    LOG_FORMAT,
    ROUTER_READY_TIMEOUT_S,
    STARTUP_TIMEOUT_S,
    EngineConfig,
)
from radixrt.runtime.helper_process import HelperProcess
from radixrt.runtime.ipc import parent_alive
from radixrt.runtime.launcher import served_name
from radixrt.runtime.replicas.plan import (
    ReplicaSpec,
    free_ports,
    plan_problem,
    plan_replicas,
    url_host,
)
from radixrt.runtime.replicas.router import (
    router_args,
    router_problem,
    router_ready,
    router_version,
    run_router,
)
from radixrt.runtime.server_options import ServerOptions

REPLICA_STOP_GRACE_S = 10.0  # after DRAIN_TIMEOUT_S, a replica or the router still up is killed

log = logging.getLogger("radixrt.replicas")


def serve_replicas(config: EngineConfig, options: ServerOptions) -> int:
    logging.basicConfig(level=options.log_level.upper(), format=LOG_FORMAT)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per health poll
    problem = plan_problem(config, options) or router_problem()
    if problem is None:
        try:
            specs = plan_replicas(config, options)
        except ValueError as exc:
            problem = str(exc)
    if problem is not None:
        print(f"radixrt serve: {problem}", file=sys.stderr)
        return 2
    stopping = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stopping.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    owner = os.getppid() if options.exit_with_parent else None
    deployment = Deployment(stopping, owner)
    try:
        return deployment.run(specs, config, options)
    finally:
        deployment.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_replica(spec: ReplicaSpec) -> None:
    """Entry point of a replica's process: its share of the CPU, then an ordinary serve()."""
    if spec.threads is not None:  # before torch loads (the scheduler and worker inherit it)
        os.environ["OMP_NUM_THREADS"] = str(spec.threads)
    if spec.cpus is not None:
        os.sched_setaffinity(0, spec.cpus)
    logging.basicConfig(level=spec.options.log_level.upper(),
                        format=LOG_FORMAT.replace("%(name)s", f"{spec.name} %(name)s"))
    from radixrt.runtime.launcher import serve

    sys.exit(serve(spec.config, spec.options))


class Deployment:
    """The replica and router processes, watched together and stopped together."""

    def __init__(self, stopping: threading.Event, owner: int | None) -> None:
        self.stopping = stopping  # set by SIGTERM / SIGINT
        self.owner = owner  # --exit-with-parent: the pid whose exit stops us
        self.procs: dict[str, HelperProcess] = {}
        self.failed = False  # a process died, or start-up timed out

    def run(self, specs: list[ReplicaSpec], config: EngineConfig, options: ServerOptions) -> int:
        for spec in specs:
            self.start(spec.name, run_replica, spec)
            share = f", cores {list(spec.cpus)}" if spec.cpus else ""
            threads = f", {spec.threads} thread(s){share}" if spec.threads else ""
            log.info("%s: %s (pid %d%s)", spec.name, spec.url, self.procs[spec.name].pid,
                     threads)
        if not self.wait(lambda: all(healthy(s.url) for s in specs), STARTUP_TIMEOUT_S,
                         "the replicas to answer /health"):
            return self.exit_code()
        metrics_port = free_ports("127.0.0.1", 1, avoid=set())[0]
        self.start("router", run_router,
                   router_args(options, [s.url for s in specs], metrics_port))
        url = f"http://{url_host(options.host)}:{options.port}"
        if not self.wait(lambda: router_ready(url, len(specs)), ROUTER_READY_TIMEOUT_S,
                         "the router to list every replica"):
            return self.exit_code()
        log.info("serving %s on %s through the SGLang router (sglang-router %s, policy %s) "
                 "over %d replicas; router metrics on http://127.0.0.1:%d/metrics",
                 served_name(config, options), url, router_version(), options.router_policy,
                 len(specs), metrics_port)
        self.wait(lambda: False, None, "")  # the watch: until a signal or a death
        return self.exit_code()

    def start(self, name: str, target: Callable[[Any], None], arg: Any) -> None:
        proc = HelperProcess(target, arg, name=f"radixrt-{name}")
        proc.start()
        self.procs[name] = proc

    def wait(self, done: Callable[[], bool], timeout: float | None, what: str) -> bool:
        """True once done(); False when stopped, when a process died, or after timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.stopping.is_set():
            dead = self.dead()
            if dead:
                log.error("%s; stopping every replica and the router", dead)
                self.failed = True
                return False
            if self.owner is not None and not parent_alive(self.owner):
                log.warning("the process that started the server (pid %d) is gone; stopping",
                            self.owner)
                self.stopping.set()
                return False
            if done():
                return True
            if deadline is not None and time.monotonic() > deadline:
                log.error("gave up waiting for %s after %.0f s", what, timeout)
                self.failed = True
                return False
            self.stopping.wait(CHILD_WATCH_S)
        return False

    def dead(self) -> str:
        for name, proc in self.procs.items():
            if not proc.is_alive():
                return f"{name} (pid {proc.pid}) exited with code {proc.exitcode}"
        return ""

    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def stop(self) -> None:
        """SIGTERM to all at once; SIGKILL to those still up after the drain and a grace."""
        for proc in self.procs.values():
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + DRAIN_TIMEOUT_S + REPLICA_STOP_GRACE_S
        for name, proc in self.procs.items():
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                log.warning("%s (pid %d) did not stop in time: killing it", name, proc.pid)
                proc.kill()
                proc.join(REPLICA_STOP_GRACE_S)


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False
