"""Packed weights taken apart and joined as a model loads them: rows in any order with zero rows
for padding, column ranges on group boundaries (refused inside a group), parts of one layout
stacked; each equal to the same operation on the dequantized floats."""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels.packed_reference import PackedTensors, dequantize_ref
from radixrt.runtime.models.packed_weight import (
    concat_rows,
    format_name,
    same_layout,
    select_rows,
    slice_cols,
)


def packed(rows: int, cols: int, kind: str = "u4", group: int = 32, seed: int = 0
           ) -> PackedTensors:
    gen = torch.Generator().manual_seed(seed)
    codes = (torch.randint(0, 256, (rows, cols // 2), dtype=torch.uint8, generator=gen)
             if kind == "u4" else
             torch.randint(-128, 128, (rows, cols), dtype=torch.int8, generator=gen))
    scales = torch.rand(rows, cols // group, generator=gen)
    return PackedTensors(codes, scales, torch.randn(rows, cols // group, generator=gen), kind,
                         group, cols)


@pytest.mark.parametrize("kind,group", [("u4", 32), ("i8", 16)])
def test_rows_columns_and_joins_equal_the_dense_operations(kind: str, group: int) -> None:
    p = packed(10, 128, kind, group)
    dense = dequantize_ref(p)
    picked = select_rows(p, [4, None, 0, 9, None])
    want = torch.zeros(5, 128)
    want[[0, 2, 3]] = dense[[4, 0, 9]]
    assert torch.equal(dequantize_ref(picked), want)
    assert select_rows(p, list(range(10))) is p
    cols = slice_cols(p, 32, 96, pad=32)
    assert cols is not None
    assert torch.equal(dequantize_ref(cols),
                       torch.cat([dense[:, 32:96], torch.zeros(10, 32)], dim=1))
    assert slice_cols(p, 16, 96) is None and slice_cols(p, 0, 48) is None  # inside a group
    other = packed(3, 128, kind, group, seed=1)
    joined = concat_rows([p, other])
    assert torch.equal(dequantize_ref(joined), torch.cat([dense, dequantize_ref(other)]))


def test_parts_of_different_layouts_are_not_joined() -> None:
    a, b = packed(2, 64), packed(2, 64, "i8", 32)
    assert not same_layout(a, b)
    with pytest.raises(ValueError, match="different layouts"):
        concat_rows([a, b])
    assert format_name(a) == "u4/g32/f32" and format_name(b) == "i8/g32/f32"
    with pytest.raises(ValueError, match="no row 2"):
        select_rows(a, [2])
