"""extend_attention_ref with key limits (an image's rows seeing its whole run: Gemma 3) against
a naive softmax over exactly the keys each row may see: positions j <= its limit, and within the
sliding window behind its own position."""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels.reference import extend_attention_ref


def naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
          limits: torch.Tensor, window: int | None, scale: float) -> torch.Tensor:
    """q [n, h, d] at `positions`; k, v [kv_len, kvh, d] of one request."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("nhd,jhd->nhj", q, k) * scale
    j = torch.arange(k.shape[0])
    seen = j[None, :] <= limits[:, None]
    if window is not None:
        seen &= j[None, :] > positions[:, None] - window
    scores = scores.masked_fill(~seen[:, None, :], float("-inf"))
    return torch.einsum("nhj,jhd->nhd", torch.softmax(scores, dim=-1), v)


@pytest.mark.parametrize("window", [None, 3])
def test_rows_see_up_to_their_limits(window: int | None) -> None:
    torch.manual_seed(0)
    heads, kv_heads, dim, prefix, new = 4, 2, 8, 5, 9
    kv_len = prefix + new
    k_cache = torch.randn(kv_len + 1, kv_heads, dim)
    v_cache = torch.randn(kv_len + 1, kv_heads, dim)
    slots = torch.randperm(kv_len) + 1  # a scattered slot table
    q = torch.randn(new, heads, dim)
    positions = torch.arange(prefix, kv_len)
    limits = positions.clone()
    limits[2:7] = prefix + 6  # rows 2..6 form an image's run: each sees up to its last
    o = torch.empty_like(q)
    extend_attention_ref(q, o, k_cache, v_cache, torch.tensor([0, new]),
                         torch.tensor([0, kv_len]), slots, 0.3, sliding_window=window,
                         key_limits=limits)
    want = naive(q, k_cache[slots], v_cache[slots], positions, limits, window, 0.3)
    torch.testing.assert_close(o, want, rtol=1e-5, atol=1e-5)
    causal = torch.empty_like(q)
    extend_attention_ref(q, causal, k_cache, v_cache, torch.tensor([0, new]),
                         torch.tensor([0, kv_len]), slots, 0.3, sliding_window=window,
                         key_limits=positions)  # limits at their own positions: causal
    torch.testing.assert_close(causal, naive(q, k_cache[slots], v_cache[slots], positions,
                                             positions, window, 0.3), rtol=1e-5, atol=1e-5)
