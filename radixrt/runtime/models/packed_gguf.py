"""GGUF quantization blocks as packed weights (kernels/packed_reference.py's layout), without loss:
each block's codes, and each group's scale and bias computed as gguf's dequantizer computes them
(float32 products of the block's float16 factors), so dequantize_ref gives gguf's floats bit for
bit (tests/runtime/models/test_packed_gguf.py multiplies an identity to prove it).

    Q4_0  u4 codes, group 32: scale d, bias -8 d              (float16: exact)
    Q4_1  u4 codes, group 32: scale d, bias m                 (float16)
    Q8_0  i8 codes, group 32: scale d, bias 0                 (float16)
    Q4_K  u4 codes, group 32: scale d * sc_j, bias -(dmin * m_j) (float32)
    Q5_K  i8 codes 0..31, group 32: as Q4_K                   (float32)
    Q6_K  i8 codes -32..31, group 16: scale d * sc_j, bias 0  (float32)

Any other type has no packed form here: its tensors load dequantized (PACKED_QTYPES).
"""

from __future__ import annotations

import gguf
import numpy as np
import torch
from torch import Tensor

from radixrt.kernels.packed_reference import PackedTensors

_QT = gguf.GGMLQuantizationType
QK_K = 256  # a K-quant super-block's values
PACKED_QTYPES = frozenset({_QT.Q4_0, _QT.Q4_1, _QT.Q8_0, _QT.Q4_K, _QT.Q5_K, _QT.Q6_K})


def _f16(raw: np.ndarray) -> Tensor:
    """[..., 2] uint8 -> [...] float16 (little-endian, as GGUF stores them)."""
    return torch.from_numpy(np.ascontiguousarray(raw).view(np.float16)[..., 0].copy())


def _u4(codes: Tensor) -> Tensor:
    """Codes of groups of 32 ([..., 32] uint8, 0..15) -> the u4 layout ([..., 16]: element i in
    the low nibble of byte i, element i + 16 in its high nibble)."""
    return codes[..., :16] | (codes[..., 16:] << 4)


def pack_gguf_rows(raw: np.ndarray, qtype: int, cols: int) -> PackedTensors | None:
    """raw: [rows, row_bytes] uint8, whole rows of a GGUF tensor of `cols` values per row; its
    packed form, or None for a type PACKED_QTYPES lacks."""
    if qtype not in PACKED_QTYPES:
        return None
    rows = raw.shape[0]
    block, type_size = gguf.GGML_QUANT_SIZES[_QT(qtype)]
    blocks = raw.reshape(rows, cols // block, type_size)  # [rows, blocks, type_size]
    if qtype in (_QT.Q4_0, _QT.Q4_1, _QT.Q8_0):
        return _pack_32(blocks, qtype, rows, cols)
    return _pack_k(blocks, qtype, rows, cols)


def _pack_32(blocks: np.ndarray, qtype: int, rows: int, cols: int) -> PackedTensors:
    """Q4_0 [d, qs 16], Q4_1 [d, m, qs 16], Q8_0 [d, qs 32 int8]: one group per block."""
    d = _f16(blocks[..., 0:2])  # [rows, groups]
    if qtype == _QT.Q8_0:
        codes = torch.from_numpy(blocks[..., 2:].copy().view(np.int8)).reshape(rows, cols)
        return PackedTensors(codes, d, torch.zeros_like(d), "i8", 32, cols)
    qs = torch.from_numpy(blocks[..., -16:].copy()).reshape(rows, cols // 2)  # GGUF's order
    bias = -8.0 * d if qtype == _QT.Q4_0 else _f16(blocks[..., 2:4])  # -8 d: exact in float16
    return PackedTensors(qs, d, bias.to(torch.float16), "u4", 32, cols)


def _k_scale_min(scales: np.ndarray) -> tuple[Tensor, Tensor]:
    """Q4_K / Q5_K's 12 bytes of 6-bit scales and mins -> ([..., 8], [..., 8]) float32."""
    sc, mn = gguf.quants.Q4_K.get_scale_min(scales.reshape(-1, 12))
    shape = (*scales.shape[:-1], 8)
    return (torch.from_numpy(sc.astype(np.float32)).reshape(shape),
            torch.from_numpy(mn.astype(np.float32)).reshape(shape))


def _pack_k(blocks: np.ndarray, qtype: int, rows: int, cols: int) -> PackedTensors:
    n = cols // QK_K  # super-blocks per row
    if qtype == _QT.Q6_K:
        ql = torch.from_numpy(blocks[..., :128].copy()).reshape(rows, n, 2, 64)
        qh = torch.from_numpy(blocks[..., 128:192].copy()).reshape(rows, n, 2, 32)
        sc = torch.from_numpy(blocks[..., 192:208].copy().view(np.int8)).float()  # [rows, n, 16]
        d = _f16(blocks[..., 208:210]).float()  # [rows, n]
        # each half of 128 values: the low nibbles of its 64 bytes, then their high nibbles;
        # bits 4-5 from qh, two bits per value, shifts 0, 2, 4, 6 in turn
        low = torch.stack([ql & 0x0F, ql >> 4], dim=3).reshape(rows, n, 8, 32)
        high = torch.stack([(qh >> s) & 0x03 for s in (0, 2, 4, 6)], dim=3).reshape(rows, n, 8, 32)
        q = (low | (high << 4)).to(torch.int8)
        codes = (q - 32).reshape(rows, cols)
        scale = (d.unsqueeze(-1) * sc).reshape(rows, cols // 16)
        return PackedTensors(codes.contiguous(), scale, torch.zeros_like(scale), "i8", 16, cols)
    d = _f16(blocks[..., 0:2]).float()  # [rows, n]
    dmin = _f16(blocks[..., 2:4]).float()
    sc, mn = _k_scale_min(blocks[..., 4:16])  # [rows, n, 8]
    scale = (d.unsqueeze(-1) * sc).reshape(rows, cols // 32)
    bias = (-(dmin.unsqueeze(-1) * mn)).reshape(rows, cols // 32)
    if qtype == _QT.Q4_K:
        qs = torch.from_numpy(blocks[..., 16:144].copy()).reshape(rows, n, 4, 32)
        low, high = qs & 0x0F, qs >> 4  # chunk c: sub-block 2c in the low nibbles, 2c + 1 high
        groups = torch.stack([low, high], dim=3).reshape(rows, n * 8, 32)
        u4 = _u4(groups).reshape(rows, cols // 2)
        return PackedTensors(u4.contiguous(), scale, bias, "u4", 32, cols)
    qh = torch.from_numpy(blocks[..., 16:48].copy())  # [rows, n, 32]: bit j of sub-block j
    qs = torch.from_numpy(blocks[..., 48:176].copy()).reshape(rows, n, 4, 32)
    low = torch.stack([qs & 0x0F, qs >> 4], dim=3).reshape(rows, n, 8, 32)
    high = torch.stack([(qh >> j) & 1 for j in range(8)], dim=2)  # [rows, n, 8, 32]
    codes = (low | (high << 4)).to(torch.int8).reshape(rows, cols)
    return PackedTensors(codes.contiguous(), scale, bias, "i8", 32, cols)


def packed_nbytes(qtype: int, rows: int, cols: int) -> int | None:
    """Bytes a [rows, cols] GGUF tensor of this type takes packed (codes, scales, biases), or
    None for a type without a packed form: what `radixrt plan` counts for a packed model."""
    if qtype not in PACKED_QTYPES:
        return None
    u4 = qtype in (_QT.Q4_0, _QT.Q4_1, _QT.Q4_K)
    group = 16 if qtype == _QT.Q6_K else 32
    scale = 2 if qtype in (_QT.Q4_0, _QT.Q4_1, _QT.Q8_0) else 4  # float16 or float32
    return rows * (cols // 2 if u4 else cols) + 2 * rows * (cols // group) * scale
