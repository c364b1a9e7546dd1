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

Multi-head latent attention (models/mla.py; kv_lora_rank 0 = ordinary attention):
    q_lora_rank        the query's low-rank compression (0: a full q projection, V2-Lite)
    kv_lora_rank       the latent each token caches (512 for V3), after its RMSNorm
    qk_nope_head_dim, qk_rope_head_dim, v_head_dim   each head's unrotated and rotated query /
                       key dims and its value dim; head_dim is their query-key sum
    rope_interleave    rotary pairs interleaved (x0, x1), (x2, x3)... (DeepSeek) not halves
    The KV pool then holds one row of kv_lora_rank + qk_rope_head_dim per token and layer
    (kv_layout).

Mixture of experts (models/moe.py; num_experts 0 = dense):
    num_experts, num_experts_per_tok, moe_intermediate_size (each expert's)
    moe_layers         per layer: True where the MLP is the MoE block (() = every layer)
    routing            "softmax_topk" (renormalised when norm_topk_prob), "topk_softmax"
                       (gpt-oss) or "sigmoid_topk" (DeepSeek-V3, GLM-4.5: sigmoid scores,
                       chosen with score_correction_bias, weights without it, renormalised
                       when norm_topk_prob)
    n_group, topk_group   grouped top-k: experts in n_group groups, only the topk_group best
                       groups compete (a group's score: its best expert's for softmax, its two
                       best's sum for sigmoid)
    routed_scaling_factor  the routing weights times this (DeepSeek)
    score_correction_bias  a per-expert bias added to the scores when choosing (DeepSeek-V3's
                       auxiliary-loss-free balancing), never to the weights
    router_float32     the router's logits computed in float32 whatever the model's dtype
                       (DeepSeek, GLM-4.5: a bf16 router would flip close choices)
    router_bias, expert_bias      biases on the router and on the experts' projections
    expert_activation  "silu" (SwiGLU) or "swiglu_oai" (gpt-oss: clamped, alpha, limit)
    shared_expert_intermediate_size   a shared expert added to every token: scaled by a
                       sigmoid gate (Qwen2-MoE) or not (shared_expert_gated False: DeepSeek)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixrt.runtime.models.rope import ROPE_TYPES, rope_type_of

NORM_LAYOUTS = ("pre", "sandwich", "post")
ROUTINGS = ("softmax_topk", "topk_softmax", "sigmoid_topk")
ROPE_LAYER_KINDS = ("global", "local", "none")


@dataclass(frozen=True)
class KVLayout:
    """What one token's KV is in one rank's pool (forward.kv_cache.KVShape): kv_parts
    tensors (2: K and V; 1: MLA's latent, whose first value dims are also its value) of
    num_kv_heads x head_dim per layer."""

    num_layers: int
    kv_parts: int
    num_kv_heads: int
    head_dim: int


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
    shared_expert_gated: bool = True
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    score_correction_bias: bool = False
    router_float32: bool = False
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False
    # multimodal RoPE (Qwen2-VL): the rotary frequencies in sections taking their positions
    # from the temporal, height and width streams in turn (ForwardBatch.mrope_positions); ()
    # for 1-D positions
    mrope_section: tuple[int, ...] = ()
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
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing {self.routing!r}: use one of {ROUTINGS}")
        if self.num_experts and (self.n_group < 1 or self.num_experts % self.n_group
                                 or not 1 <= self.topk_group <= self.n_group):
            raise ValueError(f"n_group={self.n_group} must divide num_experts="
                             f"{self.num_experts}, with 1 <= topk_group={self.topk_group} <= "
                             "n_group")
        if self.kv_lora_rank and (self.qk_nope_head_dim + self.qk_rope_head_dim != self.head_dim
                                  or self.v_head_dim < 1 or self.qk_rope_head_dim % 2):
            raise ValueError(f"latent attention: head_dim={self.head_dim} must be "
                             f"qk_nope_head_dim + qk_rope_head_dim (an even rotary part), "
                             f"with v_head_dim >= 1")
        if any(w is not None and w < 1 for w in self.windows):
            raise ValueError(f"sliding windows must be >= 1: {self.windows}")

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def rotary_dim(self) -> int:
        if self.kv_lora_rank:
            return self.qk_rope_head_dim
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def kv_layout(self) -> KVLayout:
        """One token's KV in an unsharded pool: K and V per KV head, or MLA's one latent row
        (kv_lora_rank + qk_rope_head_dim: 576 for V3)."""
        if self.kv_lora_rank:
            return KVLayout(self.num_layers, 1, 1, self.kv_lora_rank + self.qk_rope_head_dim)
        return KVLayout(self.num_layers, 2, self.num_kv_heads, self.head_dim)

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

