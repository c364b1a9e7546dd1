"""The request front: every request's client side, written once for every way in.

The Engine (direct calls) and the tokenizer process (`TokenizerManager`, for HTTP and DSL
clients over either link) both run a request through this one class:

1. `encode`: text, token ids or chat messages -> token ids (the limits that need the model --
   context length, vocabulary -- are checked once, where the request is queued:
   `Scheduler.add_request`);
2. `submit`: choose its rid, start its output tracker, and send one `SubmitRequest` carrying the
   typed SamplingParams. A constrained request's grammar is checked here (a broken pattern is a
   ValueError before anything is queued) and compiled on a thread; the request is queued at
   once with `grammar_ready=False` (so it counts against the queue caps) and `poll` sends
   GrammarReady once the grammar is compiled -- or ends it with the compile error;
3. `receive`: the scheduler's DeltaBatch becomes StreamChunks (incremental detokenization per
   sample), appended to the request's `Stream` when a reader waits on one; a stop string ends
   the sample here and on the scheduler's side (AbortRequest "stop"); a SubmitError is the
   request's refusal; a ControlReply answers a `call`; a pinned prefix is announced to the
   callback its request was submitted with, even after its reader left;
4. `abort`, `unpin`, and `take` / `forget` once the output was read.

`send` delivers a message to the scheduler: a socket (the tokenizer process) or a direct call
into the scheduler's intake (the Engine), which may answer at once by calling `receive`.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import msgspec

from radixrt.runtime.constrained.compiler import GrammarCompiler
from radixrt.runtime.errors import QueueFull
from radixrt.runtime.image_messages import ImageInput, is_image_id
from radixrt.runtime.messages import (
    AbortRequest,
    ControlReply,
    ControlRequest,
    DeltaBatch,
    GrammarReady,
    LoraRequest,
    Scheduling,
    SubmitError,
    SubmitRequest,
    ToScheduler,
    ToTokenizer,
    TreeViewRequest,
    UnpinRequest,
)
from radixrt.runtime.outputs import RequestOutput, StreamChunk
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.tokenizer.chat_images import has_images, take_images
from radixrt.runtime.tokenizer.image_prompts import ImagePrompts
from radixrt.runtime.tokenizer.output_tracker import OutputTracker
from radixrt.runtime.tokenizer.prompts import Prompt, encode_prompt
from radixrt.runtime.trace_messages import RequestTrace


class GrammarTiming:
    """A request's grammar: submitted at `started` (monotonic seconds), compiled at `ended`
    (None while compiling), or found in the compiler's cache (`cached`)."""

    def __init__(self, started: float, cached: bool) -> None:
        self.started = started
        self.cached = cached
        self.ended: float | None = started if cached else None

    def done(self, _future: Future) -> None:  # on the compiler's thread
        if self.ended is None:
            self.ended = time.monotonic()


def refusal_error(refusal: SubmitError) -> Exception:
    """The exception a refused request raises to its caller: QueueFull (retry later) or
    ValueError (the request itself is invalid)."""
    if refusal.retry_after_s > 0:
        return QueueFull(refusal.message, refusal.retry_after_s)
    return ValueError(refusal.message)


class Stream:
    """One request's output as it arrives (StreamChunks, or the SubmitError that refused it),
    for a reader that waits on an event loop."""

    def __init__(self) -> None:
        self.items: deque[StreamChunk | SubmitError] = deque()
        self._arrived = asyncio.Event()

    def put(self, item: StreamChunk | SubmitError) -> None:
        self.items.append(item)
        self._arrived.set()

    async def wait(self) -> None:
        """Return once an item is there (at once if one is)."""
        if not self.items:
            self._arrived.clear()
            await self._arrived.wait()


class RequestFront:
    def __init__(self, tokenizer: Any, send: Callable[[ToScheduler], None],
                 grammars: Callable[[], GrammarCompiler], rids: Iterator[int] | None = None,
                 processor: Any | None = None) -> None:
        """send: delivers a message to the scheduler; grammars: the compiler shared with the
        worker (made on first use); rids: where request ids come from (one scheduler, one
        source); processor: a vision-language model's (its images' placeholders)."""
        self.tokenizer = tokenizer
        self.images = None if processor is None else ImagePrompts(processor)
        self._send = send
        self._grammars = grammars
        self._rids = rids if rids is not None else itertools.count()
        self._call_ids = itertools.count()
        self._trackers: dict[int, OutputTracker] = {}
        self._streams: dict[int, Stream] = {}
        self._compiling: dict[int, Future] = {}  # rid -> its grammar, compiling
        self._compile_times: dict[int, GrammarTiming] = {}  # rid -> when its grammar compiled
        # a traced request's stages that came after its reader ended (a stop string ended it
        # here, or its client left): (owner rid, trace) go here (request_tracer.py)
        self.on_late_trace: Callable[[int, RequestTrace], None] | None = None
        self._refusals: dict[int, SubmitError] = {}
        self._pin_callbacks: dict[int, Callable[[int], None]] = {}  # rid -> told once pinned
        self._calls: dict[int, Future] = {}  # call_id -> its ControlReply's result

    # --- intake ------------------------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        """Text, token ids or chat messages -> token ids. ValueError on a malformed prompt
        (and on chat messages with images: `encode_images` takes those)."""
        if not isinstance(prompt, str) and has_images(prompt):  # type: ignore[arg-type]
            raise ValueError("this prompt has images: it goes where images are taken "
                             "(chat requests, generate)")
        return encode_prompt(self.tokenizer, prompt)

    def encode_images(self, prompt: Prompt, images: Sequence[Any] = (),
                      load: Callable[[Any], Any] | None = None
                      ) -> tuple[list[int], list[ImageInput]]:
        """A prompt with images -> token ids with their placeholders, and the images
        (tokenizer/image_prompts.py). The images are chat messages' image parts
        (tokenizer/chat_images.py), or `images` for a text prompt with one image token per
        image; load(ref) turns a part's ref into a PIL image (None: they are images already).
        ValueError for a model without images or a bad image."""
        refs = list(images)
        if not isinstance(prompt, str) and has_images(prompt):  # type: ignore[arg-type]
            if refs:
                raise ValueError("give images either as the messages' image parts or as "
                                 "images=, not both")
            messages, refs = take_images(prompt)  # type: ignore[arg-type]
            prompt = messages
        if self.images is None:
            if refs:
                raise ValueError("this model takes no images: serve a vision-language model")
            return encode_prompt(self.tokenizer, prompt), []
        ids = encode_prompt(self.tokenizer, prompt)
        return self.images.expand(ids, [load(r) for r in refs] if load else refs)

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams,
               scheduling: Scheduling | None = None, pin: bool = False, stream: bool = False,
               on_pinned: Callable[[int], None] | None = None,
               images: Sequence[ImageInput] = ()) -> int:
        """Send one request to the scheduler; returns its rid. Raises ValueError for a broken
        grammar (before anything is queued). A refusal by the scheduler arrives through
        `receive` (at once for the Engine): into the request's stream (stream=True), else see
        `refusal`. on_pinned(rid): called once the scheduler pinned its prefix (pin=True).
        images: the prompt's (encode_images), whose placeholder ids are in prompt_ids."""
        constraint = None if params.prefill_only else params.constraint
        started = time.monotonic()
        cached = constraint is not None and self._grammars().cached(constraint)
        grammar = self._grammars().compile_async(constraint) if constraint else None
        rid = next(self._rids)
        if grammar is not None:
            timing = GrammarTiming(started, cached=cached)
            self._compile_times[rid] = timing
            grammar.add_done_callback(timing.done)
        ids = [int(t) for t in prompt_ids]
        shown = ids if not images or self.images is None else [  # placeholders as the image token
            self.images.placeholder_id if is_image_id(t) else t for t in ids]
        self._trackers[rid] = OutputTracker(self.tokenizer, rid, shown, params)
        if stream:
            self._streams[rid] = Stream()
        if pin and on_pinned is not None:
            self._pin_callbacks[rid] = on_pinned
        if grammar is not None:
            self._compiling[rid] = grammar
        self._send(SubmitRequest(rid=rid, prompt_ids=ids, params=params,
                                 scheduling=scheduling or Scheduling(), pin=pin,
                                 grammar_ready=grammar is None, images=list(images)))
        self.poll()  # a cached grammar is ready at once
        return rid

    def poll(self) -> None:
        """Requests whose grammar finished compiling may start; a failed compile ends one."""
        for rid, future in list(self._compiling.items()):
            if not future.done():
                continue
            del self._compiling[rid]
            error = future.exception()
            if error is None:
                self._send(GrammarReady(rid=rid))
            else:
                reason = f"error: the grammar failed to compile: {error}"
                self._send(AbortRequest(rid=rid, reason=reason))

    @property
    def compiling(self) -> list[Future]:
        """The grammars that queued requests wait for."""
        return list(self._compiling.values())

    def grammar(self, rid: int) -> Future | None:
        """The grammar request `rid` waits for, while it compiles."""
        return self._compiling.get(rid)

    def abort(self, rid: int) -> None:
        """Abort a request (and all its samples) wherever it is."""
        tracker = self._trackers.get(rid)
        if tracker is not None and not tracker.finished:
            self._compiling.pop(rid, None)
            self._send(AbortRequest(rid=rid))

    def unpin(self, rid: int) -> None:
        """Release the prefix a request submitted with pin=True kept."""
        self._send(UnpinRequest(rid=rid))

    def call(self, op: str) -> Future:
        """A control call ("info", "flush_cache", "check_integrity"); its result arrives with
        the ControlReply (at once for the Engine)."""
        return self._call(lambda call_id: ControlRequest(call_id=call_id, op=op))

    def call_lora(self, name: str, path: str | None) -> Future:
        """Load LoRA adapter `name` from folder `path` (None: unload it); the scheduler's
        answer ({"ok": ...}, SchedulerIntake.lora) arrives with the ControlReply."""
        return self._call(lambda call_id: LoraRequest(call_id=call_id, name=name, path=path))

    def call_tree_view(self, depth: int, limit: int, text_tokens: int) -> Future:
        """A snapshot of the radix tree's top (tree_messages.TreeViewRequest; a bad bound is a
        ValueError here); the scheduler's TreeView, as builtins, arrives with the ControlReply."""
        asked = TreeViewRequest(call_id=0, depth=depth, limit=limit, text_tokens=text_tokens)
        return self._call(lambda call_id: msgspec.structs.replace(asked, call_id=call_id))

    def _call(self, message: Callable[[int], ToScheduler]) -> Future:
        call_id = next(self._call_ids)
        future: Future = Future()
        self._calls[call_id] = future
        try:
            self._send(message(call_id))
        except BaseException:
            del self._calls[call_id]
            raise
        return future

    # --- outputs -----------------------------------------------------------------------------
    def receive(self, msg: ToTokenizer) -> list[StreamChunk]:
        """Fold in what the scheduler sent; returns the new stream pieces."""
        if isinstance(msg, ControlReply):
            future = self._calls.pop(msg.call_id, None)
            if future is not None:
                future.set_result(dict(msg.result))
            return []
        if isinstance(msg, SubmitError):
            self._pin_callbacks.pop(msg.rid, None)
            self._compile_times.pop(msg.rid, None)
            if self._trackers.pop(msg.rid, None) is not None:
                self._compiling.pop(msg.rid, None)
                stream = self._streams.get(msg.rid)
                if stream is not None:
                    stream.put(msg)
                else:
                    self._refusals[msg.rid] = msg
            return []
        assert isinstance(msg, DeltaBatch), msg
        chunks: list[StreamChunk] = []
        for delta in msg.deltas:
            if delta.finish_reason is not None and delta.rid in self._pin_callbacks:
                on_pinned = self._pin_callbacks.pop(delta.rid)
                if delta.pinned:  # told whether or not its reader is still there
                    on_pinned(delta.rid)
            tracker = self._trackers.get(delta.owner)
            new, stopped = tracker.apply(delta) if tracker is not None else ([], False)
            if (delta.trace is not None and self.on_late_trace is not None
                    and all(chunk.trace is None for chunk in new)):
                self.on_late_trace(delta.owner, delta.trace)
            if tracker is None:
                continue
            chunks += new
            stream = self._streams.get(delta.owner)
            if stream is not None:
                for chunk in new:
                    stream.put(chunk)
            if stopped:  # a stop string: the scheduler ends that sample now
                self._send(AbortRequest(rid=delta.rid, reason="stop"))
        return chunks

    def stream(self, rid: int) -> Stream | None:
        """The stream of a request submitted with stream=True (until `forget`)."""
        return self._streams.get(rid)

    async def read(self, rid: int, progress: Callable[[Stream], Awaitable[None]]
                   ) -> AsyncIterator[StreamChunk]:
        """The chunks of request `rid` (submitted with stream=True) as they arrive, until its
        last; raises its refusal (QueueFull or ValueError). progress(stream) returns once the
        stream may have grown (the Engine takes a step; the tokenizer process waits)."""
        stream = self._streams[rid]
        while True:
            if not stream.items:
                if self.finished(rid):
                    return
                await progress(stream)
                continue
            item = stream.items.popleft()
            if isinstance(item, SubmitError):
                raise refusal_error(item)
            yield item

    def refusal(self, rid: int) -> SubmitError | None:
        """Why the scheduler refused request `rid` (then forgotten), or None."""
        return self._refusals.pop(rid, None)

    def tracker(self, rid: int) -> OutputTracker | None:
        return self._trackers.get(rid)

    def finished(self, rid: int) -> bool:
        tracker = self._trackers.get(rid)
        return tracker is None or tracker.finished

    def take(self, rid: int) -> RequestOutput:
        """A request's output (finished or not); the front forgets it."""
        self._streams.pop(rid, None)
        self._compile_times.pop(rid, None)
        return self._trackers.pop(rid).output

    def grammar_timing(self, rid: int) -> GrammarTiming | None:
        """When request `rid`'s grammar compiled (None: it has none)."""
        return self._compile_times.get(rid)

    def forget(self, rid: int) -> None:
        """Drop what the front holds of request `rid` (its pin callback stays until it ends)."""
        self._compile_times.pop(rid, None)
        self._trackers.pop(rid, None)
        self._streams.pop(rid, None)
        self._refusals.pop(rid, None)

    @property
    def held(self) -> list[int]:
        """The rids whose outputs the front still holds."""
        return list(self._trackers)
