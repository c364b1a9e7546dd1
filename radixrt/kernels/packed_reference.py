"""Packed weights: the layout the CPU kernels (kernels/cpu/packed_gemm.cpp) and the GPU kernels
(kernels/packed_triton.py) multiply with, and their PyTorch references.

A packed weight [N, K] is integer codes in groups along K, each group with a scale and a bias:

    w[n, g * group + i] = scale[n, g] * code[n, g * group + i] + bias[n, g]

the product rounded to float32 before the bias is added (two roundings, never a fused
multiply-add): the arithmetic of gguf's dequantizers, so a GGUF tensor packed without loss
(models/packed_gguf.py) dequantizes to gguf's floats bit for bit.

- codes "u4": [N, K / 2] uint8. A group of 32 is 16 bytes; the low nibble of byte i is element
  i, the high nibble element i + 16 (GGUF's Q4_0 / Q4_1 order). group 32.
- codes "i8": [N, K] int8. group 32 or 16.
- scales, biases: [N, K / group], float16 where every value is exact in float16 (Q4_0, Q4_1,
  Q8_0), else float32.

packed_linear_ref(x, w) = x @ dequantize_ref(w).T: the products a kernel must equal (to float
summation order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

CODE_KINDS = ("u4", "i8")
GROUPS = {"u4": (32,), "i8": (32, 16)}
SCALE_DTYPES = (torch.float16, torch.float32)


@dataclass(frozen=True)
class PackedTensors:
    """One packed weight [rows, cols]: its codes, scales and biases (see the module docstring)."""

    codes: Tensor  # u4: [rows, cols // 2] uint8; i8: [rows, cols] int8
    scales: Tensor  # [rows, cols // group] float16 or float32
    biases: Tensor  # [rows, cols // group], the scales' dtype
    kind: str  # "u4" or "i8"
    group: int
    cols: int

    def __post_init__(self) -> None:
        if self.kind not in CODE_KINDS or self.group not in GROUPS[self.kind]:
            raise ValueError(f"packed codes {self.kind!r} in groups of {self.group}: use "
                             f"{GROUPS}")
        if self.cols % 32:
            raise ValueError(f"a packed weight's columns ({self.cols}) must be a multiple of 32")
        rows = self.codes.shape[0]
        code_cols = self.cols // 2 if self.kind == "u4" else self.cols
        want = {"codes": (rows, code_cols), "scales": (rows, self.cols // self.group),
                "biases": (rows, self.cols // self.group)}
        for name, shape in want.items():
            t = getattr(self, name)
            if tuple(t.shape) != shape or not t.is_contiguous():
                raise ValueError(f"packed {name} of shape {tuple(t.shape)}: expected a "
                                 f"contiguous {shape}")
        code_dtype = torch.uint8 if self.kind == "u4" else torch.int8
        if self.codes.dtype != code_dtype:
            raise ValueError(f"{self.kind} codes must be {code_dtype}, not {self.codes.dtype}")
        if self.scales.dtype not in SCALE_DTYPES or self.biases.dtype != self.scales.dtype:
            raise ValueError("scales and biases must share one dtype, float16 or float32")

    @property
    def rows(self) -> int:
        return int(self.codes.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.biases))


def codes_of(w: PackedTensors) -> Tensor:
    """The codes as int64 [rows, cols], in element order."""
    if w.kind == "i8":
        return w.codes.long()
    nibbles = w.codes.view(w.rows, w.cols // 32, 16)  # [rows, groups, 16]
    low, high = (nibbles & 0x0F).long(), (nibbles >> 4).long()
    return torch.cat([low, high], dim=-1).reshape(w.rows, w.cols)


def dequantize_ref(w: PackedTensors) -> Tensor:
    """[rows, cols] float32: scale * code, rounded, then + bias."""
    codes = codes_of(w).float().view(w.rows, w.cols // w.group, w.group)
    scaled = codes * w.scales.float().unsqueeze(-1)  # rounded to float32 here
    return (scaled + w.biases.float().unsqueeze(-1)).reshape(w.rows, w.cols)


def packed_linear_ref(x: Tensor, w: PackedTensors) -> Tensor:
    """x [n, cols] float32 -> [n, rows]: x @ dequantize_ref(w).T."""
    return x @ dequantize_ref(w).T
