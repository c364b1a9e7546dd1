"""The per-token layer work on the CPU (kernels/cpu/layers.h) for float32 rows: RMSNorm (its
reference: models/layers.py RMSNorm's forward), the gated MLP's act(gate) * up (its reference:
GatedMLP's forward between its projections), and a row of logits' first maximum and
log-sum-exp (references: torch.argmax, torch.logsumexp: the sampler's greedy rows)."""

from __future__ import annotations

import torch
from torch import Tensor

from radixrt.kernels.native import native_library


def rms_norm_cpu(x: Tensor, weight: Tensor, eps: float, offset: float) -> Tensor | None:
    """x [..., dim] float32 normalised and scaled by (offset + weight) [dim]; None where the
    layout is not the kernel's (the caller computes it in PyTorch)."""
    dim = x.shape[-1]
    if x.stride(-1) != 1 or weight.dtype != torch.float32 or not weight.is_contiguous():
        return None
    rows = x.reshape(-1, dim) if x.dim() != 2 else x
    if rows.dim() != 2 or (rows.shape[0] > 1 and rows.stride(0) < dim):
        return None
    out = torch.empty(rows.shape, dtype=torch.float32)
    native_library().rx_rmsnorm(rows.data_ptr(), rows.stride(0), weight.data_ptr(),
                                out.data_ptr(), rows.shape[0], dim, eps, offset)
    return out.view(x.shape)


ACT_KINDS = {"silu": 0, "gelu_tanh": 1}  # kernels/cpu/layers.h ACT_*


def act_mul_cpu(gate_up: Tensor, act: str) -> Tensor | None:
    """gate_up [n, 2 * inter] float32 -> act(gate) * up [n, inter]; None where the layout or
    the activation is not the kernel's."""
    if act not in ACT_KINDS or gate_up.dim() != 2 or gate_up.stride(1) != 1:
        return None
    n, width = gate_up.shape
    inter = width // 2
    out = torch.empty(n, inter, dtype=torch.float32)
    native_library().rx_act_mul(ACT_KINDS[act], gate_up.data_ptr(), gate_up.stride(0), inter,
                                out.data_ptr(), n)
    return out


def argmax_lse_cpu(x: Tensor) -> tuple[Tensor, Tensor] | None:
    """x [rows, cols] float32 -> (index of each row's first maximum [rows] int64, its
    log-sum-exp [rows] float32); None where x is not a contiguous float32 CPU matrix."""
    if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous():
        return None
    index = torch.empty(x.shape[0], dtype=torch.int64)
    lse = torch.empty(x.shape[0], dtype=torch.float32)
    native_library().rx_argmax_lse(x.data_ptr(), x.shape[0], x.shape[1], index.data_ptr(),
                                   lse.data_ptr())
    return index, lse
