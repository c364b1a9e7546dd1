"""LoraBatch: which LoRA adapter slot each row of a forward pass runs under.

A batch mixes requests of different adapters (and of none); its rows are grouped request by
request, so the rows of one adapter come in runs ("segments"). The adapted linear layers
(models/lora_layer.py) add each segment's low-rank product to the base product: one base
product for the whole batch, small products per segment (the SGMV idea).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

NO_ADAPTER = -1  # the slot of a row that runs on the base weights alone


@dataclass(frozen=True)
class LoraBatch:
    token_slot: Tensor  # [num_tokens] int64: each row's adapter slot, NO_ADAPTER for none
    seg_indptr: Tensor  # [num_segments + 1] int64: segment g is rows seg_indptr[g]:[g + 1]
    seg_slot: Tensor  # [num_segments] int64: the slot of each segment
    slots: frozenset[int]  # the adapter slots the batch uses
    num_segments: int
    max_segment: int  # rows of the longest segment (a kernel grid's extent)
    # what every layer's product reads, made once a step: own()'s masks by (slots, rank),
    # padded()'s table
    masks: dict[object, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def build(cls, entry_slots: Sequence[int], extend_lens: Sequence[int],
              device: torch.device | str = "cpu") -> LoraBatch | None:
        """From each batch entry's slot and its rows; None when no entry has an adapter (the
        pass is the base model's alone)."""
        if all(s == NO_ADAPTER for s in entry_slots):
            return None
        bounds, slots, lengths = [0], [], []
        for slot, rows in zip(entry_slots, extend_lens, strict=True):
            if slots and slots[-1] == slot:
                bounds[-1] += rows
                lengths[-1] += rows
            else:
                slots.append(slot)
                bounds.append(bounds[-1] + rows)
                lengths.append(rows)
        per_row = torch.repeat_interleave(torch.tensor(slots, dtype=torch.int64),
                                          torch.tensor(lengths, dtype=torch.int64))
        return cls(
            token_slot=per_row.to(device),
            seg_indptr=torch.tensor(bounds, dtype=torch.int64, device=device),
            seg_slot=torch.tensor(slots, dtype=torch.int64, device=device),
            slots=frozenset(s for s in slots if s != NO_ADAPTER),
            num_segments=len(slots),
            max_segment=max(lengths),
        )

    def padded(self) -> tuple[Tensor, Tensor, Tensor]:
        """segment_rows' table of the batch (kernels/lora_reference.py), made once a step."""
        table = self.masks.get("padded")
        if table is None:
            from radixrt.kernels.lora_reference import segment_rows

            table = self.masks["padded"] = segment_rows(self.seg_indptr, self.seg_slot)
        return table

    def own(self, num_slots: int, rank: int) -> Tensor:
        """[num_tokens, num_slots * rank] float32: 1.0 on each row's own slot's columns."""
        mask = self.masks.get((num_slots, rank))
        if mask is None:
            column_slot = torch.arange(num_slots * rank, device=self.token_slot.device) // rank
            mask = (column_slot[None, :] == self.token_slot[:, None]).float()
            self.masks[(num_slots, rank)] = mask
        return mask

    @property
    def num_tokens(self) -> int:
        return int(self.token_slot.shape[0])
