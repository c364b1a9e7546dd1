"""TorchAttentionBackend: the CPU / fallback backend, built on the PyTorch reference kernels."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from radixrt.kernels.reference import decode_attention_ref, extend_attention_ref, store_kv_ref
from radixrt.runtime.forward.forward_batch import ForwardBatch
from radixrt.runtime.forward.kv_cache import KVCache


@dataclass
class _SubBatch:
    """The requests of one kind (decode or extend) of a mixed batch, re-indexed from zero."""

    rows: Tensor | None  # [n] token rows of these requests in the batch; None = all rows, in order
    qo_indptr: Tensor  # [k + 1]
    kv_indptr: Tensor  # [k + 1]
    kv_indices: Tensor  # [sum of these requests' seq_lens]


class TorchAttentionBackend:
    """Decode requests (one new token after a prefix) run together in one padded SDPA call;
    extend requests run one SDPA call each. Attention scale is head_dim ** -0.5 unless given."""

    def __init__(self, sm_scale: float | None = None) -> None:
        self.sm_scale = sm_scale
        self._decode: _SubBatch | None = None
        self._extend: _SubBatch | None = None

    def init_forward(self, batch: ForwardBatch) -> None:
        is_decode = batch.decode_mask
        decode_ids = [i for i, d in enumerate(is_decode) if d]
        extend_ids = [i for i, d in enumerate(is_decode) if not d]
        if not extend_ids:
            self._decode = _SubBatch(None, batch.qo_indptr, batch.kv_indptr, batch.kv_indices)
            self._extend = None
        elif not decode_ids:
            self._decode = None
            self._extend = _SubBatch(None, batch.qo_indptr, batch.kv_indptr, batch.kv_indices)
        else:
            self._decode = _select(batch, decode_ids)
            self._extend = _select(batch, extend_ids)

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        layer_id: int,
        kv_cache: KVCache,
        batch: ForwardBatch,
    ) -> Tensor:
        # q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim]
        k_cache, v_cache = kv_cache.k[layer_id], kv_cache.v[layer_id]
        store_kv_ref(k_cache, v_cache, k, v, batch.out_slots)
        scale = self.sm_scale if self.sm_scale is not None else q.shape[-1] ** -0.5
        o = torch.empty_like(q)  # [num_tokens, num_heads, head_dim]
        if self._decode is not None:
            sub = self._decode
            if sub.rows is None:
                decode_attention_ref(q, o, k_cache, v_cache, sub.kv_indptr, sub.kv_indices, scale)
            else:
                o_sub = torch.empty_like(q[sub.rows])  # [num_decode, num_heads, head_dim]
                decode_attention_ref(
                    q[sub.rows], o_sub, k_cache, v_cache, sub.kv_indptr, sub.kv_indices, scale
                )
                o[sub.rows] = o_sub
        if self._extend is not None:
            sub = self._extend
            q_sub = q if sub.rows is None else q[sub.rows]
            o_sub = o if sub.rows is None else torch.empty_like(q_sub)
            extend_attention_ref(
                q_sub, o_sub, k_cache, v_cache, sub.qo_indptr, sub.kv_indptr, sub.kv_indices, scale
            )
            if sub.rows is not None:
                o[sub.rows] = o_sub
        return o


def _select(batch: ForwardBatch, ids: list[int]) -> _SubBatch:
    qo = batch.qo_indptr.tolist()
    kv = batch.kv_indptr.tolist()
    device = batch.kv_indices.device
    rows = torch.cat([torch.arange(qo[i], qo[i + 1]) for i in ids]).to(device)
    kv_indices = torch.cat([batch.kv_indices[kv[i] : kv[i + 1]] for i in ids])
    qo_lens = torch.tensor([qo[i + 1] - qo[i] for i in ids], dtype=torch.int64)
    kv_lens = torch.tensor([kv[i + 1] - kv[i] for i in ids], dtype=torch.int64)
    zero = torch.zeros(1, dtype=torch.int64)
    return _SubBatch(
        rows=rows,
        qo_indptr=torch.cat([zero, qo_lens.cumsum(0)]).to(device),
        kv_indptr=torch.cat([zero, kv_lens.cumsum(0)]).to(device),
        kv_indices=kv_indices,
    )
