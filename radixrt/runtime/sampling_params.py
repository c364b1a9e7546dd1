"""SamplingParams: the one definition of how a request is sampled (frozen, validated once).

Every other layer (HTTP, DSL, scheduler, worker) reuses this class, and it is what travels: a
msgspec Struct, so `SubmitRequest` and `WorkerRequest` (messages.py) carry it typed and the
receiving process decodes it straight into this class. Validation happens in ``__post_init__``
(which msgspec also runs on decode) so an invalid object cannot exist; ``with_`` returns a
validated copy. Error messages name the field, the bad value and what is allowed. A request's
path builds it once at its edge (the HTTP handler, the DSL endpoint, the Engine's caller) and
decodes it once on the far side of each process boundary; nothing rebuilds it from a dict.

The object is hashable: ``stop`` and ``stop_token_ids`` are normalised to tuples and ``logit_bias``
to a read-only, hashable dict (:class:`LogitBias`), while a plain ``dict`` is accepted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from radixrt.runtime.config import (
    DEFAULT_MAX_TOKENS,
    INT64_MAX,
    INT64_MIN,
    MAX_GRAMMAR_CHARS,
    MAX_TOP_LOGPROBS,
    REASONING_FORMAT_NAMES,
)
from radixrt.runtime.pooling_params import Pooling

# Bounds of the fields (with config.py's INT64_MIN / INT64_MAX, MAX_GRAMMAR_CHARS and
# MAX_TOP_LOGPROBS, which the server shares), checked before anything is allocated: n is capped as
# OpenAI caps it, lists and strings have sane maximum lengths.
MAX_N = 128  # samples per request
# a JSON schema's text: real-world schemas run past MAX_GRAMMAR_CHARS, mostly descriptions
# (Kubernetes'); compiles are bounded in time and the grammar cache in bytes, so size is not
# what keeps them safe
MAX_SCHEMA_CHARS = 1 << 20
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 256
MAX_LOGIT_BIAS_ENTRIES = 1024
MAX_CHOICES = 256
LOGIT_BIAS_LIMIT = 100.0  # |logit_bias value| allowed (OpenAI's range)
PENALTY_LIMIT = 2.0  # |frequency_penalty| and |presence_penalty| allowed (OpenAI's range)


class LogitBias(dict[int, float]):
    """Read-only, hashable ``{token_id: bias}`` dict (a dict subclass, so msgspec encodes it)."""

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("logit_bias of a SamplingParams is read-only; use params.with_(...)")

    __setitem__ = __delitem__ = __ior__ = _read_only  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = _read_only  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __reduce__(self) -> tuple[type[LogitBias], tuple[dict[int, float]]]:
        return (LogitBias, (dict(self),))


def _bad(field: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"{field}={value!r} is invalid: {allowed}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_int64(value: Any) -> bool:
    return _is_int(value) and INT64_MIN <= value <= INT64_MAX


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


CONSTRAINT_FIELDS = ("regex", "json_schema", "choices", "tool_calls", "ebnf", "lark")


class SamplingParams(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    # None (not given): the one default of every entry point, resolved once when the request is
    # queued (resolved_max_tokens; the scheduler stores it on the request): the rest of the
    # context, at most DEFAULT_MAX_TOKENS. 0: prefill only (score the prompt, generate nothing)
    max_tokens: int | None = None
    min_tokens: int = 0  # EOS and stop_token_ids are masked until this many tokens exist
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0 = off
    min_p: float = 0.0
    frequency_penalty: float = 0.0  # OpenAI-style, over output tokens
    presence_penalty: float = 0.0  # OpenAI-style, over output tokens
    repetition_penalty: float = 1.0  # HF-style, over prompt + output tokens
    logit_bias: dict[int, float] | None = None  # stored as LogitBias (any mapping); {} -> None
    stop: tuple[str, ...] = ()  # a str is accepted and becomes a 1-tuple
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    n: int = 1
    logprobs: bool = False  # return the sampled token's logprob
    top_logprobs: int = 0  # 0..MAX_TOP_LOGPROBS alternatives per position (independent of logprobs)
    prompt_logprobs_start: int | None = None  # prompt position from which logprobs are returned
    skip_special_tokens: bool = True
    # constrained decoding (at most one): the output must match the regex, be JSON valid under
    # the schema (a JSON string; a dict is dumped), or be exactly one of the choices
    regex: str | None = None
    json_schema: str | None = None  # a dict is accepted and dumped
    choices: tuple[str, ...] | None = None
    # tool calls (a constraint like the three above): JSON text {"format", "mode", "parallel",
    # "tools": [{"name", "parameters"}]}, the calls the output must be (constrained/structural.py)
    tool_calls: str | None = None
    # context-free grammars (run on llguidance): GBNF as llama.cpp writes it (root ::= ...), or
    # Lark as llguidance and vLLM take it (start: ...)
    ebnf: str | None = None
    lark: str | None = None
    # the output starts with this reasoning format's thinking (REASONING_FORMAT_NAMES); the
    # constraint, if any, applies only after it
    reasoning_format: str | None = None
    # a pooling request (pooling_params.py): max_tokens=0, and the pooled hidden state or a
    # head's logits come back instead of tokens
    pooling: Pooling | None = None

    def __post_init__(self) -> None:
        self._check_ints()
        self._check_floats()
        self._check_bools()
        self._normalise_logit_bias()
        self._normalise_stop()
        self._normalise_stop_token_ids()
        self._normalise_constraint()
        if self.pooling is not None:
            self._check_pooling()

    # --- validation --------------------------------------------------------------------------

    def _set(self, name: str, value: Any) -> None:
        msgspec.structs.force_setattr(self, name, value)  # frozen: normalisation only here

    def _check_ints(self) -> None:
        for name in ("min_tokens", "top_k", "n", "top_logprobs"):
            value = getattr(self, name)
            if not _is_int(value):
                raise _bad(name, value, "must be an int")
            if not _is_int64(value):
                raise _bad(name, value, "must fit in 64 bits")
        for name in ("max_tokens", "seed", "prompt_logprobs_start"):
            value = getattr(self, name)
            if value is not None and not _is_int(value):
                raise _bad(name, value, "must be an int or None")
            if value is not None and not _is_int64(value):
                raise _bad(name, value, "must fit in 64 bits")
        if self.max_tokens is not None and self.max_tokens < 0:
            raise _bad("max_tokens", self.max_tokens, "must be >= 1, 0 (prefill only: score "
                       "the prompt, generate nothing) or None (the default)")
        if self.min_tokens < 0 or (self.max_tokens is not None
                                   and self.min_tokens > self.max_tokens):
            allowed = f"must be in [0, max_tokens={self.max_tokens}]"
            raise _bad("min_tokens", self.min_tokens, allowed)
        if self.top_k < -1:
            raise _bad("top_k", self.top_k, "must be -1 or 0 (off) or >= 1")
        if not 1 <= self.n <= MAX_N:
            raise _bad("n", self.n, f"must be in [1, {MAX_N}]")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise _bad("top_logprobs", self.top_logprobs, f"must be in [0, {MAX_TOP_LOGPROBS}]")
        if self.prompt_logprobs_start is not None and self.prompt_logprobs_start < 0:
            raise _bad("prompt_logprobs_start", self.prompt_logprobs_start, "must be >= 0 or None")

    def _check_floats(self) -> None:
        for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
                     "repetition_penalty"):
            value = getattr(self, name)
            if not _is_real(value) or not math.isfinite(value):
                raise _bad(name, value, "must be a finite number")
            self._set(name, float(value))
        if self.temperature < 0:
            raise _bad("temperature", self.temperature, "must be >= 0 (0 means greedy)")
        if not 0 < self.top_p <= 1:
            raise _bad("top_p", self.top_p, "must be in (0, 1]")
        if not 0 <= self.min_p <= 1:
            raise _bad("min_p", self.min_p, "must be in [0, 1]")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not -PENALTY_LIMIT <= value <= PENALTY_LIMIT:
                raise _bad(name, value, f"must be in [-{PENALTY_LIMIT}, {PENALTY_LIMIT}]")
        if self.repetition_penalty <= 0:
            raise _bad("repetition_penalty", self.repetition_penalty, "must be > 0 (1 means off)")

    def _check_bools(self) -> None:
        for name in ("ignore_eos", "logprobs", "skip_special_tokens"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise _bad(name, value, "must be a bool")

    def _normalise_logit_bias(self) -> None:
        bias = self.logit_bias
        if bias is None:
            return
        if not isinstance(bias, Mapping):
            raise _bad("logit_bias", bias, "must be a mapping {token_id: bias} or None")
        if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
            raise ValueError(f"logit_bias has {len(bias)} entries: at most "
                             f"{MAX_LOGIT_BIAS_ENTRIES} are allowed")
        for token_id, value in bias.items():
            if not _is_int64(token_id) or token_id < 0:
                raise _bad("logit_bias", bias, f"key {token_id!r} must be a token id "
                           "(int >= 0, within 64 bits)")
            if not _is_real(value) or not -LOGIT_BIAS_LIMIT <= value <= LOGIT_BIAS_LIMIT:
                raise _bad("logit_bias", bias, f"value {value!r} for token {token_id} must be a "
                           f"finite number in [-{LOGIT_BIAS_LIMIT}, {LOGIT_BIAS_LIMIT}]")
        items = {token_id: float(value) for token_id, value in bias.items()}
        self._set("logit_bias", LogitBias(items) if items else None)

    def _normalise_stop(self) -> None:
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        if not isinstance(stop, Sequence) or isinstance(stop, (bytes, bytearray)):
            raise _bad("stop", self.stop, "must be a str or a sequence of non-empty str")
        if len(stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop has {len(stop)} strings: at most {MAX_STOP_STRINGS} are "
                             "allowed")
        for item in stop:
            if not isinstance(item, str) or not item:
                raise _bad("stop", self.stop, f"entry {item!r} must be a non-empty str")
            if len(item) > MAX_STOP_STRING_CHARS:
                raise ValueError(f"a stop string has {len(item)} characters: at most "
                                 f"{MAX_STOP_STRING_CHARS} are allowed")
        self._set("stop", tuple(stop))

    def _normalise_stop_token_ids(self) -> None:
        ids = self.stop_token_ids
        if not isinstance(ids, Sequence) or isinstance(ids, (str, bytes, bytearray)):
            raise _bad("stop_token_ids", ids, "must be a sequence of token ids (int >= 0)")
        if len(ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"stop_token_ids has {len(ids)} entries: at most "
                             f"{MAX_STOP_TOKEN_IDS} are allowed")
        for token_id in ids:
            if not _is_int64(token_id) or token_id < 0:
                raise _bad("stop_token_ids", ids, f"entry {token_id!r} must be an int >= 0 "
                           "within 64 bits")
        self._set("stop_token_ids", tuple(ids))

    def _normalise_constraint(self) -> None:
        schema = self.json_schema
        if schema is not None and not isinstance(schema, str):
            if not isinstance(schema, Mapping):
                raise _bad("json_schema", schema, "must be a JSON schema (a dict or JSON text)")
            self._set("json_schema", json.dumps(schema))
        if self.regex is not None and (not isinstance(self.regex, str) or not self.regex):
            raise _bad("regex", self.regex, "must be a non-empty str")
        if self.choices is not None:
            choices = self.choices
            if isinstance(choices, str) or not isinstance(choices, Sequence) or not choices:
                raise _bad("choices", choices, "must be a non-empty list of non-empty str")
            if any(not isinstance(c, str) or not c for c in choices):
                raise _bad("choices", choices, "must be a non-empty list of non-empty str")
            if len(choices) > MAX_CHOICES:
                raise ValueError(f"choices has {len(choices)} entries: at most {MAX_CHOICES} "
                                 "are allowed")
            self._set("choices", tuple(choices))
        if self.tool_calls is not None and (not isinstance(self.tool_calls, str)
                                            or not self.tool_calls):
            raise _bad("tool_calls", self.tool_calls, "must be a non-empty str (JSON text)")
        for name in ("ebnf", "lark"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise _bad(name, value, "must be a non-empty str (a grammar)")
        if self.reasoning_format is not None and \
                self.reasoning_format not in REASONING_FORMAT_NAMES:
            raise _bad("reasoning_format", self.reasoning_format,
                       f"must be one of {list(REASONING_FORMAT_NAMES)} or None")
        for name in CONSTRAINT_FIELDS:
            value = getattr(self, name)
            size = sum(map(len, value)) if name == "choices" and value else len(value or "")
            limit = MAX_SCHEMA_CHARS if name == "json_schema" else MAX_GRAMMAR_CHARS
            if size > limit:
                raise ValueError(f"{name} has {size} characters: at most {limit} are allowed")
        given = [n for n in CONSTRAINT_FIELDS if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError("give at most one of regex, json_schema, choices, tool_calls, ebnf "
                             f"and lark (got {given})")
        if given and self.ignore_eos:
            raise _bad("ignore_eos", True, f"cannot be combined with {given[0]}: a grammar ends "
                       "the output with EOS when it is complete")
        if given and self.min_tokens:
            raise _bad("min_tokens", self.min_tokens, f"must be 0 with {given[0]}: the grammar "
                       "decides the length")

    def _check_pooling(self) -> None:
        if self.max_tokens != 0:
            raise _bad("max_tokens", self.max_tokens, "must be 0 for a pooling request (it "
                       "returns a vector or scores, no tokens)")
        if self.n != 1:
            raise _bad("n", self.n, "must be 1 for a pooling request")
        given = [n for n in CONSTRAINT_FIELDS if getattr(self, n) is not None]
        if given:
            raise ValueError(f"a pooling request generates nothing: {given[0]} does not apply")
        if self.prompt_logprobs_start is not None:
            raise _bad("prompt_logprobs_start", self.prompt_logprobs_start, "must be None for a "
                       "pooling request (it returns a vector or scores)")

    @property
    def constraint(self) -> tuple[str, str | tuple[str, ...]] | None:
        """(kind, pattern) of the grammar the output must follow, or None. With a reasoning
        format, the kind is "reasoning": its thinking first, then the constraint."""
        for kind in CONSTRAINT_FIELDS:
            value = getattr(self, kind)
            if value is not None:
                if self.reasoning_format is None:
                    return kind, value
                inner = list(value) if kind == "choices" else value
                return "reasoning", json.dumps({"format": self.reasoning_format,
                                                "then": [kind, inner]})
        return None

    def resolved_max_tokens(self, prompt_tokens: int, context_length: int) -> int:
        """The max_tokens a queued request runs with: None becomes the default rule (which
        min_tokens must not exceed either)."""
        if self.max_tokens is not None:
            return self.max_tokens
        resolved = default_max_tokens(prompt_tokens, context_length)
        if self.min_tokens > resolved:
            raise _bad("min_tokens", self.min_tokens, f"must be in [0, max_tokens={resolved}] "
                       "(max_tokens left out: the rest of the context)")
        return resolved

    def validate_for_vocab(self, vocab_size: int) -> None:
        """Reject token ids that the model cannot produce (needs the vocab, so not in __init__)."""
        if self.logit_bias is not None:
            for token_id in self.logit_bias:
                if token_id >= vocab_size:
                    raise _bad("logit_bias", dict(self.logit_bias),
                               f"token id {token_id} must be < vocab_size={vocab_size}")
        for token_id in self.stop_token_ids:
            if token_id >= vocab_size:
                raise _bad("stop_token_ids", self.stop_token_ids,
                           f"token id {token_id} must be < vocab_size={vocab_size}")

    # --- derived -----------------------------------------------------------------------------

    def with_(self, **changes: Any) -> SamplingParams:
        """A validated copy with some fields changed."""
        unknown = sorted(set(changes) - set(self.__struct_fields__))
        if unknown:
            raise TypeError(f"unknown sampling option(s) {unknown}; known options: "
                            f"{sorted(self.__struct_fields__)}")
        return msgspec.structs.replace(self, **changes)

    @classmethod
    def from_fields(cls, values: Mapping[str, Any]) -> SamplingParams:
        """Built at an edge from a client's field values (the DSL endpoint's `params`)."""
        unknown = sorted(set(values) - set(cls.__struct_fields__))
        if unknown:
            raise ValueError(f"unknown sampling option(s) {unknown}; known: "
                             f"{sorted(cls.__struct_fields__)}")
        return cls(**values)

    @property
    def prefill_only(self) -> bool:
        """max_tokens=0: compute the prompt (its logprobs, its cache entry), sample nothing."""
        return self.max_tokens == 0

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_penalties(self) -> bool:
        """True if the sampler needs this request's token history (prompt and/or output ids)."""
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs or self.top_logprobs > 0


def default_max_tokens(prompt_tokens: int, context_length: int) -> int:
    """max_tokens when a request leaves it out, whatever its entry point (Engine, HTTP, DSL):
    the rest of the context, at most DEFAULT_MAX_TOKENS (at least 1: a prompt that fills the
    context is refused with its own message)."""
    return max(1, min(DEFAULT_MAX_TOKENS, context_length - prompt_tokens))


def check_token_ids(ids: Sequence[int], vocab_size: int) -> None:
    """Refuse prompt token ids the model does not have (checked once, where every request is
    queued: Scheduler.add_request)."""
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
