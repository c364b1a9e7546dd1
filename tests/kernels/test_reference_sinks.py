"""Attention sinks (gpt-oss): the reference kernels and the torch backend against the definition.

The definition, written out here as transformers' gpt-oss eager attention does it: each query
head h has a learned logit s_h; append it as one more column to the head's (scaled, windowed,
soft-capped) scores, softmax, drop the column, multiply by V. Every check also shows the test
can tell a dropped sink: the expected result differs from plain attention by far more than the
tolerance. Sinks are drawn around the scores' magnitude, so that they take a visible share.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_reference import HEAD_DIM, NUM_KV_HEADS, make_case
from test_reference_cascade import indptr, ragged_case
from torch import Tensor

from radixrt.kernels import reference
from radixrt.kernels.reference import (
    cascade_decode_attention_ref,
    decode_attention_ref,
    extend_attention_ref,
    store_kv_ref,
)
from radixrt.runtime.forward.attention import TorchAttentionBackend
from radixrt.runtime.forward.attention.base import LayerAttention
from radixrt.runtime.forward.forward_batch import ForwardBatch, PrefixGroup
from radixrt.runtime.forward.kv_cache import KVCache

Q_SCALE = 3.0  # scores of a few units: a cap of 1-2 bites, a sink near them takes a share
# (sliding window, logit cap): none, windows shorter than some requests' KV, caps, both
WINDOW_CAP = [(None, 0.0), (1, 0.0), (4, 0.0), (None, 1.5), (3, 2.0), (100, 1.0)]
TOL = {"atol": 1e-5, "rtol": 1e-5}


def sink_softmax(scores: Tensor, sink: float) -> Tensor:
    """transformers' gpt-oss: softmax over [scores, sink], the sink's column dropped."""
    combined = torch.cat([scores, scores.new_tensor([sink])])
    return torch.softmax(combined - combined.max(), dim=0)[:-1]


def naive_sink_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, batch: ForwardBatch, scale: float,
    sinks: Tensor | None, window: int | None = None, logit_cap: float = 0.0,
) -> Tensor:  # fmt: skip
    """Explicit loops in float64: token j of request i (prefix P) sees positions 0..P+j (with a
    window W only P+j-W+1..P+j; a cap c turns scores s into c * tanh(s / c)); sinks None: plain
    softmax attention."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = q.shape[1] // k_cache.shape[1]
    qo, kv = batch.qo_indptr.tolist(), batch.kv_indptr.tolist()
    for i in range(batch.batch_size):
        slots = batch.kv_indices[kv[i] : kv[i + 1]].tolist()
        prefix = len(slots) - (qo[i + 1] - qo[i])
        for j, row in enumerate(range(qo[i], qo[i + 1])):
            first = 0 if window is None else max(0, prefix + j + 1 - window)
            visible = slots[first : prefix + j + 1]
            for h in range(q.shape[1]):
                keys = k_cache[visible, h // group].double()  # [n, head_dim]
                values = v_cache[visible, h // group].double()  # [n, head_dim]
                scores = keys @ q[row, h].double() * scale  # [n]
                if logit_cap > 0:
                    scores = logit_cap * torch.tanh(scores / logit_cap)
                if sinks is None:
                    probs = torch.softmax(scores, dim=0)
                else:
                    probs = sink_softmax(scores, float(sinks[h]))
                out[row, h] = probs @ values
    return out


def stored_case(
    prefix_lens: list[int], extend_lens: list[int], group: int, seed: int
) -> tuple[ForwardBatch, KVCache, Tensor, Tensor]:
    """A batch with every token's K/V stored, its queries (scaled up) and sinks [num_heads]."""
    batch, kv_cache, q, k, v = make_case(prefix_lens, extend_lens, NUM_KV_HEADS * group, seed)
    store_kv_ref(kv_cache.k[0], kv_cache.v[0], k, v, batch.out_slots)
    gen = torch.Generator().manual_seed(seed + 1000)
    sinks = 2.0 * torch.randn(NUM_KV_HEADS * group, generator=gen) + 1.0
    return batch, kv_cache, q * Q_SCALE, sinks


def check(o: Tensor, q: Tensor, kv_cache: KVCache, batch: ForwardBatch, scale: float,
          sinks: Tensor, window: int | None, cap: float, **tol: float) -> None:  # fmt: skip
    """o equals the definition, which a dropped sink would miss by far more than tol."""
    args = (q, kv_cache.k[0], kv_cache.v[0], batch, scale)
    tol = tol or TOL
    expected = naive_sink_attention(*args, sinks, window, cap)
    torch.testing.assert_close(o.double(), expected, **tol)
    plain = naive_sink_attention(*args, None, window, cap)
    assert (expected - plain).abs().max() > max(1e-2, 10 * tol["atol"])


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("window,cap", WINDOW_CAP)
def test_extend_ref_with_sinks_matches_definition(
    group: int, window: int | None, cap: float
) -> None:
    batch, kv_cache, q, sinks = stored_case([0, 9, 3, 12, 6], [7, 4, 6, 1, 1], group, seed=11)
    o = torch.full_like(q, float("nan"))
    extend_attention_ref(q, o, kv_cache.k[0], kv_cache.v[0], batch.qo_indptr, batch.kv_indptr,
                         batch.kv_indices, 0.3, sliding_window=window, logit_cap=cap,
                         sinks=sinks)  # fmt: skip
    check(o, q, kv_cache, batch, 0.3, sinks, window, cap)


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("window,cap", WINDOW_CAP)
def test_decode_ref_with_sinks_matches_definition(
    group: int, window: int | None, cap: float
) -> None:
    batch, kv_cache, q, sinks = stored_case([1, 17, 4, 30], [1] * 4, group, seed=12)
    o = torch.full_like(q, float("nan"))
    decode_attention_ref(q, o, kv_cache.k[0], kv_cache.v[0], batch.kv_indptr, batch.kv_indices,
                         0.3, sliding_window=window, logit_cap=cap, sinks=sinks)  # fmt: skip
    check(o, q, kv_cache, batch, 0.3, sinks, window, cap)


@pytest.mark.parametrize("window,cap", [(None, 0.0), (5, 0.0), (7, 2.0)])
def test_extend_ref_with_sinks_in_query_chunks(
    window: int | None, cap: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Long extends run a chunk of queries at a time: tiny chunks give the same result."""
    monkeypatch.setattr(reference, "MIN_QUERY_CHUNK", 3)
    monkeypatch.setattr(reference, "QUERY_CHUNK_SCORES", 1)
    batch, kv_cache, q, sinks = stored_case([0, 8], [23, 17], 2, seed=13)
    o = torch.full_like(q, float("nan"))
    extend_attention_ref(q, o, kv_cache.k[0], kv_cache.v[0], batch.qo_indptr, batch.kv_indptr,
                         batch.kv_indices, 0.3, sliding_window=window, logit_cap=cap,
                         sinks=sinks)  # fmt: skip
    check(o, q, kv_cache, batch, 0.3, sinks, window, cap)


@pytest.mark.parametrize("window,cap", [(None, 0.0), (4, 1.5)])
def test_bfloat16_refs_with_sinks(window: int | None, cap: float) -> None:
    """bfloat16 inputs and bfloat16 sinks (the explicit float32 path, not the fused kernel)."""
    batch, kv_cache, q, sinks = stored_case([5, 0, 13], [1, 6, 3], 3, seed=14)
    kv_cache.buffer.copy_(kv_cache.buffer.bfloat16().float())  # the definition's inputs
    q, sinks = q.bfloat16(), sinks.bfloat16()
    k_bf, v_bf = kv_cache.k[0].bfloat16(), kv_cache.v[0].bfloat16()
    o = torch.full_like(q, float("nan"))
    extend_attention_ref(q, o, k_bf, v_bf, batch.qo_indptr, batch.kv_indptr, batch.kv_indices,
                         0.3, sliding_window=window, logit_cap=cap, sinks=sinks)  # fmt: skip
    check(o, q.float(), kv_cache, batch, 0.3, sinks.float(), window, cap, atol=2e-2, rtol=2e-2)


def test_sinks_at_the_extremes() -> None:
    """A sink of -inf takes nothing (plain attention, exactly the SDPA path's result up to
    rounding); a sink far above every score takes all (zeros)."""
    batch, kv_cache, q, sinks = stored_case([6, 0, 13], [1, 5, 3], 3, seed=15)
    args = (kv_cache.k[0], kv_cache.v[0], batch.qo_indptr, batch.kv_indptr, batch.kv_indices, 0.3)
    plain, o = torch.empty_like(q), torch.empty_like(q)
    extend_attention_ref(q, plain, *args)
    extend_attention_ref(q, o, *args, sinks=torch.full_like(sinks, float("-inf")))
    torch.testing.assert_close(o, plain, **TOL)
    extend_attention_ref(q, o, *args, sinks=torch.full_like(sinks, 1e4))
    assert o.abs().max() == 0


@pytest.mark.parametrize("cap", [0.0, 1.5])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("seed", range(3))
def test_cascade_ref_with_sinks_equals_decode_ref(seed: int, page_size: int, cap: float) -> None:
    """The sink rescales the merged prefix + own attention: plain decode over the whole KV."""
    case = ragged_case(seed, page_size)
    gen = torch.Generator().manual_seed(seed)
    kv_heads, head_dim, group = 2, 32, 3
    k_cache = torch.randn(case["num_slots"] + 1, kv_heads, head_dim, generator=gen)
    v_cache = torch.randn(case["num_slots"] + 1, kv_heads, head_dim, generator=gen)
    q = 3 * torch.randn(case["bs"], kv_heads * group, head_dim, generator=gen)
    sinks = 2.0 * torch.randn(kv_heads * group, generator=gen) + 1.0
    full, groups, owns = case["full"], case["groups"], case["owns"]
    prefixes = [case["prefixes"][g] for _, g in groups]
    flat = (indptr([len(p) for p in prefixes]), torch.tensor(sum(prefixes, []), dtype=torch.int64),
            indptr([len(rows) for rows, _ in groups]),
            torch.tensor(sum((rows for rows, _ in groups), []), dtype=torch.int64),
            indptr([len(o) for o in owns]), torch.tensor(sum(owns, [])))  # fmt: skip
    outs = []
    for s in (sinks, None):
        plain, cascade = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
        decode_attention_ref(q, plain, k_cache, v_cache, indptr([len(f) for f in full]),
                             torch.tensor(sum(full, [])), head_dim**-0.5, logit_cap=cap,
                             sinks=s)  # fmt: skip
        cascade_decode_attention_ref(q, cascade, k_cache, v_cache, *flat, head_dim**-0.5,
                                     logit_cap=cap, sinks=s)  # fmt: skip
        torch.testing.assert_close(cascade, plain, atol=1e-5, rtol=1e-4)
        outs.append(plain)
    assert (outs[0] - outs[1]).abs().max() > 1e-2


# --- the torch backend ---------------------------------------------------------------------


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("window,cap", [(None, 0.0), (3, 0.0), (None, 1.5), (8, 2.0)])
@pytest.mark.parametrize(
    "prefix_lens,extend_lens",
    [([6, 0, 13, 4, 2], [1, 5, 1, 3, 1]),  # mixed: the decode and the extend path
     ([0, 7], [6, 5]),  # extend only
     ([7, 30, 2], [1, 1, 1])],  # decode only
)  # fmt: skip
def test_torch_backend_with_sinks(
    prefix_lens: list[int], extend_lens: list[int], group: int, window: int | None, cap: float
) -> None:
    batch, kv_cache, q, k, v = make_case(prefix_lens, extend_lens, NUM_KV_HEADS * group, seed=16)
    sinks = 2.0 * torch.randn(NUM_KV_HEADS * group, generator=torch.Generator().manual_seed(3))
    backend = TorchAttentionBackend()
    backend.init_forward(batch)
    layer = LayerAttention(0, scale=0.3, sliding_window=window, logit_cap=cap, sinks=sinks)
    o = backend.forward(q * Q_SCALE, k, v, layer, kv_cache, batch)
    check(o, q * Q_SCALE, kv_cache, batch, 0.3, sinks, window, cap)


@pytest.mark.parametrize("window,cap", [(None, 0.0), (None, 1.5), (8, 0.0), (200, 1.0)])
def test_torch_backend_cascade_with_sinks(window: int | None, cap: float) -> None:
    """Decode requests behind a shared prefix: with and without their group (cascade, unless
    the window is shorter than some request's KV), the definition's output."""
    gen = torch.Generator().manual_seed(17)
    kv = KVCache(num_layers=1, num_slots=512, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM,
                 dtype=torch.float32, device=torch.device("cpu"))  # fmt: skip
    kv.buffer[:, :, :-1] = torch.randn(2, 1, 512, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    tables = [list(range(60)) + list(range(100 + 20 * i, 104 + 21 * i)) for i in range(3)]
    tables.append(list(range(300, 330)))
    q = Q_SCALE * torch.randn(4, 3 * NUM_KV_HEADS, HEAD_DIM, generator=gen)
    k_new, v_new = torch.randn(2, 4, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    sinks = 2.0 * torch.randn(3 * NUM_KV_HEADS, generator=gen)
    layer = LayerAttention(0, scale=0.3, sliding_window=window, logit_cap=cap, sinks=sinks)
    for groups in ([], [PrefixGroup([0, 1, 2], 60)]):
        batch = ForwardBatch.build([[1]] * 4, [len(t) - 1 for t in tables], tables,
                                   prefix_groups=groups)  # fmt: skip
        backend = TorchAttentionBackend()
        backend.init_forward(batch)
        o = backend.forward(q, k_new, v_new, layer, kv, batch)
        check(o, q, kv, batch, 0.3, sinks, window, cap)


def test_layer_attention_with_sinks_stays_a_value() -> None:
    """sinks takes no part in == and hash (a tensor has no truth value), nor in the repr."""
    sinks = torch.zeros(4)
    a, b = LayerAttention(2, 0.5, 128), LayerAttention(2, 0.5, 128, sinks=sinks)
    assert a == b and hash(a) == hash(b) and b.sinks is sinks
    assert "sinks" not in repr(b)
    with pytest.raises(ValueError, match="sinks"):
        LayerAttention(0, sinks=torch.zeros(2, 2))
    assert math.isclose(b.softmax_scale(64), 0.5)
