"""Packed-weight products on the GPU: Triton kernels for the packed layouts
(kernels/packed_reference.py: u4 / i8 codes in groups with a scale and a bias) and for FP8
weights (float8 e4m3 with a scale per output row), each equal to its PyTorch reference:

    packed_gemv(x, w)    a few rows of x (decode): split-K, every program a block of output
                         rows over one slice of K, partial sums added atomically in float32
    packed_gemm(x, w)    many rows (prefill): tiles of x rows x output rows, the codes of a tile
                         decoded to x's dtype in registers and multiplied with tl.dot
    fp8_linear(x, w, s)  x @ (w.float() * s[:, None]).T for e4m3 weights, any rows
    (references: packed_linear_ref; fp8_linear_ref below)

Accumulation is float32; the output has x's dtype. On a machine without CUDA they run in
Triton's interpreter (kernels/__init__.py), which is how the tests prove them equal.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from radixrt.kernels.packed_reference import PackedTensors

GEMV_MAX_ROWS = 8  # rows of x the split-K GEMV takes; more go to the tiled GEMM
_CODES = {"u4": 0, "i8": 1}


def fp8_linear_ref(x: Tensor, w: Tensor, scale: Tensor) -> Tensor:
    """x [n, K] @ (w [N, K] float8_e4m3fn as float32 * scale [N, 1]).T -> [n, N] float32."""
    return x.float() @ (w.float() * scale.float().unsqueeze(1)).T


@triton.jit
def _weights(codes_ptr, scales_ptr, biases_ptr, rows, cols, K, G, CODE: tl.constexpr,
             GROUP: tl.constexpr):
    """The float32 weights at [rows, cols] (broadcast index tensors, every one inside the
    weight: callers clamp their tails to index 0 and zero them afterwards)."""
    if CODE == 0:  # u4: group of 32 in 16 bytes, element i low nibble, i + 16 high
        byte = (cols // 32) * 16 + (cols % 16)
        packed = tl.load(codes_ptr + rows * (K // 2) + byte).to(tl.int32)
        q = (packed >> ((cols % 32) // 16 * 4)) & 15
    else:
        q = tl.load(codes_ptr + rows * K + cols).to(tl.int32)
    g = rows * G + cols // GROUP
    s = tl.load(scales_ptr + g).to(tl.float32)
    b = tl.load(biases_ptr + g).to(tl.float32)
    return q.to(tl.float32) * s + b


@triton.jit
def _gemv_kernel(x_ptr, codes_ptr, scales_ptr, biases_ptr, out_ptr, M, N, K, G,
                 CODE: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    k_per_split = tl.cdiv(K, SPLIT_K)
    for m in range(M):
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for k0 in range(pid_k * k_per_split, tl.minimum((pid_k + 1) * k_per_split, K), BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)  # [BLOCK_K]
            ok = (rows[:, None] < N) & (cols[None, :] < K)
            r2, c2 = tl.where(ok, rows[:, None], 0), tl.where(ok, cols[None, :], 0)
            w = _weights(codes_ptr, scales_ptr, biases_ptr, r2, c2, K, G, CODE, GROUP)
            x = tl.load(x_ptr + m * K + cols, mask=cols < K, other=0.0).to(tl.float32)
            acc += tl.sum(tl.where(ok, w, 0.0) * x[None, :], axis=1)
        tl.atomic_add(out_ptr + m * N + rows, acc, mask=rows < N)


@triton.jit
def _gemm_kernel(x_ptr, codes_ptr, scales_ptr, biases_ptr, out_ptr, M, N, K, G,
                 CODE: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # x rows
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # output rows (weight rows)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :],
                    mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)  # [BM, BK]
        ok = (rn[None, :] < N) & (rk[:, None] < K)  # [BK, BN]
        r2, c2 = tl.where(ok, rn[None, :], 0), tl.where(ok, rk[:, None], 0)
        w = _weights(codes_ptr, scales_ptr, biases_ptr, r2, c2, K, G, CODE, GROUP)
        acc += tl.dot(x.to(tl.float32), tl.where(ok, w, 0.0), input_precision="ieee")
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _fp8_kernel(x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :],
                    mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        w = tl.load(w_ptr + rn[None, :] * K + rk[:, None],
                    mask=(rn[None, :] < N) & (rk[:, None] < K), other=0.0)  # [BK, BN] e4m3
        acc += tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
    scale = tl.load(s_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], acc * scale[None, :],
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def _block(n: int, cap: int) -> int:
    return max(16, min(cap, triton.next_power_of_2(n)))


def packed_gemv(x: Tensor, w: PackedTensors, split_k: int | None = None) -> Tensor:
    """x [n <= GEMV_MAX_ROWS, cols] -> x @ W.T [n, rows] in x's dtype (float32 sums)."""
    n, k = x.shape
    x = x.contiguous()
    out = torch.zeros(n, w.rows, dtype=torch.float32, device=x.device)
    block_n, block_k = _block(w.rows, 64), _block(k, 128)
    split = split_k or max(1, min(8, k // 512))
    grid = (triton.cdiv(w.rows, block_n), split)
    _gemv_kernel[grid](x, w.codes, w.scales, w.biases, out, n, w.rows, k, k // w.group,
                       CODE=_CODES[w.kind], GROUP=w.group, BLOCK_N=block_n, BLOCK_K=block_k,
                       SPLIT_K=split)
    return out.to(x.dtype)


def packed_gemm(x: Tensor, w: PackedTensors) -> Tensor:
    """x [n, cols] -> x @ W.T [n, rows] in x's dtype (float32 sums), tiled."""
    n, k = x.shape
    x = x.contiguous()
    out = torch.empty(n, w.rows, dtype=torch.float32, device=x.device)
    bm, bn, bk = _block(n, 64), _block(w.rows, 64), 32
    grid = (triton.cdiv(n, bm), triton.cdiv(w.rows, bn))
    _gemm_kernel[grid](x, w.codes, w.scales, w.biases, out, n, w.rows, k, k // w.group,
                       CODE=_CODES[w.kind], GROUP=w.group, BLOCK_M=bm, BLOCK_N=bn,
                       BLOCK_K=bk)
    return out.to(x.dtype)


def packed_linear(x: Tensor, w: PackedTensors) -> Tensor:
    """The GPU's packed product: the split-K GEMV for decode's few rows, else the GEMM."""
    return packed_gemv(x, w) if x.shape[0] <= GEMV_MAX_ROWS else packed_gemm(x, w)


def fp8_linear(x: Tensor, w: Tensor, scale: Tensor) -> Tensor:
    """x [n, K] @ (w [N, K] float8_e4m3fn * scale [N] per row).T -> [n, N] in x's dtype."""
    n, k = x.shape
    x = x.contiguous()
    out = torch.empty(n, w.shape[0], dtype=torch.float32, device=x.device)
    bm, bn, bk = _block(n, 64), _block(w.shape[0], 64), 32
    grid = (triton.cdiv(n, bm), triton.cdiv(w.shape[0], bn))
    _fp8_kernel[grid](x, w, scale.float().contiguous(), out, n, w.shape[0], k, BLOCK_M=bm,
                      BLOCK_N=bn, BLOCK_K=bk)
    return out.to(x.dtype)


def quantize_fp8(w: Tensor) -> tuple[Tensor, Tensor]:
    """w [N, K] -> (e4m3 codes [N, K], float32 scale [N]): each row scaled into e4m3's range
    (absmax / 448)."""
    absmax = w.float().abs().amax(dim=1).clamp(min=1e-12)
    scale = absmax / 448.0
    return (w.float() / scale.unsqueeze(1)).to(torch.float8_e4m3fn), scale
