"""DslClient: the frontend's ZeroMQ connection to a runtime's DSL endpoint.

One DEALER socket, owned by an asyncio loop on a background thread; any number of program
threads make calls at once (`call`), each waiting on its own queue for the replies with its call
id, and so does async code on any other event loop (`acall`: the replies are handed to that loop),
so thousands of asyncio programs share the one connection and the one thread.
A call never waits forever: a silent runtime is pinged, and a runtime that does not answer the
ping (or a local runtime process that exited) fails the call with a clear error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from radixrt.frontend.lang.backend import BackendError, RuntimeUnreachable
from radixrt.runtime.messages import DslReply, DslRequest

DSL_POLL_S = 0.5  # a waiting DSL call wakes this often to check the runtime is still there
DSL_PING_AFTER_S = 20.0  # a call with no reply this long pings the runtime ...
DSL_PING_TIMEOUT_S = 30.0  # ... and fails if the ping gets no answer this long


class DslClient:
    def __init__(self, address: str, alive: Callable[[], bool] | None = None,
                 api_key: str | None = None) -> None:
        self.address = address
        self._api_key = api_key  # sent with every request
        self._alive = alive
        self._calls: dict[int, Callable[[DslReply], None]] = {}  # call id -> where replies go
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
            deliver = self._calls.get(reply.call_id)
            if deliver is not None:
                deliver(reply)

    async def _send(self, request: DslRequest) -> None:
        await self._sock.send(self._encoder.encode(request))

    def call(self, on_piece: Callable[[DslReply], None] | None = None,
             timeout: float | None = None, **fields: Any) -> DslReply:
        """Send one DslRequest(**fields) and wait for its final reply; streamed replies go to
        on_piece. Raises BackendError with the runtime's message when it refuses the call."""
        call_id = self._new_call()
        replies: queue.SimpleQueue = queue.SimpleQueue()
        self._calls[call_id] = replies.put
        try:
            self._submit(DslRequest(call_id=call_id, api_key=self._api_key, **fields))
            return self._wait(call_id, replies, on_piece, timeout, fields.get("op") != "info")
        except BaseException:
            self._abort(call_id)
            raise
        finally:
            self._calls.pop(call_id, None)

    async def acall(self, on_piece: Callable[[DslReply], None] | None = None,
                    timeout: float | None = None, **fields: Any) -> DslReply:
        """`call` for async code: awaits the reply on the caller's event loop. Cancelling it
        aborts the call in the runtime (its KV is freed)."""
        call_id = self._new_call()
        loop = asyncio.get_running_loop()
        replies: asyncio.Queue[DslReply] = asyncio.Queue()
        def deliver(reply: DslReply) -> None:
            with contextlib.suppress(RuntimeError):  # the caller's loop closed meanwhile
                loop.call_soon_threadsafe(replies.put_nowait, reply)

        self._calls[call_id] = deliver
        try:
            request = DslRequest(call_id=call_id, api_key=self._api_key, **fields)
            await self._asend(request)
            start = last = time.monotonic()
            while True:
                try:
                    reply = await asyncio.wait_for(replies.get(), DSL_POLL_S)
                except asyncio.TimeoutError:
                    if self._silent_too_long(start, last, timeout, fields.get("op") != "info"):
                        await self.acall(op="info", timeout=DSL_PING_TIMEOUT_S)  # or raises
                        last = time.monotonic()
                    continue
                last = time.monotonic()
                final = self._handle(call_id, reply, on_piece)
                if final is not None:
                    return final
        except BaseException:
            self._abort(call_id)
            raise
        finally:
            self._calls.pop(call_id, None)

    async def _asend(self, request: DslRequest) -> None:
        """Send without blocking the caller's loop; a runtime that exited, or that takes no
        requests for DSL_PING_TIMEOUT_S (its queue full), fails the call."""
        sent = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._send(request),
                                                                    self._loop))
        start = time.monotonic()
        try:
            while not (await asyncio.wait({sent}, timeout=DSL_POLL_S))[0]:
                self._silent_too_long(start, start, DSL_PING_TIMEOUT_S, False)  # or raises
        finally:
            sent.cancel()  # a no-op once sent
        sent.result()

    def _new_call(self) -> int:
        if self._closed:
            raise BackendError("this runtime connection is closed")
        with self._ids_lock:
            return next(self._ids)

    def _abort(self, call_id: int) -> None:
        """Tell the runtime to stop a call (interrupted or failed here), without waiting for the
        send: a runtime that stopped reading must not stall the caller."""
        if not self._closed:
            request = DslRequest(call_id=call_id, op="abort", api_key=self._api_key)
            asyncio.run_coroutine_threadsafe(self._send(request), self._loop)

    def _wait(self, call_id: int, replies: queue.SimpleQueue,
              on_piece: Callable[[DslReply], None] | None, timeout: float | None,
              may_ping: bool) -> DslReply:
        start = last = time.monotonic()
        while True:
            try:
                reply = replies.get(timeout=DSL_POLL_S)
            except queue.Empty:
                if self._silent_too_long(start, last, timeout, may_ping):
                    self.call(op="info", timeout=DSL_PING_TIMEOUT_S)  # raises if it is gone
                    last = time.monotonic()
                continue
            last = time.monotonic()
            final = self._handle(call_id, reply, on_piece)
            if final is not None:
                return final

    def _silent_too_long(self, start: float, last: float, timeout: float | None,
                         may_ping: bool) -> bool:
        """No reply for a poll interval: raise if the runtime exited or the call timed out;
        True when it is time to ping the runtime."""
        now = time.monotonic()
        if self._alive is not None and not self._alive():
            raise RuntimeUnreachable(f"the runtime at {self.address} exited")
        if timeout is not None and now - start > timeout:
            raise RuntimeUnreachable(f"no reply from the runtime at {self.address} within "
                               f"{timeout:.0f} s")
        return may_ping and now - last > DSL_PING_AFTER_S

    @staticmethod
    def _handle(call_id: int, reply: DslReply,
                on_piece: Callable[[DslReply], None] | None) -> DslReply | None:
        """A streamed piece goes to on_piece (None returned); the final reply is returned, or
        raises BackendError when the runtime refused or aborted the call."""
        if not reply.done:
            if on_piece is not None:
                on_piece(reply)
            return None
        if reply.error is not None:
            raise BackendError(reply.error)
        if reply.finish_reason == "abort":
            raise BackendError(f"the runtime aborted call {call_id}")
        return reply

    def _submit(self, request: DslRequest) -> None:
        sent = asyncio.run_coroutine_threadsafe(self._send(request), self._loop)
        try:
            sent.result(timeout=DSL_PING_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            sent.cancel()
            raise RuntimeUnreachable(f"the runtime at {self.address} took no request for "
                               f"{DSL_PING_TIMEOUT_S:.0f} s (its queue is full)") from None

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
