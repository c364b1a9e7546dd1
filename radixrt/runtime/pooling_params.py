"""Pooling: what a request that is read rather than continued asks of the model, and what the
served model can give.

A pooling request is a prefill-only request (`SamplingParams.max_tokens == 0`) whose
`SamplingParams.pooling` says what to return instead of tokens:

- task "embed": the final hidden states (after the model's last norm) pooled over the prompt --
  the last token's row ("last"), the mean of every row ("mean") or the first row ("cls") --
  then cut to its first `dimensions` entries (Matryoshka) and scaled to unit length if
  `normalize`; vLLM's order: cut first, then normalize, so a cut vector is unit length too;
- task "classify": a head's logits at the pooled row: the checkpoint's classification head
  (`*ForSequenceClassification`, `score.weight`), or, on a language model, the LM head's
  logits of `label_tokens` (a yes/no reranker: [no, yes]). Raw logits; the surface turns them
  into probabilities (softmax) or a score (sigmoid).

Pooling over the last row reuses a cached prefix like any prompt (only the rows after it are
computed); "mean" and "cls" need every row's hidden state, so their prompts are computed whole
(their KV still goes into the radix tree for others).

`PoolingInfo` is what the worker's model offers (read from the checkpoint: sentence-transformers'
`modules.json` / `1_Pooling/config.json`, the classification head's labels); it travels in
`WorkerReady` so every surface fills a request's mode and defaults from the one source.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import msgspec

# what a served model is for (`--task`; models/pooling_config.py reads "auto" from the checkpoint)
MODEL_TASKS = ("auto", "generate", "embed", "rerank", "classify", "reward")
POOLING_TASKS = ("embed", "classify")
POOLING_MODES = ("last", "mean", "cls")
MAX_LABEL_TOKENS = 16  # label_tokens of an LM-head classifier
MAX_DIMENSIONS = 1 << 16


class Pooling(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    task: str  # "embed" | "classify"
    mode: str = "last"  # which rows it pools: "last" | "mean" | "cls"
    normalize: bool = False  # embed: to unit length (after the cut to `dimensions`)
    dimensions: int | None = None  # embed: keep the first N entries (Matryoshka)
    label_tokens: tuple[int, ...] = ()  # classify on an LM head: these tokens' logits

    def __post_init__(self) -> None:
        if self.task not in POOLING_TASKS:
            raise ValueError(f"pooling task {self.task!r} is invalid: use one of "
                             f"{list(POOLING_TASKS)}")
        if self.mode not in POOLING_MODES:
            raise ValueError(f"pooling mode {self.mode!r} is invalid: use one of "
                             f"{list(POOLING_MODES)}")
        if not isinstance(self.normalize, bool):
            raise ValueError(f"normalize={self.normalize!r} must be a bool")
        dims = self.dimensions
        if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool)
                                 or not 1 <= dims <= MAX_DIMENSIONS):
            raise ValueError(f"dimensions={dims!r} is invalid: give an integer >= 1 (at most "
                             "the model's hidden size), or leave it out")
        tokens = tuple(self.label_tokens)
        if len(tokens) > MAX_LABEL_TOKENS or any(
                not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in tokens):
            raise ValueError(f"label_tokens must be at most {MAX_LABEL_TOKENS} token ids")
        msgspec.structs.force_setattr(self, "label_tokens", tokens)
        if self.task == "embed" and tokens:
            raise ValueError("label_tokens belong to task 'classify'")

    @property
    def whole_prompt(self) -> bool:
        """True when every row of the prompt is pooled: no cached prefix may be skipped."""
        return self.mode != "last"


class PoolingInfo(msgspec.Struct, frozen=True):
    """What the served model offers for pooling requests.

    mode / normalize: how embeddings are pooled by default (the checkpoint's
    sentence-transformers files; else the last token, normalized); hidden_size: the embedding's
    length; num_labels / labels: the classification head (0: none); generates: it has an LM
    head; task: what `--task` (or the checkpoint) says the model is for ("generate", "embed",
    "rerank", "classify", "reward"); rerank_tokens: a language model reranking by its yes/no
    logits reads these tokens ([no, yes]); empty when it does not rerank that way."""

    mode: str = "last"
    normalize: bool = True
    hidden_size: int = 0
    num_labels: int = 0
    labels: tuple[str, ...] = ()
    generates: bool = True
    task: str = "generate"
    rerank_tokens: tuple[int, ...] = ()


def check_pooling(spec: Pooling | None, info: PoolingInfo, vocab_size: int | None) -> None:
    """Refuse a request the served model cannot answer (ValueError saying what it can do)."""
    if spec is None:
        if not info.generates:
            raise ValueError("this model has a classification head and no LM head: it does not "
                             "generate; use /classify, /v1/rerank or /v1/embeddings")
        return
    if spec.dimensions is not None and info.hidden_size and spec.dimensions > info.hidden_size:
        raise ValueError(f"dimensions={spec.dimensions} is more than the model's "
                         f"{info.hidden_size}: give at most {info.hidden_size}")
    if spec.task == "classify":
        if info.num_labels and spec.label_tokens:
            raise ValueError("label_tokens read an LM head; this model has a classification "
                             "head")
        if not info.num_labels and not spec.label_tokens:
            raise ValueError("this model has no classification head: it scores with an LM "
                             "head's label_tokens (start it with --task rerank), or embeds")
        if not info.generates and spec.label_tokens:
            raise ValueError("label_tokens read an LM head, which this model lacks")
        bad = [t for t in spec.label_tokens if vocab_size is not None and t >= vocab_size]
        if bad:
            raise ValueError(f"label_tokens {bad} are outside the vocabulary")


def pack_floats(values: Sequence[float]) -> bytes:
    """float32 little-endian, as OpenAI's base64 embeddings carry them."""
    return struct.pack(f"<{len(values)}f", *values)


def unpack_floats(data: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(data) // 4}f", data))


def softmax(logits: Sequence[float]) -> list[float]:
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    total = sum(exps)
    return [e / total for e in exps]


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
