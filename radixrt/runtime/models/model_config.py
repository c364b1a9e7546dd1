"""ModelConfig: the shape of a Llama-family model, from a HF config.json or GGUF metadata."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# HF architectures (config.json "architectures") that LlamaForCausalLM implements.
SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)
_ARCH_BY_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
# "freq_factors": a GGUF's rope_freqs tensor (how llama.cpp stores Llama-3.1 scaling): each
# inverse frequency divided by its factor.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "freq_factors")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # None, or {"rope_type": "llama3" | "linear", ...}
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm of q and k before rope (Qwen3)
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None  # recorded only; attention is always full (see report)

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"architecture {self.architecture!r} is not supported; "
                f"use one of {SUPPORTED_ARCHITECTURES}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"rope_type {rope_type!r} is not supported; use one of {SUPPORTED_ROPE_TYPES}"
            )

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @classmethod
    def from_hf_dict(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        """From a parsed config.json (transformers 4.x `rope_scaling` or 5.x `rope_parameters`)."""
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else _ARCH_BY_MODEL_TYPE.get(cfg.get("model_type", ""), "")
        num_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        rope_params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        rope_theta = float(rope_params.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
        if "type" in rope_params and "rope_type" not in rope_params:
            rope_params["rope_type"] = rope_params.pop("type")
        rope_scaling = rope_params if rope_params.get("rope_type", "default") != "default" else None
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
        return cls(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(cfg.get("head_dim") or hidden // num_heads),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", arch == "Qwen2ForCausalLM")),
            qk_norm=arch == "Qwen3ForCausalLM",
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            sliding_window=window,
        )

    @classmethod
    def from_gguf_metadata(
        cls, meta: Mapping[str, Any], vocab_size: int, tied: bool,
        freq_factors: Sequence[float] | None = None,
    ) -> ModelConfig:
        """From the scalar metadata of a llama-architecture GGUF file (and its rope_freqs
        tensor, if it has one)."""
        arch = meta.get("general.architecture", "llama")
        if arch != "llama":
            raise ValueError(f"GGUF architecture {arch!r} is not supported (only 'llama')")
        num_heads = int(meta["llama.attention.head_count"])
        hidden = int(meta["llama.embedding_length"])
        head_dim = int(meta.get("llama.rope.dimension_count", hidden // num_heads))
        eos = meta.get("tokenizer.ggml.eos_token_id")
        return cls(
            architecture="LlamaForCausalLM",
            vocab_size=vocab_size,
            hidden_size=hidden,
            intermediate_size=int(meta["llama.feed_forward_length"]),
            num_layers=int(meta["llama.block_count"]),
            num_heads=num_heads,
            num_kv_heads=int(meta.get("llama.attention.head_count_kv", num_heads)),
            head_dim=head_dim,
            rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
            rope_scaling=gguf_rope_scaling(meta, freq_factors, head_dim),
            rms_norm_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
            tie_word_embeddings=tied,
            max_position_embeddings=int(meta.get("llama.context_length", 4096)),
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=() if eos is None else (int(eos),),
        )


def gguf_rope_scaling(meta: Mapping[str, Any], freq_factors: Sequence[float] | None,
                      head_dim: int) -> dict[str, Any] | None:
    """A GGUF's RoPE scaling as rope_scaling: linear from its metadata, Llama-3.1's as the
    per-frequency factors of its rope_freqs tensor. Any other kind (YaRN, ...) is refused: the
    model would run, wrongly, past its original context."""
    kind = str(meta.get("llama.rope.scaling.type", "none"))
    factor = float(meta.get("llama.rope.scaling.factor", 1.0) or 1.0)
    if freq_factors is not None:
        if len(freq_factors) != head_dim // 2:
            raise ValueError(f"the GGUF's rope_freqs has {len(freq_factors)} factors; "
                             f"head_dim {head_dim} needs {head_dim // 2}")
        if kind not in ("none", "linear") or factor != 1.0:
            raise ValueError(f"the GGUF combines rope_freqs with {kind} scaling (factor "
                             f"{factor}): not supported")
        return {"rope_type": "freq_factors", "factors": tuple(float(f) for f in freq_factors)}
    if kind == "none" or factor == 1.0:
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    raise ValueError(f"the GGUF's RoPE scaling {kind!r} is not supported (linear and "
                     "Llama-3.1 frequency factors are): this model would run wrongly")
