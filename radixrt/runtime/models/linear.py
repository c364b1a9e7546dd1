"""Linear layers that stay near the memory bandwidth at the small batches decode runs.

A decode step multiplies a few rows (one per running request, or one per drafted token) by every
weight matrix, so its time is the time to read the weights. On the CPU, MKL's sgemm as F.linear
calls it (x @ weight.T) reads them at well under the bandwidth from 2 rows on; the same product
asked the other way round, weight @ x.T (the weight as the left operand, its rows contiguous),
keeps near it. Measured on the default model's 120 projection matrices with the weights out of
cache (docs/design-notes.md, "The CPU step"; median of 7, ms, F.linear -> weight-major):
1 row 27.1 -> 22.2 (as 2 rows), 2 rows 46.3 -> 20.5, 4 rows 50.7 -> 20.4, 8 rows 56.2 -> 34.8,
9 rows 61.9 -> 43.2 (as 16), 16 rows 66.7 -> 40.3, 64 rows 114.3 -> 93.8; the LM head at 8 rows
18.5 -> 8.5. MKL's cost moves in steps of the row count (1-4, 5-8, 9-16 cost about the same as 4, 8
and 16 rows), and one row and 9-15 rows cost more than the step above them, so those are padded
with zero rows (PADDED_ROWS). From a few hundred rows on (prefill chunks) the transposed result's
copy costs more than the product saves, and F.linear runs unchanged.

Each output element is the same dot product over the same inputs; the results equal F.linear's
to float rounding (MKL picks its kernel, and with it the summation order, by shape; the tests
check the tolerance).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# On the CPU, products over at most this many rows run weight-major (weight @ x.T): measured
# faster at every row count up to 128 (191.6 against 234.7 ms at 128 rows, the copy included),
# slower from 512 on (698.5 against 628.5).
WEIGHT_MAJOR_MAX_ROWS = 128
# Row counts that run as a larger one (zero rows appended, their outputs dropped): MKL's
# weight-major product over them costs more than over the larger count (1 row 27.5 ms against
# 22.2 as 2; 9-15 rows 43-89 ms against 40-42 as 16).
PADDED_ROWS = {1: 2, **{rows: 16 for rows in range(9, 16)}}


def small_batch_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """F.linear(x, weight, bias); on the CPU, for at most WEIGHT_MAJOR_MAX_ROWS rows, computed
    weight-major as weight @ x.T.

    x: [rows, in_features]; weight: [out_features, in_features] -> [rows, out_features]."""
    rows = x.shape[0] if x.dim() == 2 else -1
    if x.device.type != "cpu" or not 1 <= rows <= WEIGHT_MAJOR_MAX_ROWS:
        return F.linear(x, weight, bias)
    padded = PADDED_ROWS.get(rows, rows)
    if padded != rows:
        x = torch.cat([x, x.new_zeros(padded - rows, x.shape[1])])
    out = torch.mm(weight, x.t()).t()[:rows].contiguous()  # [rows, out_features]
    if bias is not None:
        out += bias
    return out


class SmallBatchLinear(nn.Linear):
    """nn.Linear (same parameters, same results) through small_batch_linear."""

    def forward(self, x: Tensor) -> Tensor:
        return small_batch_linear(x, self.weight, self.bias)
