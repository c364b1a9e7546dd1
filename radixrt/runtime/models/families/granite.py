"""Granite (3.x dense): Llama's layout with four multipliers: embeddings times
embedding_multiplier, each residual branch times residual_multiplier, attention_multiplier as the
softmax scale, logits divided by logits_scaling."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from radixrt.runtime.models.families.family import ModelFamily
from radixrt.runtime.models.hf_fields import common_fields
from radixrt.runtime.models.model_config import ModelConfig


def read_granite(cfg: Mapping[str, Any], architecture: str) -> ModelConfig:
    fields = common_fields(cfg, architecture)
    fields.update(embedding_scale=float(cfg.get("embedding_multiplier", 1.0)),
                  residual_scale=float(cfg.get("residual_multiplier", 1.0)),
                  attention_scale=float(cfg.get("attention_multiplier", 1.0)),
                  logits_divisor=float(cfg.get("logits_scaling", 1.0)))
    return ModelConfig(**fields)


GRANITE = ModelFamily(
    name="granite",
    architectures=("GraniteForCausalLM",),
    model_types=("granite",),
    gguf_architectures=("granite",),
    read_config=read_granite,
    features={"window": "-", "rope": "default, linear, llama3, YaRN"},
)
