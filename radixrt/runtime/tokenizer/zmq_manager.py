"""Process 1's side of the trio: the TokenizerManager that talks to the scheduler process over
ZeroMQ. Tokenizes, submits, turns output deltas into text (incremental detokenization, stop
strings) and streams it to the HTTP handlers."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import zmq
import zmq.asyncio

from radixrt.runtime.constrained.compiler import GrammarCompiler
from radixrt.runtime.constrained.token_table import TokenTable
from radixrt.runtime.errors import QueueFull
from radixrt.runtime.ipc import TOKENIZER_IN, Addresses, TypedSocket
from radixrt.runtime.messages import (
    AbortRequest,
    ControlReply,
    ControlRequest,
    DeltaBatch,
    SchedulerReady,
    Scheduling,
    SubmitError,
    SubmitRequest,
    UnpinRequest,
)
from radixrt.runtime.outputs import StreamChunk
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.tokenizer.manager_base import ClientIds, RequestMetrics
from radixrt.runtime.tokenizer.output_tracker import OutputTracker
from radixrt.runtime.tokenizer.prompts import Prompt, encode_checked


class ZmqTokenizerManager:
    def __init__(self, tokenizer: Any, model_name: str, addrs: Addresses) -> None:
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.context_length = 0  # known once the scheduler is ready
        self.vocab_size = len(tokenizer)
        self.info: dict[str, Any] = {}
        self._ctx = zmq.asyncio.Context()
        inbox = self._ctx.socket(zmq.PULL)
        inbox.bind(addrs.to_tokenizer)
        outbox = self._ctx.socket(zmq.PUSH)
        outbox.setsockopt(zmq.LINGER, 0)
        outbox.connect(addrs.to_scheduler)
        self._in = TypedSocket(inbox, TOKENIZER_IN)
        self._out = TypedSocket(outbox, Any)
        self._streams: dict[int, tuple[OutputTracker, asyncio.Queue]] = {}
        self._calls: dict[int, asyncio.Future] = {}
        self._rids = itertools.count()
        self._client_ids = ClientIds()
        self._call_ids = itertools.count()
        self._callbacks: list[Callable[[RequestMetrics], None]] = []
        self._pin_callbacks: list[Callable[[int], None]] = []
        self._receiver: asyncio.Task | None = None
        self._grammar_dir = addrs.grammar_dir
        self._grammars: GrammarCompiler | None = None

    # --- start-up ------------------------------------------------------------------------
    async def wait_ready(self, alive: Callable[[], bool], timeout_s: float) -> None:
        """Wait for the scheduler (which waits for the worker's model load)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if await self._in.sock.poll(500, zmq.POLLIN):
                msg = self._in.decode(await self._in.sock.recv())
                if isinstance(msg, SchedulerReady):
                    self.info = dict(msg.info)
                    self.context_length = int(msg.info["context_length"])
                    self._receiver = asyncio.create_task(self._receive())
                    return
            if not alive():
                raise RuntimeError("a runtime process died during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the runtime was not ready after {timeout_s:.0f}s")

    async def close(self) -> None:
        if self._receiver is not None:
            self._receiver.cancel()
        self._ctx.destroy(linger=0)

    # --- TokenizerManager ----------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        return encode_checked(self.tokenizer, prompt, self.vocab_size)

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        rid_hint: str | None = None,
        pin: bool = False,
        scheduling: Scheduling | None = None,
    ) -> AsyncIterator[StreamChunk]:
        scheduling = scheduling or Scheduling()
        if params.constraint is not None:  # refused here if broken; compiled off the loop
            await asyncio.wrap_future(self.grammars().compile_async(params.constraint))
        rid = next(self._rids)
        self._client_ids.add(rid_hint, rid)
        tracker = OutputTracker(self.tokenizer, rid, list(prompt_ids), params)
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[rid] = (tracker, queue)
        metrics = RequestMetrics(arrival=time.monotonic(), prompt_tokens=len(prompt_ids),
                                 priority=scheduling.priority, tenant=scheduling.tenant)
        refused = False
        await self._send(SubmitRequest(rid=rid, prompt_ids=list(prompt_ids),
                                       params=params.to_dict(), scheduling=scheduling, pin=pin))
        try:
            while not (tracker.finished and queue.empty()):  # a slow reader still gets all
                item = await queue.get()
                if isinstance(item, SubmitError):
                    refused = True
                    if item.retry_after_s > 0:
                        raise QueueFull(item.message, item.retry_after_s)
                    raise ValueError(item.message)
                metrics.record(item, time.monotonic())
                yield item
        finally:
            self._streams.pop(rid, None)
            self._client_ids.remove(rid_hint, rid)
            if not tracker.finished and not refused:
                await self._send(AbortRequest(rid=rid))  # the client went away: free its KV
            metrics.finished = time.monotonic()
            if not refused:
                for callback in self._callbacks:
                    callback(metrics)

    def grammars(self) -> GrammarCompiler:
        """Compiles grammars for the worker: it loads them from the shared grammar folder."""
        if self._grammars is None:
            vocab = int(self.info.get("vocab_size", self.vocab_size))
            eos = self.info.get("eos_token_ids", [self.tokenizer.eos_token_id])
            table = TokenTable(self.tokenizer, vocab, eos)
            self._grammars = GrammarCompiler(table, self._grammar_dir)
        return self._grammars

    async def abort(self, rid: int | str) -> int:
        rids = self._client_ids.resolve(rid)
        for one in rids:
            await self._send(AbortRequest(rid=one))
        return len(rids)

    async def unpin(self, rid: int) -> None:
        await self._send(UnpinRequest(rid=rid))

    async def flush_cache(self) -> int:
        return int((await self._call("flush_cache"))["freed_tokens"])

    async def server_info(self) -> dict[str, Any]:
        info = await self._call("info")
        info["model"] = self.model_name
        return info

    async def check_integrity(self) -> dict[str, Any]:
        return await self._call("check_integrity")

    def on_finish(self, callback: Callable[[RequestMetrics], None]) -> None:
        self._callbacks.append(callback)

    def on_pinned(self, callback: Callable[[int], None]) -> None:
        self._pin_callbacks.append(callback)

    # --- plumbing ------------------------------------------------------------------------
    async def _send(self, msg: Any) -> None:
        await self._out.sock.send(self._out.encode(msg))

    async def _call(self, op: str) -> dict[str, Any]:
        call_id = next(self._call_ids)
        future = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        await self._send(ControlRequest(call_id=call_id, op=op))
        try:
            return dict(await future)
        finally:
            self._calls.pop(call_id, None)

    async def _receive(self) -> None:
        while True:
            msg = self._in.decode(await self._in.sock.recv())
            if isinstance(msg, DeltaBatch):
                await self._apply(msg)
            elif isinstance(msg, SubmitError):
                entry = self._streams.get(msg.rid)
                if entry is not None:
                    entry[1].put_nowait(msg)
            elif isinstance(msg, ControlReply):
                future = self._calls.get(msg.call_id)
                if future is not None and not future.done():
                    future.set_result(msg.result)

    async def _apply(self, batch: DeltaBatch) -> None:
        for delta in batch.deltas:
            if delta.pinned:  # leased at once, whether or not its client is still reading
                for on_pinned in self._pin_callbacks:
                    on_pinned(delta.rid)
            entry = self._streams.get(delta.owner)
            if entry is None:
                continue
            tracker, queue = entry
            chunks, stopped = tracker.apply(delta)
            for chunk in chunks:
                queue.put_nowait(chunk)
            if stopped:  # a stop string: the scheduler ends that sample now
                await self._send(AbortRequest(rid=delta.rid, reason="stop"))
