"""The sliding-window and logit-cap section of benchmarks/gpu_check.py, on its attention shapes
(Llama-3-8B's on a GPU) with the windows and caps of Mistral and Gemma 2 (W = 1k-4k, cap 50).

- decode: the windowed (and capped) decode kernel against the same kernel over the whole
  context (what the window saves: it reads W of ctx positions per request) and against the
  PyTorch reference (the last W positions gathered, then SDPA or the explicit capped path),
  whose output it must match;
- extend: the windowed extend kernel against the full-context one, and its error against
  extend_attention_ref (not timed: a chunk of queries at a time, slow by design);
- the last decode and extend case once more with attention sinks (gpt-oss: a logit per query
  head), in both kernels and the reference ("sinks" in the case's name).
"""

from __future__ import annotations

from typing import Any

from gpu_check_sizes import Sizes
from gpu_check_timing import Report, bench, compare, fmt_time, paged_pool, rel_err

MAX_ERR = 2e-2  # bfloat16 inputs, float32 accumulation


def case_name(kind: str, bs: int, tokens: str, window: int, cap: float, sinks: Any = None) -> str:
    name = f"{kind} bs={bs} {tokens} W={window}" + (f" c={cap:g}" if cap else "")
    return name + (" sinks" if sinks is not None else "")


def draw_sinks(with_sinks: bool, sizes: Sizes, dtype: Any, device: Any) -> Any:
    """[heads] sink logits in the model's dtype (None: without)."""
    import torch

    return torch.randn(sizes.heads, device=device).to(dtype) + 2.0 if with_sinks else None


def window_decode_case(sizes: Sizes, bs: int, ctx: int, window: int, cap: float,
                       pool: tuple[Any, Any, Any], report: Report,
                       with_sinks: bool = False) -> None:  # fmt: skip
    import torch

    from radixrt.kernels.decode_attention import decode_attention
    from radixrt.kernels.reference import decode_attention_ref

    k_cache, v_cache, all_slots = pool
    device, scale = k_cache.device, sizes.head_dim**-0.5
    slots = all_slots[: bs * ctx]  # [bs * ctx]
    kv_indptr = torch.arange(bs + 1, device=device) * ctx  # [bs + 1]
    q = torch.randn(bs, sizes.heads, sizes.head_dim, dtype=k_cache.dtype, device=device)
    o, o_full = torch.empty_like(q), torch.empty_like(q)  # [bs, heads, head_dim]
    sinks = draw_sinks(with_sinks, sizes, k_cache.dtype, device)
    options = {"sliding_window": window, "logit_cap": cap, "sinks": sinks}

    def windowed() -> None:
        decode_attention(q, o, k_cache, v_cache, kv_indptr, slots, scale, max_kv_len=ctx,
                         **options)  # fmt: skip

    def full() -> None:
        decode_attention(q, o_full, k_cache, v_cache, kv_indptr, slots, scale, max_kv_len=ctx,
                         logit_cap=cap, sinks=sinks)  # fmt: skip

    def reference() -> Any:
        out = torch.empty_like(q)  # [bs, heads, head_dim]
        decode_attention_ref(q, out, k_cache, v_cache, kv_indptr, slots, scale, **options)
        return out

    err, t_window, t_ref = compare(windowed, reference, o, device)
    t_full = bench(full, device)
    result = (
        f"{fmt_time(t_window)} vs full ctx {fmt_time(t_full)} ({t_full / t_window:4.1f}x), "
        f"torch {fmt_time(t_ref)}  err {err:.0e}"
    )
    report.add("window", case_name("decode", bs, f"ctx={ctx}", window, cap, sinks), result,
               ok=err < MAX_ERR)  # fmt: skip


def window_extend_case(sizes: Sizes, bs: int, new: int, prefix: int, window: int, cap: float,
                       device: Any, dtype: Any, report: Report,
                       with_sinks: bool = False) -> None:  # fmt: skip
    import torch

    from radixrt.kernels.extend_attention import extend_attention
    from radixrt.kernels.reference import extend_attention_ref

    scale, ctx = sizes.head_dim**-0.5, new + prefix
    k_cache, v_cache, slots = paged_pool(bs * ctx, sizes, dtype, device)
    q = torch.randn(bs * new, sizes.heads, sizes.head_dim, dtype=dtype, device=device)
    o, o_full = torch.empty_like(q), torch.empty_like(q)  # [bs * new, heads, head_dim]
    ptrs = (torch.arange(bs + 1, device=device) * new, torch.arange(bs + 1, device=device) * ctx,
            slots)  # qo_indptr [bs + 1], kv_indptr [bs + 1], kv_indices [bs * ctx]  # fmt: skip
    sinks = draw_sinks(with_sinks, sizes, dtype, device)
    options = {"sliding_window": window, "logit_cap": cap, "sinks": sinks}

    def windowed() -> None:
        extend_attention(q, o, k_cache, v_cache, *ptrs, scale, max_extend_len=new, **options)

    def full() -> None:
        extend_attention(q, o_full, k_cache, v_cache, *ptrs, scale, max_extend_len=new,
                         logit_cap=cap, sinks=sinks)  # fmt: skip

    o.fill_(float("nan"))
    windowed()
    ref = torch.empty_like(q)  # [bs * new, heads, head_dim]
    extend_attention_ref(q, ref, k_cache, v_cache, *ptrs, scale, **options)
    err = rel_err(o, ref)
    t_window, t_full = bench(windowed, device), bench(full, device)
    pairs = bs * sum(min(prefix + i + 1, window) for i in range(new))  # (query, key) in window
    flops = 4 * sizes.heads * sizes.head_dim * pairs
    result = (
        f"{fmt_time(t_window)} vs full ctx {fmt_time(t_full)} ({t_full / t_window:4.1f}x)  "
        f"{flops / t_window / 1e12:6.1f} TFLOP/s  err {err:.0e}"
    )
    name = case_name("extend", bs, f"new={new} P={prefix}", window, cap, sinks)
    report.add("window", name, result, ok=err < MAX_ERR)


def window_bench(sizes: Sizes, device: Any, dtype: Any, report: Report) -> None:
    most = max(bs * ctx for bs, ctx, _, _ in sizes.window_decode_cases)
    pool = paged_pool(most, sizes, dtype, device)
    for bs, ctx, window, cap in sizes.window_decode_cases:
        window_decode_case(sizes, bs, ctx, window, cap, pool, report)
    window_decode_case(sizes, *sizes.window_decode_cases[-1], pool, report, with_sinks=True)
    del pool
    for bs, new, prefix, window, cap in sizes.window_extend_cases:
        window_extend_case(sizes, bs, new, prefix, window, cap, device, dtype, report)
    window_extend_case(sizes, *sizes.window_extend_cases[-1], device, dtype, report,
                       with_sinks=True)  # fmt: skip
