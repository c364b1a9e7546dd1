"""gpt-oss: sliding-window layers alternating with global ones (layer_types), attention sinks (a
learned logit per head in every softmax's denominator), biases on q/k/v/o, YaRN RoPE, and a MoE
block routed top_k-then-softmax over biased router logits, whose experts (with biases) use a
clamped SwiGLU: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit).
The checkpoint stacks the experts (`experts.gate_up_proj` [E, hidden, 2 * inter], gate and up
interleaved by column; `experts.down_proj` [E, inter, hidden]) and names the router `router`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from radixrt.runtime.models.families.family import ModelFamily
from radixrt.runtime.models.hf_fields import common_fields
from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.tensor_source import Weight


def read_gpt_oss(cfg: Mapping[str, Any], architecture: str) -> ModelConfig:
    fields = common_fields({"attention_bias": True, **cfg}, architecture)
    fields.update(attention_sinks=True, norm_weight_first=True,
                  num_experts=int(cfg["num_local_experts"]),
                  num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                  moe_intermediate_size=fields["intermediate_size"], routing="topk_softmax",
                  router_bias=True, expert_bias=True, expert_activation="swiglu_oai",
                  swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)),
                  swiglu_limit=float(cfg.get("swiglu_limit", 7.0)))
    return ModelConfig(**fields)


def rename_gpt_oss(name: str, weight: Weight,
                   config: ModelConfig) -> Iterable[tuple[str, Weight]]:
    yield name.replace(".mlp.router.", ".mlp.gate."), weight


GPT_OSS = ModelFamily(
    name="gpt_oss",
    architectures=("GptOssForCausalLM",),
    model_types=("gpt_oss",),
    gguf_architectures=("gpt-oss",),
    read_config=read_gpt_oss,
    rename=rename_gpt_oss,
    features={"window": "alternating sliding / global", "rope": "YaRN",
              "moe": "top-k softmax, biased router and experts, clamped SwiGLU; sinks"},
)
