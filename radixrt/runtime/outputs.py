"""What the engine hands back: finished outputs and streaming chunks."""

from __future__ import annotations

from dataclasses import dataclass, field

from radixrt.runtime.messages import TokenLogprob
from radixrt.runtime.trace_messages import RequestTrace


@dataclass
class CompletionOutput:
    """One of the n samples of a request."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error: ..."
    logprobs: list[TokenLogprob] = field(default_factory=list)  # when params.logprobs
    matched_stop: str | None = None  # the stop string that ended it (finish_reason "stop")


@dataclass
class RequestOutput:
    rid: int
    prompt_token_ids: list[int]
    samples: list[CompletionOutput]
    cached_tokens: int = 0  # prompt tokens served from the radix cache
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    pinned: bool = False  # submitted with pin=True and its prefix is now pinned (unpin(rid))
    pin_error: str | None = None  # submitted with pin=True and the pin was refused: why
    # a pooling request (SamplingParams.pooling): the embedding, or the head's logits
    pooled: list[float] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.samples[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.samples[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.samples[0].finish_reason

    @property
    def logprobs(self) -> list[TokenLogprob]:
        return self.samples[0].logprobs

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def completion_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.samples)

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.samples)


@dataclass(frozen=True)
class StreamChunk:
    """New text and tokens of one sample since the previous chunk."""

    rid: int
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens served from the radix cache
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # on the first chunk
    queue_s: float = -1.0  # the first chunk: seconds queued before admission, ...
    prefill_s: float = -1.0  # ... and from admission to the first token (-1 on other chunks)
    pinned: bool = False  # the final chunk of a pin=True request: its prefix is pinned
    pin_error: str | None = None  # ... or why the pin was refused
    matched_stop: str | None = None  # the final chunk of a sample a stop string ended: that string
    pooled: list[float] = field(default_factory=list)  # the final chunk of a pooling request
    trace: RequestTrace | None = None  # the final chunk of a traced request: its stages
