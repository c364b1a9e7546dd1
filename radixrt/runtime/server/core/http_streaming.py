"""Running requests for the HTTP layer: submit and surface refusals before any byte is sent,
stream several prompts as one, collect whole outputs, and abort when the client goes away.

Every stream handed out here is closed on every path (aclose), so closing it, or cancelling the
task that iterates it, reaches manager.generate's generator and aborts the request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from radixrt.runtime.config import QUEUE_TIMEOUT
from radixrt.runtime.errors import QueueFull
from radixrt.runtime.image_messages import ImageInput
from radixrt.runtime.messages import Scheduling, TokenLogprob
from radixrt.runtime.outputs import StreamChunk
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.server.core.error_shapes import APIError, error_message, param_of
from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager

SHOULD_RETRY_HEADER = "x-should-retry"  # read by the OpenAI and Anthropic Python clients

DISCONNECT_POLL_S = 0.05  # how often a non-streaming request checks that its client is still there

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its response was ready."""


class PrimedStream:
    """A request's chunk stream whose first chunk has already arrived."""

    def __init__(self, source: AsyncIterator[StreamChunk], first: StreamChunk | None) -> None:
        self._source = source
        self._first = first
        self.rid = first.rid if first is not None else None  # the runtime's id, for /abort

    def __aiter__(self) -> PrimedStream:
        return self

    async def __anext__(self) -> StreamChunk:
        if self._first is not None:
            chunk, self._first = self._first, None
            return chunk
        return await self._source.__anext__()

    async def aclose(self) -> None:
        close = getattr(self._source, "aclose", None)
        if close is not None:
            await close()


async def open_stream(
    manager: TokenizerManager, ids: list[int], params: SamplingParams, rid_hint: str | None,
    scheduling: Scheduling, pin: bool = False, images: Sequence[ImageInput] = (),
) -> PrimedStream:
    """Submit and wait for the first chunk: a refusal raises APIError while the HTTP response
    can still say so: 400 for bad input (ValueError, or an "error: ..." finish before any
    output), 429 with Retry-After for a full queue, 408 for a queue timeout. images: the
    prompt's (TokenizerManager.encode_images)."""
    source = manager.generate(ids, params, rid_hint, pin=pin, scheduling=scheduling,
                              images=images)
    try:
        first = await source.__anext__()
    except StopAsyncIteration:
        first = None
    except QueueFull as exc:
        raise queue_full(str(exc), exc.retry_after_s) from None
    except ValueError as exc:
        raise APIError(str(exc), param=param_of(str(exc))) from None
    except BaseException:
        await PrimedStream(source, None).aclose()
        raise
    message = error_message(first.finish_reason) if first is not None else None
    if message is not None and not first.token_ids:  # type: ignore[union-attr]
        await PrimedStream(source, None).aclose()
        if message.startswith(QUEUE_TIMEOUT):
            # 408, which OpenAI's and Anthropic's clients retry by default: exactly when the
            # server is congested. `x-should-retry: false` (those clients obey it over the
            # status) says that the request timed out in the queue, as its `timeout` asked.
            raise APIError(message, status=408, code="queue_timeout", param="timeout",
                           headers={SHOULD_RETRY_HEADER: "false"})
        raise APIError(message)
    return PrimedStream(source, first)


def queue_full(message: str, retry_after_s: int) -> APIError:
    """429 with Retry-After: a queue is at its cap."""
    return APIError(message, status=429, code="queue_full", type="rate_limit_exceeded",
                    headers={"Retry-After": str(retry_after_s)})


async def open_streams(
    manager: TokenizerManager,
    ids_list: Sequence[list[int]],
    params_list: Sequence[SamplingParams],
    rid_hint: str | Sequence[str] | None,
    scheduling: Scheduling,
    pin: bool = False,
    images_list: Sequence[Sequence[ImageInput]] | None = None,
) -> list[PrimedStream]:
    """Submit several prompts concurrently (so they batch); if one is refused or the caller is
    cancelled, close the ones already open. rid_hint: the id the client sees, one for all the
    prompts or one per prompt; images_list: each prompt's images (None: none)."""
    hints = [rid_hint] * len(ids_list) if rid_hint is None or isinstance(rid_hint, str) else (
        list(rid_hint))
    images = images_list if images_list is not None else [()] * len(ids_list)
    tasks = [asyncio.ensure_future(open_stream(manager, ids, p, hint, scheduling, pin, shown))
             for ids, p, hint, shown in zip(ids_list, params_list, hints, images, strict=True)]
    try:
        await asyncio.wait(tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await _close_opened(tasks)
        raise
    failures = [t.exception() for t in tasks if t.exception() is not None]
    if failures:
        await _close_opened(tasks)
        raise failures[0]  # type: ignore[misc]
    return [t.result() for t in tasks]


async def _close_opened(tasks: Sequence[asyncio.Future[PrimedStream]]) -> None:
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is None:
            await task.result().aclose()


async def merge_streams(
    streams: Sequence[PrimedStream],
) -> AsyncGenerator[tuple[int, StreamChunk], None]:
    """(stream index, chunk) pairs from all streams as they arrive; closes them all at the end."""
    queue: asyncio.Queue[tuple[int, StreamChunk | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: PrimedStream) -> None:
        try:
            async for chunk in stream:
                await queue.put((i, chunk))
        except Exception as exc:  # handed to the consumer, which raises it
            await queue.put((i, exc))
        finally:
            await queue.put((i, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await stream.aclose()


# --- whole outputs -----------------------------------------------------------------------------


@dataclass
class SampleOutput:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    matched_stop: str | None = None  # the stop string that ended it, if one did

    def add(self, chunk: StreamChunk) -> None:
        self.text += chunk.text
        self.token_ids += chunk.token_ids
        self.logprobs += chunk.logprobs
        self.finish_reason = chunk.finish_reason or self.finish_reason
        self.matched_stop = chunk.matched_stop or self.matched_stop


@dataclass
class PromptOutput:
    prompt_tokens: int
    samples: list[SampleOutput]
    cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # when asked for
    pinned: bool = False  # asked to pin: the prefix is pinned (its rid is the pin id) ...
    pin_error: str | None = None  # ... or why not
    pooled: list[float] = field(default_factory=list)  # a pooling request's vector or logits

    def add(self, chunk: StreamChunk) -> None:
        self.samples[chunk.index].add(chunk)
        if chunk.pooled:
            self.pooled = chunk.pooled
        self.cached_tokens = max(self.cached_tokens, chunk.cached_tokens)
        if chunk.prompt_logprobs:
            self.prompt_logprobs = list(chunk.prompt_logprobs)
        self.pinned = self.pinned or chunk.pinned
        self.pin_error = self.pin_error or chunk.pin_error

    @property
    def completion_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.samples)


async def collect(stream: PrimedStream, prompt_tokens: int, n: int) -> PromptOutput:
    out = PromptOutput(prompt_tokens, [SampleOutput() for _ in range(n)])
    try:
        async for chunk in stream:
            out.add(chunk)
    finally:
        await stream.aclose()
    for sample in out.samples:
        message = error_message(sample.finish_reason)
        if message is not None:
            raise APIError(message)
    return out


async def collect_all(
    streams: Sequence[PrimedStream], prompt_tokens: Sequence[int], n: int
) -> list[PromptOutput]:
    tasks = [asyncio.ensure_future(collect(s, p, n)) for s, p in zip(streams, prompt_tokens)]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; if the client disconnects first, cancel it (which aborts its requests)."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL_S)

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
    if task.cancelled():
        raise ClientGone()
    return task.result()


# --- server-sent events ------------------------------------------------------------------------


def sse(data: Any) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


SSE_DONE = sse("[DONE]")


def named_sse(name: str, data: dict[str, Any]) -> bytes:
    """A server-sent event with its type named (Anthropic's and the Responses API's streams
    name every event)."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class SSEResponse(StreamingResponse):
    """A streaming response that stops as soon as the client disconnects, whether it notices on
    a failed send or on an http.disconnect message, and always closes its body generator."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncGenerator[bytes, None]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache"})
        self._body = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stream = asyncio.ensure_future(self.stream_response(send))
        watcher = asyncio.ensure_future(self._wait_for_disconnect(receive))
        try:
            await asyncio.wait({stream, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            stream.cancel()
            await asyncio.gather(stream, watcher, return_exceptions=True)
            await self._body.aclose()
        if stream.done() and not stream.cancelled():
            error = stream.exception()
            if error is not None and not isinstance(error, OSError):
                raise error

    @staticmethod
    async def _wait_for_disconnect(receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
