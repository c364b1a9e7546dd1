"""A latent layer (multi-head latent attention: one cached row per token, its values the row's
first value_dim dims) through both backends: the torch backend (decode, cascade groups, extend)
and the triton backend (the latent kernels, in Triton's interpreter without CUDA) equal the
latent kernels' PyTorch references on the same pool, and store the same rows."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any Triton kernel is defined (see radixrt.kernels)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from radixrt.kernels.mla_reference import (  # noqa: E402
    mla_decode_attention_ref,
    mla_extend_attention_ref,
)
from radixrt.runtime.forward.attention import TorchAttentionBackend  # noqa: E402
from radixrt.runtime.forward.attention.base import LayerAttention  # noqa: E402
from radixrt.runtime.forward.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from radixrt.runtime.forward.forward_batch import ForwardBatch, PrefixGroup  # noqa: E402
from radixrt.runtime.forward.kv_cache import KVCache  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
HEADS, LATENT, ROPE = 16, 32, 16  # a tiny V3: 16 query heads over a 32 + 16 latent row
NUM_SLOTS = 160
LAYER = LayerAttention(0, 0.125, value_dim=LATENT)


def _pool(gen: torch.Generator) -> KVCache:
    kv = KVCache(1, NUM_SLOTS, 1, LATENT + ROPE, torch.float32, DEVICE, parts=1)
    kv.buffer[:, :, :NUM_SLOTS] = torch.randn(1, 1, NUM_SLOTS, 1, LATENT + ROPE,
                                              generator=gen).to(DEVICE)
    assert kv.v[0] is kv.k[0] and kv.bytes_per_token() == (LATENT + ROPE) * 4
    return kv


def _run(backend: object, batch: ForwardBatch, kv: KVCache, q: torch.Tensor,
         rows: torch.Tensor) -> torch.Tensor:
    backend.init_forward(batch)  # type: ignore[attr-defined]
    out = backend.forward(q, rows, None, LAYER, kv, batch)  # type: ignore[attr-defined]
    assert out.shape == (q.shape[0], HEADS, LATENT)
    return out


@pytest.mark.parametrize(
    "prefix_lens, extend_lens",
    [([5, 0, 12, 3], [1, 9, 4, 1]),  # decode and prefill mixed
     ([0, 6], [7, 5]),  # prefill only
     ([7, 30, 2], [1, 1, 1])],  # decode only
)  # fmt: skip
def test_latent_layer_backends_match_references(prefix_lens: list[int],
                                                extend_lens: list[int]) -> None:
    gen = torch.Generator().manual_seed(len(prefix_lens))
    perm = torch.randperm(NUM_SLOTS, generator=gen)
    tables, tokens, used = [], [], 0
    for prefix, extend in zip(prefix_lens, extend_lens):
        tables.append(perm[used : used + prefix + extend])
        tokens.append([0] * extend)
        used += prefix + extend
    batch = ForwardBatch.build(tokens, prefix_lens, tables, device=DEVICE)
    n = batch.num_tokens
    q = torch.randn(n, HEADS, LATENT + ROPE, generator=gen).to(DEVICE)
    rows = torch.randn(n, 1, LATENT + ROPE, generator=gen).to(DEVICE)
    pools = [_pool(torch.Generator().manual_seed(7)) for _ in range(3)]
    pools[2].k[0][batch.out_slots] = rows
    expected = torch.empty(n, HEADS, LATENT, device=DEVICE)
    if batch.is_decode_only:
        mla_decode_attention_ref(q, expected, pools[2].k[0], batch.kv_indptr, batch.kv_indices,
                                 LAYER.softmax_scale(0), LATENT)
    else:
        mla_extend_attention_ref(q, expected, pools[2].k[0], batch.qo_indptr, batch.kv_indptr,
                                 batch.kv_indices, LAYER.softmax_scale(0), LATENT)
    for backend, kv in ((TorchAttentionBackend(), pools[0]),
                        (TritonAttentionBackend(), pools[1])):
        got = _run(backend, batch, kv, q, rows)
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(kv.buffer, pools[2].buffer, atol=0, rtol=0)


def test_latent_cascade_decode_reads_the_shared_prefix_once() -> None:
    """Decode rows behind a shared latent prefix (a prefix group): the torch backend's cascade
    path over the latent equals the plain latent decode, and reads the prefix once; the triton
    backend (no latent cascade kernel) equals both."""
    gen = torch.Generator().manual_seed(3)
    perm = torch.randperm(NUM_SLOTS, generator=gen).tolist()
    shared, rest = perm[:40], perm[40:]
    tables = [shared + rest[0:5], shared + rest[5:6], rest[6:26], shared + rest[26:40]]
    prefix_lens = [len(t) - 1 for t in tables]
    q = torch.randn(4, HEADS, LATENT + ROPE, generator=gen).to(DEVICE)
    rows = torch.randn(4, 1, LATENT + ROPE, generator=gen).to(DEVICE)
    outs, reads = [], []
    for backend, groups in ((TorchAttentionBackend(), []),
                            (TorchAttentionBackend(), [PrefixGroup([0, 1, 3], 40)]),
                            (TritonAttentionBackend(), [PrefixGroup([0, 1, 3], 40)])):
        batch = ForwardBatch.build([[0]] * 4, prefix_lens, tables, device=DEVICE,
                                   prefix_groups=groups)
        outs.append(_run(backend, batch, _pool(torch.Generator().manual_seed(5)), q, rows))
        reads.append(getattr(backend, "kv_positions_read", None))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[2], outs[0], atol=1e-4, rtol=1e-4)
    assert reads[1] == reads[0] - 2 * 40  # two of the group's three rows skip the prefix
