"""The contract between the HTTP layer and whatever runs the requests.

`ZmqTokenizerManager` (the tokenizer process of `radixrt serve`, talking to the scheduler over
ZeroMQ) and `EngineManager` (an in-process Engine, for tests and embedding) both implement it, so
the HTTP layer is written once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from radixrt.runtime.messages import Scheduling
from radixrt.runtime.outputs import StreamChunk
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.tokenizer.prompts import Prompt


@dataclass
class RequestMetrics:
    """Per-request timings the manager records for /metrics (seconds, monotonic clock)."""

    arrival: float
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None
    prompt_tokens: int = 0
    priority: int = 0
    tenant: str = ""
    cached_tokens: int = 0
    completion_tokens: int = 0
    queue: float | None = None  # submission to first admission, as the scheduler measured it
    prefill: float | None = None  # first admission to first token
    inter_token: list[float] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)  # one per sample, as they end

    def record(self, chunk: StreamChunk, now: float) -> None:
        """Account for one streamed chunk."""
        self.cached_tokens = chunk.cached_tokens
        if self.queue is None and chunk.queue_s >= 0:
            self.queue, self.prefill = chunk.queue_s, chunk.prefill_s
        if chunk.finish_reason is not None:
            self.finish_reasons.append(chunk.finish_reason)
        if not chunk.token_ids:
            return
        if self.first_token is None:
            self.first_token = now
        elif self.last_token is not None:
            self.inter_token.append(now - self.last_token)
        self.last_token = now
        self.completion_tokens += len(chunk.token_ids)


class ClientIds:
    """The ids clients see (`cmpl-...`, `chatcmpl-...`, `gen-...`, given to `generate` as
    rid_hint) -> the runtime ids of their running requests (one per prompt of a request), so
    that /abort takes either."""

    def __init__(self) -> None:
        self._rids: dict[str, set[int]] = {}

    def add(self, hint: str | None, rid: int) -> None:
        if hint is not None:
            self._rids.setdefault(hint, set()).add(rid)

    def remove(self, hint: str | None, rid: int) -> None:
        rids = self._rids.get(hint) if hint is not None else None
        if rids is not None:
            rids.discard(rid)
            if not rids:
                del self._rids[hint]  # type: ignore[arg-type]

    def resolve(self, rid: int | str) -> list[int]:
        """The runtime ids a client's id stands for (an int is one already)."""
        if isinstance(rid, int):
            return [rid]
        return sorted(self._rids.get(rid, ()))


class TokenizerManager(Protocol):
    model_name: str  # the name clients must send as `model`
    context_length: int
    vocab_size: int
    tokenizer: Any  # a transformers tokenizer

    def encode(self, prompt: Prompt) -> list[int]:
        """Text, token ids or chat messages -> token ids. Raises ValueError on bad input."""
        ...

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        rid_hint: str | None = None,
        pin: bool = False,
        scheduling: Scheduling | None = None,
    ) -> AsyncIterator[StreamChunk]:
        """Submit and stream, with `scheduling`'s priority, tenant, cache namespace and queue
        timeout. With pin, the finished prompt stays cached until `unpin(rid)`
        when the final chunk says `pinned` (else its `pin_error` says why not); the on_pinned
        callbacks hear of the pin even when the stream was closed before that chunk.
        Raises QueueFull when a queue is at its cap, ValueError (both before yielding
        anything) when the runtime refuses the request: prompt or max_tokens past the context,
        ids outside the vocabulary, bad params. Closing the iterator early (client gone)
        aborts the request and frees its KV. Every sample ends with a chunk whose
        finish_reason is set."""
        ...

    async def abort(self, rid: int | str) -> int:
        """Abort by the runtime's id or by the id the client saw (`cmpl-...`); returns how many
        running requests that id named."""
        ...

    async def unpin(self, rid: int) -> None:
        """Release the prefix of a request generated with pin=True."""
        ...

    async def flush_cache(self) -> int:
        """Drop every unlocked cached KV page; returns the tokens freed."""
        ...

    async def server_info(self) -> dict[str, Any]:
        """Config and live counters: running, waiting, kv_total/free/evictable/locked/private,
        cache_hit_rate, prompt/cached/generated tokens, steps, preemptions."""
        ...

    def on_finish(self, callback: Any) -> None:
        """Register callback(RequestMetrics) called once per finished request (for /metrics)."""
        ...

    def on_pinned(self, callback: Any) -> None:
        """Register callback(rid), called once per request whose prefix the runtime pinned, as
        soon as the manager learns of it (the pin service puts the pin under a lease)."""
        ...
