"""The latent-attention section of benchmarks/gpu_check.py: the MLA decode and extend kernels
(kernels/mla_attention.py) against PyTorch SDPA over the gathered latent rows (one KV head,
values = the rows' first 512 dims), on DeepSeek-V3's shapes: 128 query heads (tp 1) and 16 (a
tp 8 rank), a latent of 512 + 64 per token, bfloat16, page-16 slot tables scattered through
the pool. Each case reports both times, the kernel's error against SDPA, and its rate: latent
bytes read per second (what bounds decode).
"""

from __future__ import annotations

import math
from typing import Any

from gpu_check_timing import Report, bench, fmt_bandwidth, fmt_time, rel_err

MAX_ERR = 2e-2  # bfloat16 inputs, float32 accumulation
LATENT, ROPE = 512, 64
# (heads, batch, context): decode; (heads, new tokens, prefix): extend
GPU_DECODE = ((128, 1, 4096), (128, 32, 4096), (16, 64, 8192))
GPU_EXTEND = ((16, 512, 0), (16, 256, 2048))
DRY_DECODE = ((16, 2, 24),)
DRY_EXTEND = ((16, 5, 7),)


def _pool(tokens: int, device: Any, dtype: Any) -> tuple[Any, Any]:
    """A latent pool [slots + 1, 1, 576] twice as large as needed, and `tokens` scattered slots
    in page-16 runs."""
    import torch

    pages = 2 * math.ceil(tokens / 16) + 1
    cache = torch.randn(pages * 16 + 1, 1, LATENT + ROPE, dtype=dtype, device=device)
    order = torch.randperm(pages, device=device)[: math.ceil(tokens / 16)]
    slots = (order.unsqueeze(1) * 16 + torch.arange(16, device=device)).reshape(-1)[:tokens]
    return cache, slots


def _sdpa(q: Any, cache: Any, slots: Any, mask: Any, scale: float) -> Any:
    """q [b, heads, m, 576] over slots [b, n] of the pool (mask [b|1, 1, m, n] or None)."""
    import torch.nn.functional as F

    rows = cache[slots].transpose(1, 2)  # [b, 1, n, 576]
    return F.scaled_dot_product_attention(q, rows, rows[..., :LATENT], attn_mask=mask,
                                          scale=scale, enable_gqa=True)


def decode_case(heads: int, bs: int, ctx: int, device: Any, dtype: Any, report: Report) -> None:
    import torch

    from radixrt.kernels.mla_attention import mla_decode_attention

    cache, slots = _pool(bs * ctx, device, dtype)
    slots = slots.view(bs, ctx)
    q = torch.randn(bs, heads, LATENT + ROPE, dtype=dtype, device=device)
    o = torch.empty(bs, heads, LATENT, dtype=dtype, device=device)
    indptr = torch.arange(0, bs * ctx + 1, ctx, device=device)
    scale = (128 + ROPE) ** -0.5

    def kernel() -> None:
        mla_decode_attention(q, o, cache, indptr, slots.reshape(-1), scale, LATENT)

    def sdpa() -> Any:
        return _sdpa(q.unsqueeze(2), cache, slots, None, scale).squeeze(2)

    kernel()
    err = rel_err(o, sdpa())
    t_kernel, t_sdpa = bench(kernel, device), bench(sdpa, device)
    read = bs * ctx * (LATENT + ROPE) * cache.element_size()
    report.add("mla", f"decode heads={heads} bs={bs} ctx={ctx}",
               f"{fmt_time(t_kernel)} vs SDPA {fmt_time(t_sdpa)} ({t_sdpa / t_kernel:4.1f}x)  "
               f"{fmt_bandwidth(read / t_kernel)} latent  err {err:.0e}", ok=err < MAX_ERR)


def extend_case(heads: int, new: int, prefix: int, device: Any, dtype: Any,
                report: Report) -> None:
    import torch

    from radixrt.kernels.mla_attention import mla_extend_attention

    cache, slots = _pool(prefix + new, device, dtype)
    q = torch.randn(new, heads, LATENT + ROPE, dtype=dtype, device=device)
    o = torch.empty(new, heads, LATENT, dtype=dtype, device=device)
    qo = torch.tensor([0, new], device=device)
    kv = torch.tensor([0, prefix + new], device=device)
    scale = (128 + ROPE) ** -0.5
    rows = torch.arange(new, device=device).unsqueeze(1)
    mask = (torch.arange(prefix + new, device=device).unsqueeze(0) <= rows + prefix)[None, None]

    def kernel() -> None:
        mla_extend_attention(q, o, cache, qo, kv, slots, scale, LATENT, max_extend_len=new)

    def sdpa() -> Any:
        return _sdpa(q.transpose(0, 1).unsqueeze(0), cache, slots.unsqueeze(0), mask,
                     scale)[0].transpose(0, 1)

    kernel()
    err = rel_err(o, sdpa())
    t_kernel, t_sdpa = bench(kernel, device), bench(sdpa, device)
    flops = 2 * heads * new * (prefix + new / 2) * (2 * LATENT + ROPE)
    report.add("mla", f"extend heads={heads} new={new} prefix={prefix}",
               f"{fmt_time(t_kernel)} vs SDPA {fmt_time(t_sdpa)} ({t_sdpa / t_kernel:4.1f}x)  "
               f"{flops / t_kernel / 1e12:5.1f} TFLOP/s  err {err:.0e}", ok=err < MAX_ERR)


def mla_bench(dry: bool, device: Any, dtype: Any, report: Report) -> None:
    for heads, bs, ctx in DRY_DECODE if dry else GPU_DECODE:
        decode_case(heads, bs, ctx, device, dtype, report)
    for heads, new, prefix in DRY_EXTEND if dry else GPU_EXTEND:
        extend_case(heads, new, prefix, device, dtype, report)
