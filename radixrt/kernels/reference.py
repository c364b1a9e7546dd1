"""PyTorch reference "kernels" for paged attention: the CPU path and the oracle of the Triton ones.

Conventions shared with the Triton kernels (keep these signatures):
- k_cache, v_cache: one layer's KV tensors, [num_slots + 1, num_kv_heads, head_dim]; the last row is
  a zeroed padding slot that is never allocated, so padded positions may point at it.
- Requests are ragged: request i's new tokens are rows qo_indptr[i]:qo_indptr[i+1] of q, and its
  full KV (prefix + new tokens) lives in slots kv_indices[kv_indptr[i]:kv_indptr[i+1]].
- New token j of a request with prefix length P attends to KV positions 0..P+j.
- The output tensor o is written in place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def store_kv_ref(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, out_slots: Tensor) -> None:
    """Write the new tokens' K and V into their slots.

    k_cache, v_cache: [num_slots + 1, num_kv_heads, head_dim]
    k, v: [num_tokens, num_kv_heads, head_dim]; out_slots: [num_tokens] int64
    """
    k_cache[out_slots] = k.to(k_cache.dtype)
    v_cache[out_slots] = v.to(v_cache.dtype)


def _attend(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, scale: float
) -> Tensor:
    """SDPA over q [batch, heads, q_len, head_dim] and k, v [batch, kv_heads, kv_len, head_dim].

    GQA without copying K/V: query head h reads KV head h // group, so the group's query heads
    are folded into the query-length axis of their KV head ([b, kv_heads, group * q_len, d])."""
    b, num_heads, q_len, head_dim = q.shape
    num_kv_heads, kv_len = k.shape[1], k.shape[2]
    group = num_heads // num_kv_heads
    if group == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              scale=scale)
    if causal:
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # [b|1, 1, q_len, kv]
        mask = mask.expand(mask.shape[0], 1, q_len, kv_len).repeat(1, 1, group, 1)
    qg = q.reshape(b, num_kv_heads, group * q_len, head_dim)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
    return out.reshape(b, num_heads, q_len, head_dim)


def extend_attention_ref(
    q: Tensor,
    o: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    qo_indptr: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    sm_scale: float,
) -> None:
    """Attention of new tokens (any count per request) over their request's prefix and themselves.

    q, o: [num_tokens, num_heads, head_dim]; qo_indptr, kv_indptr: [bs + 1] int64
    kv_indices: [sum(seq_lens)] int64. The new tokens' K/V must already be stored.
    """
    qo_bounds = qo_indptr.tolist()
    kv_bounds = kv_indptr.tolist()
    for i in range(len(qo_bounds) - 1):
        q_start, q_end = qo_bounds[i], qo_bounds[i + 1]
        kv_start, kv_end = kv_bounds[i], kv_bounds[i + 1]
        q_len, kv_len = q_end - q_start, kv_end - kv_start
        if q_len == 0:
            continue
        prefix_len = kv_len - q_len
        slots = kv_indices[kv_start:kv_end]  # [kv_len]
        qi = q[q_start:q_end].transpose(0, 1).unsqueeze(0)  # [1, num_heads, q_len, head_dim]
        ki = k_cache[slots].transpose(0, 1).unsqueeze(0)  # [1, num_kv_heads, kv_len, head_dim]
        vi = v_cache[slots].transpose(0, 1).unsqueeze(0)  # [1, num_kv_heads, kv_len, head_dim]
        ki, vi = ki.to(q.dtype), vi.to(q.dtype)
        if prefix_len == 0:
            out = _attend(qi, ki, vi, None, q_len > 1, sm_scale)
        else:
            rows = torch.arange(q_len, device=q.device).unsqueeze(1)  # [q_len, 1]
            cols = torch.arange(kv_len, device=q.device).unsqueeze(0)  # [1, kv_len]
            mask = cols <= rows + prefix_len  # [q_len, kv_len]
            out = _attend(qi, ki, vi, mask, False, sm_scale)
        o[q_start:q_end] = out.squeeze(0).transpose(0, 1).to(o.dtype)


def decode_padded_slots(
    kv_indptr: Tensor, kv_indices: Tensor, padding_slot: int
) -> tuple[Tensor, Tensor]:
    """Pad the ragged slot lists of a decode batch into a matrix.

    Returns slots [bs, max_len] (padded entries point at padding_slot) and valid [bs, max_len] bool.
    """
    seq_lens = kv_indptr[1:] - kv_indptr[:-1]  # [bs]
    max_len = int(seq_lens.max().item())
    pos = torch.arange(max_len, device=kv_indices.device).unsqueeze(0)  # [1, max_len]
    valid = pos < seq_lens.unsqueeze(1)  # [bs, max_len]
    flat = (kv_indptr[:-1].unsqueeze(1) + pos).clamp_(max=max(kv_indices.numel() - 1, 0))
    slots = torch.where(valid, kv_indices[flat], padding_slot)  # [bs, max_len]
    return slots, valid


def decode_attention_ref(
    q: Tensor,
    o: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    sm_scale: float,
) -> None:
    """Attention of one new token per request over its whole KV, batched in one padded SDPA call.

    q, o: [bs, num_heads, head_dim]; kv_indptr: [bs + 1] int64; kv_indices: [sum(seq_lens)] int64.
    The new token's own K/V must already be stored (it is the last of the request's slots).
    """
    if q.shape[0] == 0:
        return
    slots, valid = decode_padded_slots(kv_indptr, kv_indices, k_cache.shape[0] - 1)
    k = k_cache[slots].transpose(1, 2).to(q.dtype)  # [bs, num_kv_heads, max_len, head_dim]
    v = v_cache[slots].transpose(1, 2).to(q.dtype)  # [bs, num_kv_heads, max_len, head_dim]
    mask = valid[:, None, None, :]  # [bs, 1, 1, max_len]
    out = _attend(q.unsqueeze(2), k, v, mask, False, sm_scale)  # [bs, num_heads, 1, head_dim]
    o.copy_(out.squeeze(2))
