"""The Triton attention kernels under a sliding window and logit soft-capping, against their
PyTorch references (which tests/kernels/test_reference.py checks against naive attention).

Without CUDA they run in Triton's CPU interpreter. Cases reuse test_extend_attention's ragged
batches: slot tables scattered through a NaN-poisoned pool (page sizes 1 and 16), NaN-filled
outputs and workspaces. Windows run from 1 (a query sees only itself) to longer than any
request's KV; small blocks give several query blocks and key tiles per request, so a block's
window skips tiles and a row sees no key of some tiles. Queries are scaled up so that a cap
changes the softmax a lot.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any Triton kernel is defined (see radixrt.kernels)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from test_cascade_attention import random_case  # noqa: E402
from test_extend_attention import (  # noqa: E402
    DEVICE,
    NUM_KV_HEADS,
    TOLERANCE,
    indptr,
    make_extend_case,
    poisoned_pool,
    rel_err,
    slot_tables,
    to_dev,
)

from radixrt.kernels.cascade_attention import (  # noqa: E402
    cascade_decode_attention,
    cascade_workspace_numel,
)
from radixrt.kernels.decode_attention import decode_attention, decode_workspace_numel  # noqa: E402
from radixrt.kernels.extend_attention import extend_attention  # noqa: E402
from radixrt.kernels.reference import (  # noqa: E402
    cascade_decode_attention_ref,
    decode_attention_ref,
    extend_attention_ref,
)

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
Q_SCALE = 4.0  # scores of a few units: a cap of 1-5 bites
# (GQA ratio, head_dim, page size, dtype, sliding window, logit cap)
CASES = [
    (1, 64, 1, F32, 5, 0.0),
    (3, 128, 16, BF16, 9, 2.0),
    (2, 256, 1, F16, 1000, 1.5),  # longer than every request's KV
    (8, 64, 16, F32, 1, 0.0),  # a query sees itself only
    (1, 256, 16, F32, 20, 0.0),
    (2, 96, 1, F32, None, 1.0),  # a cap alone; head_dim not a power of two
    (3, 32, 16, F16, 3, 5.0),
    (1, 128, 1, BF16, 40, 0.0),
]
Case = tuple[int, int, int, torch.dtype, int | None, float]


def case_id(case: Case) -> str:
    group, head_dim, page_size, dtype, window, cap = case
    return f"g{group}-d{head_dim}-p{page_size}-{str(dtype)[6:]}-w{window}-c{cap:g}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_extend_window_and_cap_match_reference(case: Case) -> None:
    group, head_dim, page_size, dtype, window, cap = case
    gen = torch.Generator().manual_seed(500 + CASES.index(case))
    c = make_extend_case(group, head_dim, page_size, gen, max_len=24)
    q, k_cache, v_cache = to_dev(dtype, c.q * Q_SCALE, c.k_cache, c.v_cache)
    ptrs = (c.qo_indptr, c.kv_indptr, c.kv_indices)
    options = {"sliding_window": window, "logit_cap": cap}
    ref = torch.full(q.shape, float("nan"))
    extend_attention_ref(q.cpu().float(), ref, k_cache.cpu().float(), v_cache.cpu().float(),
                         *ptrs, head_dim**-0.5, **options)  # fmt: skip
    o = torch.full_like(q, float("nan"))
    extend_attention(q, o, k_cache, v_cache, *to_dev(torch.int64, *ptrs), head_dim**-0.5,
                     **options, block_m=16, block_n=16)  # fmt: skip
    assert rel_err(o, ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_decode_window_and_cap_match_reference(case: Case) -> None:
    group, head_dim, page_size, dtype, window, cap = case
    gen = torch.Generator().manual_seed(600 + CASES.index(case))
    seq_lens = [1, *(int(n) for n in torch.randint(2, 70, (3,), generator=gen))]
    num_slots, tables = slot_tables(seq_lens, page_size, gen)
    k_cache, v_cache = poisoned_pool(num_slots, tables, NUM_KV_HEADS, head_dim, gen)
    q = Q_SCALE * torch.randn(len(seq_lens), NUM_KV_HEADS * group, head_dim, generator=gen)
    q, k_cache, v_cache = to_dev(dtype, q, k_cache, v_cache)
    kv_indptr, kv_indices = indptr(seq_lens), torch.cat(tables)
    options = {"sliding_window": window, "logit_cap": cap}
    ref = torch.full(q.shape, float("nan"))
    decode_attention_ref(q.cpu().float(), ref, k_cache.cpu().float(), v_cache.cpu().float(),
                         kv_indptr, kv_indices, head_dim**-0.5, **options)  # fmt: skip
    kv_indptr, kv_indices = to_dev(torch.int64, kv_indptr, kv_indices)
    for grouped, splits in ((False, 3), (True, 3), (True, 1)):
        numel = decode_workspace_numel(len(seq_lens), q.shape[1], head_dim, splits)
        workspace = torch.full((max(numel, 1),), float("nan"), device=DEVICE)
        o = torch.full_like(q, float("nan"))
        decode_attention(q, o, k_cache, v_cache, kv_indptr, kv_indices, head_dim**-0.5,
                         **options, num_kv_splits=splits, workspace=workspace, grouped=grouped,
                         block_n=16)  # fmt: skip
        assert rel_err(o, ref) < TOLERANCE[dtype], f"grouped={grouped}, splits={splits}"


@pytest.mark.parametrize(
    "kv_group,head_dim,page_size,dtype,cap",
    [(2, 64, 1, F32, 1.0), (3, 128, 16, BF16, 2.5), (1, 256, 16, F16, 4.0)],
)  # fmt: skip
def test_cascade_cap_matches_reference(
    kv_group: int, head_dim: int, page_size: int, dtype: torch.dtype, cap: float
) -> None:
    """The cascade kernel takes a logit cap (no window: see radixrt.kernels.cascade_attention)."""
    gen = torch.Generator().manual_seed(700 + head_dim)
    c = random_case(kv_group, head_dim, page_size, gen)
    c.q = c.q * Q_SCALE
    q, *rest = c.args(dtype)
    ref = torch.full(q.shape, float("nan"))
    cpu = [t.cpu().float() if t.is_floating_point() else t.cpu() for t in rest]
    cascade_decode_attention_ref(q.cpu().float(), ref, *cpu, head_dim**-0.5, logit_cap=cap)
    plain = torch.full(q.shape, float("nan"))
    decode_attention_ref(q.cpu().float(), plain, cpu[0], cpu[1], c.full_indptr, c.full_indices,
                         head_dim**-0.5, logit_cap=cap)  # fmt: skip
    assert rel_err(ref, plain) < 1e-5
    numel = cascade_workspace_numel(q.shape[0], q.shape[1], head_dim, 2, 3)
    workspace = torch.full((numel,), float("nan"), device=DEVICE)
    o = torch.full_like(q, float("nan"))
    cascade_decode_attention(q, o, *rest, head_dim**-0.5, logit_cap=cap, num_kv_splits=2,
                             num_prefix_splits=3, workspace=workspace, block_m=16,
                             block_n=16)  # fmt: skip
    assert rel_err(o, ref) < TOLERANCE[dtype]
