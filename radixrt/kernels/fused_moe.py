"""fused_moe: the mixture-of-experts layer as grouped GEMMs over tokens sorted by expert (Triton).

Same arguments as radixrt.kernels.moe_reference.fused_moe_ref, its PyTorch reference (whose
docstring gives the conventions), plus optional block sizes. A (token, k) choice is a pair,
numbered t * top_k + k. Stages, in order:

1. align (torch, no host synchronisation, so CUDA graphs can capture it): count the pairs of
   each expert, pad each expert's count up to a multiple of BLOCK_M, and lay the pairs out
   sorted by expert in that padded order: sorted_pairs [num_blocks * BLOCK_M] (padding rows
   hold num_pairs) and block_experts [num_blocks], the expert of each block of BLOCK_M rows.
   The padded count is data-dependent, so the grids cover its bound num_pairs +
   min(num_experts, num_pairs) * (BLOCK_M - 1); blocks past the padded count carry expert id
   num_experts and return at once. Experts without a pair get no block.
2. gate_up kernel: a program takes one block of rows (all routed to one expert) and BLOCK_N
   intermediate columns, gathers the rows' tokens of x and accumulates both the gate and the up
   product (two float32 accumulators over the same x tiles), adds the biases, applies the
   activation and writes h [num_blocks * BLOCK_M, inter] in x's dtype, in sorted row order.
3. down kernel: a program takes the same block of rows of h and BLOCK_N hidden columns,
   multiplies by the expert's w_down (float32 accumulators), adds the bias, scales each row by
   its pair's routing weight and writes it, in x's dtype (where the reference rounds its down
   product too), to its pair's row of pair_out [num_pairs, hidden].
4. reduction: pair_out viewed [num_tokens, top_k, hidden] summed over top_k in float32 (torch),
   cast to x's dtype (top_k 1: pair_out is the output). Each pair's row is written by exactly
   one program, so there are no atomics and the result is deterministic (float32 atomic adds
   into the output would save the buffer but not be); the extra traffic (num_pairs * hidden
   elements written, read once) is small next to the expert weights every step reads.

Workspace: h and pair_out, (num_pairs + min(num_experts, num_pairs) * (BLOCK_M - 1)) * inter +
num_pairs * hidden elements of x's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from radixrt.kernels.moe_reference import (
    DEFAULT_SWIGLU_ALPHA,
    DEFAULT_SWIGLU_LIMIT,
    check_moe_args,
)
from radixrt.kernels.triton_utils import dot_dtype_and_precision, interpreting

MIN_BLOCK = 16  # tl.dot needs at least 16 rows / columns / reduction elements
MAX_BLOCK_M = 64
_GPU_BLOCK_N = 64
_GPU_BLOCK_K = {torch.float32: 32, torch.bfloat16: 64, torch.float16: 64}
_GPU_NUM_WARPS = 4
_GPU_NUM_STAGES = 3
_INTERPRETER_MAX_BLOCK = 512  # the interpreter runs programs serially: fewer, larger tiles


@dataclass(frozen=True)
class MoEBlocks:
    block_m: int  # sorted rows per program (all one expert's)
    gate_up_n: int  # intermediate columns per gate_up program
    gate_up_k: int  # hidden elements per gate_up tl.dot
    down_n: int  # hidden columns per down program
    down_k: int  # intermediate elements per down tl.dot
    num_warps: int
    num_stages: int


class ExpertBlocks(NamedTuple):
    sorted_pairs: Tensor  # [num_blocks * block_m] int32: pair of each sorted row; num_pairs: pad
    block_experts: Tensor  # [num_blocks] int32: expert of each block; num_experts: past the end


def default_block_m(num_pairs: int, num_experts: int) -> int:
    """Rows per block from the mean pairs per expert: 16 for decode-sized steps (little
    padding), up to MAX_BLOCK_M for long prefills (more reuse of each weight tile)."""
    mean = -(-num_pairs // num_experts)
    return min(MAX_BLOCK_M, max(MIN_BLOCK, triton.next_power_of_2(mean)))


def moe_blocks(num_pairs: int, num_experts: int, hidden: int, inter: int, dtype: torch.dtype,
               block_m: int | None, block_n: int | None, block_k: int | None,
               ) -> MoEBlocks:  # fmt: skip
    """Block sizes for the GPU, or for the interpreter (which runs programs one after another,
    so there each tile spans its whole dimension, up to _INTERPRETER_MAX_BLOCK); explicit
    block_n / block_k apply to both kernels."""
    block_m = block_m or default_block_m(num_pairs, num_experts)
    if interpreting():

        def fit(dim: int) -> int:
            return max(MIN_BLOCK, min(_INTERPRETER_MAX_BLOCK, triton.next_power_of_2(dim)))

        return MoEBlocks(block_m, block_n or fit(inter), block_k or fit(hidden),
                         block_n or fit(hidden), block_k or fit(inter), 1, 1)  # fmt: skip
    n, k = block_n or _GPU_BLOCK_N, block_k or _GPU_BLOCK_K[dtype]
    return MoEBlocks(block_m, n, k, n, k, _GPU_NUM_WARPS, _GPU_NUM_STAGES)


def moe_dot_dtype_and_precision(dtype: torch.dtype) -> tuple[tl.dtype, str]:
    """triton_utils.dot_dtype_and_precision, except that the interpreter widens float16 operands
    to float32 as well: numpy's float16 matmul has no BLAS behind it (orders of magnitude
    slower), and products of float16 values are exact in float32."""
    if dtype == torch.float16 and interpreting():
        return tl.float32, "ieee"
    return dot_dtype_and_precision(dtype)


def align_pairs_to_blocks(topk_ids: Tensor, num_experts: int, block_m: int) -> ExpertBlocks:
    """Stage 1: the pairs sorted by expert, each expert's run padded to a multiple of block_m.

    topk_ids [num_tokens, top_k] with values in [0, num_experts). Shapes depend only on the
    input shapes (not on the ids), and nothing is read back to the host."""
    pair_experts = topk_ids.reshape(-1).long()  # [num_pairs]
    num_pairs, device = pair_experts.numel(), pair_experts.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, pair_experts, torch.ones_like(pair_experts))  # [num_experts]
    padded = (counts + block_m - 1) // block_m * block_m  # [num_experts]
    padded_ends = padded.cumsum(0)  # [num_experts]
    order = torch.argsort(pair_experts, stable=True)  # [num_pairs]: pair ids grouped by expert
    sorted_experts = pair_experts[order]  # [num_pairs]
    rank = torch.arange(num_pairs, device=device) - (counts.cumsum(0) - counts)[sorted_experts]
    dest = (padded_ends - padded)[sorted_experts] + rank  # [num_pairs]: row in the padded order
    bound = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    num_blocks = triton.cdiv(bound, block_m)
    sorted_pairs = torch.full((num_blocks * block_m,), num_pairs, dtype=torch.int32, device=device)
    sorted_pairs[dest] = order.to(torch.int32)
    block_starts = torch.arange(num_blocks, device=device) * block_m  # [num_blocks]
    # the expert whose padded run holds each block's first row (num_experts past the last run)
    block_experts = torch.searchsorted(padded_ends, block_starts, right=True)  # [num_blocks]
    return ExpertBlocks(sorted_pairs, block_experts.to(torch.int32))


@triton.jit
def _activation(gate, up, alpha, limit, CLAMPED_SWIGLU: tl.constexpr):
    """silu(gate) * up, or gpt-oss's (clamp(up, -l, l) + 1) * g * sigmoid(alpha * g) with
    g = min(gate, l): both are g * sigmoid(g * s) * u. gate, up [BLOCK_M, BLOCK_N] float32."""
    scale = 1.0
    if CLAMPED_SWIGLU:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit) + 1.0
        scale = alpha
    return gate / (1.0 + tl.exp(-gate * scale)) * up


@triton.jit
def _gate_up_kernel(
    x_ptr,  # [num_tokens, hidden]
    w_ptr,  # [num_experts, 2 * inter, hidden]
    bias_ptr,  # [num_experts, 2 * inter] (HAS_BIAS; any pointer otherwise)
    h_ptr,  # [num_blocks * BLOCK_M, inter] out, x's dtype, sorted row order
    sorted_pairs_ptr,  # [num_blocks * BLOCK_M]
    block_experts_ptr,  # [num_blocks]
    num_pairs,
    num_experts,
    top_k,
    hidden,
    inter,
    stride_xt,
    stride_we,
    stride_wn,
    stride_be,
    stride_ht,
    swiglu_alpha,
    swiglu_limit,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    CLAMPED_SWIGLU: tl.constexpr,
):
    block = tl.program_id(0)
    expert = tl.load(block_experts_ptr + block).to(tl.int64)
    if expert >= num_experts:  # past the padded count
        return
    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] sorted rows
    pairs = tl.load(sorted_pairs_ptr + offs_m)  # [BLOCK_M]
    mask_m = pairs < num_pairs
    tokens = (pairs // top_k).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] intermediate columns
    mask_n = offs_n < inter
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + tokens[:, None] * stride_xt + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None]  # [K, N]
    up_offset = inter * stride_wn
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k_start in range(0, hidden, BLOCK_K):
        mask_k = offs_k < hidden - k_start
        a = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0).to(DOT_DTYPE)
        mask_w = mask_k[:, None] & mask_n[None, :]
        w_gate = tl.load(w_ptrs, mask=mask_w, other=0.0).to(DOT_DTYPE)
        w_up = tl.load(w_ptrs + up_offset, mask=mask_w, other=0.0).to(DOT_DTYPE)
        acc_gate += tl.dot(a, w_gate, input_precision=PRECISION)
        acc_up += tl.dot(a, w_up, input_precision=PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        b_ptrs = bias_ptr + expert * stride_be + offs_n
        acc_gate += tl.load(b_ptrs, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        acc_up += tl.load(b_ptrs + inter, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    h = _activation(acc_gate, acc_up, swiglu_alpha, swiglu_limit, CLAMPED_SWIGLU)
    h_ptrs = h_ptr + offs_m.to(tl.int64)[:, None] * stride_ht + offs_n[None, :]
    tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=mask_n[None, :])  # padding rows too


@triton.jit
def _down_kernel(
    h_ptr,  # [num_blocks * BLOCK_M, inter], sorted row order
    w_ptr,  # [num_experts, hidden, inter]
    bias_ptr,  # [num_experts, hidden] (HAS_BIAS; any pointer otherwise)
    pair_weights_ptr,  # [num_pairs] float32
    out_ptr,  # [num_pairs, hidden] out, x's dtype
    sorted_pairs_ptr,  # [num_blocks * BLOCK_M]
    block_experts_ptr,  # [num_blocks]
    num_pairs,
    num_experts,
    hidden,
    inter,
    stride_ht,
    stride_we,
    stride_wn,
    stride_be,
    stride_ot,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    block = tl.program_id(0)
    expert = tl.load(block_experts_ptr + block).to(tl.int64)
    if expert >= num_experts:  # past the padded count
        return
    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] sorted rows
    pairs = tl.load(sorted_pairs_ptr + offs_m)  # [BLOCK_M]
    mask_m = pairs < num_pairs
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] hidden columns
    mask_n = offs_n < hidden
    offs_k = tl.arange(0, BLOCK_K)
    h_ptrs = h_ptr + offs_m.to(tl.int64)[:, None] * stride_ht + offs_k[None, :]  # [M, K]
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None]  # [K, N]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k_start in range(0, inter, BLOCK_K):
        mask_k = offs_k < inter - k_start
        a = tl.load(h_ptrs, mask=mask_k[None, :], other=0.0).to(DOT_DTYPE)
        w = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0).to(DOT_DTYPE)
        acc += tl.dot(a, w, input_precision=PRECISION)
        h_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        bias = tl.load(bias_ptr + expert * stride_be + offs_n, mask=mask_n, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    acc *= tl.load(pair_weights_ptr + pairs, mask=mask_m, other=0.0)[:, None]
    out_ptrs = out_ptr + pairs.to(tl.int64)[:, None] * stride_ot + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def fused_moe(
    x: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    topk_ids: Tensor,
    topk_weights: Tensor,
    *,
    gate_up_bias: Tensor | None = None,
    down_bias: Tensor | None = None,
    activation: str = "silu",
    swiglu_alpha: float = DEFAULT_SWIGLU_ALPHA,
    swiglu_limit: float = DEFAULT_SWIGLU_LIMIT,
    block_m: int | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
) -> Tensor:
    """sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t]) -> [num_tokens, hidden], x's
    dtype (see the module docstring for the stages). block_m, block_n, block_k override the
    block sizes (powers of two, at least 16)."""
    check_moe_args(x, w_gate_up, w_down, topk_ids, topk_weights, gate_up_bias, down_bias,
                   activation)  # fmt: skip
    if w_gate_up.stride(2) != 1 or w_down.stride(2) != 1:
        raise ValueError("w_gate_up and w_down need a contiguous last (input) axis")
    num_tokens, top_k = topk_ids.shape
    num_experts, hidden, inter = w_down.shape
    if num_tokens == 0:
        return torch.zeros_like(x)
    x = x.contiguous()
    num_pairs = num_tokens * top_k
    blocks = moe_blocks(num_pairs, num_experts, hidden, inter, x.dtype, block_m, block_n, block_k)
    aligned = align_pairs_to_blocks(topk_ids, num_experts, blocks.block_m)
    h = _run_gate_up(x, w_gate_up, gate_up_bias, aligned, top_k, blocks, activation,
                     swiglu_alpha, swiglu_limit)  # fmt: skip
    pair_weights = topk_weights.reshape(-1).float().contiguous()  # [num_pairs]
    pair_out = _run_down(h, w_down, down_bias, pair_weights, aligned, blocks)  # [pairs, hidden]
    if top_k == 1:
        return pair_out
    return pair_out.view(num_tokens, top_k, hidden).sum(1, dtype=torch.float32).to(x.dtype)


def _run_gate_up(x: Tensor, w_gate_up: Tensor, bias: Tensor | None, aligned: ExpertBlocks,
                 top_k: int, blocks: MoEBlocks, activation: str, swiglu_alpha: float,
                 swiglu_limit: float) -> Tensor:  # fmt: skip
    """Stage 2: h [num_blocks * block_m, inter] = act(gate, up) of each sorted row."""
    num_experts, two_inter, hidden = w_gate_up.shape
    inter = two_inter // 2
    num_blocks = aligned.block_experts.numel()
    h = torch.empty(num_blocks * blocks.block_m, inter, dtype=x.dtype, device=x.device)
    bias = bias.contiguous() if bias is not None else None
    dot_dtype, precision = moe_dot_dtype_and_precision(x.dtype)
    grid = (num_blocks, triton.cdiv(inter, blocks.gate_up_n))
    _gate_up_kernel[grid](
        x, w_gate_up, w_gate_up if bias is None else bias, h, *aligned,
        x.shape[0] * top_k, num_experts, top_k, hidden, inter,
        x.stride(0), w_gate_up.stride(0), w_gate_up.stride(1),
        0 if bias is None else bias.stride(0), h.stride(0),
        float(swiglu_alpha), float(swiglu_limit),
        BLOCK_M=blocks.block_m, BLOCK_N=blocks.gate_up_n, BLOCK_K=blocks.gate_up_k,
        DOT_DTYPE=dot_dtype, PRECISION=precision, HAS_BIAS=bias is not None,
        CLAMPED_SWIGLU=activation == "swiglu_oai",
        num_warps=blocks.num_warps, num_stages=blocks.num_stages,
    )  # fmt: skip
    return h


def _run_down(h: Tensor, w_down: Tensor, bias: Tensor | None, pair_weights: Tensor,
              aligned: ExpertBlocks, blocks: MoEBlocks) -> Tensor:  # fmt: skip
    """Stage 3: pair_out [num_pairs, hidden] = weight * (down(h) + bias) of each pair, h's dtype."""
    num_experts, hidden, inter = w_down.shape
    num_pairs = pair_weights.numel()
    out = torch.empty(num_pairs, hidden, dtype=h.dtype, device=h.device)
    bias = bias.contiguous() if bias is not None else None
    dot_dtype, precision = moe_dot_dtype_and_precision(h.dtype)
    grid = (aligned.block_experts.numel(), triton.cdiv(hidden, blocks.down_n))
    _down_kernel[grid](
        h, w_down, w_down if bias is None else bias, pair_weights, out, *aligned,
        num_pairs, num_experts, hidden, inter,
        h.stride(0), w_down.stride(0), w_down.stride(1),
        0 if bias is None else bias.stride(0), out.stride(0),
        BLOCK_M=blocks.block_m, BLOCK_N=blocks.down_n, BLOCK_K=blocks.down_k,
        DOT_DTYPE=dot_dtype, PRECISION=precision, HAS_BIAS=bias is not None,
        num_warps=blocks.num_warps, num_stages=blocks.num_stages,
    )  # fmt: skip
    return out
