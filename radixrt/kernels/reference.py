"""PyTorch reference "kernels" for paged attention: the CPU path and the oracle of the Triton ones.

Conventions shared with the Triton kernels (keep these signatures):
- k_cache, v_cache: one layer's KV tensors, [num_slots + 1, num_kv_heads, head_dim]; the last row is
  a zeroed padding slot that is never allocated, so padded positions may point at it.
- Requests are ragged: request i's new tokens are rows qo_indptr[i]:qo_indptr[i+1] of q, and its
  full KV (prefix + new tokens) lives in slots kv_indices[kv_indptr[i]:kv_indptr[i+1]]; KV
  position j of a request is the j-th slot of its list.
- New token j of a request with prefix length P sits at position P+j and attends to KV positions
  0..P+j; a decode token (the last of its request's KV) sits at position seq_len - 1.
- sliding_window W (None: off): a query at position p attends only to positions j with
  p - W < j <= p (W keys, itself included).
- logit_cap c (0: off): each score s = q.k * sm_scale becomes c * tanh(s / c) before the softmax.
- sinks (None: off): [num_heads] float, a logit per query head that joins each softmax's
  denominator (not scaled, not capped) and adds no value (gpt-oss).
- The output tensor o is written in place. v_cache may have fewer dims than k_cache (a latent
  layer's values are the first value_dim dims of its keys: v_cache = k_cache[..., :value_dim]);
  o then has v_cache's.

Without either option attention runs through PyTorch's SDPA (fused kernels). A window reads only
the keys some query can see (a decode gathers the last W positions; an extend a mask over them);
a cap takes an explicit float32 scores path. Sinks take attend_with_lse (reference_lse.py: the
fused CPU kernel for float32, else the explicit path) and rescale by sigmoid(lse - sink). An
extend under any of them runs a chunk of queries at a time, its scores within about
QUERY_CHUNK_SCORES elements.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from radixrt.kernels.reference_lse import (
    apply_sinks,
    attend_with_lse,
    attend_with_sinks,
    merge_attention,
    soft_cap_,
)

QUERY_CHUNK_SCORES = 1 << 24  # elements of one chunk's scores (64 MiB of float32), about
MIN_QUERY_CHUNK = 64  # ... but never fewer query rows per chunk than this


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


def gather_kv_pair(k_cache: Tensor, v_cache: Tensor, slots: Tensor) -> tuple[Tensor, Tensor]:
    """gather_kv of both caches; a latent layer's values (v_cache a view of k_cache's first
    dims) come out as the same view of the gathered keys, gathered once."""
    k = gather_kv(k_cache, slots)
    if v_cache.data_ptr() == k_cache.data_ptr() and v_cache.shape[:-1] == k_cache.shape[:-1]:
        return k, k[..., : v_cache.shape[-1]]
    return k, gather_kv(v_cache, slots)


def _attend(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, scale: float,
    logit_cap: float = 0.0, sinks: Tensor | None = None,
) -> Tensor:
    """SDPA over q [batch, heads, q_len, head_dim] and k, v [batch, kv_heads, kv_len, head_dim]
    (mask: bool, broadcastable to [batch, 1, q_len, kv_len]); logit_cap > 0 soft-caps the scores
    on an explicit float32 path instead; sinks [heads] go through attend_with_sinks.

    GQA without copying K/V: query head h reads KV head h // group, so the group's query heads
    are folded into the query-length axis of their KV head ([b, kv_heads, group * q_len, d])."""
    b, num_heads, q_len, head_dim = q.shape
    num_kv_heads, kv_len = k.shape[1], k.shape[2]
    group = num_heads // num_kv_heads
    if causal:
        if logit_cap == 0 and group == 1 and sinks is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device).tril()
    if sinks is not None:
        return attend_with_sinks(q, k, v, None if mask is None else _mask4(mask), scale,
                                 logit_cap, sinks)  # fmt: skip
    if logit_cap > 0:
        return _attend_capped(q, k, v, mask, scale, logit_cap)
    if group == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if mask is not None:
        mask = _mask4(mask).expand(-1, 1, q_len, kv_len).repeat(1, 1, group, 1)
    qg = q.reshape(b, num_kv_heads, group * q_len, head_dim)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
    return out.reshape(b, num_heads, q_len, v.shape[-1])


def _mask4(mask: Tensor) -> Tensor:
    """A bool mask [q_len, kv_len] or [b|1, 1, q_len|1, kv_len] as 4-D [b|1, 1, q_len|1, kv_len]."""
    return mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))


def _attend_capped(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, logit_cap: float
) -> Tensor:
    """_attend with soft-capped scores, computed in float32 (shapes as _attend's)."""
    b, num_heads, q_len, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    qg = q.float().reshape(b, num_kv_heads, group * q_len, head_dim)
    scores = torch.matmul(qg, k.float().transpose(-1, -2)).mul_(scale)  # [b, kvh, g * q_len, n]
    scores = soft_cap_(scores, logit_cap).view(b, num_kv_heads, group, q_len, -1)
    if mask is not None:  # [b|1, 1, 1, q_len|1, kv_len] over [b, kvh, group, q_len, kv_len]
        scores.masked_fill_(~_mask4(mask).unsqueeze(2), float("-inf"))
    probs = torch.softmax(scores, dim=-1).view(b, num_kv_heads, group * q_len, -1)
    out = torch.matmul(probs, v.float())  # [b, kv_heads, group * q_len, v_dim]
    return out.view(b, num_heads, q_len, v.shape[-1]).to(q.dtype)


def extend_attention_ref(
    q: Tensor,
    o: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    qo_indptr: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    sm_scale: float,
    *,
    sliding_window: int | None = None,
    logit_cap: float = 0.0,
    sinks: Tensor | None = None,
    key_limits: Tensor | None = None,
) -> None:
    """Attention of new tokens (any count per request) over their request's prefix and themselves.

    q, o: [num_tokens, num_heads, head_dim]; qo_indptr, kv_indptr: [bs + 1] int64
    kv_indices: [sum(seq_lens)] int64. The new tokens' K/V must already be stored.
    key_limits: [num_tokens] int64, the last key position each row sees (>= its own; an
    image's rows see the image's last: Gemma 3's block mask), None: each its own (causal).
    """
    qo_bounds = qo_indptr.tolist()
    kv_bounds = kv_indptr.tolist()
    for i in range(len(qo_bounds) - 1):
        q_start, q_end = qo_bounds[i], qo_bounds[i + 1]
        kv_start, kv_end = kv_bounds[i], kv_bounds[i + 1]
        if q_end == q_start:
            continue
        slots = kv_indices[kv_start:kv_end]  # [kv_len]
        q_req = q[q_start:q_end]  # [q_len, num_heads, head_dim]
        prefix_len = slots.numel() - q_req.shape[0]
        window = window_within(sliding_window, slots.numel())
        whole = v_cache.shape[-1] == k_cache.shape[-1]  # (a latent layer: chunks of queries)
        limits = None
        if key_limits is not None:
            limits = key_limits[q_start:q_end]  # [q_len]
            own = torch.arange(prefix_len, slots.numel(), device=limits.device)
            limits = None if bool((limits == own).all()) else limits
        if window is None and logit_cap == 0 and sinks is None and whole and limits is None:
            out = _extend_request(q_req, k_cache, v_cache, slots, prefix_len, sm_scale)
        else:
            out = _extend_request_chunked(q_req, k_cache, v_cache, slots, prefix_len, sm_scale,
                                          window, logit_cap, sinks, limits)  # fmt: skip
        o[q_start:q_end] = out.to(o.dtype)


def window_within(sliding_window: int | None, kv_len: int) -> int | None:
    """The window, or None where it hides nothing: no query of a request whose KV is at most
    the window long has a key outside it."""
    return sliding_window if sliding_window is not None and sliding_window < kv_len else None


def _extend_request(
    q_req: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, prefix_len: int, scale: float
) -> Tensor:
    """One request's full causal attention in one SDPA call: q_req [q_len, num_heads, head_dim],
    slots [kv_len] -> [q_len, num_heads, head_dim]."""
    q_len, kv_len = q_req.shape[0], slots.numel()
    qi = q_req.transpose(0, 1).unsqueeze(0)  # [1, num_heads, q_len, head_dim]
    # [1, num_kv_heads, kv_len, head_dim]
    k_all, v_all = gather_kv_pair(k_cache, v_cache, slots)
    ki = k_all.transpose(0, 1).unsqueeze(0).to(q_req.dtype)
    vi = v_all.transpose(0, 1).unsqueeze(0).to(q_req.dtype)
    if prefix_len == 0:
        out = _attend(qi, ki, vi, None, q_len > 1, scale)
    else:
        rows = torch.arange(q_len, device=q_req.device).unsqueeze(1)  # [q_len, 1]
        cols = torch.arange(kv_len, device=q_req.device).unsqueeze(0)  # [1, kv_len]
        out = _attend(qi, ki, vi, cols <= rows + prefix_len, False, scale)  # mask [q_len, kv_len]
    return out.squeeze(0).transpose(0, 1)


def _query_chunk_rows(num_heads: int, kv_len: int, window: int | None) -> int:
    """Query rows per chunk of a windowed or capped extend: scores of about QUERY_CHUNK_SCORES
    elements (a chunk of r rows under a window W reads at most r + W - 1 keys)."""
    span = kv_len if window is None else min(kv_len, 2 * window)
    rows = max(MIN_QUERY_CHUNK, QUERY_CHUNK_SCORES // max(num_heads * span, 1))
    return rows if window is None else min(rows, max(window, MIN_QUERY_CHUNK))


def _extend_request_chunked(
    q_req: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, prefix_len: int,
    scale: float, window: int | None, logit_cap: float, sinks: Tensor | None = None,
    limits: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """_extend_request under a sliding window, a logit cap, sinks and/or key limits ([q_len]:
    the last key each row sees), a chunk of queries at a time, each chunk reading only the
    keys its queries may see."""
    q_len, num_heads, _ = q_req.shape
    device = q_req.device
    out = q_req.new_empty(q_len, num_heads, v_cache.shape[-1])  # [q_len, num_heads, v_dim]
    rows = _query_chunk_rows(num_heads, slots.numel(), window)
    for first in range(0, q_len, rows):
        last = min(q_len, first + rows)  # rows first..last-1, at positions prefix_len + row
        lo = 0 if window is None else max(0, prefix_len + first + 1 - window)
        hi = prefix_len + last  # keys lo..hi-1
        pos_q = torch.arange(prefix_len + first, hi, device=device).unsqueeze(1)  # [rows, 1]
        seen = pos_q if limits is None else limits[first:last].unsqueeze(1)  # [rows, 1]
        hi = max(hi, int(seen.max()) + 1)
        # [1, num_kv_heads, hi - lo, head_dim]
        k_part, v_part = gather_kv_pair(k_cache, v_cache, slots[lo:hi])
        ki = k_part.transpose(0, 1).unsqueeze(0).to(q_req.dtype)
        vi = v_part.transpose(0, 1).unsqueeze(0).to(q_req.dtype)
        pos_k = torch.arange(lo, hi, device=device).unsqueeze(0)  # [1, hi - lo]
        mask = pos_k <= seen  # [rows, hi - lo]
        if window is not None:
            mask &= pos_k > pos_q - window
        qi = q_req[first:last].transpose(0, 1).unsqueeze(0)  # [1, num_heads, rows, head_dim]
        res = _attend(qi, ki, vi, mask, False, scale, logit_cap, sinks)  # [1, heads, rows, dim]
        out[first:last] = res.squeeze(0).transpose(0, 1)
    return out


def decode_padded_slots(
    kv_indptr: Tensor, kv_indices: Tensor, padding_slot: int, sliding_window: int | None = None
) -> tuple[Tensor, Tensor]:
    """Pad the ragged slot lists of a decode batch into a matrix; with a sliding window W, only
    each list's last W slots (what a decode query at position seq_len - 1 sees).

    Returns slots [bs, max_len] (padded entries point at padding_slot) and valid [bs, max_len] bool.
    """
    seq_lens = kv_indptr[1:] - kv_indptr[:-1]  # [bs]
    starts = kv_indptr[:-1]  # [bs]
    if sliding_window is not None:
        starts = starts + (seq_lens - sliding_window).clamp(min=0)
        seq_lens = seq_lens.clamp(max=sliding_window)
    max_len = int(seq_lens.max().item())
    pos = torch.arange(max_len, device=kv_indices.device).unsqueeze(0)  # [1, max_len]
    valid = pos < seq_lens.unsqueeze(1)  # [bs, max_len]
    flat = (starts.unsqueeze(1) + pos).clamp_(max=max(kv_indices.numel() - 1, 0))
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
    *,
    sliding_window: int | None = None,
    logit_cap: float = 0.0,
    sinks: Tensor | None = None,
) -> None:
    """Attention of one new token per request over its whole KV (its last sliding_window
    positions), batched in one padded attention call.

    q, o: [bs, num_heads, head_dim]; kv_indptr: [bs + 1] int64; kv_indices: [sum(seq_lens)] int64.
    The new token's own K/V must already be stored (it is the last of the request's slots).
    """
    if q.shape[0] == 0:
        return
    slots, valid = decode_padded_slots(kv_indptr, kv_indices, k_cache.shape[0] - 1, sliding_window)
    decode_attention_padded(q, o, k_cache, v_cache, slots, valid, sm_scale, logit_cap=logit_cap,
                            sinks=sinks)  # fmt: skip


def decode_attention_padded(
    q: Tensor, o: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, valid: Tensor,
    sm_scale: float, *, logit_cap: float = 0.0, sinks: Tensor | None = None,
) -> None:
    """decode_attention_ref on slot lists already padded by decode_padded_slots (a backend pads
    them once per forward pass, not once per layer; a sliding window is applied there: only
    the window's slots are padded in). slots, valid: [bs, max_len]."""
    # [bs, num_kv_heads, max_len, head_dim]
    k_all, v_all = gather_kv_pair(k_cache, v_cache, slots)
    k, v = k_all.transpose(1, 2).to(q.dtype), v_all.transpose(1, 2).to(q.dtype)
    mask = valid[:, None, None, :]  # [bs, 1, 1, max_len]
    # [bs, num_heads, 1, head_dim]
    out = _attend(q.unsqueeze(2), k, v, mask, False, sm_scale, logit_cap, sinks)
    o.copy_(out.squeeze(2))


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
    *,
    logit_cap: float = 0.0,
    sinks: Tensor | None = None,
) -> None:
    """Decode attention where groups of requests share a KV prefix (cascade attention).

    Group g's requests (rows group_rows[group_indptr[g]:group_indptr[g+1]] of q; a row is in at
    most one group) all begin with the KV in slots prefix_indices[prefix_indptr[g]:
    prefix_indptr[g+1]]. Request i's own KV, what follows its group's prefix (all of its KV
    when it is in no group), is in slots kv_indices[kv_indptr[i]:kv_indptr[i+1]]; it holds at
    least the new token. The prefix is read once per group: all the group's queries attend to it
    together; each request attends to its own KV; the two are merged by their log-sum-exps.
    The result equals decode_attention_ref over the concatenated KV (with the same logit_cap
    and sinks: a sink rescales the merged attention, by its merged log-sum-exp).
    There is no sliding window: a windowed layer decodes with decode_attention_ref (the
    backends use this only when the window covers every request's whole KV).

    q, o: [bs, num_heads, head_dim]; prefix_indptr, group_indptr: [num_groups + 1] int64;
    prefix_indices: [sum(prefix_lens)] int64; group_rows: [sum(group sizes)] int64;
    kv_indptr: [bs + 1] int64; kv_indices: [sum(own lens)] int64.
    """
    if q.shape[0] == 0:
        return
    padding = k_cache.shape[0] - 1
    slots, valid = decode_padded_slots(kv_indptr, kv_indices, padding)
    if group_indptr.numel() <= 1:  # no groups: plain decode attention
        decode_attention_padded(q, o, k_cache, v_cache, slots, valid, sm_scale,
                                logit_cap=logit_cap, sinks=sinks)  # fmt: skip
        return
    groups = pad_groups(prefix_indptr, prefix_indices, group_indptr, group_rows, padding)
    cascade_decode_attention_padded(q, o, k_cache, v_cache, groups, slots, valid, sm_scale,
                                    logit_cap=logit_cap, sinks=sinks)


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
    *, logit_cap: float = 0.0, sinks: Tensor | None = None,
) -> None:
    """cascade_decode_attention_ref on metadata a backend prepares once per forward pass: the
    groups padded by pad_groups, and the requests' own slot lists padded by decode_padded_slots
    (slots, valid: [bs, max_len]). Two attention calls, whatever the number of groups: every
    request over its own KV, and every group's queries over its prefix."""
    bs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    qg = q.reshape(bs, num_kv_heads, group, head_dim)  # [bs, kv_heads, group, head_dim]
    k_all, v_all = gather_kv_pair(k_cache, v_cache, slots)
    k = k_all.transpose(1, 2)  # [bs, kv_heads, max_len, head_dim]
    v = v_all.transpose(1, 2)  # [bs, kv_heads, max_len, v_dim]
    out, lse = attend_with_lse(qg, k, v, valid[:, None, None, :], sm_scale, logit_cap)
    if bool(groups[1].any()):  # some group has a prefix
        _merge_prefixes(qg, out, lse, k_cache, v_cache, groups, sm_scale, logit_cap)
    if sinks is not None:  # over the merged attention: [bs, kv_heads, group, v_dim]
        out = apply_sinks(out, lse, sinks.view(num_kv_heads, group))
    o.copy_(out.reshape(bs, num_heads, v_cache.shape[-1]))


def _merge_prefixes(
    qg: Tensor, out: Tensor, lse: Tensor, k_cache: Tensor, v_cache: Tensor,
    groups: tuple[Tensor, Tensor, Tensor, Tensor], sm_scale: float, logit_cap: float,
) -> None:  # fmt: skip
    """Every group's queries over its prefix, merged into its members' rows of out
    [bs, kv_heads, group, head_dim] and lse [bs, kv_heads, group] (in place)."""
    _, num_kv_heads, group, head_dim = qg.shape
    members, member_valid, prefix, prefix_valid = groups
    num_groups, width = members.shape
    # each group's members' query heads of a KV head attend together: [G, kv_heads, W * group, d]
    q_p = qg[members].permute(0, 2, 1, 3, 4).reshape(num_groups, num_kv_heads, width * group,
                                                      head_dim)
    k_pre, v_pre = gather_kv_pair(k_cache, v_cache, prefix)
    k_p = k_pre.transpose(1, 2)  # [G, kv_heads, max_prefix, head_dim]
    v_p = v_pre.transpose(1, 2)  # [G, kv_heads, max_prefix, v_dim]
    out_p, lse_p = attend_with_lse(q_p, k_p, v_p, prefix_valid[:, None, None, :], sm_scale,
                                   logit_cap)
    out_p = out_p.reshape(num_groups, num_kv_heads, width, group, -1).transpose(1, 2)
    lse_p = lse_p.reshape(num_groups, num_kv_heads, width, group).transpose(1, 2)
    rows = members[member_valid]  # [sum of group sizes]
    out[rows], lse[rows] = merge_attention(out[rows], lse[rows], out_p[member_valid],
                                           lse_p[member_valid])
