"""A GGUF file's metadata as a config.json dict, so that a GGUF model is read by its family like
any checkpoint folder (models/registry.py). llama.cpp's converter writes the keys under the
architecture's name ("gemma2.embedding_length", ...); what each architecture writes, and what
llama.cpp hard-codes instead, is in models/gguf_archs.py.

A file that asks for something its family cannot honour (a key in FEATURE_KEYS the family does
not read, per-layer head counts, a RoPE scaling we do not implement) is refused: it would load
and run, wrongly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from radixrt.runtime.models.gguf_archs import (
    LLAMA3_FREQS,
    PHI3_LONG_FACTORS,
    PHI3_SHORT_FACTORS,
    ArchMeta,
    GGUFArchitecture,
    gguf_architecture,
)

DEFAULT_ROPE_THETA = 10000.0  # llama.cpp's rope_freq_base when the file has none
DEFAULT_CONTEXT = 4096
# keys that change what the model computes, each honoured only by the architectures that list
# it in their feature_keys (a key present with a false / zero value asks for nothing)
FEATURE_KEYS = {
    "attn_logit_softcapping": "attention-logit soft-capping",
    "final_logit_softcapping": "final-logit soft-capping",
    "attention.sliding_window": "a sliding window",
    "attention.sliding_window_pattern": "a pattern of sliding-window layers",
    "rope.freq_base_swa": "a RoPE base of its own for sliding layers",
    "embedding_scale": "an embedding multiplier",
    "residual_scale": "a residual multiplier",
    "attention.scale": "an attention scale",
    "logit_scale": "a logit divisor",
    "expert_count": "mixture-of-experts layers",
    "expert_shared_feed_forward_length": "a shared expert",
    "expert_shared_count": "shared experts",
    "expert_group_count": "grouped expert routing",
    "expert_group_used_count": "grouped expert routing",
    "expert_weights_scale": "scaled routing weights",
    "expert_chunk_feed_forward_length": "chunked experts",
    "leading_dense_block_count": "leading dense layers",
    "moe_every_n_layers": "experts on every n-th layer only",
    "moe_latent_size": "latent expert projections",
    "swiglu_clamp_exp": "clamped expert SwiGLU",
    "swiglu_clamp_shexp": "clamped shared-expert SwiGLU",
    "attention.clamp_kqv": "clamped q/k/v",
    "rope.dimension_sections": "multimodal RoPE sections",
    "rope.scaling.yarn_log_multiplier": "YaRN with mscale_all_dim",
    "use_parallel_residual": "parallel residual blocks",
}
# the value of a feature key that asks for nothing, where it is not false / zero
NEUTRAL_VALUES: dict[str, Any] = {"expert_weights_scale": 1.0}
# tokenizer ids that end generation in llama.cpp (llama_vocab::is_eog), first the EOS
_END_TOKEN_KEYS = ("eos_token_id", "eot_token_id", "eom_token_id")


def gguf_hf_config(meta: Mapping[str, Any], shapes: Mapping[str, Sequence[int]],
                   factors: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """config.json fields of a GGUF file: its metadata, its tensors' shapes (torch order) and
    the values of the small tensors that carry RoPE factors (arch.config_tensors)."""
    arch = gguf_architecture(meta)
    m = ArchMeta(meta, arch.name, shapes)
    _refuse_unhonoured_keys(m, arch)
    cfg = _common_fields(m, shapes, arch.latent_attention)
    cfg["architectures"] = [arch.hf_architecture]
    scaling = gguf_rope_scaling(m, factors, cfg)
    if scaling is not None:
        cfg["rope_scaling"] = scaling
    cfg.update(arch.read_config(m, cfg))
    return cfg


def _refuse_unhonoured_keys(m: ArchMeta, arch: GGUFArchitecture) -> None:
    for key, what in FEATURE_KEYS.items():
        value = m.get(key)
        if _asks_for(key, value) and key not in arch.feature_keys:
            raise ValueError(f"this {arch.name} GGUF sets {arch.name}.{key}={value!r} "
                             f"({what}), which radixrt's {arch.hf_architecture} does not "
                             "honour: it would run wrongly")


def _asks_for(key: str, value: Any) -> bool:
    """Whether a key's value asks for its feature: not false, zero, all zeros or neutral."""
    if isinstance(value, tuple):
        return any(value)
    return bool(value) and value != NEUTRAL_VALUES.get(key)


def _common_fields(m: ArchMeta, shapes: Mapping[str, Sequence[int]],
                   latent: bool = False) -> dict[str, Any]:
    """Sizes as llama.cpp reads them: head_dim is attention.key_length (default hidden / heads)
    and the rotary dimension rope.dimension_count (default head_dim; Phi-3 writes a partial
    one). Latent attention (DeepSeek's): its reader sets the head sizes (gguf_deepseek.py)."""
    heads = m.integer("attention.head_count")
    hidden = m.integer("embedding_length")
    head_dim = m.integer("attention.key_length", hidden // heads)
    value_dim = m.integer("attention.value_length", head_dim)
    if value_dim != head_dim and not latent:
        raise ValueError(f"the GGUF's value heads ({value_dim}) differ from its key heads "
                         f"({head_dim}): not supported")
    rotary = m.integer("rope.dimension_count", head_dim)
    cfg: dict[str, Any] = {
        "vocab_size": int(shapes["token_embd.weight"][0]),
        "hidden_size": hidden,
        "intermediate_size": m.integer("feed_forward_length"),
        "num_hidden_layers": m.integer("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": m.integer("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "rope_theta": m.number("rope.freq_base", DEFAULT_ROPE_THETA),
        "rms_norm_eps": m.number("attention.layer_norm_rms_epsilon"),
        "tie_word_embeddings": "output.weight" not in shapes,
        "attention_bias": "blk.0.attn_q.bias" in shapes or "blk.0.attn_qkv.bias" in shapes,
        "max_position_embeddings": m.integer("context_length", DEFAULT_CONTEXT),
        **_token_ids(m.meta),
    }
    if rotary != head_dim and not latent:
        cfg["partial_rotary_factor"] = rotary / head_dim
    return cfg


def _token_ids(meta: Mapping[str, Any]) -> dict[str, Any]:
    bos = meta.get("tokenizer.ggml.bos_token_id")
    ends = [int(meta[f"tokenizer.ggml.{key}"]) for key in _END_TOKEN_KEYS
            if meta.get(f"tokenizer.ggml.{key}") is not None]
    return {"bos_token_id": None if bos is None else int(bos),
            "eos_token_id": list(dict.fromkeys(ends)) or None}


def gguf_rope_scaling(m: ArchMeta, factors: Mapping[str, Sequence[float]],
                      cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    """The file's RoPE scaling as rope_scaling: Llama-3.1's as the per-frequency factors of its
    rope_freqs tensor, Phi-3's LongRoPE from its rope_factors_long/short tensors, linear and
    YaRN from the metadata. Any other kind is refused: the model would run, wrongly, past its
    original context."""
    kind = str(m.get("rope.scaling.type", "none"))
    factor = float(m.get("rope.scaling.factor") or 1.0)
    rotary = int(cfg["head_dim"] * cfg.get("partial_rotary_factor", 1.0))
    if LLAMA3_FREQS in factors:
        if kind not in ("none", "linear") or factor != 1.0:
            raise ValueError(f"the GGUF combines rope_freqs with {kind} scaling (factor "
                             f"{factor}): not supported")
        return {"rope_type": "freq_factors",
                "factors": _factor_list(factors[LLAMA3_FREQS], rotary, "rope_freqs")}
    if PHI3_LONG_FACTORS in factors or kind == "longrope":
        return _longrope(m, factors, cfg, rotary)
    if kind == "none" or factor == 1.0:
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        return _yarn(m, factor)
    raise ValueError(f"the GGUF's RoPE scaling {kind!r} is not supported (linear, YaRN, "
                     "LongRoPE and Llama-3.1 frequency factors are): this model would run "
                     "wrongly")


def _factor_list(values: Sequence[float], rotary: int, name: str) -> tuple[float, ...]:
    if len(values) != rotary // 2:
        raise ValueError(f"the GGUF's {name} has {len(values)} factors; the rotary dimension "
                         f"{rotary} needs {rotary // 2}")
    return tuple(float(v) for v in values)


def _yarn(m: ArchMeta, factor: float) -> dict[str, Any]:
    """llama.cpp's YaRN keys -> transformers' (its extrapolation factor is HF's fixed 1; a
    negative one means "derive it", which gives 1 too)."""
    original = m.get("rope.scaling.original_context_length")
    if original is None:
        raise ValueError("the GGUF's YaRN scaling lacks rope.scaling.original_context_length")
    ext = m.get("rope.scaling.yarn_ext_factor")
    if ext is not None and ext >= 0 and ext != 1.0:
        raise ValueError(f"the GGUF's YaRN extrapolation factor {ext} is not supported")
    out: dict[str, Any] = {"rope_type": "yarn", "factor": factor,
                           "original_max_position_embeddings": int(original)}
    attention = m.get("rope.scaling.yarn_attn_factor", m.get("rope.scaling.attn_factor"))
    if attention is not None:
        out["attention_factor"] = float(attention)
    for key in ("beta_fast", "beta_slow"):
        if m.get(f"rope.scaling.yarn_{key}") is not None:
            out[key] = float(m.get(f"rope.scaling.yarn_{key}"))
    return out


def _longrope(m: ArchMeta, factors: Mapping[str, Sequence[float]], cfg: Mapping[str, Any],
              rotary: int) -> dict[str, Any]:
    """Phi-3's LongRoPE: the converter writes the long and short factors as tensors, the
    original context and the attention factor it derived (as HF derives it) as metadata."""
    if PHI3_LONG_FACTORS not in factors or PHI3_SHORT_FACTORS not in factors:
        raise ValueError("the GGUF's LongRoPE scaling lacks rope_factors_long / "
                         "rope_factors_short")
    original = m.get("rope.scaling.original_context_length")
    if original is None:
        raise ValueError("the GGUF's LongRoPE scaling lacks "
                         "rope.scaling.original_context_length")
    out: dict[str, Any] = {
        "rope_type": "longrope",
        "long_factor": _factor_list(factors[PHI3_LONG_FACTORS], rotary, "rope_factors_long"),
        "short_factor": _factor_list(factors[PHI3_SHORT_FACTORS], rotary, "rope_factors_short"),
        "factor": cfg["max_position_embeddings"] / int(original),
        "original_max_position_embeddings": int(original),
    }
    if m.get("rope.scaling.attn_factor") is not None:
        out["attention_factor"] = float(m.get("rope.scaling.attn_factor"))
    return out
