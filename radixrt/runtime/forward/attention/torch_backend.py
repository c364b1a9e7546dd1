"""TorchAttentionBackend: the CPU / fallback backend, built on the PyTorch reference kernels.

Everything that depends on the batch but not on the layer (which rows decode, their padded slot
lists, the shared-prefix groups) is prepared once per forward pass in init_forward; a layer's
forward only gathers K/V and attends.

On the CPU in float32 (native=True, the CPU kernels built) a layer stores its K/V and runs its
decode rows outside any shared-prefix group through kernels/cpu/attention.cpp, which reads the
KV in place through each request's slot list (no gather, no padding); a pass of at most
SMALL_PASS_ROWS rows and no group runs every row there (speculative drafts, short chunks: the
fused decode step's kernel, so the two give the same floats). The slots are checked once per
forward pass. Larger extends and cascade groups keep the reference kernels.

A latent layer (LayerAttention.value_dim: multi-head latent attention) stores its one row per
token and runs the same reference kernels (decode, cascade, extend) with the values as a view
of the keys' first value_dim dims: one KV head that every query head reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from radixrt.kernels.cpu_attention import decode_attention_cpu, slots_within, store_kv_cpu
from radixrt.kernels.packed_gemm import MAX_GEMM_ROWS
from radixrt.kernels.reference import (
    cascade_decode_attention_padded,
    decode_attention_padded,
    extend_attention_ref,
    store_kv_ref,
)
from radixrt.runtime.forward.attention.base import LayerAttention
from radixrt.runtime.forward.attention.decode_layout import DecodeLayout
from radixrt.runtime.forward.forward_batch import ForwardBatch
from radixrt.runtime.forward.kv_cache import KVCache

# a pass of at most this many rows runs all its attention on the CPU kernel (native): the rows
# the fused decode step takes (models/fused_decode.py), which runs the same kernel
SMALL_PASS_ROWS = MAX_GEMM_ROWS


@dataclass
class _ExtendPlan:
    """The extend requests of a batch, re-indexed from zero."""

    rows: Tensor | None  # [n] token rows of these requests in the batch; None = all rows, in order
    qo_indptr: Tensor  # [k + 1]
    kv_indptr: Tensor  # [k + 1]
    kv_indices: Tensor  # [sum of these requests' seq_lens]


class TorchAttentionBackend:
    """Decode requests (one new token after a prefix) run together in one padded attention call;
    decode requests that share a prefix (the batch's prefix_groups) read it once, together, and
    merge it with their own KV by log-sum-exp (cascade attention); extend requests run one SDPA
    call each. A layer's sliding window, logit cap and sinks go to the reference kernels (the
    cascade reference applies a sink to the merged attention, exactly); a decode
    layer whose window is shorter than some request's KV reads each request's last `window`
    positions and no shared prefix (see DecodeLayout).

    kv_positions_read counts the KV positions decode attention has gathered, over all layers
    and steps (tests check that a shared prefix is read once, and a window's positions only)."""

    def __init__(self, native: bool = False) -> None:
        """native: the CPU kernels may run (the model checks they are built)."""
        self._decode: DecodeLayout | None = None
        self._extend: _ExtendPlan | None = None
        self.kv_positions_read = 0
        self.native = native
        self._slots_checked = -1  # the pool size this pass's slots were checked against
        self._small = False

    def init_forward(self, batch: ForwardBatch) -> None:
        self._slots_checked = -1
        # a small pass (as many rows as the fused decode step takes), no shared-prefix group:
        # every row, decode or extend, through the CPU kernel (the fused step's own kernel)
        self._small = (batch.num_tokens <= SMALL_PASS_ROWS and not batch.prefix_groups)
        is_decode = batch.decode_mask
        decode_ids = [i for i, d in enumerate(is_decode) if d]
        extend_ids = [i for i, d in enumerate(is_decode) if not d]
        self._decode = DecodeLayout.build(batch, decode_ids)
        if not extend_ids:
            self._extend = None
        elif not decode_ids:
            self._extend = _ExtendPlan(None, batch.qo_indptr, batch.kv_indptr, batch.kv_indices)
        else:
            self._extend = _select(batch, extend_ids)

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor | None,
        layer: LayerAttention,
        kv_cache: KVCache,
        batch: ForwardBatch,
    ) -> Tensor:
        # q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim]
        k_cache, v_cache = kv_cache.k[layer.layer_id], kv_cache.v[layer.layer_id]
        if v is None:  # a latent layer: one row per token, its values the first value_dim dims
            k_cache[batch.out_slots] = k.to(k_cache.dtype)
            v_cache = k_cache[..., : layer.value_dim]
            native = False
            o = q.new_empty(*q.shape[:2], v_cache.shape[-1])  # [num_tokens, num_heads, v_dim]
        else:
            native = self._native_for(q, k_cache, batch)
            if not (native and store_kv_cpu(k_cache, v_cache, k, v, batch.out_slots)):
                store_kv_ref(k_cache, v_cache, k, v, batch.out_slots)
            o = torch.empty_like(q)  # [num_tokens, num_heads, head_dim]
        if native and self._small and batch.key_limits is None and decode_attention_cpu(
                q.contiguous(), o, k_cache, v_cache, batch.kv_indptr, batch.kv_indices,
                layer.softmax_scale(q.shape[-1]), sliding_window=layer.sliding_window,
                logit_cap=layer.logit_cap, sinks=layer.sinks, qo_indptr=batch.qo_indptr):
            if self._decode is not None:  # decode rows' reads, counted as they always are
                self.kv_positions_read += self._decode.positions_read(layer.sliding_window)
            return o
        if self._decode is not None:
            self._forward_decode(self._decode, q, o, k_cache, v_cache, layer, native)
        if self._extend is not None:
            sub = self._extend
            q_sub = q if sub.rows is None else q[sub.rows]
            o_sub = o if sub.rows is None else o.new_empty(q_sub.shape[0], *o.shape[1:])
            extend_attention_ref(
                q_sub, o_sub, k_cache, v_cache, sub.qo_indptr, sub.kv_indptr, sub.kv_indices,
                layer.softmax_scale(q.shape[-1]), sliding_window=layer.sliding_window,
                logit_cap=layer.logit_cap, sinks=layer.sinks,
                key_limits=None if batch.key_limits is None else (
                    batch.key_limits if sub.rows is None else batch.key_limits[sub.rows]),
            )  # fmt: skip
            if sub.rows is not None:
                o[sub.rows] = o_sub
        return o

    def _native_for(self, q: Tensor, k_cache: Tensor, batch: ForwardBatch) -> bool:
        """Whether this layer's store and decode run on the CPU kernels: float32 on the CPU, and
        every slot of the pass inside the pool (checked once per pass: the kernels index
        memory unchecked)."""
        if not (self.native and q.dtype == k_cache.dtype == torch.float32
                and q.device.type == "cpu"):
            return False
        size = k_cache.shape[0]
        if self._slots_checked != size:
            if not (slots_within(batch.out_slots, size) and slots_within(batch.kv_indices, size)):
                raise RuntimeError("a KV slot of the batch lies outside the pool")
            self._slots_checked = size
        return True

    def _forward_decode(
        self, plan: DecodeLayout, q: Tensor, o: Tensor, k_cache: Tensor, v_cache: Tensor,
        layer: LayerAttention, native: bool = False,
    ) -> None:  # fmt: skip
        """The decode rows of q into o: [num_tokens, num_heads, head_dim] both."""
        scale, padding = layer.softmax_scale(q.shape[-1]), k_cache.shape[0] - 1
        q_dec = q if plan.rows is None else q[plan.rows]  # [num_decode, num_heads, head_dim]
        o_dec = o if plan.rows is None else o.new_empty(q_dec.shape[0], *o.shape[1:])
        if (native and not plan.uses_groups(layer.sliding_window) and decode_attention_cpu(
                q_dec.contiguous(), o_dec, k_cache, v_cache, plan.full_indptr, plan.full_indices,
                scale, sliding_window=plan.layer_window(layer.sliding_window),
                logit_cap=layer.logit_cap, sinks=layer.sinks)):
            if plan.rows is not None:
                o[plan.rows] = o_dec
            self.kv_positions_read += plan.positions_read(layer.sliding_window)
            return
        slots, valid = plan.padded_slots(padding, layer.sliding_window)  # [num_decode, max_len]
        if plan.uses_groups(layer.sliding_window):
            cascade_decode_attention_padded(
                q_dec, o_dec, k_cache, v_cache, plan.padded_groups(padding), slots, valid, scale,
                logit_cap=layer.logit_cap, sinks=layer.sinks,
            )  # fmt: skip
        else:
            decode_attention_padded(q_dec, o_dec, k_cache, v_cache, slots, valid, scale,
                                    logit_cap=layer.logit_cap, sinks=layer.sinks)  # fmt: skip
        if plan.rows is not None:
            o[plan.rows] = o_dec
        self.kv_positions_read += plan.positions_read(layer.sliding_window)


def _select(batch: ForwardBatch, ids: list[int]) -> _ExtendPlan:
    qo = batch.qo_indptr.tolist()
    kv = batch.kv_indptr.tolist()
    device = batch.kv_indices.device
    rows = torch.cat([torch.arange(qo[i], qo[i + 1]) for i in ids]).to(device)
    kv_indices = torch.cat([batch.kv_indices[kv[i] : kv[i + 1]] for i in ids])
    qo_lens = torch.tensor([qo[i + 1] - qo[i] for i in ids], dtype=torch.int64)
    kv_lens = torch.tensor([kv[i + 1] - kv[i] for i in ids], dtype=torch.int64)
    zero = torch.zeros(1, dtype=torch.int64)
    return _ExtendPlan(
        rows=rows,
        qo_indptr=torch.cat([zero, qo_lens.cumsum(0)]).to(device),
        kv_indptr=torch.cat([zero, kv_lens.cumsum(0)]).to(device),
        kv_indices=kv_indices,
    )
