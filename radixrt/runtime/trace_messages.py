"""What the scheduler records of a traced request (Scheduling.trace), for the OpenTelemetry
spans the request front emits when it ends (tokenizer/request_tracer.py). Times are wall-clock
seconds (time.time), the same clock in every process of one machine. An untraced request has no
record: tracing off costs nothing but a None check at each stage."""

from __future__ import annotations

import time

import msgspec

MAX_CHUNKS = 64  # prefill chunks kept per request: the later ones are added to the last


class PrefillChunk(msgspec.Struct, frozen=True):
    """One step's part of the prompt: planned at `start`, its result folded in at `end`."""

    start: float
    end: float
    tokens: int


class RequestTrace(msgspec.Struct):
    """Filled in by the scheduler as the request goes; sent with its final OutputDelta."""

    queued_at: float = msgspec.field(default_factory=time.time)
    admitted_at: float = -1.0  # first admission (-1: never admitted)
    # prompt tokens found in the radix tree at first admission, by tier (messages.TIER_NAMES)
    hit_tokens: list[int] = []
    chunks: list[PrefillChunk] = []
    drafted_tokens: int = 0  # speculative decoding: drafts verified ...
    accepted_tokens: int = 0  # ... and accepted
    preemptions: int = 0


def merged(first: RequestTrace, other: RequestTrace) -> RequestTrace:
    """The record of a request of n > 1 samples from two of its samples': they share the
    prompt's stages (the first's), their drafts add up; preemptions: the most any sample went
    through (each counts its parent's, before the fork)."""
    return msgspec.structs.replace(
        first, drafted_tokens=first.drafted_tokens + other.drafted_tokens,
        accepted_tokens=first.accepted_tokens + other.accepted_tokens,
        preemptions=max(first.preemptions, other.preemptions))


def add_chunk(trace: RequestTrace, chunk: PrefillChunk) -> None:
    """Record one step's part of the prompt; past MAX_CHUNKS, it lengthens the last one."""
    if len(trace.chunks) < MAX_CHUNKS:
        trace.chunks.append(chunk)
        return
    last = trace.chunks[-1]
    trace.chunks[-1] = PrefillChunk(last.start, chunk.end, last.tokens + chunk.tokens)
