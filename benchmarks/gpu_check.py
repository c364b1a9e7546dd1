"""One prepared check for a GPU machine: kernel tests, kernel timings, an 8B-shaped decode step.

    python benchmarks/gpu_check.py          # on a CUDA machine; about 3-5 minutes on an H200
    python benchmarks/gpu_check.py --dry    # tiny shapes, Triton's interpreter, CPU (the tests)

1. runs tests/kernels/test_extend_attention.py, tests/kernels/test_cascade_attention.py,
   tests/kernels/test_decode_attention_windows.py, tests/kernels/test_decode_attention_sinks.py,
   tests/kernels/test_fused_moe.py, tests/kernels/test_packed_triton.py,
   tests/kernels/test_lora_triton.py (the LoRA SGMV shrink / expand),
   tests/kernels/test_mla_attention.py (the latent kernels),
   tests/runtime/forward/attention/test_triton_backend.py and test_triton_backend_latent.py
   natively (pytest);
2. measures device-to-device copy bandwidth (the yardstick of "achieved bandwidth");
3. times decode attention (batch 1-256 x context 512-8k) and extend attention against PyTorch
   SDPA over gathered K/V, on Llama-3-8B attention shapes (32 heads, 8 KV heads, head_dim 128,
   bfloat16, page-16 slot tables scattered through the pool), and cascade decode attention
   (32-64 requests sharing a 2k-4k-token prefix, short own KV) against decode attention over
   each request's concatenated KV; then decode and extend under a sliding window (and a logit
   cap, and attention sinks) against the same kernels over the whole context
   (gpu_check_window.py); the fused mixture-of-experts kernel against its PyTorch reference on
   Qwen3-30B-A3B and gpt-oss-20b layer shapes (gpu_check_moe.py); the packed-weight products
   (int4, int8 and FP8 weights, the split-K GEMV and the tiled GEMM) against the same weights
   in bfloat16 through torch, on Llama-3-8B's projection shapes (gpu_check_packed.py); the
   latent-attention decode and extend kernels against SDPA over the gathered latent, on
   DeepSeek-V3's shapes (gpu_check_mla.py);
4. times the decode step (forward + logits) of a dummy-weight Llama-3-8B-shaped model, eager and
   with CUDA graphs: tokens/s and model bandwidth utilisation (weights + KV bytes read per step /
   step time / copy bandwidth).
It prints a short summary table last and exits non-zero when any check failed. Sections that no
longer fit the time budget (--budget-s) are skipped and say so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

from gpu_check_mla import mla_bench
from gpu_check_moe import moe_bench
from gpu_check_packed import packed_bench
from gpu_check_sizes import DRY_SIZES, GPU_SIZES, Sizes
from gpu_check_timing import (
    Report,
    bench,
    compare,
    fmt_bandwidth,
    fmt_time,
    paged_pool,
    rel_err,
)
from gpu_check_window import window_bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dry", action="store_true", help="tiny shapes on the CPU (interpreter)")
    p.add_argument("--budget-s", type=float, default=450.0, help="skip sections past this")
    p.add_argument("--skip-tests", action="store_true", help="timings only")
    return p.parse_args(argv)


# --- sections ----------------------------------------------------------------------------------
def run_kernel_tests(sizes: Sizes, report: Report, timeout_s: float) -> None:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "tests/kernels/test_extend_attention.py", "tests/kernels/test_cascade_attention.py",
           "tests/kernels/test_decode_attention_windows.py",
           "tests/kernels/test_decode_attention_sinks.py", "tests/kernels/test_fused_moe.py",
           "tests/kernels/test_packed_triton.py", "tests/kernels/test_lora_triton.py",
           "tests/kernels/test_mla_attention.py",
           "tests/runtime/forward/attention/test_triton_backend.py",
           "tests/runtime/forward/attention/test_triton_backend_latent.py"]  # fmt: skip
    if sizes.test_filter:
        cmd += ["-k", sizes.test_filter]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        report.add("tests", "pytest (native)", f"timed out after {timeout_s:.0f} s", ok=False)
        return
    lines = [line for line in proc.stdout.strip().splitlines() if line.strip()]
    last = lines[-1].strip("= ") if lines else "no output"
    if proc.returncode != 0:
        print(proc.stdout[-6000:], proc.stderr[-3000:], sep="\n")
    elapsed = time.perf_counter() - start
    report.add("tests", "pytest (native)", f"{last} ({elapsed:.0f} s)", ok=proc.returncode == 0)


def copy_bandwidth(sizes: Sizes, device: Any, report: Report) -> float:
    import torch

    src = torch.empty(sizes.copy_bytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    seconds = bench(lambda: dst.copy_(src), device, flush_l2=False)
    bandwidth = 2 * sizes.copy_bytes / seconds  # read + write
    report.add("copy", f"copy {sizes.copy_bytes >> 20} MiB", fmt_bandwidth(bandwidth))
    return bandwidth


def decode_case(sizes: Sizes, bs: int, ctx: int, pool: tuple[Any, Any, Any], bandwidth: float,
                report: Report) -> None:  # fmt: skip
    import torch
    import torch.nn.functional as F

    from radixrt.kernels.decode_attention import decode_attention

    k_cache, v_cache, all_slots = pool
    device, group, scale = k_cache.device, sizes.heads // sizes.kv_heads, sizes.head_dim**-0.5
    slots = all_slots[: bs * ctx]  # [bs * ctx]
    kv_indptr = torch.arange(bs + 1, device=device) * ctx  # [bs + 1]
    q = torch.randn(bs, sizes.heads, sizes.head_dim, dtype=k_cache.dtype, device=device)
    o = torch.empty_like(q)  # [bs, heads, head_dim]

    def triton_step() -> None:
        decode_attention(q, o, k_cache, v_cache, kv_indptr, slots, scale, max_kv_len=ctx)

    def sdpa_step() -> Any:  # GQA folded: a KV head's query heads are its query rows
        k = k_cache[slots].view(bs, ctx, sizes.kv_heads, -1).transpose(1, 2)
        v = v_cache[slots].view(bs, ctx, sizes.kv_heads, -1).transpose(1, 2)
        qg = q.view(bs, sizes.kv_heads, group, -1)
        return F.scaled_dot_product_attention(qg, k, v, scale=scale).reshape_as(q)

    err, t_triton, t_sdpa = compare(triton_step, sdpa_step, o, device)
    kv_bytes = 2 * k_cache[0].numel() * k_cache.element_size() * bs * ctx
    achieved = (kv_bytes + slots.numel() * 8 + 2 * q.numel() * q.element_size()) / t_triton
    result = (
        f"{fmt_time(t_triton)} vs sdpa {fmt_time(t_sdpa)} ({t_sdpa / t_triton:4.1f}x)  "
        f"{fmt_bandwidth(achieved)} = {achieved / bandwidth:4.0%} of copy  err {err:.0e}"
    )
    report.add("decode", f"bs={bs} ctx={ctx}", result, ok=err < 2e-2)


def decode_bench(sizes: Sizes, device: Any, dtype: Any, bandwidth: float, report: Report) -> None:
    pool = paged_pool(max(sizes.decode_batches) * max(sizes.decode_contexts), sizes, dtype, device)
    for bs in sizes.decode_batches:
        for ctx in sizes.decode_contexts:
            decode_case(sizes, bs, ctx, pool, bandwidth, report)


def cascade_case(sizes: Sizes, bs: int, groups: int, prefix: int, own: int, device: Any,
                 dtype: Any, report: Report) -> None:  # fmt: skip
    """bs requests in `groups` equal groups, each group sharing a prefix of `prefix` tokens, each
    request owning `own` more: cascade_decode_attention vs decode_attention on the full KV."""
    import torch

    from radixrt.kernels.cascade_attention import cascade_decode_attention
    from radixrt.kernels.decode_attention import decode_attention
    from radixrt.kernels.reference import cascade_decode_attention_ref

    scale, members = sizes.head_dim**-0.5, bs // groups
    k_cache, v_cache, slots = paged_pool(groups * prefix + bs * own, sizes, dtype, device)
    prefix_slots = slots[: groups * prefix].view(groups, prefix)  # [groups, prefix]
    own_slots = slots[groups * prefix :].view(bs, own)  # [bs, own]
    group_rows = torch.randperm(bs, device=device)  # [bs]: group g is rows g*members: of it
    group_of = torch.empty_like(group_rows)  # [bs]: each request's group
    group_of[group_rows] = torch.arange(bs, device=device) // members
    full_slots = torch.cat([prefix_slots[group_of], own_slots], 1).reshape(-1)  # [bs * ctx]
    full_indptr = torch.arange(bs + 1, device=device) * (prefix + own)  # [bs + 1]
    args = (
        torch.arange(groups + 1, device=device) * prefix, prefix_slots.reshape(-1),
        torch.arange(groups + 1, device=device) * members, group_rows,
        torch.arange(bs + 1, device=device) * own, own_slots.reshape(-1),
    )  # fmt: skip
    q = torch.randn(bs, sizes.heads, sizes.head_dim, dtype=dtype, device=device)
    o, o_full = torch.empty_like(q), torch.empty_like(q)  # [bs, heads, head_dim]

    def cascade_step() -> None:
        cascade_decode_attention(q, o, k_cache, v_cache, *args, scale, max_group_size=members,
                                 max_kv_len=own)  # fmt: skip

    def decode_step() -> None:
        decode_attention(q, o_full, k_cache, v_cache, full_indptr, full_slots, scale,
                         max_kv_len=prefix + own)  # fmt: skip

    ref = torch.empty(q.shape, dtype=torch.float32, device=device)
    cascade_decode_attention_ref(q, ref, k_cache, v_cache, *args, scale)
    o.fill_(float("nan"))
    o_full.fill_(float("nan"))
    cascade_step()
    decode_step()
    err, err_decode = rel_err(o, ref), rel_err(o_full, ref)
    t_cascade, t_decode = bench(cascade_step, device), bench(decode_step, device)
    result = (
        f"{fmt_time(t_cascade)} vs decode {fmt_time(t_decode)} ({t_decode / t_cascade:4.1f}x)  "
        f"decode err {err_decode:.0e}  err {err:.0e}"
    )
    report.add("cascade", f"bs={bs} g={groups} P={prefix} own={own}", result,
               ok=max(err, err_decode) < 2e-2)  # fmt: skip


def cascade_bench(sizes: Sizes, device: Any, dtype: Any, report: Report) -> None:
    for bs, groups, prefix, own in sizes.cascade_cases:
        cascade_case(sizes, bs, groups, prefix, own, device, dtype, report)


def extend_case(sizes: Sizes, bs: int, new: int, prefix: int, device: Any, dtype: Any,
                report: Report) -> None:  # fmt: skip
    import torch
    import torch.nn.functional as F

    from radixrt.kernels.extend_attention import extend_attention

    scale, group, ctx = sizes.head_dim**-0.5, sizes.heads // sizes.kv_heads, new + prefix
    k_cache, v_cache, slots = paged_pool(bs * ctx, sizes, dtype, device)
    q = torch.randn(bs * new, sizes.heads, sizes.head_dim, dtype=dtype, device=device)
    o = torch.empty_like(q)  # [bs * new, heads, head_dim]
    qo_indptr = torch.arange(bs + 1, device=device) * new  # [bs + 1]
    kv_indptr = torch.arange(bs + 1, device=device) * ctx  # [bs + 1]
    rows = torch.arange(new, device=device).unsqueeze(1)  # [new, 1]
    mask = torch.arange(ctx, device=device).unsqueeze(0) <= rows + prefix  # [new, ctx]

    def triton_step() -> None:
        extend_attention(
            q, o, k_cache, v_cache, qo_indptr, kv_indptr, slots, scale, max_extend_len=new
        )

    def sdpa_step() -> Any:
        k = k_cache[slots].view(bs, ctx, sizes.kv_heads, -1).transpose(1, 2)
        v = v_cache[slots].view(bs, ctx, sizes.kv_heads, -1).transpose(1, 2)
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        qb = q.view(bs, new, sizes.heads, -1).transpose(1, 2)
        if prefix == 0:
            out = F.scaled_dot_product_attention(qb, k, v, is_causal=True, scale=scale)
        else:
            out = F.scaled_dot_product_attention(qb, k, v, attn_mask=mask, scale=scale)
        return out.transpose(1, 2).reshape_as(q)

    err, t_triton, t_sdpa = compare(triton_step, sdpa_step, o, device)
    flops = 4 * bs * sizes.heads * sizes.head_dim * (new * prefix + new * (new + 1) / 2)
    result = (
        f"{fmt_time(t_triton)} vs sdpa {fmt_time(t_sdpa)} ({t_sdpa / t_triton:4.1f}x)  "
        f"{flops / t_triton / 1e12:6.1f} TFLOP/s  err {err:.0e}"
    )
    report.add("extend", f"bs={bs} new={new} prefix={prefix}", result, ok=err < 2e-2)


def extend_bench(sizes: Sizes, device: Any, dtype: Any, report: Report) -> None:
    for bs, new, prefix in sizes.extend_cases:
        extend_case(sizes, bs, new, prefix, device, dtype, report)


def load_dummy_model(sizes: Sizes, device: Any, dtype: Any) -> Any:
    from radixrt.runtime.models.loader import load_model

    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(sizes.model_config, f)
        return load_model(folder, dtype=dtype, device=device, load_format="dummy",
                          attention_backend="triton")  # fmt: skip


def model_step(model: Any, kv_cache: Any, batch: Any, runner: Any) -> Callable[[], Any]:
    """One decode step, forward and logits: replayed from a CUDA graph when runner is given."""
    import torch

    def step() -> Any:
        with torch.inference_mode():
            hidden = None if runner is None else runner.run(batch)
            if hidden is None:
                hidden = model(batch, kv_cache)  # [bs, hidden]
            return model.compute_logits(hidden)  # [bs, vocab]

    return step


def model_bench(sizes: Sizes, device: Any, dtype: Any, bandwidth: float, report: Report) -> None:
    """Decode steps of a dummy-weight model: eager, then (on CUDA) replayed from CUDA graphs."""
    import torch

    from radixrt.runtime.forward.forward_batch import ForwardBatch
    from radixrt.runtime.forward.kv_cache import KVCache

    loaded = load_dummy_model(sizes, device, dtype)
    model, config = loaded.model, loaded.config
    weight_bytes = sum(
        p.numel() * p.element_size()
        for name, p in model.named_parameters()
        if not name.startswith("embed_tokens") or config.tie_word_embeddings
    )  # the embedding table is read a row per token, unless it is also the output head
    most = max(bs * ctx for bs, ctx in sizes.model_cases)
    kv_cache = KVCache.from_config(config, most + most // 4, dtype, device)
    runner = None
    if device.type == "cuda":
        from radixrt.runtime.worker.cuda_graph import CudaGraphRunner

        start = time.perf_counter()
        runner = CudaGraphRunner(model, kv_cache, max(bs for bs, _ in sizes.model_cases))
        elapsed = time.perf_counter() - start
        report.add("model", "capture CUDA graphs", f"{len(runner.graphs)} buckets, {elapsed:.1f} s")
    for bs, ctx in sizes.model_cases:
        slots = torch.randperm(kv_cache.num_slots)[: bs * ctx].view(bs, ctx)
        batch = ForwardBatch.build([[7]] * bs, [ctx - 1] * bs, list(slots), device=device)
        for graph_runner in (None, runner) if runner is not None else (None,):
            case = f"bs={bs} ctx={ctx} {'eager' if graph_runner is None else 'graph'}"
            replays = runner.replays if runner is not None else 0
            seconds = bench(model_step(model, kv_cache, batch, graph_runner), device, False, 0.3)
            if graph_runner is not None and graph_runner.replays == replays:
                report.add("model", case, "no CUDA graph replayed", ok=False)
                continue
            mbu = (weight_bytes + bs * ctx * kv_cache.bytes_per_token()) / seconds / bandwidth
            result = f"{fmt_time(seconds)}/step  {bs / seconds:9.1f} tok/s  MBU {mbu:4.0%}"
            report.add("model", case, result)


# --- main --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry:  # before Triton defines any kernel (radixrt.kernels reads it at import)
        os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, ROOT)
    import torch
    import triton

    if not args.dry and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; use --dry for the CPU smoke run", file=sys.stderr)
        return 2
    sizes = DRY_SIZES if args.dry else GPU_SIZES
    device = torch.device("cpu" if args.dry else "cuda")
    dtype = torch.float32 if args.dry else torch.bfloat16
    name = "CPU (dry run, Triton interpreter)" if args.dry else torch.cuda.get_device_name()
    title = f"{name}, torch {torch.__version__}, triton {triton.__version__}, {dtype}"
    print(f"gpu_check on {title}", flush=True)
    start = time.perf_counter()
    report = Report()

    def section(label: str, need_s: float, fn: Callable[[], Any]) -> Any:
        left = args.budget_s - (time.perf_counter() - start)
        if left < need_s:
            report.add(label, "skipped", f"{left:.0f} s left of the budget, needs ~{need_s:.0f}")
            return None
        print(f"\n[{label}] ({time.perf_counter() - start:.0f} s elapsed)", flush=True)
        try:
            return fn()
        except Exception as exc:  # a failed section must not hide the others
            traceback.print_exc()
            report.add(label, "error", f"{type(exc).__name__}: {exc}", ok=False)
            return None
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()

    if not args.skip_tests:
        timeout = max(60.0, args.budget_s - 200.0)
        section("tests", 60, lambda: run_kernel_tests(sizes, report, timeout))
    bandwidth = section("copy", 5, lambda: copy_bandwidth(sizes, device, report)) or math.nan
    section("decode", 30, lambda: decode_bench(sizes, device, dtype, bandwidth, report))
    section("cascade", 15, lambda: cascade_bench(sizes, device, dtype, report))
    section("extend", 15, lambda: extend_bench(sizes, device, dtype, report))
    section("window", 15, lambda: window_bench(sizes, device, dtype, report))
    section("moe", 15, lambda: moe_bench(args.dry, device, dtype, report))
    section("packed", 20, lambda: packed_bench(args.dry, device, dtype, report))
    section("mla", 15, lambda: mla_bench(args.dry, device, dtype, report))
    section("model", 45, lambda: model_bench(sizes, device, dtype, bandwidth, report))
    if device.type != "cuda":
        report.add("model", "CUDA graphs", "not run: no CUDA in the dry run")
    report.add("total", "wall time", f"{time.perf_counter() - start:.0f} s")
    report.print_table(title)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
