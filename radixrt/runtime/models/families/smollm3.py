"""SmolLM3: Llama's layout, with no RoPE on every no_rope_layer_interval-th layer (NoPE):
`no_rope_layers[i]` is 1 where layer i rotates, 0 where it does not."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from radixrt.runtime.models.families.family import ModelFamily
from radixrt.runtime.models.hf_fields import common_fields
from radixrt.runtime.models.model_config import ModelConfig

NO_ROPE_LAYER_INTERVAL = 4  # SmolLM3Config's default


def read_smollm3(cfg: Mapping[str, Any], architecture: str) -> ModelConfig:
    fields = common_fields({"tie_word_embeddings": True, "use_sliding_window": False, **cfg},
                           architecture)
    num_layers = fields["num_layers"]
    uses_rope = cfg.get("no_rope_layers")
    if uses_rope is None:
        interval = int(cfg.get("no_rope_layer_interval") or NO_ROPE_LAYER_INTERVAL)
        uses_rope = [int((i + 1) % interval != 0) for i in range(num_layers)]
    if len(uses_rope) != num_layers:
        raise ValueError(f"no_rope_layers has {len(uses_rope)} entries for {num_layers} layers")
    fields["layer_rope"] = tuple("global" if used else "none" for used in uses_rope)
    return ModelConfig(**fields)


SMOLLM3 = ModelFamily(
    name="smollm3",
    architectures=("SmolLM3ForCausalLM",),
    model_types=("smollm3",),
    gguf_architectures=("smollm3",),
    read_config=read_smollm3,
    features={"window": "from layer_types (off by default)", "rope": "default, YaRN; NoPE layers"},
)
