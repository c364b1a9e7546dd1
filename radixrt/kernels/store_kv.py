"""store_kv: write the new tokens' K and V into their slots of the paged KV pool (Triton).

Same arguments as radixrt.kernels.reference.store_kv_ref, its PyTorch reference.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from radixrt.kernels.triton_utils import interpreting

# Elements one program copies per tensor on the GPU; the interpreter takes many tokens at once.
_GPU_ELEMS_PER_PROGRAM = 4096
_INTERPRETER_MAX_TOKENS = 64


@triton.jit
def _store_kv_kernel(
    k_ptr,  # [num_tokens, num_kv_heads, head_dim]
    v_ptr,  # [num_tokens, num_kv_heads, head_dim]
    k_cache_ptr,  # [num_slots + 1, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_slots + 1, num_kv_heads, head_dim]
    slots_ptr,  # [num_tokens] int64
    num_tokens,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ckt,
    stride_ckh,
    stride_cvt,
    stride_cvh,
    HEAD_DIM: tl.constexpr,
    ROW: tl.constexpr,  # num_kv_heads * head_dim
    BLOCK_T: tl.constexpr,
    BLOCK_ROW: tl.constexpr,
):
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    mask_t = offs_t < num_tokens
    slots = tl.load(slots_ptr + offs_t, mask=mask_t, other=0).to(tl.int64)
    offs = tl.arange(0, BLOCK_ROW)
    head = offs // HEAD_DIM
    dim = offs % HEAD_DIM
    mask = mask_t[:, None] & (offs < ROW)[None, :]
    tokens = offs_t.to(tl.int64)[:, None]
    k = tl.load(k_ptr + tokens * stride_kt + (head * stride_kh + dim)[None, :], mask=mask)
    v = tl.load(v_ptr + tokens * stride_vt + (head * stride_vh + dim)[None, :], mask=mask)
    k_dst = k_cache_ptr + slots[:, None] * stride_ckt + (head * stride_ckh + dim)[None, :]
    v_dst = v_cache_ptr + slots[:, None] * stride_cvt + (head * stride_cvh + dim)[None, :]
    tl.store(k_dst, k, mask=mask)
    tl.store(v_dst, v, mask=mask)


def store_kv(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, out_slots: Tensor) -> None:
    """Write k, v into k_cache, v_cache at out_slots (cast to the cache dtype).

    k_cache, v_cache: [num_slots + 1, num_kv_heads, head_dim]
    k, v: [num_tokens, num_kv_heads, head_dim] (any token stride); out_slots: [num_tokens] int
    Needs no host synchronisation, so it can be captured in a CUDA graph.
    """
    num_tokens, num_kv_heads, head_dim = k.shape
    if v.shape != k.shape or k_cache.shape[1:] != k.shape[1:] or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"store_kv shapes differ: k {tuple(k.shape)}, v {tuple(v.shape)}, "
            f"k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}"
        )
    if out_slots.shape != (num_tokens,):
        raise ValueError(f"out_slots {tuple(out_slots.shape)} must be [{num_tokens}]")
    if num_tokens == 0:
        return
    # cast here, not in the kernel: torch rounds to nearest even (Triton's interpreter truncates)
    k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
    for t in (k, v, k_cache, v_cache):
        if t.stride(2) != 1:
            raise ValueError("store_kv needs a contiguous last (head_dim) axis")
    row = num_kv_heads * head_dim
    block_row = triton.next_power_of_2(row)
    if interpreting():
        block_t = min(_INTERPRETER_MAX_TOKENS, triton.next_power_of_2(num_tokens))
    else:
        block_t = max(1, _GPU_ELEMS_PER_PROGRAM // block_row)
    grid = (triton.cdiv(num_tokens, block_t),)
    _store_kv_kernel[grid](
        k, v, k_cache, v_cache, out_slots, num_tokens,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        HEAD_DIM=head_dim, ROW=row, BLOCK_T=block_t, BLOCK_ROW=block_row,
        num_warps=4,
    )  # fmt: skip
