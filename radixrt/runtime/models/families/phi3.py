"""Phi-3 and Phi-4 (Phi3ForCausalLM): q, k, v fused in one `qkv_proj` tensor and gate, up in one
`gate_up_proj` in the checkpoint (split here into the decoder's parts, each readable by rows
under tensor parallelism); `longrope` (alias `su`) RoPE scaling; partial rotary (Phi-4-mini)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from radixrt.runtime.models.families.family import ModelFamily
from radixrt.runtime.models.hf_fields import common_fields
from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.tensor_source import RowRange, Weight, shape_of


def read_phi3(cfg: Mapping[str, Any], architecture: str) -> ModelConfig:
    fields = common_fields(cfg, architecture)
    fields.update(attention_bias=False, o_proj_bias=False)  # no biases in Phi-3's attention
    return ModelConfig(**fields)


def rename_phi3(name: str, weight: Weight, config: ModelConfig) -> Iterable[tuple[str, Weight]]:
    if ".qkv_proj." in name:
        q = config.num_heads * config.head_dim
        kv = config.num_kv_heads * config.head_dim
        bounds = {"q_proj": (0, q), "k_proj": (q, q + kv), "v_proj": (q + kv, q + 2 * kv)}
        for part, (start, stop) in bounds.items():
            yield name.replace("qkv_proj", part), RowRange(weight, start, stop)
    elif ".gate_up_proj." in name:
        half = shape_of(weight)[0] // 2
        yield name.replace("gate_up_proj", "gate_proj"), RowRange(weight, 0, half)
        yield name.replace("gate_up_proj", "up_proj"), RowRange(weight, half, 2 * half)
    else:
        yield name, weight


PHI3 = ModelFamily(
    name="phi3",
    architectures=("Phi3ForCausalLM",),
    model_types=("phi3",),
    gguf_architectures=("phi3",),
    read_config=read_phi3,
    rename=rename_phi3,
    features={"window": "from sliding_window (Phi-3-mini-4k: 2047)",
              "rope": "default, longrope / su, partial rotary"},
)
