"""GLM-4.5 / GLM-4.6 (Glm4MoeForCausalLM): grouped-query attention with q/k/v biases (none on
o), a partial rotary embedding (rotate-half over the first partial_rotary_factor of each head),
q/k norms per head where use_qk_norm, and DeepSeek-V3's MoE (families/deepseek.py): dense
first layers, sigmoid routing with the correction bias, ungated shared experts. The
multi-token-prediction layer past num_hidden_layers is not loaded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from radixrt.runtime.models.families.deepseek import (
    deepseek_moe_fields,
    rename_deepseek_moe,
    with_defaults,
)
from radixrt.runtime.models.families.family import ModelFamily
from radixrt.runtime.models.hf_fields import common_fields
from radixrt.runtime.models.model_config import ModelConfig


def read_glm4_moe(cfg: Mapping[str, Any], architecture: str) -> ModelConfig:
    cfg = with_defaults(cfg, architecture)
    fields = common_fields(cfg, architecture)
    fields.update(deepseek_moe_fields(cfg, fields["num_layers"]))
    fields.update(o_proj_bias=False, qk_norm=bool(cfg.get("use_qk_norm", False)),
                  routing="sigmoid_topk", score_correction_bias=True)
    return ModelConfig(**fields)


GLM4_MOE = ModelFamily(
    name="glm4_moe",
    architectures=("Glm4MoeForCausalLM",),
    model_types=("glm4_moe",),
    gguf_architectures=("glm4moe",),
    read_config=read_glm4_moe,
    rename=rename_deepseek_moe,
    features={"window": "-", "rope": "default, partial",
              "moe": "DeepSeek-MoE: shared experts, dense first layers, grouped sigmoid top-k "
                     "with a correction bias"},
)
