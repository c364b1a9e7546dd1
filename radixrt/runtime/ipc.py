"""ZeroMQ plumbing shared by the three processes: addresses in a private 0700 directory, the
scheduler's and worker's start argument, typed msgpack sockets (msgspec, never pickle), and the
owner watch of `--exit-with-parent`."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from radixrt.runtime.config import EngineConfig
from radixrt.runtime.messages import FromWorker, StepPlan, ToScheduler, ToTokenizer


@dataclass(frozen=True)
class Addresses:
    """ipc:// endpoints; each is bound by its receiving side."""

    to_scheduler: str  # tokenizer -> scheduler
    to_tokenizer: str  # scheduler -> tokenizer
    to_worker: str  # scheduler -> worker (step plans)
    from_worker: str  # worker -> scheduler (results)
    grammar_dir: str = ""  # compiled grammars: the tokenizer process writes, the worker reads

    @classmethod
    def in_private_dir(cls) -> tuple[Addresses, str]:
        folder = tempfile.mkdtemp(prefix="radixrt-")  # created 0700
        os.chmod(folder, 0o700)

        def addr(name: str) -> str:
            return f"ipc://{os.path.join(folder, name)}"

        grammars = os.path.join(folder, "grammars")
        addrs = cls(addr("scheduler"), addr("tokenizer"), addr("worker"), addr("results"), grammars)
        return addrs, folder


class ServiceArgs(msgspec.Struct, frozen=True):
    """What the launcher starts the scheduler and the worker process with (HelperProcess)."""

    config: EngineConfig
    addrs: Addresses
    log_level: str
    listen_fd: int = -1  # under tensor parallelism, the worker's: the ranks' store's socket


class TypedSocket:
    """A zmq socket that sends msgspec Structs and decodes one declared type (or union)."""

    def __init__(self, sock: zmq.Socket, decode_type: Any) -> None:
        self.sock = sock
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(decode_type)

    def send(self, msg: msgspec.Struct) -> None:
        self.sock.send(self._encoder.encode(msg), copy=False)

    def recv(self, timeout_ms: int | None = None) -> Any | None:
        """The next message, or None after timeout_ms without one."""
        if timeout_ms is not None and not self.sock.poll(timeout_ms, zmq.POLLIN):
            return None
        return self._decoder.decode(self.sock.recv(copy=False).buffer)

    def recv_raw(self, timeout_ms: int | None = None) -> memoryview | None:
        """The next message's bytes, undecoded (to pass on as they are), or None."""
        if timeout_ms is not None and not self.sock.poll(timeout_ms, zmq.POLLIN):
            return None
        return self.sock.recv(copy=False).buffer

    def decode(self, data: bytes | memoryview) -> Any:
        return self._decoder.decode(data)

    def encode(self, msg: msgspec.Struct) -> bytes:
        return self._encoder.encode(msg)


def pull(ctx: zmq.Context, address: str, decode_type: Any) -> TypedSocket:
    sock = ctx.socket(zmq.PULL)
    sock.bind(address)
    return TypedSocket(sock, decode_type)


def push(ctx: zmq.Context, address: str) -> TypedSocket:
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return TypedSocket(sock, Any)


def parent_alive(parent_pid: int) -> bool:
    """Whether the process parent_pid is still this one's parent (`--exit-with-parent`; radixrt's
    own helpers have a lifeline instead: helper_process.py)."""
    return os.getppid() == parent_pid


# the decode type of each receiving end
SCHEDULER_IN = ToScheduler
TOKENIZER_IN = ToTokenizer
WORKER_IN = StepPlan
RESULTS_IN = FromWorker
