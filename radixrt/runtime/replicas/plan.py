"""The plan of a data-parallel deployment, made before anything starts: each replica's name, port,
devices (its own GPUs on CUDA; on the CPU its own share of the cores and threads) and options,
and the refusals of plans that cannot work, each saying what to do instead."""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass, replace

from radixrt.runtime.config import EngineConfig
from radixrt.runtime.server_options import ServerOptions

# `radixrt serve --dp-size N` (runtime/replicas/): N replicas named REPLICA_NAME_FORMAT behind the
# SGLang router (the optional dependency `radixrt[router]`), in a process of its own.
REPLICA_NAME_FORMAT = "replica-{index}"


@dataclass(frozen=True)
class ReplicaSpec:
    """One complete `radixrt serve` (tokenizer, scheduler, worker, radix cache) of N."""

    name: str
    url: str  # where the router (and an operator) reaches it
    config: EngineConfig
    options: ServerOptions  # dp_size 1, its own port, exit_with_parent, replica_name = name
    threads: int | None = None  # OMP_NUM_THREADS on the CPU (None: left as it is)
    cpus: tuple[int, ...] | None = None  # the cores it runs on (None: all of them)


def plan_problem(config: EngineConfig, options: ServerOptions) -> str | None:
    """Why this deployment cannot be planned (a command-line mistake), or None (dp_size itself
    is bounded by ServerOptions)."""
    if config.nnodes > 1:
        return ("--dp-size > 1 runs every replica on this machine; with --nnodes > 1 start one "
                "`radixrt serve` per replica (each its own --dist-init-addr) and run the router "
                "in front of them yourself")
    if config.dist_init_addr is not None:
        return ("--dist-init-addr cannot be shared by --dp-size replicas: leave it out, and "
                "each replica's tensor-parallel ranks meet on a free loopback port of their own")
    if options.dsl_port is not None and options.port in dsl_ports(options):
        return (f"--dsl-port={options.dsl_port}: replica i serves DSL clients on dsl-port + i, "
                f"which must not take the router's --port={options.port}")
    return None


def dsl_ports(options: ServerOptions) -> list[int]:
    if options.dsl_port is None:
        return []
    return [options.dsl_port + i for i in range(options.dp_size)]


def plan_replicas(config: EngineConfig, options: ServerOptions) -> list[ReplicaSpec]:
    """The replicas, on free ports of --host; ValueError when the devices are not there."""
    n = options.dp_size
    ports = free_ports(options.host, n, avoid={options.port, *dsl_ports(options)})
    host = url_host(options.host)
    if on_cpu(config):
        shares = cpu_shares(n)
        configs = [config] * n
        threads: list[int | None] = [len(s) if s else 1 for s in shares]
    else:
        shares, threads = [None] * n, [None] * n
        configs = gpu_configs(config, n)
    if config.disk_cache_dir is not None:  # one disk tier per replica, each its own folder
        configs = [replace(c, disk_cache_dir=os.path.join(config.disk_cache_dir,
                                                          REPLICA_NAME_FORMAT.format(index=i)))
                   for i, c in enumerate(configs)]
    specs = []
    for i in range(n):
        name = REPLICA_NAME_FORMAT.format(index=i)
        opts = replace(options, port=ports[i], dp_size=1, exit_with_parent=True,
                       replica_name=name,
                       dsl_port=None if options.dsl_port is None else options.dsl_port + i)
        specs.append(ReplicaSpec(name, f"http://{host}:{ports[i]}", configs[i], opts,
                                 threads[i], shares[i]))
    return specs


def on_cpu(config: EngineConfig) -> bool:
    from radixrt.runtime.worker.setup import resolve_device  # torch: only when planning

    return resolve_device(config.device).type == "cpu"


def cpu_shares(n: int) -> list[tuple[int, ...] | None]:
    """Replica i runs on cores [i * k, (i + 1) * k) of this process's k * n or more (tensor-
    parallel ranks inside it split its share further); with fewer cores than replicas, none is
    pinned and each gets one thread."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) < n:
        return [None] * n
    k = len(cores) // n
    return [tuple(cores[i * k:(i + 1) * k]) for i in range(n)]


def gpu_configs(config: EngineConfig, n: int) -> list[EngineConfig]:
    """Replica i takes tp_size GPUs of its own, from --base-gpu-id (or --device cuda:K) on."""
    import torch

    tp = config.tp_size
    index = torch.device(config.device).index if config.device.startswith("cuda") else None
    first = index if index is not None and tp == 1 else config.base_gpu_id
    visible = torch.cuda.device_count()
    if first + n * tp > visible:
        raise ValueError(f"--dp-size {n} x --tp-size {tp} needs {n * tp} GPUs from cuda:{first}; "
                         f"{visible} are visible")
    if tp == 1:
        return [replace(config, device=f"cuda:{first + i}") for i in range(n)]
    return [replace(config, device="cuda", base_gpu_id=first + i * tp) for i in range(n)]


def url_host(host: str) -> str:
    """The host part of a URL that reaches a server bound to `host` from this machine."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"[{host}]" if ":" in host else host


def free_ports(host: str, n: int, avoid: set[int]) -> list[int]:
    """n distinct ports free on `host` now (held open together, so they differ)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    bind_host = host or "0.0.0.0"
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < n:
            sock = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            sock.bind((bind_host, 0))
            port = int(sock.getsockname()[1])
            if port not in avoid:
                ports.append(port)
        return ports
