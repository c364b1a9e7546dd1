"""Triton kernels (store_kv, extend_attention, decode_attention) against their PyTorch references.

Without CUDA they run in Triton's CPU interpreter. Every case draws ragged shapes from its own
seed and scatters slot tables through a pool larger than needed (page size 1: a random
permutation of slots; page size 16: random pages of 16 consecutive slots). Slots no request owns
hold NaN, and outputs are NaN before each run, so a wrong slot or an unwritten element fails.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any Triton kernel is defined (see radixrt.kernels)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import itertools  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from torch import Tensor  # noqa: E402

from radixrt.kernels import decode_attention as decode_mod  # noqa: E402
from radixrt.kernels import extend_attention as extend_mod  # noqa: E402
from radixrt.kernels import store_kv as store_mod  # noqa: E402
from radixrt.kernels import triton_utils  # noqa: E402
from radixrt.kernels.decode_attention import decode_attention, decode_workspace_numel  # noqa: E402
from radixrt.kernels.extend_attention import extend_attention  # noqa: E402
from radixrt.kernels.reference import (  # noqa: E402
    decode_attention_ref,
    extend_attention_ref,
    store_kv_ref,
)
from radixrt.kernels.store_kv import store_kv  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 1e-2, torch.float16: 1e-2}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Every (GQA ratio, head_dim, page size) once, the dtypes taking turns: 12 cases per kernel.
SHAPES = [
    (group, head_dim, page_size, DTYPES[i % 3])
    for i, (group, head_dim, page_size) in enumerate(
        itertools.product((1, 3, 8), (64, 128), (1, 16))
    )
]
NUM_KV_HEADS = 2


def shape_id(case: tuple[int, int, int, torch.dtype]) -> str:
    group, head_dim, page_size, dtype = case
    return f"g{group}-d{head_dim}-p{page_size}-{str(dtype).removeprefix('torch.')}"


def slot_tables(seq_lens: list[int], page_size: int, gen: torch.Generator) -> tuple[int, list]:
    """(num_slots, per-request slot tables) scattered through a pool twice the size needed."""
    pages_needed = sum(math.ceil(n / page_size) for n in seq_lens)
    num_pages = 2 * pages_needed + 3
    pages = torch.randperm(num_pages, generator=gen)
    tables, used = [], 0
    for n in seq_lens:
        count = math.ceil(n / page_size)
        mine = pages[used : used + count]  # [count] page ids, in random order
        used += count
        slots = (mine.unsqueeze(1) * page_size + torch.arange(page_size)).reshape(-1)
        tables.append(slots[:n])
    return num_pages * page_size, tables


def poisoned_pool(
    num_slots: int, tables: list[Tensor], kv_heads: int, head_dim: int, gen: torch.Generator
) -> tuple[Tensor, Tensor]:
    """float32 K and V [num_slots + 1, kv_heads, head_dim]: random in the tables' slots, NaN in
    every other slot, zeros in the padding slot (the last row)."""
    shape = (num_slots + 1, kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"))
    v_cache = torch.full(shape, float("nan"))
    used = torch.cat(tables).unique()
    k_cache[used] = torch.randn(used.numel(), kv_heads, head_dim, generator=gen)
    v_cache[used] = torch.randn(used.numel(), kv_heads, head_dim, generator=gen)
    k_cache[num_slots] = 0.0
    v_cache[num_slots] = 0.0
    return k_cache, v_cache


def indptr(lens: list[int]) -> Tensor:
    return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int64)


def rel_err(out: Tensor, ref: Tensor) -> float:
    """max |out - ref| / max |ref| (NaN anywhere in out counts as infinitely wrong)."""
    out = out.float().cpu()
    if torch.isnan(out).any():
        return math.inf
    return ((out - ref).abs().max() / ref.abs().max()).item()


def to_dev(dtype: torch.dtype, *tensors: Tensor) -> list[Tensor]:
    return [t.to(DEVICE, dtype) for t in tensors]


# --- store_kv --------------------------------------------------------------------------------


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(
    "src_dtype,cache_dtype",
    [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
     (torch.float16, torch.float16), (torch.float32, torch.bfloat16)],
)  # fmt: skip
def test_store_kv_matches_reference(
    page_size: int, src_dtype: torch.dtype, cache_dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(page_size * 7 + DTYPES.index(cache_dtype))
    kv_heads, head_dim = 3, 64
    seq_lens = [int(n) for n in torch.randint(1, 40, (3,), generator=gen)]
    num_slots, tables = slot_tables(seq_lens, page_size, gen)
    out_slots = torch.cat(tables)  # [num_tokens]
    n = out_slots.numel()
    # k and v as the model makes them: strided views into one fused projection
    qkv = torch.randn(n, 4 * kv_heads * head_dim, generator=gen)
    k = qkv[:, : kv_heads * head_dim].view(n, kv_heads, head_dim)
    v = qkv[:, 2 * kv_heads * head_dim : 3 * kv_heads * head_dim].view(n, kv_heads, head_dim)
    k_cache = torch.randn(num_slots + 1, kv_heads, head_dim, generator=gen)
    v_cache = torch.randn(num_slots + 1, kv_heads, head_dim, generator=gen)
    k_cache[out_slots] = float("nan")  # the slots to write start poisoned
    v_cache[out_slots] = float("nan")
    k_dev, v_dev = (t.to(DEVICE, src_dtype) for t in (k, v))
    kc_dev, vc_dev = to_dev(cache_dtype, k_cache, v_cache)
    kc_ref, vc_ref = kc_dev.cpu().clone(), vc_dev.cpu().clone()
    store_kv(kc_dev, vc_dev, k_dev, v_dev, out_slots.to(DEVICE))
    store_kv_ref(kc_ref, vc_ref, k_dev.cpu(), v_dev.cpu(), out_slots)
    assert not torch.isnan(kc_dev[out_slots.to(DEVICE)]).any()
    assert torch.equal(kc_dev.cpu(), kc_ref) and torch.equal(vc_dev.cpu(), vc_ref)


# --- extend_attention ------------------------------------------------------------------------


@dataclass
class ExtendCase:
    q: Tensor  # [num_tokens, num_heads, head_dim] float32
    k_cache: Tensor  # [num_slots + 1, kv_heads, head_dim] float32
    v_cache: Tensor
    qo_indptr: Tensor  # [bs + 1]
    kv_indptr: Tensor  # [bs + 1]
    kv_indices: Tensor  # [sum(seq_lens)]
    max_extend_len: int


def make_extend_case(
    group: int, head_dim: int, page_size: int, gen: torch.Generator, max_len: int = 40
) -> ExtendCase:
    bs = int(torch.randint(2, 5, (1,), generator=gen))
    extend_lens = [int(n) for n in torch.randint(1, max_len, (bs,), generator=gen)]
    prefix_lens = [int(n) for n in torch.randint(1, max_len, (bs,), generator=gen)]
    prefix_lens[0] = 0  # a plain prefill ...
    extend_lens[-1] = 1  # ... and a decode-like request (one token after a prefix) in every batch
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    num_slots, tables = slot_tables(seq_lens, page_size, gen)
    k_cache, v_cache = poisoned_pool(num_slots, tables, NUM_KV_HEADS, head_dim, gen)
    q = torch.randn(sum(extend_lens), NUM_KV_HEADS * group, head_dim, generator=gen)
    return ExtendCase(
        q, k_cache, v_cache, indptr(extend_lens), indptr(seq_lens), torch.cat(tables),
        max(extend_lens),
    )  # fmt: skip


@pytest.mark.parametrize("case", SHAPES, ids=shape_id)
def test_extend_attention_matches_reference(case: tuple[int, int, int, torch.dtype]) -> None:
    group, head_dim, page_size, dtype = case
    gen = torch.Generator().manual_seed(SHAPES.index(case))
    c = make_extend_case(group, head_dim, page_size, gen)
    q, k_cache, v_cache = to_dev(dtype, c.q, c.k_cache, c.v_cache)
    ref = torch.full(q.shape, float("nan"))
    extend_attention_ref(
        q.cpu().float(), ref, k_cache.cpu().float(), v_cache.cpu().float(),
        c.qo_indptr, c.kv_indptr, c.kv_indices, head_dim**-0.5,
    )  # fmt: skip
    # small blocks in half the cases: several query and key blocks per request
    blocks = {"block_m": 16, "block_n": 16} if page_size == 1 else {}
    o = torch.full_like(q, float("nan"))
    extend_attention(
        q, o, k_cache, v_cache, *to_dev(torch.int64, c.qo_indptr, c.kv_indptr, c.kv_indices),
        head_dim**-0.5, **blocks,
    )  # fmt: skip
    assert rel_err(o, ref) < TOLERANCE[dtype]


def test_extend_attention_head_dim_96_and_no_max_len_hint() -> None:
    """A head_dim that is not a power of two, and max_extend_len read from qo_indptr."""
    gen = torch.Generator().manual_seed(96)
    c = make_extend_case(2, 96, 1, gen, max_len=20)
    ref = torch.empty_like(c.q)
    ptrs = (c.qo_indptr, c.kv_indptr, c.kv_indices)
    extend_attention_ref(c.q, ref, c.k_cache, c.v_cache, *ptrs, 0.1)
    q, k_cache, v_cache = to_dev(torch.float32, c.q, c.k_cache, c.v_cache)
    o = torch.full_like(q, float("nan"))
    extend_attention(q, o, k_cache, v_cache, *to_dev(torch.int64, *ptrs), 0.1)
    assert rel_err(o, ref) < TOLERANCE[torch.float32]


# --- decode_attention ------------------------------------------------------------------------


@pytest.mark.parametrize("case", SHAPES, ids=shape_id)
def test_decode_attention_matches_reference(case: tuple[int, int, int, torch.dtype]) -> None:
    group, head_dim, page_size, dtype = case
    gen = torch.Generator().manual_seed(100 + SHAPES.index(case))
    bs = int(torch.randint(3, 7, (1,), generator=gen))
    seq_lens = [int(n) for n in torch.randint(1, 120, (bs,), generator=gen)]
    seq_lens[0] = 1  # the shortest possible: fewer keys than splits
    num_slots, tables = slot_tables(seq_lens, page_size, gen)
    tables.append(torch.tensor([num_slots]))  # a CUDA graph's dummy row: the padding slot only
    bs += 1
    k_cache, v_cache = poisoned_pool(num_slots, tables, NUM_KV_HEADS, head_dim, gen)
    q = torch.randn(bs, NUM_KV_HEADS * group, head_dim, generator=gen)
    kv_indptr, kv_indices = indptr([*seq_lens, 1]), torch.cat(tables)
    ref = torch.full(q.shape, float("nan"))
    q, k_cache, v_cache = to_dev(dtype, q, k_cache, v_cache)
    decode_attention_ref(
        q.cpu().float(), ref, k_cache.cpu().float(), v_cache.cpu().float(), kv_indptr, kv_indices,
        head_dim**-0.5,
    )  # fmt: skip
    kv_indptr, kv_indices = to_dev(torch.int64, kv_indptr, kv_indices)
    splits = int(torch.randint(2, 5, (1,), generator=gen))
    numel = decode_workspace_numel(bs, q.shape[1], head_dim, splits)
    for grouped in (False, True):
        workspace = torch.full((numel,), float("nan"), device=DEVICE)
        o = torch.full_like(q, float("nan"))
        decode_attention(
            q, o, k_cache, v_cache, kv_indptr, kv_indices, head_dim**-0.5,
            num_kv_splits=splits, workspace=workspace, grouped=grouped, block_n=16,
        )  # fmt: skip
        assert rel_err(o, ref) < TOLERANCE[dtype], f"grouped={grouped}, splits={splits}"
    o = torch.full_like(q, float("nan"))
    decode_attention(q, o, k_cache, v_cache, kv_indptr, kv_indices, head_dim**-0.5)  # defaults
    assert rel_err(o, ref) < TOLERANCE[dtype]


def test_decode_split_heuristic() -> None:
    cpu = torch.device("cpu")
    assert decode_mod.default_num_kv_splits(1, 8, cpu) == 1  # one compute unit: no split
    assert 1 <= decode_mod.default_num_kv_splits(256, 8, DEVICE, 8192) <= decode_mod.MAX_KV_SPLITS


# --- GPU code generation, checked on the CPU ---------------------------------------------------

_SIG_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
              torch.int64: "i64", torch.int32: "i32"}  # fmt: skip
_KERNELS = [(store_mod, "_store_kv_kernel"), (extend_mod, "_extend_kernel"),
            (decode_mod, "_decode_stage1"), (decode_mod, "_decode_grouped_stage1"),
            (decode_mod, "_decode_stage2")]  # fmt: skip


class _LaunchRecorder:
    """Stands in for a kernel: records (kernel, args, kwargs) of `kernel[grid](...)` calls."""

    def __init__(self, kernel: Any, calls: list) -> None:
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *args, **kwargs: self.calls.append((self.kernel, args, kwargs))


def _compile_for_hopper(kernel: Any, args: tuple, kwargs: dict) -> None:
    """Compile one recorded launch for sm_90 (down to a cubin) without a GPU."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
    values = dict(zip(kernel.arg_names, args)) | kwargs
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    for i, name in enumerate(kernel.arg_names):
        value = values[name]
        if i in kernel.constexprs:
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, Tensor):
            signature[name] = "*" + _SIG_TYPES[value.dtype]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name] = "i64" if abs(value) >= 1 << 31 else "i32"
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def compile_launches_for_hopper() -> None:
    """Run the launchers with their GPU settings, recording instead of launching, and compile
    every recorded launch for sm_90. Needs TRITON_INTERPRET=0 (a process of its own: the
    interpreter patches triton.language for the whole process)."""
    assert not triton_utils.interpreting(), "run with TRITON_INTERPRET=0"
    calls: list = []
    for mod, name in _KERNELS:
        setattr(mod, name, _LaunchRecorder(getattr(mod, name), calls))
    kv = torch.zeros(33, 8, 128, dtype=torch.bfloat16)
    q = torch.zeros(4, 32, 128, dtype=torch.bfloat16)
    ptr, idx = torch.tensor([0, 2, 3, 4, 5]), torch.arange(5)
    store_kv(kv, kv, q[:, :8], q[:, 8:16], idx[:4])
    extend_attention(q, q, kv, kv, ptr, ptr, idx, 0.1, max_extend_len=2)
    decode_attention(q, q, kv, kv, ptr, idx, 0.1, num_kv_splits=4)  # grouped
    q32, kv32 = q[:, :8, :64].float(), kv[:, :, :64].float()
    extend_attention(q32, q32.clone(), kv32, kv32, ptr, ptr, idx, 0.1, max_extend_len=2)
    decode_attention(q32, q32.clone(), kv32, kv32, ptr, idx, 0.1, num_kv_splits=3)  # per head
    decode_attention(q, q, kv, kv, ptr, idx, 0.1, num_kv_splits=1)  # stage 1 writes o
    decode_attention(q32, q32.clone(), kv32, kv32, ptr, idx, 0.1, num_kv_splits=1)
    window_cap = {"sliding_window": 3, "logit_cap": 30.0}  # the masked and soft-capped variants
    extend_attention(q, q, kv, kv, ptr, ptr, idx, 0.1, max_extend_len=2, **window_cap)
    decode_attention(q, q, kv, kv, ptr, idx, 0.1, num_kv_splits=4, **window_cap)  # grouped
    decode_attention(q32, q32.clone(), kv32, kv32, ptr, idx, 0.1, num_kv_splits=1, **window_cap)
    sinks = {"sinks": torch.zeros(32, dtype=torch.bfloat16)}  # a bfloat16 model's parameter
    extend_attention(q, q, kv, kv, ptr, ptr, idx, 0.1, max_extend_len=2, **sinks, **window_cap)
    decode_attention(q, q, kv, kv, ptr, idx, 0.1, num_kv_splits=4, **sinks)  # stage 2 adds it
    decode_attention(q, q, kv, kv, ptr, idx, 0.1, num_kv_splits=1, **sinks)  # grouped stage 1
    sinks32 = torch.zeros(8)  # float32 sinks, per-head stage 1 writing o
    decode_attention(q32, q32.clone(), kv32, kv32, ptr, idx, 0.1, num_kv_splits=1, sinks=sinks32)
    assert len(calls) == 18, len(calls)
    for kernel, args, kwargs in calls:
        _compile_for_hopper(kernel, args, kwargs)
    print(f"compiled {len(calls)} launches for sm_90")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the native tests above compile them")
def test_kernels_compile_for_hopper() -> None:
    """The launchers' GPU settings (block sizes, bfloat16 dots, float32 'ieee' dots, sliding
    window, logit cap and sinks variants) compile for sm_90: catches what the interpreter lets
    through (tl.dot shapes and dtypes, loop types)."""
    compile_module_for_hopper("test_extend_attention", 18)


def compile_module_for_hopper(module: str, launches: int) -> None:
    """Run `module`.compile_launches_for_hopper() in a process without the interpreter (the
    kernels defined for real), and check that it compiled `launches` launches."""
    pytest.importorskip("triton.backends.nvidia")
    code = f"import {module} as t; t.compile_launches_for_hopper()"
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=os.path.dirname(__file__), env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"compiled {launches} launches for sm_90" in proc.stdout
