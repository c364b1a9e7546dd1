"""TPGroup: the tensor-parallel ranks of one model and the collectives its layers and its plan
broadcast use, over torch.distributed process groups made explicitly (no default group, no
module-level state: several groups may live in one process, as the tests' threads do).

- `cpu`: a gloo group. It carries the step plans (a length, then the msgspec bytes as a uint8
  tensor; never pickled objects) and, on the CPU, the layers' collectives too.
- `device`: the layers' group: the gloo group on the CPU, an NCCL group on CUDA.

Every rank must issue the same collectives in the same order; the plan broadcast guarantees it
(every rank runs the same plan through the same model). At size 1 every collective returns its
input: a single-rank model calls exactly the kernels it always did.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

LOOPBACK = ("127.0.0.1", "localhost")


@dataclass
class TPGroup:
    rank: int
    size: int
    cpu: Any = None  # ProcessGroupGloo, or None at size 1
    device: Any = None  # the layers' group (gloo or NCCL), or None at size 1
    store: Any = None  # the TCPStore the ranks met at (kept alive with the group)
    device_is_cuda: bool = False

    @classmethod
    def single(cls) -> TPGroup:
        return cls(rank=0, size=1)

    @classmethod
    def join(cls, rank: int, size: int, addr: str, backend: str, timeout_s: float,
             listen: socket.socket | None = None) -> TPGroup:
        """Meet the other ranks at addr (HOST:PORT; rank 0 serves the store there, from
        `listen` when the caller bound it already) and make the groups. backend: "gloo" or
        "nccl" (the layers' group; plans always go over gloo)."""
        host, port = addr.rsplit(":", 1)
        timeout = datetime.timedelta(seconds=timeout_s)
        if rank == 0 and listen is None:
            listen = bind_listener(host, int(port))
        # the store owns a duplicate of the listening socket: it must stay open as long as the
        # store's daemon thread polls it, whatever happens to the Python socket object
        fd = os.dup(listen.fileno()) if rank == 0 and listen is not None else None
        if listen is not None:
            listen.close()
        store = dist.TCPStore(host, int(port), size, is_master=rank == 0, timeout=timeout,
                              master_listen_fd=fd, use_libuv=False)
        cpu = _gloo(dist.PrefixStore("cpu", store), rank, size, host, int(port), timeout)
        device = cpu
        if backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            device = dist.ProcessGroupNCCL(dist.PrefixStore("nccl", store), rank, size, opts)
        return cls(rank, size, cpu, device, store, backend == "nccl")

    # --- the layers' collectives ---------------------------------------------------------
    def all_reduce(self, x: Tensor) -> Tensor:
        """Sum of x over the ranks (in place; x is returned)."""
        if self.size == 1:
            return x
        self.device.allreduce([x]).wait()
        return x

    def all_gather(self, x: Tensor) -> Tensor:
        """[rows, n] on every rank -> [rows, size * n]: the ranks' pieces side by side."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self.device.allgather([parts], [x.contiguous()]).wait()
        return torch.cat(parts, dim=-1)

    # --- the plan link and agreement (gloo, host memory) ---------------------------------
    def min_int(self, value: int) -> int:
        """The smallest of the ranks' values (the KV pool size they agree on)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        self.cpu.allreduce([t], dist.ReduceOp.MIN).wait()
        return int(t.item())

    def broadcast_bytes(self, data: bytes | None, header: int | None = None) -> tuple[int, bytes]:
        """Rank 0 sends (header, data); every other rank passes None and receives them. The
        header is len(data) unless given (a negative header is a signal with no data)."""
        length = torch.tensor([0 if data is None else
                               (len(data) if header is None else header)], dtype=torch.int64)
        self.cpu.broadcast(length, 0).wait()
        n = int(length.item())
        if n <= 0:
            return n, b""
        if self.rank == 0:
            assert data is not None
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            buf = torch.empty(n, dtype=torch.uint8)
        self.cpu.broadcast(buf, 0).wait()
        return n, data if self.rank == 0 and data is not None else buf.numpy().tobytes()

    def set_timeout(self, seconds: float) -> None:
        """The timeout of every later collective (start-up may take longer than a step)."""
        if self.size == 1:
            return
        timeout = datetime.timedelta(seconds=seconds)
        for group in {id(self.cpu): self.cpu, id(self.device): self.device}.values():
            group._set_default_timeout(timeout)

    def close(self) -> None:
        """Release the process groups and the store (their threads and sockets); the group
        takes no collective after this."""
        if self.device is not None and self.device is not self.cpu:
            with contextlib.suppress(Exception):
                self.device.shutdown()
        self.cpu = self.device = self.store = None

    def barrier(self) -> None:
        if self.size > 1:
            self.cpu.barrier().wait()


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one) for rank 0's store: bound to
    the host the ranks meet at, so a loopback group is reachable from this machine only."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host if host not in ("localhost",) else "127.0.0.1", port))
    sock.listen(128)
    return sock


def _gloo(store: Any, rank: int, size: int, host: str, port: int,
          timeout: datetime.timedelta) -> Any:
    """The gloo group, listening on GLOO_SOCKET_IFNAME's interfaces when set (torch's own
    convention), on loopback for a loopback group, else on this machine's address that routes
    to the rendezvous host (its hostname may resolve to 127.0.1.1, unreachable from others)."""
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    gloo = dist.ProcessGroupGloo
    names = [n for n in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n]
    if names:
        opts._devices = [gloo.create_device(interface=name) for name in names]
    elif host in LOOPBACK:
        opts._devices = [gloo.create_device(hostname="127.0.0.1")]
    else:
        opts._devices = [gloo.create_device(hostname=_route_to(host, port))]
    return dist.ProcessGroupGloo(store, rank, size, opts)


def _route_to(host: str, port: int) -> str:
    """This machine's address on the route to host (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        return probe.getsockname()[0]
