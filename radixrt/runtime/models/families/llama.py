"""Llama 2/3 (SmolLM2), Mistral, Qwen2, Qwen3: the decoder's own layout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from radixrt.runtime.models.families.family import ModelFamily
from radixrt.runtime.models.hf_fields import common_fields
from radixrt.runtime.models.model_config import ModelConfig


def read_llama(cfg: Mapping[str, Any], architecture: str) -> ModelConfig:
    """Llama and Qwen3 put attention_bias on q, k, v and o; Qwen2 always has q/k/v biases and
    none on o; Mistral has none, whatever the config says (as transformers builds them)."""
    fields = common_fields(cfg, architecture)
    if architecture == "Qwen2ForCausalLM":
        fields.update(attention_bias=True, o_proj_bias=False)
    elif architecture == "MistralForCausalLM":
        fields.update(attention_bias=False, o_proj_bias=False)
    fields["qk_norm"] = architecture == "Qwen3ForCausalLM"
    return ModelConfig(**fields)


LLAMA = ModelFamily(
    name="llama",
    architectures=("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                   "Qwen3ForCausalLM"),
    model_types=("llama", "mistral", "qwen2", "qwen3"),
    gguf_architectures=("llama", "qwen2", "qwen3"),
    read_config=read_llama,
    features={"window": "Mistral: every layer; Qwen2: from layer_types",
              "rope": "default, linear, llama3, YaRN"},
)
