"""MLA (DeepSeek's multi-head latent attention) Triton kernels against their PyTorch references,
and the references against naive per-head attention.

Without CUDA the kernels run in Triton's CPU interpreter, so shapes stay small: 128 heads (V3's)
only over a handful of KV positions. Cases reuse test_extend_attention's slot tables (scattered
through a pool twice the size needed; page size 1: a random permutation, 16: random pages of 16
slots). Every slot no request owns holds NaN, the padding slot (the last row) included, and
outputs and workspaces are NaN before each run, so a wrong slot or an unwritten element fails.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any Triton kernel is defined (see radixrt.kernels)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from test_extend_attention import (  # noqa: E402
    DEVICE,
    _compile_for_hopper,
    _LaunchRecorder,
    compile_module_for_hopper,
    indptr,
    poisoned_pool,
    rel_err,
    slot_tables,
    to_dev,
)
from torch import Tensor  # noqa: E402

from radixrt.kernels import mla_attention as mla_mod  # noqa: E402
from radixrt.kernels import triton_utils  # noqa: E402
from radixrt.kernels.decode_attention import decode_workspace_numel  # noqa: E402
from radixrt.kernels.mla_attention import mla_decode_attention, mla_extend_attention  # noqa: E402
from radixrt.kernels.mla_reference import (  # noqa: E402
    mla_decode_attention_ref,
    mla_extend_attention_ref,
)

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
TOLERANCE = {F32: 1e-5, BF16: 1e-2, F16: 1e-2}
V3, SMALL = (512, 64), (32, 16)  # (value_dim, rope_dim)
# (num_heads, (value_dim, rope_dim), page size, dtype, max KV length, KV splits)
DECODE_CASES = [
    (1, SMALL, 1, F32, 100, 3),
    (16, SMALL, 16, F32, 100, 1),
    (16, SMALL, 1, BF16, 100, 4),
    (16, V3, 16, F32, 40, 2),
    (1, V3, 1, F16, 40, 3),
    (128, V3, 1, BF16, 6, 2),
    (128, V3, 16, F32, 6, 1),
]
# (num_heads, (value_dim, rope_dim), page size, dtype, max new tokens, with a prefix)
EXTEND_CASES = [
    (1, SMALL, 1, F32, 45, True),  # two query blocks of 32 tokens per request
    (16, SMALL, 16, BF16, 6, True),  # few new tokens: blocks of 8 tokens x 4 heads
    (16, SMALL, 1, F32, 20, False),
    (3, SMALL, 16, F16, 12, False),  # a head count that is not a power of two
    (16, V3, 16, F32, 6, True),
    (128, V3, 1, BF16, 3, True),
]


def case_id(case: tuple) -> str:
    heads, (value_dim, rope_dim), page_size, dtype = case[:4]
    return f"h{heads}-{value_dim}+{rope_dim}-p{page_size}-{str(dtype).removeprefix('torch.')}"


def latent_pool(seq_lens: list[int], page_size: int, head_dim_k: int, gen: torch.Generator):
    """(kv_cache [num_slots + 1, 1, head_dim_k] float32, per-request slot tables): random rows in
    the tables' slots, NaN everywhere else, the padding slot included (no kernel may read it)."""
    num_slots, tables = slot_tables(seq_lens, page_size, gen)
    kv_cache = poisoned_pool(num_slots, tables, 1, head_dim_k, gen)[0]
    kv_cache[num_slots] = float("nan")
    return kv_cache, tables


def naive_attention(
    q: Tensor, kv_cache: Tensor, slots: Tensor, prefix_len: int, scale: float, value_dim: int
) -> Tensor:
    """One request, every head on its own, expanded: k = the whole latent row, v = its first
    value_dim dims, new token j sees positions 0..prefix_len + j. q [q_len, heads, head_dim_k]
    -> [q_len, heads, value_dim] float64."""
    k = kv_cache[slots, 0].double()  # [kv_len, head_dim_k]
    v = k[:, :value_dim]  # [kv_len, value_dim]
    out = torch.empty(q.shape[0], q.shape[1], value_dim, dtype=torch.float64)
    for j in range(q.shape[0]):
        seen = prefix_len + j + 1
        for h in range(q.shape[1]):
            scores = (k[:seen] @ q[j, h].double()) * scale  # [seen]
            weights = torch.exp(scores - scores.max())
            out[j, h] = (weights / weights.sum()) @ v[:seen]
    return out


def test_references_equal_naive_attention() -> None:
    gen = torch.Generator().manual_seed(7)
    heads, value_dim, rope_dim = 3, 8, 4
    prefix_lens, extend_lens = [0, 5, 2], [4, 1, 3]
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    kv_cache, tables = latent_pool(seq_lens, 1, value_dim + rope_dim, gen)
    q = torch.randn(sum(extend_lens), heads, value_dim + rope_dim, generator=gen)
    expected = torch.cat([
        naive_attention(q[s : s + e], kv_cache, t, p, 0.3, value_dim)
        for s, t, p, e in zip(indptr(extend_lens).tolist(), tables, prefix_lens, extend_lens)
    ])  # fmt: skip
    o = torch.full((q.shape[0], heads, value_dim), float("nan"))
    kv_indptr, kv_indices = indptr(seq_lens), torch.cat(tables)
    mla_extend_attention_ref(q, o, kv_cache, indptr(extend_lens), kv_indptr, kv_indices, 0.3,
                             value_dim)  # fmt: skip
    assert rel_err(o, expected.float()) < 1e-5
    last = indptr(extend_lens)[1:] - 1  # each request's last new token, as a decode
    o_decode = torch.full((len(seq_lens), heads, value_dim), float("nan"))
    mla_decode_attention_ref(q[last], o_decode, kv_cache, kv_indptr, kv_indices.int(), 0.3,
                             value_dim)  # fmt: skip
    assert rel_err(o_decode, expected[last].float()) < 1e-5


@pytest.mark.parametrize("case", DECODE_CASES, ids=case_id)
def test_mla_decode_matches_reference(case: tuple) -> None:
    heads, (value_dim, rope_dim), page_size, dtype, max_len, splits = case
    head_dim_k = value_dim + rope_dim
    gen = torch.Generator().manual_seed(DECODE_CASES.index(case))
    seq_lens = [1, *(int(n) for n in torch.randint(2, max_len + 1, (2,), generator=gen))]
    kv_cache, tables = latent_pool(seq_lens, page_size, head_dim_k, gen)
    q = torch.randn(len(seq_lens), heads, head_dim_k, generator=gen)
    q, kv_cache = to_dev(dtype, q, kv_cache)
    index_dtype = torch.int32 if splits % 2 else torch.int64
    kv_indptr, kv_indices = to_dev(index_dtype, indptr(seq_lens), torch.cat(tables))
    scale = head_dim_k**-0.5
    ref = torch.full((len(seq_lens), heads, value_dim), float("nan"))
    mla_decode_attention_ref(q.cpu().float(), ref, kv_cache.cpu().float(), kv_indptr.cpu(),
                             kv_indices.cpu(), scale, value_dim)  # fmt: skip
    numel = decode_workspace_numel(len(seq_lens), heads, value_dim, splits)
    workspace = torch.full((max(numel, 1),), float("nan"), device=DEVICE)
    o = torch.full(ref.shape, float("nan"), dtype=dtype, device=DEVICE)
    mla_decode_attention(q, o, kv_cache, kv_indptr, kv_indices, scale, value_dim,
                         num_kv_splits=splits, workspace=workspace)  # fmt: skip
    assert rel_err(o, ref) < TOLERANCE[dtype], f"splits={splits}"
    if splits > 1:  # and the defaults: the heuristic's split count, a workspace allocated
        o = torch.full(ref.shape, float("nan"), dtype=dtype, device=DEVICE)
        mla_decode_attention(q, o, kv_cache, kv_indptr, kv_indices, scale, value_dim)
        assert rel_err(o, ref) < TOLERANCE[dtype], "default splits"


@pytest.mark.parametrize("case", EXTEND_CASES, ids=case_id)
def test_mla_extend_matches_reference(case: tuple) -> None:
    heads, (value_dim, rope_dim), page_size, dtype, max_len, with_prefix = case
    head_dim_k = value_dim + rope_dim
    gen = torch.Generator().manual_seed(100 + EXTEND_CASES.index(case))
    extend_lens = [max_len, 1, int(torch.randint(1, max_len + 1, (1,), generator=gen))]
    prefix_lens = [0, 0, 0]
    if with_prefix:  # a plain prefill, a decode-like request and a prefix of random length
        prefix_lens = [0, max_len, int(torch.randint(1, 2 * max_len, (1,), generator=gen))]
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    kv_cache, tables = latent_pool(seq_lens, page_size, head_dim_k, gen)
    q = torch.randn(sum(extend_lens), heads, head_dim_k, generator=gen)
    q, kv_cache = to_dev(dtype, q, kv_cache)
    index_dtype = torch.int32 if with_prefix else torch.int64
    ptrs = to_dev(index_dtype, indptr(extend_lens), indptr(seq_lens), torch.cat(tables))
    scale = head_dim_k**-0.5
    ref = torch.full((q.shape[0], heads, value_dim), float("nan"))
    mla_extend_attention_ref(q.cpu().float(), ref, kv_cache.cpu().float(),
                             *(p.cpu() for p in ptrs), scale, value_dim)  # fmt: skip
    o = torch.full(ref.shape, float("nan"), dtype=dtype, device=DEVICE)
    hint = {"max_extend_len": max_len} if with_prefix else {}  # else read from qo_indptr
    mla_extend_attention(q, o, kv_cache, *ptrs, scale, value_dim, **hint)
    assert rel_err(o, ref) < TOLERANCE[dtype]


def test_bad_arguments_raise() -> None:
    q = torch.zeros(2, 4, 48)
    o = torch.zeros(2, 4, 32)
    kv_cache = torch.zeros(9, 1, 48)
    ptr, idx = torch.tensor([0, 1, 2]), torch.tensor([0, 1])
    bad = {
        "exactly one": (q, o, torch.zeros(9, 2, 48), 32),
        "head_dim": (q, o, torch.zeros(9, 1, 64), 32),
        "value_dim": (q, torch.zeros(2, 4, 48), kv_cache, 48),
        "must be": (q, torch.zeros(2, 4, 16), kv_cache, 32),
        "dtypes differ": (q, o, kv_cache.bfloat16(), 32),
    }
    for match, (q_, o_, kv_, value_dim) in bad.items():
        for fn in (mla_decode_attention, mla_decode_attention_ref):
            with pytest.raises(ValueError, match=match):
                fn(q_, o_, kv_, ptr, idx, 1.0, value_dim)
        for fn in (mla_extend_attention, mla_extend_attention_ref):
            with pytest.raises(ValueError, match=match):
                fn(q_, o_, kv_, ptr, ptr, idx, 1.0, value_dim)
    with pytest.raises(ValueError, match="kv_indptr"):
        mla_decode_attention(q, o, kv_cache, ptr[:2], idx, 1.0, 32)
    with pytest.raises(ValueError, match="workspace"):
        mla_decode_attention(q, o, kv_cache, ptr, idx, 1.0, 32, num_kv_splits=2,
                             workspace=torch.zeros(3))  # fmt: skip


# --- GPU code generation, checked on the CPU ---------------------------------------------------

_KERNELS = ("_mla_decode_stage1", "_merge_splits", "_mla_extend_kernel")


def compile_launches_for_hopper() -> None:
    """Run the launchers with their GPU settings on DeepSeek-V3 shapes (128 heads, 512 + 64,
    bfloat16) and a small float32 one ('ieee' dots), recording instead of launching, and compile
    every recorded launch for sm_90. Needs TRITON_INTERPRET=0 (see test_extend_attention)."""
    assert not triton_utils.interpreting(), "run with TRITON_INTERPRET=0"
    calls: list = []
    for name in _KERNELS:
        setattr(mla_mod, name, _LaunchRecorder(getattr(mla_mod, name), calls))
    kv = torch.zeros(33, 1, 576, dtype=torch.bfloat16)
    q = torch.zeros(4, 128, 576, dtype=torch.bfloat16)
    o = torch.zeros(4, 128, 512, dtype=torch.bfloat16)
    ptr, idx = torch.tensor([0, 2, 3, 4, 5]), torch.arange(5)
    mla_decode_attention(q, o, kv, ptr, idx, 0.1, 512, num_kv_splits=4)  # stage 1 and merge
    mla_decode_attention(q, o, kv, ptr, idx, 0.1, 512, num_kv_splits=1)  # stage 1 writes o
    mla_extend_attention(q, o, kv, ptr, ptr, idx, 0.1, 512, max_extend_len=2)  # 2 x 16 heads
    mla_extend_attention(q, o, kv, ptr, ptr, idx, 0.1, 512, max_extend_len=64)  # 32 tokens
    q32, kv32, o32 = q[:, :16, :48].float(), kv[:, :, :48].float(), o[:, :16, :32].float()
    mla_decode_attention(q32, o32, kv32, ptr, idx, 0.1, 32, num_kv_splits=1)
    mla_extend_attention(q32, o32, kv32, ptr, ptr, idx, 0.1, 32, max_extend_len=2)
    assert len(calls) == 7, len(calls)
    for kernel, args, kwargs in calls:
        _compile_for_hopper(kernel, args, kwargs)
    print(f"compiled {len(calls)} launches for sm_90")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the tests above run the kernels natively")
def test_kernels_compile_for_hopper() -> None:
    """V3's shapes compile for sm_90: tl.dot shapes and dtypes the interpreter lets through."""
    compile_module_for_hopper("test_mla_attention", 7)
