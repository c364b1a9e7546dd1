"""What llama.cpp's converter (convert_hf_to_gguf.py) writes for each architecture we load, and
how to read it back into a config.json dict and Hugging Face tensor names.

Per architecture (GGUF `general.architecture`):

- the HF architecture (the family that runs it, models/registry.py);
- the tensor names: llama.cpp's per-layer names (gguf-py's tensor_mapping.py) -> the HF module
  inside model.layers.N. Gemma 2/3 and OLMo-2 carry extra norms; Phi-3 keeps its fused
  `attn_qkv` and an `ffn_up` holding gate then up (the phi3 family splits both);
- whether the converter permuted Q/K rows (LlamaModel.permute: only the architectures llama.cpp
  runs with non-NeoX, interleaved RoPE: llama, granite, smollm3, all LlamaModel subclasses);
- the norm offset the converter added (Gemma 1/2/3 store w + 1, llama.cpp multiplying by the
  stored value; our RMSNorm takes Gemma's own w and computes (1 + w), so 1 is subtracted back);
- the metadata keys that carry the family's traits (`feature_keys`; any other such key set in a
  file is refused: see gguf_config.FEATURE_KEYS) and the traits llama.cpp hard-codes instead of
  writing them (Gemma 2/3's sliding pattern, local RoPE base and 27B attention scale; SmolLM3's
  NoPE interval), reproduced here;
- whether it holds stacked experts (`experts`: Mixtral, written as llama with expert_count and
  so read by the MOE_VARIANTS entry; qwen2moe, qwen3moe, olmoe, gpt-oss). Their routers,
  shared expert, sinks and hard-coded routing are in models/gguf_moe.py, the stacked expert
  tensors are read per expert by models/gguf_experts.py;
- DeepSeek-MoE's (`latent_attention`: deepseek2, DeepSeek's multi-head latent attention; and
  glm4moe): their tensors, split kv_b_proj, routing keys and multi-token-prediction layers are
  in models/gguf_deepseek.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from radixrt.runtime.models.gguf_deepseek import (
    DEEPSEEK2_LAYERS,
    DEEPSEEK_FEATURE_KEYS,
    EXPERT_BIAS,
    GLM4MOE_LAYERS,
    read_deepseek2,
    read_glm4moe,
)
from radixrt.runtime.models.gguf_meta import FULL, ArchMeta, sliding_layers
from radixrt.runtime.models.gguf_moe import (
    GPT_OSS_NORMS,
    GPT_OSS_TENSORS,
    MOE_FEATURE_KEYS,
    MOE_ROUTER,
    SHARED_EXPERT,
    read_gpt_oss,
    read_mixtral,
    read_olmoe,
    read_qwen2moe,
    read_qwen3moe,
)

GEMMA_ACTIVATION = "gelu_pytorch_tanh"  # llama.cpp's LLM_FFN_GELU: ggml_gelu, the tanh form
# Gemma 2: llama.cpp's defaults when a key is missing (llama-hparams.h), as Gemma2Config's
GEMMA2_ATTN_SOFTCAP = 50.0
GEMMA2_FINAL_SOFTCAP = 30.0
GEMMA2_WINDOW = 4096
GEMMA2_SLIDING_PATTERN = 2  # llama.cpp set_swa_pattern(2): even layers slide
GEMMA3_SLIDING_PATTERN = 6  # set_swa_pattern(6): every 6th layer is global
GEMMA3_LOCAL_THETA = 10000.0  # rope_freq_base_train_swa, hard-coded by llama.cpp
# llama.cpp recognises Gemma 2 27B / Gemma 3 27B by their layer count and scales queries by
# (hidden / heads) ** -0.5 there (query_pre_attn_scalar 144 / 168), by head_dim ** -0.5 otherwise
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
SMOLLM3_NO_ROPE_INTERVAL = 4  # llama.cpp's n_no_rope_layer_step: no GGUF key carries it

_ATTENTION = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
}
_MLP = {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_PRE_NORMS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
LLAMA_LAYERS = {**_PRE_NORMS, **_ATTENTION, **_MLP}
QK_NORM_LAYERS = {**LLAMA_LAYERS, **_QK_NORMS}
# Gemma 2/3: HF's post_attention_layernorm follows attention, pre_feedforward_layernorm
# precedes the MLP (llama.cpp's ffn_norm)
SANDWICH_LAYERS = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    **_ATTENTION, **_MLP,
}
OLMO2_LAYERS = {
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    **_ATTENTION, **_MLP, **_QK_NORMS,
}
PHI3_LAYERS = {
    **_PRE_NORMS,
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_up": "mlp.gate_up_proj",  # Phi-3's gate_up_proj, kept fused by the converter
    "ffn_down": "mlp.down_proj",
}
MOE_LAYERS = {**_PRE_NORMS, **_ATTENTION, **MOE_ROUTER}  # + the experts (gguf_experts.py)
GPT_OSS_LAYERS = {**GPT_OSS_NORMS, **_ATTENTION, **MOE_ROUTER}
GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                "output": "lm_head"}
LLAMA3_FREQS = "rope_freqs.weight"  # Llama 3.1's rope scaling, as per-frequency factors
PHI3_LONG_FACTORS = "rope_factors_long.weight"
PHI3_SHORT_FACTORS = "rope_factors_short.weight"


ConfigReader = Callable[[ArchMeta, dict[str, Any]], dict[str, Any]]


def _no_fields(meta: ArchMeta, cfg: dict[str, Any]) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class GGUFArchitecture:
    """How one GGUF architecture reads back; see the module docstring."""

    name: str
    hf_architecture: str
    layer_names: Mapping[str, str]
    permuted_qk: bool = False
    norm_offset: float = 0.0
    config_tensors: tuple[str, ...] = ()
    feature_keys: frozenset[str] = frozenset()
    read_config: ConfigReader = _no_fields
    experts: bool = False  # stacked expert tensors (ffn_*_exps), read by gguf_experts.py
    # per-layer tensors named whole ("attn_sinks.weight") -> HF parameter inside the layer
    layer_tensors: Mapping[str, str] = field(default_factory=dict)
    # DeepSeek's latent attention: key_length / value_length are not the heads' and kv_b_proj
    # may be written split (models/gguf_deepseek.py)
    latent_attention: bool = False


def _gemma_query_scalar(meta: ArchMeta, cfg: Mapping[str, Any]) -> float:
    if cfg["num_hidden_layers"] == GEMMA_27B_LAYERS[meta.arch]:
        return cfg["hidden_size"] / cfg["num_attention_heads"]
    return float(cfg["head_dim"])


def read_gemma(meta: ArchMeta, cfg: dict[str, Any]) -> dict[str, Any]:
    return {"hidden_activation": GEMMA_ACTIVATION}


def read_gemma2(meta: ArchMeta, cfg: dict[str, Any]) -> dict[str, Any]:
    window = int(meta.get("attention.sliding_window") or GEMMA2_WINDOW)
    return {
        "hidden_activation": GEMMA_ACTIVATION,
        "attn_logit_softcapping": meta.number("attn_logit_softcapping", GEMMA2_ATTN_SOFTCAP),
        "final_logit_softcapping": meta.number("final_logit_softcapping", GEMMA2_FINAL_SOFTCAP),
        "sliding_window": window,
        "layer_types": sliding_layers(cfg["num_hidden_layers"], GEMMA2_SLIDING_PATTERN),
        "query_pre_attn_scalar": _gemma_query_scalar(meta, cfg),
    }


def read_gemma3(meta: ArchMeta, cfg: dict[str, Any]) -> dict[str, Any]:
    """No window (or 0): every layer global, as llama.cpp then runs it."""
    window = int(meta.get("attention.sliding_window") or 0)
    pattern = meta.get("attention.sliding_window_pattern", GEMMA3_SLIDING_PATTERN)
    layers = cfg["num_hidden_layers"]
    return {
        "hidden_activation": GEMMA_ACTIVATION,
        "final_logit_softcapping": meta.number("final_logit_softcapping", 0.0),
        "sliding_window": window or None,
        "layer_types": sliding_layers(layers, pattern) if window else [FULL] * layers,
        "rope_local_base_freq": meta.number("rope.freq_base_swa", GEMMA3_LOCAL_THETA),
        "query_pre_attn_scalar": _gemma_query_scalar(meta, cfg),
    }


def read_phi3(meta: ArchMeta, cfg: dict[str, Any]) -> dict[str, Any]:
    """Phi-3 writes its window (0: none; llama.cpp disables it at load, HF applies it on every
    layer, as we do) and always its original context."""
    out: dict[str, Any] = {}
    window = int(meta.get("attention.sliding_window") or 0)
    if window:
        out["sliding_window"] = window
    original = meta.get("rope.scaling.original_context_length")
    if original is not None:
        out["original_max_position_embeddings"] = int(original)
    return out


def read_granite(meta: ArchMeta, cfg: dict[str, Any]) -> dict[str, Any]:
    """The converter writes each multiplier only when set (non-zero); llama.cpp then falls back
    to no scaling, and to head_dim ** -0.5 for the attention scale."""
    return {
        "embedding_multiplier": meta.number("embedding_scale", 1.0),
        "residual_multiplier": meta.number("residual_scale", 1.0),
        "attention_multiplier": meta.number("attention.scale", cfg["head_dim"] ** -0.5),
        "logits_scaling": meta.number("logit_scale", 1.0),
    }


def read_smollm3(meta: ArchMeta, cfg: dict[str, Any]) -> dict[str, Any]:
    return {"no_rope_layer_interval": SMOLLM3_NO_ROPE_INTERVAL}


_SOFTCAPS = frozenset({"attn_logit_softcapping", "final_logit_softcapping"})
_WINDOWS = frozenset({"attention.sliding_window", "attention.sliding_window_pattern",
                      "rope.freq_base_swa"})
_GRANITE_SCALES = frozenset({"embedding_scale", "residual_scale", "attention.scale",
                             "logit_scale"})

GGUF_ARCHITECTURES: dict[str, GGUFArchitecture] = {
    arch.name: arch for arch in (
        GGUFArchitecture("llama", "LlamaForCausalLM", LLAMA_LAYERS, permuted_qk=True,
                         config_tensors=(LLAMA3_FREQS,)),
        GGUFArchitecture("qwen2", "Qwen2ForCausalLM", LLAMA_LAYERS),
        GGUFArchitecture("qwen3", "Qwen3ForCausalLM", QK_NORM_LAYERS),
        GGUFArchitecture("gemma", "GemmaForCausalLM", LLAMA_LAYERS, norm_offset=1.0,
                         read_config=read_gemma),
        GGUFArchitecture("gemma2", "Gemma2ForCausalLM", SANDWICH_LAYERS, norm_offset=1.0,
                         feature_keys=_SOFTCAPS | _WINDOWS, read_config=read_gemma2),
        GGUFArchitecture("gemma3", "Gemma3ForCausalLM", {**SANDWICH_LAYERS, **_QK_NORMS},
                         norm_offset=1.0, feature_keys=_SOFTCAPS | _WINDOWS,
                         read_config=read_gemma3),
        GGUFArchitecture("phi3", "Phi3ForCausalLM", PHI3_LAYERS,
                         config_tensors=(PHI3_LONG_FACTORS, PHI3_SHORT_FACTORS),
                         feature_keys=frozenset({"attention.sliding_window"}),
                         read_config=read_phi3),
        GGUFArchitecture("olmo2", "Olmo2ForCausalLM", OLMO2_LAYERS),
        GGUFArchitecture("granite", "GraniteForCausalLM", LLAMA_LAYERS, permuted_qk=True,
                         config_tensors=(LLAMA3_FREQS,), feature_keys=_GRANITE_SCALES,
                         read_config=read_granite),
        GGUFArchitecture("smollm3", "SmolLM3ForCausalLM", LLAMA_LAYERS, permuted_qk=True,
                         config_tensors=(LLAMA3_FREQS,), read_config=read_smollm3),
        GGUFArchitecture("qwen2moe", "Qwen2MoeForCausalLM", {**MOE_LAYERS, **SHARED_EXPERT},
                         experts=True, read_config=read_qwen2moe,
                         feature_keys=MOE_FEATURE_KEYS | {"expert_shared_feed_forward_length"}),
        GGUFArchitecture("qwen3moe", "Qwen3MoeForCausalLM", {**MOE_LAYERS, **_QK_NORMS},
                         experts=True, feature_keys=MOE_FEATURE_KEYS, read_config=read_qwen3moe),
        GGUFArchitecture("olmoe", "OlmoeForCausalLM", {**MOE_LAYERS, **_QK_NORMS}, experts=True,
                         feature_keys=MOE_FEATURE_KEYS, read_config=read_olmoe),
        GGUFArchitecture("gpt-oss", "GptOssForCausalLM", GPT_OSS_LAYERS, experts=True,
                         layer_tensors=GPT_OSS_TENSORS, read_config=read_gpt_oss,
                         feature_keys=MOE_FEATURE_KEYS | {"attention.sliding_window"}),
        # DeepseekV3ForCausalLM where the file routes by sigmoid (read_deepseek2)
        GGUFArchitecture("deepseek2", "DeepseekV2ForCausalLM", DEEPSEEK2_LAYERS, experts=True,
                         layer_tensors=EXPERT_BIAS, latent_attention=True,
                         read_config=read_deepseek2, feature_keys=DEEPSEEK_FEATURE_KEYS
                         | {"rope.scaling.yarn_log_multiplier"}),
        GGUFArchitecture("glm4moe", "Glm4MoeForCausalLM", GLM4MOE_LAYERS, experts=True,
                         layer_tensors=EXPERT_BIAS, feature_keys=DEEPSEEK_FEATURE_KEYS,
                         read_config=read_glm4moe),
    )
}
# an architecture that llama.cpp's converter also writes with experts (Mixtral as llama): the
# entry read when the file sets {arch}.expert_count
MOE_VARIANTS: dict[str, GGUFArchitecture] = {
    "llama": GGUFArchitecture("llama", "MixtralForCausalLM", MOE_LAYERS, permuted_qk=True,
                              config_tensors=(LLAMA3_FREQS,), experts=True,
                              feature_keys=MOE_FEATURE_KEYS, read_config=read_mixtral),
}


def all_gguf_architectures() -> Iterator[GGUFArchitecture]:
    yield from GGUF_ARCHITECTURES.values()
    yield from MOE_VARIANTS.values()


def gguf_architecture(meta: Mapping[str, Any]) -> GGUFArchitecture:
    """The table entry of a GGUF's general.architecture (its MoE variant when the file has
    experts); refused with the supported ones."""
    name = str(meta.get("general.architecture", ""))
    if name not in GGUF_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {name!r} is not supported; supported: "
                         f"{', '.join(GGUF_ARCHITECTURES)}")
    if name in MOE_VARIANTS and meta.get(f"{name}.expert_count"):
        return MOE_VARIANTS[name]
    return GGUF_ARCHITECTURES[name]
