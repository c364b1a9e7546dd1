"""What a DSL backend provides, whichever runtime is behind it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from radixrt.runtime.sampling_params import CONSTRAINT_FIELDS

# what a pin runs: the prefix is computed (and kept), nothing sampled
PREFILL_ONLY = {"max_tokens": 0}
# a generate's params key (not a sampling field) asking for the thinking apart (gen's
# separate_reasoning=True); backends without reasoning support refuse it
SEPARATE_REASONING = "separate_reasoning"


def constraint_of(params: Mapping[str, Any]) -> tuple[str, Any] | None:
    """The constrained decoding a generate's params ask for, as (kind, pattern): kind one of
    regex / json_schema (JSON text) / choices / tool_calls (gen puts at most one in), or None."""
    for kind in CONSTRAINT_FIELDS:
        if params.get(kind) is not None:
            return kind, params[kind]
    return None


class BackendError(RuntimeError):
    """The runtime refused or failed a call; the message is the runtime's."""


class RuntimeUnreachable(BackendError):
    """Not a refusal of one call: the runtime exited or stopped answering (a ReplicaEndpoint
    places no more programs on it)."""


@dataclass(frozen=True)
class ChatFormat:
    """Text around each role's message, and what a conversation without a system message starts
    with (the template's default system prompt, if any). image_token: the text that stands for
    an image (what the chat template writes for one, e.g. LLaVA's "<image>\\n"); "" where the
    model takes no images, or the backend cannot send them."""

    roles: dict[str, tuple[str, str]]
    preamble: str = ""
    tool_prompt: str = ""  # the runtime's tool prompt, "{tools}" where the tools are listed
    image_token: str = ""

    @classmethod
    def from_info(cls, chat: dict[str, Any]) -> ChatFormat:
        roles = {r: (p, s) for r, (p, s) in chat.get("roles", {}).items()}
        return cls(roles, chat.get("preamble", ""), chat.get("tool_prompt", ""),
                   chat.get("image_token", ""))

    def markers(self, role: str) -> tuple[str, str]:
        if role not in self.roles:
            raise BackendError(
                f"role {role!r} has no chat template here: the model has no chat template, or "
                "the backend could not read it (OpenAICompatible takes chat_format=...)"
            )
        return self.roles[role]


@dataclass
class GenResult:
    text: str
    finish_reason: str | None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    # asked for logprobs: SGLang's meta info keys (output_token_logprobs, output_top_logprobs,
    # input_token_logprobs, input_top_logprobs), each entry (logprob, token id, token text), an
    # id or a text None where the server does not say it
    logprobs: dict[str, Any] = field(default_factory=dict)
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments JSON)
    reasoning: str | None = None  # separate_reasoning: the thinking (None: there was none)
    content: str | None = None  # separate_reasoning: the answer after it


@dataclass
class ChoiceLogprobs:
    """Log-probability of each token of one choice after the text (and on its own)."""

    logprobs: list[float]
    unconditional: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class PieceMeta:
    """What one streamed piece of a gen's output carried besides its text: how many tokens it
    holds, and their logprob entries (output_token_logprobs / output_top_logprobs, as GenResult's
    logprobs) when logprobs were asked for. A piece's text may be "" while its tokens are not
    (a character still incomplete, text held back while it may start a stop string)."""

    tokens: int
    logprobs: dict[str, list[Any]] = field(default_factory=dict)


# on_piece(text) or on_piece(text, PieceMeta): a backend that knows a piece's tokens says so
PieceCallback = Callable[..., None]


class TokenUsage:
    """What a backend's calls sent and received (SGLang's `backend.token_usage`): prompt tokens
    (those the runtime found cached among them: cached_tokens), completion tokens and calls,
    counted as the runtime reports each generate (gens and pins; select's scoring calls are not
    generates and are not counted). Thread-safe; `reset()` starts again from zero."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(("prompt_tokens", "completion_tokens", "cached_tokens",
                                      "calls"), 0)

    def add(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> None:
        with self._lock:
            self._counts["prompt_tokens"] += int(prompt_tokens)
            self._counts["completion_tokens"] += int(completion_tokens)
            self._counts["cached_tokens"] += int(cached_tokens)
            self._counts["calls"] += 1

    def reset(self) -> None:
        with self._lock:
            self._counts = dict.fromkeys(self._counts, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    @property
    def prompt_tokens(self) -> int:
        return self.snapshot()["prompt_tokens"]

    @property
    def completion_tokens(self) -> int:
        return self.snapshot()["completion_tokens"]

    @property
    def cached_tokens(self) -> int:
        return self.snapshot()["cached_tokens"]

    @property
    def calls(self) -> int:
        return self.snapshot()["calls"]

    def __repr__(self) -> str:
        return f"TokenUsage({self.snapshot()})"


class SummedTokenUsage(TokenUsage):
    """The usage of several backends (a ReplicaEndpoint's replicas) read as one: the sums of
    theirs; reset() resets each."""

    def __init__(self, parts: Iterable[TokenUsage]) -> None:
        super().__init__()
        self._parts = list(parts)

    def add(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> None:
        raise TypeError("a summed usage is read-only: its backends count their own calls")

    def reset(self) -> None:
        for part in self._parts:
            part.reset()

    def snapshot(self) -> dict[str, int]:
        snaps = [part.snapshot() for part in self._parts]
        return {key: sum(s[key] for s in snaps) for key in self._counts}


class Backend(Protocol):
    def chat_format(self) -> ChatFormat: ...

    def generate(
        self, text: str, params: dict[str, Any], on_piece: PieceCallback | None,
        priority: int = 0,
    ) -> GenResult:
        """Continue `text` under `params` (SamplingParams fields, a constraint among them:
        constraint_of(params); SEPARATE_REASONING as well); stream pieces of the output to
        on_piece when given: on_piece(text), or on_piece(text, PieceMeta) where the backend
        knows the piece's tokens. priority: lower is more urgent in the runtime's queue."""
        ...

    def score(self, text: str, choices: list[str], unconditional: bool,
              priority: int = 0) -> list[ChoiceLogprobs]:
        """Token log-probabilities of each choice as the continuation of text, in one batch."""
        ...

    def embed(self, text: str, dimensions: int | None, priority: int = 0) -> list[float]:
        """The embedding of `text` (the runtime's pooling), cut to `dimensions` where given."""
        ...

    def pin(self, text: str, priority: int = 0) -> Any:
        """Compute `text` once (at `priority`) and keep it cached until unpin(handle); None if
        unsupported."""
        ...

    def unpin(self, handle: Any) -> None: ...

    def info(self) -> dict[str, Any]:
        """The runtime's counters (cache_hit_rate, cached_tokens, ...) where it reports them."""
        ...

    # Optional: `token_usage` (a TokenUsage: global_config.default_backend.token_usage) and
    # `token_texts(token_ids) -> list[str]` (each id decoded on its own with the model's
    # tokenizer: gen(return_text_in_logprobs=True) needs it where logprob entries carry ids
    # without texts).
    # Images (rx.image): a backend that takes them names the model's image token in its
    # chat_format(), and its generate, score and pin (and their async twins) take a keyword
    # `images`: the files' bytes, one per image token of the text, in order (passed only when
    # the text holds images). `no_images`, a str attribute: why rx.image cannot run on this
    # backend (else the model is said to take none).


def program_backend(backend: Any) -> Any:
    """The backend one program runs on: a backend over several replicas (ReplicaEndpoint)
    gives each program its own view, kept on one replica (`for_program()`); any other backend
    is itself."""
    for_program = getattr(backend, "for_program", None)
    return backend if for_program is None else for_program()
