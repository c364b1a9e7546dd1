"""Linear layers that stay near the memory bandwidth at the small batches decode runs, over
either weight format: float (the exact reference) or packed (kernels/packed_reference.py).

A decode step multiplies a few rows (one per running request) by every weight matrix, so its
time is the time to read the weights. On the CPU, MKL's sgemm reads them at about the machine's
bandwidth for 1-2 rows but at about half of it for 4-12 rows (measured on the default model's
shapes with the weights out of cache: 30 layers' projections took 17.4 ms for one row, 38.0 ms
for eight; the LM head 4.3 ms and 15.6 ms). Splitting the weight's output rows into blocks
(256 rows for a layer's projections, 1024 for the LM head) brings eight rows to 33.0 ms and
9.4 ms; from 16 rows on the plain product is faster again. Each output element is the same dot
product over the same inputs; the results equal F.linear's to float rounding (MKL picks its
kernel, and with it the summation order, by shape; the tests check the tolerance). The figures
and how they were measured are in docs/design-notes.md ("The CPU step").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from radixrt.kernels.packed_gemm import packed_gather, packed_gemm, packed_rows
from radixrt.kernels.packed_reference import PackedTensors
from radixrt.runtime.config import LINEAR_BLOCK_ROWS
from radixrt.runtime.models.packed_weight import concat_rows, format_name, same_layout

# On the CPU, linear layers over this many rows (inclusive) run block of output rows by block of
# output rows, LINEAR_BLOCK_ROWS rows per block for a layer's projections (LM_HEAD_BLOCK_ROWS for
# the LM head, decoder.py): MKL reads the weights at about half the bandwidth for these batch
# sizes otherwise.
CPU_BLOCKED_LINEAR_ROWS = (3, 12)
# Packed weights multiply up to this many rows of x in the packed kernel (each group of codes
# decoded once for all of them); more rows (prefill) dequantize the weight and take F.linear.
PACKED_GEMM_MAX_ROWS = 16


def small_batch_linear(x: Tensor, weight: Tensor, bias: Tensor | None, block_rows: int) -> Tensor:
    """F.linear(x, weight, bias); on the CPU, for a batch of rows within
    CPU_BLOCKED_LINEAR_ROWS, computed block of output rows by block of output rows.

    x: [rows, in_features]; weight: [out_features, in_features] -> [rows, out_features]."""
    rows = x.shape[0] if x.dim() == 2 else -1
    low, high = CPU_BLOCKED_LINEAR_ROWS
    if x.device.type != "cpu" or not low <= rows <= high or weight.shape[0] <= block_rows:
        return F.linear(x, weight, bias)
    parts = [
        F.linear(x, weight[start : start + block_rows],
                 None if bias is None else bias[start : start + block_rows])
        for start in range(0, weight.shape[0], block_rows)
    ]  # fmt: skip
    return torch.cat(parts, dim=1)  # [rows, out_features]


class BlockedLinear(nn.Linear):
    """nn.Linear (same parameters, same results) through small_batch_linear; packed=True keeps
    the weight in a LinearWeight (`.packed`) instead of the float parameter `.weight` (None)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 block_rows: int = LINEAR_BLOCK_ROWS, packed: bool = False) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.block_rows = block_rows
        self.packed: LinearWeight | None = None
        if packed:
            self.register_parameter("weight", None)
            self.packed = LinearWeight(out_features, in_features)

    def product(self, x: Tensor) -> Tensor:
        """x @ W.T without the bias: [rows, out_features]."""
        if self.packed is not None:
            return self.packed.matmul(x, self.block_rows)
        return small_batch_linear(x, self.weight, None, self.block_rows)

    def forward(self, x: Tensor) -> Tensor:
        if self.packed is not None:
            out = self.packed.matmul(x, self.block_rows)
            return out if self.bias is None else out + self.bias
        return small_batch_linear(x, self.weight, self.bias, self.block_rows)


class LinearWeight:
    """A linear layer's weight [rows, cols] in packed form: row ranges ("parts"), each packed or
    float32 (a tensor whose type has no packed form, read as floats), filled as the checkpoint
    is read (a fused projection's q, k, v arrive one by one) and joined by finish() where
    neighbours share a layout. The default model's projections end as one packed part each."""

    def __init__(self, rows: int, cols: int) -> None:
        self.rows = rows
        self.cols = cols
        self.parts: list[tuple[int, Tensor | PackedTensors]] = []  # (first row, rows)

    def add(self, start: int, data: Tensor | PackedTensors) -> None:
        n, cols = tuple(data.shape)
        if cols != self.cols or not 0 <= start <= start + n <= self.rows:
            raise ValueError(f"a weight part of shape ({n}, {cols}) at row {start} does not fit "
                             f"a weight of shape ({self.rows}, {self.cols})")
        self.parts.append((start, data))

    @property
    def complete(self) -> bool:
        """Every row covered exactly once."""
        covered = 0
        for start, data in sorted(self.parts, key=lambda p: p[0]):
            if start != covered:
                return False
            covered += data.shape[0]
        return covered == self.rows

    def finish(self) -> None:
        """Join neighbouring parts of one layout (float with float, packed of the same
        layout)."""
        if not self.complete:
            raise ValueError(f"weight rows missing or loaded twice ({len(self.parts)} parts "
                             f"for {self.rows} rows)")
        joined: list[tuple[int, Tensor | PackedTensors]] = []
        for start, data in sorted(self.parts, key=lambda p: p[0]):
            if joined and _joinable(joined[-1][1], data):
                prev_start, prev = joined[-1]
                both = (concat_rows([prev, data]) if isinstance(data, PackedTensors)
                        else torch.cat([prev, data]))  # type: ignore[list-item]
                joined[-1] = (prev_start, both)
            else:
                joined.append((start, data))
        self.parts = joined

    @property
    def formats(self) -> list[str]:
        """Each part's format: "float32" or the packed layout (format_name)."""
        return [format_name(d) if isinstance(d, PackedTensors) else str(d.dtype).split(".")[-1]
                for _, d in self.parts]

    @property
    def nbytes(self) -> int:
        return sum(d.nbytes if isinstance(d, PackedTensors) else d.numel() * d.element_size()
                   for _, d in self.parts)

    def matmul(self, x: Tensor, block_rows: int = LINEAR_BLOCK_ROWS) -> Tensor:
        """x [n, cols] -> x @ W.T [n, rows] float32."""
        if len(self.parts) == 1:
            return _part_product(x, self.parts[0][1], block_rows)
        out = torch.empty(x.shape[0], self.rows, dtype=torch.float32, device=x.device)
        for start, data in self.parts:
            out[:, start : start + data.shape[0]] = _part_product(x, data, block_rows)
        return out

    def gather(self, index: Tensor) -> Tensor:
        """Rows `index` [n] as float32 [n, cols] (an embedding lookup)."""
        if len(self.parts) == 1 and isinstance(self.parts[0][1], PackedTensors):
            return packed_gather(self.parts[0][1], index)
        return F.embedding(index, self.dense())

    def dense(self) -> Tensor:
        """The whole weight as float32 [rows, cols]."""
        return torch.cat([_dense(d) for _, d in self.parts])


def _joinable(a: Tensor | PackedTensors, b: Tensor | PackedTensors) -> bool:
    if isinstance(a, PackedTensors) and isinstance(b, PackedTensors):
        return same_layout(a, b)
    return isinstance(a, Tensor) and isinstance(b, Tensor) and a.dtype == b.dtype


def _dense(data: Tensor | PackedTensors) -> Tensor:
    return packed_rows(data, 0, data.rows) if isinstance(data, PackedTensors) else data


def _part_product(x: Tensor, data: Tensor | PackedTensors, block_rows: int) -> Tensor:
    if not isinstance(data, PackedTensors):
        return small_batch_linear(x, data, None, block_rows)
    if x.shape[0] <= PACKED_GEMM_MAX_ROWS:
        return packed_gemm(x, data)
    return F.linear(x, packed_rows(data, 0, data.rows))
