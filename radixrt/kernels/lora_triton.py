"""Batched LoRA products over segments of a batch (SGMV), Triton kernels equal to their PyTorch
references in radixrt/kernels/lora_reference.py (whose docstring gives the math and layouts):

    sgmv_shrink(x, a, seg_indptr, seg_slot)     t [T, R] float32 = x A[slot]^T per segment
    sgmv_expand(t, b, seg_indptr, seg_slot, y)  y [T, N] += t B[slot]^T per segment, in place

Both launch programs over (segment, block of BLOCK_M rows of it, block of output columns: R for
the shrink, N for the expand); the row-block axis covers the longest segment (read from
seg_indptr on the host unless the caller passes max_seg_len), and programs past their segment's
end, or of a segment with slot -1, return at once. The shrink loops over K in BLOCK_K steps, the
expand over R in BLOCK_R steps, with tl.dot into float32 accumulators (every block is at least
16 wide, tl.dot's minimum; tails of rows, K, R and N are masked). A segment's rows of y belong
to its programs alone, so the expand loads, adds and stores them: no atomics, deterministic.

Dots: the shrink multiplies x and A in their dtype (bfloat16 / float16 products are exact in
float32, float32 ones use "ieee" precision); the expand multiplies the float32 t with B widened
to float32, in TF32 on the GPU when B is bfloat16 / float16 (t rounded to 10 mantissa bits, finer
than bfloat16's 7) and "ieee" when B is float32. The interpreter runs every dot in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from radixrt.kernels.lora_reference import check_expand_args, check_shrink_args
from radixrt.kernels.triton_utils import dot_dtype_and_precision, interpreting

MIN_BLOCK = 16  # tl.dot needs at least 16 rows / columns / reduction elements
MAX_BLOCK_M = 64  # segment rows per program on the GPU
MAX_BLOCK_R = 64  # shrink: rank columns per program on the GPU (and the expand's R step)
_GPU_BLOCK_N = 64  # expand: output columns per program
_GPU_BLOCK_K = {torch.float32: 32, torch.bfloat16: 64, torch.float16: 64}  # shrink's K step
_GPU_NUM_WARPS = 4
_GPU_NUM_STAGES = 3
_INTERPRETER_MAX_BLOCK = 512  # the interpreter runs programs serially: fewer, larger tiles


@triton.jit
def _shrink_kernel(
    x_ptr,  # [T, K]
    a_ptr,  # [S, R, K]
    t_ptr,  # [T, R] float32 out (zeros beforehand)
    seg_indptr_ptr,  # [G + 1]
    seg_slot_ptr,  # [G]
    K,
    R,
    stride_xt,
    stride_as,
    stride_ar,
    stride_tt,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seg = tl.program_id(0)
    slot = tl.load(seg_slot_ptr + seg).to(tl.int64)
    end = tl.load(seg_indptr_ptr + seg + 1).to(tl.int64)
    row0 = tl.load(seg_indptr_ptr + seg).to(tl.int64) + tl.program_id(1) * BLOCK_M
    if (slot < 0) | (row0 >= end):  # no adapter, or past the segment's rows
        return
    offs_m = row0 + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows
    mask_m = offs_m < end
    offs_r = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R] rank columns
    mask_r = offs_r < R
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xt + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    a_ptrs = a_ptr + slot * stride_as + offs_r[None, :] * stride_ar + offs_k[:, None]  # [K, R]
    acc = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)
    for k_start in range(0, K, BLOCK_K):
        mask_k = offs_k < K - k_start
        xs = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0).to(DOT_DTYPE)
        a_t = tl.load(a_ptrs, mask=mask_k[:, None] & mask_r[None, :], other=0.0).to(DOT_DTYPE)
        acc += tl.dot(xs, a_t, input_precision=PRECISION)
        x_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
    t_ptrs = t_ptr + offs_m[:, None] * stride_tt + offs_r[None, :]
    tl.store(t_ptrs, acc, mask=mask_m[:, None] & mask_r[None, :])


@triton.jit
def _expand_kernel(
    t_ptr,  # [T, R] float32
    b_ptr,  # [S, N, R]
    y_ptr,  # [T, N] in and out
    seg_indptr_ptr,  # [G + 1]
    seg_slot_ptr,  # [G]
    N,
    R,
    stride_tt,
    stride_bs,
    stride_bn,
    stride_yt,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seg = tl.program_id(0)
    slot = tl.load(seg_slot_ptr + seg).to(tl.int64)
    end = tl.load(seg_indptr_ptr + seg + 1).to(tl.int64)
    row0 = tl.load(seg_indptr_ptr + seg).to(tl.int64) + tl.program_id(1) * BLOCK_M
    if (slot < 0) | (row0 >= end):  # no adapter (y untouched), or past the segment's rows
        return
    offs_m = row0 + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows
    mask_m = offs_m < end
    offs_n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] output columns
    mask_n = offs_n < N
    offs_r = tl.arange(0, BLOCK_R)
    t_ptrs = t_ptr + offs_m[:, None] * stride_tt + offs_r[None, :]  # [BLOCK_M, BLOCK_R]
    b_ptrs = b_ptr + slot * stride_bs + offs_n[None, :] * stride_bn + offs_r[:, None]  # [R, N]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for r_start in range(0, R, BLOCK_R):
        mask_r = offs_r < R - r_start
        ts = tl.load(t_ptrs, mask=mask_m[:, None] & mask_r[None, :], other=0.0)
        b_t = tl.load(b_ptrs, mask=mask_r[:, None] & mask_n[None, :], other=0.0).to(tl.float32)
        acc += tl.dot(ts, b_t, input_precision=PRECISION)
        t_ptrs += BLOCK_R
        b_ptrs += BLOCK_R
    y_ptrs = y_ptr + offs_m[:, None] * stride_yt + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptrs, (y + acc).to(y_ptr.dtype.element_ty), mask=mask)


def _fit(dim: int, cap: int) -> int:
    """A power-of-two block covering dim up to cap, at least MIN_BLOCK."""
    return max(MIN_BLOCK, min(cap, triton.next_power_of_2(max(dim, 1))))


def _launch_options() -> dict[str, int]:
    return {"num_warps": 1, "num_stages": 1} if interpreting() else {
        "num_warps": _GPU_NUM_WARPS, "num_stages": _GPU_NUM_STAGES}  # fmt: skip


def _segments_on(device: torch.device, seg_indptr: Tensor, seg_slot: Tensor,
                 max_seg_len: int | None) -> tuple[Tensor, Tensor, int]:  # fmt: skip
    """The segments as contiguous int64 tensors on device, and the longest segment's rows (read
    back from seg_indptr, a host synchronisation, unless given)."""
    seg_indptr = seg_indptr.to(device=device, dtype=torch.int64).contiguous()
    seg_slot = seg_slot.to(device=device, dtype=torch.int64).contiguous()
    if max_seg_len is None:
        lengths = seg_indptr[1:] - seg_indptr[:-1]
        max_seg_len = int(lengths.max().item()) if lengths.numel() else 0
    return seg_indptr, seg_slot, max_seg_len


def sgmv_shrink(x: Tensor, a: Tensor, seg_indptr: Tensor, seg_slot: Tensor, *,
                max_seg_len: int | None = None, block_m: int | None = None,
                block_r: int | None = None, block_k: int | None = None) -> Tensor:  # fmt: skip
    """x [T, K], a [S, R, K] (x's dtype) -> t [T, R] float32: x[rows] @ a[slot].T per segment,
    zeros for rows of slot -1 (lora_reference.sgmv_shrink_ref). max_seg_len, when given, must be
    at least the longest segment; block_m / block_r / block_k override the block sizes (powers
    of two, at least 16)."""
    check_shrink_args(x, a, seg_indptr, seg_slot)
    if a.dtype != x.dtype:
        raise TypeError(f"x {x.dtype} and a {a.dtype} must share a dtype")
    dot_dtype, precision = dot_dtype_and_precision(x.dtype)  # also rejects other dtypes
    (num_rows, k), rank = x.shape, a.shape[1]
    t = torch.zeros(num_rows, rank, dtype=torch.float32, device=x.device)
    seg_indptr, seg_slot, max_len = _segments_on(x.device, seg_indptr, seg_slot, max_seg_len)
    if max_len == 0 or rank == 0:
        return t
    x, a = x.contiguous(), a.contiguous()
    interp = interpreting()
    if interp:  # numpy's float16 / bfloat16 matmuls are slow or misread: widen them
        dot_dtype, precision = tl.float32, "ieee"
    bm = block_m or _fit(max_len, _INTERPRETER_MAX_BLOCK if interp else MAX_BLOCK_M)
    br = block_r or _fit(rank, _INTERPRETER_MAX_BLOCK if interp else MAX_BLOCK_R)
    bk = block_k or (_fit(k, _INTERPRETER_MAX_BLOCK) if interp else _GPU_BLOCK_K[x.dtype])
    grid = (seg_slot.numel(), triton.cdiv(max_len, bm), triton.cdiv(rank, br))
    _shrink_kernel[grid](
        x, a, t, seg_indptr, seg_slot, k, rank, x.stride(0), a.stride(0), a.stride(1), t.stride(0),
        BLOCK_M=bm, BLOCK_R=br, BLOCK_K=bk, DOT_DTYPE=dot_dtype, PRECISION=precision,
        **_launch_options(),
    )  # fmt: skip
    return t


def sgmv_expand(t: Tensor, b: Tensor, seg_indptr: Tensor, seg_slot: Tensor, y: Tensor, *,
                max_seg_len: int | None = None, block_m: int | None = None,
                block_n: int | None = None, block_r: int | None = None) -> Tensor:  # fmt: skip
    """t [T, R] float32, b [S, N, R], y [T, N] (any of float32 / bfloat16 / float16): y[rows] +=
    t[rows] @ b[slot].T per segment, in place (rows of slot -1 untouched, their t not read);
    returns y (lora_reference.sgmv_expand_ref). y needs a contiguous last axis. max_seg_len and
    the block overrides as for sgmv_shrink."""
    check_expand_args(t, b, seg_indptr, seg_slot, y)
    if t.dtype != torch.float32:
        raise TypeError(f"t must be float32 (sgmv_shrink's output), not {t.dtype}")
    for tensor in (b, y):
        dot_dtype_and_precision(tensor.dtype)  # raises TypeError for other dtypes
    if y.shape[1] > 1 and y.stride(1) != 1:
        raise ValueError("y needs a contiguous last axis (it is written in place)")
    rank, n = t.shape[1], b.shape[1]
    seg_indptr, seg_slot, max_len = _segments_on(y.device, seg_indptr, seg_slot, max_seg_len)
    if max_len == 0 or rank == 0 or n == 0:
        return y
    t, b = t.contiguous(), b.contiguous()
    interp = interpreting()
    precision = "ieee" if b.dtype == torch.float32 or interp else "tf32"
    bm = block_m or _fit(max_len, _INTERPRETER_MAX_BLOCK if interp else MAX_BLOCK_M)
    bn = block_n or (_fit(n, _INTERPRETER_MAX_BLOCK) if interp else _GPU_BLOCK_N)
    br = block_r or _fit(rank, _INTERPRETER_MAX_BLOCK if interp else MAX_BLOCK_R)
    grid = (seg_slot.numel(), triton.cdiv(max_len, bm), triton.cdiv(n, bn))
    _expand_kernel[grid](
        t, b, y, seg_indptr, seg_slot, n, rank, t.stride(0), b.stride(0), b.stride(1), y.stride(0),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_R=br, PRECISION=precision, **_launch_options(),
    )  # fmt: skip
    return y
