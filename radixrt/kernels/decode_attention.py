"""decode_attention: one new token per request attends over its whole KV in the paged pool
(Triton, split-KV "flash-decoding").

Same arguments as radixrt.kernels.reference.decode_attention_ref, its PyTorch reference.
Stage 1 splits each request's KV into num_kv_splits contiguous chunks and writes, per chunk and
query head, the normalised partial output and its log-sum-exp; stage 2 merges the chunks (with a
single chunk stage 1 writes the output and stage 2 is skipped). Stage 1 comes in two variants: per
query head (vector products; best without GQA) and grouped, where one program serves all query
heads of a KV head with tl.dot, reading each K/V tile once. Under a sliding window W the chunks
split only the last W positions of each request (what its query at seq_len - 1 sees); a logit
cap soft-caps each score (triton_utils.soft_cap_log2). Attention sinks join the denominator once,
at the end: in stage 2's merge (a partial's log-sum-exp excludes the sink), or in stage 1 when
it writes the output (one split; triton_utils.add_sink).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from radixrt.kernels.triton_utils import (
    MAX_COMBINE,
    SUM_COMBINE,
    add_sink,
    attend_tiles,
    block_dim,
    check_kv_args,
    check_sinks,
    dot_dtype_and_precision,
    interpreting,
    num_compute_units,
    soft_cap_log2,
)

_LOG2E = math.log2(math.e)
MAX_KV_SPLITS = 16
MIN_KEYS_PER_SPLIT = 64  # the split heuristic never makes chunks shorter than this on average
_GPU_BLOCK_N = 64
_INTERPRETER_BLOCK_N = 32


@triton.jit
def _split_range(kv_len, window, split, NUM_SPLITS: tl.constexpr, WINDOWED: tl.constexpr):
    """Positions lo..hi-1 of chunk `split` of a request's KV: the last `window` positions
    (WINDOWED) or all kv_len of them, cut into NUM_SPLITS chunks."""
    first = 0
    if WINDOWED:  # the decode query sits at position kv_len - 1
        first = tl.maximum(kv_len - window, 0)
    split_len = (kv_len - first + NUM_SPLITS - 1) // NUM_SPLITS
    lo = first + split * split_len
    return lo, tl.minimum(lo + split_len, kv_len)


@triton.jit
def _decode_stage1(
    q_ptr,  # [bs, num_heads, head_dim]
    o_ptr,  # [bs, num_heads, head_dim]: written directly when NUM_SPLITS == 1
    k_cache_ptr,  # [num_slots + 1, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_slots + 1, num_kv_heads, head_dim]
    kv_indptr_ptr,  # [bs + 1]
    kv_indices_ptr,  # [sum(seq_lens)]
    sinks_ptr,  # [num_heads] (HAS_SINKS; read here only when NUM_SPLITS == 1)
    part_o_ptr,  # [bs, num_heads, NUM_SPLITS, head_dim] float32
    part_lse_ptr,  # [bs, num_heads, NUM_SPLITS] float32
    scale_log2,
    window,  # sliding window (WINDOWED)
    cap_log2,  # logit_cap * log2(e) (SOFT_CAP)
    stride_qb,
    stride_qh,
    stride_ob,
    stride_oh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    num_heads,
    kv_group,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    WINDOWED: tl.constexpr,
    SOFT_CAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    split = tl.program_id(2)
    kv_head = head // kv_group
    kv_start = tl.load(kv_indptr_ptr + req).to(tl.int64)
    kv_len = tl.load(kv_indptr_ptr + req + 1).to(tl.int64) - kv_start
    lo, hi = _split_range(kv_len, window, split, NUM_SPLITS, WINDOWED)

    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    q_row = q_ptr + req.to(tl.int64) * stride_qb + head * stride_qh
    q = tl.load(q_row + offs_d, mask=mask_d, other=0.0).to(tl.float32)  # [BLOCK_D]
    m_i = float("-inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        slots = tl.load(kv_indices_ptr + kv_start + offs_n, mask=mask_n, other=0).to(tl.int64)
        mask_nd = mask_n[:, None] & mask_d[None, :]
        k_ptrs = k_cache_ptr + slots[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :]
        k = tl.load(k_ptrs, mask=mask_nd, other=0.0).to(tl.float32)  # [BLOCK_N, BLOCK_D]
        qk = tl.reduce(q[None, :] * k, 1, SUM_COMBINE) * scale_log2  # [BLOCK_N]
        if SOFT_CAP:
            qk = soft_cap_log2(qk, cap_log2)
        qk = tl.where(mask_n, qk, float("-inf"))
        m_new = tl.maximum(tl.reduce(qk, 0, MAX_COMBINE), m_i)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new)  # [BLOCK_N]
        l_i = l_i * alpha + tl.reduce(p, 0, SUM_COMBINE)
        v_ptrs = v_cache_ptr + slots[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :]
        v = tl.load(v_ptrs, mask=mask_nd, other=0.0).to(tl.float32)  # [BLOCK_N, BLOCK_D]
        acc = acc * alpha + tl.reduce(p[:, None] * v, 0, SUM_COMBINE)
        m_i = m_new
    nonempty = l_i > 0  # an empty chunk stores zeros and a log-sum-exp of -inf
    denominator = tl.where(nonempty, l_i, 1.0)
    if NUM_SPLITS == 1 and HAS_SINKS:  # the sink joins the one chunk's denominator
        denominator = add_sink(l_i, m_i, tl.load(sinks_ptr + head).to(tl.float32))
    out = acc / denominator
    if NUM_SPLITS == 1:
        o_row = o_ptr + req.to(tl.int64) * stride_ob + head * stride_oh
        tl.store(o_row + offs_d, out.to(o_ptr.dtype.element_ty), mask=mask_d)
    else:
        lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
        part_row = (req.to(tl.int64) * num_heads + head) * NUM_SPLITS + split
        tl.store(part_o_ptr + part_row * HEAD_DIM + offs_d, out, mask=mask_d)
        tl.store(part_lse_ptr + part_row, lse)


@triton.jit
def _decode_grouped_stage1(
    q_ptr,  # [bs, num_heads, head_dim]
    o_ptr,  # [bs, num_heads, head_dim]: written directly when NUM_SPLITS == 1
    k_cache_ptr,  # [num_slots + 1, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_slots + 1, num_kv_heads, head_dim]
    kv_indptr_ptr,  # [bs + 1]
    kv_indices_ptr,  # [sum(seq_lens)]
    sinks_ptr,  # [num_heads] (HAS_SINKS; read here only when NUM_SPLITS == 1)
    part_o_ptr,  # [bs, num_heads, NUM_SPLITS, head_dim] float32
    part_lse_ptr,  # [bs, num_heads, NUM_SPLITS] float32
    scale_log2,
    window,  # sliding window (WINDOWED)
    cap_log2,  # logit_cap * log2(e) (SOFT_CAP)
    stride_qb,
    stride_qh,
    stride_ob,
    stride_oh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    num_heads,
    kv_group,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,  # >= kv_group and >= 16 (tl.dot)
    NUM_SPLITS: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    WINDOWED: tl.constexpr,
    SOFT_CAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    kv_start = tl.load(kv_indptr_ptr + req).to(tl.int64)
    kv_len = tl.load(kv_indptr_ptr + req + 1).to(tl.int64) - kv_start
    lo, hi = _split_range(kv_len, window, split, NUM_SPLITS, WINDOWED)

    offs_g = tl.arange(0, BLOCK_H)
    mask_h = offs_g < kv_group
    heads = kv_head * kv_group + offs_g  # [BLOCK_H] query heads of this KV head
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    q_ptrs = q_ptr + req.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=mask_h[:, None] & mask_d[None, :], other=0.0).to(DOT_DTYPE)
    m_i, l_i, acc = attend_tiles(
        q, 0, kv_indices_ptr, kv_start, lo, hi, k_cache_ptr, v_cache_ptr,
        stride_kt, stride_kh, stride_vt, stride_vh, kv_head, offs_d, mask_d, scale_log2, 0,
        cap_log2, ROWS=BLOCK_H, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, DOT_DTYPE=DOT_DTYPE,
        PRECISION=PRECISION, CAUSAL=False, WINDOWED=False, SOFT_CAP=SOFT_CAP,
    )  # fmt: skip
    nonempty = l_i > 0
    denominator = tl.where(nonempty, l_i, 1.0)
    if NUM_SPLITS == 1 and HAS_SINKS:  # the sink joins the one chunk's denominator
        sinks = tl.load(sinks_ptr + heads, mask=mask_h, other=0.0).to(tl.float32)
        denominator = add_sink(l_i, m_i, sinks)
    store_heads_split(acc / denominator[:, None], m_i, l_i, o_ptr, part_o_ptr, part_lse_ptr,
                      req, heads, split, offs_d, mask_h, mask_d, stride_ob, stride_oh,
                      num_heads, WIDTH=HEAD_DIM, NUM_SPLITS=NUM_SPLITS)


@triton.jit
def store_heads_split(
    out,  # [BLOCK_H, BLOCK_D] float32: the heads' normalised output over this split
    m_i,  # [BLOCK_H] running max (log2 domain)
    l_i,  # [BLOCK_H] softmax denominators (0: the split saw no key)
    o_ptr,
    part_o_ptr,
    part_lse_ptr,
    req,
    heads,  # [BLOCK_H] query heads
    split,
    offs_d,
    mask_h,
    mask_d,
    stride_ob,
    stride_oh,
    num_heads,
    WIDTH: tl.constexpr,  # the output's dims per head
    NUM_SPLITS: tl.constexpr,
):
    """A block of heads' result of one KV split: the output itself with one split, else the
    partial output and its log-sum-exp (-inf for an empty split) for _decode_stage2 to merge.
    The grouped decode kernel and the latent decode kernel (mla_attention.py) end here."""
    nonempty = l_i > 0
    mask_hd = mask_h[:, None] & mask_d[None, :]
    if NUM_SPLITS == 1:
        o_rows = o_ptr + req.to(tl.int64) * stride_ob + heads * stride_oh  # [BLOCK_H]
        tl.store(o_rows[:, None] + offs_d[None, :], out.to(o_ptr.dtype.element_ty), mask=mask_hd)
    else:
        lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
        part_rows = (req.to(tl.int64) * num_heads + heads) * NUM_SPLITS + split  # [BLOCK_H]
        o_ptrs = part_o_ptr + part_rows[:, None] * WIDTH + offs_d[None, :]
        tl.store(o_ptrs, out, mask=mask_hd)
        tl.store(part_lse_ptr + part_rows, lse, mask=mask_h)


@triton.jit
def _decode_stage2(
    part_o_ptr,  # [bs, num_heads, NUM_SPLITS, head_dim] float32
    part_lse_ptr,  # [bs, num_heads, NUM_SPLITS] float32
    o_ptr,  # [bs, num_heads, head_dim]
    sinks_ptr,  # [num_heads] (HAS_SINKS)
    stride_ob,
    stride_oh,
    num_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < NUM_SPLITS
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    first = (req.to(tl.int64) * num_heads + head) * NUM_SPLITS
    lse = tl.load(part_lse_ptr + first + offs_s, mask=mask_s, other=float("-inf"))  # [BLOCK_S]
    m = tl.reduce(lse, 0, MAX_COMBINE)
    m = tl.where(m > float("-inf"), m, 0.0)  # all chunks empty (a zero-length request): zeros
    if HAS_SINKS:  # natural log -> log2; the sink counts in the max too: exp2(sink - m) <= 1
        sink = tl.load(sinks_ptr + head).to(tl.float32) * 1.4426950408889634
        m = tl.maximum(m, sink)
    w = tl.exp2(lse - m)  # [BLOCK_S]; empty chunks weigh 0
    # an empty partial's output is not read (cascade_attention never writes its empty ones)
    mask_s = lse > float("-inf")
    parts_ptrs = part_o_ptr + (first + offs_s)[:, None] * HEAD_DIM + offs_d[None, :]
    parts = tl.load(parts_ptrs, mask=mask_s[:, None] & mask_d[None, :], other=0.0)
    total = tl.reduce(w, 0, SUM_COMBINE)
    if HAS_SINKS:  # joins the denominator, adds no value
        total += tl.exp2(sink - m)
    out = tl.reduce(w[:, None] * parts, 0, SUM_COMBINE) / tl.where(total > 0, total, 1.0)
    o_ptrs = o_ptr + req.to(tl.int64) * stride_ob + head * stride_oh + offs_d
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=mask_d)


def default_num_kv_splits(
    batch_size: int, num_kv_heads: int, device: torch.device, max_kv_len: int | None = None
) -> int:
    """Enough chunks to give every compute unit about two programs, at most MAX_KV_SPLITS, and
    (when the longest request is known) no chunks shorter than MIN_KEYS_PER_SPLIT on average."""
    programs = max(1, batch_size * num_kv_heads)
    splits = triton.cdiv(2 * num_compute_units(device), programs)
    if max_kv_len is not None:
        splits = min(splits, triton.cdiv(max(max_kv_len, 1), MIN_KEYS_PER_SPLIT))
    return max(1, min(MAX_KV_SPLITS, splits))


def decode_workspace_numel(
    batch_size: int, num_heads: int, head_dim: int, num_kv_splits: int
) -> int:
    """float32 elements of the stage-1 partial results (outputs and log-sum-exps); none for one
    split, where stage 1 writes the output itself."""
    if num_kv_splits == 1:
        return 0
    return batch_size * num_heads * num_kv_splits * (head_dim + 1)


def decode_attention(
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
    num_kv_splits: int | None = None,
    workspace: Tensor | None = None,
    grouped: bool | None = None,
    max_kv_len: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
) -> None:
    """Attention of each request's one new token over its whole KV, written into o.

    q, o: [bs, num_heads, head_dim]; k_cache, v_cache: [num_slots + 1, num_kv_heads, head_dim];
    kv_indptr: [bs + 1] int; kv_indices: [sum(seq_lens)] int; every request needs >= 1 position.
    num_kv_splits: chunks per request (default: default_num_kv_splits). workspace: a float32
    tensor of >= decode_workspace_numel(...) elements (default: allocated here). grouped: serve
    all query heads of a KV head in one program (default: when there is GQA). With num_kv_splits
    and workspace given the call allocates nothing and never synchronises: CUDA graphs capture it.
    sliding_window, logit_cap, sinks: as in the reference (None, 0 and None: off); a window also
    bounds the keys per request that the default split count assumes.
    """
    check_kv_args(q, k_cache, v_cache)
    check_sinks(sinks, q.shape[1])
    if o.shape != q.shape or o.stride(2) != 1:
        raise ValueError(f"o {tuple(o.shape)} must be shaped like q {tuple(q.shape)}")
    batch_size, num_heads, head_dim = q.shape
    if kv_indptr.numel() != batch_size + 1:
        raise ValueError(f"kv_indptr has {kv_indptr.numel()} entries for {batch_size} requests")
    if batch_size == 0:
        return
    num_kv_heads = k_cache.shape[1]
    kv_group = num_heads // num_kv_heads
    if sliding_window is not None and max_kv_len is not None:
        max_kv_len = min(max_kv_len, sliding_window)
    splits = num_kv_splits or default_num_kv_splits(batch_size, num_kv_heads, q.device, max_kv_len)
    numel = decode_workspace_numel(batch_size, num_heads, head_dim, splits)
    if workspace is None:
        workspace = torch.empty(max(numel, 1), dtype=torch.float32, device=q.device)
    elif workspace.dtype != torch.float32 or workspace.numel() < numel:
        raise ValueError(f"workspace must be float32 with >= {numel} elements")
    part_o = workspace[: numel - batch_size * num_heads * splits]
    part_lse = workspace[numel - batch_size * num_heads * splits : numel]
    bd = block_dim(head_dim)
    bn = block_n or (_INTERPRETER_BLOCK_N if interpreting() else _GPU_BLOCK_N)
    scores = (sm_scale * _LOG2E, sliding_window or 0, logit_cap * _LOG2E)
    sinks_arg = q if sinks is None else sinks  # never read without sinks
    options = dict(WINDOWED=sliding_window is not None, SOFT_CAP=logit_cap > 0,
                   HAS_SINKS=sinks is not None)  # fmt: skip
    strides = (
        q.stride(0), q.stride(1), o.stride(0), o.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
    )  # fmt: skip
    if grouped if grouped is not None else kv_group > 1:
        dot_dtype, precision = dot_dtype_and_precision(q.dtype)
        _decode_grouped_stage1[(batch_size, num_kv_heads, splits)](
            q, o, k_cache, v_cache, kv_indptr, kv_indices, sinks_arg, part_o, part_lse, *scores,
            *strides, num_heads, kv_group,
            HEAD_DIM=head_dim, BLOCK_D=bd, BLOCK_N=bn,
            BLOCK_H=max(16, triton.next_power_of_2(kv_group)), NUM_SPLITS=splits,
            DOT_DTYPE=dot_dtype, PRECISION=precision, **options, num_warps=num_warps,
            num_stages=num_stages,
        )  # fmt: skip
    else:
        _decode_stage1[(batch_size, num_heads, splits)](
            q, o, k_cache, v_cache, kv_indptr, kv_indices, sinks_arg, part_o, part_lse, *scores,
            *strides, num_heads, kv_group,
            HEAD_DIM=head_dim, BLOCK_D=bd, BLOCK_N=bn, NUM_SPLITS=splits, **options,
            num_warps=num_warps, num_stages=num_stages,
        )  # fmt: skip
    if splits == 1:  # stage 1 wrote the outputs
        return
    _decode_stage2[(batch_size, num_heads)](
        part_o, part_lse, o, sinks_arg, o.stride(0), o.stride(1), num_heads,
        HEAD_DIM=head_dim, BLOCK_D=bd, NUM_SPLITS=splits,
        BLOCK_S=triton.next_power_of_2(splits), HAS_SINKS=sinks is not None, num_warps=num_warps,
    )  # fmt: skip
