"""DeepSeek-V2 / V2-Lite / V3 (and Kimi K2, V3's architecture): multi-head latent attention
(models/mla.py) and DeepSeek-MoE: the first first_k_dense_replace layers dense (then every
moe_layer_freq-th layer MoE), routed experts plus ungated shared experts of
n_shared_experts x moe_intermediate_size, the weights times routed_scaling_factor.

Routing: V2 takes a softmax over the experts (topk_method "greedy", or "group_limited_greedy":
only the topk_group groups with the best expert compete); V3 sigmoid scores chosen with
e_score_correction_bias among the topk_group groups whose two best experts score highest,
renormalised when norm_topk_prob. (V2 renormalises when norm_topk_prob too, as DeepSeek's own
code does; transformers' V2 never does, and no released V2 sets it.)

RoPE: interleaved pairs (V2 always; V3 unless rope_interleave is false) over qk_rope_head_dim
dims, DeepSeek's YaRN: cos / sin times mscale / mscale_all_dim's correction, and the softmax
scale (qk_nope_head_dim + qk_rope_head_dim) ** -0.5 times mscale_all_dim's correction squared.
A checkpoint's multi-token-prediction layers (past num_hidden_layers) are not loaded."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from radixrt.runtime.models.families.family import ModelFamily
from radixrt.runtime.models.hf_fields import common_fields
from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.rope import rope_type_of, yarn_mscale
from radixrt.runtime.models.tensor_source import Weight

# DeepSeek's MoE names -> the decoder's
_MOE_NAMES = {".mlp.shared_experts.": ".mlp.shared_expert.",
              ".mlp.gate.e_score_correction_bias": ".mlp.score_correction_bias"}


# transformers' config classes' defaults, for the keys a config.json leaves out
_DEFAULTS: dict[str, dict[str, Any]] = {
    "DeepseekV2ForCausalLM": dict(
        q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
        v_head_dim=128, n_routed_experts=64, n_shared_experts=2, moe_intermediate_size=1407,
        first_k_dense_replace=0, routed_scaling_factor=1.0, norm_topk_prob=False,
        topk_method="greedy"),
    "DeepseekV3ForCausalLM": dict(
        q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
        v_head_dim=128, n_routed_experts=256, n_shared_experts=1, moe_intermediate_size=2048,
        first_k_dense_replace=3, routed_scaling_factor=2.5, norm_topk_prob=True, n_group=8,
        topk_group=4, num_experts_per_tok=8),
    "Glm4MoeForCausalLM": dict(
        n_routed_experts=128, n_shared_experts=1, moe_intermediate_size=1408,
        first_k_dense_replace=1, routed_scaling_factor=1.0, norm_topk_prob=True, n_group=1,
        topk_group=1, num_experts_per_tok=8, partial_rotary_factor=0.5),
}


def with_defaults(cfg: Mapping[str, Any], architecture: str) -> dict[str, Any]:
    """config.json over its architecture's defaults (a key present, even null, wins)."""
    return {**_DEFAULTS.get(architecture, {}), **cfg}


def latent_scale(head_dim: int, scaling: Mapping[str, Any] | None) -> float:
    """The softmax scale of a latent-attention head: head_dim ** -0.5, times YaRN's
    mscale_all_dim correction squared where the rope is YaRN-extended."""
    scale = head_dim**-0.5
    if rope_type_of(scaling) == "yarn" and scaling and scaling.get("mscale_all_dim"):
        factor = float(scaling.get("factor") or 1.0)
        scale *= yarn_mscale(factor, float(scaling["mscale_all_dim"])) ** 2
    return scale


def deepseek_moe_fields(cfg: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    """The DeepSeek-MoE traits (shared with GLM-4.5): experts, shared experts, dense layers,
    grouped routing."""
    experts = int(cfg.get("n_routed_experts") or 0)
    dense = int(cfg.get("first_k_dense_replace") or 0)
    freq = int(cfg.get("moe_layer_freq") or 1)
    inter = int(cfg.get("moe_intermediate_size") or 0)
    return dict(
        num_experts=experts,
        num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
        moe_intermediate_size=inter,
        moe_layers=tuple(experts > 0 and i >= dense and i % freq == 0
                         for i in range(num_layers)),
        shared_expert_intermediate_size=inter * int(cfg.get("n_shared_experts") or 0),
        shared_expert_gated=False,
        n_group=int(cfg.get("n_group") or 1),
        topk_group=int(cfg.get("topk_group") or 1),
        routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        router_float32=True,
    )


def read_deepseek(cfg: Mapping[str, Any], architecture: str) -> ModelConfig:
    v3 = architecture == "DeepseekV3ForCausalLM"
    cfg = with_defaults(cfg, architecture)
    fields = common_fields(cfg, architecture)
    nope, rope = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"])
    fields.update(deepseek_moe_fields(cfg, fields["num_layers"]))
    sigmoid = v3 or cfg.get("scoring_func") == "sigmoid"
    grouped = v3 or cfg.get("topk_method") in ("group_limited_greedy", "noaux_tc")
    fields.update(
        num_kv_heads=fields["num_heads"],
        head_dim=nope + rope,
        q_lora_rank=int(cfg.get("q_lora_rank") or 0),
        kv_lora_rank=int(cfg["kv_lora_rank"]),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        v_head_dim=int(cfg["v_head_dim"]),
        rope_interleave=bool(cfg.get("rope_interleave", True)) if v3 else True,
        attention_scale=latent_scale(nope + rope, fields["rope_scaling"]),
        partial_rotary_factor=1.0,
        routing="sigmoid_topk" if sigmoid else "softmax_topk",
        score_correction_bias=v3 or cfg.get("topk_method") == "noaux_tc",
    )
    if not grouped:
        fields.update(n_group=1, topk_group=1)
    return ModelConfig(**fields)


def rename_deepseek_moe(name: str, weight: Weight,
                        config: ModelConfig) -> Iterable[tuple[str, Weight]]:
    """DeepSeek-MoE's names; nothing of the multi-token-prediction layers past the last
    decoder layer."""
    parts = name.split(".")
    if len(parts) > 2 and parts[1] == "layers" and int(parts[2]) >= config.num_layers:
        return
    for old, new in _MOE_NAMES.items():
        name = name.replace(old, new)
    yield name, weight


def rename_deepseek(name: str, weight: Weight,
                    config: ModelConfig) -> Iterable[tuple[str, Weight]]:
    """rename_deepseek_moe, and V2-Lite's full query projection (q_b_proj here)."""
    for new, w in rename_deepseek_moe(name, weight, config):
        yield new.replace(".self_attn.q_proj.", ".self_attn.q_b_proj."), w


DEEPSEEK = ModelFamily(
    name="deepseek",
    architectures=("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"),
    model_types=("deepseek_v2", "deepseek_v3"),
    gguf_architectures=("deepseek2",),
    read_config=read_deepseek,
    rename=rename_deepseek,
    features={"window": "-", "rope": "default, YaRN (DeepSeek's mscale), interleaved",
              "moe": "DeepSeek-MoE: shared experts, dense first layers, grouped top-k, "
                     "softmax (V2) or sigmoid + correction bias (V3)",
              "attention": "multi-head latent attention (one latent row per token)"},
)
