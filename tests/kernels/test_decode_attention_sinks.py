"""The Triton attention kernels with attention sinks (gpt-oss), against their PyTorch references
(which tests/kernels/test_reference_sinks.py checks against the definition).

Without CUDA they run in Triton's CPU interpreter. Cases reuse test_extend_attention's ragged
batches (slot tables scattered through a NaN-poisoned pool, page sizes 1 and 16, NaN-filled
outputs and workspaces), alone and under sliding windows and logit caps. Decode runs both stage-1
variants with one split (stage 1 adds the sink) and several (stage 2 adds it); cascade adds it in
its merge. Each case also checks that the reference with the sink is far from the one without,
so a kernel that dropped the sink would fail.
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
from torch import Tensor  # noqa: E402

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

F32, BF16 = torch.float32, torch.bfloat16
Q_SCALE = 2.0  # scores of a few units, sinks drawn near them
# (GQA ratio, head_dim, page size, dtype, sliding window, logit cap)
CASES = [
    (1, 64, 1, F32, None, 0.0),
    (4, 64, 16, BF16, None, 0.0),
    (2, 128, 16, F32, 7, 0.0),
    (3, 64, 1, BF16, 5, 2.0),
    (8, 96, 16, F32, 1, 0.0),  # a query sees itself and the sink only; head_dim not a power of 2
    (2, 128, 1, BF16, None, 1.5),
]
Case = tuple[int, int, int, torch.dtype, int | None, float]


def case_id(case: Case) -> str:
    group, head_dim, page_size, dtype, window, cap = case
    return f"g{group}-d{head_dim}-p{page_size}-{str(dtype)[6:]}-w{window}-c{cap:g}"


def draw_sinks(num_heads: int, dtype: torch.dtype, gen: torch.Generator) -> Tensor:
    """Sinks in the model's dtype, on the device: logits around the scores' magnitude."""
    return (2.0 * torch.randn(num_heads, generator=gen) + 2.0).to(DEVICE, dtype)


def refs(fn: object, q: Tensor, args: tuple, sinks: Tensor, **options: object) -> Tensor:
    """fn's float32 result on the dtype-rounded inputs with the sinks, checked to be far from
    the result without them."""
    outs = []
    for s in (sinks.cpu().float(), None):
        out = torch.full(q.shape, float("nan"))
        fn(q.cpu().float(), out, *args, **options, sinks=s)  # type: ignore[operator]
        outs.append(out)
    assert rel_err(outs[1], outs[0]) > 0.05, "the sinks barely change the result"
    return outs[0]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_extend_with_sinks_matches_reference(case: Case) -> None:
    group, head_dim, page_size, dtype, window, cap = case
    gen = torch.Generator().manual_seed(800 + CASES.index(case))
    c = make_extend_case(group, head_dim, page_size, gen, max_len=24)
    q, k_cache, v_cache = to_dev(dtype, c.q * Q_SCALE, c.k_cache, c.v_cache)
    sinks = draw_sinks(q.shape[1], dtype, gen)
    ptrs = (c.qo_indptr, c.kv_indptr, c.kv_indices)
    options = {"sliding_window": window, "logit_cap": cap}
    ref = refs(extend_attention_ref, q, (k_cache.cpu().float(), v_cache.cpu().float(), *ptrs,
                                         head_dim**-0.5), sinks, **options)  # fmt: skip
    o = torch.full_like(q, float("nan"))
    extend_attention(q, o, k_cache, v_cache, *to_dev(torch.int64, *ptrs), head_dim**-0.5,
                     **options, sinks=sinks, block_m=16, block_n=16)  # fmt: skip
    assert rel_err(o, ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_decode_with_sinks_matches_reference(case: Case) -> None:
    group, head_dim, page_size, dtype, window, cap = case
    gen = torch.Generator().manual_seed(900 + CASES.index(case))
    seq_lens = [1, *(int(n) for n in torch.randint(2, 70, (3,), generator=gen))]
    num_slots, tables = slot_tables(seq_lens, page_size, gen)
    k_cache, v_cache = poisoned_pool(num_slots, tables, NUM_KV_HEADS, head_dim, gen)
    q = Q_SCALE * torch.randn(len(seq_lens), NUM_KV_HEADS * group, head_dim, generator=gen)
    q, k_cache, v_cache = to_dev(dtype, q, k_cache, v_cache)
    sinks = draw_sinks(q.shape[1], dtype, gen)
    kv_indptr, kv_indices = indptr(seq_lens), torch.cat(tables)
    options = {"sliding_window": window, "logit_cap": cap}
    ref = refs(decode_attention_ref, q, (k_cache.cpu().float(), v_cache.cpu().float(), kv_indptr,
                                         kv_indices, head_dim**-0.5), sinks, **options)  # fmt: skip
    kv_indptr, kv_indices = to_dev(torch.int64, kv_indptr, kv_indices)
    for grouped, splits in ((False, 3), (True, 3), (False, 1), (True, 1)):
        numel = decode_workspace_numel(len(seq_lens), q.shape[1], head_dim, splits)
        workspace = torch.full((max(numel, 1),), float("nan"), device=DEVICE)
        o = torch.full_like(q, float("nan"))
        decode_attention(q, o, k_cache, v_cache, kv_indptr, kv_indices, head_dim**-0.5,
                         **options, sinks=sinks, num_kv_splits=splits, workspace=workspace,
                         grouped=grouped, block_n=16)  # fmt: skip
        assert rel_err(o, ref) < TOLERANCE[dtype], f"grouped={grouped}, splits={splits}"


@pytest.mark.parametrize(
    "kv_group,head_dim,page_size,dtype,cap",
    [(2, 64, 1, F32, 0.0), (3, 128, 16, BF16, 2.5), (4, 64, 16, F32, 0.0)],
)  # fmt: skip
def test_cascade_with_sinks_matches_reference(
    kv_group: int, head_dim: int, page_size: int, dtype: torch.dtype, cap: float
) -> None:
    """The cascade kernel adds the sink in its merge (and its no-group fallback, the decode
    kernel, in its own)."""
    gen = torch.Generator().manual_seed(1000 + head_dim + kv_group)
    c = random_case(kv_group, head_dim, page_size, gen)
    c.q = c.q * Q_SCALE
    q, *rest = c.args(dtype)
    sinks = draw_sinks(q.shape[1], dtype, gen)
    cpu = [t.cpu().float() if t.is_floating_point() else t.cpu() for t in rest]
    ref = refs(cascade_decode_attention_ref, q, (*cpu, head_dim**-0.5), sinks, logit_cap=cap)
    plain = torch.full(q.shape, float("nan"))
    decode_attention_ref(q.cpu().float(), plain, cpu[0], cpu[1], c.full_indptr, c.full_indices,
                         head_dim**-0.5, logit_cap=cap, sinks=sinks.cpu().float())  # fmt: skip
    assert rel_err(ref, plain) < 1e-5
    numel = cascade_workspace_numel(q.shape[0], q.shape[1], head_dim, 2, 3)
    o = torch.full_like(q, float("nan"))
    cascade_decode_attention(q, o, *rest, head_dim**-0.5, logit_cap=cap, sinks=sinks,
                             num_kv_splits=2, num_prefix_splits=3,
                             workspace=torch.full((numel,), float("nan"), device=DEVICE),
                             block_m=16, block_n=16)  # fmt: skip
    assert rel_err(o, ref) < TOLERANCE[dtype]
    no_groups = rest[:2] + [rest[2][:1], rest[3][:0], rest[4][:1], rest[5][:0]]
    no_groups += to_dev(torch.int64, c.full_indptr, c.full_indices)
    o = torch.full_like(q, float("nan"))
    cascade_decode_attention(q, o, *no_groups, head_dim**-0.5, logit_cap=cap, sinks=sinks)
    assert rel_err(o, ref) < TOLERANCE[dtype]


def test_sinks_are_checked() -> None:
    q = torch.zeros(2, 4, 64, device=DEVICE)
    kv = torch.zeros(5, 2, 64, device=DEVICE)
    ptr, idx = torch.tensor([0, 1, 2], device=DEVICE), torch.arange(2, device=DEVICE)
    with pytest.raises(ValueError, match="sinks"):
        decode_attention(q, q.clone(), kv, kv, ptr, idx, 0.1, sinks=torch.zeros(3, device=DEVICE))
    with pytest.raises(ValueError, match="sinks"):
        extend_attention(q, q.clone(), kv, kv, ptr, ptr, idx, 0.1,
                         sinks=torch.zeros(8, device=DEVICE)[::2])  # fmt: skip
    with pytest.raises(TypeError, match="sinks"):
        decode_attention(q, q.clone(), kv, kv, ptr, idx, 0.1,
                         sinks=torch.zeros(4, dtype=torch.int64, device=DEVICE))  # fmt: skip
