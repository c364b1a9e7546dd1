"""OLMo-2: norms after attention and after the MLP (none before), q and k normed over all heads
at once (so a tensor-parallel rank would need every head's statistics: tp_size 1 only)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from radixrt.runtime.models.families.family import ModelFamily
from radixrt.runtime.models.hf_fields import common_fields
from radixrt.runtime.models.model_config import ModelConfig


def read_olmo2(cfg: Mapping[str, Any], architecture: str) -> ModelConfig:
    fields = common_fields(cfg, architecture)
    fields.update(norm_layout="post", qk_norm_all_heads=True, norm_weight_first=True)
    return ModelConfig(**fields)


OLMO2 = ModelFamily(
    name="olmo2",
    architectures=("Olmo2ForCausalLM",),
    model_types=("olmo2",),
    gguf_architectures=("olmo2",),
    read_config=read_olmo2,
    tensor_parallel=False,
    features={"window": "-", "rope": "default, linear, YaRN"},
)
