"""cascade_decode_attention: decode attention where groups of requests share a KV prefix, the
prefix's K/V read once per group instead of once per request (Triton, "cascade attention").

Same arguments as radixrt.kernels.reference.cascade_decode_attention_ref, its PyTorch reference.
Attention over prefix + own KV is split into partial attentions over disjoint key sets, each
normalised with its log-sum-exp (log2 domain), and merged by those at the end:

1. own KV: one program per (request, KV head, own chunk) serves all query heads of the KV head
   with tl.dot, like decode_attention's grouped stage 1. It also marks the request's prefix
   partials empty (log-sum-exp -inf), so a request in no group merges its own KV alone.
2. prefix: one program per (group, KV head, query block, prefix chunk). A query block is
   BLOCK_M rows of the group's (member, query head of this KV head) pairs, so every K/V tile
   of the chunk is loaded once and attended by all of them in one [BLOCK_M, BLOCK_N] tl.dot.
   Launched after step 1, it overwrites the group members' prefix partials.
3. merge: per (request, query head), the partials weighted by exp2(lse - max lse), by
   decode_attention's stage 2 (which skips partials with a log-sum-exp of -inf). Attention
   sinks join the denominator here, once, as in decode_attention (the partials exclude them).

Both partial steps are one kernel, _cascade_partial: a "segment" (a request's own KV, or a
group's prefix) is a slot range plus the query rows attending to it. Chunks are aligned to
BLOCK_N. Partials live in one float32 workspace: outputs [bs, num_heads, splits, head_dim] and
log-sum-exps [bs, num_heads, splits], own chunks first, then prefix chunks. Without groups
(or with empty ones) the call is decode_attention.

A logit cap soft-caps every score in both partial steps (the merge is unchanged: it only
weighs the partials by their log-sum-exps). There is no sliding window, as in the reference: a
windowed layer decodes with decode_attention, and the backends use this kernel for one only
when its window covers every request's whole KV (where it hides nothing).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from radixrt.kernels.decode_attention import _decode_stage2 as _cascade_merge  # the same merge
from radixrt.kernels.decode_attention import decode_attention, default_num_kv_splits
from radixrt.kernels.triton_utils import (
    attend_tiles,
    block_dim,
    check_kv_args,
    check_sinks,
    dot_dtype_and_precision,
    interpreting,
    num_compute_units,
)

_LOG2E = math.log2(math.e)
MAX_PREFIX_SPLITS = 16
MIN_PREFIX_KEYS_PER_SPLIT = 256  # keeps the partials' traffic well below the prefix's
_GPU_BLOCK_M, _GPU_BLOCK_N = 64, 64
_INTERPRETER_BLOCK_M, _INTERPRETER_BLOCK_N = 32, 32


@triton.jit
def _cascade_partial(
    q_ptr,  # [bs, num_heads, head_dim]
    k_cache_ptr,  # [num_slots + 1, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_slots + 1, num_kv_heads, head_dim]
    seg_indptr_ptr,  # [num_segments + 1]: segment s's KV is seg_indices[seg_indptr[s]:...[s+1]]
    seg_indices_ptr,  # [sum(segment lens)] slots
    rows_indptr_ptr,  # [num_segments + 1] (GROUPS): segment s's rows are rows[...[s]:...[s+1]]
    rows_ptr,  # [sum(group sizes)] (GROUPS); without GROUPS segment s is row s
    part_o_ptr,  # [bs, num_heads, TOTAL_SPLITS, head_dim] float32
    part_lse_ptr,  # [bs, num_heads, TOTAL_SPLITS] float32 (log2 domain)
    scale_log2,
    cap_log2,  # logit_cap * log2(e) (SOFT_CAP)
    stride_qb,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    num_heads,
    kv_group,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,  # >= 16 (tl.dot); without GROUPS also >= kv_group
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,  # chunks per segment in this launch
    SPLIT_BASE: tl.constexpr,  # this launch's first chunk index in the partials
    TOTAL_SPLITS: tl.constexpr,
    BLOCK_C: tl.constexpr,  # > 0: mark partials NUM_SPLITS..TOTAL_SPLITS-1 of the rows empty
    GROUPS: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    SOFT_CAP: tl.constexpr,
):
    seg = tl.program_id(0)
    kv_head = tl.program_id(1)
    query_blocks = tl.num_programs(2) // NUM_SPLITS  # neighbouring programs read the same chunk
    split = tl.program_id(2) // query_blocks
    block_start = (tl.program_id(2) % query_blocks) * BLOCK_M
    offs_m = block_start + tl.arange(0, BLOCK_M)  # [BLOCK_M] (member, query head) pairs
    seg_start = tl.load(seg_indptr_ptr + seg).to(tl.int64)
    seg_len = tl.load(seg_indptr_ptr + seg + 1).to(tl.int64) - seg_start
    split_len = ((seg_len + NUM_SPLITS - 1) // NUM_SPLITS + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    lo = split * split_len
    hi = tl.minimum(lo + split_len, seg_len)
    if GROUPS:
        first = tl.load(rows_indptr_ptr + seg).to(tl.int64)
        num_rows = tl.load(rows_indptr_ptr + seg + 1).to(tl.int64) - first
        member = offs_m // kv_group
        mask_m = member < num_rows
        rows = tl.load(rows_ptr + first + member, mask=mask_m, other=0).to(tl.int64)
        hi = tl.where(block_start < num_rows * kv_group, hi, lo)  # a block past the group: idle
    else:
        mask_m = offs_m < kv_group
        rows = tl.zeros([BLOCK_M], tl.int64) + seg
    heads = kv_head * kv_group + offs_m % kv_group  # [BLOCK_M] query heads
    lse_rows = (rows * num_heads + heads) * TOTAL_SPLITS  # [BLOCK_M] first partial of each row
    if BLOCK_C > 0:
        offs_c = NUM_SPLITS + tl.arange(0, BLOCK_C)
        limit = tl.where(split == 0, TOTAL_SPLITS, NUM_SPLITS)  # chunk 0's programs do it
        mask_c = mask_m[:, None] & (offs_c[None, :] < limit)
        empty = tl.full([BLOCK_M, BLOCK_C], float("-inf"), tl.float32)
        tl.store(part_lse_ptr + lse_rows[:, None] + offs_c[None, :], empty, mask=mask_c)

    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    mask_md = mask_m[:, None] & mask_d[None, :]
    q_ptrs = q_ptr + rows[:, None] * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=mask_md, other=0.0).to(DOT_DTYPE)  # [BLOCK_M, BLOCK_D]
    m_i, l_i, acc = attend_tiles(
        q, 0, seg_indices_ptr, seg_start, lo, hi, k_cache_ptr, v_cache_ptr,
        stride_kt, stride_kh, stride_vt, stride_vh, kv_head, offs_d, mask_d, scale_log2, 0,
        cap_log2, ROWS=BLOCK_M, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, DOT_DTYPE=DOT_DTYPE,
        PRECISION=PRECISION, CAUSAL=False, WINDOWED=False, SOFT_CAP=SOFT_CAP,
    )  # fmt: skip
    nonempty = l_i > 0  # an empty chunk stores zeros and a log-sum-exp of -inf
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    part_rows = lse_rows + SPLIT_BASE + split  # [BLOCK_M]
    tl.store(part_o_ptr + part_rows[:, None] * HEAD_DIM + offs_d[None, :], out, mask=mask_md)
    tl.store(part_lse_ptr + part_rows, lse, mask=mask_m)


def default_num_prefix_splits(
    num_groups: int, num_kv_heads: int, query_blocks: int, device: torch.device,
    prefix_tokens: int,
) -> int:  # fmt: skip
    """Prefix chunks per group: about two programs per compute unit, at most MAX_PREFIX_SPLITS,
    and chunks of at least MIN_PREFIX_KEYS_PER_SPLIT keys on average (prefix_tokens: all the
    groups' prefix slots, known without reading the device)."""
    programs = max(1, num_groups * num_kv_heads * query_blocks)
    splits = triton.cdiv(2 * num_compute_units(device), programs)
    mean_len = prefix_tokens // max(num_groups, 1)
    splits = min(splits, triton.cdiv(max(mean_len, 1), MIN_PREFIX_KEYS_PER_SPLIT))
    return max(1, min(MAX_PREFIX_SPLITS, splits))


def cascade_workspace_numel(
    batch_size: int, num_heads: int, head_dim: int, num_kv_splits: int, num_prefix_splits: int
) -> int:
    """float32 elements of the partial outputs and log-sum-exps (own and prefix chunks)."""
    return batch_size * num_heads * (num_kv_splits + num_prefix_splits) * (head_dim + 1)


def cascade_decode_attention(
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
    num_kv_splits: int | None = None,
    num_prefix_splits: int | None = None,
    max_group_size: int | None = None,
    max_kv_len: int | None = None,
    workspace: Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
) -> None:
    """Decode attention over each request's group prefix + own KV, written into o.

    q, o: [bs, num_heads, head_dim]; k_cache, v_cache: [num_slots + 1, num_kv_heads, head_dim];
    prefix_indptr, group_indptr: [num_groups + 1] int; prefix_indices: [sum(prefix lens)] int;
    group_rows: [sum(group sizes)] int (rows of q, each in at most one group);
    kv_indptr: [bs + 1] int; kv_indices: [sum(own lens)] int; every request owns >= 1 slot.
    num_kv_splits: own-KV chunks per request (default: default_num_kv_splits, with max_kv_len,
    the longest own KV, when given). num_prefix_splits: chunks per prefix (default:
    default_num_prefix_splits). max_group_size: the largest group's size, which sizes the grid
    and the query blocks (default: group_rows.numel(), an upper bound; blocks past a group's
    size idle). workspace: float32 of >= cascade_workspace_numel(...) elements (default:
    allocated here). block_m, block_n: the prefix kernel's query rows per block (default: the
    largest group's rows of a KV head, 16 to 64) and keys per tile. With the split counts and
    the workspace given the call allocates nothing and never synchronises: CUDA graphs
    capture it. logit_cap, sinks: as in the reference (0 and None: off).
    """
    check_kv_args(q, k_cache, v_cache)
    check_sinks(sinks, q.shape[1])
    if o.shape != q.shape or o.stride(2) != 1:
        raise ValueError(f"o {tuple(o.shape)} must be shaped like q {tuple(q.shape)}")
    batch_size, num_heads, head_dim = q.shape
    if kv_indptr.numel() != batch_size + 1:
        raise ValueError(f"kv_indptr has {kv_indptr.numel()} entries for {batch_size} requests")
    if prefix_indptr.numel() != group_indptr.numel() or group_indptr.numel() < 1:
        raise ValueError(
            f"prefix_indptr ({prefix_indptr.numel()}) and group_indptr "
            f"({group_indptr.numel()}) need num_groups + 1 entries each"
        )
    num_groups = group_indptr.numel() - 1
    if batch_size == 0:
        return
    num_kv_heads = k_cache.shape[1]
    kv_group = num_heads // num_kv_heads
    own_bound = max_kv_len or max(kv_indices.numel() - batch_size + 1, 1)
    own_splits = num_kv_splits or default_num_kv_splits(
        batch_size, num_kv_heads, q.device, own_bound
    )
    bn = block_n or (_INTERPRETER_BLOCK_N if interpreting() else _GPU_BLOCK_N)
    if num_groups == 0 or group_rows.numel() == 0:  # nothing shared: plain decode
        decode_attention(
            q, o, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, logit_cap=logit_cap,
            sinks=sinks, num_kv_splits=own_splits, workspace=workspace, block_n=bn,
            num_warps=num_warps, num_stages=num_stages,
        )  # fmt: skip
        return
    max_rows = (max_group_size or group_rows.numel()) * kv_group  # query rows of a KV head
    cap = _INTERPRETER_BLOCK_M if interpreting() else _GPU_BLOCK_M
    bm = block_m or min(cap, max(16, triton.next_power_of_2(max_rows)))
    query_blocks = triton.cdiv(max_rows, bm)
    prefix_splits = num_prefix_splits or default_num_prefix_splits(
        num_groups, num_kv_heads, query_blocks, q.device, prefix_indices.numel()
    )
    splits = own_splits + prefix_splits
    numel = cascade_workspace_numel(batch_size, num_heads, head_dim, own_splits, prefix_splits)
    if workspace is None:
        workspace = torch.empty(numel, dtype=torch.float32, device=q.device)
    elif workspace.dtype != torch.float32 or workspace.numel() < numel:
        raise ValueError(f"workspace must be float32 with >= {numel} elements")
    part_o = workspace[: batch_size * num_heads * splits * head_dim]
    part_lse = workspace[batch_size * num_heads * splits * head_dim : numel]
    dot_dtype, precision = dot_dtype_and_precision(q.dtype)
    bd = block_dim(head_dim)
    common = (
        part_o, part_lse, sm_scale * _LOG2E, logit_cap * _LOG2E, q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        num_heads, kv_group,
    )  # fmt: skip
    consts = dict(
        HEAD_DIM=head_dim, BLOCK_D=bd, BLOCK_N=bn, TOTAL_SPLITS=splits, DOT_DTYPE=dot_dtype,
        PRECISION=precision, SOFT_CAP=logit_cap > 0, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    # 1. own KV; also marks every request's prefix partials empty
    _cascade_partial[(batch_size, num_kv_heads, own_splits)](
        q, k_cache, v_cache, kv_indptr, kv_indices, group_indptr, group_rows, *common,
        BLOCK_M=max(16, triton.next_power_of_2(kv_group)), NUM_SPLITS=own_splits, SPLIT_BASE=0,
        BLOCK_C=triton.next_power_of_2(prefix_splits), GROUPS=False, **consts,
    )  # fmt: skip
    # 2. the shared prefixes, after step 1 (same stream): overwrites the members' partials
    _cascade_partial[(num_groups, num_kv_heads, query_blocks * prefix_splits)](
        q, k_cache, v_cache, prefix_indptr, prefix_indices, group_indptr, group_rows, *common,
        BLOCK_M=bm, NUM_SPLITS=prefix_splits, SPLIT_BASE=own_splits, BLOCK_C=0, GROUPS=True,
        **consts,
    )  # fmt: skip
    # 3. merge
    _cascade_merge[(batch_size, num_heads)](
        part_o, part_lse, o, q if sinks is None else sinks, o.stride(0), o.stride(1), num_heads,
        HEAD_DIM=head_dim, BLOCK_D=bd, NUM_SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits),
        HAS_SINKS=sinks is not None, num_warps=num_warps,
    )  # fmt: skip
