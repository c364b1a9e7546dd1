"""The CPU's decode-step attention kernels against their PyTorch references: decode attention over
ragged slot lists scattered through the pool (GQA groups of 1 to 8, head dims 16 to 256,
sliding windows, logit caps, sinks; its log-sum-exps against attend_with_lse), the KV store, and
the rotary embedding (bit for bit: the same products, each rounded)."""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels.cpu_attention import (
    decode_attention_cpu,
    rotate_qk_cpu,
    slots_within,
    store_kv_cpu,
)
from radixrt.kernels.reference import decode_attention_ref, extend_attention_ref, store_kv_ref
from radixrt.kernels.reference_lse import attend_with_lse
from radixrt.runtime.models.rope import apply_rotary


def case(lens: list[int], heads: int, kv_heads: int, dim: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    slots = sum(lens) + 7
    k_cache = torch.randn(slots + 1, kv_heads, dim, generator=gen)
    v_cache = torch.randn(slots + 1, kv_heads, dim, generator=gen)
    indices = torch.randperm(slots, generator=gen)[: sum(lens)]
    indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    q = torch.randn(len(lens), heads, dim, generator=gen)
    return q, k_cache, v_cache, indptr, indices


@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 4, 16), (8, 1, 128),
                                                (16, 2, 256), (6, 2, 80)])
@pytest.mark.parametrize("window,cap,sinks", [(None, 0.0, False), (5, 0.0, False),
                                              (None, 30.0, False), (7, 20.0, True)])
def test_decode_attention_equals_the_reference(heads: int, kv_heads: int, dim: int,
                                               window: int | None, cap: float,
                                               sinks: bool) -> None:
    lens = [1, 16, 17, 40, 3]
    q, k_cache, v_cache, indptr, indices = case(lens, heads, kv_heads, dim)
    sink = torch.randn(heads) if sinks else None
    got, want = torch.full_like(q, float("nan")), torch.empty_like(q)
    assert decode_attention_cpu(q, got, k_cache, v_cache, indptr, indices, dim**-0.5,
                                sliding_window=window, logit_cap=cap, sinks=sink)
    decode_attention_ref(q, want, k_cache, v_cache, indptr, indices, dim**-0.5,
                         sliding_window=window, logit_cap=cap, sinks=sink)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("window,cap,sinks", [(None, 0.0, False), (3, 0.0, False),
                                              (None, 25.0, True)])
def test_extend_rows_equal_the_reference(window: int | None, cap: float, sinks: bool) -> None:
    """A few new tokens per request (drafts, a short chunk, a first prompt): each row sees its
    request's KV up to its own position."""
    extends, prefixes = [3, 1, 5, 2], [6, 20, 0, 1]
    lens = [p + e for p, e in zip(prefixes, extends)]
    q, k_cache, v_cache, indptr, indices = case(lens, 8, 2, 64, seed=7)
    q = torch.randn(sum(extends), 8, 64, generator=torch.Generator().manual_seed(2))
    qo = torch.tensor([0, *torch.tensor(extends).cumsum(0).tolist()])
    sink = torch.randn(8) if sinks else None
    got, want = torch.full_like(q, float("nan")), torch.empty_like(q)
    assert decode_attention_cpu(q, got, k_cache, v_cache, indptr, indices, 0.125,
                                sliding_window=window, logit_cap=cap, sinks=sink, qo_indptr=qo)
    extend_attention_ref(q, want, k_cache, v_cache, qo, indptr, indices, 0.125,
                         sliding_window=window, logit_cap=cap, sinks=sink)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


def test_the_log_sum_exps_are_those_of_the_reference() -> None:
    lens = [5, 33]
    q, k_cache, v_cache, indptr, indices = case(lens, 6, 2, 64, seed=3)
    o, lse = torch.empty_like(q), torch.empty(2, 6)
    assert decode_attention_cpu(q, o, k_cache, v_cache, indptr, indices, 0.125, lse=lse)
    for i, n in enumerate(lens):
        slots = indices[indptr[i] : indptr[i] + n]
        k = k_cache[slots].permute(1, 0, 2).unsqueeze(0)  # [1, kv_heads, n, dim]
        v = v_cache[slots].permute(1, 0, 2).unsqueeze(0)
        qg = q[i].reshape(1, 2, 3, 64)  # a KV head's query heads folded
        out, want = attend_with_lse(qg, k, v, None, 0.125)
        torch.testing.assert_close(lse[i], want.reshape(6), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(o[i], out.reshape(6, 64), rtol=1e-5, atol=1e-5)


def test_shapes_outside_the_kernel_are_declined() -> None:
    q, k_cache, v_cache, indptr, indices = case([4], 4, 4, 24)  # head_dim not a multiple of 16
    o = torch.zeros_like(q)
    assert not decode_attention_cpu(q, o, k_cache, v_cache, indptr, indices, 0.2)
    assert torch.count_nonzero(o) == 0


def test_store_kv_equals_the_reference_with_strided_rows() -> None:
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(6, 3 * 2 * 16, generator=gen)  # k and v as views of a fused row
    k = qkv[:, 32:64].view(6, 2, 16)
    v = qkv[:, 64:].view(6, 2, 16)
    slots = torch.tensor([9, 2, 0, 17, 5, 11])
    caches = [torch.zeros(20, 2, 16) for _ in range(4)]
    assert store_kv_cpu(caches[0], caches[1], k, v, slots)
    store_kv_ref(caches[2], caches[3], k, v, slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert slots_within(slots, 20) and not slots_within(slots, 17)
    assert not slots_within(torch.tensor([-1]), 20) and slots_within(torch.tensor([]), 1)


@pytest.mark.parametrize("rotary_dim", [64, 32, 48])
def test_rotary_in_place_is_the_references_bit_for_bit(rotary_dim: int) -> None:
    gen = torch.Generator().manual_seed(rotary_dim)
    qkv = torch.randn(5, (9 + 3 + 3) * 64, generator=gen)
    q = qkv[:, : 9 * 64].view(5, 9, 64)
    k = qkv[:, 9 * 64 : 12 * 64].view(5, 3, 64)
    angles = torch.rand(5, 1, rotary_dim // 2, generator=gen) * 100
    cos, sin = angles.cos(), angles.sin()
    want_q, want_k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    assert rotate_qk_cpu(q, k, cos, sin)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
