"""Mixtral: Llama's attention (a sliding window where the config has one) with a sparse MoE
block: softmax over the experts, top_k, renormalised. The checkpoint names the block
`block_sparse_moe` and an expert's projections w1 (gate), w3 (up), w2 (down)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from radixrt.runtime.models.families.family import ModelFamily
from radixrt.runtime.models.hf_fields import common_fields
from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.tensor_source import Weight

_EXPERT_NAMES = {".w1.": ".gate_proj.", ".w3.": ".up_proj.", ".w2.": ".down_proj."}


def read_mixtral(cfg: Mapping[str, Any], architecture: str) -> ModelConfig:
    fields = common_fields(cfg, architecture)
    fields.update(num_experts=int(cfg["num_local_experts"]),
                  num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                  moe_intermediate_size=fields["intermediate_size"], norm_topk_prob=True,
                  attention_bias=False, o_proj_bias=False)  # Mistral's attention: no biases
    return ModelConfig(**fields)


def rename_mixtral(name: str, weight: Weight,
                   config: ModelConfig) -> Iterable[tuple[str, Weight]]:
    name = name.replace(".block_sparse_moe.", ".mlp.")
    if ".mlp.experts." in name:
        for old, new in _EXPERT_NAMES.items():
            name = name.replace(old, new)
    yield name, weight


MIXTRAL = ModelFamily(
    name="mixtral",
    architectures=("MixtralForCausalLM",),
    model_types=("mixtral",),
    gguf_architectures=("llama",),
    read_config=read_mixtral,
    rename=rename_mixtral,
    features={"window": "from sliding_window", "rope": "default", "moe": "softmax top-k"},
)
