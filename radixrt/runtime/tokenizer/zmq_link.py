"""The tokenizer process's link to the scheduler process over ZeroMQ: the request front's
messages go out on a PUSH socket (a plain one: the front sends from synchronous code, and a send
returns at once while the scheduler keeps up with its queue); a task on the event loop receives
the scheduler's replies and hands them to the front (which fills the waiting requests'
streams)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

from radixrt.runtime.constrained.compiler import GrammarCompiler
from radixrt.runtime.constrained.token_table import TokenTable
from radixrt.runtime.ipc import TOKENIZER_IN, Addresses, TypedSocket
from radixrt.runtime.messages import SchedulerReady, ToScheduler
from radixrt.runtime.tokenizer.request_front import RequestFront, Stream

READY_POLL_MS = 500  # start-up: how often the processes' liveness is checked


class ZmqSchedulerLink:
    def __init__(self, tokenizer: Any, addrs: Addresses, processor: Any | None = None) -> None:
        """Make it inside the event loop that serves it (its sockets are asyncio sockets).
        processor: a vision-language model's (its prompts' images)."""
        self.info: dict[str, Any] = {}
        self._ctx = zmq.asyncio.Context()
        inbox = self._ctx.socket(zmq.PULL)
        inbox.bind(addrs.to_tokenizer)
        self._send_ctx = zmq.Context()
        outbox = self._send_ctx.socket(zmq.PUSH)
        outbox.setsockopt(zmq.LINGER, 0)
        outbox.connect(addrs.to_scheduler)
        self._in = TypedSocket(inbox, TOKENIZER_IN)
        self._out = TypedSocket(outbox, Any)
        self._grammar_dir = addrs.grammar_dir
        self._grammars: GrammarCompiler | None = None
        self._receiver: asyncio.Task | None = None
        self.front = RequestFront(tokenizer, self._send, self._grammar_compiler,
                                  processor=processor)

    async def start(self, alive: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if await self._in.sock.poll(READY_POLL_MS, zmq.POLLIN):
                msg = self._in.decode(await self._in.sock.recv())
                if isinstance(msg, SchedulerReady):
                    self.info = dict(msg.info)
                    self._receiver = asyncio.create_task(self._receive())
                    return
            if not alive():
                raise RuntimeError("a runtime process died during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the runtime was not ready after {timeout_s:.0f}s")

    async def progress(self, stream: Stream) -> None:
        await stream.wait()  # the receiving task fills it

    async def close(self) -> None:
        if self._receiver is not None:
            self._receiver.cancel()
        self._ctx.destroy(linger=0)
        self._send_ctx.destroy(linger=0)

    def _send(self, msg: ToScheduler) -> None:
        self._out.send(msg)

    async def _receive(self) -> None:
        while True:
            self.front.receive(self._in.decode(await self._in.sock.recv()))

    def _grammar_compiler(self) -> GrammarCompiler:
        """Compiles grammars for the worker: it loads them from the shared grammar folder."""
        if self._grammars is None:
            vocab = int(self.info["vocab_size"])
            table = TokenTable(self.front.tokenizer, vocab, self.info["eos_token_ids"])
            self._grammars = GrammarCompiler(
                table, self._grammar_dir, backend=self.info["grammar_backend"],
                timeout_s=self.info["grammar_compile_timeout"], check_inline=False)
        return self._grammars
