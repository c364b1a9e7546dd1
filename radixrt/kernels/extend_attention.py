"""extend_attention: new tokens of a ragged batch attend to their cached prefix and causally to
each other, reading K/V from the paged pool through the slot table (Triton, online softmax).

Same arguments as radixrt.kernels.reference.extend_attention_ref, its PyTorch reference. The new
tokens' K/V must already be stored (store_kv), so one loop over the request's slots covers prefix
and new tokens alike: row j of a request with prefix P sees positions 0..P+j.
"""

from __future__ import annotations

import math

import triton
import triton.language as tl
from torch import Tensor

from radixrt.kernels.triton_utils import (
    MAX_COMBINE,
    SUM_COMBINE,
    block_dim,
    check_kv_args,
    dot_dtype_and_precision,
    interpreting,
)

_LOG2E = math.log2(math.e)


@triton.jit
def _extend_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim]
    o_ptr,  # [num_tokens, num_heads, head_dim]
    k_cache_ptr,  # [num_slots + 1, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_slots + 1, num_kv_heads, head_dim]
    qo_indptr_ptr,  # [bs + 1]
    kv_indptr_ptr,  # [bs + 1]
    kv_indices_ptr,  # [sum(seq_lens)]
    scale_log2,  # sm_scale * log2(e): scores go through exp2
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    kv_group,  # query heads per KV head
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    block_m = tl.program_id(2)
    q_start = tl.load(qo_indptr_ptr + req).to(tl.int64)
    q_len = tl.load(qo_indptr_ptr + req + 1).to(tl.int64) - q_start
    if block_m * BLOCK_M < q_len:
        kv_start = tl.load(kv_indptr_ptr + req).to(tl.int64)
        kv_len = tl.load(kv_indptr_ptr + req + 1).to(tl.int64) - kv_start
        prefix_len = kv_len - q_len
        kv_head = head // kv_group
        k_head_ptr = k_cache_ptr + kv_head * stride_kh
        v_head_ptr = v_cache_ptr + kv_head * stride_vh

        offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] row within the request
        offs_d = tl.arange(0, BLOCK_D)
        mask_m = offs_m < q_len
        mask_d = offs_d < HEAD_DIM
        rows = q_start + offs_m  # [BLOCK_M] int64
        q_ptrs = q_ptr + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
        q = tl.load(q_ptrs, mask=mask_m[:, None] & mask_d[None, :], other=0.0).to(DOT_DTYPE)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        # keys visible to this block: the prefix and the new tokens up to its last row; every
        # row sees key 0, so after the first block no row's running max is -inf
        kv_end = prefix_len + tl.minimum(q_len, (block_m + 1) * BLOCK_M)
        for start_n in range(0, kv_end, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)  # [BLOCK_N] position within the request
            mask_n = offs_n < kv_end
            slots = tl.load(kv_indices_ptr + kv_start + offs_n, mask=mask_n, other=0).to(tl.int64)
            k_ptrs = k_head_ptr + slots[None, :] * stride_kt + offs_d[:, None]
            k = tl.load(k_ptrs, mask=mask_d[:, None] & mask_n[None, :], other=0.0)  # [D, N]
            qk = tl.dot(q, k.to(DOT_DTYPE), input_precision=PRECISION) * scale_log2  # [M, N]
            visible = (offs_n[None, :] <= prefix_len + offs_m[:, None]) & mask_n[None, :]
            qk = tl.where(visible, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.reduce(qk, 1, MAX_COMBINE))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(qk - m_new[:, None])  # [M, N]
            l_i = l_i * alpha + tl.reduce(p, 1, SUM_COMBINE)
            v_ptrs = v_head_ptr + slots[:, None] * stride_vt + offs_d[None, :]
            v = tl.load(v_ptrs, mask=mask_n[:, None] & mask_d[None, :], other=0.0)  # [N, D]
            pv = tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=PRECISION)
            acc = acc * alpha[:, None] + pv
            m_i = m_new

        out = acc / l_i[:, None]
        o_ptrs = o_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def _default_blocks(head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for the GPU, or for the interpreter's serial numpy."""
    if interpreting():
        return 32, 32, 4
    if block_dim(head_dim) <= 128:
        return 64, 64, 4
    return 32, 32, 4


def extend_attention(
    q: Tensor,
    o: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    qo_indptr: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    sm_scale: float,
    *,
    max_extend_len: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 2,
) -> None:
    """Attention of each request's new tokens over its prefix and themselves, written into o.

    q, o: [num_tokens, num_heads, head_dim]; k_cache, v_cache: [num_slots + 1, num_kv_heads,
    head_dim]; qo_indptr, kv_indptr: [bs + 1] int; kv_indices: [sum(seq_lens)] int.
    max_extend_len: the longest request's new-token count; reading it from qo_indptr costs a
    host synchronisation, so callers that know it pass it. Block sizes default per device.
    """
    check_kv_args(q, k_cache, v_cache)
    if o.shape != q.shape or o.stride(2) != 1:
        raise ValueError(f"o {tuple(o.shape)} must be shaped like q {tuple(q.shape)}")
    batch_size = qo_indptr.numel() - 1
    if batch_size <= 0 or q.shape[0] == 0:
        return
    if max_extend_len is None:
        max_extend_len = int((qo_indptr[1:] - qo_indptr[:-1]).max().item())
    if max_extend_len <= 0:
        return
    num_heads, head_dim = q.shape[1], q.shape[2]
    def_m, def_n, def_warps = _default_blocks(head_dim)
    bm, bn = block_m or def_m, block_n or def_n
    dot_dtype, precision = dot_dtype_and_precision(q.dtype)
    grid = (batch_size, num_heads, triton.cdiv(max_extend_len, bm))
    _extend_kernel[grid](
        q, o, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale * _LOG2E,
        q.stride(0), q.stride(1), o.stride(0), o.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        num_heads // k_cache.shape[1],
        HEAD_DIM=head_dim, BLOCK_D=block_dim(head_dim), BLOCK_M=bm, BLOCK_N=bn,
        DOT_DTYPE=dot_dtype, PRECISION=precision,
        num_warps=num_warps or def_warps, num_stages=num_stages,
    )  # fmt: skip
