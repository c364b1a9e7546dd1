"""The GPU's packed-weight kernels against their PyTorch references, in Triton's interpreter
without CUDA: the split-K GEMV and the tiled GEMM over u4 and i8 codes (groups of 32 and 16,
float16 and float32 scales, shapes off the blocks), and the FP8 (e4m3, per-row scale) product."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any Triton kernel is defined (see radixrt.kernels)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from radixrt.kernels.packed_reference import packed_linear_ref  # noqa: E402
from radixrt.kernels.packed_triton import (  # noqa: E402
    GEMV_MAX_ROWS,
    fp8_linear,
    fp8_linear_ref,
    packed_gemm,
    packed_gemv,
    packed_linear,
    quantize_fp8,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def random_packed(rows: int, cols: int, kind: str, group: int, dtype: torch.dtype):
    from test_packed_gemm import random_packed as make

    w = make(rows, cols, kind, group, dtype)
    return type(w)(w.codes.to(DEVICE), w.scales.to(DEVICE), w.biases.to(DEVICE), kind, group,
                   cols)


@pytest.mark.parametrize("kind,group,dtype", [("u4", 32, torch.float16), ("i8", 16, torch.float32),
                                              ("i8", 32, torch.float16)])
@pytest.mark.parametrize("rows,cols", [(40, 96), (17, 64)])
def test_gemv_and_gemm_equal_the_reference(kind: str, group: int, dtype: torch.dtype,
                                           rows: int, cols: int) -> None:
    w = random_packed(rows, cols, kind, group, dtype)
    gen = torch.Generator().manual_seed(rows)
    for n, fn in ((1, packed_gemv), (3, packed_gemv), (5, packed_gemm), (GEMV_MAX_ROWS + 1,
                                                                       packed_linear)):
        x = torch.randn(n, cols, generator=gen).to(DEVICE)
        torch.testing.assert_close(fn(x, w), packed_linear_ref(x, w), rtol=1e-4, atol=1e-4)


def test_fp8_equals_its_reference_and_stays_near_the_float_weights() -> None:
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(24, 64, generator=gen) * torch.rand(24, 1, generator=gen)).to(DEVICE)
    codes, scale = quantize_fp8(w)
    x = torch.randn(6, 64, generator=gen).to(DEVICE)
    got = fp8_linear(x, codes, scale)
    torch.testing.assert_close(got, fp8_linear_ref(x, codes, scale), rtol=1e-4, atol=1e-4)
    bound = (x.abs() @ w.abs().T) / 16  # e4m3 rounds each weight within 1/16 of itself
    assert ((got - x @ w.T).abs() <= bound + 1e-6).all()
