"""KVCache: the per-layer K and V tensors of the slot pool, plus copy / swap helpers."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor


class KVShape(Protocol):
    """What the KV tensors need of a model's configuration (models.ModelConfig has it)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


class KVCache:
    """K/V of every layer for num_slots slots plus one zeroed padding slot (index num_slots).

    All of it lives in one buffer [2, num_layers, num_slots + 1, num_kv_heads, head_dim];
    k[layer] and v[layer] are views of it, so whole-pool copies and swaps are single index ops.
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots} must be >= 1")
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (2, num_layers, num_slots + 1, num_kv_heads, head_dim)
        self.buffer = torch.zeros(shape, dtype=dtype, device=self.device)
        self.k: list[Tensor] = [self.buffer[0, i] for i in range(num_layers)]
        self.v: list[Tensor] = [self.buffer[1, i] for i in range(num_layers)]

    @classmethod
    def from_config(
        cls, config: KVShape, num_slots: int, dtype: torch.dtype, device: torch.device | str
    ) -> KVCache:
        layers, heads, dim = config.num_layers, config.num_kv_heads, config.head_dim
        return cls(layers, num_slots, heads, dim, dtype, device)

    @property
    def padding_slot(self) -> int:
        return self.num_slots

    def bytes_per_token(self) -> int:
        elem = self.buffer.element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem

    def copy_slots(self, src: Tensor, dst: Tensor) -> None:
        """Copy-on-write: slot dst[i] takes the K/V of slot src[i] in every layer."""
        src = src.to(self.device, torch.int64)
        dst = dst.to(self.device, torch.int64)
        self.buffer[:, :, dst] = self.buffer[:, :, src]

    def read_slots(self, slots: Tensor) -> Tensor:
        """Swap out: [2, num_layers, n, num_kv_heads, head_dim] host copy of the slots' K/V."""
        slots = slots.to(self.device, torch.int64)
        return self.buffer[:, :, slots].cpu()

    def write_slots(self, slots: Tensor, data: Tensor) -> None:
        """Swap in: data [2, num_layers, n, num_kv_heads, head_dim] goes to the given slots."""
        slots = slots.to(self.device, torch.int64)
        self.buffer[:, :, slots] = data.to(self.device, self.dtype)
