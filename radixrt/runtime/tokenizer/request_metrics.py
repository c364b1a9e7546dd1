"""What the TokenizerManager measures of each request, for /metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixrt.runtime.outputs import StreamChunk
from radixrt.runtime.tokenizer.request_front import GrammarTiming
from radixrt.runtime.trace_messages import RequestTrace, merged


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
    lora: str = ""  # the LoRA adapter it ran under ("": the base model)
    pooling: str = ""  # a pooling request's task ("embed", "classify"; "": it generates)
    cached_tokens: int = 0
    completion_tokens: int = 0
    queue: float | None = None  # submission to first admission, as the scheduler measured it
    prefill: float | None = None  # first admission to first token
    inter_token: list[float] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)  # one per sample, as they end
    # tracing (tokenizer/request_tracer.py): wall-clock arrival, the caller's trace context,
    # when its grammar compiled (request_front.GrammarTiming), the scheduler's record
    rid: int = -1
    wall_arrival: float = 0.0
    trace_context: Any = None
    grammar: GrammarTiming | None = None
    trace: RequestTrace | None = None

    def record(self, chunk: StreamChunk, now: float) -> None:
        """Account for one streamed chunk."""
        self.cached_tokens = chunk.cached_tokens
        if chunk.trace is not None:  # each sample's: n > 1 has several
            self.trace = chunk.trace if self.trace is None else merged(self.trace, chunk.trace)
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
