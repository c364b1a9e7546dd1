"""Tensor-parallel layers. Each holds its rank's piece of a full weight and knows which rows or
columns of the full weight those are (a ShardPlan's lists; None marks a zero padding row), so
loading is one `load(shard, full_tensor)` per checkpoint tensor.

- ColumnParallelLinear: a slice of the output rows (QKV, gate/up); no communication.
- RowParallelLinear: a slice of the input columns (o, down); the partial products are summed
  over the ranks (all-reduce).
- VocabParallelEmbedding: a slice of the vocabulary rows; a rank looks up the ids it holds,
  zeros for the rest, and the ranks' rows are summed.
- parallel_logits: each rank's vocabulary slice of the logits, gathered, padding dropped.

At tp_size 1 the lists cover the whole weight in order: the layers hold the full weights and
call the same kernels (small_batch_linear, F.embedding) the single-device model always did.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from radixrt.runtime.config import LINEAR_BLOCK_ROWS
from radixrt.runtime.distributed.group import TPGroup
from radixrt.runtime.models.linear import BlockedLinear, small_batch_linear
from radixrt.runtime.models.shard_plan import Slice
from radixrt.runtime.models.tensor_source import Weight, read_all, read_range, shape_of


def take(full: Weight, index: Sequence[int | None], dim: int) -> Tensor:
    """full's entries at `index` along dim, zeros where the index is None (padding). A shard's
    real entries are one ascending run (padding comes after them), so only that range of a
    TensorSource is read."""
    shape = list(shape_of(full))
    real = [i for i in index if i is not None]
    if real and not 0 <= min(real) <= max(real) < shape[dim]:
        raise ValueError(f"checkpoint tensor of shape {tuple(shape)} has no index "
                         f"{min(real) if min(real) < 0 else max(real)} along dimension {dim}")
    shape[dim] = len(index)
    if not real:
        return torch.zeros(shape)
    run = real == list(range(real[0], real[0] + len(real)))
    if run:
        piece = read_range(full, dim, real[0], real[0] + len(real))
    else:
        piece = read_all(full).index_select(dim, torch.tensor(real, dtype=torch.int64))
    if list(index) == real:
        return piece
    out = piece.new_zeros(shape)
    where = torch.tensor([j for j, i in enumerate(index) if i is not None], dtype=torch.int64)
    return out.index_copy_(dim, where, piece)


class ColumnParallelLinear(BlockedLinear):
    """Output rows `rows[0] + rows[1] + ...` of one or more full weights (a fused projection:
    shard s is the full tensor loaded as `load(s, tensor)`)."""

    def __init__(self, in_features: int, rows: Sequence[Sequence[int | None]], bias: bool,
                 block_rows: int = LINEAR_BLOCK_ROWS) -> None:
        self.rows = [list(r) for r in rows]
        self.sizes = [len(r) for r in self.rows]
        super().__init__(in_features, sum(self.sizes), bias=bias, block_rows=block_rows)

    @torch.no_grad()
    def load(self, shard: int, full: Weight, name: str = "weight") -> None:
        start = sum(self.sizes[:shard])
        dest = getattr(self, name).data[start : start + self.sizes[shard]]
        piece = take(full, self.rows[shard], 0)
        _check_shape(dest, piece)
        dest.copy_(piece)


class RowParallelLinear(BlockedLinear):
    """Input columns `cols` of a full weight; the ranks' partial outputs are summed, then the
    bias (replicated; gpt-oss's o_proj) is added once."""

    def __init__(self, cols: Sequence[int | None], out_features: int, tp: TPGroup,
                 block_rows: int = LINEAR_BLOCK_ROWS, bias: bool = False) -> None:
        super().__init__(len(cols), out_features, bias=bias, block_rows=block_rows)
        self.cols = list(cols)
        self.tp = tp

    def forward(self, x: Tensor) -> Tensor:
        # x: [num_tokens, local in_features] -> [num_tokens, out_features], summed over ranks
        out = self.tp.all_reduce(small_batch_linear(x, self.weight, None, self.block_rows))
        return out if self.bias is None else out + self.bias

    @torch.no_grad()
    def load(self, shard: int, full: Weight, name: str = "weight") -> None:
        if name == "bias":
            _check_shape(self.bias.data, read_all(full))
            self.bias.data.copy_(read_all(full))
            return
        piece = take(full, self.cols, 1)
        _check_shape(self.weight.data, piece)
        self.weight.data.copy_(piece)


class VocabRows(nn.Module):
    """A rank's vocabulary rows of a [vocab, hidden] weight: the LM head when it is untied."""

    def __init__(self, vocab: Slice, hidden_size: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.weight = nn.Parameter(torch.empty(vocab.size, hidden_size))

    @torch.no_grad()
    def load(self, shard: int, full: Weight, name: str = "weight") -> None:
        piece = take(full, self.vocab.indices(), 0)
        _check_shape(self.weight.data, piece)
        self.weight.data.copy_(piece)


class VocabParallelEmbedding(VocabRows):
    def __init__(self, vocab: Slice, hidden_size: int, tp: TPGroup) -> None:
        super().__init__(vocab, hidden_size)
        self.tp = tp

    def forward(self, ids: Tensor) -> Tensor:
        # ids: [num_tokens] -> [num_tokens, hidden]
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.vocab.start
        mine = (local >= 0) & (local < self.vocab.size)
        h = F.embedding(torch.where(mine, local, 0), self.weight)
        h = h * mine.unsqueeze(1).to(h.dtype)
        return self.tp.all_reduce(h)


def parallel_logits(hidden: Tensor, weight: Tensor, vocab: Slice, tp: TPGroup,
                    block_rows: int) -> Tensor:
    """hidden [n, hidden] x this rank's vocabulary rows of the LM head -> logits [n, vocab]
    float32 over the whole vocabulary (gathered; padding rows dropped)."""
    local = small_batch_linear(hidden, weight, None, block_rows)  # [n, vocab.size]
    if tp.size == 1:
        return local.float()
    return tp.all_gather(local)[:, : vocab.real].float()


def _check_shape(dest: Tensor, piece: Tensor) -> None:
    if tuple(dest.shape) != tuple(piece.shape):
        raise ValueError(f"checkpoint shard of shape {tuple(piece.shape)} does not fit the "
                         f"parameter's {tuple(dest.shape)}")
