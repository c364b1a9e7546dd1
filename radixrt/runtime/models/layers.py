"""Building blocks shared by the decoder families: RMSNorm (plain or Gemma's 1 + w) and the
gated MLP (SiLU, or GELU for Gemma's GeGLU). Rotary embeddings are in models/rope.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from radixrt.kernels.cpu_norm import act_mul_cpu, rms_norm_cpu
from radixrt.runtime.distributed.group import TPGroup
from radixrt.runtime.forward.lora_batch import LoraBatch
from radixrt.runtime.models.parallel import ColumnParallelLinear, RowParallelLinear


def _gelu_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


# config.json hidden_act / hidden_activation -> the gate's activation
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_tanh": _gelu_tanh,
    "gelu_new": _gelu_tanh,
    "gelu": F.gelu,
}
# the activations the CPU kernels compute (kernels/cpu_norm.py ACT_KINDS), by config name
ACTIVATION_KINDS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
                    "gelu_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}


class RMSNorm(nn.Module):
    """x / rms(x) * (offset + weight), with the statistics in float32 (as the reference
    implementations do). offset 0 is Llama's; 1 is Gemma's, whose checkpoints store w - 1.
    Llama casts the normalized x back to its dtype, then multiplies by the weight; Gemma, OLMo-2
    and gpt-oss multiply first and cast once (weight_first): the same in float32, not in bf16."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0,
                 weight_first: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.offset = offset
        self.weight_first = weight_first or bool(offset)
        self.native = False  # float32 rows on the CPU through kernels/cpu/rmsnorm.cpp

    def forward(self, x: Tensor) -> Tensor:
        # x: [..., dim]
        if self.native and x.dtype == torch.float32 and x.device.type == "cpu":
            out = rms_norm_cpu(x, self.weight, self.eps, self.offset)
            if out is not None:
                return out
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight_first:
            return (x32 * (self.offset + self.weight.float())).to(dtype)
        return self.weight * x32.to(dtype)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up fused into one projection; under tensor
    parallelism a rank holds `rows` of the intermediate dimension (ShardPlan.intermediate)."""

    def __init__(self, hidden_size: int, rows: Sequence[int | None], tp: TPGroup,
                 activation: str = "silu", bias: bool = False, packed: bool = False) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"hidden activation {activation!r} is not supported; use one of "
                             f"{tuple(ACTIVATIONS)}")
        self.act = ACTIVATIONS[activation]
        self.act_kind = ACTIVATION_KINDS.get(activation)  # the CPU kernel's name for it
        self.native = False  # act(gate) * up through kernels/cpu/layers.h
        self.intermediate_size = len(rows)  # this rank's
        self.gate_up_proj = ColumnParallelLinear(hidden_size, [rows, rows], bias=bias,
                                                 packed=packed)
        self.down_proj = RowParallelLinear(rows, hidden_size, tp, bias=bias, packed=packed)

    def forward(self, x: Tensor, lora: LoraBatch | None = None) -> Tensor:
        # x: [num_tokens, hidden]; lora: the rows' adapters (None: the base weights alone)
        gate_up = self.gate_up_proj(x, lora)  # [num_tokens, 2 * intermediate]
        if self.native and self.act_kind is not None and gate_up.dtype == torch.float32:
            both = act_mul_cpu(gate_up, self.act_kind)
            if both is not None:
                return self.down_proj(both, lora)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return self.down_proj(self.act(gate) * up, lora)


def soft_cap(x: Tensor, cap: float) -> Tensor:
    """cap * tanh(x / cap) (Gemma 2's logit soft-capping); x unchanged when cap is 0."""
    return x if not cap else torch.tanh(x / cap) * cap
