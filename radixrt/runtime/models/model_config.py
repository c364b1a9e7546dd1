"""ModelConfig: the shape and the traits of a decoder-only model, whatever its family.

The families (models/families/, looked up in models/registry.py) read a checkpoint's config.json
into this one record; the decoder (models/decoder.py) builds itself from it. A trait has the
value that changes nothing (Llama's) by default, so a family sets only what differs:

    norm_offset        RMSNorm scales by (offset + w): 1 for Gemma, 0 otherwise
    norm_layout        "pre" (Llama), "sandwich" (Gemma 2/3: norms before and after attention
                       and MLP), "post" (OLMo-2: after each, none before)
    hidden_act         the gated MLP's activation (silu; gelu_pytorch_tanh for GeGLU)
    embedding_scale    embeddings times this (Gemma: sqrt(hidden), rounded to the model's dtype
                       first as transformers does (embedding_scale_in_dtype); Granite's
                       multiplier, applied in float32)
    residual_scale     each block's output times this before the residual add (Granite)
    attention_scale    the softmax scale (None: head_dim ** -0.5)
    attn_logit_softcap / final_logit_softcap   c * tanh(x / c) on scores / logits (Gemma 2)
    logits_divisor     logits divided by this (Granite's logits_scaling)
    norm_weight_first  RMSNorm multiplies by its weight before casting back (OLMo-2, gpt-oss)
    mlp_bias           biases on the MLP's projections (Llama, Granite, SmolLM3 configs)
    qk_norm            RMSNorm of q and k per head before RoPE (Qwen3, Gemma 3);
    qk_norm_all_heads  over all heads at once (OLMo-2)
    partial_rotary_factor   the fraction of each head RoPE rotates (Phi-4-mini)
    layer_windows      per layer: None (full attention) or its sliding window
    layer_rope         per layer: "global", "local" (Gemma 3's sliding layers: their own theta
                       and scaling) or "none" (SmolLM3's NoPE layers)
    o_proj_bias        a bias on the attention output projection (attention_bias, where the
                       family puts it on o too)
    served_context     the context length served, when known: LongRoPE picks its short or long
                       factors by it (models/rope.py)
    attention_sinks    a learned per-head logit in every softmax's denominator (gpt-oss)

Mixture of experts (models/moe.py; num_experts 0 = dense):
    num_experts, num_experts_per_tok, moe_intermediate_size (each expert's)
    moe_layers         per layer: True where the MLP is the MoE block (() = every layer)
    routing            "softmax_topk" (renormalised when norm_topk_prob) or "topk_softmax"
    router_bias, expert_bias      biases on the router and on the experts' projections
    expert_activation  "silu" (SwiGLU) or "swiglu_oai" (gpt-oss: clamped, alpha, limit)
    shared_expert_intermediate_size   a shared expert with a sigmoid gate (Qwen2-MoE)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixrt.runtime.models.rope import ROPE_TYPES, rope_type_of

NORM_LAYOUTS = ("pre", "sandwich", "post")
ROPE_LAYER_KINDS = ("global", "local", "none")


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
    rope_scaling: dict[str, Any] | None = None  # None, or {"rope_type": ..., ...}
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2)
    qk_norm: bool = False
    qk_norm_all_heads: bool = False
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None  # the largest window of any layer (None: none has one)
    hidden_act: str = "silu"
    norm_offset: float = 0.0
    norm_layout: str = "pre"
    embedding_scale: float = 1.0
    embedding_scale_in_dtype: bool = False
    norm_weight_first: bool = False
    mlp_bias: bool = False
    residual_scale: float = 1.0
    attention_scale: float | None = None
    attn_logit_softcap: float = 0.0
    final_logit_softcap: float = 0.0
    logits_divisor: float = 1.0
    partial_rotary_factor: float = 1.0
    layer_windows: tuple[int | None, ...] = ()  # () = every layer sliding_window
    layer_rope: tuple[str, ...] = ()  # () = every layer "global"
    local_rope_theta: float | None = None
    local_rope_scaling: dict[str, Any] | None = None
    o_proj_bias: bool = False
    served_context: int | None = None
    attention_sinks: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    moe_layers: tuple[bool, ...] = ()
    routing: str = "softmax_topk"
    norm_topk_prob: bool = False
    router_bias: bool = False
    expert_bias: bool = False
    expert_activation: str = "silu"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    shared_expert_intermediate_size: int = 0
    # a classification head (`*ForSequenceClassification`: score.weight [num_labels, hidden])
    # in place of the LM head; 0: the LM head. labels: id2label's names, in label order
    num_labels: int = 0
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.rotary_dim % 2:
            raise ValueError(f"the rotary dimension {self.rotary_dim} (head_dim={self.head_dim} "
                             f"x {self.partial_rotary_factor}) must be even")
        for scaling in (self.rope_scaling, self.local_rope_scaling):
            if rope_type_of(scaling) not in ROPE_TYPES:
                raise ValueError(f"rope_type {rope_type_of(scaling)!r} is not supported; use "
                                 f"one of {ROPE_TYPES}")
        if self.norm_layout not in NORM_LAYOUTS:
            raise ValueError(f"norm_layout={self.norm_layout!r}: use one of {NORM_LAYOUTS}")
        for name, values in (("layer_windows", self.layer_windows),
                             ("layer_rope", self.layer_rope)):
            if values and len(values) != self.num_layers:
                raise ValueError(f"{name} has {len(values)} entries for {self.num_layers} layers")
        if any(kind not in ROPE_LAYER_KINDS for kind in self.layer_rope):
            raise ValueError(f"layer_rope kinds are {ROPE_LAYER_KINDS}: got {self.layer_rope}")
        if self.moe_layers and len(self.moe_layers) != self.num_layers:
            raise ValueError(f"moe_layers has {len(self.moe_layers)} entries for "
                             f"{self.num_layers} layers")
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} must be within "
                             f"1..num_experts={self.num_experts}")
        if any(w is not None and w < 1 for w in self.windows):
            raise ValueError(f"sliding windows must be >= 1: {self.windows}")

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def windows(self) -> tuple[int | None, ...]:
        """Every layer's sliding window (None: full attention)."""
        return self.layer_windows or (self.sliding_window,) * self.num_layers

    @property
    def rope_kinds(self) -> tuple[str, ...]:
        return self.layer_rope or ("global",) * self.num_layers

    @property
    def moe_kinds(self) -> tuple[bool, ...]:
        """Per layer: whether its MLP is the mixture-of-experts block."""
        if not self.num_experts:
            return (False,) * self.num_layers
        return self.moe_layers or (True,) * self.num_layers

