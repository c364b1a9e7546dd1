"""The decoder every family runs: attention over the paged KV cache, a gated MLP, RMSNorms,
rotary embeddings, whole or as one tensor-parallel rank's shard (models/shard_plan.py says which
heads and rows). What differs between families is read from ModelConfig's traits
(models/model_config.py lists them); the weight names are Hugging Face's, after the family's
renames (models/registry.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from radixrt.kernels.cpu_attention import rotate_qk_cpu
from radixrt.runtime.distributed.group import TPGroup
from radixrt.runtime.forward.attention.base import LayerAttention
from radixrt.runtime.models.fused_decode import FusedDecode
from radixrt.runtime.models.layers import GatedMLP, RMSNorm, soft_cap
from radixrt.runtime.models.linear import LinearWeight
from radixrt.runtime.models.mla import LatentAttention
from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.moe import MoEBlock, expert_target
from radixrt.runtime.models.parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    VocabRows,
    parallel_logits,
    take,
)
from radixrt.runtime.models.rope import RotaryEmbedding, apply_rotary
from radixrt.runtime.models.shard_plan import ShardPlan, head_rows
from radixrt.runtime.models.tensor_source import Weight, read_all, shape_of

if TYPE_CHECKING:
    from radixrt.runtime.forward.attention.base import AttentionBackend
    from radixrt.runtime.forward.forward_batch import ForwardBatch
    from radixrt.runtime.forward.kv_cache import KVCache

LM_HEAD_BLOCK_ROWS = 1024  # rows per block of the LM head on the CPU (linear.py)

# HF checkpoint projection name -> (our fused parameter prefix, shard index)
_FUSED_SHARDS = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
_FUSED_COUNTS = {"qkv_proj": 3, "gate_up_proj": 2}
# norms of each layout: (before attention, after attention, before MLP, after MLP); None = none
LAYER_NORMS = {
    "pre": ("input_layernorm", None, "post_attention_layernorm", None),
    "sandwich": ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"),
    "post": (None, "post_attention_layernorm", None, "post_feedforward_layernorm"),
}


def norm_of(config: ModelConfig, dim: int) -> RMSNorm:
    """An RMSNorm of the config's kind (eps, Gemma's 1 + w, weight-first) over dim."""
    return RMSNorm(dim, config.rms_norm_eps, config.norm_offset, config.norm_weight_first)


class Attention(nn.Module):
    """Attention over this rank's query and KV heads (all of them at tp_size 1)."""

    def __init__(self, config: ModelConfig, layer_id: int, backend: AttentionBackend,
                 shard: ShardPlan, tp: TPGroup, packed: bool = False) -> None:
        super().__init__()
        self.backend = backend
        self.spec = LayerAttention(layer_id, config.attention_scale, config.windows[layer_id],
                                   config.attn_logit_softcap)
        self.num_heads = shard.num_heads
        self.num_kv_heads = shard.num_kv_heads
        self.head_dim = config.head_dim
        q_rows = head_rows(shard.q_heads, self.head_dim)
        kv_rows = head_rows(shard.kv_heads, self.head_dim)
        self.shard_sizes = (len(q_rows), len(kv_rows), len(kv_rows))
        self.qkv_proj = ColumnParallelLinear(config.hidden_size, [q_rows, kv_rows, kv_rows],
                                             config.attention_bias, packed=packed)
        self.o_proj = RowParallelLinear(q_rows, config.hidden_size, tp,
                                        bias=config.o_proj_bias, packed=packed)
        self.q_heads = list(shard.q_heads)
        self.sinks: nn.Parameter | None = None
        if config.attention_sinks:  # [num_heads] of this rank, a logit per head (gpt-oss)
            self.sinks = nn.Parameter(torch.empty(self.num_heads))
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm_all_heads:  # over the concatenated heads (OLMo-2; tp_size 1 only)
            self.q_norm = norm_of(config, len(q_rows))
            self.k_norm = norm_of(config, len(kv_rows))
        elif config.qk_norm:  # per head (Qwen3, Gemma 3)
            self.q_norm = norm_of(config, self.head_dim)
            self.k_norm = norm_of(config, self.head_dim)
        self.all_heads_norm = config.qk_norm_all_heads
        self.native = False  # rotary in place through kernels/cpu/attention.cpp

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None, kv_cache: KVCache,
                batch: ForwardBatch) -> Tensor:
        # x: [num_tokens, hidden]; rope: cos, sin [num_tokens, 1, rotary_dim // 2] or None
        n = x.shape[0]
        q, k, v = self.qkv_proj(x, batch.lora).split(self.shard_sizes, dim=-1)
        if self.all_heads_norm and self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(n, self.num_heads, self.head_dim)  # [num_tokens, num_heads, head_dim]
        k = k.view(n, self.num_kv_heads, self.head_dim)  # [num_tokens, num_kv_heads, head_dim]
        v = v.view(n, self.num_kv_heads, self.head_dim)  # [num_tokens, num_kv_heads, head_dim]
        if not self.all_heads_norm and self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None and not (self.native and rotate_qk_cpu(q, k, *rope)):
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        spec = self.spec if self.sinks is None else replace(self.spec, sinks=self.sinks)
        o = self.backend.forward(q, k, v, spec, kv_cache, batch)
        return self.o_proj(o.reshape(n, self.num_heads * self.head_dim), batch.lora)

    @torch.no_grad()
    def load(self, shard: object, full: Weight, name: str) -> None:
        """The attention sinks: this rank's heads' entries (0 for a padding head)."""
        if name != "sinks" or self.sinks is None:
            raise KeyError(f"attention has no parameter {name!r} of its own")
        piece = take(full, self.q_heads, 0)
        if tuple(piece.shape) != tuple(self.sinks.shape):
            raise ValueError(f"sinks of shape {tuple(piece.shape)}; expected "
                             f"{tuple(self.sinks.shape)}")
        self.sinks.data.copy_(piece)


class DecoderLayer(nn.Module):
    """Attention then MLP, each a residual branch; its norms as the config's layout places
    them, each branch scaled by residual_scale (Granite) before it is added."""

    def __init__(self, config: ModelConfig, layer_id: int, backend: AttentionBackend,
                 shard: ShardPlan, tp: TPGroup, packed: bool = False) -> None:
        super().__init__()
        self.self_attn: Attention | LatentAttention
        if config.kv_lora_rank:
            self.self_attn = LatentAttention(config, layer_id, backend, shard, tp, packed)
        else:
            self.self_attn = Attention(config, layer_id, backend, shard, tp, packed)
        self.mlp: GatedMLP | MoEBlock
        if config.moe_kinds[layer_id]:
            self.mlp = MoEBlock(config, shard.rows_of(config.moe_intermediate_size).indices(),
                                shard.rows_of(config.shared_expert_intermediate_size).indices(),
                                tp)
        else:
            self.mlp = GatedMLP(config.hidden_size, shard.intermediate.indices(), tp,
                                config.hidden_act, config.mlp_bias, packed)
        self.norm_names = LAYER_NORMS[config.norm_layout]
        for name in self.norm_names:
            if name is not None:
                self.add_module(name, norm_of(config, config.hidden_size))
        self.residual_scale = config.residual_scale

    def _norm(self, index: int, x: Tensor) -> Tensor:
        name = self.norm_names[index]
        return x if name is None else getattr(self, name)(x)

    def forward(self, h: Tensor, rope: tuple[Tensor, Tensor] | None, kv_cache: KVCache,
                batch: ForwardBatch) -> Tensor:
        # h: [num_tokens, hidden] residual stream
        attn = self._norm(1, self.self_attn(self._norm(0, h), rope, kv_cache, batch))
        h = h + attn * self.residual_scale if self.residual_scale != 1.0 else h + attn
        x = self._norm(2, h)
        mlp = self._norm(3, self.mlp(x, batch.lora) if isinstance(self.mlp, GatedMLP)
                         else self.mlp(x))
        return h + mlp * self.residual_scale if self.residual_scale != 1.0 else h + mlp


class CausalLM(nn.Module):
    """forward() returns final hidden states of all new tokens; compute_logits() projects the rows
    the caller picks (usually each request's last token). Under tensor parallelism (shard, tp)
    it is one rank's shard, and both return the same full tensors on every rank.

    packed: the projections, the embedding and the LM head keep the checkpoint's packed weights
    where it has them (models/linear.py, LinearWeight); the rest (norms, routers, experts)
    load as floats either way."""

    def __init__(self, config: ModelConfig, attn_backend: AttentionBackend,
                 shard: ShardPlan | None = None, tp: TPGroup | None = None,
                 packed: bool = False) -> None:
        super().__init__()
        self.config = config
        self.attn_backend = attn_backend
        self.shard = shard or ShardPlan.single(config)
        self.tp = tp or TPGroup.single()
        self.embed_tokens = VocabParallelEmbedding(self.shard.vocab, config.hidden_size, self.tp,
                                                   packed)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, attn_backend, self.shard, self.tp, packed)
            for i in range(config.num_layers)
        )
        self.norm = norm_of(config, config.hidden_size)
        self.rotary = RotaryEmbedding(config.rotary_dim, config.rope_theta, config.rope_scaling,
                                      config.max_position_embeddings, config.served_context)
        self.local_rotary: RotaryEmbedding | None = None
        if "local" in config.rope_kinds:
            self.local_rotary = RotaryEmbedding(
                config.rotary_dim, config.local_rope_theta or config.rope_theta,
                config.local_rope_scaling, config.max_position_embeddings, config.served_context)
        self.fused: FusedDecode | None = None  # use_cpu_kernels builds it
        self.cpu_kernels = False  # use_cpu_kernels: the CPU kernels run its norms, attention...
        self.lm_head: VocabRows | None = None
        self.score: nn.Parameter | None = None  # a classifier's head [num_labels, hidden]
        if config.num_labels:
            self.score = nn.Parameter(torch.empty(config.num_labels, config.hidden_size))
        elif not config.tie_word_embeddings:
            self.lm_head = VocabRows(self.shard.vocab, config.hidden_size, packed)

    @property
    def generates(self) -> bool:
        """False for a classifier: it has a classification head and no LM head."""
        return self.score is None

    def rotaries(self) -> list[RotaryEmbedding]:
        return [r for r in (self.rotary, self.local_rotary) if r is not None]

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, kv_cache: KVCache) -> Tensor:
        """Runs attn_backend.init_forward(batch) itself (the fused decode step needs none).
        Returns [num_tokens, hidden]."""
        h = self.embed_tokens(batch.input_ids)  # [num_tokens, hidden]
        scale = self.config.embedding_scale
        if scale != 1.0:  # Gemma's rounded to the model's dtype first, as transformers does
            h = h * (torch.tensor(scale, dtype=h.dtype)
                     if self.config.embedding_scale_in_dtype else scale)
        if batch.image_rows is not None:  # an image's features stand in for its placeholders
            h[batch.image_rows] = batch.image_embeds.to(h.dtype)  # type: ignore[union-attr]
        ropes: dict[str, tuple[Tensor, Tensor] | None] = {"none": None}
        ropes["global"] = (self.rotary.cos_sin(batch.positions, h.dtype)
                           if batch.mrope_positions is None else self.rotary.cos_sin_sections(
                               batch.mrope_positions, self.config.mrope_section, h.dtype))
        if self.local_rotary is not None:
            ropes["local"] = self.local_rotary.cos_sin(batch.positions, h.dtype)
        fused = self.fused is not None and self.fused.applies(batch)
        if not fused or self.fused.run(h, ropes, kv_cache, batch) is None:  # type: ignore[union-attr]
            self.attn_backend.init_forward(batch)
            for layer, kind in zip(self.layers, self.config.rope_kinds):
                h = layer(h, ropes[kind], kv_cache, batch)
        return self.norm(h)

    @torch.no_grad()
    def compute_logits(self, hidden: Tensor) -> Tensor:
        """hidden [n, hidden] -> logits [n, vocab] float32 (divided by logits_divisor, then
        soft-capped, where the config says so)."""
        if not self.generates:
            raise RuntimeError(f"{self.config.architecture} with a classification head has no "
                               "LM head: it classifies, it does not generate")
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        logits = parallel_logits(hidden, head.matrix, self.shard.vocab, self.tp,
                                 LM_HEAD_BLOCK_ROWS)
        if self.config.logits_divisor != 1.0:
            logits = logits / self.config.logits_divisor
        return soft_cap(logits, self.config.final_logit_softcap)

    @torch.no_grad()
    def classify(self, hidden: Tensor) -> Tensor:
        """hidden [n, hidden] -> the classification head's logits [n, num_labels] float32."""
        assert self.score is not None, "a model without a classification head"
        return (hidden @ self.score.t()).float()

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, Weight]]) -> None:
        """Load full HF-named tensors (model.layers.N.self_attn.q_proj.weight, ...; or
        TensorSources, read in part), each into this rank's piece of its parameter; every
        parameter must be covered exactly once.
        Unknown names raise, except rotary buffers and a tied head."""
        params = dict(self.named_parameters())
        modules = dict(self.named_modules())
        packed = self.packed_weights()  # packed layers' weights: loaded like parameters
        loaded: dict[str, set[object]] = {}
        for hf_name, tensor in weights:
            target = self._target(hf_name)
            if target is None:
                continue
            name, shard = target
            if name not in params and name not in packed:
                raise KeyError(f"checkpoint tensor {hf_name!r} has no parameter {name!r}")
            owner, _, attr = name.rpartition(".")
            module = modules[owner]
            try:
                if hasattr(module, "load"):  # a parallel layer: it takes its rows / columns
                    module.load(0 if shard is None else shard, tensor, attr)
                else:  # replicated (norms, routers)
                    if tuple(params[name].shape) != shape_of(tensor):
                        raise ValueError(f"shape {shape_of(tensor)} != "
                                         f"{tuple(params[name].shape)}")
                    params[name].data.copy_(read_all(tensor))
            except ValueError as exc:
                raise ValueError(f"{hf_name}: {exc}") from None
            loaded.setdefault(name, set()).add(0 if shard is None else shard)
        missing = sorted(name for name in [*params, *packed]
                         if not self._covered(name, modules, loaded.get(name, set())))
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:4]}")
        for weight in packed.values():
            weight.finish()

    def use_cpu_kernels(self, on: bool) -> None:
        """Run the norms, the rotary embedding, the KV stores and decode attention on the CPU
        kernels (kernels/cpu/: float32 on the CPU, each beside its PyTorch reference), or on
        the PyTorch ops."""
        self.cpu_kernels = on
        for module in self.modules():
            if isinstance(module, (RMSNorm, Attention, GatedMLP)):
                module.native = on
        if hasattr(self.attn_backend, "native"):
            self.attn_backend.native = on
        self.fused = FusedDecode.build(self) if on else None

    def packed_weights(self) -> dict[str, LinearWeight]:
        """The weights packed layers hold, by parameter name (`...qkv_proj.weight`)."""
        return {f"{name}.weight": module.packed for name, module in self.named_modules()
                if isinstance(getattr(module, "packed", None), LinearWeight)}

    def weight_count(self) -> int:
        """Every weight the model holds: its float parameters and its packed weights'
        elements."""
        packed = sum(w.rows * w.cols for w in self.packed_weights().values())
        return packed + sum(p.numel() for p in self.parameters())

    def weight_formats(self) -> dict[str, int]:
        """Bytes of weights per format ("float32", "u4/g32/f16", ...), over every tensor."""
        out: dict[str, int] = {}
        for weight in self.packed_weights().values():
            for (_, data), fmt in zip(weight.parts, weight.formats):
                out[fmt] = out.get(fmt, 0) + data.nbytes
        for p in self.parameters():
            fmt = str(p.dtype).split(".")[-1]
            out[fmt] = out.get(fmt, 0) + p.numel() * p.element_size()
        return out

    @staticmethod
    def _covered(name: str, modules: dict[str, nn.Module], shards: set[object]) -> bool:
        owner, _, attr = name.rpartition(".")
        covered = getattr(modules[owner], "covered", None)
        if covered is not None:  # the experts: stacked, or every expert's parts
            return bool(covered(attr, shards))
        fused = next((f for f in _FUSED_COUNTS if f".{f}." in name), None)
        return shards >= set(range(_FUSED_COUNTS[fused] if fused else 1))

    def _target(self, hf_name: str) -> tuple[str, object] | None:
        """Our parameter name (and fused shard, or expert part) for an HF tensor name; None =
        skip it."""
        if "rotary_emb" in hf_name:
            return None
        if hf_name == "lm_head.weight":
            return None if self.lm_head is None else ("lm_head.weight", None)
        if hf_name == "score.weight":
            return "score", None
        name = hf_name.removeprefix("model.")
        expert = expert_target(name)
        if expert is not None:
            return expert
        for hf_proj, (fused, shard) in _FUSED_SHARDS.items():
            if f".{hf_proj}." in name:
                return name.replace(hf_proj, fused), shard
        return name, None
