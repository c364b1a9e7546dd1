"""A linear layer's LoRA slots: the A and B matrices of the adapters a batch may use, stacked
([slots, rank, in] and [slots, out, rank], zero-padded to the slot's rank; the adapter's scale
folded into B), and the product that adds them to the base product row by row:

    y[rows of segment g] += (x[rows] @ a[slot_g].T) @ b[slot_g].T

On CUDA the Triton kernels (kernels/lora_triton.py: shrink, then expand over the batch's
segments); on the CPU the PyTorch forms of kernels/lora_reference.py: one product over every
slot with the rows' own slot kept (lora_dense_ref) for decode-sized batches, where a batch is
many one-row segments, and segment by segment (sgmv_*_ref) for prefill, where segments are long.
The worker's LoraManager (worker/lora_manager.py) fills the slots.
"""

from __future__ import annotations

import torch
from torch import Tensor

from radixrt.kernels.lora_reference import lora_dense_ref, sgmv_expand_ref, sgmv_shrink_ref
from radixrt.runtime.forward.lora_batch import LoraBatch

# On the CPU, batches of at most this many rows take the product over every slot at once (two
# matrix products and a mask per layer instead of two per segment)
DENSE_MAX_ROWS = 64


class LoraSlots:
    """One projection's slots on this rank: `rank` columns per slot (max_lora_rank times the
    parts of a fused projection, whose adapters' A are stacked and B block-diagonal)."""

    def __init__(self, num_slots: int, rank: int, in_features: int, out_features: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.a = torch.zeros(num_slots, rank, in_features, dtype=dtype, device=device)
        self.b = torch.zeros(num_slots, out_features, rank, dtype=dtype, device=device)
        self.filled = [False] * num_slots  # slot s adapts this projection (else all zeros)

    def fill(self, slot: int, a: Tensor | None, b: Tensor | None) -> None:
        """Slot `slot` holds a [r, in] and b [out, r] (None: the adapter leaves this
        projection alone)."""
        self.a[slot].zero_()
        self.b[slot].zero_()
        self.filled[slot] = a is not None
        if a is not None and b is not None:
            rank = a.shape[0]
            if rank > self.a.shape[1]:
                raise ValueError(f"an adapter of rank {rank} in a slot of rank {self.a.shape[1]}")
            self.a[slot, :rank] = a.to(self.a.dtype)
            self.b[slot, :, :rank] = b.to(self.b.dtype)

    def add(self, x: Tensor, y: Tensor, lora: LoraBatch | None) -> Tensor:
        """y += the LoRA product of x's rows under their slots; y [rows, out] is returned."""
        if lora is None or not any(self.filled[s] for s in lora.slots):
            return y
        if x.is_cuda:
            from radixrt.kernels.lora_triton import sgmv_expand, sgmv_shrink

            t = sgmv_shrink(x, self.a, lora.seg_indptr, lora.seg_slot,
                            max_seg_len=lora.max_segment)
            return sgmv_expand(t, self.b, lora.seg_indptr, lora.seg_slot, y,
                               max_seg_len=lora.max_segment)
        if lora.num_tokens <= DENSE_MAX_ROWS:
            return lora_dense_ref(x, self.a, self.b, lora.token_slot, y)
        t = sgmv_shrink_ref(x, self.a, lora.seg_indptr, lora.seg_slot)
        return sgmv_expand_ref(t, self.b, lora.seg_indptr, lora.seg_slot, y)

    @property
    def nbytes(self) -> int:
        return self.a.numel() * self.a.element_size() + self.b.numel() * self.b.element_size()
