"""Qwen2-MoE and Qwen3-MoE: softmax over the experts, top_k, renormalised when norm_topk_prob;
Qwen2-MoE adds a shared expert scaled by a sigmoid gate and keeps q/k/v biases; Qwen3-MoE has
q/k norms. Layers listed in mlp_only_layers, and those off the decoder_sparse_step, keep a dense
MLP of intermediate_size."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from radixrt.runtime.models.families.family import ModelFamily
from radixrt.runtime.models.hf_fields import common_fields
from radixrt.runtime.models.model_config import ModelConfig


def moe_layers(cfg: Mapping[str, Any], num_layers: int, num_experts: int) -> tuple[bool, ...]:
    dense = set(cfg.get("mlp_only_layers") or ())
    step = int(cfg.get("decoder_sparse_step") or 1)
    return tuple(i not in dense and num_experts > 0 and (i + 1) % step == 0
                 for i in range(num_layers))


def read_qwen_moe(cfg: Mapping[str, Any], architecture: str) -> ModelConfig:
    qwen2 = architecture == "Qwen2MoeForCausalLM"
    fields = common_fields(cfg, architecture)
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    fields.update(num_experts=experts, num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                  moe_intermediate_size=int(cfg["moe_intermediate_size"]),
                  moe_layers=moe_layers(cfg, fields["num_layers"], experts),
                  norm_topk_prob=bool(cfg.get("norm_topk_prob", False)), qk_norm=not qwen2)
    if qwen2:
        fields.update(attention_bias=bool(cfg.get("qkv_bias", True)), o_proj_bias=False,
                      shared_expert_intermediate_size=int(
                          cfg.get("shared_expert_intermediate_size") or 0))
    return ModelConfig(**fields)


QWEN_MOE = ModelFamily(
    name="qwen_moe",
    architectures=("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"),
    model_types=("qwen2_moe", "qwen3_moe"),
    gguf_architectures=("qwen2moe", "qwen3moe"),
    read_config=read_qwen_moe,
    features={"window": "-", "rope": "default, YaRN",
              "moe": "softmax top-k; shared expert (Qwen2-MoE)"},
)
