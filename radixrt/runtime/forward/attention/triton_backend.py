"""TritonAttentionBackend: the GPU backend, built on the Triton kernels of radixrt.kernels.

On a machine without CUDA the kernels run in Triton's CPU interpreter (slow; for tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from radixrt.kernels.cascade_attention import cascade_decode_attention
from radixrt.kernels.decode_attention import (
    decode_attention,
    decode_workspace_numel,
    default_num_kv_splits,
)
from radixrt.kernels.extend_attention import extend_attention
from radixrt.kernels.mla_attention import (
    mla_decode_attention,
    mla_extend_attention,
    mla_head_blocks,
)
from radixrt.kernels.reference import extend_attention_ref
from radixrt.kernels.store_kv import store_kv
from radixrt.runtime.forward.attention.base import LayerAttention
from radixrt.runtime.forward.attention.decode_layout import DecodeLayout
from radixrt.runtime.forward.forward_batch import ForwardBatch
from radixrt.runtime.forward.kv_cache import KVCache


@dataclass(frozen=True)
class _StepPlan:
    """What init_forward decided for the whole forward pass (all layers)."""

    decode: bool  # every request decodes one token: the split-KV decode kernel
    max_extend_len: int  # longest request's new tokens (the extend kernel's grid)
    max_seq_len: int  # longest request's KV (the split heuristic)
    cascade: DecodeLayout | None  # decode-only with prefix groups: the cascade kernel (on the
    # layers whose window, if any, hides none of the batch's KV)


@dataclass(frozen=True)
class _GraphMode:
    """Fixed decode settings while a CUDA graph is captured (replays reuse them)."""

    num_kv_splits: int
    workspace: Tensor  # [>= decode_workspace_numel(...)] float32, owned by the graph runner


class TritonAttentionBackend:
    """Decode-only batches run the split-KV decode kernel, or the cascade kernel when the batch
    has prefix groups (each group's shared prefix read once); batches with any extend request
    (prefill chunks, or decode and prefill mixed) run the extend kernel on every request, a
    decode request being an extend of one token. Every kernel takes the layer's sliding window,
    logit cap and sinks (the cascade kernel adds a sink in its final merge, exactly); a layer
    whose window is shorter than some request's KV decodes with the decode kernel (its last
    `window` positions), never the cascade kernel (see DecodeLayout).

    A latent layer (LayerAttention.value_dim: multi-head latent attention) stores its one row
    per token and runs the latent kernels (kernels/mla_attention.py: a tile of latent rows read
    once for a block of query heads), decode or extend as above; it has no cascade kernel, so
    its decode batches with prefix groups run the latent decode kernel (the shared prefix read
    once per block of heads of each request)."""

    def __init__(self) -> None:
        self._plan: _StepPlan | None = None
        self._graph_mode: _GraphMode | None = None
        self._workspace: Tensor | None = None  # eager decode partials, grown on demand

    # --- CUDA graph support (used by radixrt.runtime.worker.cuda_graph) -------------------
    def enter_graph_mode(self, num_kv_splits: int, workspace: Tensor) -> None:
        """Decode with these splits and this workspace (no allocation, no heuristic)."""
        self._graph_mode = _GraphMode(num_kv_splits, workspace)

    def exit_graph_mode(self) -> None:
        self._graph_mode = None

    # --- AttentionBackend ---------------------------------------------------------------
    def init_forward(self, batch: ForwardBatch) -> None:
        decode = batch.is_decode_only
        cascade = None
        if decode and batch.prefix_groups and self._graph_mode is None:
            cascade = DecodeLayout.build(batch, list(range(batch.batch_size)))
        self._plan = _StepPlan(
            decode=decode,
            max_extend_len=batch.max_extend_len,
            max_seq_len=batch.max_seq_len,
            cascade=cascade,
        )

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
        plan = self._plan
        if plan is None:
            raise RuntimeError("TritonAttentionBackend.forward before init_forward")
        k_cache, v_cache = kv_cache.k[layer.layer_id], kv_cache.v[layer.layer_id]
        if v is None:
            return self._forward_latent(q, k, layer, k_cache, batch, plan)
        store_kv(k_cache, v_cache, k, v, batch.out_slots)
        scale, window, cap = layer.softmax_scale(q.shape[-1]), layer.sliding_window, layer.logit_cap
        sinks = layer.sinks
        q = q.contiguous()
        o = torch.empty_like(q)  # [num_tokens, num_heads, head_dim]
        if plan.cascade is not None and plan.cascade.uses_groups(window):
            layout = plan.cascade
            cascade_decode_attention(
                q, o, k_cache, v_cache, *layout.flat_groups(), layout.own_indptr,
                layout.own_indices, scale, logit_cap=cap, sinks=sinks,
                max_group_size=layout.max_group_size,
                max_kv_len=layout.max_own_len,
            )  # fmt: skip
        elif plan.decode:
            splits, workspace = self._decode_settings(q, kv_cache.num_kv_heads, plan, window)
            decode_attention(
                q, o, k_cache, v_cache, batch.kv_indptr, batch.kv_indices, scale,
                sliding_window=window, logit_cap=cap, sinks=sinks, num_kv_splits=splits,
                workspace=workspace,
            )  # fmt: skip
        elif batch.key_limits is not None:  # images seen both ways (Gemma 3): the reference
            extend_attention_ref(
                q, o, k_cache, v_cache, batch.qo_indptr, batch.kv_indptr, batch.kv_indices,
                scale, sliding_window=window, logit_cap=cap, sinks=sinks,
                key_limits=batch.key_limits,
            )  # fmt: skip
        else:
            extend_attention(
                q, o, k_cache, v_cache, batch.qo_indptr, batch.kv_indptr, batch.kv_indices,
                scale, sliding_window=window, logit_cap=cap, sinks=sinks,
                max_extend_len=plan.max_extend_len,
            )  # fmt: skip
        return o

    def _forward_latent(self, q: Tensor, k: Tensor, layer: LayerAttention, cache: Tensor,
                        batch: ForwardBatch, plan: _StepPlan) -> Tensor:
        """A latent layer: q [num_tokens, num_heads, head_dim], k [num_tokens, 1, head_dim]
        (the rows to store) -> [num_tokens, num_heads, value_dim]."""
        value_dim = layer.value_dim
        assert value_dim is not None
        cache[batch.out_slots] = k.to(cache.dtype)
        q = q.contiguous()
        o = q.new_empty(*q.shape[:2], value_dim)  # [num_tokens, num_heads, value_dim]
        scale = layer.softmax_scale(q.shape[-1])
        if plan.decode:
            programs = mla_head_blocks(q.shape[1])  # per request, in place of KV heads
            splits, workspace = self._decode_settings(q, programs, plan, None, value_dim)
            mla_decode_attention(q, o, cache, batch.kv_indptr, batch.kv_indices, scale,
                                 value_dim, num_kv_splits=splits, workspace=workspace)
        else:
            mla_extend_attention(q, o, cache, batch.qo_indptr, batch.kv_indptr, batch.kv_indices,
                                 scale, value_dim, max_extend_len=plan.max_extend_len)
        return o

    def _decode_settings(
        self, q: Tensor, num_kv_heads: int, plan: _StepPlan, window: int | None,
        value_dim: int | None = None,
    ) -> tuple[int, Tensor]:
        """(num_kv_splits, workspace): the CUDA graph's, or the heuristic's for the longest KV
        a query sees (its window's at most)."""
        if self._graph_mode is not None:
            return self._graph_mode.num_kv_splits, self._graph_mode.workspace
        bs, num_heads, head_dim = q.shape
        keys = plan.max_seq_len if window is None else min(plan.max_seq_len, window)
        splits = default_num_kv_splits(bs, num_kv_heads, q.device, keys)
        numel = decode_workspace_numel(bs, num_heads, value_dim or head_dim, splits)
        ws = self._workspace
        if ws is None or ws.numel() < numel or ws.device != q.device:
            ws = self._workspace = torch.empty(max(numel, 1), dtype=torch.float32, device=q.device)
        return splits, ws
