"""The CPU's packed-weight products (kernels/cpu/packed_gemm.cpp), with the arguments of their
PyTorch references (kernels/packed_reference.py) checked before any pointer crosses to C.

    packed_gemm(x, w)          = packed_linear_ref(x, w)          x [n, cols] float32
    packed_rows(w, start, n)   = dequantize_ref(w)[start:start+n]
    packed_gather(w, index)    = dequantize_ref(w)[index]
"""

from __future__ import annotations

import torch
from torch import Tensor

from radixrt.kernels.native import native_library
from radixrt.kernels.packed_reference import PackedTensors

_CODES = {"u4": 0, "i8": 1}
MAX_GEMM_ROWS = 16  # rows of x one call of the kernel takes (kernels/cpu/packed.h)


def _layout(w: PackedTensors) -> tuple[int, int, int, int, int, int]:
    return (w.codes.data_ptr(), w.scales.data_ptr(), w.biases.data_ptr(), _CODES[w.kind],
            w.group, int(w.scales.dtype == torch.float16))


def _check_cpu(*tensors: Tensor) -> None:
    for t in tensors:
        if t.device.type != "cpu":
            raise ValueError(f"the CPU kernels take CPU tensors, not {t.device}")


def packed_gemm(x: Tensor, w: PackedTensors, out: Tensor | None = None) -> Tensor:
    """x [n, cols] float32 -> [n, rows] float32 (into `out` if given), MAX_GEMM_ROWS rows of x at
    a time."""
    if x.dim() != 2 or x.shape[1] != w.cols or x.dtype != torch.float32:
        raise ValueError(f"x of shape {tuple(x.shape)} {x.dtype}: expected [n, {w.cols}] "
                         "float32")
    x = x.contiguous()
    n = x.shape[0]
    if out is None:
        out = torch.empty(n, w.rows, dtype=torch.float32)
    elif tuple(out.shape) != (n, w.rows) or not out.is_contiguous() or out.dtype != x.dtype:
        raise ValueError(f"out of shape {tuple(out.shape)}: expected a contiguous [{n}, {w.rows}]")
    _check_cpu(x, out, w.codes)
    codes, scales, biases, kind, group, f16 = _layout(w)
    lib = native_library()
    for start in range(0, n if w.rows else 0, MAX_GEMM_ROWS):
        rows = min(MAX_GEMM_ROWS, n - start)
        status = lib.rx_packed_gemm(x[start].data_ptr(), rows, w.cols, codes, scales, biases,
                                    kind, group, f16, w.rows, out[start].data_ptr())
        _status(status, w)
    return out


def packed_rows(w: PackedTensors, start: int, count: int) -> Tensor:
    """Rows [start, start + count) of w, dequantized: [count, cols] float32."""
    if not 0 <= start <= start + count <= w.rows:
        raise ValueError(f"rows [{start}, {start + count}) of a weight of {w.rows} rows")
    _check_cpu(w.codes)
    out = torch.empty(count, w.cols, dtype=torch.float32)
    if count:
        codes, scales, biases, kind, group, f16 = _layout(w)
        _status(native_library().rx_packed_rows(codes, scales, biases, kind, group, f16, w.cols,
                                                start, count, out.data_ptr()), w)
    return out


def packed_gather(w: PackedTensors, index: Tensor) -> Tensor:
    """Rows index [n] (int64, each in [0, rows)) of w, dequantized: [n, cols] float32."""
    index = index.to(torch.int64).contiguous()
    _check_cpu(index, w.codes)
    if index.dim() != 1:
        raise ValueError(f"index of shape {tuple(index.shape)}: expected [n]")
    if index.numel() and not (int(index.min()) >= 0 and int(index.max()) < w.rows):
        raise ValueError(f"an index outside the weight's {w.rows} rows")
    out = torch.empty(index.numel(), w.cols, dtype=torch.float32)
    if index.numel():
        codes, scales, biases, kind, group, f16 = _layout(w)
        _status(native_library().rx_packed_gather(codes, scales, biases, kind, group, f16,
                                                  w.cols, index.data_ptr(), index.numel(),
                                                  out.data_ptr()), w)
    return out


def _status(status: int, w: PackedTensors) -> None:
    if status != 0:
        raise ValueError(f"no CPU kernel for {w.kind} codes in groups of {w.group} with "
                         f"{w.scales.dtype} scales")
