"""Tensor-parallel layers (radixrt/runtime/models/parallel.py) and the sharded Llama model against
their dense versions, float32 on the CPU, over REAL gloo process groups.

The ranks of a group run as threads of the test process, each joining with TPGroup.join (rank 0
serves the TCPStore from a listener bound here) and building its piece of a layer from the same
full weights with `layer.load(shard, full, name)`, the way a checkpoint is loaded. A rank
thread's exception fails the test (and a rank stuck in a collective fails it at JOIN_S).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from gloo_ranks import run_ranks
from torch import Tensor

from radixrt.runtime.distributed.group import TPGroup
from radixrt.runtime.forward.forward_batch import ForwardBatch
from radixrt.runtime.forward.kv_cache import KVCache
from radixrt.runtime.models.decoder import LM_HEAD_BLOCK_ROWS, CausalLM
from radixrt.runtime.models.loader import _build, iter_dummy_weights
from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    VocabRows,
    parallel_logits,
    take,
)
from radixrt.runtime.models.shard_plan import ShardPlan, head_rows

CPU = torch.device("cpu")
LAYER_ATOL = 1e-6
MODEL_ATOL = 1e-5


def config_of(num_heads: int, num_kv_heads: int, vocab: int = 37, inter: int = 22,
              hidden: int = 24, head_dim: int = 4, **extra: Any) -> ModelConfig:
    return ModelConfig(architecture=extra.pop("architecture", "LlamaForCausalLM"),
                       vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                       num_layers=extra.pop("num_layers", 1), num_heads=num_heads,
                       num_kv_heads=num_kv_heads, head_dim=head_dim, **extra)


def randn(gen: torch.Generator, *shape: int) -> Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float32)


def weight(gen: torch.Generator, out_features: int, in_features: int) -> Tensor:
    """A random [out, in] weight scaled so that a product with unit-variance inputs is of unit
    size (float32 rounding then stays far below LAYER_ATOL)."""
    return randn(gen, out_features, in_features) / in_features**0.5


def max_err(a: Tensor, b: Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max())


# --- take --------------------------------------------------------------------------------------


def test_take_zero_fills_padding_and_refuses_out_of_range() -> None:
    """take: entries at the index along dim (a contiguous run narrows, a view of the same
    storage), zero rows / columns where the index is None, ValueError for an index the tensor
    does not have."""
    full = torch.arange(12, dtype=torch.float32).reshape(4, 3) + 1
    run = take(full, [1, 2, 3], 0)
    assert torch.equal(run, full[1:4]) and run.data_ptr() == full[1].data_ptr()
    rows = take(full, [3, None, 0, None], 0)
    assert torch.equal(rows, torch.stack([full[3], torch.zeros(3), full[0], torch.zeros(3)]))
    cols = take(full, [None, 2, 1], 1)
    assert torch.equal(cols, torch.stack([torch.zeros(4), full[:, 2], full[:, 1]], dim=1))
    assert torch.equal(take(full, [None, None], 0), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="no index 4 along dimension 0"):
        take(full, [2, 3, 4], 0)
    with pytest.raises(ValueError, match="no index 3 along dimension 1"):
        take(full, [None, 3], 1)


def test_load_refuses_a_tensor_of_the_wrong_shape() -> None:
    """A checkpoint tensor whose other dimension does not fit the parameter is refused
    (ValueError), not broadcast or truncated into it."""
    col = ColumnParallelLinear(8, [[0, 1, None]], bias=False)
    with pytest.raises(ValueError, match="does not fit"):
        col.load(0, torch.zeros(4, 7))
    row = RowParallelLinear([0, None], 5, TPGroup.single())
    with pytest.raises(ValueError, match="does not fit"):
        row.load(0, torch.zeros(6, 3))


# --- the layers at tp 2 and 3 (and a replicated-KV case at 4) --------------------------------

# (num_heads, num_kv_heads, tp): 6/3 at 2 pads KV heads, 6/3 and 9/3 at 3 split, 9/3 at 2 pads,
# 3/1 at 2 replicates the KV head and pads a query head, 6/2 at 4 too
HEAD_CASES = [(6, 3, 2), (6, 3, 3), (9, 3, 2), (9, 3, 3), (3, 1, 2), (6, 2, 4)]


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "tp"), HEAD_CASES)
def test_qkv_column_and_o_row_parallel_match_dense(num_heads: int, num_kv_heads: int,
                                                   tp: int) -> None:
    """Fused QKV ColumnParallelLinear (shards loaded from the full q/k/v weights and biases by
    the plan's head rows): each rank's local head j is the dense projection's head q_heads[j]
    (kv_heads[j] for k and v), exactly zero for a padding head. Then RowParallelLinear o_proj
    over each rank's q output, all-reduced: the dense attention-output projection of the full q,
    identical on every rank."""
    config = config_of(num_heads, num_kv_heads)
    hd, hidden = config.head_dim, config.hidden_size
    gen = torch.Generator().manual_seed(tp * 100 + num_heads)
    w = {p: weight(gen, n * hd, hidden) for p, n in (("q", num_heads), ("k", num_kv_heads),
                                                   ("v", num_kv_heads))}
    b = {p: randn(gen, t.shape[0]) for p, t in w.items()}
    w_o = weight(gen, hidden, num_heads * hd)
    x = randn(gen, 5, hidden)
    dense = {p: F.linear(x, w[p], b[p]).view(5, -1, hd) for p in w}  # [n, heads, hd]
    dense_out = F.linear(dense["q"].reshape(5, -1), w_o)

    def rank_fn(group: TPGroup) -> Tensor:
        plan = ShardPlan.for_rank(config, tp, group.rank)
        q_rows, kv_rows = head_rows(plan.q_heads, hd), head_rows(plan.kv_heads, hd)
        qkv = ColumnParallelLinear(hidden, [q_rows, kv_rows, kv_rows], bias=True)
        for shard, p in enumerate("qkv"):
            qkv.load(shard, w[p], "weight")
            qkv.load(shard, b[p], "bias")
        y = qkv(x)
        q, k, v = y.split([len(q_rows), len(kv_rows), len(kv_rows)], dim=-1)
        for local, heads, full in ((q, plan.q_heads, dense["q"]), (k, plan.kv_heads, dense["k"]),
                                   (v, plan.kv_heads, dense["v"])):
            local = local.view(5, len(heads), hd)
            for j, h in enumerate(heads):
                if h is None:
                    assert torch.equal(local[:, j], torch.zeros(5, hd)), (group.rank, j)
                else:
                    assert max_err(local[:, j], full[:, h]) < LAYER_ATOL, (group.rank, j, h)
        o_proj = RowParallelLinear(q_rows, hidden, group)
        o_proj.load(0, w_o, "weight")
        return o_proj(q.contiguous())

    outs = run_ranks(tp, rank_fn)
    for out in outs:
        assert torch.equal(out, outs[0])
    assert max_err(outs[0], dense_out) < LAYER_ATOL


@pytest.mark.parametrize(("inter", "tp"), [(22, 2), (22, 3), (21, 3), (10, 4)])
def test_row_parallel_sums_the_ranks_and_ignores_padding_inputs(inter: int, tp: int) -> None:
    """RowParallelLinear (down_proj over the plan's intermediate slice, padded when tp does not
    divide it): the all-reduced partial products equal the dense product on every rank, even
    with garbage in the padding input columns (the padding weight columns are zero)."""
    config = config_of(6, 2 if tp != 3 else 3, inter=inter)
    gen = torch.Generator().manual_seed(inter * 10 + tp)
    w_down = weight(gen, config.hidden_size, inter)
    x = randn(gen, 4, inter)
    garbage = randn(gen, 4, inter) * 100 + 7
    dense = F.linear(x, w_down)

    def rank_fn(group: TPGroup) -> tuple[Tensor, int]:
        cols = ShardPlan.for_rank(config, tp, group.rank).intermediate.indices()
        down = RowParallelLinear(cols, config.hidden_size, group)
        down.load(0, w_down, "weight")
        local = take(x, cols, 1).clone()
        pad = torch.tensor([c is None for c in cols])
        local[:, pad] = garbage[:, : int(pad.sum())]
        return down(local), int(pad.sum())

    results = run_ranks(tp, rank_fn)
    outs = [out for out, _ in results]
    assert sum(n for _, n in results) == -(-inter // tp) * tp - inter  # padding was exercised
    for out in outs:
        assert torch.equal(out, outs[0])
    assert max_err(outs[0], dense) < LAYER_ATOL


@pytest.mark.parametrize(("vocab", "tp"), [(37, 2), (37, 3), (36, 3)])
def test_vocab_parallel_embedding_matches_dense(vocab: int, tp: int) -> None:
    """VocabParallelEmbedding: ids from every rank's slice (first, last, both ends of each
    slice, repeats) look up exactly the dense rows on every rank, also when the vocabulary does
    not divide tp (the last rank's padding rows are never hit)."""
    config = config_of(6, 3, vocab=vocab)
    gen = torch.Generator().manual_seed(vocab + tp)
    table = randn(gen, vocab, config.hidden_size)
    size = -(-vocab // tp)
    edges = {i for r in range(tp) for i in (r * size, min(r * size + size, vocab) - 1)}
    ids = torch.tensor(sorted(edges) + torch.randperm(vocab, generator=gen).tolist() + [0, 0])
    dense = F.embedding(ids, table)

    def rank_fn(group: TPGroup) -> Tensor:
        plan = ShardPlan.for_rank(config, tp, group.rank)
        embed = VocabParallelEmbedding(plan.vocab, config.hidden_size, group)
        embed.load(0, table, "weight")
        pad = [i is None for i in plan.vocab.indices()]
        assert torch.equal(embed.weight.data[torch.tensor(pad)],
                           torch.zeros(sum(pad), config.hidden_size))
        return embed(ids)

    outs = run_ranks(tp, rank_fn)
    for out in outs:
        assert torch.equal(out, outs[0])
    assert torch.equal(outs[0], dense)


@pytest.mark.parametrize("block_rows", [4, LM_HEAD_BLOCK_ROWS])
@pytest.mark.parametrize(("vocab", "tp"), [(37, 2), (37, 3)])
def test_parallel_logits_gather_and_drop_padding(vocab: int, tp: int, block_rows: int) -> None:
    """parallel_logits: each rank's vocabulary rows of the LM head (VocabRows), gathered into
    float32 logits over exactly the real vocabulary (padding columns dropped), equal to the dense
    product on every rank (blocked and plain products alike)."""
    config = config_of(6, 3, vocab=vocab)
    gen = torch.Generator().manual_seed(vocab * tp + block_rows)
    head = weight(gen, vocab, config.hidden_size)
    hidden = randn(gen, 5, config.hidden_size)  # 5 rows: within CPU_BLOCKED_LINEAR_ROWS
    dense = F.linear(hidden, head)

    def rank_fn(group: TPGroup) -> Tensor:
        plan = ShardPlan.for_rank(config, tp, group.rank)
        rows = VocabRows(plan.vocab, config.hidden_size)
        rows.load(0, head, "weight")
        return parallel_logits(hidden, rows.weight, plan.vocab, group, block_rows)

    outs = run_ranks(tp, rank_fn)
    for out in outs:
        assert torch.equal(out, outs[0])
    assert outs[0].dtype == torch.float32 and outs[0].shape == (5, vocab)
    assert max_err(outs[0], dense) < LAYER_ATOL


# --- the whole model: tp 1 vs tp N from the same full weights --------------------------------

MODEL_CONFIGS: dict[str, ModelConfig] = {
    # tp 2: KV heads padded 3 -> 4 (rank 1: KV head 2 and a zero one); tp 3: split
    "llama-6q3kv-tied": config_of(6, 3, vocab=101, inter=98, hidden=64, head_dim=16,
                                  num_layers=2, tie_word_embeddings=True),
    # q/k/v biases; tp 2: split; tp 4: each KV head on two ranks, a zero query head each
    "qwen2-bias-6q2kv": config_of(6, 2, vocab=101, inter=98, hidden=64, head_dim=16,
                                  num_layers=2, architecture="Qwen2ForCausalLM",
                                  attention_bias=True),
    # q/k RMSNorm; tp 2: padded to 12 / 4 heads (the default model's layout); tp 3: split
    "qwen3-qknorm-9q3kv": config_of(9, 3, vocab=101, inter=98, hidden=64, head_dim=16,
                                    num_layers=2, architecture="Qwen3ForCausalLM", qk_norm=True),
    # one KV head replicated on every rank; tp 2: query heads [0, 1] / [2, zero]
    "llama-3q1kv-tied": config_of(3, 1, vocab=101, inter=98, hidden=64, head_dim=16,
                                  num_layers=2, tie_word_embeddings=True),
}
MODEL_CASES = [("llama-6q3kv-tied", 2), ("llama-6q3kv-tied", 3), ("qwen2-bias-6q2kv", 2),
               ("qwen2-bias-6q2kv", 4), ("qwen3-qknorm-9q3kv", 2), ("qwen3-qknorm-9q3kv", 3),
               ("llama-3q1kv-tied", 2), ("llama-3q1kv-tied", 3)]
NUM_SLOTS = 48
PROMPTS = [[5, 100, 0, 51, 17, 99, 33], [50, 1, 77, 26]]  # ids from every rank's vocab slice
DECODE = [[64, 8], [100, 34], [2, 67]]  # fixed next tokens (no argmax: tp 1 and N stay in step)


def perturbed(weights: Iterable[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
    """iter_dummy_weights' tensors, made harder to pass by accident (deterministically, so every
    tp size gets the same model): biases random instead of zero, norm weights random around 1
    instead of 1, q/k projections 8x larger so attention is far from uniform."""
    gen = torch.Generator().manual_seed(1234)
    for name, t in weights:
        if name.endswith(".bias"):
            t = randn(gen, *t.shape) * 0.1
        elif "norm" in name:
            t = 1 + randn(gen, *t.shape) * 0.2
        elif "q_proj" in name or "k_proj" in name:
            t = t * 8
        yield name, t


@functools.cache
def full_weights(name: str) -> list[tuple[str, Tensor]]:
    return list(perturbed(iter_dummy_weights(MODEL_CONFIGS[name], CPU)))


def prefill_and_decode(model: CausalLM, config: ModelConfig) -> Tensor:
    """Logits of a prefill of two prompts (every position) and three decode steps of both,
    [len(prompts) + 2 * 3, vocab], through a KV cache of this rank's shape."""
    kv = KVCache.from_config(model.shard.kv_shape(config), NUM_SLOTS, torch.float32, "cpu")
    assert kv.num_kv_heads == model.shard.num_kv_heads
    order = torch.randperm(NUM_SLOTS, generator=torch.Generator().manual_seed(3))
    tables = [order[:16], order[16:32]]
    batch = ForwardBatch.build(PROMPTS, [0, 0], tables)
    logits = [model.compute_logits(model.forward(batch, kv))]
    lens = [len(p) for p in PROMPTS]
    for tokens in DECODE:
        batch = ForwardBatch.build([[t] for t in tokens], lens, tables)
        logits.append(model.compute_logits(model.forward(batch, kv)))
        lens = [n + 1 for n in lens]
    return torch.cat(logits)


def build(name: str, tp: TPGroup) -> CausalLM:
    return _build(MODEL_CONFIGS[name], torch.float32, CPU, "torch", full_weights(name), tp)


@functools.cache
def single_device_logits(name: str) -> Tensor:
    model = build(name, TPGroup.single())
    assert model.shard == ShardPlan.single(MODEL_CONFIGS[name])
    return prefill_and_decode(model, MODEL_CONFIGS[name])


@pytest.mark.parametrize(("name", "tp"), MODEL_CASES)
def test_sharded_model_matches_single_device(name: str, tp: int) -> None:
    """A whole tiny model built at tp N from the same full weights as at tp 1, run through a
    prefill and three decode steps on each rank's own KV shard: every rank's logits (every
    prefill position and every decode step) are bitwise identical to every other rank's, and
    within MODEL_ATOL of the single-device model's."""
    config = MODEL_CONFIGS[name]
    reference = single_device_logits(name)
    assert reference.shape == (sum(map(len, PROMPTS)) + 2 * len(DECODE), config.vocab_size)

    def rank_fn(group: TPGroup) -> Tensor:
        model = build(name, group)
        assert model.shard == ShardPlan.for_rank(config, tp, group.rank)
        return prefill_and_decode(model, config)

    outs = run_ranks(tp, rank_fn)
    for rank, out in enumerate(outs):
        assert torch.equal(out, outs[0]), f"rank {rank}'s logits differ from rank 0's"
    err = max_err(outs[0], reference)
    assert err < MODEL_ATOL, err


def test_model_refuses_a_tp_size_without_a_plan() -> None:
    """Building a shard for a tp size no plan serves (6 query / 2 KV heads at tp 3: rank 2 would
    hold only a zero KV head) raises ValueError naming the sizes that work, before any weight is
    read."""
    name = "qwen2-bias-6q2kv"

    def no_weights() -> Iterator[tuple[str, Tensor]]:
        raise AssertionError("weights were read")
        yield  # pragma: no cover

    with pytest.raises(ValueError, match=r"tp_size=3 .*\[1\] .*\[2, 4, 6\]"):
        _build(MODEL_CONFIGS[name], torch.float32, CPU, "torch", no_weights(),
               TPGroup(rank=0, size=3))


# --- a rank reads only its shard: safetensors slices and GGUF rows ------------------------------


@pytest.mark.parametrize("tp", [2, 3])
def test_a_safetensors_checkpoint_loads_shards_by_range(tmp_path: Any, tp: int) -> None:
    """The same tiny model saved as safetensors and loaded lazily (each rank reads its ranges of
    each tensor): every rank's logits equal those of the shard built from in-memory tensors."""
    from safetensors.torch import save_file

    from radixrt.runtime.models.hf_loader import iter_safetensors_weights

    name = "qwen3-qknorm-9q3kv"
    save_file({n: t.contiguous() for n, t in full_weights(name)},
              str(tmp_path / "model.safetensors"))
    config = MODEL_CONFIGS[name]

    def rank_fn(group: TPGroup) -> tuple[Tensor, Tensor]:
        lazy = _build(config, torch.float32, CPU, "torch", iter_safetensors_weights(tmp_path),
                      group)
        return prefill_and_decode(lazy, config), prefill_and_decode(build(name, group), config)

    for lazy, eager in run_ranks(tp, rank_fn):
        assert torch.equal(lazy, eager)


def test_gguf_rows_are_read_alone_and_unpermuted_per_head() -> None:
    """The default model's GGUF: a shard's rows of Q (whole heads, rope rows un-permuted head by
    head), of the MLP and of the embedding, dequantized alone, equal the same rows of the whole
    tensor dequantized and un-permuted; a column range is the whole tensor's columns."""
    from radixrt.runtime.models.gguf_file import GGUFFile
    from radixrt.runtime.models.gguf_loader import gguf_config, iter_gguf_weights
    from radixrt.runtime.models.loader import default_model_path

    folder, fname = default_model_path()
    gf = GGUFFile(f"{folder}/{fname}")
    weights = dict(iter_gguf_weights(gf, gguf_config(gf)))
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    full_q = q.read(0, 0, q.shape[0])
    assert torch.equal(q.read(0, 128, 320), full_q[128:320])  # heads 2..4 of 64 rows
    for key in ("model.layers.0.mlp.gate_proj.weight", "model.embed_tokens.weight"):
        w = weights[key]
        whole = w.read(0, 0, w.shape[0])
        assert torch.equal(w.read(0, 256, 512), whole[256:512])
        assert torch.equal(w.read(1, 64, 128), whole[:, 64:128])
