"""The triton attention backend against the torch backend: one layer's mixed batch, and the whole
default model's greedy tokens through radixrt.Engine (Triton's interpreter without CUDA)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any Triton kernel is defined (see radixrt.kernels)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

from radixrt import Engine, SamplingParams  # noqa: E402
from radixrt.runtime.forward.attention import (  # noqa: E402
    AttentionBackend,
    TorchAttentionBackend,
    create_attention_backend,
)
from radixrt.runtime.forward.attention.base import LayerAttention  # noqa: E402
from radixrt.runtime.forward.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from radixrt.runtime.forward.forward_batch import ForwardBatch, PrefixGroup  # noqa: E402
from radixrt.runtime.forward.kv_cache import KVCache  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PROMPT = "The capital of France is"
NEW_TOKENS = 8


FULL = LayerAttention(1)
SINKS = 2.0 * torch.randn(9, generator=torch.Generator().manual_seed(9)).to(DEVICE) + 2.0
# sliding windows shorter than some requests' KV and longer than all of it, logit caps, sinks
# [9 query heads] (gpt-oss) alone and with a window and a cap
LAYERS = [FULL, LayerAttention(1, sliding_window=4), LayerAttention(1, 0.2, 3, logit_cap=2.0),
          LayerAttention(1, sliding_window=100, logit_cap=1.0), LayerAttention(1, sinks=SINKS),
          LayerAttention(1, 0.2, 3, logit_cap=2.0, sinks=SINKS)]  # fmt: skip


def layer_id(layer: LayerAttention) -> str:
    sinks = "" if layer.sinks is None else "-sinks"
    return f"w{layer.sliding_window}-c{layer.logit_cap:g}{sinks}"


def run_backend(
    backend: AttentionBackend, batch: ForwardBatch, kv_cache: KVCache, qkv: list[torch.Tensor],
    layer: LayerAttention = FULL,
) -> torch.Tensor:  # fmt: skip
    backend.init_forward(batch)
    return backend.forward(*qkv, layer=layer, kv_cache=kv_cache, batch=batch)


@pytest.mark.parametrize("layer", LAYERS, ids=layer_id)
@pytest.mark.parametrize(
    "prefix_lens,extend_lens",
    [([5, 0, 12, 3], [1, 9, 4, 1]),  # decode and prefill mixed: the extend kernel for all
     ([0, 6], [7, 5]),  # prefill only
     ([7, 30, 2], [1, 1, 1])],  # decode only: the split-KV decode kernel
)  # fmt: skip
def test_backend_matches_torch_backend(
    prefix_lens: list[int], extend_lens: list[int], layer: LayerAttention
) -> None:
    gen = torch.Generator().manual_seed(len(prefix_lens))
    num_slots, kv_heads, heads, head_dim = 120, 3, 9, 64
    perm = torch.randperm(num_slots, generator=gen)
    tables, tokens, used = [], [], 0
    for prefix, extend in zip(prefix_lens, extend_lens):
        tables.append(perm[used : used + prefix + extend])
        tokens.append([0] * extend)
        used += prefix + extend
    batch = ForwardBatch.build(tokens, prefix_lens, tables, device=DEVICE)
    assert batch.is_decode_only == all(e == 1 for e in extend_lens)
    prefix = torch.randn(2, 2, num_slots, kv_heads, head_dim, generator=gen).to(DEVICE)
    caches = [KVCache(2, num_slots, kv_heads, head_dim, torch.float32, DEVICE) for _ in range(2)]
    for kv_cache in caches:
        kv_cache.buffer[:, :, :num_slots] = prefix
    n = batch.num_tokens
    qkv = [
        3 * torch.randn(n, h, head_dim, generator=gen).to(DEVICE)  # large scores: a cap bites
        for h in (heads, kv_heads, kv_heads)
    ]
    expected = run_backend(TorchAttentionBackend(), batch, caches[0], qkv, layer)
    backend = create_attention_backend("triton")
    assert isinstance(backend, TritonAttentionBackend)
    got = run_backend(backend, batch, caches[1], qkv, layer)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(caches[1].buffer, caches[0].buffer, atol=0, rtol=0)


@pytest.mark.parametrize("layer", LAYERS, ids=layer_id)
def test_cascade_backend_matches_torch_backend(layer: LayerAttention) -> None:
    """A decode batch with a prefix group (three requests behind 40 shared slots, one alone):
    the triton backend's cascade kernel (the decode kernel under a window shorter than some
    request's KV) equals the torch backend with and without the group."""
    gen = torch.Generator().manual_seed(3)
    num_slots, kv_heads, heads, head_dim = 160, 3, 9, 64
    perm = torch.randperm(num_slots, generator=gen).tolist()
    shared, rest = perm[:40], perm[40:]
    tables = [shared + rest[0:5], shared + rest[5:6], rest[6:26], shared + rest[26:40]]
    prefix_lens = [len(t) - 1 for t in tables]
    group = [PrefixGroup([0, 1, 3], 40)]
    kv_cache = KVCache(2, num_slots, kv_heads, head_dim, torch.float32, DEVICE)
    kv_cache.buffer[:, :, :num_slots] = torch.randn(
        2, 2, num_slots, kv_heads, head_dim, generator=gen
    ).to(DEVICE)
    qkv = [
        torch.randn(4, h, head_dim, generator=gen).to(DEVICE) for h in (heads, kv_heads, kv_heads)
    ]
    outs = []
    for backend, groups in (
        (TorchAttentionBackend(), []),
        (TorchAttentionBackend(), group),
        (TritonAttentionBackend(), group),
    ):
        batch = ForwardBatch.build(
            [[0]] * 4, prefix_lens, tables, device=DEVICE, prefix_groups=groups
        )
        outs.append(run_backend(backend, batch, kv_cache, qkv, layer))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[2], outs[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("layer", LAYERS, ids=layer_id)
def test_a_draft_tree_attends_each_node_to_its_path(layer: LayerAttention) -> None:
    """Speculative decoding's draft tree as the worker lays it out (worker/draft_verifier.py):
    the run's own extend (its last known token and the main line), then each branch as an
    entry whose prefix is the known tokens and its ancestors' slots, some written in this very
    pass. Both backends give each node the attention over exactly its path (the tree mask): a
    dense masked reference for the plain layer, the torch backend for the others."""
    gen = torch.Generator().manual_seed(5)
    num_slots, kv_heads, heads, head_dim, prefix = 64, 3, 9, 64, 11
    perm = torch.randperm(num_slots, generator=gen).tolist()
    known, nodes = perm[:prefix + 1], perm[prefix + 1 : prefix + 8]  # slots; 7 nodes
    parents = [-1, 0, 1, -1, 3, 1, 5]  # chain 0-1-2; branch 3-4 at the root; 5-6 under 1
    tables = [known + nodes[:3], known + nodes[3:5], known + nodes[:2] + nodes[5:7]]
    tokens = [[0] * 4, [0] * 2, [0] * 2]
    batch = ForwardBatch.build(tokens, [prefix, prefix + 1, prefix + 3], tables, device=DEVICE)
    kv = torch.randn(2, 2, num_slots, kv_heads, head_dim, generator=gen).to(DEVICE)
    qkv = [3 * torch.randn(8, h, head_dim, generator=gen).to(DEVICE)
           for h in (heads, kv_heads, kv_heads)]  # rows: the known token, nodes 0..6
    outs = []
    for backend in (TorchAttentionBackend(), TritonAttentionBackend()):
        kv_cache = KVCache(2, num_slots, kv_heads, head_dim, torch.float32, DEVICE)
        kv_cache.buffer[:, :, :num_slots] = kv
        outs.append(run_backend(backend, batch, kv_cache, qkv, layer))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=1e-4)
    if layer is not FULL:
        return
    q, k, v = qkv
    keys, values = kv[0, 1, known[:-1]], kv[1, 1, known[:-1]]  # the cached prefix (layer 1)
    for row in range(8):  # the known token's row sees the prefix and itself; a node its path
        path, at = [], row - 1
        while at >= 0:
            path.insert(0, at + 1)
            at = parents[at]
        rows = [0, *path]
        k_all = torch.cat([keys, k[rows]]).repeat_interleave(heads // kv_heads, dim=1)
        v_all = torch.cat([values, v[rows]]).repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("hd,khd->hk", q[row], k_all) / head_dim**0.5
        want = torch.einsum("hk,khd->hd", scores.softmax(-1), v_all)
        torch.testing.assert_close(outs[0][row], want, atol=1e-4, rtol=1e-4)


@contextmanager
def attention_backend(model: Any, backend: AttentionBackend) -> Iterator[None]:
    """Run the model's attention layers on another backend, restoring the old one after."""
    old = model.attn_backend
    layers = [layer.self_attn for layer in model.layers]
    model.attn_backend = backend
    for attn in layers:
        attn.backend = backend
    try:
        yield
    finally:
        model.attn_backend = old
        for attn in layers:
            attn.backend = old


def greedy(loaded: Any, prompts: list[str], **options: Any) -> tuple[Engine, list[Any]]:
    engine = Engine(model=loaded, max_total_tokens=1024, check_integrity=True, **options)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True, logprobs=True)
    return engine, engine.generate(prompts, params)


@pytest.fixture(scope="module")
def model_on_device(request: pytest.FixtureRequest) -> Any:
    """The session's default model on the CPU; a float32 copy on CUDA when there is a GPU."""
    if DEVICE.type == "cpu":
        return request.getfixturevalue("loaded_model")
    from radixrt.runtime.models.loader import load_model

    return load_model("default", dtype="float32", device=DEVICE, attention_backend="torch")


def test_engine_greedy_tokens_match_torch_backend(model_on_device: Any) -> None:
    """Prefill (extend kernel) then decode steps (decode kernel) over the whole model."""
    shared = "A list of the capital cities of Europe, with one fact about each of them: " * 2
    prompts = (
        [PROMPT]
        if DEVICE.type == "cpu"
        else [PROMPT, "def fib(n):", "Once upon a time", shared + "Paris,", shared + "Rome,"]
    )
    assert isinstance(model_on_device.model.attn_backend, TorchAttentionBackend)
    _, expected = greedy(model_on_device, prompts)
    with attention_backend(model_on_device.model, TritonAttentionBackend()):
        _, got = greedy(model_on_device, prompts, cuda_graph_max_bs=0)
    for out, ref in zip(got, expected):
        assert out.token_ids == ref.token_ids
        assert len(out.token_ids) == NEW_TOKENS
        lps = [lp.logprob for lp in out.samples[0].logprobs]
        ref_lps = [lp.logprob for lp in ref.samples[0].logprobs]
        assert lps == pytest.approx(ref_lps, abs=1e-3)


@pytest.mark.gpu
def test_cuda_graph_decode_matches_eager(model_on_device: Any) -> None:
    """Three requests replay the CUDA graph of bucket 4 (one dummy row) for every decode step;
    the tokens equal the eager torch backend's."""
    prompts = [PROMPT, "def fib(n):", "Once upon a time"]
    _, expected = greedy(model_on_device, prompts)
    with attention_backend(model_on_device.model, TritonAttentionBackend()):
        engine, graphed = greedy(model_on_device, prompts, cuda_graph_max_bs=8)
    runner = engine.worker.graph_runner
    assert runner is not None and runner.replays == NEW_TOKENS - 1
    assert [o.token_ids for o in graphed] == [o.token_ids for o in expected]
