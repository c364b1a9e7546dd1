"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3) over a paged KV cache."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from radixrt.runtime.config import LM_HEAD_BLOCK_ROWS
from radixrt.runtime.models.layers import GatedMLP, RMSNorm, RotaryEmbedding, apply_rotary
from radixrt.runtime.models.linear import BlockedLinear, small_batch_linear
from radixrt.runtime.models.model_config import ModelConfig

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
    def __init__(self, config: ModelConfig, layer_id: int, backend: AttentionBackend) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.shard_sizes = (q_size, kv_size, kv_size)
        self.qkv_proj = BlockedLinear(config.hidden_size, sum(self.shard_sizes),
                                      config.attention_bias)
        self.o_proj = BlockedLinear(q_size, config.hidden_size, bias=False)
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
    def __init__(self, config: ModelConfig, layer_id: int, backend: AttentionBackend) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_id, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)

    def forward(
        self, h: Tensor, cos: Tensor, sin: Tensor, kv_cache: KVCache, batch: ForwardBatch
    ) -> Tensor:
        # h: [num_tokens, hidden] residual stream
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, kv_cache, batch)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaForCausalLM(nn.Module):
    """forward() returns final hidden states of all new tokens; compute_logits() projects the rows
    the caller picks (usually each request's last token)."""

    def __init__(self, config: ModelConfig, attn_backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.attn_backend = attn_backend
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, attn_backend) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        self.lm_head: nn.Linear | None = None
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

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
        return small_batch_linear(hidden, weight, None, LM_HEAD_BLOCK_ROWS).float()

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        """Load HF-named tensors (model.layers.N.self_attn.q_proj.weight, ...); every parameter
        must be covered exactly once. Unknown names raise, except rotary buffers and a tied head."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            target = self._target(hf_name)
            if target is None:
                continue
            name, shard = target
            if name not in params:
                raise KeyError(f"checkpoint tensor {hf_name!r} has no parameter {name!r}")
            param = params[name]
            if shard is None:
                dest = param.data
                key = name
            else:
                dest = self._shard_view(name, param.data, shard)
                key = f"{name}#{shard}"
            if tuple(dest.shape) != tuple(tensor.shape):
                raise ValueError(f"{hf_name}: shape {tuple(tensor.shape)} != {tuple(dest.shape)}")
            dest.copy_(tensor)
            loaded.add(key)
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

    def _shard_view(self, name: str, data: Tensor, shard: int) -> Tensor:
        if ".qkv_proj." in name:
            layer = self.layers[0].self_attn
            sizes = list(layer.shard_sizes)  # type: ignore[union-attr]
        else:
            sizes = [self.config.intermediate_size] * 2
        start = sum(sizes[:shard])
        return data[start : start + sizes[shard]]
