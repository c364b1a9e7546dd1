"""ShardPlan: which part of every weight one tensor-parallel rank holds.

Attention is split by heads, the MLP by its intermediate rows, the embedding and LM head by
vocabulary rows; norms are replicated. Each rank holds a list of query heads and a list of KV
heads (global head numbers), with local query head j attending with local KV head
j // (local query heads per local KV head), as in the full model's grouped-query attention.
When the head counts do not divide tp_size the plan pads, exactly:

1. tp_size divides num_kv_heads: each rank takes num_kv_heads / tp_size KV heads and their query
   heads. No padding.
2. num_kv_heads divides tp_size (more ranks than KV heads): each KV head is replicated on
   tp_size / num_kv_heads ranks, which split its group of query heads; a group that does not
   split evenly is padded with zero query heads.
3. Otherwise the KV heads are padded with zero heads up to a multiple of tp_size, each with a
   group of zero query heads (the default model: 9 query and 3 KV heads at tp_size 2 becomes
   12 and 4, six and two per rank).

A padded ("None") head has zero rows in q/k/v (and bias) and zero columns in o_proj, so it adds
exactly zero to the output whatever it attends to. The intermediate size and the vocabulary are
padded up to a multiple of tp_size the same way (zero gate/up rows and down columns; zero
embedding rows, whose logits are dropped after the gather). A plan in which some rank would hold
no real query head (tp_size > num_heads) is refused, with the sizes that work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from radixrt.runtime.models.model_config import KVLayout, ModelConfig


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Slice:
    """Rows [start, start + size) of a dimension padded to size * tp_size; rows at or past
    `real` (the unpadded size) are zero padding."""

    start: int
    size: int
    real: int

    @classmethod
    def of(cls, total: int, tp_size: int, rank: int) -> Slice:
        size = _ceil_div(total, tp_size)
        return cls(rank * size, size, total)

    def indices(self) -> list[int | None]:
        return [i if i < self.real else None for i in range(self.start, self.start + self.size)]


@dataclass(frozen=True)
class ShardPlan:
    tp_size: int
    rank: int
    q_heads: tuple[int | None, ...]  # local query head -> global head (None: zero padding)
    kv_heads: tuple[int | None, ...]  # local KV head -> global KV head (None: zero padding)
    intermediate: Slice
    vocab: Slice

    @property
    def num_heads(self) -> int:
        return len(self.q_heads)

    @property
    def num_kv_heads(self) -> int:
        return len(self.kv_heads)

    @property
    def padded_vocab(self) -> int:
        return self.vocab.size * self.tp_size

    def rows_of(self, size: int) -> Slice:
        """This rank's rows of a dimension split like the MLP's (each expert's intermediate
        dimension, a shared expert's)."""
        return Slice.of(size, self.tp_size, self.rank)

    def kv_shape(self, config: ModelConfig) -> KVLayout:
        """The shape of this rank's KV pool (forward.kv_cache.KVShape): its KV heads, or the
        whole latent of a latent-attention model (replicated on every rank)."""
        if config.kv_lora_rank:
            return config.kv_layout
        return KVLayout(config.num_layers, 2, self.num_kv_heads, config.head_dim)

    @classmethod
    def single(cls, config: ModelConfig) -> ShardPlan:
        return cls.for_rank(config, 1, 0)

    @classmethod
    def for_rank(cls, config: ModelConfig, tp_size: int, rank: int) -> ShardPlan:
        """The plan of one rank; ValueError for a tp_size no plan serves."""
        check_tp_size(config, tp_size)
        if not 0 <= rank < tp_size:
            raise ValueError(f"rank={rank} is outside tp_size={tp_size}")
        q_heads, kv_heads = _heads(config.num_heads, config.num_kv_heads, tp_size, rank)
        return cls(tp_size, rank, tuple(q_heads), tuple(kv_heads),
                   Slice.of(config.intermediate_size, tp_size, rank),
                   Slice.of(config.vocab_size, tp_size, rank))

    def describe(self, config: ModelConfig) -> dict[str, Any]:
        """The layout for logs and /server_info (the same on every rank but for which heads)."""
        padded_q = self.num_heads * self.tp_size - config.num_heads
        kv, tp = config.num_kv_heads, self.tp_size
        return {
            "tp_size": self.tp_size,
            "heads_per_rank": self.num_heads,
            "kv_heads_per_rank": 1 if config.kv_lora_rank else self.num_kv_heads,
            "padded_heads": padded_q,
            "kv_heads": ("latent, replicated" if config.kv_lora_rank else "split" if kv % tp == 0
                         else ("replicated" if tp % kv == 0 else "padded")),
            "intermediate_per_rank": self.intermediate.size,
            "vocab_per_rank": self.vocab.size,
        }


def working_tp_sizes(config: ModelConfig, up_to: int) -> tuple[list[int], list[int]]:
    """(sizes that split the model without padding, sizes that need padding), up to `up_to`."""
    exact, padded = [], []
    for tp in range(1, min(up_to, config.num_heads) + 1):
        plans = [_heads(config.num_heads, config.num_kv_heads, tp, r) for r in range(tp)]
        if any(all(h is None for h in q) for q, _ in plans):
            continue  # some rank would hold padding only
        even = all(None not in q + kv for q, kv in plans) and (
            config.intermediate_size % tp == 0 and config.vocab_size % tp == 0)
        (exact if even else padded).append(tp)
    return exact, padded


def check_tp_size(config: ModelConfig, tp_size: int) -> None:
    if tp_size > 1 and config.qk_norm_all_heads:
        raise ValueError(f"{config.architecture} normalizes q and k over all heads at once, "
                         "which a rank holding some of the heads cannot do: use tp_size=1")
    exact, padded = working_tp_sizes(config, max(tp_size, 1))
    if tp_size not in exact + padded:
        exact, padded = working_tp_sizes(config, 64)
        raise ValueError(
            f"tp_size={tp_size} does not fit a model with {config.num_heads} query heads and "
            f"{config.num_kv_heads} KV heads (every rank needs a query head): use one of "
            f"{exact} (exact split) or {padded} (with zero padding)")


def _heads(num_heads: int, num_kv_heads: int, tp: int,
           rank: int) -> tuple[list[int | None], list[int | None]]:
    group = num_heads // num_kv_heads  # query heads per KV head
    if num_kv_heads % tp == 0:  # 1. split
        kv_local = num_kv_heads // tp
        kv = list(range(rank * kv_local, (rank + 1) * kv_local))
        return [h * group + i for h in kv for i in range(group)], list(kv)
    if tp % num_kv_heads == 0:  # 2. replicate each KV head on `ranks` ranks
        ranks = tp // num_kv_heads
        kv_head, part = divmod(rank, ranks)
        per_rank = _ceil_div(group, ranks)
        q = [part * per_rank + i for i in range(per_rank)]
        return [kv_head * group + i if i < group else None for i in q], [kv_head]
    kv_local = _ceil_div(num_kv_heads, tp)  # 3. pad the KV heads
    kv_ids = range(rank * kv_local, (rank + 1) * kv_local)
    kv: list[int | None] = [h if h < num_kv_heads else None for h in kv_ids]
    q_ids: list[int | None] = [None if h is None else h * group + i for h in kv
                               for i in range(group)]
    return q_ids, kv


def head_rows(heads: Sequence[int | None], head_dim: int) -> list[int | None]:
    """Rows (of a [heads * head_dim, ...] weight) of the given heads, None for padding rows."""
    return [None if h is None else h * head_dim + d for h in heads for d in range(head_dim)]
