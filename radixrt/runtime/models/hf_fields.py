"""The config.json keys every family shares, read once: sizes, RoPE (transformers 4.x
`rope_scaling` / `rope_theta` or 5.x `rope_parameters`, per layer type where a family has two),
sliding windows per layer (`layer_types`), tokens. A family's reader starts from these fields
and adds its traits (models/families/)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


def rope_of(cfg: Mapping[str, Any], layer_type: str | None = None,
            default_theta: float = 10000.0) -> tuple[float, dict[str, Any] | None, float]:
    """(theta, scaling or None, partial_rotary_factor) of the config, or of one layer type's
    entry where rope_parameters is keyed by layer type (Gemma 3)."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if layer_type is not None and isinstance(params.get(layer_type), Mapping):
        params = dict(params[layer_type])
    elif any(isinstance(v, Mapping) for v in params.values()):
        params = dict(params.get(FULL_ATTENTION) or {})
    theta = float(params.pop("rope_theta", cfg.get("rope_theta", default_theta)))
    partial = float(params.pop("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    if params.get("rope_type", "default") == "default":
        return theta, None, partial
    original = cfg.get("original_max_position_embeddings")
    if original is not None:
        params.setdefault("original_max_position_embeddings", int(original))
    return theta, params, partial


def layer_windows(cfg: Mapping[str, Any], num_layers: int) -> tuple[int | None, ...]:
    """Each layer's sliding window: `layer_types` where the config has it, else every layer
    sliding (Mistral) when it has a window; none when use_sliding_window is false."""
    window = cfg.get("sliding_window")
    if window is None or not cfg.get("use_sliding_window", True):
        return (None,) * num_layers
    types = cfg.get("layer_types")
    if types:
        if len(types) != num_layers:
            raise ValueError(f"layer_types has {len(types)} entries for {num_layers} layers")
        return tuple(int(window) if t == SLIDING_ATTENTION else None for t in types)
    return (int(window),) * num_layers


def common_fields(cfg: Mapping[str, Any], architecture: str) -> dict[str, Any]:
    """ModelConfig's fields that every family reads the same way."""
    num_heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    num_layers = int(cfg["num_hidden_layers"])
    theta, scaling, partial = rope_of(cfg)
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    windows = layer_windows(cfg, num_layers)
    present = [w for w in windows if w is not None]
    return dict(
        architecture=architecture,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
        head_dim=int(cfg.get("head_dim") or hidden // num_heads),
        rope_theta=theta,
        rope_scaling=scaling,
        partial_rotary_factor=partial,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        o_proj_bias=bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids,
        hidden_act=str(cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"),
        sliding_window=max(present) if present else None,
        layer_windows=windows,
    )
