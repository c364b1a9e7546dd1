"""Linear layers that stay near the memory bandwidth at the small batches decode runs.

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

from radixrt.runtime.config import LINEAR_BLOCK_ROWS

# On the CPU, linear layers over this many rows (inclusive) run block of output rows by block of
# output rows, LINEAR_BLOCK_ROWS rows per block for a layer's projections (LM_HEAD_BLOCK_ROWS for
# the LM head, decoder.py): MKL reads the weights at about half the bandwidth for these batch
# sizes otherwise.
CPU_BLOCKED_LINEAR_ROWS = (3, 12)


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
    """nn.Linear (same parameters, same results) through small_batch_linear."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 block_rows: int = LINEAR_BLOCK_ROWS) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.block_rows = block_rows

    def forward(self, x: Tensor) -> Tensor:
        return small_batch_linear(x, self.weight, self.bias, self.block_rows)
