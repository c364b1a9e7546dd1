"""DecodeLayout: where the decode requests of a batch read their KV, prepared once per forward
pass for every layer (both attention backends use it).

A decode request in one of the batch's prefix groups reads the group's shared prefix together
with the other members (once for all of them) and, alone, only what follows it: its "own" KV.
A request in no group owns all of its KV.

A sliding-window layer whose window is shorter than some decode request's KV does not use the
groups: each request reads the last `window` positions of its whole KV (decode_padded_slots with
the window), its share of a group's prefix included; exact, and a short window reads little. A
window at least as long as every decode request's KV hides nothing, and the groups stand.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch
from torch import Tensor

from radixrt.kernels.reference import decode_padded_slots, pad_groups, window_within
from radixrt.runtime.forward.forward_batch import ForwardBatch


@dataclass
class DecodeLayout:
    rows: Tensor | None  # [n] rows of the decode requests in the batch; None = every row, in order
    own_indptr: Tensor  # [n + 1] each request's KV after its group's prefix (all of it if none)
    own_indices: Tensor  # [sum of own lens]
    groups: list[tuple[Tensor, Tensor]]  # (rows [k] among the n decode requests, prefix slots)
    kv_positions: int  # KV positions one full-attention layer reads (a shared prefix once)
    max_own_len: int
    seq_lens: list[int]  # [n] each request's whole KV length
    full_indptr: Tensor  # [n + 1] each request's whole KV (the own KV when there are no groups)
    full_indices: Tensor  # [sum(seq_lens)]
    # (slots, valid) [n, max_len] per window, padded once: None = own KV, W = last W of the whole
    padded: dict[int | None, tuple[Tensor, Tensor]] = field(default_factory=dict)
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
        seq_lens = [kv[i + 1] - kv[i] for i in ids]
        lens = [kv[i + 1] - kv[i] - skip.get(i, 0) for i in ids]
        if every_row:
            full_indptr, full_indices = batch.kv_indptr, batch.kv_indices
        else:
            full_indptr, full_indices = _slot_lists(batch, kv, {i: 0 for i in ids}, seq_lens)
        if skip:
            own_indptr, own_indices = _slot_lists(batch, kv, {i: skip.get(i, 0) for i in ids}, lens)
        else:
            own_indptr, own_indices = full_indptr, full_indices
        groups = [
            (torch.tensor([position[i] for i in g.requests], dtype=torch.int64, device=device),
             batch.kv_indices[kv[g.requests[0]] : kv[g.requests[0]] + g.length])
            for g in batch.prefix_groups
        ]  # fmt: skip
        return cls(rows=rows, own_indptr=own_indptr, own_indices=own_indices, groups=groups,
                   kv_positions=sum(lens) + sum(g.length for g in batch.prefix_groups),
                   max_own_len=max(lens), seq_lens=seq_lens, full_indptr=full_indptr,
                   full_indices=full_indices)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens)

    def layer_window(self, sliding_window: int | None) -> int | None:
        """A layer's window as these requests see it: None where it hides nothing."""
        return window_within(sliding_window, self.max_seq_len)

    def uses_groups(self, sliding_window: int | None) -> bool:
        """Whether a layer with this window reads the groups' prefixes once (cascade)."""
        return bool(self.groups) and self.layer_window(sliding_window) is None

    def positions_read(self, sliding_window: int | None) -> int:
        """KV positions one layer with this window reads."""
        window = self.layer_window(sliding_window)
        if window is None:
            return self.kv_positions
        return sum(min(n, window) for n in self.seq_lens)

    def padded_slots(
        self, padding_slot: int, sliding_window: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """Slot lists padded into [n, max_len] matrices (slots, valid), at the first layer that
        asks (every layer's pool has the same padding slot): for sliding_window None each
        request's own KV (all of it without groups), for W < max_seq_len the last W positions
        of its whole KV."""
        window = self.layer_window(sliding_window)
        if window not in self.padded:
            if window is None:
                padded = decode_padded_slots(self.own_indptr, self.own_indices, padding_slot)
            else:
                padded = decode_padded_slots(self.full_indptr, self.full_indices, padding_slot,
                                             window)  # fmt: skip
            self.padded[window] = padded
        return self.padded[window]

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


def _slot_lists(
    batch: ForwardBatch, kv: list[int], skip: dict[int, int], lens: list[int]
) -> tuple[Tensor, Tensor]:
    """(indptr [n + 1], indices): the slots of requests skip.keys() (in order), each without
    its first skip[i] positions; lens are the resulting lengths (host ints: no device sync)."""
    parts = [batch.kv_indices[kv[i] + first : kv[i + 1]] for i, first in skip.items()]
    counts = torch.tensor(lens, dtype=torch.int64)
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
    return indptr.to(batch.kv_indices.device), torch.cat(parts)
