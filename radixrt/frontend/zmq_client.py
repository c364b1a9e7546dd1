"""DslClient: the frontend's ZeroMQ connection to a runtime's DSL endpoint.

One DEALER socket, owned by an asyncio loop on a background thread; any number of program
threads make calls at once, each waiting on its own queue for the replies with its call id.
A call never waits forever: a silent runtime is pinged, and a runtime that does not answer the
ping (or a local runtime process that exited) fails the call with a clear error.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from radixrt.frontend.backend import BackendError
from radixrt.runtime.config import DSL_PING_AFTER_S, DSL_PING_TIMEOUT_S, DSL_POLL_S
from radixrt.runtime.messages import DslReply, DslRequest


class DslClient:
    def __init__(self, address: str, alive: Callable[[], bool] | None = None,
                 api_key: str | None = None) -> None:
        self.address = address
        self._api_key = api_key  # sent with every request
        self._alive = alive
        self._calls: dict[int, queue.SimpleQueue] = {}
        self._ids = itertools.count(1)
        self._ids_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="radixrt-dsl-client")
        self._thread.start()
        self._closed = False
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()

    async def _open(self) -> None:
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(self.address)
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(DslReply)
        self._recv_task = asyncio.ensure_future(self._receive())

    async def _receive(self) -> None:
        while True:
            payload = await self._sock.recv()
            try:
                reply = self._decoder.decode(payload)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            waiting = self._calls.get(reply.call_id)
            if waiting is not None:
                waiting.put(reply)

    async def _send(self, request: DslRequest) -> None:
        await self._sock.send(self._encoder.encode(request))

    def call(self, on_piece: Callable[[DslReply], None] | None = None,
             timeout: float | None = None, **fields: Any) -> DslReply:
        """Send one DslRequest(**fields) and wait for its final reply; streamed replies go to
        on_piece. Raises BackendError with the runtime's message when it refuses the call."""
        if self._closed:
            raise BackendError("this runtime connection is closed")
        with self._ids_lock:
            call_id = next(self._ids)
        replies: queue.SimpleQueue = queue.SimpleQueue()
        self._calls[call_id] = replies
        try:
            self._submit(DslRequest(call_id=call_id, api_key=self._api_key, **fields))
            return self._wait(call_id, replies, on_piece, timeout, fields.get("op") != "info")
        except BaseException:
            if not self._closed:  # interrupted or failed here: the runtime can stop working
                self._submit(DslRequest(call_id=call_id, op="abort", api_key=self._api_key))
            raise
        finally:
            self._calls.pop(call_id, None)

    def _wait(self, call_id: int, replies: queue.SimpleQueue,
              on_piece: Callable[[DslReply], None] | None, timeout: float | None,
              may_ping: bool) -> DslReply:
        start = last = time.monotonic()
        while True:
            try:
                reply = replies.get(timeout=DSL_POLL_S)
            except queue.Empty:
                now = time.monotonic()
                if self._alive is not None and not self._alive():
                    raise BackendError(f"the runtime at {self.address} exited") from None
                if timeout is not None and now - start > timeout:
                    raise BackendError(
                        f"no reply from the runtime at {self.address} within {timeout:.0f} s"
                    ) from None
                if may_ping and now - last > DSL_PING_AFTER_S:
                    self.call(op="info", timeout=DSL_PING_TIMEOUT_S)  # raises if it is gone
                    last = time.monotonic()
                continue
            last = time.monotonic()
            if not reply.done:
                if on_piece is not None:
                    on_piece(reply)
                continue
            if reply.error is not None:
                raise BackendError(reply.error)
            if reply.finish_reason == "abort":
                raise BackendError(f"the runtime aborted call {call_id}")
            return reply

    def _submit(self, request: DslRequest) -> None:
        asyncio.run_coroutine_threadsafe(self._send(request), self._loop).result()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def shut() -> None:
            self._recv_task.cancel()
            self._sock.close(linger=0)
            self._ctx.term()

        asyncio.run_coroutine_threadsafe(shut(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
