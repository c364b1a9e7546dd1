"""Small helpers shared by the Triton kernels: interpreter detection, dot dtypes, launch sizes."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# Combine functions of tl.max / tl.sum. Kernels call tl.reduce(x, axis, MAX_COMBINE) instead of
# tl.max(x, axis): the same code on the GPU, but Triton's interpreter re-patches triton.language on
# every call of a nested jit function such as tl.max (milliseconds each), while tl.reduce with
# these exact combine functions runs as one numpy reduction.
MAX_COMBINE = tl.standard._elementwise_max
SUM_COMBINE = tl.standard._sum_combine

_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return bool(triton.knobs.runtime.interpret)


def dot_dtype_and_precision(dtype: torch.dtype) -> tuple[tl.dtype, str]:
    """The dtype tl.dot operands are cast to, and its input_precision, for inputs of `dtype`.

    float32 uses exact ("ieee") products, not TF32. The interpreter's tl.dot misreads bfloat16
    (numpy stores it as uint16), so there bfloat16 operands are widened to float32 first: the
    products of bfloat16 values are exact in float32, so the results match the GPU's bfloat16 dot
    with float32 accumulation up to summation order."""
    if dtype not in _TL_DTYPES:
        raise TypeError(f"unsupported dtype {dtype}: use float32, bfloat16 or float16")
    if dtype == torch.float32 or (dtype == torch.bfloat16 and interpreting()):
        return tl.float32, "ieee"
    return _TL_DTYPES[dtype], "tf32"  # the precision only matters for float32 operands


def block_dim(head_dim: int) -> int:
    """Power-of-two block covering head_dim (other head dims are masked), at least 16 for tl.dot."""
    return max(16, triton.next_power_of_2(head_dim))


@functools.lru_cache(maxsize=8)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_compute_units(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 1 elsewhere (the interpreter runs serially)."""
    if device.type != "cuda" or interpreting():
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _sm_count(index)


def check_kv_args(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Shapes the attention kernels rely on: q [n, heads, dim], caches [slots, kv_heads, dim]."""
    if q.dim() != 3 or k_cache.dim() != 3 or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"expected q [n, heads, dim] and caches [slots, kv_heads, dim], got q "
            f"{tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}"
        )
    if q.shape[2] != k_cache.shape[2] or q.shape[1] % k_cache.shape[1]:
        raise ValueError(
            f"q heads/dim {tuple(q.shape[1:])} do not fit KV heads/dim {tuple(k_cache.shape[1:])}"
        )
    if k_cache.stride(2) != 1 or v_cache.stride(2) != 1 or q.stride(2) != 1:
        raise ValueError("q and the KV caches need a contiguous last (head_dim) axis")


def check_sinks(sinks: torch.Tensor | None, num_heads: int) -> None:
    """Attention sinks, when given, are one float per query head, contiguous: [num_heads]."""
    if sinks is None:
        return
    if tuple(sinks.shape) != (num_heads,) or sinks.stride(0) != 1:
        raise ValueError(f"sinks {tuple(sinks.shape)} must be a contiguous [{num_heads}]")
    if not sinks.is_floating_point():
        raise TypeError(f"sinks must be a float tensor, not {sinks.dtype}")


@triton.jit
def add_sink(l_i, m_i, sink):
    """The softmax denominator with an attention sink: l_i, the sum of exp2(score - m_i) over
    the keys seen (scores and their running max m_i in the log2 domain), plus
    exp2(sink * log2(e) - m_i) for a sink logit as the model stores it (natural log, neither
    scaled nor capped). The accumulator divided by it is sum_j exp(x_j) v_j / (exp(sink) +
    sum_i exp(x_i)). A row that saw no key (m_i = -inf, l_i = 0, acc = 0) gets inf, so 0 out
    (the sink takes all); so does a sink more than ~88 nats above every score, whose exact
    output is below 2^-127 of the values (under float32's smallest normal)."""
    return l_i + tl.exp2(sink * 1.4426950408889634 - m_i)


@triton.jit
def soft_cap_log2(qk, cap_log2):
    """Logit soft-capping in the log2 domain: scores s * log2(e) -> c * tanh(s / c) * log2(e),
    for cap_log2 = c * log2(e). tanh(x) = 1 - 2 / (exp2(2 x log2(e)) + 1): saturates to +-1
    without overflow (exp2 of a large x is inf, of a very negative one 0)."""
    return cap_log2 * (1.0 - 2.0 / (tl.exp2(qk * (2.0 * 1.4426950408889634 / cap_log2)) + 1.0))


@triton.jit
def attend_tiles(
    q,  # [ROWS, BLOCK_D] queries of one KV head, in DOT_DTYPE
    q_pos,  # [ROWS] each query's position (CAUSAL only; anything otherwise)
    indices_ptr,  # slots of the key positions
    start,  # offset of position 0 in indices_ptr
    lo,  # first and one past the last position of this program's range
    hi,
    k_cache_ptr,  # [num_slots + 1, num_kv_heads, head_dim]
    v_cache_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    kv_head,
    offs_d,  # [BLOCK_D]
    mask_d,  # [BLOCK_D]
    scale_log2,  # sm_scale * log2(e)
    window,  # the sliding window (WINDOWED only)
    cap_log2,  # logit_cap * log2(e) (SOFT_CAP only)
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    CAUSAL: tl.constexpr,  # query r sees positions <= q_pos[r] only
    WINDOWED: tl.constexpr,  # (with CAUSAL) ... and > q_pos[r] - window
    SOFT_CAP: tl.constexpr,  # scores soft-capped at cap_log2
):
    """Online softmax of q over the keys at positions lo..hi-1, BLOCK_N K/V tiles at a time,
    each tile read once for all ROWS queries (tl.dot). Returns the running max m_i [ROWS]
    (log2 domain), the sum l_i [ROWS] and the unnormalised output acc [ROWS, BLOCK_D]. Without
    WINDOWED every row must see a key of the first tile; with it a row that has seen no key
    yet keeps m_i = -inf, l_i = 0 (and l_i = 0 at the end if it saw none)."""
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        slots = tl.load(indices_ptr + start + offs_n, mask=mask_n, other=0).to(tl.int64)
        k_ptrs = k_cache_ptr + slots[None, :] * stride_kt + kv_head * stride_kh + offs_d[:, None]
        k = tl.load(k_ptrs, mask=mask_d[:, None] & mask_n[None, :], other=0.0)  # [D, N]
        qk = tl.dot(q, k.to(DOT_DTYPE), input_precision=PRECISION) * scale_log2  # [ROWS, N]
        if SOFT_CAP:
            qk = soft_cap_log2(qk, cap_log2)
        visible = mask_n[None, :]  # [1 or ROWS, BLOCK_N]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= q_pos[:, None])
            if WINDOWED:
                visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(qk, 1, MAX_COMBINE))
        m_safe = m_new
        if WINDOWED:  # a row with no key so far: exp2(-inf - 0) = 0, not exp2(-inf + inf)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(qk - m_safe[:, None])  # [ROWS, BLOCK_N]
        l_i = l_i * alpha + tl.reduce(p, 1, SUM_COMBINE)
        v_ptrs = v_cache_ptr + slots[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :]
        v = tl.load(v_ptrs, mask=mask_n[:, None] & mask_d[None, :], other=0.0)  # [N, D]
        pv = tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return m_i, l_i, acc
