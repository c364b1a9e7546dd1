"""Gemma, Gemma 2 and Gemma 3 (text).

- All: GeGLU (gelu-tanh), RMSNorm by (1 + w), embeddings times sqrt(hidden), tied LM head,
  head_dim independent of hidden / heads.
- Gemma 2: norms before and after attention and MLP ("sandwich"), attention-logit and final-logit
  soft-capping, softmax scale query_pre_attn_scalar ** -0.5, sliding layers alternating with
  global ones (layer_types; even layers slide in configs older than it).
- Gemma 3: as Gemma 2, without soft-capping, with q/k norms; sliding layers use their own RoPE
  (rope_local_base_freq, unscaled), global ones the model's (possibly linear-scaled). The
  multimodal checkpoints (Gemma3ForConditionalGeneration) load their language model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from radixrt.runtime.models.families.family import ModelFamily
from radixrt.runtime.models.hf_fields import SLIDING_ATTENTION, common_fields, rope_of
from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.tensor_source import Weight

GEMMA3_SLIDING_PATTERN = 6  # configs older than layer_types: every 6th layer is global
GEMMA3_LOCAL_THETA = 10000.0
_MULTIMODAL_PREFIXES = ("model.language_model.", "language_model.model.")
_MULTIMODAL_SKIPPED = ("vision_tower", "multi_modal_projector", "model.vision", "vision_model")


def _layer_types(cfg: Mapping[str, Any], num_layers: int, gemma3: bool) -> list[str]:
    if cfg.get("layer_types"):
        return list(cfg["layer_types"])
    if gemma3:
        pattern = int(cfg.get("sliding_window_pattern") or GEMMA3_SLIDING_PATTERN)
        return [SLIDING_ATTENTION if (i + 1) % pattern else "full_attention"
                for i in range(num_layers)]
    return [SLIDING_ATTENTION if i % 2 == 0 else "full_attention" for i in range(num_layers)]


def read_gemma(cfg: Mapping[str, Any], architecture: str) -> ModelConfig:
    if "text_config" in cfg:  # Gemma3ForConditionalGeneration: its language model
        text = cfg["text_config"]
        eos = [*_ids(text.get("eos_token_id")), *_ids(cfg.get("eos_token_id"))]
        cfg = {**text, "architectures": [architecture], "eos_token_id": list(dict.fromkeys(eos))}
    cfg = {"tie_word_embeddings": True, **cfg}
    generation = {"GemmaForCausalLM": 1, "Gemma2ForCausalLM": 2}.get(architecture, 3)
    if generation >= 2:
        cfg["layer_types"] = _layer_types(cfg, int(cfg["num_hidden_layers"]), generation == 3)
    fields = common_fields(cfg, architecture)
    fields.update(norm_offset=1.0, embedding_scale=math.sqrt(fields["hidden_size"]),
                  embedding_scale_in_dtype=True)
    if generation == 1:
        return ModelConfig(**fields)
    scalar = float(cfg.get("query_pre_attn_scalar") or fields["head_dim"])
    fields.update(norm_layout="sandwich", attention_scale=scalar**-0.5,
                  attn_logit_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
                  final_logit_softcap=float(cfg.get("final_logit_softcapping") or 0.0))
    if generation == 3:
        theta, scaling, _ = rope_of(cfg, "sliding_attention",
                                    float(cfg.get("rope_local_base_freq", GEMMA3_LOCAL_THETA)))
        if not isinstance((cfg.get("rope_parameters") or {}).get("sliding_attention"), Mapping):
            theta, scaling = float(cfg.get("rope_local_base_freq", GEMMA3_LOCAL_THETA)), None
        kinds = tuple("local" if w is not None else "global" for w in fields["layer_windows"])
        fields.update(qk_norm=True, layer_rope=kinds, local_rope_theta=theta,
                      local_rope_scaling=scaling)
    return ModelConfig(**fields)


def _ids(value: Any) -> list[int]:
    return [] if value is None else [int(v) for v in value] if isinstance(value, list) else [
        int(value)]


def rename_gemma(name: str, weight: Weight, config: ModelConfig) -> Iterable[tuple[str, Weight]]:
    """Multimodal Gemma 3 checkpoints: the language model's tensors under the usual names."""
    if any(part in name for part in _MULTIMODAL_SKIPPED):
        return
    for prefix in _MULTIMODAL_PREFIXES:
        if name.startswith(prefix):
            name = "model." + name.removeprefix(prefix)
    if name == "language_model.lm_head.weight":
        name = "lm_head.weight"
    yield name, weight


GEMMA = ModelFamily(
    name="gemma",
    architectures=("GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM",
                   "Gemma3ForConditionalGeneration"),
    model_types=("gemma", "gemma2", "gemma3_text", "gemma3"),
    gguf_architectures=("gemma", "gemma2", "gemma3"),
    read_config=read_gemma,
    rename=rename_gemma,
    features={"window": "Gemma 2/3: sliding layers between global ones",
              "rope": "default, linear (Gemma 3 global layers); local theta"},
)
