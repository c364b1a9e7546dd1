"""Multi-head latent attention (DeepSeek's MLA, absorbed form) on the paged latent KV pool
(Triton): mla_decode_attention (split-KV) and mla_extend_attention (causal, ragged).

Same arguments and layout as radixrt.kernels.mla_reference, their PyTorch references: every
token keeps ONE row of kv_cache [num_slots + 1, 1, head_dim_k], head_dim_k = value_dim +
rope_dim (DeepSeek-V3: 512 + 64); its key is the whole row and its value the first value_dim
dims (the latent), shared by all num_heads query heads. So a program serves many query rows at
once: it loads a [BLOCK_N, BLOCK_D] latent tile and a [BLOCK_DPE, BLOCK_N] rope tile once per
BLOCK_N positions, scores them for all its rows as q_latent @ latent^T + q_rope @ rope (two
tl.dots; BLOCK_D = value_dim and BLOCK_DPE = rope_dim padded to powers of two), and multiplies
the probabilities by the same latent tile for the values (_attend_latent_tiles).

Decode: one program per (request, block of BLOCK_H heads, KV split) writes each head's
normalised partial output and log-sum-exp, and decode_attention's stage 2 merges the splits
(with one split stage 1 writes o itself); the split count, the workspace and its size are
decode_attention's (default_num_kv_splits, decode_workspace_numel with head_dim = value_dim).
Extend: one program per (request, block of heads, block of new tokens) runs BLOCK_M tokens x
BLOCK_H heads as the rows of one tile (a decode-like request with few new tokens fills the
rows with heads instead), each row seeing positions 0..prefix_len + its token's index.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from radixrt.kernels.decode_attention import _decode_stage2 as _merge_splits  # the same merge
from radixrt.kernels.decode_attention import (
    _split_range,
    decode_workspace_numel,
    default_num_kv_splits,
    store_heads_split,
)
from radixrt.kernels.mla_reference import check_indptr, check_mla_args
from radixrt.kernels.triton_utils import (
    MAX_COMBINE,
    SUM_COMBINE,
    block_dim,
    dot_dtype_and_precision,
    interpreting,
)

_LOG2E = math.log2(math.e)
_DECODE_BLOCK_H = 16  # query heads per decode program (>= 16: tl.dot's smallest M)
_DECODE_BLOCK_N = 32  # KV positions per decode tile: a 32 x 512 latent tile in V3


def mla_head_blocks(num_heads: int) -> int:
    """Decode programs per request and split: one per block of query heads (what
    default_num_kv_splits counts as programs, in place of KV heads)."""
    return triton.cdiv(num_heads, _DECODE_BLOCK_H)


@triton.jit
def _attend_latent_tiles(
    q_latent,  # [ROWS, BLOCK_D] in DOT_DTYPE
    q_rope,  # [ROWS, BLOCK_DPE] in DOT_DTYPE
    q_pos,  # [ROWS] each row's position (CAUSAL only; anything otherwise)
    indices_ptr,  # slots of the key positions
    start,  # offset of position 0 in indices_ptr
    lo,  # first and one past the last position of this program's range
    hi,
    kv_cache_ptr,  # [num_slots + 1, 1, head_dim_k]
    stride_kt,
    offs_d,  # [BLOCK_D] 0.., masked to value_dim
    mask_d,
    offs_dpe,  # [BLOCK_DPE] value_dim.., masked to head_dim_k
    mask_dpe,
    scale_log2,  # scale * log2(e)
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    CAUSAL: tl.constexpr,  # row r sees positions <= q_pos[r] only
):
    """Online softmax of ROWS queries over the latent rows at positions lo..hi-1, each tile read
    once for all rows. Every row must see a key of the first tile. Returns the running max m_i
    [ROWS] (log2 domain), the sum l_i [ROWS] and the unnormalised output acc [ROWS, BLOCK_D]."""
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        slots = tl.load(indices_ptr + start + offs_n, mask=mask_n, other=0).to(tl.int64)
        rows = kv_cache_ptr + slots * stride_kt  # [BLOCK_N]
        latent_ptrs = rows[:, None] + offs_d[None, :]
        latent = tl.load(latent_ptrs, mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        latent = latent.to(DOT_DTYPE)  # [BLOCK_N, BLOCK_D]: keys' first part and the values
        rope_ptrs = rows[None, :] + offs_dpe[:, None]
        rope = tl.load(rope_ptrs, mask=mask_dpe[:, None] & mask_n[None, :], other=0.0)
        qk = tl.dot(q_latent, tl.trans(latent), input_precision=PRECISION)  # [ROWS, BLOCK_N]
        qk = tl.dot(q_rope, rope.to(DOT_DTYPE), acc=qk, input_precision=PRECISION)
        qk = qk * scale_log2
        visible = mask_n[None, :]  # [1 or ROWS, BLOCK_N]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= q_pos[:, None])
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(qk, 1, MAX_COMBINE))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])  # [ROWS, BLOCK_N]
        l_i = l_i * alpha + tl.reduce(p, 1, SUM_COMBINE)
        pv = tl.dot(p.to(DOT_DTYPE), latent, input_precision=PRECISION)  # [ROWS, BLOCK_D]
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _load_queries(
    q_rows, heads, mask_rows, stride_qh, offs_d, mask_d, offs_dpe, mask_dpe,
    DOT_DTYPE: tl.constexpr,
):  # fmt: skip
    """The latent [ROWS, BLOCK_D] and rope [ROWS, BLOCK_DPE] parts of the queries at q_rows
    ([ROWS] pointers to their tokens) and heads [ROWS]; masked rows read zeros."""
    ptrs = q_rows[:, None] + heads[:, None] * stride_qh  # [ROWS, 1]
    q_latent = tl.load(ptrs + offs_d[None, :], mask=mask_rows[:, None] & mask_d[None, :], other=0.0)
    q_rope = tl.load(ptrs + offs_dpe[None, :], mask=mask_rows[:, None] & mask_dpe[None, :],
                     other=0.0)  # fmt: skip
    return q_latent.to(DOT_DTYPE), q_rope.to(DOT_DTYPE)


@triton.jit
def _mla_decode_stage1(
    q_ptr,  # [bs, num_heads, head_dim_k]
    o_ptr,  # [bs, num_heads, value_dim]: written directly when NUM_SPLITS == 1
    kv_cache_ptr,  # [num_slots + 1, 1, head_dim_k]
    kv_indptr_ptr,  # [bs + 1]
    kv_indices_ptr,  # [sum(seq_lens)]
    part_o_ptr,  # [bs, num_heads, NUM_SPLITS, value_dim] float32
    part_lse_ptr,  # [bs, num_heads, NUM_SPLITS] float32
    scale_log2,
    stride_qb,
    stride_qh,
    stride_ob,
    stride_oh,
    stride_kt,
    num_heads,
    VALUE_DIM: tl.constexpr,
    HEAD_DIM_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DPE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,  # query heads per program, >= 16 (tl.dot)
    NUM_SPLITS: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    req = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    split = tl.program_id(2)
    mask_h = heads < num_heads
    kv_start = tl.load(kv_indptr_ptr + req).to(tl.int64)
    kv_len = tl.load(kv_indptr_ptr + req + 1).to(tl.int64) - kv_start
    lo, hi = _split_range(kv_len, 0, split, NUM_SPLITS, False)

    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < VALUE_DIM
    offs_dpe = VALUE_DIM + tl.arange(0, BLOCK_DPE)
    mask_dpe = offs_dpe < HEAD_DIM_K
    q_rows = q_ptr + req.to(tl.int64) * stride_qb + tl.zeros([BLOCK_H], tl.int64)  # [BLOCK_H]
    q_latent, q_rope = _load_queries(
        q_rows, heads, mask_h, stride_qh, offs_d, mask_d, offs_dpe, mask_dpe, DOT_DTYPE
    )
    m_i, l_i, acc = _attend_latent_tiles(
        q_latent, q_rope, 0, kv_indices_ptr, kv_start, lo, hi, kv_cache_ptr, stride_kt,
        offs_d, mask_d, offs_dpe, mask_dpe, scale_log2,
        ROWS=BLOCK_H, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, DOT_DTYPE=DOT_DTYPE,
        PRECISION=PRECISION, CAUSAL=False,
    )  # fmt: skip
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # [BLOCK_H, BLOCK_D] (an empty split: 0)
    store_heads_split(out, m_i, l_i, o_ptr, part_o_ptr, part_lse_ptr, req, heads, split, offs_d,
                      mask_h, mask_d, stride_ob, stride_oh, num_heads, WIDTH=VALUE_DIM,
                      NUM_SPLITS=NUM_SPLITS)


@triton.jit
def _mla_extend_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim_k]
    o_ptr,  # [num_tokens, num_heads, value_dim]
    kv_cache_ptr,  # [num_slots + 1, 1, head_dim_k]
    qo_indptr_ptr,  # [bs + 1]
    kv_indptr_ptr,  # [bs + 1]
    kv_indices_ptr,  # [sum(seq_lens)]
    scale_log2,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kt,
    num_heads,
    VALUE_DIM: tl.constexpr,
    HEAD_DIM_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DPE: tl.constexpr,
    BLOCK_M: tl.constexpr,  # new tokens per program ...
    BLOCK_H: tl.constexpr,  # ... times heads per program
    ROWS: tl.constexpr,  # = BLOCK_M * BLOCK_H, >= 16 (tl.dot)
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    req = tl.program_id(0)
    head_block = tl.program_id(1)
    block_m = tl.program_id(2)
    q_start = tl.load(qo_indptr_ptr + req).to(tl.int64)
    q_len = tl.load(qo_indptr_ptr + req + 1).to(tl.int64) - q_start
    if block_m * BLOCK_M < q_len:
        kv_start = tl.load(kv_indptr_ptr + req).to(tl.int64)
        prefix_len = tl.load(kv_indptr_ptr + req + 1).to(tl.int64) - kv_start - q_len
        offs_r = tl.arange(0, ROWS)
        offs_m = block_m * BLOCK_M + offs_r // BLOCK_H  # [ROWS] each row's token in the request
        heads = head_block * BLOCK_H + offs_r % BLOCK_H  # [ROWS] each row's head
        mask_rows = (offs_m < q_len) & (heads < num_heads)
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < VALUE_DIM
        offs_dpe = VALUE_DIM + tl.arange(0, BLOCK_DPE)
        mask_dpe = offs_dpe < HEAD_DIM_K
        tokens = q_start + offs_m  # [ROWS] int64
        q_latent, q_rope = _load_queries(
            q_ptr + tokens * stride_qt, heads, mask_rows, stride_qh, offs_d, mask_d, offs_dpe,
            mask_dpe, DOT_DTYPE,
        )  # fmt: skip
        # every row sees position 0; none sees past the block's last token
        kv_end = prefix_len + tl.minimum(q_len, (block_m + 1) * BLOCK_M)
        m_i, l_i, acc = _attend_latent_tiles(
            q_latent, q_rope, prefix_len + offs_m, kv_indices_ptr, kv_start, 0, kv_end,
            kv_cache_ptr, stride_kt, offs_d, mask_d, offs_dpe, mask_dpe, scale_log2,
            ROWS=ROWS, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, DOT_DTYPE=DOT_DTYPE,
            PRECISION=PRECISION, CAUSAL=True,
        )  # fmt: skip
        out = acc / l_i[:, None]  # [ROWS, BLOCK_D]
        o_ptrs = o_ptr + tokens[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=mask_rows[:, None] & mask_d[None, :])


def _dims(q: Tensor, value_dim: int) -> dict[str, int]:
    """The head-dim constexprs of both kernels."""
    head_dim_k = q.shape[2]
    return dict(VALUE_DIM=value_dim, HEAD_DIM_K=head_dim_k, BLOCK_D=block_dim(value_dim),
                BLOCK_DPE=block_dim(head_dim_k - value_dim))  # fmt: skip


def mla_decode_attention(
    q: Tensor,
    o: Tensor,
    kv_cache: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    scale: float,
    value_dim: int,
    *,
    num_kv_splits: int | None = None,
    workspace: Tensor | None = None,
) -> None:
    """Attention of each request's one new token over its whole latent KV, written into o.

    q: [bs, num_heads, head_dim_k]; o: [bs, num_heads, value_dim]; kv_cache: [num_slots + 1, 1,
    head_dim_k]; kv_indptr: [bs + 1] int; kv_indices: [sum(seq_lens)] int; every request needs
    >= 1 position. num_kv_splits: chunks per request (default: default_num_kv_splits over the
    programs per request, one per block of heads). workspace: float32, >=
    decode_workspace_numel(bs, num_heads, value_dim, num_kv_splits) elements (default: allocated
    here). With both given the call allocates nothing and never synchronises (CUDA graphs).
    """
    check_mla_args(q, o, kv_cache, value_dim)
    batch_size, num_heads, _ = q.shape
    check_indptr("kv_indptr", kv_indptr, batch_size)
    if num_kv_splits is not None and num_kv_splits < 1:
        raise ValueError(f"num_kv_splits must be >= 1, got {num_kv_splits}")
    if batch_size == 0:
        return
    head_blocks = mla_head_blocks(num_heads)
    splits = num_kv_splits or default_num_kv_splits(batch_size, head_blocks, q.device)
    numel = decode_workspace_numel(batch_size, num_heads, value_dim, splits)
    if workspace is None:
        workspace = torch.empty(max(numel, 1), dtype=torch.float32, device=q.device)
    elif workspace.dtype != torch.float32 or workspace.numel() < numel:
        raise ValueError(f"workspace must be float32 with >= {numel} elements")
    lse_numel = batch_size * num_heads * splits
    part_o = workspace[: numel - lse_numel]  # [bs, num_heads, splits, value_dim]
    part_lse = workspace[numel - lse_numel : numel]  # [bs, num_heads, splits]
    dot_dtype, precision = dot_dtype_and_precision(q.dtype)
    dims = _dims(q, value_dim)
    _mla_decode_stage1[(batch_size, head_blocks, splits)](
        q, o, kv_cache, kv_indptr, kv_indices, part_o, part_lse, scale * _LOG2E,
        q.stride(0), q.stride(1), o.stride(0), o.stride(1), kv_cache.stride(0), num_heads,
        **dims, BLOCK_N=_DECODE_BLOCK_N, BLOCK_H=_DECODE_BLOCK_H, NUM_SPLITS=splits,
        DOT_DTYPE=dot_dtype, PRECISION=precision, num_warps=4, num_stages=2,
    )  # fmt: skip
    if splits == 1:  # stage 1 wrote the outputs
        return
    _merge_splits[(batch_size, num_heads)](
        part_o, part_lse, o, part_lse, o.stride(0), o.stride(1), num_heads,
        HEAD_DIM=value_dim, BLOCK_D=dims["BLOCK_D"], NUM_SPLITS=splits,
        BLOCK_S=triton.next_power_of_2(splits), HAS_SINKS=False, num_warps=4,
    )  # fmt: skip


def _extend_blocks(num_heads: int, value_dim: int, max_extend_len: int) -> dict[str, int]:
    """ROWS query rows per program (BLOCK_M tokens x BLOCK_H heads: heads fill the rows that a
    request's few new tokens leave), BLOCK_N and num_warps, for the GPU or the interpreter."""
    if interpreting() or block_dim(value_dim) > 128:  # V3's 512-dim latent: a 32 x 512 acc
        rows, block_n, num_warps = 32, 32, 4 if interpreting() else 8
    else:
        rows, block_n, num_warps = 64, 64, 4
    block_h = min(triton.next_power_of_2(num_heads),
                  max(1, rows // triton.next_power_of_2(max_extend_len)))  # fmt: skip
    return dict(BLOCK_M=rows // block_h, BLOCK_H=block_h, ROWS=rows, BLOCK_N=block_n,
                num_warps=num_warps)  # fmt: skip


def mla_extend_attention(
    q: Tensor,
    o: Tensor,
    kv_cache: Tensor,
    qo_indptr: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    scale: float,
    value_dim: int,
    *,
    max_extend_len: int | None = None,
) -> None:
    """Attention of each request's new tokens over its prefix and, causally, themselves.

    q: [num_tokens, num_heads, head_dim_k]; o: [num_tokens, num_heads, value_dim]; kv_cache:
    [num_slots + 1, 1, head_dim_k]; qo_indptr, kv_indptr: [bs + 1] int; kv_indices:
    [sum(seq_lens)] int, each request's prefix then its new tokens (already stored).
    max_extend_len: the longest request's new-token count; reading it from qo_indptr costs a
    host synchronisation, so callers that know it pass it.
    """
    check_mla_args(q, o, kv_cache, value_dim)
    batch_size = qo_indptr.numel() - 1
    check_indptr("kv_indptr", kv_indptr, batch_size)
    if batch_size <= 0 or q.shape[0] == 0:
        return
    if max_extend_len is None:
        max_extend_len = int((qo_indptr[1:] - qo_indptr[:-1]).max().item())
    if max_extend_len <= 0:
        return
    num_heads = q.shape[1]
    blocks = _extend_blocks(num_heads, value_dim, max_extend_len)
    dot_dtype, precision = dot_dtype_and_precision(q.dtype)
    grid = (batch_size, triton.cdiv(num_heads, blocks["BLOCK_H"]),
            triton.cdiv(max_extend_len, blocks["BLOCK_M"]))  # fmt: skip
    _mla_extend_kernel[grid](
        q, o, kv_cache, qo_indptr, kv_indptr, kv_indices, scale * _LOG2E,
        q.stride(0), q.stride(1), o.stride(0), o.stride(1), kv_cache.stride(0), num_heads,
        **_dims(q, value_dim), **blocks, DOT_DTYPE=dot_dtype, PRECISION=precision,
        num_stages=2,
    )  # fmt: skip
