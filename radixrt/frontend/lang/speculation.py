"""API speculative execution, SGLang's `@function(num_api_spec_tokens=N)`: one generate call
writes on past the gen that made it, and the program's next literal text and gens take their
values from that speculated text instead of calling the backend again. The saving is calls (round
trips, and the prompt each call sends); the radix cache already makes the prompt's reuse cheap.

How it runs (the executor drives it, this module decides):

- A gen that may speculate (`speculates`), with nothing speculated: one call with the gen's
  options, its stop strings removed, for N tokens (or its own max_tokens, if more). The output
  is kept piece by piece with the tokens of each piece (the call is streamed for that; a
  backend that does not say a piece's tokens counts one per piece).
- A gen takes the speculated text up to its first stop string (the stop string stays: the
  program's next literal text should start with it), or its first max_tokens tokens (the
  runtime's default, DEFAULT_MAX_TOKENS, when it gives none), or, when the call ended on its
  own (end of sequence, not its length), all of it: what its own call would have returned.
  When the text holds none of these (cut by the call's length before the gen's end, or a
  max_tokens that falls inside a piece of several tokens), the gen drops the speculation and
  makes a fresh speculative call, and if even that cannot say, its own call.
- Text the program appends (literals, role markers, select choices) is matched against what
  is left: a prefix of it is consumed; anything else drops the speculation (the model wrote
  something else; the next gen calls from the program's real text).
- A gen with other sampling options than those the speculation was made with, or one that may
  not speculate (a constraint, logprobs, min_tokens, stop_token_ids, separate_reasoning, n > 1),
  drops it and calls as usual. So do a fork's children, as in SGLang (a child's one gen would
  otherwise write N tokens past its end for nothing).

SGLang has a second form for chat-only APIs (its OpenAI chat backend, which cannot continue a
half-written assistant message, defers a role's gens to one call at the role's end). Every
radixrt backend continues text, so this one form also runs inside roles: the speculative call
writes on to the end of the model's turn (its end-of-turn token ends the call).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from radixrt.runtime.config import DEFAULT_MAX_TOKENS
from radixrt.runtime.sampling_params import CONSTRAINT_FIELDS

# options that make a gen call for real (the speculated text cannot stand for its output)
NOT_SPECULATED = ("logprobs", "top_logprobs", "prompt_logprobs_start", "min_tokens",
                  "stop_token_ids", "separate_reasoning", *CONSTRAINT_FIELDS)
# options a speculation is cut by (the rest must match for a gen to take from it)
CUT_BY = ("stop", "max_tokens")


@dataclass(frozen=True)
class Taken:
    """What a gen took from the speculation: its value and how its own call would have ended."""

    text: str
    tokens: int
    finish_reason: str | None
    prompt_tokens: int = 0  # the speculative call's, for the gen that made it (else 0)
    cached_tokens: int = 0


@dataclass
class _Held:
    key: tuple[tuple[str, Any], ...]  # the sampling options it was made with
    pieces: list[list[Any]]  # [text, tokens], in order; the front is consumed as it is used
    finish_reason: str | None  # the call's ("length": cut by max_tokens)
    prompt_tokens: int = 0  # reported once, by the first gen that takes from it
    cached_tokens: int = 0

    @property
    def text(self) -> str:
        return "".join(p[0] for p in self.pieces)


def speculates(params: Mapping[str, Any]) -> bool:
    """Whether a gen with these options may take its value from speculated text."""
    if int(params.get("n") or 1) != 1:
        return False
    return not any(params.get(name) for name in NOT_SPECULATED)


def _key(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, repr(v)) for k, v in params.items() if k not in CUT_BY))


def _stops(params: Mapping[str, Any]) -> tuple[str, ...]:
    stop = params.get("stop") or ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def _max_tokens(params: Mapping[str, Any]) -> int:
    given = params.get("max_tokens")
    return DEFAULT_MAX_TOKENS if given is None else int(given)


@dataclass
class Speculation:
    """The speculated text of one program state."""

    num_tokens: int  # N: how far past a gen its speculative call writes
    _held: _Held | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.num_tokens, int) or isinstance(self.num_tokens, bool) \
                or self.num_tokens < 1:
            raise ValueError(f"num_api_spec_tokens={self.num_tokens!r}: give an int >= 1 (or "
                             "None: no speculation)")

    @property
    def text(self) -> str:
        """What is speculated and not used yet."""
        return "" if self._held is None else self._held.text

    def call_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The options of the speculative call a gen with `params` makes: no stop strings, and
        N tokens (the gen's own max_tokens where it gives more)."""
        out = {k: v for k, v in params.items() if k != "stop"}
        out["max_tokens"] = max(params.get("max_tokens") or 0, self.num_tokens)
        return out

    def keep(self, params: Mapping[str, Any], pieces: list[tuple[str, int]], text: str,
             tokens: int, finish_reason: str | None, prompt_tokens: int = 0,
             cached_tokens: int = 0) -> None:
        """Hold a speculative call's output: its streamed (text, tokens) pieces and its final
        text and token count (which win where the pieces do not add up to them)."""
        joined = "".join(t for t, _ in pieces)
        counted = sum(n for _, n in pieces)
        if not text.startswith(joined) or counted > tokens:
            kept = [[text, tokens]]  # the pieces do not add up: one piece of everything
        else:
            kept = [[t, n] for t, n in pieces]
            if len(text) > len(joined) or tokens > counted:
                kept.append([text[len(joined):], tokens - counted])
        self._held = _Held(_key(params), [p for p in kept if p[0] or p[1]], finish_reason,
                           prompt_tokens, cached_tokens)

    def take(self, params: Mapping[str, Any]) -> Taken | None:
        """The value of a gen with `params` from the speculated text, consumed; None when there
        is none to take (nothing held, other options, or the text does not say where the gen
        would end): the caller drops the speculation and calls."""
        held = self._held
        if held is None or held.key != _key(params):
            return None
        text = held.text
        ends, end, total = [], 0, 0  # per piece: (its end in text, tokens through it)
        for piece_text, tokens in held.pieces:
            end, total = end + len(piece_text), total + tokens
            ends.append((end, total))
        limit = _max_tokens(params)

        def tokens_through(char: int) -> int:
            return next((n for end, n in ends if end >= char), total)

        stop_at = min(((text.find(s), len(s)) for s in _stops(params) if s in text),
                      default=None)
        if stop_at is not None and tokens_through(stop_at[0] + stop_at[1]) <= limit:
            cut, reason = stop_at[0], "stop"
            tokens = tokens_through(cut) if cut else 0
        elif total >= limit:
            cut = next((end for end, n in ends if n == limit), None)
            if cut is None:  # max_tokens falls inside a piece: where exactly is unknown
                return None
            tokens, reason = limit, "length"  # (total == limit: the last piece ends at len)
        elif held.finish_reason != "length":
            cut, tokens, reason = len(text), total, held.finish_reason
        else:
            return None
        self._consume(cut)
        taken = Taken(text[:cut], tokens, reason, held.prompt_tokens, held.cached_tokens)
        held.prompt_tokens = held.cached_tokens = 0
        return taken

    def fill(self, text: str) -> None:
        """The program appended `text`: consume it from the speculation, or drop it."""
        if self._held is None or not text:
            return
        if self._held.text.startswith(text):
            self._consume(len(text))
        else:
            self._held = None

    def drop(self) -> None:
        self._held = None

    def _consume(self, chars: int) -> None:
        """Remove the first `chars` characters (a piece cut in two keeps its tokens with its
        rest); nothing left: the speculation is used up."""
        held = self._held
        assert held is not None
        while chars and held.pieces:
            piece = held.pieces[0]
            if len(piece[0]) <= chars:
                chars -= len(piece[0])
                held.pieces.pop(0)
            else:
                piece[0] = piece[0][chars:]
                chars = 0
        if not held.pieces or not held.text:
            self._held = None
