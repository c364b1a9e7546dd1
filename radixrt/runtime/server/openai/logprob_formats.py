"""Token logprobs as the OpenAI-shaped APIs write them: the legacy completions format (with
the echoed prompt's tokens first), and the chat format (text, bytes, top alternatives) that
/v1/chat/completions and the Responses API's output_text use. Token texts are memoised per
server (TokenText)."""

from __future__ import annotations

from typing import Any

from radixrt.runtime.messages import TokenLogprob
from radixrt.runtime.server.openai.openai_protocol import (
    ChatLogprobs,
    CompletionLogprobs,
    TokenLogprobOut,
    TopLogprob,
)


class TokenText:
    """Token id -> its text, memoised (a tokenizer decode per distinct id)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id])
            self._cache[token_id] = text
        return text


def completion_logprobs(
    token_text: TokenText, logprobs: list[TokenLogprob], offset: int = 0
) -> CompletionLogprobs:
    """The legacy completions format; text_offset counts characters from `offset`."""
    out = CompletionLogprobs()
    for item in logprobs:
        text = token_text(item.token_id)
        out.tokens.append(text)
        out.token_logprobs.append(item.logprob)
        out.top_logprobs.append({token_text(t): lp for t, lp in item.top})
        out.text_offset.append(offset)
        offset += len(text)
    return out


def echo_logprobs(
    token_text: TokenText, first_token: int, prompt_logprobs: list[TokenLogprob]
) -> CompletionLogprobs:
    """The prompt's tokens in the legacy format: its first token (no logprob, nothing precedes
    it), then the runtime's prompt logprobs of the rest, offsets counted from 0."""
    first = token_text(first_token)
    out = CompletionLogprobs(tokens=[first], token_logprobs=[None], top_logprobs=[None],
                             text_offset=[0])
    return out.extend(completion_logprobs(token_text, prompt_logprobs, len(first)))


def chat_logprobs(token_text: TokenText, logprobs: list[TokenLogprob]) -> ChatLogprobs:
    def entry(token_id: int, logprob: float) -> TopLogprob:
        text = token_text(token_id)
        return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode("utf-8")))

    content = []
    for item in logprobs:
        head = entry(item.token_id, item.logprob)
        tops = [entry(t, lp) for t, lp in item.top]
        content.append(TokenLogprobOut(**head.model_dump(), top_logprobs=tops))
    return ChatLogprobs(content=content)
