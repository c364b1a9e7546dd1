"""The packed-weight section of benchmarks/gpu_check.py: the Triton products for packed and FP8
weights (kernels/packed_triton.py) against the same weights dequantized to bfloat16 and
multiplied by torch (cuBLAS), on Llama-3-8B's projection shapes, decode-sized (the split-K
GEMV) and prefill-sized (the tiled GEMM). Each case reports both times, the weight bytes the
packed product reads per second (what bounds decode), its speed-up over bfloat16, and its
error against its PyTorch reference (packed_linear_ref / fp8_linear_ref in float32).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_check_timing import Report, bench, fmt_bandwidth, fmt_time, rel_err

MAX_ERR = 2e-2  # bfloat16 activations, float32 accumulation


@dataclass(frozen=True)
class Projection:
    name: str
    rows: int  # output features
    cols: int  # input features


LLAMA3_8B_PROJECTIONS = (Projection("qkv", 6144, 4096), Projection("gate_up", 28672, 4096),
                         Projection("down", 4096, 14336))  # fmt: skip
GPU_CASES = tuple((p, fmt, n) for p in LLAMA3_8B_PROJECTIONS for fmt in ("int4", "int8", "fp8")
                  for n in (1, 8, 256))  # (projection, format, rows of x)
DRY_CASES = tuple((Projection("tiny", 96, 128), fmt, n) for fmt in ("int4", "int8", "fp8")
                  for n in (1, 9))  # fmt: skip


def packed_case(proj: Projection, fmt: str, n: int, device: Any, dtype: Any,
                report: Report) -> None:
    import torch

    from radixrt.kernels.packed_reference import dequantize_ref, packed_linear_ref
    from radixrt.kernels.packed_triton import (
        fp8_linear,
        fp8_linear_ref,
        packed_linear,
        quantize_fp8,
    )
    from radixrt.runtime.models.quantize import quantize_int4, quantize_int8

    gen = torch.Generator(device=device).manual_seed(proj.rows + n)
    w = torch.randn(proj.rows, proj.cols, device=device, generator=gen) * proj.cols**-0.5
    x = torch.randn(n, proj.cols, device=device, generator=gen).to(dtype)
    if fmt == "fp8":
        codes, scale = quantize_fp8(w)
        dense = (codes.float() * scale[:, None]).to(dtype)
        nbytes = codes.numel() + scale.numel() * 4

        def run() -> Any:
            return fp8_linear(x, codes, scale)

        ref = fp8_linear_ref(x.float(), codes, scale)
    else:
        packed = (quantize_int4 if fmt == "int4" else quantize_int8)(w)
        dense = dequantize_ref(packed).to(dtype)
        nbytes = sum(t.numel() * t.element_size()
                     for t in (packed.codes, packed.scales, packed.biases))

        def run() -> Any:
            return packed_linear(x, packed)

        ref = packed_linear_ref(x.float(), packed)
    err = rel_err(run(), ref)
    t_packed = bench(run, device)
    t_dense = bench(lambda: torch.nn.functional.linear(x, dense), device)
    result = (f"{fmt_time(t_packed)} vs bf16 {fmt_time(t_dense)} ({t_dense / t_packed:4.2f}x)  "
              f"{fmt_bandwidth(nbytes / t_packed)} weights  err {err:.0e}")
    report.add("packed", f"{fmt} {proj.name} {proj.rows}x{proj.cols} rows={n}", result,
               ok=err < MAX_ERR)


def packed_bench(dry: bool, device: Any, dtype: Any, report: Report) -> None:
    for proj, fmt, n in DRY_CASES if dry else GPU_CASES:
        packed_case(proj, fmt, n, device, dtype, report)
