"""ForwardBatch: the tensors of one forward pass over a ragged batch of extend/decode requests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from radixrt.runtime.forward.lora_batch import LoraBatch

IntSeq = Sequence[int] | Tensor


@dataclass(frozen=True)
class PrefixGroup:
    """Decode requests of the batch (indices into it) whose KV begins with the same `length`
    slots: an attention backend may read those once for all of them (cascade attention)."""

    requests: list[int]
    length: int


@dataclass
class ForwardBatch:
    """New tokens of all requests, concatenated request by request, and where their KV lives.

    Request i's new tokens are rows qo_indptr[i]:qo_indptr[i+1]; its full KV (prefix + new tokens,
    in position order) is in slots kv_indices[kv_indptr[i]:kv_indptr[i+1]]. A request with
    extend_len == 1 and a non-empty prefix is a decode request.
    """

    input_ids: Tensor  # [num_tokens] int64
    positions: Tensor  # [num_tokens] int64, absolute position of each new token
    out_slots: Tensor  # [num_tokens] int64, KV slot each new token's K/V is written to
    qo_indptr: Tensor  # [bs + 1] int64
    kv_indptr: Tensor  # [bs + 1] int64
    kv_indices: Tensor  # [sum(seq_lens)] int64
    seq_lens: list[int]  # prefix_len + extend_len per request
    extend_lens: list[int]  # new tokens per request
    prefix_groups: list[PrefixGroup] = field(default_factory=list)  # over decode requests
    lora: LoraBatch | None = None  # the rows' LoRA adapters (None: the base model alone)
    # image placeholders' rows and the features that replace their embeddings (None: none)
    image_rows: Tensor | None = None  # [num_image_rows] int64
    image_embeds: Tensor | None = None  # [num_image_rows, hidden]
    # multimodal RoPE's positions (temporal, height, width), where images moved them
    mrope_positions: Tensor | None = None  # [3, num_tokens] int64
    # the last KV position each row sees where an image's rows see each other both ways
    # (Gemma 3), None: each its own (causal)
    key_limits: Tensor | None = None  # [num_tokens] int64

    @classmethod
    def build(
        cls,
        new_token_ids: Sequence[IntSeq],
        prefix_lens: Sequence[int],
        slot_tables: Sequence[IntSeq],
        device: torch.device | str = "cpu",
        prefix_groups: Sequence[PrefixGroup] = (),
    ) -> ForwardBatch:
        """Build a batch from per-request lists.

        new_token_ids[i]: the tokens request i computes now (positions prefix_lens[i]...);
        slot_tables[i]: the slot of every position 0..prefix_lens[i] + len(new_token_ids[i]) - 1
        (a longer table is cut to that length). prefix_groups: decode requests whose tables
        begin with the same slots, each group's length shorter than its members' prefixes.
        """
        if not (len(new_token_ids) == len(prefix_lens) == len(slot_tables)):
            raise ValueError(
                f"per-request lists differ in length: {len(new_token_ids)} token lists, "
                f"{len(prefix_lens)} prefix lengths, {len(slot_tables)} slot tables"
            )
        ids, positions, out_slots, kv_slots = [], [], [], []
        extend_lens: list[int] = []
        seq_lens: list[int] = []
        for tokens, prefix_len, table in zip(new_token_ids, prefix_lens, slot_tables, strict=True):
            tokens_t = torch.as_tensor(tokens, dtype=torch.int64).reshape(-1)
            table_t = torch.as_tensor(table, dtype=torch.int64).reshape(-1)
            extend_len = tokens_t.numel()
            seq_len = prefix_len + extend_len
            if extend_len == 0:
                raise ValueError("every request in a batch needs at least one new token")
            if table_t.numel() < seq_len:
                raise ValueError(f"slot table has {table_t.numel()} slots for {seq_len} positions")
            ids.append(tokens_t)
            positions.append(torch.arange(prefix_len, seq_len, dtype=torch.int64))
            out_slots.append(table_t[prefix_len:seq_len])
            kv_slots.append(table_t[:seq_len])
            extend_lens.append(extend_len)
            seq_lens.append(seq_len)
        return cls(
            input_ids=_cat(ids, device),
            positions=_cat(positions, device),
            out_slots=_cat(out_slots, device),
            qo_indptr=_indptr(extend_lens, device),
            kv_indptr=_indptr(seq_lens, device),
            kv_indices=_cat(kv_slots, device),
            seq_lens=seq_lens,
            extend_lens=extend_lens,
            prefix_groups=_checked_groups(prefix_groups, prefix_lens, extend_lens),
        )

    @property
    def shared_reads_saved(self) -> int:
        """KV positions per layer that the prefix groups read once instead of once a member."""
        return sum((len(g.requests) - 1) * g.length for g in self.prefix_groups)

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def prefix_lens(self) -> list[int]:
        return [s - e for s, e in zip(self.seq_lens, self.extend_lens, strict=True)]

    @property
    def max_extend_len(self) -> int:
        return max(self.extend_lens, default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens, default=0)

    @property
    def decode_mask(self) -> list[bool]:
        """Per request: True for a decode request (one new token after a non-empty prefix)."""
        return [e == 1 and s > 1 for s, e in zip(self.seq_lens, self.extend_lens, strict=True)]

    @property
    def is_decode_only(self) -> bool:
        return all(self.decode_mask)

    @property
    def last_token_rows(self) -> Tensor:
        """[bs] int64: row of each request's last new token (where its next-token logits are)."""
        return self.qo_indptr[1:] - 1

    @property
    def device(self) -> torch.device:
        return self.input_ids.device


def _checked_groups(groups: Sequence[PrefixGroup], prefix_lens: Sequence[int],
                   extend_lens: Sequence[int]) -> list[PrefixGroup]:
    members = [i for group in groups for i in group.requests]
    if len(set(members)) != len(members) or any(len(g.requests) < 2 for g in groups):
        raise ValueError("prefix groups must be disjoint and of at least two requests")
    for group in groups:
        for i in group.requests:
            if extend_lens[i] != 1 or not 0 < group.length <= prefix_lens[i]:
                raise ValueError(f"prefix group of length {group.length}: request {i} is not a "
                                 f"decode with a prefix that long")
    return list(groups)


def _cat(parts: list[Tensor], device: torch.device | str) -> Tensor:
    if not parts:
        return torch.empty(0, dtype=torch.int64, device=device)
    return torch.cat(parts).to(device)


def _indptr(lens: list[int], device: torch.device | str) -> Tensor:
    out = torch.zeros(len(lens) + 1, dtype=torch.int64)
    if lens:
        out[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int64), 0)
    return out.to(device)
