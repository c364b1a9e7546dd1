"""AttentionBackend: the interface the model's attention layers call."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from torch import Tensor

if TYPE_CHECKING:
    from radixrt.runtime.forward.forward_batch import ForwardBatch
    from radixrt.runtime.forward.kv_cache import KVCache


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
        v: Tensor,
        layer_id: int,
        kv_cache: KVCache,
        batch: ForwardBatch,
    ) -> Tensor:
        """Store k, v at batch.out_slots in layer layer_id, then attend.

        q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim]
        returns [num_tokens, num_heads, head_dim]: each new token attends to its request's prefix
        and causally to the request's new tokens.
        """
        ...
