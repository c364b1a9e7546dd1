"""A linear layer's LoRA slots: the A and B matrices of the adapters a batch may use, stacked
([slots, rank, in] and [slots, out, rank], zero-padded to the slot's rank; the adapter's scale
folded into B), and the product that adds them to the base product row by row:

    y[rows of segment g] += (x[rows] @ a[slot_g].T) @ b[slot_g].T

On CUDA the Triton kernels (kernels/lora_triton.py: shrink, then expand over the batch's
segments); on the CPU the PyTorch forms of kernels/lora_reference.py: one product over every
slot with the rows' own slot kept (lora_dense, on B kept in its layout: [out, slots * rank])
for decode-sized batches, where a batch is many one-row segments, and for prefill, where
segments are long, two batched products over the segments padded to the longest
(lora_padded), or segment by segment (sgmv_*_ref) where padding would waste too much.
The worker's LoraManager (worker/lora_manager.py) fills the slots.
"""

from __future__ import annotations

import torch
from torch import Tensor

from radixrt.kernels.lora_reference import (
    lora_dense,
    lora_padded,
    sgmv_expand_ref,
    sgmv_shrink_ref,
)
from radixrt.runtime.forward.lora_batch import LoraBatch

# On the CPU, batches of at most this many rows take the product over every slot at once (two
# matrix products and a mask per layer instead of two per segment)
DENSE_MAX_ROWS = 64
# Larger batches take two batched products over their segments padded to the longest
# (lora_padded) while the padded table has at most this many entries per row; segment by
# segment (sgmv_*_ref) past it (one long prompt beside many short rows)
PADDED_MAX_WASTE = 2


class LoraSlots:
    """One projection's slots on this rank: `rank` columns per slot (max_lora_rank times the
    parts of a fused projection, whose adapters' A are stacked and B block-diagonal)."""

    def __init__(self, num_slots: int, rank: int, in_features: int, out_features: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.a = torch.zeros(num_slots, rank, in_features, dtype=dtype, device=device)
        self.filled = [False] * num_slots  # slot s adapts this projection (else all zeros)
        # on the CPU, B is kept as lora_dense multiplies it, [out, slots * rank], and `b` is a
        # view of it (a's layout for lora_dense, [slots * rank, in], is a view of `a`)
        self.b_flat: Tensor | None = None
        if device.type == "cpu":
            self.b_flat = torch.zeros(out_features, num_slots * rank, dtype=dtype, device=device)
            self.b = self.b_flat.view(out_features, num_slots, rank).permute(1, 0, 2)
        else:
            self.b = torch.zeros(num_slots, out_features, rank, dtype=dtype, device=device)

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
        if lora.num_tokens <= DENSE_MAX_ROWS and self.b_flat is not None and x.dtype == y.dtype:
            # the slots up to the highest one the batch uses (the manager fills the lowest
            # free slots first): the others' weights are not read
            slots, rank, k = self.a.shape
            width = (max(lora.slots) + 1) * rank
            own = lora.own(slots, rank)[:, :width]
            return lora_dense(x, self.a.view(slots * rank, k)[:width], self.b_flat[:, :width],
                              own, y)
        rows, slots, valid = lora.padded()
        if rows.numel() <= PADDED_MAX_WASTE * lora.num_tokens and x.dtype == y.dtype:
            return lora_padded(x, self.a, self.b, rows, slots, valid, y)
        t = sgmv_shrink_ref(x, self.a, lora.seg_indptr, lora.seg_slot)
        return sgmv_expand_ref(t, self.b, lora.seg_indptr, lora.seg_slot, y)

    @property
    def nbytes(self) -> int:
        return (self.a.numel() + self.b.numel()) * self.a.element_size()
