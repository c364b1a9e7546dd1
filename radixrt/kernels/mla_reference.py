"""PyTorch references for multi-head latent attention (DeepSeek's MLA, absorbed form): the CPU
path and the oracle of the Triton kernels in mla_attention.py.

Layout (the conventions of reference.py otherwise: ragged requests, slot lists, in-place o):
- kv_cache: one layer's latent KV, [num_slots + 1, 1, head_dim_k] with head_dim_k = value_dim +
  rope_dim (DeepSeek-V3: 512 + 64 = 576); the last row is a zeroed padding slot. Each token keeps
  ONE row, shared by every query head (MQA): its key is the whole row, its value the row's first
  value_dim dims (the compressed latent).
- q: [num_tokens, num_heads, head_dim_k] (the latent part already absorbed the key up-projection,
  the rope part is rotated); o: [num_tokens, num_heads, value_dim] (still in latent space: the
  caller applies the value up-projection).
- Request i's KV positions are the slots kv_indices[kv_indptr[i]:kv_indptr[i+1]] (int64 or
  int32); in an extend its new tokens are the last qo_len of them, and new token j of a request
  with prefix P attends to positions 0..P+j; a decode token attends to all of them.

The math runs in float32, one request at a time; the output is cast to o's dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_mla_args(q: Tensor, o: Tensor, kv_cache: Tensor, value_dim: int) -> None:
    """Shapes and dtypes both the references and the kernels rely on: q [n, heads, head_dim_k],
    o [n, heads, value_dim], kv_cache [slots, 1, head_dim_k], all of one dtype, with
    0 < value_dim < head_dim_k and a contiguous last axis."""
    if q.dim() != 3 or kv_cache.dim() != 3:
        raise ValueError(
            f"expected q [n, num_heads, head_dim_k] and kv_cache [num_slots + 1, 1, head_dim_k], "
            f"got q {tuple(q.shape)}, kv_cache {tuple(kv_cache.shape)}"
        )
    if kv_cache.shape[1] != 1:
        raise ValueError(f"kv_cache must have exactly one (latent) head, got {kv_cache.shape[1]}")
    head_dim_k = kv_cache.shape[2]
    if q.shape[2] != head_dim_k:
        raise ValueError(f"q head_dim {q.shape[2]} != kv_cache head_dim_k {head_dim_k}")
    if not 0 < value_dim < head_dim_k:
        raise ValueError(f"value_dim {value_dim} must lie in 1..{head_dim_k - 1} (head_dim_k - 1)")
    if tuple(o.shape) != (q.shape[0], q.shape[1], value_dim):
        raise ValueError(
            f"o {tuple(o.shape)} must be [{q.shape[0]}, {q.shape[1]}, {value_dim}] "
            f"(q's tokens and heads, value_dim)"
        )
    if not q.dtype == o.dtype == kv_cache.dtype:
        raise ValueError(f"dtypes differ: q {q.dtype}, o {o.dtype}, kv_cache {kv_cache.dtype}")
    if q.stride(2) != 1 or o.stride(2) != 1 or kv_cache.stride(2) != 1:
        raise ValueError("q, o and kv_cache need a contiguous last axis")


def check_indptr(name: str, indptr: Tensor, batch_size: int) -> None:
    """indptr: [bs + 1] integers."""
    if indptr.dim() != 1 or indptr.numel() != batch_size + 1:
        raise ValueError(f"{name} {tuple(indptr.shape)} must be [{batch_size + 1}]")
    if indptr.is_floating_point():
        raise ValueError(f"{name} must be an integer tensor, not {indptr.dtype}")


def _attend_latent(
    q: Tensor, latent_rows: Tensor, scale: float, value_dim: int, visible: Tensor | None
) -> Tensor:
    """q [q_len, num_heads, head_dim_k] against latent_rows [kv_len, head_dim_k] (keys: whole
    rows, values: their first value_dim dims); visible [q_len, kv_len] bool or None (all)
    -> [q_len, num_heads, value_dim] float32."""
    scores = torch.einsum("thd,nd->thn", q.float(), latent_rows.float()) * scale
    if visible is not None:  # [q_len, num_heads, kv_len]
        scores = scores.masked_fill(~visible.unsqueeze(1), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("thn,nd->thd", probs, latent_rows[:, :value_dim].float())


def mla_decode_attention_ref(
    q: Tensor,
    o: Tensor,
    kv_cache: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    scale: float,
    value_dim: int,
) -> None:
    """Attention of one new token per request over its whole latent KV, written into o.

    q: [bs, num_heads, head_dim_k]; o: [bs, num_heads, value_dim]; kv_cache: [num_slots + 1, 1,
    head_dim_k]; kv_indptr: [bs + 1]; kv_indices: [sum(seq_lens)], every request >= 1 position.
    """
    check_mla_args(q, o, kv_cache, value_dim)
    check_indptr("kv_indptr", kv_indptr, q.shape[0])
    bounds = kv_indptr.tolist()
    for i in range(q.shape[0]):
        slots = kv_indices[bounds[i] : bounds[i + 1]].long()  # [kv_len]
        rows = kv_cache[slots, 0]  # [kv_len, head_dim_k]
        o[i] = _attend_latent(q[i : i + 1], rows, scale, value_dim, None)[0].to(o.dtype)


def mla_extend_attention_ref(
    q: Tensor,
    o: Tensor,
    kv_cache: Tensor,
    qo_indptr: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    scale: float,
    value_dim: int,
) -> None:
    """Attention of each request's new tokens over its prefix and, causally, themselves.

    q: [num_tokens, num_heads, head_dim_k]; o: [num_tokens, num_heads, value_dim]; qo_indptr,
    kv_indptr: [bs + 1]; kv_indices: [sum(seq_lens)], each request's prefix then its new tokens
    (whose latent rows must already be stored).
    """
    check_mla_args(q, o, kv_cache, value_dim)
    batch_size = qo_indptr.numel() - 1
    check_indptr("kv_indptr", kv_indptr, batch_size)
    qo_bounds, kv_bounds = qo_indptr.tolist(), kv_indptr.tolist()
    for i in range(batch_size):
        q_start, q_end = qo_bounds[i], qo_bounds[i + 1]
        if q_end == q_start:
            continue
        slots = kv_indices[kv_bounds[i] : kv_bounds[i + 1]].long()  # [kv_len]
        q_len, kv_len = q_end - q_start, slots.numel()
        if kv_len < q_len:
            raise ValueError(f"request {i} has {q_len} new tokens but only {kv_len} KV positions")
        rows = torch.arange(q_len, device=q.device).unsqueeze(1)  # [q_len, 1]
        cols = torch.arange(kv_len, device=q.device).unsqueeze(0)  # [1, kv_len]
        visible = cols <= rows + (kv_len - q_len)  # [q_len, kv_len]
        out = _attend_latent(q[q_start:q_end], kv_cache[slots, 0], scale, value_dim, visible)
        o[q_start:q_end] = out.to(o.dtype)
