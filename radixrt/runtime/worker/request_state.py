"""RequestState: what the worker keeps of one request between steps, so that a step plan
carries deltas only (messages.py): its tokens, its slot table, its grammar's place, its pooled
rows, its images."""

from __future__ import annotations

from dataclasses import dataclass

from radixrt.runtime.constrained.grammar_engine import GrammarState
from radixrt.runtime.image_messages import ImageInput
from radixrt.runtime.models.pooler import PoolState
from radixrt.runtime.sampling_params import SamplingParams


@dataclass
class RequestState:
    params: SamplingParams
    max_tokens: int  # resolved at admission by the scheduler
    token_ids: list[int]  # prompt + outputs so far (an image's placeholders as its token)
    prompt_len: int
    slots: list[int]  # slot of every position whose K/V is computed
    seed_offset: int
    grammar: GrammarState | None = None  # where a constrained output is in its grammar
    lora: str | None = None  # the LoRA adapter it runs under (LoraAdapter.key)
    pool: PoolState | None = None  # a pooling request: what it pooled of its prompt so far
    images: list[ImageInput] | None = None  # its prompt's images (worker/image_embeds.py)
