"""The Triton cascade (shared-prefix) decode attention kernel against its PyTorch references.

Without CUDA it runs in Triton's CPU interpreter. Each case draws a ragged decode batch from its
own seed: a group whose queries fill more than one query block, smaller groups, rows in no group
(with longer own KV), prefixes longer than one KV tile, slot tables scattered through a
NaN-poisoned pool (page sizes 1 and 16, as in test_extend_attention), and NaN-filled outputs and
workspaces. The kernel must match cascade_decode_attention_ref and decode_attention_ref over each
request's concatenated prefix + own KV.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any Triton kernel is defined (see radixrt.kernels)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from dataclasses import dataclass  # noqa: E402

import pytest  # noqa: E402
from test_extend_attention import (  # noqa: E402
    DEVICE,
    NUM_KV_HEADS,
    SHAPES,
    TOLERANCE,
    _compile_for_hopper,
    _LaunchRecorder,
    compile_module_for_hopper,
    indptr,
    poisoned_pool,
    rel_err,
    shape_id,
    slot_tables,
    to_dev,
)
from torch import Tensor  # noqa: E402

from radixrt.kernels import cascade_attention as cascade_mod  # noqa: E402
from radixrt.kernels import triton_utils  # noqa: E402
from radixrt.kernels.cascade_attention import (  # noqa: E402
    cascade_decode_attention,
    cascade_workspace_numel,
)
from radixrt.kernels.reference import (  # noqa: E402
    cascade_decode_attention_ref,
    decode_attention_ref,
)


@dataclass
class CascadeCase:
    q: Tensor  # [bs, num_heads, head_dim] float32
    k_cache: Tensor  # [num_slots + 1, kv_heads, head_dim] float32, NaN in unowned slots
    v_cache: Tensor
    prefix_indptr: Tensor  # [num_groups + 1]
    prefix_indices: Tensor  # [sum(prefix lens)]
    group_indptr: Tensor  # [num_groups + 1]
    group_rows: Tensor  # [sum(group sizes)]
    kv_indptr: Tensor  # [bs + 1]: own KV
    kv_indices: Tensor  # [sum(own lens)]
    full_indptr: Tensor  # [bs + 1]: prefix + own KV, for decode_attention_ref
    full_indices: Tensor  # [sum(prefix lens of each row's group + own lens)]

    def args(self, dtype: torch.dtype) -> list[Tensor]:
        """The kernel's tensor arguments on DEVICE (q and the caches in dtype)."""
        q, k_cache, v_cache = to_dev(dtype, self.q, self.k_cache, self.v_cache)
        ptrs = (self.prefix_indptr, self.prefix_indices, self.group_indptr, self.group_rows,
                self.kv_indptr, self.kv_indices)  # fmt: skip
        return [q, k_cache, v_cache, *to_dev(torch.int64, *ptrs)]


def make_cascade_case(
    group_sizes: list[int], prefix_lens: list[int], own_lens: list[int], kv_group: int,
    head_dim: int, page_size: int, gen: torch.Generator,
) -> CascadeCase:  # fmt: skip
    """Groups of group_sizes rows with prefixes of prefix_lens, placed on random rows of a batch
    of len(own_lens) requests (the rows left over are in no group)."""
    bs = len(own_lens)
    rows = torch.randperm(bs, generator=gen)[: sum(group_sizes)]  # [sum(group sizes)]
    num_slots, tables = slot_tables([*prefix_lens, *own_lens], page_size, gen)
    k_cache, v_cache = poisoned_pool(num_slots, tables, NUM_KV_HEADS, head_dim, gen)
    prefixes, owns = tables[: len(prefix_lens)], tables[len(prefix_lens) :]
    full = list(owns)
    bounds = indptr(group_sizes).tolist()
    for g, prefix in enumerate(prefixes):
        for row in rows[bounds[g] : bounds[g + 1]].tolist():
            full[row] = torch.cat([prefix, owns[row]])
    empty = torch.zeros(0, dtype=torch.int64)
    return CascadeCase(
        torch.randn(bs, NUM_KV_HEADS * kv_group, head_dim, generator=gen), k_cache, v_cache,
        indptr(prefix_lens), torch.cat([empty, *prefixes]), indptr(group_sizes), rows,
        indptr(own_lens), torch.cat(owns), indptr([t.numel() for t in full]), torch.cat(full),
    )  # fmt: skip


def references(case: CascadeCase, dtype: torch.dtype) -> Tensor:
    """float32 cascade_decode_attention_ref on the dtype-rounded inputs, checked against
    decode_attention_ref over the concatenated KV."""
    q, k_cache, v_cache = (t.to(dtype).float() for t in (case.q, case.k_cache, case.v_cache))
    scale = q.shape[2] ** -0.5
    ref = torch.full(q.shape, float("nan"))
    cascade_decode_attention_ref(
        q, ref, k_cache, v_cache, case.prefix_indptr, case.prefix_indices, case.group_indptr,
        case.group_rows, case.kv_indptr, case.kv_indices, scale,
    )  # fmt: skip
    plain = torch.full(q.shape, float("nan"))
    decode_attention_ref(q, plain, k_cache, v_cache, case.full_indptr, case.full_indices, scale)
    assert rel_err(ref, plain) < 1e-5
    return ref


def random_case(kv_group: int, head_dim: int, page_size: int, gen: torch.Generator) -> CascadeCase:
    rand = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=gen))
    big = -(-17 // kv_group) + rand(0, 2)  # its queries fill more than one 16-row block
    group_sizes = [big, rand(1, 4), 1]
    prefix_lens = [rand(33, 70), rand(1, 40), rand(1, 20)]  # the first spans several tiles
    ungrouped = rand(1, 3)
    own_lens = [rand(1, 10) for _ in range(sum(group_sizes))]
    own_lens += [rand(1, 50) for _ in range(ungrouped)]
    return make_cascade_case(group_sizes, prefix_lens, own_lens, kv_group, head_dim,
                             page_size, gen)  # fmt: skip


@pytest.mark.parametrize("case", SHAPES, ids=shape_id)
def test_cascade_attention_matches_references(case: tuple[int, int, int, torch.dtype]) -> None:
    kv_group, head_dim, page_size, dtype = case
    gen = torch.Generator().manual_seed(300 + SHAPES.index(case))
    c = random_case(kv_group, head_dim, page_size, gen)
    ref = references(c, dtype)
    args = c.args(dtype)
    q, scale = args[0], head_dim**-0.5
    own_splits = int(torch.randint(1, 4, (1,), generator=gen))
    prefix_splits = int(torch.randint(2, 5, (1,), generator=gen))
    numel = cascade_workspace_numel(q.shape[0], q.shape[1], head_dim, own_splits, prefix_splits)
    workspace = torch.full((numel,), float("nan"), device=DEVICE)
    o = torch.full_like(q, float("nan"))
    cascade_decode_attention(
        q, o, *args[1:], scale, num_kv_splits=own_splits, num_prefix_splits=prefix_splits,
        max_group_size=int((c.group_indptr[1:] - c.group_indptr[:-1]).max()),
        workspace=workspace, block_m=16, block_n=16,
    )  # fmt: skip
    err = rel_err(o, ref)
    assert err < TOLERANCE[dtype], f"splits {own_splits}+{prefix_splits}: {err}"
    o = torch.full_like(q, float("nan"))
    cascade_decode_attention(q, o, *args[1:], scale)  # defaults
    assert rel_err(o, ref) < TOLERANCE[dtype]


def test_cascade_attention_edge_cases() -> None:
    """A group with an empty prefix, a group with no members, a one-row group, rows in no group;
    then the same batch with no groups at all, which is plain decode."""
    gen = torch.Generator().manual_seed(7)
    c = make_cascade_case([2, 0, 1], [0, 12, 40], [3, 1, 7, 2, 30], 2, 64, 16, gen)
    ref = references(c, torch.float32)
    args = c.args(torch.float32)
    o = torch.full_like(args[0], float("nan"))
    cascade_decode_attention(args[0], o, *args[1:], 0.125, num_prefix_splits=3, block_n=16)
    assert rel_err(o, ref) < TOLERANCE[torch.float32]

    none = torch.zeros(1, dtype=torch.int64)  # num_groups = 0
    empty = torch.zeros(0, dtype=torch.int64)
    no_groups = CascadeCase(c.q, c.k_cache, c.v_cache, none, empty, none, empty, c.kv_indptr,
                            c.kv_indices, c.kv_indptr, c.kv_indices)  # fmt: skip
    ref = references(no_groups, torch.float16)
    args = no_groups.args(torch.float16)
    o = torch.full_like(args[0], float("nan"))
    cascade_decode_attention(args[0], o, *args[1:], 0.125, num_kv_splits=2)
    assert rel_err(o, ref) < TOLERANCE[torch.float16]

    args = c.args(torch.float16)
    small = torch.empty(8, device=DEVICE)
    with pytest.raises(ValueError, match="workspace"):
        cascade_decode_attention(args[0], o, *args[1:], 0.125, num_kv_splits=1,
                                 num_prefix_splits=1, workspace=small)  # fmt: skip


def test_prefix_split_heuristic() -> None:
    cpu = torch.device("cpu")
    assert cascade_mod.default_num_prefix_splits(1, 8, 1, cpu, 4096) == 1  # one compute unit
    splits = cascade_mod.default_num_prefix_splits(2, 8, 4, DEVICE, 2 * 4096)
    assert 1 <= splits <= cascade_mod.MAX_PREFIX_SPLITS
    assert cascade_mod.default_num_prefix_splits(1, 8, 1, DEVICE, 100) == 1  # short: one chunk


# --- GPU code generation, checked on the CPU ---------------------------------------------------


def compile_launches_for_hopper() -> None:
    """Run the launcher with its GPU settings (bfloat16 GQA-4 head_dim 128, float32 without GQA,
    float16 GQA-8, bfloat16 soft-capped, bfloat16 with sinks), recording instead of launching,
    and compile every launch for sm_90. Needs TRITON_INTERPRET=0 (see test_extend_attention)."""
    assert not triton_utils.interpreting(), "run with TRITON_INTERPRET=0"
    calls: list = []
    for name in ("_cascade_partial", "_cascade_merge"):
        setattr(cascade_mod, name, _LaunchRecorder(getattr(cascade_mod, name), calls))
    ptrs = (torch.tensor([0, 5, 9]), torch.arange(9), torch.tensor([0, 2, 3]),
            torch.tensor([3, 0, 1]), torch.arange(5), torch.arange(9, 13))  # fmt: skip
    sinks = torch.zeros(32, dtype=torch.bfloat16)
    cases = ((32, 8, 128, torch.bfloat16, {"block_m": 64}),  # the 8B shape at full block size
             (4, 4, 64, torch.float32, {}), (16, 2, 128, torch.float16, {}),
             (32, 8, 128, torch.bfloat16, {"logit_cap": 30.0}),  # soft-capped
             (32, 8, 128, torch.bfloat16, {"sinks": sinks}))  # the merge adds them  # fmt: skip
    for heads, kv_heads, head_dim, dtype, blocks in cases:
        q = torch.zeros(4, heads, head_dim, dtype=dtype)
        kv = torch.zeros(17, kv_heads, head_dim, dtype=dtype)
        cascade_decode_attention(q, q.clone(), kv, kv, *ptrs, 0.1, num_kv_splits=2,
                                 num_prefix_splits=4, **blocks)  # fmt: skip
    assert len(calls) == 15, len(calls)
    for kernel, args, kwargs in calls:
        _compile_for_hopper(kernel, args, kwargs)
    print(f"compiled {len(calls)} launches for sm_90")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the native tests above compile them")
def test_cascade_kernels_compile_for_hopper() -> None:
    """The launcher's GPU settings (64-row query blocks, bfloat16/float16 dots, float32 'ieee'
    dots, a logit cap, sinks) compile for sm_90: catches what the interpreter lets through."""
    compile_module_for_hopper("test_cascade_attention", 15)
