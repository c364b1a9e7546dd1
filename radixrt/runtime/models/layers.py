"""Building blocks of Llama-family models: RMSNorm, rotary embedding (with llama3 scaling), MLP."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from radixrt.runtime.distributed.group import TPGroup
from radixrt.runtime.models.parallel import ColumnParallelLinear, RowParallelLinear


class RMSNorm(nn.Module):
    """x / rms(x) * weight, with the statistics in float32 (as the reference implementations do)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # x: [..., dim]
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> Tensor:
    """[head_dim // 2] float32 inverse frequencies, with "linear" or "llama3" scaling applied."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)  # [head_dim // 2]
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type == "default":
        return inv_freq
    if rope_type == "freq_factors":  # llama.cpp's rope_freqs: theta_i / factor_i
        return inv_freq / torch.tensor(scaling["factors"], dtype=torch.float32)  # type: ignore[index]
    factor = float(scaling["factor"])  # type: ignore[index]
    if rope_type == "linear":
        return inv_freq / factor
    if rope_type == "llama3":
        return _llama3_scaled(inv_freq, factor, scaling)  # type: ignore[arg-type]
    raise ValueError(f"rope_type {rope_type!r} is not supported")


def _llama3_scaled(inv_freq: Tensor, factor: float, scaling: dict[str, Any]) -> Tensor:
    """Llama 3.1 scaling: long wavelengths slowed by `factor`, short kept, a smooth ramp between."""
    low_freq_factor = float(scaling["low_freq_factor"])
    high_freq_factor = float(scaling["high_freq_factor"])
    original_len = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen = original_len / low_freq_factor  # longer than this: fully scaled
    high_freq_wavelen = original_len / high_freq_factor  # shorter than this: unscaled
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    ramp = (original_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - ramp) * scaled / factor + ramp * scaled
    in_between = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_between, blended, scaled)


class RotaryEmbedding(nn.Module):
    """Rotate-half (NeoX / HF layout) rotary position embedding; cos/sin computed per forward."""

    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any] | None) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta
        self.scaling = scaling
        inv_freq = rope_inv_freq(head_dim, theta, scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def materialize(self, device: torch.device) -> None:
        """Recompute inv_freq (float32) on device, e.g. after building on the meta device."""
        self.inv_freq = rope_inv_freq(self.head_dim, self.theta, self.scaling).to(device)

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """positions [num_tokens] -> cos, sin [num_tokens, 1, head_dim // 2] in dtype."""
        freqs = positions.float().unsqueeze(1) * self.inv_freq.float().unsqueeze(0)
        return freqs.cos().unsqueeze(1).to(dtype), freqs.sin().unsqueeze(1).to(dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [num_tokens, heads, head_dim]; cos, sin [num_tokens, 1, head_dim // 2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up fused into one projection; under tensor
    parallelism a rank holds `rows` of the intermediate dimension (ShardPlan.intermediate)."""

    def __init__(self, hidden_size: int, rows: Sequence[int | None], tp: TPGroup) -> None:
        super().__init__()
        self.intermediate_size = len(rows)  # this rank's
        self.gate_up_proj = ColumnParallelLinear(hidden_size, [rows, rows], bias=False)
        self.down_proj = RowParallelLinear(rows, hidden_size, tp)

    def forward(self, x: Tensor) -> Tensor:
        # x: [num_tokens, hidden]
        gate_up = self.gate_up_proj(x)  # [num_tokens, 2 * intermediate]
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)
