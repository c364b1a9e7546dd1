"""Tiny random-weight checkpoints of every supported family, built with transformers' own
classes from a config written here (nothing is downloaded), with the default model's tokenizer
saved beside them so that an Engine or `radixrt serve` can run them on text.

Each has 4 layers of width 64 and the tokenizer's 49152-token vocabulary; a family's traits are
turned on (soft-capping, windows of WINDOW tokens, RoPE kinds), and every weight, norms and
biases included, is drawn non-trivially, so that a trait read wrongly shows in the logits."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

WINDOW = 8  # shorter than every test prompt
TINY = dict(hidden_size=64, intermediate_size=112, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5)
ORIGINAL_CONTEXT = 32  # YaRN / LongRoPE models: prompts run past it
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0,
            "long_factor": [1.0 + 0.25 * i for i in range(6)],
            "short_factor": [1.0 + 0.05 * i for i in range(6)]}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": ORIGINAL_CONTEXT}
# latent attention of 4 heads: a latent of 32 + a rotary key of 16, heads' nope 24 and value 20
DEEPSEEK_MLA = dict(num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=16,
                    qk_nope_head_dim=24, v_head_dim=20, moe_intermediate_size=32,
                    n_shared_experts=1, first_k_dense_replace=1)


def _configs() -> dict[str, tuple[Any, Any, dict[str, Any]]]:
    """name -> (config class, model class, the config's family-specific arguments)."""
    import transformers as tf

    return {
        "mistral-window": (tf.MistralConfig, tf.MistralForCausalLM,
                           dict(sliding_window=WINDOW)),
        "qwen2-window": (tf.Qwen2Config, tf.Qwen2ForCausalLM,
                         dict(use_sliding_window=True, sliding_window=WINDOW,
                              max_window_layers=2)),
        "llama-yarn": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(rope_parameters=YARN)),
        "gemma": (tf.GemmaConfig, tf.GemmaForCausalLM, dict(head_dim=24)),
        "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM,
                   dict(head_dim=24, sliding_window=WINDOW, query_pre_attn_scalar=20,
                        attn_logit_softcapping=5.0, final_logit_softcapping=3.0)),
        "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM,
                   dict(head_dim=24, sliding_window=WINDOW, query_pre_attn_scalar=20,
                        layer_types=["sliding_attention", "sliding_attention",
                                     "full_attention", "sliding_attention"],
                        rope_parameters={
                            "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                            "full_attention": {"rope_type": "linear", "factor": 2.0,
                                               "rope_theta": 100000.0}})),
        "phi3-window": (tf.Phi3Config, tf.Phi3ForCausalLM, dict(sliding_window=WINDOW)),
        "phi4-mini-longrope": (tf.Phi3Config, tf.Phi3ForCausalLM,
                               dict(rope_parameters={**LONGROPE, "partial_rotary_factor": 0.75},
                                    original_max_position_embeddings=ORIGINAL_CONTEXT)),
        "olmo2": (tf.Olmo2Config, tf.Olmo2ForCausalLM, {}),
        "granite": (tf.GraniteConfig, tf.GraniteForCausalLM,
                    dict(embedding_multiplier=6.0, residual_multiplier=0.4,
                         attention_multiplier=0.1, logits_scaling=2.5)),
        "smollm3": (tf.SmolLM3Config, tf.SmolLM3ForCausalLM, dict(no_rope_layer_interval=2)),
        # mixtures of experts (intermediate_size is each expert's unless the family splits it)
        "mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM,
                    dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
                         intermediate_size=48)),
        "qwen2-moe": (tf.Qwen2MoeConfig, tf.Qwen2MoeForCausalLM,
                      dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                           shared_expert_intermediate_size=48, norm_topk_prob=False,
                           mlp_only_layers=[1])),
        "qwen3-moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM,
                      dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                           norm_topk_prob=True, head_dim=24)),
        "olmoe": (tf.OlmoeConfig, tf.OlmoeForCausalLM,
                  dict(num_experts=4, num_experts_per_tok=1, intermediate_size=48)),
        "gpt-oss": (tf.GptOssConfig, tf.GptOssForCausalLM,
                    dict(num_local_experts=4, num_experts_per_tok=2, head_dim=16,
                         sliding_window=WINDOW, intermediate_size=48,
                         layer_types=["sliding_attention", "full_attention"] * 2,
                         rope_parameters={**YARN, "rope_theta": 150000.0,
                                          "beta_fast": 32.0, "beta_slow": 1.0,
                                          "truncate": False})),
        # DeepSeek's latent attention and MoE; GLM-4.5's MoE (MoE from the second layer on)
        "deepseek-v2-lite": (tf.DeepseekV2Config, tf.DeepseekV2ForCausalLM,
                             dict(DEEPSEEK_MLA, q_lora_rank=None, head_dim=16,
                                  n_routed_experts=8, num_experts_per_tok=2,
                                  topk_method="greedy",
                                  rope_parameters={**YARN, "mscale": 0.707,
                                                   "mscale_all_dim": 0.707})),
        "deepseek-v3": (tf.DeepseekV3Config, tf.DeepseekV3ForCausalLM,
                        dict(DEEPSEEK_MLA, q_lora_rank=48, n_routed_experts=8,
                             num_experts_per_tok=2, n_group=4, topk_group=2,
                             routed_scaling_factor=2.5, norm_topk_prob=True,
                             rope_parameters={**YARN, "mscale": 1.0, "mscale_all_dim": 1.0,
                                              "beta_fast": 32.0, "beta_slow": 1.0})),
        "glm4-moe": (tf.Glm4MoeConfig, tf.Glm4MoeForCausalLM,
                     dict(head_dim=16, attention_bias=True, use_qk_norm=True,
                          n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                          moe_intermediate_size=32, n_shared_experts=1,
                          first_k_dense_replace=1, routed_scaling_factor=1.5,
                          norm_topk_prob=True,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                           "partial_rotary_factor": 0.5})),
    }


def tiny_names() -> list[str]:
    """The dense families' checkpoints."""
    return ["mistral-window", "qwen2-window", "llama-yarn", "gemma", "gemma2", "gemma3",
            "phi3-window", "phi4-mini-longrope", "olmo2", "granite", "smollm3"]


def tiny_moe_names() -> list[str]:
    """The mixture-of-experts families' checkpoints."""
    return ["mixtral", "qwen2-moe", "qwen3-moe", "olmoe", "gpt-oss", "deepseek-v2-lite",
            "deepseek-v3", "glm4-moe"]


def build_config(name: str, vocab_size: int, bos: int = 1, eos: int = 2) -> Any:
    """The transformers config of the tiny `name` model."""
    config_cls, _, extra = _configs()[name]
    special = dict(vocab_size=vocab_size, bos_token_id=bos, eos_token_id=eos, pad_token_id=eos)
    return config_cls(**{**TINY, **special, **extra})


def build_tiny(name: str, folder: Path, tokenizer: Any, seed: int = 0) -> Any:
    """Save the tiny `name` checkpoint (config.json, safetensors, tokenizer) in folder and
    return the transformers model (float32, eval mode) that holds the same weights."""
    config = build_config(name, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model = _configs()[name][1](config).eval()
    # RMSNorm by (1 + w) in Gemma: w near 0
    randomize_weights(model, 0.0 if name.startswith("gemma") else 1.0, sinks_std=1.0)
    with torch.no_grad():  # DeepSeek-V3's balancing bias is a buffer: drawn too
        for bname, buf in model.named_buffers():
            if bname.endswith("e_score_correction_bias"):
                buf.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def randomize_weights(model: Any, norm_center: float = 1.0,
                      sinks_std: float | None = None) -> None:
    """Non-trivial weights, drawn in parameter order from torch's global generator: norms
    norm_center + N(0, 0.2), biases N(0, 0.3), attention sinks N(0, sinks_std) where given,
    the rest N(0, 0.15)."""
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if pname.endswith("norm.weight"):
                param.copy_(norm_center + 0.2 * torch.randn_like(param))
            elif sinks_std is not None and pname.endswith("sinks"):
                param.normal_(0.0, sinks_std)
            else:
                param.normal_(0.0, 0.3 if pname.endswith(".bias") else 0.15)


def hf_logprobs(model: Any, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab] float32 log-probabilities of transformers' forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def cached_scorer(model: Any) -> Callable[[list[int]], torch.Tensor]:
    cache: dict[tuple[int, ...], torch.Tensor] = {}

    def score(ids: list[int]) -> torch.Tensor:
        if tuple(ids) not in cache:
            cache[tuple(ids)] = hf_logprobs(model, ids)
        return cache[tuple(ids)]

    return score
