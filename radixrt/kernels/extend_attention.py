"""extend_attention: new tokens of a ragged batch attend to their cached prefix and causally to
each other, reading K/V from the paged pool through the slot table (Triton, online softmax).

Same arguments as radixrt.kernels.reference.extend_attention_ref, its PyTorch reference. The new
tokens' K/V must already be stored (store_kv), so one loop over the request's slots covers prefix
and new tokens alike: row j of a request with prefix P sees positions 0..P+j (under a sliding
window W only P+j-W+1..P+j: a query block starts at its first row's window, skipping the tiles
before it; a logit cap soft-caps each score, see triton_utils.soft_cap_log2; attention sinks
join each row's final denominator, see triton_utils.add_sink).
"""

from __future__ import annotations

import math

import triton
import triton.language as tl
from torch import Tensor

from radixrt.kernels.triton_utils import (
    add_sink,
    attend_tiles,
    block_dim,
    check_kv_args,
    check_sinks,
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
    sinks_ptr,  # [num_heads] (HAS_SINKS)
    scale_log2,  # sm_scale * log2(e): scores go through exp2
    window,  # sliding window (WINDOWED)
    cap_log2,  # logit_cap * log2(e) (SOFT_CAP)
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
    WINDOWED: tl.constexpr,
    SOFT_CAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    block_m = tl.program_id(2)
    q_start = tl.load(qo_indptr_ptr + req).to(tl.int64)
    q_len = tl.load(qo_indptr_ptr + req + 1).to(tl.int64) - q_start
    if block_m * BLOCK_M < q_len:
        kv_start = tl.load(kv_indptr_ptr + req).to(tl.int64)
        prefix_len = tl.load(kv_indptr_ptr + req + 1).to(tl.int64) - kv_start - q_len
        offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] row within the request
        offs_d = tl.arange(0, BLOCK_D)
        mask_m = offs_m < q_len
        mask_d = offs_d < HEAD_DIM
        rows = q_start + offs_m  # [BLOCK_M] int64
        q_ptrs = q_ptr + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
        q = tl.load(q_ptrs, mask=mask_m[:, None] & mask_d[None, :], other=0.0).to(DOT_DTYPE)
        # keys visible to this block: up to its last row's position; without a window from key
        # 0 (which every row sees), with one from the first row's window start (the tiles before
        # it are no row's)
        kv_end = prefix_len + tl.minimum(q_len, (block_m + 1) * BLOCK_M)
        kv_lo = 0
        if WINDOWED:
            kv_lo = tl.maximum(prefix_len + block_m * BLOCK_M + 1 - window, 0)
        m_i, l_i, acc = attend_tiles(
            q, prefix_len + offs_m, kv_indices_ptr, kv_start, kv_lo, kv_end,
            k_cache_ptr, v_cache_ptr, stride_kt, stride_kh, stride_vt, stride_vh,
            head // kv_group, offs_d, mask_d, scale_log2, window, cap_log2,
            ROWS=BLOCK_M, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, DOT_DTYPE=DOT_DTYPE,
            PRECISION=PRECISION, CAUSAL=True, WINDOWED=WINDOWED, SOFT_CAP=SOFT_CAP,
        )  # fmt: skip
        if WINDOWED:  # rows past the request's last may see no key in the window: not 0 / 0
            l_i = tl.where(mask_m, l_i, 1.0)
        if HAS_SINKS:
            l_i = add_sink(l_i, m_i, tl.load(sinks_ptr + head).to(tl.float32))
        out = acc / l_i[:, None]  # every row of the request sees at least itself
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
    sliding_window: int | None = None,
    logit_cap: float = 0.0,
    sinks: Tensor | None = None,
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
    sliding_window, logit_cap, sinks: as in the reference (None, 0 and None: off).
    """
    check_kv_args(q, k_cache, v_cache)
    check_sinks(sinks, q.shape[1])
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
        q, o, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices,
        q if sinks is None else sinks, sm_scale * _LOG2E,
        sliding_window or 0, logit_cap * _LOG2E, q.stride(0), q.stride(1), o.stride(0), o.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        num_heads // k_cache.shape[1],
        HEAD_DIM=head_dim, BLOCK_D=block_dim(head_dim), BLOCK_M=bm, BLOCK_N=bn,
        DOT_DTYPE=dot_dtype, PRECISION=precision, WINDOWED=sliding_window is not None,
        SOFT_CAP=logit_cap > 0, HAS_SINKS=sinks is not None, num_warps=num_warps or def_warps,
        num_stages=num_stages,
    )  # fmt: skip
