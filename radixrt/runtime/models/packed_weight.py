"""Packed weights in the model: a shard's rows or columns of a packed checkpoint tensor, the parts
of a fused projection joined, and which formats a layer's weight ended up in.

Rows are whole (a row's codes, scales and biases are its own), so any rows can be taken, in any
order, with zero rows for padding. Columns come in groups: a column range is taken packed only
where it starts and ends on group boundaries (tensor parallelism's row-parallel shards of the
usual shapes do); anything else reads as floats (the caller's fallback).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from radixrt.kernels.packed_reference import PackedTensors


def _like(p: PackedTensors, codes: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor,
          cols: int) -> PackedTensors:
    return PackedTensors(codes.contiguous(), scales.contiguous(), biases.contiguous(), p.kind,
                         p.group, cols)


def select_rows(p: PackedTensors, index: Sequence[int | None]) -> PackedTensors:
    """Rows `index` of p in that order; None is a zero row (padding)."""
    real = [i for i in index if i is not None]
    if real and not 0 <= min(real) <= max(real) < p.rows:
        raise ValueError(f"a packed tensor of {p.rows} rows has no row {max(real)}")
    if list(index) == list(range(p.rows)):
        return p
    rows = torch.tensor(real, dtype=torch.int64)
    if len(real) == len(index):  # a permutation or a subset: no padding rows
        def pick(t: torch.Tensor) -> torch.Tensor:
            return t.index_select(0, rows)
    else:
        where = torch.tensor([j for j, i in enumerate(index) if i is not None],
                             dtype=torch.int64)

        def pick(t: torch.Tensor) -> torch.Tensor:
            out = t.new_zeros((len(index), *t.shape[1:]))
            return out.index_copy_(0, where, t.index_select(0, rows)) if real else out

    return _like(p, pick(p.codes), pick(p.scales), pick(p.biases), p.cols)


def slice_cols(p: PackedTensors, start: int, stop: int, pad: int = 0) -> PackedTensors | None:
    """Columns [start, stop) of p and `pad` zero columns after them, packed; None where a
    boundary falls inside a group."""
    g = p.group
    if start % g or stop % g or pad % g or (stop - start + pad) % 32:
        return None
    per_byte = 2 if p.kind == "u4" else 1
    codes = p.codes[:, start // per_byte : stop // per_byte]
    scales = p.scales[:, start // g : stop // g]
    biases = p.biases[:, start // g : stop // g]
    if pad:
        codes = torch.cat([codes, codes.new_zeros(p.rows, pad // per_byte)], dim=1)
        scales = torch.cat([scales, scales.new_zeros(p.rows, pad // g)], dim=1)
        biases = torch.cat([biases, biases.new_zeros(p.rows, pad // g)], dim=1)
    return _like(p, codes, scales, biases, stop - start + pad)


def same_layout(a: PackedTensors, b: PackedTensors) -> bool:
    return (a.kind, a.group, a.cols, a.scales.dtype) == (b.kind, b.group, b.cols, b.scales.dtype)


def concat_rows(parts: Sequence[PackedTensors]) -> PackedTensors:
    """Parts of one layout stacked row-wise (a fused projection's q, k and v)."""
    first = parts[0]
    if not all(same_layout(first, p) for p in parts[1:]):
        raise ValueError("packed parts of different layouts cannot be joined")
    return _like(first, torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts]),
                 torch.cat([p.biases for p in parts]), first.cols)


def format_name(p: PackedTensors) -> str:
    """How a packed tensor stores its values, for start-up lines and /server_info."""
    scale = "f16" if p.scales.dtype == torch.float16 else "f32"
    return f"{p.kind}/g{p.group}/{scale}"
