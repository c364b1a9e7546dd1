"""ShardPlan (radixrt/runtime/models/shard_plan.py): which query heads, KV heads, intermediate rows
and vocabulary rows each tensor-parallel rank holds. Pure logic, no model, no tensors.

The rules under test (the module docstring's): 1. tp_size divides num_kv_heads: split, no
padding; 2. num_kv_heads divides tp_size: each KV head replicated on tp_size / num_kv_heads ranks
that split its query heads, padded with zero query heads when they do not split evenly; 3.
otherwise the KV heads are padded with zero heads (each with a group of zero query heads) up to a
multiple of tp_size. A plan in which some rank would hold no real query head is refused with a
ValueError naming the sizes that work.
"""

from __future__ import annotations

import ast
import re
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.shard_plan import (
    ShardPlan,
    Slice,
    check_tp_size,
    head_rows,
    working_tp_sizes,
)


def make_config(num_heads: int = 9, num_kv_heads: int = 3, intermediate_size: int = 1536,
                vocab_size: int = 49152) -> ModelConfig:
    """A config with the given shape; the defaults are the default model's (SmolLM2-135M)."""
    return ModelConfig(architecture="LlamaForCausalLM", vocab_size=vocab_size, hidden_size=64,
                       intermediate_size=intermediate_size, num_layers=2, num_heads=num_heads,
                       num_kv_heads=num_kv_heads, head_dim=8)


DEFAULT = make_config()


def plans(config: ModelConfig, tp: int) -> list[ShardPlan]:
    return [ShardPlan.for_rank(config, tp, r) for r in range(tp)]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def served(config: ModelConfig, tp: int) -> list[ShardPlan] | str:
    """The plans of tp_size tp's ranks, or the refusal's message; the first, middle and last
    rank (all of them for tp_size <= 8: the plan's cost grows fast with tp_size) must agree."""
    ranks = range(tp) if tp <= 8 else (0, tp // 2, tp - 1)
    outcomes: list[ShardPlan | str] = []
    for rank in ranks:
        try:
            outcomes.append(ShardPlan.for_rank(config, tp, rank))
        except ValueError as exc:
            outcomes.append(str(exc))
    kinds = {isinstance(o, str) for o in outcomes}
    assert len(kinds) == 1, f"tp_size={tp}: some ranks accepted, some refused: {outcomes}"
    if isinstance(outcomes[0], str):
        assert len(set(outcomes)) == 1
        return outcomes[0]
    return plans(config, tp) if tp > 8 else [o for o in outcomes if isinstance(o, ShardPlan)]


def expected_refusal(num_heads: int, num_kv_heads: int, tp: int) -> bool:
    """The refusal rule, derived independently from the three cases: refused iff the last rank
    would hold only zero (padding) query heads."""
    if tp < 1 or tp > num_heads:
        return True
    group = num_heads // num_kv_heads
    if num_kv_heads % tp == 0:
        return False
    if tp % num_kv_heads == 0:  # the last of `ranks` parts of a group starts past its end
        ranks = tp // num_kv_heads
        return ceil_div(group, ranks) * (ranks - 1) >= group
    return ceil_div(num_kv_heads, tp) * (tp - 1) >= num_kv_heads  # last rank: padding KV only


def check_plan(config: ModelConfig, tp: int) -> None:
    """Every property a served plan must have (see the module docstring)."""
    nq, nkv = config.num_heads, config.num_kv_heads
    group = nq // nkv
    ps = plans(config, tp)
    assert [p.rank for p in ps] == list(range(tp)) and {p.tp_size for p in ps} == {tp}
    # every rank has the same shapes (one KV pool shape, one program for all ranks)
    assert len({(p.num_heads, p.num_kv_heads) for p in ps}) == 1
    local_group, rest = divmod(ps[0].num_heads, ps[0].num_kv_heads)
    assert rest == 0 and local_group >= 1

    # every real query head exactly once; every rank holds at least one
    q_real = Counter(h for p in ps for h in p.q_heads if h is not None)
    assert q_real == Counter(range(nq))
    assert all(any(h is not None for h in p.q_heads) for p in ps)
    # every real KV head at least once
    kv_real = Counter(h for p in ps for h in p.kv_heads if h is not None)
    assert set(kv_real) == set(range(nkv))
    assert all(h is None or 0 <= h < nkv for p in ps for h in p.kv_heads)

    # local query head j attends with local KV head j // local_group, which must be the global
    # KV head of its global query head in the full model's GQA mapping
    for p in ps:
        for j, q in enumerate(p.q_heads):
            kv = p.kv_heads[j // local_group]
            if q is not None:
                assert kv == q // group, (p, j)
            if kv is None:
                assert q is None, f"a zero KV head serves a real query head: {p}"

    pad_q = sum(h is None for p in ps for h in p.q_heads)
    pad_kv = sum(h is None for p in ps for h in p.kv_heads)
    assert pad_q == tp * ps[0].num_heads - nq
    if nkv % tp == 0:  # 1. split: no padding, each KV head on one rank
        assert pad_q == pad_kv == 0
        assert kv_real == Counter(range(nkv))
        assert ps[0].num_kv_heads == nkv // tp
    elif tp % nkv == 0:  # 2. replicated: each KV head on tp / nkv ranks, zero query heads only
        ranks = tp // nkv
        assert pad_kv == 0 and ps[0].num_kv_heads == 1
        assert kv_real == Counter({h: ranks for h in range(nkv)})
        assert ps[0].num_heads == ceil_div(group, ranks)
        assert (pad_q == 0) == (group % ranks == 0)
    else:  # 3. padded KV heads up to a multiple of tp, each with a group of zero query heads
        assert ps[0].num_kv_heads == ceil_div(nkv, tp)
        assert pad_kv == tp * ceil_div(nkv, tp) - nkv
        assert kv_real == Counter(range(nkv))
        assert local_group == group and pad_q == pad_kv * group

    for name, total in (("intermediate", config.intermediate_size), ("vocab", config.vocab_size)):
        slices: list[Slice] = [getattr(p, name) for p in ps]
        size = ceil_div(total, tp)
        assert [(s.start, s.size, s.real) for s in slices] == [
            (r * size, size, total) for r in range(tp)]
        rows = [i for s in slices for i in s.indices()]
        # the slices tile [0, padded) in order; rows past the real size are padding (None)
        assert rows == list(range(total)) + [None] * (size * tp - total)
        assert 0 <= size * tp - total < tp
    assert ps[0].padded_vocab == ceil_div(config.vocab_size, tp) * tp >= config.vocab_size

    shape = ps[0].kv_shape(config)
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (
        config.num_layers, ps[0].num_kv_heads, config.head_dim)
    info = ps[0].describe(config)
    assert info["padded_heads"] == pad_q
    assert info["kv_heads"] == (
        "split" if nkv % tp == 0 else "replicated" if tp % nkv == 0 else "padded")


def refusal_sizes(message: str) -> tuple[list[int], list[int]]:
    """The two lists of sizes a refusal names: (exact split, with zero padding)."""
    found = re.findall(r"\[[\d, ]*\]", message)
    assert len(found) == 2, message
    exact, padded = (ast.literal_eval(f) for f in found)
    return exact, padded


# --- the default model shape: 9 query heads, 3 KV heads, intermediate 1536, vocab 49152 ---------


def test_default_tp1_holds_everything_in_order() -> None:
    """tp 1 (and ShardPlan.single) is the whole model: all heads and rows, in order, no padding."""
    p = ShardPlan.for_rank(DEFAULT, 1, 0)
    assert p == ShardPlan.single(DEFAULT)
    assert p.q_heads == tuple(range(9)) and p.kv_heads == (0, 1, 2)
    assert p.intermediate == Slice(0, 1536, 1536) and p.vocab == Slice(0, 49152, 49152)
    assert p.padded_vocab == 49152
    check_plan(DEFAULT, 1)


def test_default_tp2_pads_kv_heads_to_four() -> None:
    """tp 2 (case 3): KV heads padded 3 -> 4, query heads 9 -> 12; rank 1 holds KV head 2 and a
    zero KV head, whose three query heads are zero too."""
    r0, r1 = plans(DEFAULT, 2)
    assert r0.kv_heads == (0, 1) and r0.q_heads == tuple(range(6))
    assert r1.kv_heads == (2, None) and r1.q_heads == (6, 7, 8, None, None, None)
    assert r0.intermediate == Slice(0, 768, 1536) and r1.intermediate == Slice(768, 768, 1536)
    assert r1.vocab == Slice(24576, 24576, 49152)
    assert r0.describe(DEFAULT)["kv_heads"] == "padded"
    assert r0.describe(DEFAULT)["padded_heads"] == 3
    assert r1.kv_shape(DEFAULT).num_kv_heads == 2
    check_plan(DEFAULT, 2)


def test_default_tp3_splits_without_padding() -> None:
    """tp 3 (case 1): one KV head and its three query heads per rank."""
    ps = plans(DEFAULT, 3)
    assert [p.kv_heads for p in ps] == [(0,), (1,), (2,)]
    assert [p.q_heads for p in ps] == [(0, 1, 2), (3, 4, 5), (6, 7, 8)]
    assert [p.intermediate.start for p in ps] == [0, 512, 1024]
    assert [p.vocab.start for p in ps] == [0, 16384, 32768]
    assert ps[0].describe(DEFAULT)["kv_heads"] == "split"
    assert ps[0].describe(DEFAULT)["padded_heads"] == 0
    check_plan(DEFAULT, 3)


def test_default_tp4_is_refused_naming_the_sizes_that_work() -> None:
    """tp 4 (case 3 with one KV head per rank) leaves rank 3 a zero KV head only: refused on
    every rank, the message naming the working sizes."""
    for rank in range(4):
        with pytest.raises(ValueError, match="tp_size=4") as info:
            ShardPlan.for_rank(DEFAULT, 4, rank)
        assert refusal_sizes(str(info.value)) == ([1, 3], [2, 6, 9])


def test_default_tp6_replicates_kv_heads_and_pads_query_heads() -> None:
    """tp 6 (case 2): each KV head on two ranks; its three query heads split 2 + 1, the second
    rank padded with one zero query head."""
    ps = plans(DEFAULT, 6)
    assert [p.kv_heads for p in ps] == [(0,), (0,), (1,), (1,), (2,), (2,)]
    assert [p.q_heads for p in ps] == [(0, 1), (2, None), (3, 4), (5, None), (6, 7), (8, None)]
    assert ps[0].describe(DEFAULT)["kv_heads"] == "replicated"
    assert ps[0].describe(DEFAULT)["padded_heads"] == 3
    assert ps[0].intermediate.size == 256 and ps[0].vocab.size == 8192
    check_plan(DEFAULT, 6)


def test_default_tp9_one_query_head_per_rank() -> None:
    """tp 9 (case 2, no padding): each KV head on three ranks, one query head each."""
    ps = plans(DEFAULT, 9)
    assert [p.q_heads for p in ps] == [(h,) for h in range(9)]
    assert [p.kv_heads for p in ps] == [(h // 3,) for h in range(9)]
    # 1536 and 49152 are not multiples of 9: both padded
    assert ps[0].intermediate == Slice(0, 171, 1536) and ps[8].intermediate.indices()[-3:] == [
        None, None, None]
    assert ps[0].padded_vocab == 49158
    check_plan(DEFAULT, 9)


def test_default_working_sizes() -> None:
    """working_tp_sizes of the default model: 1, 3 split exactly (9 as well but for the padded
    intermediate / vocab), 2 and 6 need padding; 4, 5, 7, 8 and above 9 are refused."""
    assert working_tp_sizes(DEFAULT, 64) == ([1, 3], [2, 6, 9])
    assert working_tp_sizes(DEFAULT, 2) == ([1], [2])
    for tp in (0, -1, 4, 5, 7, 8, 10, 12, 18):
        with pytest.raises(ValueError, match=f"tp_size={tp} "):
            check_tp_size(DEFAULT, tp)


def test_rank_outside_tp_size_is_refused() -> None:
    """A rank outside [0, tp_size) has no plan."""
    for rank in (-1, 3, 4):
        with pytest.raises(ValueError, match=f"rank={rank} is outside tp_size=3"):
            ShardPlan.for_rank(DEFAULT, 3, rank)


def test_exact_needs_divisible_intermediate_and_vocab() -> None:
    """A head split without padding counts as exact only when intermediate and vocab divide."""
    assert working_tp_sizes(make_config(4, 2, 64, 64), 4) == ([1, 2, 4], [])
    assert working_tp_sizes(make_config(4, 2, 63, 64), 4) == ([1], [2, 4])
    assert working_tp_sizes(make_config(4, 2, 64, 62), 4) == ([1, 2], [4])


def test_head_rows() -> None:
    """head_rows: each head's head_dim rows in order, None rows for a zero head."""
    assert head_rows([2, None, 0], 3) == [6, 7, 8, None, None, None, 0, 1, 2]
    assert head_rows([], 4) == []


def test_slice_padding() -> None:
    """Slice.of: ceil(total / tp) rows per rank; the last rank's rows past total are None."""
    assert Slice.of(10, 4, 3) == Slice(9, 3, 10)
    assert Slice.of(10, 4, 3).indices() == [9, None, None]
    assert Slice.of(10, 4, 0).indices() == [0, 1, 2]
    assert Slice.of(3, 3, 2).indices() == [2]


# --- properties over random shapes ------------------------------------------------------------

shapes = st.tuples(
    st.integers(1, 6),  # num_kv_heads
    st.integers(1, 6),  # query heads per KV head
    st.integers(1, 300),  # intermediate_size
    st.integers(1, 500),  # vocab_size
)


@settings(deadline=None)  # a plan's cost grows with tp_size; a busy machine is slower
@given(shape=shapes, data=st.data())
def test_every_served_plan_covers_the_model(shape: tuple[int, int, int, int],
                                            data: st.DataObject) -> None:
    """For a random model shape and a tp_size the plan serves: all check_plan properties hold
    (each real query head exactly once, each KV head at least once and exactly as each case
    says, the GQA mapping preserved, padding only where the case says, slices tiling)."""
    nkv, group, inter, vocab = shape
    config = make_config(nkv * group, nkv, inter, vocab)
    tp = data.draw(st.sampled_from([t for t in range(1, nkv * group + 1)
                                    if not expected_refusal(nkv * group, nkv, t)]))
    check_plan(config, tp)


@settings(deadline=None)
@given(shape=shapes)
def test_working_sizes_are_exactly_the_accepted_sizes(shape: tuple[int, int, int, int]) -> None:
    """working_tp_sizes lists exactly the sizes for_rank accepts (tp 1 .. num_heads + 2), the
    refusal rule matches the independent one (some rank would hold zero query heads only),
    "exact" means no padding anywhere, and every refusal names the sizes that work."""
    nkv, group, inter, vocab = shape
    nq = nkv * group
    config = make_config(nq, nkv, inter, vocab)
    exact, padded = working_tp_sizes(config, nq + 2)
    assert exact == sorted(exact) and padded == sorted(padded)
    assert not set(exact) & set(padded)
    assert 1 in exact
    works = sorted(exact + padded)
    for tp in range(1, nq + 3):
        outcome = served(config, tp)
        ok = not isinstance(outcome, str)
        assert ok == (tp in works), tp
        assert ok == (not expected_refusal(nq, nkv, tp)), tp
        if isinstance(outcome, str):
            assert f"tp_size={tp}" in outcome
            assert refusal_sizes(outcome) == working_tp_sizes(config, 64)
        else:
            no_padding = (all(None not in p.q_heads + p.kv_heads for p in outcome)
                          and inter % tp == 0 and vocab % tp == 0)
            assert no_padding == (tp in exact), tp
