"""The fused mixture-of-experts section of benchmarks/gpu_check.py: the Triton kernel against
its PyTorch reference (the grouped per-expert path the CPU runs), on one MoE layer of
Qwen3-30B-A3B's shape (128 experts, top-8, hidden 2048, intermediate 768; decode-sized and
prefill-sized steps) and of gpt-oss-20b's (32 experts, top-4, hidden 2880, intermediate 2880,
biases and the clamped SwiGLU). Each case reports both times, the kernel's error against the
reference, and the kernel's rate: the chosen experts' weight bytes read per second (what bounds
decode) and TFLOP/s (what bounds prefill).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_check_timing import Report, bench, fmt_bandwidth, fmt_time, rel_err

MAX_ERR = 2e-2  # bfloat16 inputs, float32 accumulation


@dataclass(frozen=True)
class MoELayer:
    name: str
    num_experts: int
    top_k: int
    hidden: int
    inter: int
    activation: str = "silu"
    bias: bool = False


QWEN3_30B_A3B = MoELayer("qwen3-30b-a3b", 128, 8, 2048, 768)
GPT_OSS_20B = MoELayer("gpt-oss-20b", 32, 4, 2880, 2880, "swiglu_oai", bias=True)
GPU_MOE_CASES = ((QWEN3_30B_A3B, 1), (QWEN3_30B_A3B, 16), (QWEN3_30B_A3B, 256),
                 (GPT_OSS_20B, 16))  # (layer, tokens)  # fmt: skip
TINY_MOE = MoELayer("tiny", 16, 4, 64, 32)
DRY_MOE_CASES = ((TINY_MOE, 1), (TINY_MOE, 5),
                 (MoELayer("tiny-oss", 8, 2, 64, 48, "swiglu_oai", bias=True), 3))  # fmt: skip


def moe_inputs(layer: MoELayer, tokens: int, device: Any, dtype: Any) -> tuple[tuple, dict]:
    """(x, w_gate_up, w_down, topk_ids, topk_weights), keywords: random weights, softmax-top-k
    routing of random router logits."""
    import torch

    e, hidden, inter = layer.num_experts, layer.hidden, layer.inter
    x = torch.randn(tokens, hidden, device=device, dtype=dtype)
    w_gate_up = torch.randn(e, 2 * inter, hidden, device=device, dtype=dtype) * hidden**-0.5
    w_down = torch.randn(e, hidden, inter, device=device, dtype=dtype) * inter**-0.5
    logits = torch.randn(tokens, e, device=device)  # [tokens, num_experts]
    topk_weights, topk_ids = torch.topk(torch.softmax(logits, -1), layer.top_k, dim=-1)
    topk_weights = topk_weights / topk_weights.sum(-1, keepdim=True)  # [tokens, top_k]
    kwargs: dict[str, Any] = {"activation": layer.activation}
    if layer.bias:
        kwargs["gate_up_bias"] = torch.randn(e, 2 * inter, device=device, dtype=dtype) * 0.1
        kwargs["down_bias"] = torch.randn(e, hidden, device=device, dtype=dtype) * 0.1
    return (x, w_gate_up, w_down, topk_ids, topk_weights), kwargs


def moe_case(layer: MoELayer, tokens: int, device: Any, dtype: Any, report: Report) -> None:
    from radixrt.kernels.fused_moe import fused_moe
    from radixrt.kernels.moe_reference import fused_moe_ref

    args, kwargs = moe_inputs(layer, tokens, device, dtype)
    out = fused_moe(*args, **kwargs)  # [tokens, hidden]
    err = rel_err(out, fused_moe_ref(*args, **kwargs))
    t_triton = bench(lambda: fused_moe(*args, **kwargs), device)
    t_ref = bench(lambda: fused_moe_ref(*args, **kwargs), device)
    chosen = int(args[3].unique().numel())  # experts whose weights the step reads
    weight_bytes = chosen * 3 * layer.inter * layer.hidden * args[1].element_size()
    flops = 2 * tokens * layer.top_k * 3 * layer.inter * layer.hidden
    result = (
        f"{fmt_time(t_triton)} vs torch {fmt_time(t_ref)} ({t_ref / t_triton:4.1f}x)  "
        f"{fmt_bandwidth(weight_bytes / t_triton)} weights  "
        f"{flops / t_triton / 1e12:5.1f} TFLOP/s  err {err:.0e}"
    )
    report.add("moe", f"{layer.name} tokens={tokens}", result, ok=err < MAX_ERR)


def moe_bench(dry: bool, device: Any, dtype: Any, report: Report) -> None:
    for layer, tokens in DRY_MOE_CASES if dry else GPU_MOE_CASES:
        moe_case(layer, tokens, device, dtype, report)
