"""AttentionBackend: the interface the model's attention layers call, and LayerAttention: what
one layer asks of it (scale, sliding window, logit soft-capping, attention sinks)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from torch import Tensor

if TYPE_CHECKING:
    from radixrt.runtime.forward.forward_batch import ForwardBatch
    from radixrt.runtime.forward.kv_cache import KVCache


@dataclass(frozen=True)
class LayerAttention:
    """One attention layer's fixed settings.

    layer_id: its index into the KV cache.
    scale: the softmax scale (None: head_dim ** -0.5).
    sliding_window: None = full attention; W = a query at position p sees the keys at positions
        j with p - W < j <= p (W keys, itself included; transformers' convention). A request's
        KV position j is the j-th entry of its slot list.
    logit_cap: 0 = off; c > 0 = each score s (after scaling) becomes c * tanh(s / c) (Gemma 2).
    sinks: None = off; a [num_heads] float tensor (this rank's query heads, any float dtype, on
        the device of q) = a learned logit s_h per query head that joins every softmax's
        denominator and contributes no value (gpt-oss): p_j = exp(x_j) / (exp(s_h) +
        sum_i exp(x_i)) over the visible keys' scores x (after scaling, window and cap; the sink
        itself is neither scaled nor capped). The model passes its parameter, so the tensor is
        read at every call (no copy here). It takes no part in == and hash (a tensor has no
        boolean equality): two settings that differ only in their sinks compare equal, and
        the repr leaves it out.
    value_dim: None = K and V are stored apart (num_kv_heads x head_dim each); an int = a
        latent layer (multi-head latent attention, models/mla.py): the cache holds one row per
        token, the key k (one KV head), v is None and never stored, and a key's value is its
        first value_dim dims; the output is [num_tokens, num_heads, value_dim].
    """

    layer_id: int
    scale: float | None = None
    sliding_window: int | None = None
    logit_cap: float = 0.0
    sinks: Tensor | None = field(default=None, compare=False, repr=False)
    value_dim: int | None = None

    def __post_init__(self) -> None:
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window={self.sliding_window} must be >= 1 or None")
        if self.logit_cap < 0:
            raise ValueError(f"logit_cap={self.logit_cap} must be >= 0")
        if self.value_dim is not None and self.value_dim < 1:
            raise ValueError(f"value_dim={self.value_dim} must be >= 1 or None")
        if self.sinks is not None and self.sinks.dim() != 1:
            raise ValueError(f"sinks of shape {tuple(self.sinks.shape)}: expected [num_heads]")

    def softmax_scale(self, head_dim: int) -> float:
        return self.scale if self.scale is not None else head_dim**-0.5


@runtime_checkable
class AttentionBackend(Protocol):
    """Stores new K/V into the paged cache and attends over each request's prefix + new tokens."""

    def init_forward(self, batch: ForwardBatch) -> None:
        """Prepare per-step metadata; called once per forward pass, before the first layer."""
        ...

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor | None,
        layer: LayerAttention,
        kv_cache: KVCache,
        batch: ForwardBatch,
    ) -> Tensor:
        """Store k, v at batch.out_slots in layer layer.layer_id, then attend.

        q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim]
        returns [num_tokens, num_heads, head_dim]: each new token attends to its request's prefix
        and causally to the request's new tokens, within layer.sliding_window when it has one.
        A latent layer (layer.value_dim): v is None, k [num_tokens, 1, head_dim] is the row
        stored, the output [num_tokens, num_heads, value_dim].
        """
        ...
