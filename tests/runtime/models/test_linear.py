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


# --- LinearWeight: a weight in packed parts ----------------------------------------------------
def _packed_rows(rows: int, cols: int, seed: int):
    from radixrt.kernels.packed_reference import PackedTensors

    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (rows, cols // 2), dtype=torch.uint8, generator=gen)
    scales = torch.rand(rows, cols // 32, generator=gen).half()
    return PackedTensors(codes, scales, (scales * 0.3).contiguous(), "u4", 32, cols)


@pytest.mark.parametrize("rows", [1, 4, 16, 17, 40])
def test_a_weight_in_parts_multiplies_as_its_dense_rows(rows: int) -> None:
    """A fused projection whose q and v are packed and k is float (a type without a packed
    form): joined where the layouts agree, its product the dense weight's at every batch
    size (the packed kernel up to 16 rows, dequantized + F.linear past them)."""
    from radixrt.kernels.packed_reference import dequantize_ref
    from radixrt.runtime.models.linear import LinearWeight

    q, v, v2 = _packed_rows(64, 96, 0), _packed_rows(16, 96, 1), _packed_rows(16, 96, 2)
    k = torch.randn(16, 96)
    weight = LinearWeight(112, 96)
    for start, data in ((96, v2), (0, q), (64, k), (80, v)):  # any order
        weight.add(start, data)
    assert not LinearWeight(112, 96).complete and weight.complete
    weight.finish()
    assert weight.formats == ["u4/g32/f16", "float32", "u4/g32/f16"]  # v, v2 joined
    dense = torch.cat([dequantize_ref(q), k, dequantize_ref(v), dequantize_ref(v2)])
    assert torch.equal(weight.dense(), dense)
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
    torch.testing.assert_close(weight.matmul(x), x @ dense.T, rtol=1e-5, atol=1e-4)
    index = torch.tensor([0, 111, 70])
    assert torch.equal(weight.gather(index), dense[index])


def test_a_part_that_does_not_fit_or_a_gap_is_refused() -> None:
    from radixrt.runtime.models.linear import LinearWeight

    weight = LinearWeight(32, 64)
    with pytest.raises(ValueError, match="does not fit"):
        weight.add(20, _packed_rows(16, 64, 0))
    weight.add(0, _packed_rows(16, 64, 0))
    with pytest.raises(ValueError, match="missing or loaded twice"):
        weight.finish()
