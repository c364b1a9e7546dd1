"""The CPU's packed-weight kernels against their PyTorch references (kernels/packed_reference.py),
over every layout (u4 and i8 codes, groups of 32 and 16, float16 and float32 scales), shapes that
are not multiples of the kernels' tiles, rows of x across the kernel's tile sizes and past its
per-call limit; dequantizing is exact (bit for bit), products equal the reference to float
summation order, and an identity through the product gives the weights bit for bit."""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels.packed_gemm import MAX_GEMM_ROWS, packed_gather, packed_gemm, packed_rows
from radixrt.kernels.packed_reference import PackedTensors, dequantize_ref, packed_linear_ref

LAYOUTS = [("u4", 32, torch.float16), ("u4", 32, torch.float32), ("i8", 32, torch.float16),
           ("i8", 32, torch.float32), ("i8", 16, torch.float32), ("i8", 16, torch.float16)]


def random_packed(rows: int, cols: int, kind: str, group: int, dtype: torch.dtype,
                  seed: int = 0) -> PackedTensors:
    gen = torch.Generator().manual_seed(seed)
    if kind == "u4":
        codes = torch.randint(0, 256, (rows, cols // 2), dtype=torch.uint8, generator=gen)
    else:
        codes = torch.randint(-128, 128, (rows, cols), dtype=torch.int8, generator=gen)
    groups = cols // group
    scales = (torch.rand(rows, groups, generator=gen) * 0.02 + 1e-3).to(dtype)
    biases = (torch.randn(rows, groups, generator=gen) * 0.05).to(dtype)
    return PackedTensors(codes, scales, biases, kind, group, cols)


@pytest.mark.parametrize("kind,group,dtype", LAYOUTS)
@pytest.mark.parametrize("rows,cols", [(37, 576), (16, 32), (200, 1536), (5, 96)])
def test_products_equal_the_reference(kind: str, group: int, dtype: torch.dtype, rows: int,
                                      cols: int) -> None:
    w = random_packed(rows, cols, kind, group, dtype)
    gen = torch.Generator().manual_seed(rows + cols)
    for n in (1, 2, 3, 5, 8, 13, MAX_GEMM_ROWS + 3):
        x = torch.randn(n, cols, generator=gen)
        got = packed_gemm(x, w)
        dense = dequantize_ref(w).double()
        exact = x.double() @ dense.T  # the float32 products' sum, exactly
        scale = x.double().abs() @ dense.abs().T  # what float32 sums round against
        assert ((got.double() - exact).abs() <= 1e-6 * scale + 1e-30).all()
        assert ((got - packed_linear_ref(x, w)).double().abs() <= 2e-6 * scale + 1e-30).all()


@pytest.mark.parametrize("kind,group,dtype", LAYOUTS)
def test_dequantizing_is_exact_and_an_identity_gives_the_weights(kind: str, group: int,
                                                                  dtype: torch.dtype) -> None:
    w = random_packed(48, 512, kind, group, dtype, seed=1)
    dense = dequantize_ref(w)
    assert torch.equal(packed_rows(w, 0, w.rows), dense)
    assert torch.equal(packed_rows(w, 7, 20), dense[7:27])
    index = torch.tensor([3, 0, 47, 3])
    assert torch.equal(packed_gather(w, index), dense[index])
    eye = torch.eye(w.cols)
    for start in (0, 250):  # columns of the weight, bit for bit, through the product
        assert torch.equal(packed_gemm(eye[start : start + 11], w), dense.T[start : start + 11])


def test_results_do_not_depend_on_the_other_rows_of_x() -> None:
    """Each output row is its own row's product, whatever shares the call."""
    w = random_packed(96, 576, "u4", 32, torch.float16)
    x = torch.randn(12, 576)
    alone = torch.cat([packed_gemm(x[i : i + 1], w) for i in range(12)])
    assert torch.equal(packed_gemm(x, w), alone)


def test_bad_arguments_are_refused() -> None:
    w = random_packed(8, 64, "u4", 32, torch.float16)
    with pytest.raises(ValueError, match=r"expected \[n, 64\] float32"):
        packed_gemm(torch.randn(2, 32), w)
    with pytest.raises(ValueError, match="float32"):
        packed_gemm(torch.randn(2, 64, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="outside the weight's 8 rows"):
        packed_gather(w, torch.tensor([8]))
    with pytest.raises(ValueError, match=r"rows \[4, 12\)"):
        packed_rows(w, 4, 8)
    with pytest.raises(ValueError, match="groups of 16"):
        PackedTensors(w.codes, w.scales, w.biases, "u4", 16, 64)
    with pytest.raises(ValueError, match="share one dtype"):
        PackedTensors(w.codes, w.scales, w.biases.float(), "u4", 32, 64)
    with pytest.raises(ValueError, match="multiple of 32"):
        PackedTensors(w.codes[:, :8], w.scales[:, :1], w.biases[:, :1], "u4", 32, 16)
