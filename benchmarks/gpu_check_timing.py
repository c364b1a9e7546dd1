"""Shared pieces of benchmarks/gpu_check.py's sections: the report, timing, formatting, the
paged KV pool the attention timings read."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpu_check_sizes import Sizes


@dataclass
class Report:
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # (section, case, result)
    failed: bool = False

    def add(self, section: str, case: str, result: str, ok: bool = True) -> None:
        self.rows.append((section, case, result if ok else f"FAILED: {result}"))
        self.failed |= not ok
        print(f"  {section:<8} {case:<28} {self.rows[-1][2]}", flush=True)

    def print_table(self, title: str) -> None:
        print(f"\n=== gpu_check summary: {title} ===")
        print(f"{'section':<8} {'case':<28} result")
        for section, case, result in self.rows:
            print(f"{section:<8} {case:<28} {result}")


def bench(
    fn: Callable[[], Any], device: Any, flush_l2: bool = True, target_s: float = 0.1
) -> float:
    """Median seconds per call. On CUDA: events, L2 flushed before each call when asked."""
    import torch

    fn()  # warm up (and compile)
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    torch.cuda.synchronize()
    scrub = torch.empty(256 << 20, dtype=torch.int8, device=device) if flush_l2 else None
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    iters = max(5, min(100, int(target_s / max(time.perf_counter() - start, 1e-6))))
    times = []
    for _ in range(iters):
        if scrub is not None:
            scrub.zero_()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def fmt_time(seconds: float) -> str:
    return f"{seconds * 1e6:8.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:8.2f} ms"


def fmt_bandwidth(bytes_per_s: float) -> str:
    if bytes_per_s >= 1e12:
        return f"{bytes_per_s / 1e12:5.2f} TB/s"
    return f"{bytes_per_s / 1e9:5.1f} GB/s"


def rel_err(out: Any, ref: Any) -> float:
    out, ref = out.float(), ref.float()
    if not bool(out.isfinite().all()):
        return math.inf
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-6))


def paged_pool(tokens: int, sizes: Sizes, dtype: Any, device: Any) -> tuple[Any, Any, Any]:
    """K, V caches [slots + 1, kv_heads, head_dim] twice as large as needed, and a permutation of
    page-16 runs of slots to hand out (scattered, each page's slots consecutive)."""
    import torch

    pages = 2 * math.ceil(tokens / 16) + 1
    shape = (pages * 16 + 1, sizes.kv_heads, sizes.head_dim)
    k_cache = torch.randn(shape, dtype=dtype, device=device)
    v_cache = torch.randn(shape, dtype=dtype, device=device)
    order = torch.randperm(pages, device=device)[: math.ceil(tokens / 16)]
    slots = (order.unsqueeze(1) * 16 + torch.arange(16, device=device)).reshape(-1)[:tokens]
    return k_cache, v_cache, slots


def compare(
    triton_step: Callable[[], None], sdpa_step: Callable[[], Any], out: Any, device: Any
) -> tuple[float, float, float]:
    """(relative error of out after triton_step vs SDPA, Triton seconds, SDPA seconds)."""
    out.fill_(float("nan"))
    triton_step()
    err = rel_err(out, sdpa_step())
    return err, bench(triton_step, device), bench(sdpa_step, device)
