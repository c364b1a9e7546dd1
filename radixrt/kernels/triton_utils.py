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
