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
   sample); a stop string ends the sample here and on the scheduler's side (AbortRequest
   "stop"); a SubmitError is kept as the request's refusal;
4. `abort`, and `take` / `forget` once the output was read.

`send` delivers a message to the scheduler: a socket (the tokenizer process) or a direct call
into the scheduler's intake (the Engine), which may answer at once by calling `receive`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from radixrt.runtime.constrained.compiler import GrammarCompiler
from radixrt.runtime.errors import QueueFull
from radixrt.runtime.messages import (
    AbortRequest,
    DeltaBatch,
    GrammarReady,
    Scheduling,
    SubmitError,
    SubmitRequest,
    ToScheduler,
)
from radixrt.runtime.outputs import RequestOutput, StreamChunk
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.tokenizer.output_tracker import OutputTracker
from radixrt.runtime.tokenizer.prompts import Prompt, encode_prompt


def refusal_error(refusal: SubmitError) -> Exception:
    """The exception a refused request raises to its caller: QueueFull (retry later) or
    ValueError (the request itself is invalid)."""
    if refusal.retry_after_s > 0:
        return QueueFull(refusal.message, refusal.retry_after_s)
    return ValueError(refusal.message)


class RequestFront:
    def __init__(self, tokenizer: Any, send: Callable[[ToScheduler], None],
                 grammars: Callable[[], GrammarCompiler]) -> None:
        """grammars: the compiler shared with the worker (made on first use)."""
        self.tokenizer = tokenizer
        self._send = send
        self._grammars = grammars
        self._rids = itertools.count()
        self._trackers: dict[int, OutputTracker] = {}
        self._compiling: dict[int, Future] = {}  # rid -> its grammar, compiling
        self._refusals: dict[int, SubmitError] = {}

    # --- intake ------------------------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        """Text, token ids or chat messages -> token ids. ValueError on a malformed prompt."""
        return encode_prompt(self.tokenizer, prompt)

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams,
               scheduling: Scheduling | None = None, pin: bool = False) -> int:
        """Send one request to the scheduler; returns its rid. Raises ValueError for a broken
        grammar (before anything is queued). A refusal by the scheduler arrives through
        `receive` (at once for the Engine): see `refusal`."""
        constraint = None if params.prefill_only else params.constraint
        grammar = self._grammars().compile_async(constraint) if constraint else None
        rid = next(self._rids)
        ids = [int(t) for t in prompt_ids]
        self._trackers[rid] = OutputTracker(self.tokenizer, rid, ids, params)
        if grammar is not None:
            self._compiling[rid] = grammar
        self._send(SubmitRequest(rid=rid, prompt_ids=ids, params=params,
                                 scheduling=scheduling or Scheduling(), pin=pin,
                                 grammar_ready=grammar is None))
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

    def abort(self, rid: int) -> None:
        """Abort a request (and all its samples) wherever it is."""
        tracker = self._trackers.get(rid)
        if tracker is not None and not tracker.finished:
            self._compiling.pop(rid, None)
            self._send(AbortRequest(rid=rid))

    # --- outputs -----------------------------------------------------------------------------
    def receive(self, msg: DeltaBatch | SubmitError) -> list[StreamChunk]:
        """Fold in what the scheduler sent; returns the new stream pieces."""
        if isinstance(msg, SubmitError):
            if self._trackers.pop(msg.rid, None) is not None:
                self._compiling.pop(msg.rid, None)
                self._refusals[msg.rid] = msg
            return []
        chunks: list[StreamChunk] = []
        for delta in msg.deltas:
            tracker = self._trackers.get(delta.owner)
            if tracker is None:
                continue
            new, stopped = tracker.apply(delta)
            chunks += new
            if stopped:  # a stop string: the scheduler ends that sample now
                self._send(AbortRequest(rid=delta.rid, reason="stop"))
        return chunks

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
        return self._trackers.pop(rid).output

    def forget(self, rid: int) -> None:
        self._trackers.pop(rid, None)
        self._refusals.pop(rid, None)

    @property
    def held(self) -> list[int]:
        """The rids whose outputs the front still holds."""
        return list(self._trackers)
