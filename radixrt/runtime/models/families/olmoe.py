"""OLMoE: Llama's layout with q and k normed over all heads at once (as OLMo-2) and a sparse MoE
block (softmax, top_k, renormalised when norm_topk_prob). tp_size 1 (the all-heads norm)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from radixrt.runtime.models.families.family import ModelFamily
from radixrt.runtime.models.hf_fields import common_fields
from radixrt.runtime.models.model_config import ModelConfig


def read_olmoe(cfg: Mapping[str, Any], architecture: str) -> ModelConfig:
    if cfg.get("clip_qkv") is not None:
        raise ValueError("OLMoE with clip_qkv is not supported (the q/k/v clamp is not "
                         "implemented): this model would run wrongly")
    fields = common_fields(cfg, architecture)
    fields.update(num_experts=int(cfg["num_experts"]),
                  num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                  moe_intermediate_size=fields["intermediate_size"],
                  norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                  qk_norm_all_heads=True)
    return ModelConfig(**fields)


OLMOE = ModelFamily(
    name="olmoe",
    architectures=("OlmoeForCausalLM",),
    model_types=("olmoe",),
    gguf_architectures=("olmoe",),
    read_config=read_olmoe,
    tensor_parallel=False,
    features={"window": "-", "rope": "default", "moe": "softmax top-k"},
)
