"""Dequantization of GGUF tensor data into float32 torch tensors: F32, F16, BF16, Q4_0, Q4_1,
Q8_0 and MXFP4 (gpt-oss's experts) by vectorized torch ops, every other type through the gguf
package's gguf.quants.dequantize (refused clearly where the installed package cannot)."""

from __future__ import annotations

import gguf
import numpy as np
import torch
from torch import Tensor

_QT = gguf.GGMLQuantizationType
_MXFP4 = getattr(_QT, "MXFP4", None)  # gguf >= 0.17
# MXFP4 (OCP microscaling): blocks of 32 e2m1 values sharing an e8m0 scale; ggml stores the 16
# e2m1 magnitudes doubled (kvalues_mxfp4) and halves the scale to match
MXFP4_VALUES = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
                            dtype=torch.float32)
MXFP4_BLOCK_BYTES = 17  # one e8m0 exponent byte, then 16 bytes of nibbles


def dequantize(raw: np.ndarray, qtype: int, shape: tuple[int, ...]) -> Tensor:
    """Raw uint8 bytes of one tensor -> float32 tensor of the given (torch-order) shape."""
    data = torch.from_numpy(raw)  # [nbytes] uint8
    if qtype == _QT.F32:
        return data.view(torch.float32).reshape(shape).clone()
    if qtype == _QT.F16:
        return data.view(torch.float16).float().reshape(shape)
    if qtype == _QT.BF16:
        return data.view(torch.bfloat16).float().reshape(shape)
    if qtype in (_QT.Q4_0, _QT.Q4_1, _QT.Q8_0):
        block, type_size = gguf.GGML_QUANT_SIZES[_QT(qtype)]
        blocks = data.view(-1, type_size)  # [num_blocks, type_size]
        d = blocks[:, :2].contiguous().view(torch.float16).float()  # [num_blocks, 1]
        out = torch.empty(blocks.shape[0], block, dtype=torch.float32)  # [num_blocks, 32]
        if qtype == _QT.Q8_0:
            out.copy_(blocks[:, 2:].contiguous().view(torch.int8))
            return out.mul_(d).reshape(shape)
        packed = blocks[:, type_size - block // 2 :]  # [num_blocks, 16]: low nibbles, then high
        half = block // 2
        out[:, :half] = packed & 0x0F
        out[:, half:] = packed >> 4
        if qtype == _QT.Q4_0:
            return out.sub_(8.0).mul_(d).reshape(shape)
        m = blocks[:, 2:4].contiguous().view(torch.float16).float()  # [num_blocks, 1]
        return out.mul_(d).add_(m).reshape(shape)
    if _MXFP4 is not None and qtype == _MXFP4:
        return dequantize_mxfp4(data).reshape(shape)
    return _dequantize_with_gguf(raw, qtype, shape)


def dequantize_mxfp4(data: Tensor) -> Tensor:
    """ggml's block_mxfp4, [num_blocks * 17] uint8 -> [num_blocks, 32] float32: byte 0 the
    exponent e (scale 2^(e - 128), ggml_e8m0_to_fp32_half; e < 2 are subnormal floats), then 16
    bytes whose low nibbles are values 0..15 and high nibbles values 16..31 (indices into the
    doubled e2m1 table)."""
    blocks = data.view(-1, MXFP4_BLOCK_BYTES)
    e = blocks[:, :1].to(torch.int32)  # [num_blocks, 1]
    bits = torch.where(e < 2, torch.tensor(0x00200000, dtype=torch.int32) << e, (e - 1) << 23)
    scale = bits.view(torch.float32)
    nibbles = blocks[:, 1:]
    index = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=1).long()  # [num_blocks, 32]
    return MXFP4_VALUES[index] * scale


def _dequantize_with_gguf(raw: np.ndarray, qtype: int, shape: tuple[int, ...]) -> Tensor:
    try:
        out = gguf.quants.dequantize(np.asarray(raw), _QT(qtype))
    except NotImplementedError as error:
        raise ValueError(f"GGUF tensors of type {_QT(qtype).name} cannot be dequantized by the "
                         f"installed gguf package ({error}): not supported") from None
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(shape)
