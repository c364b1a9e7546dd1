"""DecodeLayout: where the decode requests of a batch read their KV, prepared once per forward
pass for every layer (both attention backends use it).

A decode request in one of the batch's prefix groups reads the group's shared prefix together
with the other members (once for all of them) and, alone, only what follows it: its "own" KV.
A request in no group owns all of its KV.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

from radixrt.kernels.reference import decode_padded_slots, pad_groups
from radixrt.runtime.forward.forward_batch import ForwardBatch


@dataclass
class DecodeLayout:
    rows: Tensor | None  # [n] rows of the decode requests in the batch; None = every row, in order
    own_indptr: Tensor  # [n + 1] each request's KV after its group's prefix (all of it if none)
    own_indices: Tensor  # [sum of own lens]
    groups: list[tuple[Tensor, Tensor]]  # (rows [k] among the n decode requests, prefix slots)
    kv_positions: int  # KV positions one layer reads (a shared prefix counted once)
    max_own_len: int
    padded: tuple[Tensor, Tensor] | None = None  # own slots and valid [n, max_len], padded once
    flat: tuple[Tensor, Tensor, Tensor, Tensor] | None = None
    padded_prefixes: tuple[Tensor, Tensor, Tensor, Tensor] | None = None

    @classmethod
    def build(cls, batch: ForwardBatch, ids: list[int]) -> DecodeLayout | None:
        """The layout of the decode requests `ids` (indices into the batch), None if none."""
        if not ids:
            return None
        device = batch.kv_indices.device
        position = {req: j for j, req in enumerate(ids)}
        skip = {req: group.length for group in batch.prefix_groups for req in group.requests}
        kv = [0, *itertools.accumulate(batch.seq_lens)]  # host offsets: no device sync
        every_row = len(ids) == batch.batch_size
        rows = None if every_row else batch.qo_indptr[torch.tensor(ids, device=device)]
        lens = [kv[i + 1] - kv[i] - skip.get(i, 0) for i in ids]
        if not skip and every_row:
            own_indptr, own_indices = batch.kv_indptr, batch.kv_indices
        else:
            parts = [batch.kv_indices[kv[i] + skip.get(i, 0) : kv[i + 1]] for i in ids]
            own = torch.tensor(lens, dtype=torch.int64)
            own_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), own.cumsum(0)]).to(device)
            own_indices = torch.cat(parts)
        groups = [
            (torch.tensor([position[i] for i in g.requests], dtype=torch.int64, device=device),
             batch.kv_indices[kv[g.requests[0]] : kv[g.requests[0]] + g.length])
            for g in batch.prefix_groups
        ]  # fmt: skip
        return cls(rows=rows, own_indptr=own_indptr, own_indices=own_indices, groups=groups,
                   kv_positions=sum(lens) + sum(g.length for g in batch.prefix_groups),
                   max_own_len=max(lens))

    def padded_slots(self, padding_slot: int) -> tuple[Tensor, Tensor]:
        """The own slot lists padded into [n, max_len] matrices (slots, valid), at the first
        layer that asks: every layer's pool has the same padding slot."""
        if self.padded is None:
            self.padded = decode_padded_slots(self.own_indptr, self.own_indices, padding_slot)
        return self.padded

    def padded_groups(self, padding_slot: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The groups padded for one attention call over all of them (kernels.reference
        pad_groups), at the first layer that asks."""
        if self.padded_prefixes is None:
            self.padded_prefixes = pad_groups(*self.flat_groups(), padding_slot)
        return self.padded_prefixes

    def flat_groups(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The groups as the cascade kernels take them: prefix_indptr, prefix_indices,
        group_indptr, group_rows."""
        if self.flat is None:
            device = self.own_indices.device
            zero = torch.zeros(1, dtype=torch.int64)
            prefix_lens = torch.tensor([p.numel() for _, p in self.groups], dtype=torch.int64)
            sizes = torch.tensor([r.numel() for r, _ in self.groups], dtype=torch.int64)
            self.flat = (
                torch.cat([zero, prefix_lens.cumsum(0)]).to(device),
                torch.cat([p for _, p in self.groups]),
                torch.cat([zero, sizes.cumsum(0)]).to(device),
                torch.cat([r for r, _ in self.groups]),
            )
        return self.flat

    @property
    def max_group_size(self) -> int:
        return max((r.numel() for r, _ in self.groups), default=0)
