"""KVCache: the per-layer K and V tensors of the slot pool (or MLA's one latent tensor), plus
copy / swap helpers."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor


class KVShape(Protocol):
    """What the KV tensors need of a model's configuration (models.ModelConfig has it)."""

    num_layers: int
    kv_parts: int
    num_kv_heads: int
    head_dim: int


@runtime_checkable
class HasKVLayout(Protocol):
    """A model's configuration (models.ModelConfig): kv_layout is its KVShape."""

    @property
    def kv_layout(self) -> KVShape: ...


class KVCache:
    """K/V of every layer for num_slots slots plus one zeroed padding slot (index num_slots).

    All of it lives in one buffer [parts, num_layers, num_slots + 1, num_kv_heads, head_dim];
    k[layer] and v[layer] are views of it, so whole-pool copies and swaps are single index ops.
    parts is 2 (K and V) or 1: a latent pool (multi-head latent attention), one row per token
    and layer, where v[layer] is k[layer] (a latent layer reads its values as the rows' first
    value_dim dims: LayerAttention.value_dim). Copies, swaps, the host and disk tiers carry
    whichever shape the pool has.
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        parts: int = 2,
    ) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots} must be >= 1")
        if parts not in (1, 2):
            raise ValueError(f"parts={parts}: a pool holds K and V (2) or a latent (1)")
        self.parts = parts
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (parts, num_layers, num_slots + 1, num_kv_heads, head_dim)
        self.buffer = torch.zeros(shape, dtype=dtype, device=self.device)
        self.k: list[Tensor] = [self.buffer[0, i] for i in range(num_layers)]
        self.v: list[Tensor] = (self.k if parts == 1 else
                                [self.buffer[1, i] for i in range(num_layers)])

    @classmethod
    def from_config(
        cls, config: KVShape | HasKVLayout, num_slots: int, dtype: torch.dtype,
        device: torch.device | str,
    ) -> KVCache:
        """A pool of a KV shape (one rank's: ShardPlan.kv_shape), or of a model's whole KV
        (a ModelConfig: its kv_layout)."""
        shape = config.kv_layout if isinstance(config, HasKVLayout) else config
        layers, heads, dim = shape.num_layers, shape.num_kv_heads, shape.head_dim
        return cls(layers, num_slots, heads, dim, dtype, device, shape.kv_parts)

    @property
    def padding_slot(self) -> int:
        return self.num_slots

    def bytes_per_token(self) -> int:
        elem = self.buffer.element_size()
        return self.parts * self.num_layers * self.num_kv_heads * self.head_dim * elem

    def copy_slots(self, src: Tensor, dst: Tensor) -> None:
        """Copy-on-write: slot dst[i] takes the K/V of slot src[i] in every layer."""
        src = src.to(self.device, torch.int64)
        dst = dst.to(self.device, torch.int64)
        self.buffer[:, :, dst] = self.buffer[:, :, src]

    def read_slots(self, slots: Tensor) -> Tensor:
        """Swap out: [parts, num_layers, n, num_kv_heads, head_dim] host copy of the slots'
        K/V."""
        slots = slots.to(self.device, torch.int64)
        return self.buffer[:, :, slots].cpu()

    def write_slots(self, slots: Tensor, data: Tensor) -> None:
        """Swap in: data [parts, num_layers, n, num_kv_heads, head_dim] goes to the given
        slots."""
        slots = slots.to(self.device, torch.int64)
        self.buffer[:, :, slots] = data.to(self.device, self.dtype)
