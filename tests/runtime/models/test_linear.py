"""small_batch_linear: the CPU's weight-major product for small batches gives F.linear's results
(to float rounding: MKL picks its kernel, and so its summation order, by shape), at every batch
size (padded row counts, the largest weight-major one and the first plain one included), with
and without a bias, on the default model's shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixrt.runtime.models.linear import (
    PADDED_ROWS,
    WEIGHT_MAJOR_MAX_ROWS,
    SmallBatchLinear,
    small_batch_linear,
)

ROWS = sorted({1, 2, 3, 5, 8, 9, 12, 15, 16, 17, 64, WEIGHT_MAJOR_MAX_ROWS,
               WEIGHT_MAJOR_MAX_ROWS + 1, *PADDED_ROWS})


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("shape", [(960, 576), (1000, 64), (4096, 576)])
@pytest.mark.parametrize("bias", [False, True])
def test_weight_major_product_is_f_linear(rows: int, shape: tuple[int, int], bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(*shape, generator=gen)
    b = torch.randn(shape[0], generator=gen) if bias else None
    x = torch.randn(rows, shape[1], generator=gen)
    got = small_batch_linear(x, weight, b)
    torch.testing.assert_close(got, F.linear(x, weight, b), rtol=1e-5, atol=1e-4)
    assert got.shape == (rows, shape[0]) and got.is_contiguous()


def test_rows_of_a_padded_batch_do_not_change_each_other() -> None:
    """A padded batch's zero rows are dropped: each row's output is its own product (a row of
    9 equals the same row alone, to rounding), whatever else is in the batch."""
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(300, 40, generator=gen)
    x = torch.randn(9, 40, generator=gen)
    nine = small_batch_linear(x, weight, None)
    for i in (0, 8):
        torch.testing.assert_close(nine[i : i + 1], small_batch_linear(x[i : i + 1], weight, None),
                                   rtol=1e-5, atol=1e-4)


def test_small_batch_linear_is_an_nn_linear() -> None:
    layer = SmallBatchLinear(16, 600, bias=True)
    assert isinstance(layer, torch.nn.Linear) and set(layer.state_dict()) == {"weight", "bias"}
    for rows in (1, 9, WEIGHT_MAJOR_MAX_ROWS, WEIGHT_MAJOR_MAX_ROWS + 1):
        x = torch.randn(rows, 16)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    x3 = torch.randn(2, 3, 16)  # not 2-D: the plain product
    torch.testing.assert_close(layer(x3), F.linear(x3, layer.weight, layer.bias))
