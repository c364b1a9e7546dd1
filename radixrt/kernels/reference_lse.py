"""PyTorch reference attention in log-sum-exp form, beside reference.py (its conventions).

Attention over a key set K is fully described by its output o_K and its log-sum-exp lse_K (the
natural log of the softmax's denominator). That makes three things exact and cheap:
- merging partial attentions over disjoint key sets (cascade attention, split KV): merge_attention;
- attention sinks (gpt-oss): a per-head logit s that joins the denominator and adds no value,
  o = sum_j exp(x_j) v_j / (exp(s) + exp(lse)) = o_K * sigmoid(lse_K - s): apply_sinks;
- both at once: merge first, then apply the sink once to the merged result.

soft_cap_ lives here because attend_with_lse applies it; reference.py imports it from here.
"""

from __future__ import annotations

import torch
from torch import Tensor


def soft_cap_(scores: Tensor, logit_cap: float) -> Tensor:
    """scores -> logit_cap * tanh(scores / logit_cap), in place (logit_cap > 0)."""
    return scores.div_(logit_cap).tanh_().mul_(logit_cap)


def attend_with_lse(
    q: Tensor, k: Tensor, v: Tensor, valid: Tensor | None, sm_scale: float, logit_cap: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Softmax attention that also returns each query's log-sum-exp (natural log), in float32.

    q: [b, num_kv_heads, m, head_dim] (a KV head's query heads folded into m);
    k, v: [b, num_kv_heads, n, head_dim]; valid: bool, broadcastable to [b, 1, m, n] as
    [b|1, 1, m|1, n], or None; every query needs at least one valid key. Returns out
    [b, num_kv_heads, m, head_dim] and lse [b, num_kv_heads, m]. float32 on the CPU runs
    PyTorch's fused CPU flash-attention kernel (the one SDPA uses, which also returns the
    log-sum-exp); anything else (a logit cap included) the plain formula in float32.
    """
    fused = (q.device.type == "cpu" and q.dtype == k.dtype == v.dtype == torch.float32
             and k.shape[-1] == v.shape[-1])
    if fused and logit_cap == 0:
        mask = None
        if valid is not None:  # additive, in the query's dtype (as the kernel requires)
            mask = torch.zeros(valid.shape, dtype=q.dtype).masked_fill_(~valid, float("-inf"))
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=mask, scale=sm_scale)
        return out, lse
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * sm_scale  # [b, h, m, n]
    if logit_cap > 0:
        soft_cap_(scores, logit_cap)
    if valid is not None:
        scores = scores.masked_fill(~valid, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [b, h, m]
    probs = torch.exp(scores - lse.unsqueeze(-1))  # [b, h, m, n]
    return torch.matmul(probs, v.float()), lse


def attend_with_sinks(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, logit_cap: float,
    sinks: Tensor,
) -> Tensor:
    """Attention with sinks: q [b, heads, q_len, head_dim], k, v [b, kv_heads, kv_len, head_dim],
    mask bool [b|1, 1, q_len|1, kv_len] or None, sinks [heads] -> [b, heads, q_len, head_dim] in
    q's dtype. attend_with_lse with a KV head's query heads folded into its query axis (no K/V
    copies for GQA), rescaled by apply_sinks."""
    b, num_heads, q_len, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    if mask is not None and q_len > 1:  # [b|1, 1, group * q_len, kv_len]: rows as the queries'
        mask = mask.expand(-1, 1, q_len, -1).repeat(1, 1, group, 1)
    qg = q.reshape(b, num_kv_heads, group * q_len, head_dim)
    out, lse = attend_with_lse(qg, k, v, mask, scale, logit_cap)  # [b, kvh, group * q_len, (d)]
    out = apply_sinks(out.reshape(b, num_heads, q_len, -1), lse.reshape(b, num_heads, q_len),
                      sinks.view(1, num_heads, 1))  # fmt: skip
    return out.to(q.dtype)


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


def apply_sinks(out: Tensor, lse: Tensor, sinks: Tensor) -> Tensor:
    """Attention with a sink from the attention without it: out * sigmoid(lse - sink).

    out: [..., head_dim] (softmax-normalised over the visible keys); lse: [...] its natural
    log-sum-exps; sinks: broadcastable to lse (each query's head's sink logit). Returns float32
    [..., head_dim]."""
    return out.float() * torch.sigmoid(lse.float() - sinks.float()).unsqueeze(-1)
