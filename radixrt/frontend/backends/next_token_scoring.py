"""Scoring `select` choices on an OpenAI-compatible server that does not echo prompt
log-probabilities (llama.cpp's llama-server: `echo` is ignored and only generated tokens carry
logprobs): each choice token's log-probability is read from the next-token distribution after
the text and the choice's tokens before it.

1. The server tokenizes the text and every text + choice (`POST /tokenize`); a choice's scored
   tokens start where the tokenizations part from the text's, as radixrt's own scoring does.
2. Every distinct prefix whose next token must be scored becomes one prompt of token ids; all of
   them go in ONE `/v1/completions` request (max_tokens=1, logprobs=TOP_K), so a select of
   one-token choices (A-D) costs one prompt.
3. A choice token's log-probability is its entry among the prefix's top TOP_K; a token outside
   them gets the least logprob among them (an upper bound on its own), which only ever makes an
   unlikely choice look slightly less unlikely.

The top logprobs must come with token ids (llama-server's "content" entries); a server that
neither echoes nor names token ids has no route here, and the caller says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixrt.frontend.lang.backend import BackendError, ChoiceLogprobs

TOP_K = 100  # alternatives asked for at each scored position


class NoScoringRoute(BackendError):
    """The server lacks what this route needs (/tokenize, token ids in its logprobs)."""


Post = Callable[[str, dict[str, Any]], dict[str, Any]]  # (path, body) -> the JSON reply


def score_by_next_tokens(post: Post, model: str, text: str, choices: list[str],
                         unconditional: bool) -> list[ChoiceLogprobs]:
    text_ids = _tokenize(post, text, True)
    fulls = [_tokenize(post, text + c, True) for c in choices]
    start = max(1, min(min(_common_len(text_ids, f), len(f) - 1) for f in fulls))
    sequences = [(f, start) for f in fulls]
    if unconditional:  # after the model's start token(s) alone, or from the choice's 2nd token
        begin = _tokenize(post, "", True)
        sequences += [(begin + _tokenize(post, c, False), max(len(begin), 1)) for c in choices]
    prefixes = sorted({tuple(ids[:i]) for ids, first in sequences for i in range(first, len(ids))})
    reply = post("/completions", {"model": model, "prompt": [list(p) for p in prefixes],
                                  "max_tokens": 1, "logprobs": TOP_K, "temperature": 0.0})
    tops = {prefixes[int(c["index"])]: _top_by_id(c) for c in reply.get("choices", [])}
    if len(tops) != len(prefixes):
        raise NoScoringRoute("the server answered a batch of token-id prompts with "
                           f"{len(tops)} completions for {len(prefixes)} prompts")
    scored = [[_lookup(tops[tuple(ids[:i])], ids[i]) for i in range(first, len(ids))]
              for ids, first in sequences]
    n = len(choices)
    return [ChoiceLogprobs(scored[i], scored[n + i] if unconditional else []) for i in range(n)]


def _tokenize(post: Post, text: str, add_special: bool) -> list[int]:
    try:
        reply = post("/tokenize", {"content": text, "add_special": add_special})
    except BackendError as exc:
        raise NoScoringRoute(f"POST /tokenize failed ({exc})") from None
    tokens = reply.get("tokens")
    if not isinstance(tokens, list):
        raise NoScoringRoute("the server's /tokenize did not return token ids")
    return [int(t["id"]) if isinstance(t, dict) else int(t) for t in tokens]


def _top_by_id(choice: dict[str, Any]) -> dict[int, float]:
    """The first generated position's alternatives, token id -> logprob."""
    content = (choice.get("logprobs") or {}).get("content") or []
    if not content or "top_logprobs" not in content[0]:
        raise NoScoringRoute("the server's completion logprobs carry no token ids")
    return {int(e["id"]): float(e["logprob"]) for e in content[0]["top_logprobs"]}


def _lookup(top: dict[int, float], token: int) -> float:
    return top[token] if token in top else min(top.values(), default=float("-inf"))


def _common_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
