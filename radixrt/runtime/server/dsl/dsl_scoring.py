"""Scoring of `select` choices for DSL clients: one client call, one batch of runtime requests.

The text before the choices is prefilled once (a cache hit when the program computed it before);
then every choice runs at once as a prompt whose log-probabilities are returned from the first
token where the choices' tokenizations part from the text's, all hitting that cached prefix.
The text's images (rx.image) go with every prompt that holds them: the same placeholder ids in
each, so the choices share the images' KV in the tree too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from radixrt.runtime.image_messages import ImageInput
from radixrt.runtime.messages import DslChoice, Scheduling, TokenLogprob
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager

PREFILL_ONLY = SamplingParams(max_tokens=0)  # the prompt's logprobs (and cache entry) only


async def score_choices(
    manager: TokenizerManager, text: str, choices: list[str], unconditional: bool,
    prefill_first: bool = True, scheduling: Scheduling | None = None,
    images: Sequence[Any] = (),
) -> list[DslChoice]:
    """Log-probabilities of each choice's tokens after `text` (and alone, if unconditional).
    prefill_first: compute the shared text before the choices (pointless without a radix cache).
    scheduling: the priority and tenant every scoring request runs with. images: the text's
    (decoded; one image token each in the text), sent with every prompt that holds them.
    Raises ValueError for empty text or choices, or when the runtime refuses a request."""
    scheduling = scheduling or Scheduling()
    if not text:
        raise ValueError("select needs some text before it to score the choices against")
    if not choices or any(not isinstance(c, str) or not c for c in choices):
        raise ValueError("choices must be a non-empty list of non-empty strings")
    prefix_ids, prefix_images = await _encode(manager, text, images)
    full = [await _encode(manager, text + c, images) for c in choices]
    start = max(1, min(min(common_len(prefix_ids, ids), len(ids) - 1) for ids, _ in full))
    shared = [im for im in prefix_images if im.runs[-1][0] + im.runs[-1][1] <= start]
    if prefill_first and start > 1 and len(shared) == len(prefix_images):
        # the shared text once (its images whole in it); the choices find it in the cache
        await _prompt_logprobs(manager, prefix_ids[:start], None, scheduling, shared)
    tasks = [_prompt_logprobs(manager, ids, start, scheduling, ims) for ids, ims in full]
    if unconditional:
        tasks += [_prompt_logprobs(manager, _alone(manager, c), 1, scheduling) for c in choices]
    results = await _gather_or_cancel(tasks)
    out = []
    for i, (ids, _) in enumerate(full):
        uncond = [lp.logprob for lp in results[len(choices) + i]] if unconditional else []
        out.append(DslChoice(ids[start:], [lp.logprob for lp in results[i]], uncond))
    return out


def common_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def start_token_id(tokenizer: Any) -> int:
    """What an unconditional score conditions on: BOS where the model has one, else EOS."""
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else (
        tokenizer.eos_token_id)
    return int(start)


def start_text(tokenizer: Any) -> str:
    """The start token as text (server_info's score_start), so that an OpenAI-API client scores
    a choice alone exactly as the DSL endpoint does: prompt = score_start + choice."""
    return str(tokenizer.decode([start_token_id(tokenizer)], skip_special_tokens=False))


def _alone(manager: TokenizerManager, choice: str) -> list[int]:
    """The choice after a start token only."""
    tok = manager.tokenizer
    return [start_token_id(tok), *tok.encode(choice, add_special_tokens=False)]


async def _encode(manager: TokenizerManager, text: str, images: Sequence[Any]
                  ) -> tuple[list[int], list[ImageInput]]:
    return await manager.encode_images(text, images) if images else (manager.encode(text), [])


async def _prompt_logprobs(
    manager: TokenizerManager, ids: list[int], start: int | None, scheduling: Scheduling,
    images: Sequence[ImageInput] = (),
) -> list[TokenLogprob]:
    params = PREFILL_ONLY if start is None else PREFILL_ONLY.with_(prompt_logprobs_start=start)
    logprobs: list[TokenLogprob] = []
    async with contextlib.aclosing(manager.generate(ids, params, scheduling=scheduling,
                                                    images=images)) as stream:
        async for chunk in stream:
            logprobs.extend(chunk.prompt_logprobs)
    return logprobs


async def _gather_or_cancel(coros: list) -> list:
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
