"""The SGLang router (PyPI `sglang-router`, a Rust binary behind a Python launcher) in front of
the replicas: whether it is installed, its arguments, its process, and when it is ready.

The router runs in a helper process of its own (helper_process.py: its arguments cross on the
child's stdin) that builds `RouterArgs` and calls the package's own `launch_router`, which is what
`python -m sglang_router.launch_router` does, but with no secret on a command line (`ps` would
show an --api-key there). Beside the lifeline every helper has, it dies with its parent by
PR_SET_PDEATHSIG, which needs no Python thread: the router's native code may hold the
interpreter's lock for as long as it runs.

What it is given: every replica's URL, --host/--port, the policy, a free loopback port for its
Prometheus metrics (its default, 29000, would clash between deployments), the drain time as its
shutdown grace period, and --api-key when there is one: the router then demands that key of
clients and sends it to the replicas (with named keys, --api-key-file, it passes each client's
own Authorization header through, and its probes of /server_info go unanswered: it routes all
the same, but lists the model as "unknown").
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import logging
import os
import signal
from typing import Any

import httpx

from radixrt.runtime.config import DRAIN_TIMEOUT_S, ROUTER_READY_TIMEOUT_S
from radixrt.runtime.server_options import ServerOptions

ROUTER_INSTALL_HINT = "pip install 'radixrt[router]'"

PR_SET_PDEATHSIG = 1  # prctl(2)
log = logging.getLogger("radixrt.replicas")


def router_problem() -> str | None:
    """None when the router can run, else what to install."""
    try:
        found = importlib.util.find_spec("sglang_router") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return ("--dp-size > 1 puts the SGLang router in front of the replicas, and it is not "
                f"installed: {ROUTER_INSTALL_HINT}")
    return None


def router_version() -> str:
    try:
        return importlib.metadata.version("sglang-router")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def router_args(options: ServerOptions, worker_urls: list[str], metrics_port: int
                ) -> dict[str, Any]:
    """sglang_router.router_args.RouterArgs fields (sglang-router 0.3.2)."""
    args: dict[str, Any] = {
        "worker_urls": worker_urls,
        "host": options.host,
        "port": options.port,
        "policy": options.router_policy,
        "prometheus_host": "127.0.0.1",
        "prometheus_port": metrics_port,
        "log_level": router_log_level(options.log_level),
        "shutdown_grace_period_secs": int(DRAIN_TIMEOUT_S),
        "worker_startup_timeout_secs": int(ROUTER_READY_TIMEOUT_S),
    }
    if options.api_key:
        args["api_key"] = options.api_key
    return args


def router_log_level(level: str) -> str:
    """radixrt's (Python's) level names in the router's: debug, info, warn, error."""
    level = level.lower()
    if level in ("debug", "info"):
        return level
    return "warn" if level.startswith("warn") else "error"


def run_router(args: dict[str, Any]) -> None:
    """Entry point of the router's process."""
    die_with_parent()
    from sglang_router.launch_router import launch_router
    from sglang_router.router_args import RouterArgs

    launch_router(RouterArgs(**args))


def die_with_parent() -> None:
    """SIGTERM this process when its parent dies (Linux), and at once if it already has."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the launcher's stop() is all there is
        return
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def router_ready(url: str, replicas: int) -> bool:
    """The router answers and lists every replica as healthy."""
    try:
        r = httpx.get(f"{url}/readiness", timeout=2.0)
        return r.status_code == 200 and r.json().get("healthy_workers") == replicas
    except (httpx.HTTPError, ValueError):
        return False
