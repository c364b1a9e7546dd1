"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3) over a paged KV cache, whole
or as one tensor-parallel rank's shard (models/shard_plan.py says which heads and rows)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from radixrt.runtime.config import LM_HEAD_BLOCK_ROWS
from radixrt.runtime.distributed.group import TPGroup
from radixrt.runtime.models.layers import GatedMLP, RMSNorm, RotaryEmbedding, apply_rotary
from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    VocabRows,
    parallel_logits,
)
from radixrt.runtime.models.shard_plan import ShardPlan, head_rows
from radixrt.runtime.models.tensor_source import Weight, read_all, shape_of

if TYPE_CHECKING:
    from radixrt.runtime.forward.attention.base import AttentionBackend
    from radixrt.runtime.forward.forward_batch import ForwardBatch
    from radixrt.runtime.forward.kv_cache import KVCache

# HF checkpoint projection name -> (our fused parameter prefix, shard index)
_FUSED_SHARDS = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaAttention(nn.Module):
    """Attention over this rank's query and KV heads (all of them at tp_size 1)."""

    def __init__(self, config: ModelConfig, layer_id: int, backend: AttentionBackend,
                 shard: ShardPlan, tp: TPGroup) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.num_heads = shard.num_heads
        self.num_kv_heads = shard.num_kv_heads
        self.head_dim = config.head_dim
        q_rows = head_rows(shard.q_heads, self.head_dim)
        kv_rows = head_rows(shard.kv_heads, self.head_dim)
        self.shard_sizes = (len(q_rows), len(kv_rows), len(kv_rows))
        self.qkv_proj = ColumnParallelLinear(config.hidden_size, [q_rows, kv_rows, kv_rows],
                                             config.attention_bias)
        self.o_proj = RowParallelLinear(q_rows, config.hidden_size, tp)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, kv_cache: KVCache, batch: ForwardBatch
    ) -> Tensor:
        # x: [num_tokens, hidden]
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.shard_sizes, dim=-1)
        q = q.view(n, self.num_heads, self.head_dim)  # [num_tokens, num_heads, head_dim]
        k = k.view(n, self.num_kv_heads, self.head_dim)  # [num_tokens, num_kv_heads, head_dim]
        v = v.view(n, self.num_kv_heads, self.head_dim)  # [num_tokens, num_kv_heads, head_dim]
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        o = self.backend.forward(q, k, v, self.layer_id, kv_cache, batch)
        return self.o_proj(o.reshape(n, self.num_heads * self.head_dim))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, backend: AttentionBackend,
                 shard: ShardPlan, tp: TPGroup) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_id, backend, shard, tp)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config.hidden_size, shard.intermediate.indices(), tp)

    def forward(
        self, h: Tensor, cos: Tensor, sin: Tensor, kv_cache: KVCache, batch: ForwardBatch
    ) -> Tensor:
        # h: [num_tokens, hidden] residual stream
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, kv_cache, batch)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaForCausalLM(nn.Module):
    """forward() returns final hidden states of all new tokens; compute_logits() projects the rows
    the caller picks (usually each request's last token). Under tensor parallelism (shard, tp)
    it is one rank's shard, and both return the same full tensors on every rank."""

    def __init__(self, config: ModelConfig, attn_backend: AttentionBackend,
                 shard: ShardPlan | None = None, tp: TPGroup | None = None) -> None:
        super().__init__()
        self.config = config
        self.attn_backend = attn_backend
        self.shard = shard or ShardPlan.single(config)
        self.tp = tp or TPGroup.single()
        self.embed_tokens = VocabParallelEmbedding(self.shard.vocab, config.hidden_size, self.tp)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, attn_backend, self.shard, self.tp)
            for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        self.lm_head: VocabRows | None = None
        if not config.tie_word_embeddings:
            self.lm_head = VocabRows(self.shard.vocab, config.hidden_size)

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, kv_cache: KVCache) -> Tensor:
        """Runs attn_backend.init_forward(batch) itself. Returns [num_tokens, hidden]."""
        self.attn_backend.init_forward(batch)
        h = self.embed_tokens(batch.input_ids)  # [num_tokens, hidden]
        cos, sin = self.rotary.cos_sin(batch.positions, h.dtype)  # [num_tokens, 1, head_dim // 2]
        for layer in self.layers:
            h = layer(h, cos, sin, kv_cache, batch)
        return self.norm(h)

    @torch.no_grad()
    def compute_logits(self, hidden: Tensor) -> Tensor:
        """hidden [n, hidden] -> logits [n, vocab] float32."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return parallel_logits(hidden, weight, self.shard.vocab, self.tp, LM_HEAD_BLOCK_ROWS)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, Weight]]) -> None:
        """Load full HF-named tensors (model.layers.N.self_attn.q_proj.weight, ...; or
        TensorSources, read in part), each into this rank's piece of its parameter; every
        parameter must be covered exactly once.
        Unknown names raise, except rotary buffers and a tied head."""
        params = dict(self.named_parameters())
        modules = dict(self.named_modules())
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            target = self._target(hf_name)
            if target is None:
                continue
            name, shard = target
            if name not in params:
                raise KeyError(f"checkpoint tensor {hf_name!r} has no parameter {name!r}")
            owner, _, attr = name.rpartition(".")
            module = modules[owner]
            try:
                if hasattr(module, "load"):  # a parallel layer: it takes its rows / columns
                    module.load(shard or 0, tensor, attr)
                else:  # replicated (norms)
                    if tuple(params[name].shape) != shape_of(tensor):
                        raise ValueError(f"shape {shape_of(tensor)} != "
                                         f"{tuple(params[name].shape)}")
                    params[name].data.copy_(read_all(tensor))
            except ValueError as exc:
                raise ValueError(f"{hf_name}: {exc}") from None
            loaded.add(name if shard is None else f"{name}#{shard}")
        expected = set()
        for name in params:
            if ".qkv_proj." in name:
                expected.update(f"{name}#{i}" for i in range(3))
            elif ".gate_up_proj." in name:
                expected.update(f"{name}#{i}" for i in range(2))
            else:
                expected.add(name)
        missing = sorted(expected - loaded)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:4]}")

    def _target(self, hf_name: str) -> tuple[str, int | None] | None:
        """Our parameter name (and fused shard index) for an HF tensor name; None = skip it."""
        if "rotary_emb" in hf_name:
            return None
        if hf_name == "lm_head.weight":
            return None if self.lm_head is None else ("lm_head.weight", None)
        name = hf_name.removeprefix("model.")
        for hf_proj, (fused, shard) in _FUSED_SHARDS.items():
            if f".{hf_proj}." in name:
                return name.replace(hf_proj, fused), shard
        return name, None
