"""small_batch_linear: the CPU's blocked product for small batches gives F.linear's results (to
float rounding: MKL picks its kernel, and so its summation order, by shape), at every batch
size, with and without a bias, on the default model's shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixrt.runtime.config import LINEAR_BLOCK_ROWS
from radixrt.runtime.models.decoder import LM_HEAD_BLOCK_ROWS
from radixrt.runtime.models.linear import CPU_BLOCKED_LINEAR_ROWS, BlockedLinear, small_batch_linear


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 12, 13, 64])
@pytest.mark.parametrize("shape,block", [((960, 576), LINEAR_BLOCK_ROWS),
                                         ((1000, 64), 256),  # a last block of 232 rows
                                         ((4096, 576), LM_HEAD_BLOCK_ROWS)])
@pytest.mark.parametrize("bias", [False, True])
def test_blocked_product_is_f_linear(rows: int, shape: tuple[int, int], block: int,
                                             bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(*shape, generator=gen)
    b = torch.randn(shape[0], generator=gen) if bias else None
    x = torch.randn(rows, shape[1], generator=gen)
    got = small_batch_linear(x, weight, b, block)
    torch.testing.assert_close(got, F.linear(x, weight, b), rtol=1e-5, atol=1e-4)
    assert got.shape == (rows, shape[0])


def test_blocked_linear_is_an_nn_linear() -> None:
    layer = BlockedLinear(16, 600, bias=True)
    assert isinstance(layer, torch.nn.Linear) and set(layer.state_dict()) == {"weight", "bias"}
    low, high = CPU_BLOCKED_LINEAR_ROWS
    for rows in (low - 1, low, high, high + 1):
        x = torch.randn(rows, 16)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
