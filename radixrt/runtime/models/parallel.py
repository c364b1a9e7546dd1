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

packed=True: a layer keeps its weight as the checkpoint stores it where that has a packed form
(models/packed_gguf.py; a LinearWeight in `.packed`, no float `.weight`), floats otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from radixrt.kernels.packed_reference import PackedTensors
from radixrt.runtime.config import LINEAR_BLOCK_ROWS
from radixrt.runtime.distributed.group import TPGroup
from radixrt.runtime.forward.lora_batch import LoraBatch
from radixrt.runtime.models.linear import BlockedLinear, LinearWeight, small_batch_linear
from radixrt.runtime.models.lora_layer import LoraSlots
from radixrt.runtime.models.packed_weight import select_rows, slice_cols
from radixrt.runtime.models.shard_plan import Slice
from radixrt.runtime.models.tensor_source import (
    Weight,
    read_all,
    read_packed,
    read_range,
    shape_of,
)


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


def take_rows_packed(full: Weight, index: Sequence[int | None]) -> Tensor | PackedTensors:
    """take(full, index, 0), packed where the checkpoint tensor has a packed form."""
    real = [i for i in index if i is not None]
    if real:
        low = min(real)
        packed = read_packed(full, low, max(real) + 1)
        if packed is not None:
            return select_rows(packed, [None if i is None else i - low for i in index])
    return take(full, index, 0)


def take_cols_packed(full: Weight, index: Sequence[int | None]) -> Tensor | PackedTensors:
    """take(full, index, 1), packed where the columns are one run on group boundaries followed
    by padding (a row-parallel shard)."""
    real = [i for i in index if i is not None]
    run = bool(real) and real == list(range(real[0], real[0] + len(real)))
    if run and index[: len(real)] == real:
        packed = read_packed(full, 0, shape_of(full)[0])
        if packed is not None:
            piece = slice_cols(packed, real[0], real[-1] + 1, len(index) - len(real))
            if piece is not None:
                return piece
    return take(full, index, 1)


class ColumnParallelLinear(BlockedLinear):
    """Output rows `rows[0] + rows[1] + ...` of one or more full weights (a fused projection:
    shard s is the full tensor loaded as `load(s, tensor)`)."""

    def __init__(self, in_features: int, rows: Sequence[Sequence[int | None]], bias: bool,
                 block_rows: int = LINEAR_BLOCK_ROWS, packed: bool = False) -> None:
        self.rows = [list(r) for r in rows]
        self.sizes = [len(r) for r in self.rows]
        super().__init__(in_features, sum(self.sizes), bias=bias, block_rows=block_rows,
                         packed=packed)
        self.lora: LoraSlots | None = None  # LoRA adapters' slots (worker/lora_manager.py)

    def forward(self, x: Tensor, lora: LoraBatch | None = None) -> Tensor:
        # x: [num_tokens, in_features] -> [num_tokens, this rank's rows], plus the rows'
        # adapters' products
        y = super().forward(x)
        return y if self.lora is None or lora is None else self.lora.add(x, y, lora)

    @torch.no_grad()
    def load(self, shard: int, full: Weight, name: str = "weight") -> None:
        start = sum(self.sizes[:shard])
        if name == "weight" and self.packed is not None:
            self.packed.add(start, take_rows_packed(full, self.rows[shard]))
            return
        dest = getattr(self, name).data[start : start + self.sizes[shard]]
        piece = take(full, self.rows[shard], 0)
        _check_shape(dest, piece)
        dest.copy_(piece)


class RowParallelLinear(BlockedLinear):
    """Input columns `cols` of a full weight; the ranks' partial outputs are summed, then the
    bias (replicated; gpt-oss's o_proj) is added once."""

    def __init__(self, cols: Sequence[int | None], out_features: int, tp: TPGroup,
                 block_rows: int = LINEAR_BLOCK_ROWS, bias: bool = False,
                 packed: bool = False) -> None:
        super().__init__(len(cols), out_features, bias=bias, block_rows=block_rows,
                         packed=packed)
        self.cols = list(cols)
        self.tp = tp
        self.lora: LoraSlots | None = None  # LoRA adapters' slots (worker/lora_manager.py)

    def forward(self, x: Tensor, lora: LoraBatch | None = None) -> Tensor:
        # x: [num_tokens, local in_features] -> [num_tokens, out_features], summed over ranks;
        # an adapter's A holds this rank's columns: its partial products are summed with them
        out = self.product(x)
        if self.lora is not None and lora is not None:
            out = self.lora.add(x, out, lora)
        out = self.tp.all_reduce(out)
        return out if self.bias is None else out + self.bias

    @torch.no_grad()
    def load(self, shard: int, full: Weight, name: str = "weight") -> None:
        if name == "bias":
            _check_shape(self.bias.data, read_all(full))
            self.bias.data.copy_(read_all(full))
            return
        if self.packed is not None:
            self.packed.add(0, take_cols_packed(full, self.cols))
            return
        piece = take(full, self.cols, 1)
        _check_shape(self.weight.data, piece)
        self.weight.data.copy_(piece)


class VocabRows(nn.Module):
    """A rank's vocabulary rows of a [vocab, hidden] weight: the LM head when it is untied."""

    def __init__(self, vocab: Slice, hidden_size: int, packed: bool = False) -> None:
        super().__init__()
        self.vocab = vocab
        self.packed: LinearWeight | None = None
        if packed:
            self.register_parameter("weight", None)
            self.packed = LinearWeight(vocab.size, hidden_size)
        else:
            self.weight = nn.Parameter(torch.empty(vocab.size, hidden_size))

    @property
    def matrix(self) -> Tensor | LinearWeight:
        """The rows as the LM head multiplies with them: the float weight or the packed one."""
        return self.weight if self.packed is None else self.packed

    @torch.no_grad()
    def load(self, shard: int, full: Weight, name: str = "weight") -> None:
        if self.packed is not None:
            self.packed.add(0, take_rows_packed(full, self.vocab.indices()))
            return
        piece = take(full, self.vocab.indices(), 0)
        _check_shape(self.weight.data, piece)
        self.weight.data.copy_(piece)


class VocabParallelEmbedding(VocabRows):
    def __init__(self, vocab: Slice, hidden_size: int, tp: TPGroup, packed: bool = False) -> None:
        super().__init__(vocab, hidden_size, packed)
        self.tp = tp

    def _rows(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.weight) if self.packed is None else self.packed.gather(ids)

    def forward(self, ids: Tensor) -> Tensor:
        # ids: [num_tokens] -> [num_tokens, hidden]
        if self.tp.size == 1:
            return self._rows(ids)
        local = ids - self.vocab.start
        mine = (local >= 0) & (local < self.vocab.size)
        h = self._rows(torch.where(mine, local, 0))
        h = h * mine.unsqueeze(1).to(h.dtype)
        return self.tp.all_reduce(h)


def parallel_logits(hidden: Tensor, weight: Tensor | LinearWeight, vocab: Slice, tp: TPGroup,
                    block_rows: int) -> Tensor:
    """hidden [n, hidden] x this rank's vocabulary rows of the LM head (float or packed) ->
    logits [n, vocab] float32 over the whole vocabulary (gathered; padding rows dropped)."""
    if isinstance(weight, LinearWeight):
        local = weight.matmul(hidden.float().contiguous(), block_rows)  # [n, vocab.size]
    else:
        local = small_batch_linear(hidden, weight, None, block_rows)
    if tp.size == 1:
        return local.float()
    return tp.all_gather(local)[:, : vocab.real].float()


def _check_shape(dest: Tensor, piece: Tensor) -> None:
    if tuple(dest.shape) != tuple(piece.shape):
        raise ValueError(f"checkpoint shard of shape {tuple(piece.shape)} does not fit the "
                         f"parameter's {tuple(dest.shape)}")
