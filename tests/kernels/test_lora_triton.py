"""The batched LoRA products: the PyTorch references (segment form and dense form) against a
plain per-row loop in float64; the Triton kernels against the references (in Triton's CPU
interpreter without CUDA); their sm_90 compilation.

Slots no segment names hold NaN, so reading a wrong adapter fails; so do the t rows of slot -1
segments handed to the expand (it must not read them), and y's rows of slot -1 must come back
bit for bit (the dense form reads every slot, so its cases keep all weights finite).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any Triton kernel is defined (see radixrt.kernels)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from typing import NamedTuple  # noqa: E402

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_extend_attention import (  # noqa: E402
    DEVICE,
    _compile_for_hopper,
    _LaunchRecorder,
    compile_module_for_hopper,
)
from torch import Tensor  # noqa: E402

from radixrt.kernels import lora_triton as lora_mod  # noqa: E402
from radixrt.kernels import triton_utils  # noqa: E402
from radixrt.kernels.lora_reference import (  # noqa: E402
    lora_dense_ref,
    lora_padded,
    segment_rows,
    segments_of,
    sgmv_expand_ref,
    sgmv_shrink_ref,
)
from radixrt.kernels.lora_triton import sgmv_expand, sgmv_shrink  # noqa: E402

NUM_SLOTS = 4
# max |out - expected| / max |expected|. Triton's interpreter truncates float32 -> bfloat16 where
# the reference rounds to nearest: up to one bfloat16 ulp of y (2^-7 relative) apart.
KERNEL_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}


class Case(NamedTuple):
    x: Tensor  # [T, K]
    a: Tensor  # [S, R, K]
    b: Tensor  # [S, N, R]
    y: Tensor  # [T, N]
    seg_indptr: Tensor  # [G + 1]
    seg_slot: Tensor  # [G]
    token_slot: Tensor  # [T]


def make_case(seg_lens: list[int], seg_slots: list[int], k: int, n: int, rank: int,
              dtype: torch.dtype = torch.float32, seed: int = 0, nan_unused: bool = True,
              ) -> Case:  # fmt: skip
    """Random inputs on DEVICE; each slot's adapter has a random rank <= `rank`, zero-padded."""
    gen = torch.Generator().manual_seed(seed)
    num_rows = sum(seg_lens)
    x = torch.randn(num_rows, k, generator=gen)
    a = torch.randn(NUM_SLOTS, rank, k, generator=gen) / k**0.5
    b = torch.randn(NUM_SLOTS, n, rank, generator=gen)
    for s in range(NUM_SLOTS):
        r = int(torch.randint(1, rank + 1, (1,), generator=gen))
        a[s, r:], b[s, :, r:] = 0.0, 0.0
        if nan_unused and s not in seg_slots:
            a[s], b[s] = float("nan"), float("nan")
    y = torch.randn(num_rows, n, generator=gen)
    seg_indptr = torch.tensor([0, *seg_lens]).cumsum(0)
    token_slot = torch.repeat_interleave(torch.tensor(seg_slots), torch.tensor(seg_lens))
    tensors = (x.to(dtype), a.to(dtype), b.to(dtype), y.to(dtype), seg_indptr,
               torch.tensor(seg_slots, dtype=torch.int64), token_slot)  # fmt: skip
    return Case(*(v.to(DEVICE) for v in tensors))


def per_row_loop(case: Case) -> tuple[Tensor, Tensor]:
    """(t [T, R], y + LoRA [T, N]) in float64, one row at a time."""
    t = torch.zeros(case.x.shape[0], case.a.shape[1], dtype=torch.float64)
    y = case.y.double().cpu()
    for i, slot in enumerate(case.token_slot.tolist()):
        if slot >= 0:
            t[i] = case.a[slot].double().cpu() @ case.x[i].double().cpu()
            y[i] += case.b[slot].double().cpu() @ t[i]
    return t, y


def rel_err(got: Tensor, want: Tensor) -> float:
    """max |got - want| / max |want| (0 for empty tensors)."""
    if want.numel() == 0:
        return 0.0
    err = (got.double().cpu() - want.double().cpu()).abs().max()
    return float(err / want.double().abs().max().clamp_min(1e-12))


def assert_no_adapter_rows_untouched(case: Case, y: Tensor) -> None:
    none = case.token_slot < 0
    assert torch.equal(y[none], case.y[none]), "rows of slot -1 changed"


segments = st.lists(st.tuples(st.sampled_from([0, 1, 1, 2, 5, 23]),
                              st.integers(-1, NUM_SLOTS - 2)), min_size=1, max_size=6)  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(segs=segments, k=st.integers(1, 40), n=st.integers(1, 33), rank=st.integers(1, 20),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_references_equal_a_per_row_loop(segs: list[tuple[int, int]], k: int, n: int, rank: int,
                                         seed: int) -> None:  # fmt: skip
    """Segments of length 0, 1 and long, slot -1, ranks and sizes off 16; slot NUM_SLOTS - 1 is
    never used (NaN). The run-length segments of the rows give the same result."""
    case = make_case([ln for ln, _ in segs], [s for _, s in segs], k, n, rank, seed=seed)
    t_want, y_want = per_row_loop(case)
    t = sgmv_shrink_ref(case.x, case.a, case.seg_indptr, case.seg_slot)
    assert t.dtype == torch.float32
    assert torch.allclose(t.double().cpu(), t_want, rtol=1e-5, atol=1e-5)
    assert torch.all(t[case.token_slot < 0] == 0)
    y = sgmv_expand_ref(t, case.b, case.seg_indptr, case.seg_slot, case.y.clone())
    assert torch.allclose(y.double().cpu(), y_want, rtol=1e-5, atol=1e-5)
    assert_no_adapter_rows_untouched(case, y)
    indptr, slots = segments_of(case.token_slot)
    assert torch.all(indptr[1:] > indptr[:-1]) and torch.all(slots[1:] != slots[:-1])
    assert torch.equal(torch.repeat_interleave(slots, indptr.diff()), case.token_slot)
    t2 = sgmv_shrink_ref(case.x, case.a, indptr, slots)
    y2 = sgmv_expand_ref(t2, case.b, indptr, slots, case.y.clone())
    assert torch.allclose(y2, y, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("seg_lens,seg_slots", [
    ([1] * 9, [0, 2, -1, 0, 1, 1, -1, 3, 2]),  # decode: one row per request
    ([7, 1, 12, 1, 3], [1, -1, 3, 0, 1]),  # a mixed batch
    ([0], [0]),  # no rows
])  # fmt: skip
def test_dense_form_equals_the_segment_form(seg_lens: list[int], seg_slots: list[int]) -> None:
    case = make_case(seg_lens, seg_slots, k=40, n=24, rank=12, nan_unused=False)
    t = sgmv_shrink_ref(case.x, case.a, case.seg_indptr, case.seg_slot)
    want = sgmv_expand_ref(t, case.b, case.seg_indptr, case.seg_slot, case.y.clone())
    got = lora_dense_ref(case.x, case.a, case.b, case.token_slot, case.y.clone())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert_no_adapter_rows_untouched(case, got)


KERNEL_CASES = {
    "decode": ([1] * 7, [0, -1, 2, 0, 1, -1, 2], 40, 24, 12, {}),
    "prefill": ([37, 0, 5, 20, 1], [2, 1, -1, 0, 2], 72, 40, 16, {}),
    "small_blocks": ([37, 2, 18], [1, -1, 0], 50, 40, 20, {"block_m": 16, "block_r": 16}),
    "bf16": ([9, 1, 20], [0, 2, -1], 48, 33, 8, {}),
}


@pytest.mark.parametrize("name", list(KERNEL_CASES))
def test_triton_kernels_equal_the_references(name: str) -> None:
    """float32 (decode-like, prefill-like with an empty segment, and small blocks so the loops
    over rows, K, R and N take several steps with tails) and bfloat16."""
    seg_lens, seg_slots, k, n, rank, blocks = KERNEL_CASES[name]
    dtype = torch.bfloat16 if name == "bf16" else torch.float32
    case = make_case(seg_lens, seg_slots, k, n, rank, dtype, seed=len(name))
    shrink_blocks = {**blocks, "block_k": 16} if blocks else {}
    expand_blocks = {**blocks, "block_n": 16} if blocks else {}
    t = sgmv_shrink(case.x, case.a, case.seg_indptr, case.seg_slot, **shrink_blocks)
    t_want = sgmv_shrink_ref(case.x, case.a, case.seg_indptr, case.seg_slot)
    assert t.dtype == torch.float32 and rel_err(t, t_want) < 1e-5
    t_in = t_want.clone()
    t_in[case.token_slot < 0] = float("nan")  # the expand must not read these rows
    y = sgmv_expand(t_in, case.b, case.seg_indptr, case.seg_slot, case.y.clone(), **expand_blocks)
    y_want = sgmv_expand_ref(t_want, case.b, case.seg_indptr, case.seg_slot, case.y.clone())
    assert y.dtype == dtype and rel_err(y, y_want) < KERNEL_TOLERANCE[dtype]
    assert_no_adapter_rows_untouched(case, y)
    # an explicit max_seg_len (no host synchronisation) gives the same t
    t_bound = sgmv_shrink(case.x, case.a, case.seg_indptr, case.seg_slot, max_seg_len=64)
    assert rel_err(t_bound, t_want) < 1e-5


# --- GPU code generation, checked on the CPU -------------------------------------------------

HOPPER_LAUNCHES = 6


def compile_launches_for_hopper() -> None:
    """Run the launchers with their GPU settings (bfloat16, float16 and float32 inputs; a
    decode-sized and a prefill-sized batch), recording instead of launching, and compile every
    launch for sm_90. Needs TRITON_INTERPRET=0 (see test_extend_attention)."""
    assert not triton_utils.interpreting(), "run with TRITON_INTERPRET=0"
    calls: list = []
    for name in ("_shrink_kernel", "_expand_kernel"):
        setattr(lora_mod, name, _LaunchRecorder(getattr(lora_mod, name), calls))
    cases = ((torch.bfloat16, [1] * 8, 16), (torch.float16, [100, 3], 64),
             (torch.float32, [5, 40], 8))  # fmt: skip
    for dtype, seg_lens, rank in cases:
        case = make_case(seg_lens, [0, 1] * (len(seg_lens) // 2), 256, 192, rank, dtype)
        t = sgmv_shrink(case.x, case.a, case.seg_indptr, case.seg_slot)
        sgmv_expand(t, case.b, case.seg_indptr, case.seg_slot, case.y)
    assert len(calls) == HOPPER_LAUNCHES, len(calls)
    for kernel, args, kwargs in calls:
        _compile_for_hopper(kernel, args, kwargs)
    print(f"compiled {len(calls)} launches for sm_90")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the native tests above compile them")
def test_lora_kernels_compile_for_hopper() -> None:
    """The launchers' GPU settings (block sizes, bfloat16/float16 dots, float32 'ieee' and 'tf32'
    dots) compile for sm_90: catches what the interpreter lets through."""
    compile_module_for_hopper("test_lora_triton", HOPPER_LAUNCHES)


@pytest.mark.parametrize("seg_lens,seg_slots", [
    ([64, 64, 64], [0, 1, 2]),  # prefill of three requests, three adapters
    ([5, 30, 1, 12], [3, -1, 3, 0]),  # uneven, one without an adapter, a slot twice
    ([7], [-1]),  # no adapter at all
])
def test_padded_form_equals_the_segment_form(seg_lens: list[int], seg_slots: list[int]) -> None:
    """lora_padded (the CPU's prefill form) on segment_rows' table = shrink then expand."""
    case = make_case(seg_lens, seg_slots, k=24, n=18, rank=6, nan_unused=False)
    want = sgmv_expand_ref(sgmv_shrink_ref(case.x, case.a, case.seg_indptr, case.seg_slot),
                           case.b, case.seg_indptr, case.seg_slot, case.y.clone())
    rows, slots, valid = segment_rows(case.seg_indptr, case.seg_slot)
    got = lora_padded(case.x, case.a, case.b, rows, slots, valid, case.y.clone())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
