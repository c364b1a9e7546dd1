"""Turning what a user passes as a prompt into token ids: text, token ids, or chat messages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from radixrt.runtime.tokenizer.chat_tool_prompts import render_chat

Prompt = str | Sequence[int] | Sequence[Mapping[str, Any]]
MAX_TOKEN_ID = 1 << 32  # tokenizers take token ids as unsigned 32-bit integers


def is_single_prompt(value: Any) -> bool:
    """A str, a list of ints or a list of chat messages is one prompt; a list of those is many."""
    if isinstance(value, str):
        return True
    if isinstance(value, Sequence) and value:
        first = value[0]
        return isinstance(first, (int, Mapping)) and not isinstance(first, bool)
    return False


def encode_prompt(tokenizer: Any, prompt: Prompt) -> list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt is empty: give some text, token ids or chat messages")
        return list(tokenizer.encode(prompt, add_special_tokens=True))
    if not isinstance(prompt, Sequence) or not prompt:
        raise ValueError("prompt must be a non-empty str, list of token ids or list of messages")
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        # the model's vocabulary bounds them where the request is queued (the scheduler); here
        # only what the detokenizer can take at all
        bad = [t for t in prompt if not 0 <= t < MAX_TOKEN_ID]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary")
        return list(prompt)  # type: ignore[arg-type]
    if all(isinstance(m, Mapping) for m in prompt):
        for i, m in enumerate(prompt):
            if "role" not in m or "content" not in m:
                raise ValueError(f"chat message {i} needs 'role' and 'content' keys, got {dict(m)}")
        return render_chat(tokenizer, prompt)
    raise ValueError("a prompt is a str, a list of token ids (ints) or a list of chat messages")
