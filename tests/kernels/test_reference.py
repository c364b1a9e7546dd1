"""Reference attention kernels, the torch backend and KVCache vs naive per-token loops."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from radixrt.kernels import reference
from radixrt.kernels.reference import decode_attention_ref, extend_attention_ref, store_kv_ref
from radixrt.runtime.forward.attention import TorchAttentionBackend
from radixrt.runtime.forward.attention.base import LayerAttention
from radixrt.runtime.forward.forward_batch import ForwardBatch
from radixrt.runtime.forward.kv_cache import KVCache

HEAD_DIM = 8
NUM_KV_HEADS = 2
NUM_SLOTS = 200


def naive_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, batch: ForwardBatch, scale: float,
    window: int | None = None, logit_cap: float = 0.0,
) -> Tensor:
    """Explicit loops: token j of request i (prefix P) attends to positions 0..P+j (with a window
    W only to P+j-W+1..P+j; with a cap c its scores s become c * tanh(s / c)), in float64."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = q.shape[1] // k_cache.shape[1]
    qo, kv = batch.qo_indptr.tolist(), batch.kv_indptr.tolist()
    for i in range(batch.batch_size):
        slots = batch.kv_indices[kv[i] : kv[i + 1]].tolist()
        prefix = batch.prefix_lens[i]
        for j, row in enumerate(range(qo[i], qo[i + 1])):
            first = 0 if window is None else max(0, prefix + j + 1 - window)
            visible = slots[first : prefix + j + 1]
            for h in range(q.shape[1]):
                keys = k_cache[visible, h // group].double()  # [n, head_dim]
                values = v_cache[visible, h // group].double()  # [n, head_dim]
                scores = keys @ q[row, h].double() * scale  # [n]
                if logit_cap > 0:
                    scores = logit_cap * torch.tanh(scores / logit_cap)
                out[row, h] = torch.softmax(scores, dim=0) @ values
    return out


def make_case(
    prefix_lens: list[int], extend_lens: list[int], num_heads: int, seed: int = 0
) -> tuple[ForwardBatch, KVCache, Tensor, Tensor, Tensor]:
    """A batch over scattered slots with random prefix KV already stored; new q, k, v."""
    gen = torch.Generator().manual_seed(seed)
    kv_cache = KVCache(1, NUM_SLOTS, NUM_KV_HEADS, HEAD_DIM, torch.float32, "cpu")
    perm = torch.randperm(NUM_SLOTS, generator=gen)
    tables, tokens, start = [], [], 0
    for prefix, extend in zip(prefix_lens, extend_lens, strict=True):
        tables.append(perm[start : start + prefix + extend])
        tokens.append([0] * extend)
        start += prefix + extend
    batch = ForwardBatch.build(tokens, prefix_lens, tables)
    prefix_slots = torch.cat([t[:p] for t, p in zip(tables, prefix_lens, strict=True)])
    n_prefix = prefix_slots.numel()
    kv_cache.k[0][prefix_slots] = torch.randn(n_prefix, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    kv_cache.v[0][prefix_slots] = torch.randn(n_prefix, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    n = batch.num_tokens
    q = torch.randn(n, num_heads, HEAD_DIM, generator=gen)
    k = torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    return batch, kv_cache, q, k, v


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize(
    "prefix_lens,extend_lens",
    [([0], [7]), ([0, 0], [5, 1]), ([9], [4]), ([3, 0, 12], [6, 4, 1]), ([5, 11], [1, 3])],
)
def test_extend_matches_naive(group: int, prefix_lens: list[int], extend_lens: list[int]) -> None:
    batch, kv_cache, q, k, v = make_case(prefix_lens, extend_lens, NUM_KV_HEADS * group)
    scale = 1 / math.sqrt(HEAD_DIM)
    store_kv_ref(kv_cache.k[0], kv_cache.v[0], k, v, batch.out_slots)
    o = torch.empty_like(q)
    extend_attention_ref(
        q, o, kv_cache.k[0], kv_cache.v[0], batch.qo_indptr, batch.kv_indptr, batch.kv_indices,
        scale,
    )  # fmt: skip
    expected = naive_attention(q, kv_cache.k[0], kv_cache.v[0], batch, scale)
    torch.testing.assert_close(o.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("group", [1, 3])
def test_decode_matches_naive(group: int) -> None:
    prefix_lens = [1, 17, 4, 30]
    batch, kv_cache, q, k, v = make_case(prefix_lens, [1] * 4, NUM_KV_HEADS * group, seed=1)
    scale = 1 / math.sqrt(HEAD_DIM)
    store_kv_ref(kv_cache.k[0], kv_cache.v[0], k, v, batch.out_slots)
    o = torch.empty_like(q)
    decode_attention_ref(
        q, o, kv_cache.k[0], kv_cache.v[0], batch.kv_indptr, batch.kv_indices, scale
    )
    expected = naive_attention(q, kv_cache.k[0], kv_cache.v[0], batch, scale)
    torch.testing.assert_close(o.double(), expected, atol=1e-5, rtol=1e-5)
    assert kv_cache.k[0][kv_cache.padding_slot].abs().sum() == 0, "padding slot was written"


@pytest.mark.parametrize("group", [1, 3])
def test_backend_mixed_batch_matches_naive(group: int) -> None:
    """Decode and extend requests interleaved in one batch take both paths of the backend."""
    prefix_lens, extend_lens = [6, 0, 13, 4, 2], [1, 5, 1, 3, 1]
    batch, kv_cache, q, k, v = make_case(prefix_lens, extend_lens, NUM_KV_HEADS * group, seed=2)
    backend = TorchAttentionBackend()
    backend.init_forward(batch)
    o = backend.forward(q, k, v, LayerAttention(0), kv_cache, batch)
    expected = naive_attention(q, kv_cache.k[0], kv_cache.v[0], batch, 1 / math.sqrt(HEAD_DIM))
    torch.testing.assert_close(o.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kv_cache.k[0][batch.out_slots], k)
    torch.testing.assert_close(kv_cache.v[0][batch.out_slots], v)


# (sliding window, logit cap): windows shorter than some requests' KV and longer than all of it
WINDOW_CAP = [(1, 0.0), (4, 0.0), (100, 0.0), (None, 1.5), (3, 2.0), (100, 1.0)]
Q_SCALE = 3.0  # larger scores, so that a cap of 1-2 changes the softmax a lot


def window_case(group: int, seed: int) -> tuple[ForwardBatch, KVCache, Tensor, Tensor, Tensor]:
    """Prefills, prefill chunks after a prefix and decodes, K/V of the new tokens stored."""
    prefix_lens, extend_lens = [0, 9, 3, 12, 6], [7, 4, 6, 1, 1]
    batch, kv_cache, q, k, v = make_case(prefix_lens, extend_lens, NUM_KV_HEADS * group, seed)
    store_kv_ref(kv_cache.k[0], kv_cache.v[0], k, v, batch.out_slots)
    return batch, kv_cache, q * Q_SCALE, k, v


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("window,logit_cap", WINDOW_CAP)
def test_extend_window_and_cap_match_naive(
    group: int, window: int | None, logit_cap: float
) -> None:
    batch, kv_cache, q, _, _ = window_case(group, seed=3)
    scale = 1 / math.sqrt(HEAD_DIM)
    o = torch.full_like(q, float("nan"))
    extend_attention_ref(
        q, o, kv_cache.k[0], kv_cache.v[0], batch.qo_indptr, batch.kv_indptr, batch.kv_indices,
        scale, sliding_window=window, logit_cap=logit_cap,
    )  # fmt: skip
    expected = naive_attention(q, kv_cache.k[0], kv_cache.v[0], batch, scale, window, logit_cap)
    torch.testing.assert_close(o.double(), expected, atol=1e-5, rtol=1e-5)
    plain = naive_attention(q, kv_cache.k[0], kv_cache.v[0], batch, scale)
    if window == 100 and logit_cap == 0:
        torch.testing.assert_close(o.double(), plain, atol=1e-5, rtol=1e-5)
    else:  # the option changes the result: the test can tell it from plain attention
        assert (o.double() - plain).abs().max() > 1e-2


@pytest.mark.parametrize("window,logit_cap", [(5, 0.0), (None, 1.0), (7, 2.0)])
def test_extend_in_query_chunks_matches_naive(
    window: int | None, logit_cap: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Long extends run a chunk of queries at a time: tiny chunks give the same result."""
    monkeypatch.setattr(reference, "MIN_QUERY_CHUNK", 3)
    monkeypatch.setattr(reference, "QUERY_CHUNK_SCORES", 1)
    batch, kv_cache, q, k, v = make_case([0, 8], [23, 17], NUM_KV_HEADS * 2, seed=4)
    store_kv_ref(kv_cache.k[0], kv_cache.v[0], k, v, batch.out_slots)
    o = torch.full_like(q, float("nan"))
    extend_attention_ref(
        q * Q_SCALE, o, kv_cache.k[0], kv_cache.v[0], batch.qo_indptr, batch.kv_indptr,
        batch.kv_indices, 0.3, sliding_window=window, logit_cap=logit_cap,
    )  # fmt: skip
    expected = naive_attention(q * Q_SCALE, kv_cache.k[0], kv_cache.v[0], batch, 0.3, window,
                               logit_cap)  # fmt: skip
    torch.testing.assert_close(o.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("window,logit_cap", WINDOW_CAP)
def test_decode_window_and_cap_match_naive(
    group: int, window: int | None, logit_cap: float
) -> None:
    batch, kv_cache, q, k, v = make_case([1, 17, 4, 30], [1] * 4, NUM_KV_HEADS * group, seed=5)
    store_kv_ref(kv_cache.k[0], kv_cache.v[0], k, v, batch.out_slots)
    o = torch.full_like(q, float("nan"))
    decode_attention_ref(
        q * Q_SCALE, o, kv_cache.k[0], kv_cache.v[0], batch.kv_indptr, batch.kv_indices, 0.3,
        sliding_window=window, logit_cap=logit_cap,
    )  # fmt: skip
    expected = naive_attention(q * Q_SCALE, kv_cache.k[0], kv_cache.v[0], batch, 0.3, window,
                               logit_cap)  # fmt: skip
    torch.testing.assert_close(o.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("window,logit_cap", [(3, 0.0), (None, 1.5), (8, 2.0)])
def test_backend_window_and_cap_match_naive(
    group: int, window: int | None, logit_cap: float
) -> None:
    """The torch backend's decode and extend paths in one batch, under a window and a cap."""
    prefix_lens, extend_lens = [6, 0, 13, 4, 2], [1, 5, 1, 3, 1]
    batch, kv_cache, q, k, v = make_case(prefix_lens, extend_lens, NUM_KV_HEADS * group, seed=6)
    backend = TorchAttentionBackend()
    backend.init_forward(batch)
    layer = LayerAttention(0, scale=0.3, sliding_window=window, logit_cap=logit_cap)
    o = backend.forward(q * Q_SCALE, k, v, layer, kv_cache, batch)
    expected = naive_attention(q * Q_SCALE, kv_cache.k[0], kv_cache.v[0], batch, 0.3, window,
                               logit_cap)  # fmt: skip
    torch.testing.assert_close(o.double(), expected, atol=1e-5, rtol=1e-5)
    seq_lens = [p + e for p, e, d in zip(prefix_lens, extend_lens, batch.decode_mask) if d]
    assert backend.kv_positions_read == sum(min(n, window or n) for n in seq_lens)


def test_forward_batch_build() -> None:
    batch = ForwardBatch.build(
        [[5, 6, 7], [8]], [2, 4], [[10, 11, 12, 13, 14], [1, 2, 3, 4, 9, 99]]
    )
    assert batch.input_ids.tolist() == [5, 6, 7, 8]
    assert batch.positions.tolist() == [2, 3, 4, 4]
    assert batch.out_slots.tolist() == [12, 13, 14, 9]
    assert batch.qo_indptr.tolist() == [0, 3, 4]
    assert batch.kv_indptr.tolist() == [0, 5, 10]
    assert batch.kv_indices.tolist() == [10, 11, 12, 13, 14, 1, 2, 3, 4, 9]
    assert batch.seq_lens == [5, 5] and batch.extend_lens == [3, 1]
    assert batch.decode_mask == [False, True]
    assert batch.last_token_rows.tolist() == [2, 3]
    with pytest.raises(ValueError, match="slot table"):
        ForwardBatch.build([[1, 2]], [3], [[0, 1, 2]])


def test_kv_cache_copy_and_swap() -> None:
    cache = KVCache(3, 16, 2, 4, torch.float32, "cpu")
    assert cache.bytes_per_token() == 2 * 3 * 2 * 4 * 4
    assert cache.k[0].shape == (17, 2, 4)
    cache.buffer.normal_()
    cache.buffer[:, :, cache.padding_slot] = 0
    src, dst = torch.tensor([1, 5, 7]), torch.tensor([2, 9, 0])
    cache.copy_slots(src, dst)
    for layer in range(3):
        torch.testing.assert_close(cache.k[layer][dst], cache.k[layer][src])
        torch.testing.assert_close(cache.v[layer][dst], cache.v[layer][src])
    saved = cache.read_slots(torch.tensor([3, 4]))
    assert saved.shape == (2, 3, 2, 2, 4) and saved.device.type == "cpu"
    cache.write_slots(torch.tensor([10, 11]), saved)
    torch.testing.assert_close(cache.read_slots(torch.tensor([10, 11])), saved)
    torch.testing.assert_close(cache.v[2][11], cache.v[2][4])
