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


def gather_kv(cache: Tensor, slots: Tensor) -> Tensor:
    """cache[slots] for a K or V tensor [num_slots + 1, num_kv_heads, head_dim] and slots of any
    shape -> [*slots.shape, num_kv_heads, head_dim]. Gathered as whole rows of a 2-D view with
    index_select, which reads scattered slots several times faster on the CPU than advanced
    indexing of the 3-D tensor (0.14 against 0.7-2.5 ms for 3,680 slots of 192 floats)."""
    if not cache.is_contiguous():
        return cache[slots]
    rows = cache.view(cache.shape[0], -1).index_select(0, slots.reshape(-1))
    return rows.view(*slots.shape, *cache.shape[1:])


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
        # [1, num_kv_heads, kv_len, head_dim]
        ki = gather_kv(k_cache, slots).transpose(0, 1).unsqueeze(0)
        vi = gather_kv(v_cache, slots).transpose(0, 1).unsqueeze(0)
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
    decode_attention_padded(q, o, k_cache, v_cache, slots, valid, sm_scale)


def decode_attention_padded(
    q: Tensor, o: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, valid: Tensor,
    sm_scale: float,
) -> None:
    """decode_attention_ref on slot lists already padded by decode_padded_slots (a backend pads
    them once per forward pass, not once per layer). slots, valid: [bs, max_len]."""
    # [bs, num_kv_heads, max_len, head_dim]
    k = gather_kv(k_cache, slots).transpose(1, 2).to(q.dtype)
    v = gather_kv(v_cache, slots).transpose(1, 2).to(q.dtype)
    mask = valid[:, None, None, :]  # [bs, 1, 1, max_len]
    out = _attend(q.unsqueeze(2), k, v, mask, False, sm_scale)  # [bs, num_heads, 1, head_dim]
    o.copy_(out.squeeze(2))


def attend_with_lse(
    q: Tensor, k: Tensor, v: Tensor, valid: Tensor | None, sm_scale: float
) -> tuple[Tensor, Tensor]:
    """Softmax attention that also returns each query's log-sum-exp (natural log), in float32.

    q: [b, num_kv_heads, m, head_dim] (a KV head's query heads folded into m);
    k, v: [b, num_kv_heads, n, head_dim]; valid: [b, 1, 1, n] bool or None; every query needs at
    least one valid key. Returns out [b, num_kv_heads, m, head_dim] and lse [b, num_kv_heads, m].
    float32 on the CPU runs PyTorch's fused CPU flash-attention kernel (the one SDPA uses, which
    also returns the log-sum-exp); anything else the plain formula in float32.
    """
    if q.device.type == "cpu" and q.dtype == k.dtype == v.dtype == torch.float32:
        mask = None
        if valid is not None:  # additive, in the query's dtype (as the kernel requires)
            mask = torch.zeros(valid.shape, dtype=q.dtype).masked_fill_(~valid, float("-inf"))
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=mask, scale=sm_scale)
        return out, lse
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * sm_scale  # [b, h, m, n]
    if valid is not None:
        scores = scores.masked_fill(~valid, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [b, h, m]
    probs = torch.exp(scores - lse.unsqueeze(-1))  # [b, h, m, n]
    return torch.matmul(probs, v.float()), lse


def merge_attention(
    o_a: Tensor, lse_a: Tensor, o_b: Tensor, lse_b: Tensor
) -> tuple[Tensor, Tensor]:
    """Attention over keys A ∪ B from the attention over A and over B (disjoint key sets).

    o_*: [..., head_dim]; lse_*: [...] natural log-sum-exps (-inf: no keys)."""
    lse = torch.logaddexp(lse_a, lse_b)  # [...]
    finite = lse.nan_to_num(neginf=0.0)
    w_a = torch.exp(lse_a - finite).unsqueeze(-1)
    w_b = torch.exp(lse_b - finite).unsqueeze(-1)
    return o_a * w_a + o_b * w_b, lse


def cascade_decode_attention_ref(
    q: Tensor,
    o: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    prefix_indptr: Tensor,
    prefix_indices: Tensor,
    group_indptr: Tensor,
    group_rows: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    sm_scale: float,
) -> None:
    """Decode attention where groups of requests share a KV prefix (cascade attention).

    Group g's requests (rows group_rows[group_indptr[g]:group_indptr[g+1]] of q; a row is in at
    most one group) all begin with the KV in slots prefix_indices[prefix_indptr[g]:
    prefix_indptr[g+1]]. Request i's own KV, what follows its group's prefix (all of its KV
    when it is in no group), is in slots kv_indices[kv_indptr[i]:kv_indptr[i+1]]; it holds at
    least the new token. The prefix is read once per group: all the group's queries attend to it
    together; each request attends to its own KV; the two are merged by their log-sum-exps.
    The result equals decode_attention_ref over the concatenated KV.

    q, o: [bs, num_heads, head_dim]; prefix_indptr, group_indptr: [num_groups + 1] int64;
    prefix_indices: [sum(prefix_lens)] int64; group_rows: [sum(group sizes)] int64;
    kv_indptr: [bs + 1] int64; kv_indices: [sum(own lens)] int64.
    """
    if q.shape[0] == 0:
        return
    padding = k_cache.shape[0] - 1
    slots, valid = decode_padded_slots(kv_indptr, kv_indices, padding)
    if group_indptr.numel() <= 1:  # no groups: plain decode attention
        decode_attention_padded(q, o, k_cache, v_cache, slots, valid, sm_scale)
        return
    groups = pad_groups(prefix_indptr, prefix_indices, group_indptr, group_rows, padding)
    cascade_decode_attention_padded(q, o, k_cache, v_cache, groups, slots, valid, sm_scale)


def pad_groups(prefix_indptr: Tensor, prefix_indices: Tensor, group_indptr: Tensor,
               group_rows: Tensor, padding_slot: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The ragged groups as padded matrices, so that one attention call serves them all:
    members [G, max_members] (rows of q; padding: row 0), member_valid [G, max_members] bool
    (False for every member of a group with an empty prefix), prefix slots [G, max_prefix]
    (padding: padding_slot) and prefix_valid [G, max_prefix]."""
    members, member_valid = decode_padded_slots(group_indptr, group_rows, 0)
    prefix, prefix_valid = decode_padded_slots(prefix_indptr, prefix_indices, padding_slot)
    # a group with an empty prefix adds nothing: its members keep their own attention alone
    member_valid &= prefix_valid.any(dim=1, keepdim=True)
    return members, member_valid, prefix, prefix_valid


def cascade_decode_attention_padded(
    q: Tensor, o: Tensor, k_cache: Tensor, v_cache: Tensor,
    groups: tuple[Tensor, Tensor, Tensor, Tensor], slots: Tensor, valid: Tensor, sm_scale: float,
) -> None:
    """cascade_decode_attention_ref on metadata a backend prepares once per forward pass: the
    groups padded by pad_groups, and the requests' own slot lists padded by decode_padded_slots
    (slots, valid: [bs, max_len]). Two attention calls, whatever the number of groups: every
    request over its own KV, and every group's queries over its prefix."""
    bs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    members, member_valid, prefix, prefix_valid = groups
    num_groups, width = members.shape
    qg = q.reshape(bs, num_kv_heads, group, head_dim)  # [bs, kv_heads, group, head_dim]
    k = gather_kv(k_cache, slots).transpose(1, 2)  # [bs, kv_heads, max_len, head_dim]
    v = gather_kv(v_cache, slots).transpose(1, 2)  # [bs, kv_heads, max_len, head_dim]
    out, lse = attend_with_lse(qg, k, v, valid[:, None, None, :], sm_scale)
    if not bool(member_valid.any()):  # no group with a prefix
        o.copy_(out.reshape(bs, num_heads, head_dim))
        return
    # each group's members' query heads of a KV head attend together: [G, kv_heads, W * group, d]
    q_p = qg[members].permute(0, 2, 1, 3, 4).reshape(num_groups, num_kv_heads, width * group,
                                                      head_dim)
    k_p = gather_kv(k_cache, prefix).transpose(1, 2)  # [G, kv_heads, max_prefix, head_dim]
    v_p = gather_kv(v_cache, prefix).transpose(1, 2)  # [G, kv_heads, max_prefix, head_dim]
    out_p, lse_p = attend_with_lse(q_p, k_p, v_p, prefix_valid[:, None, None, :], sm_scale)
    out_p = out_p.reshape(num_groups, num_kv_heads, width, group, head_dim).transpose(1, 2)
    lse_p = lse_p.reshape(num_groups, num_kv_heads, width, group).transpose(1, 2)
    rows = members[member_valid]  # [sum of group sizes]
    out[rows], lse[rows] = merge_attention(out[rows], lse[rows], out_p[member_valid],
                                           lse_p[member_valid])
    o.copy_(out.reshape(bs, num_heads, head_dim))
