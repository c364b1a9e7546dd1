"""Cascade attention: decode requests that share a radix-tree prefix read it once per step.

The path is checked against the path it replaces: the reference kernel against plain decode
attention on random ragged batches, the torch backend's layer output with groups against the same
batch without, and the whole default model's greedy tokens and logprobs with
`cascade_attention` on and off (shared system prompts, page sizes 1 and 16, n > 1 forks,
overlap). That the prefix is read once is counted: the backend counts the KV positions it reads.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
import torch

from radixrt import SamplingParams
from radixrt.kernels.reference import cascade_decode_attention_ref, decode_attention_ref
from radixrt.runtime.forward.attention.base import LayerAttention
from radixrt.runtime.forward.attention.torch_backend import TorchAttentionBackend
from radixrt.runtime.forward.forward_batch import ForwardBatch, PrefixGroup
from radixrt.runtime.forward.kv_cache import KVCache


def indptr(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int64)


def ragged_case(seed: int, page_size: int) -> dict[str, Any]:
    """1-3 groups of 1-5 requests, each group behind a shared prefix (none, 1 or 3 pages, or a
    ragged length), each request with 1-40 positions of its own; slots scattered page by page
    through a pool twice as large as needed. Requests of a group without a prefix are in no
    group."""
    rng = random.Random(seed)
    sizes = [rng.randint(1, 5) for _ in range(rng.randint(1, 3))]
    prefix_lens = [rng.choice([0, page_size, 3 * page_size, rng.randint(1, 50)]) for _ in sizes]
    own_lens = [rng.randint(1, 40) for _ in range(sum(sizes))]
    num_pages = 2 * (sum(prefix_lens) + sum(own_lens)) // page_size + 8
    pages = list(range(num_pages))
    rng.shuffle(pages)

    def take(n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            page = pages.pop()
            out += [page * page_size + j for j in range(page_size)]
        return out[:n]

    prefixes = [take(n) for n in prefix_lens]
    owns = [take(n) for n in own_lens]
    members = list(range(sum(sizes)))
    rng.shuffle(members)  # a group's rows are anywhere in the batch
    groups = []
    for g, size in enumerate(sizes):
        groups.append((members[:size], g))
        members = members[size:]
    full = [list(o) for o in owns]
    for rows, g in groups:
        for r in rows:
            full[r] = prefixes[g] + owns[r]
    return {"prefixes": prefixes, "owns": owns, "full": full, "bs": len(own_lens),
            "groups": [(rows, g) for rows, g in groups if prefix_lens[g] > 0],
            "num_slots": num_pages * page_size}


@pytest.mark.parametrize("logit_cap", [0.0, 1.5])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("seed", range(4))
def test_cascade_reference_equals_plain_decode(
    seed: int, group: int, page_size: int, logit_cap: float
) -> None:
    case = ragged_case(seed, page_size)
    gen = torch.Generator().manual_seed(seed)
    kv_heads, head_dim = 2, 32
    k_cache = torch.randn(case["num_slots"] + 1, kv_heads, head_dim, generator=gen)
    v_cache = torch.randn(case["num_slots"] + 1, kv_heads, head_dim, generator=gen)
    q = 3 * torch.randn(case["bs"], kv_heads * group, head_dim, generator=gen)  # a cap bites
    plain = torch.full_like(q, float("nan"))
    full = case["full"]
    decode_attention_ref(q, plain, k_cache, v_cache, indptr([len(f) for f in full]),
                         torch.tensor(list(itertools.chain(*full))), head_dim**-0.5,
                         logit_cap=logit_cap)  # fmt: skip
    groups = case["groups"]
    own = torch.tensor(list(itertools.chain(*case["owns"])))
    cascade = torch.full_like(q, float("nan"))
    prefixes = [case["prefixes"][g] for _, g in groups]
    cascade_decode_attention_ref(
        q, cascade, k_cache, v_cache,
        indptr([len(p) for p in prefixes]), torch.tensor(list(itertools.chain(*prefixes)),
                                                          dtype=torch.int64),
        indptr([len(rows) for rows, _ in groups]),
        torch.tensor(list(itertools.chain(*(rows for rows, _ in groups))), dtype=torch.int64),
        indptr([len(o) for o in case["owns"]]), own, head_dim**-0.5, logit_cap=logit_cap,
    )  # fmt: skip
    assert torch.allclose(cascade, plain, atol=1e-5, rtol=1e-4)


def test_the_torch_backend_reads_a_shared_prefix_once() -> None:
    """One layer, a decode batch of 4 requests behind a 100-token prefix plus one alone: with
    the group the layer's output is the same and it reads 100 + own positions, not 4 x 100."""
    gen = torch.Generator().manual_seed(0)
    kv = KVCache(num_layers=1, num_slots=1024, num_kv_heads=3, head_dim=64,
                 dtype=torch.float32, device=torch.device("cpu"))
    kv.k[0][:-1] = torch.randn(1024, 3, 64, generator=gen)
    kv.v[0][:-1] = torch.randn(1024, 3, 64, generator=gen)
    prefix = list(range(100))
    tables = [prefix + list(range(200 + 20 * i, 200 + 20 * i + 5 + i)) for i in range(4)]
    tables.append(list(range(600, 650)))
    tokens = [[1]] * 5
    prefix_lens = [len(t) - 1 for t in tables]
    q = torch.randn(5, 9, 64, generator=gen)
    k_new = torch.randn(5, 3, 64, generator=gen)
    v_new = torch.randn(5, 3, 64, generator=gen)
    outs, reads = [], []
    for groups in ([], [PrefixGroup([0, 1, 2, 3], 100)]):
        batch = ForwardBatch.build(tokens, prefix_lens, tables, prefix_groups=groups)
        backend = TorchAttentionBackend()
        backend.init_forward(batch)
        outs.append(backend.forward(q, k_new, v_new, LayerAttention(0), kv, batch))
        reads.append(backend.kv_positions_read)
    own = sum(len(t) for t in tables)
    assert reads == [own, own - 3 * 100]
    assert torch.allclose(outs[0], outs[1], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "window,logit_cap,reads",
    [(None, 2.0, 100 + 26 + 50),  # the group reads its prefix once
     (8, 0.0, 4 * 8 + 8),  # a short window: each request its last 8 positions, no prefix
     (50, 1.0, 4 * 50 + 50),  # a window into the prefix: each request its share of it
     (200, 1.0, 100 + 26 + 50)],  # as long as every request's KV: no window, the group stands
)  # fmt: skip
def test_the_torch_backend_decodes_a_windowed_layer_exactly(
    window: int | None, logit_cap: float, reads: int
) -> None:
    """The batch of the test above with and without its group, on a layer with a sliding window
    and a logit cap: the same output, the reference's, and only the window's positions read."""
    gen = torch.Generator().manual_seed(1)
    kv = KVCache(num_layers=2, num_slots=1024, num_kv_heads=3, head_dim=64,
                 dtype=torch.float32, device=torch.device("cpu"))
    kv.buffer[:, :, :-1] = torch.randn(2, 2, 1024, 3, 64, generator=gen)
    tables = [list(range(100)) + list(range(200 + 20 * i, 205 + 21 * i)) for i in range(4)]
    tables.append(list(range(600, 650)))
    layer = LayerAttention(1, scale=0.2, sliding_window=window, logit_cap=logit_cap)
    q = 3 * torch.randn(5, 9, 64, generator=gen)
    k_new, v_new = torch.randn(2, 5, 3, 64, generator=gen)
    outs, counts = [], []
    for groups in ([], [PrefixGroup([0, 1, 2, 3], 100)]):
        batch = ForwardBatch.build([[1]] * 5, [len(t) - 1 for t in tables], tables,
                                   prefix_groups=groups)  # fmt: skip
        backend = TorchAttentionBackend()
        backend.init_forward(batch)
        outs.append(backend.forward(q, k_new, v_new, layer, kv, batch))
        counts.append(backend.kv_positions_read)
    expected = torch.full_like(q, float("nan"))
    decode_attention_ref(q, expected, kv.k[1], kv.v[1], batch.kv_indptr, batch.kv_indices, 0.2,
                         sliding_window=window, logit_cap=logit_cap)  # fmt: skip
    assert torch.allclose(outs[0], expected, atol=1e-5, rtol=1e-4)
    assert torch.allclose(outs[1], expected, atol=1e-5, rtol=1e-4)
    assert counts[1] == reads
    assert counts[0] == sum(min(len(t), window or len(t)) for t in tables)


def test_a_group_that_is_not_a_decode_prefix_is_refused() -> None:
    with pytest.raises(ValueError, match="prefix group"):
        ForwardBatch.build([[1], [1, 2]], [10, 10], [list(range(11)), list(range(12))],
                           prefix_groups=[PrefixGroup([0, 1], 5)])
    with pytest.raises(ValueError, match="prefix group"):
        ForwardBatch.build([[1], [1]], [10, 4], [list(range(11)), list(range(5))],
                           prefix_groups=[PrefixGroup([0, 1], 8)])


SYSTEM = ("You are a careful assistant who answers questions about geography, history and "
          "science in one short sentence, without lists, and never more than twenty words. ")


def shared_prompts() -> list[str]:
    questions = ["What is the capital of France?", "Who wrote Hamlet?", "Why is the sky blue?",
                 "How far is the Moon?", "What is photosynthesis?", "Who was Ada Lovelace?"]
    other = "Write one sentence about the sea and the wind, please."
    return [SYSTEM * 2 + f"Question: {q}\nAnswer:" for q in questions] + [other]


def tokens_and_logprobs(outputs: list[Any]) -> tuple[list, list]:
    tokens = [list(o.token_ids) for o in outputs]
    logprobs = [[lp.logprob for lp in o.logprobs] for o in outputs]
    return tokens, logprobs


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("page_size", [1, 16])
def test_the_model_decodes_the_same_with_cascade_on_and_off(
    make_engine: Any, loaded_model: Any, page_size: int
) -> None:
    """Greedy tokens identical and logprobs within 1e-4 with cascade attention on and off, and
    the shared system prompt read far less often with it on."""
    prompts = shared_prompts()
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=True)
    backend = loaded_model.model.attn_backend
    runs, reads = [], []
    for cascade in (False, True):
        # drafted runs are extends, never grouped: cascade's reads are counted without them
        engine = make_engine(page_size=page_size, cascade_attention=cascade,
                             cascade_min_saved_reads=64, speculative_algorithm=None)
        engine.generate(prompts[:1], params)  # the system prompt in the cache: all hit it
        before = backend.kv_positions_read
        runs.append(tokens_and_logprobs(engine.generate(prompts, params)))
        reads.append(backend.kv_positions_read - before)
    (tokens_off, lps_off), (tokens_on, lps_on) = runs
    assert tokens_on == tokens_off
    for a, b in zip(lps_on, lps_off, strict=True):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4
    assert reads[1] < reads[0] / 2, reads


def test_forked_samples_share_their_prompt_in_one_group(make_engine: Any,
                                                          loaded_model: Any) -> None:
    """n = 3 seeded samples of one prompt: the children's decodes read the prompt once; the
    samples are those of the plain path."""
    prompt = SYSTEM + "Tell me a short fact about owls."
    params = SamplingParams(max_tokens=10, temperature=0.8, seed=7, n=3, logprobs=True,
                            ignore_eos=True)
    backend = loaded_model.model.attn_backend
    outs, reads = [], []
    for cascade in (False, True):
        engine = make_engine(cascade_attention=cascade, cascade_min_saved_reads=64,
                             speculative_algorithm=None)
        before = backend.kv_positions_read
        (out,) = engine.generate([prompt], params)
        reads.append(backend.kv_positions_read - before)
        outs.append(tokens_and_logprobs(out.samples))
    assert outs[1][0] == outs[0][0]
    for a, b in zip(outs[1][1], outs[0][1], strict=True):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4
    assert reads[1] < reads[0] / 2, reads
