"""What llama.cpp's converter writes for the mixture-of-experts architectures, and what llama.cpp
hard-codes for them instead, read back into config.json fields (the tables are in
models/gguf_archs.py, the stacked expert tensors are read by models/gguf_experts.py).

- Mixtral is written as `llama` with `llama.expert_count` / `expert_used_count`; its expert size
  is `feed_forward_length`. Qwen2-MoE (`qwen2moe`, with a shared expert of
  `expert_shared_feed_forward_length`), Qwen3-MoE (`qwen3moe`) and gpt-oss (`gpt-oss`) write
  `expert_feed_forward_length`; OLMoE (`olmoe`) uses `feed_forward_length`. Where a Qwen file
  lacks the key, llama.cpp takes n_ff / n_expert_used (and n_ff for the shared expert), as here.
- The routing is not in the file: llama.cpp's graph builders pass it to build_moe_ffn
  themselves. All take a softmax over the experts; the top-k weights are renormalised for
  Mixtral (src/models/llama.cpp) and Qwen3-MoE, not for Qwen2-MoE and OLMoE (whatever the HF
  config's norm_topk_prob was); gpt-oss takes the top-k logits, then a softmax over them
  (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT) and runs its experts with the clamped SwiGLU
  (ggml_swiglu_oai, alpha 1.702 and limit 7 hard-coded). A file whose expert_weights_norm or
  expert_gating_func says otherwise is refused: llama.cpp would ignore the key, the model's
  config said something else, and either reading could be wrong.
- gpt-oss: every other layer slides (set_swa_pattern(2), layer 0 sliding, as HF's layer_types)
  over `attention.sliding_window`; YaRN from the generic keys, but without truncating the
  correction range, as gpt-oss's config asks (`truncate: false`) and OpenAI's reference does.
  llama.cpp's ggml_rope_yarn_corr_dims always floors / ceils it, so for this one model we
  follow the model rather than llama.cpp (the two differ slightly in a few frequencies).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from radixrt.runtime.models.gguf_meta import ArchMeta, sliding_layers

# llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE values (expert_gating_func)
GATING_SOFTMAX = 1
GATING_SOFTMAX_WEIGHT = 3
GPT_OSS_SWIGLU_ALPHA = 1.702  # ggml_swiglu_oai's constants in llama.cpp's build_ffn
GPT_OSS_SWIGLU_LIMIT = 7.0
GPT_OSS_SLIDING_PATTERN = 2  # set_swa_pattern(2): even layers slide

MOE_ROUTER = {"ffn_gate_inp": "mlp.gate"}  # the router (HF's gate; gpt-oss's router, renamed)
SHARED_EXPERT = {  # Qwen2-MoE's shared expert and its sigmoid gate
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# gpt-oss's pre-MoE norm is HF's post_attention_layernorm, which gguf-py maps to
# attn_post_norm (written "post_attention_norm"), not to ffn_norm
GPT_OSS_NORMS = {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm"}
# per-layer tensors whose HF parameter has no .weight suffix: GGUF "part.suffix" -> HF name
GPT_OSS_TENSORS = {"attn_sinks.weight": "self_attn.sinks"}
MOE_FEATURE_KEYS = frozenset({"expert_count"})


@dataclass(frozen=True)
class Routing:
    """What llama.cpp's builder passes to build_moe_ffn: whether the top-k weights are
    renormalised (None: it makes no difference, the softmax is over the top k) and the gating."""

    renormalize: bool | None
    gating: int = GATING_SOFTMAX


MIXTRAL_ROUTING = Routing(renormalize=True)
QWEN2MOE_ROUTING = Routing(renormalize=False)
QWEN3MOE_ROUTING = Routing(renormalize=True)
OLMOE_ROUTING = Routing(renormalize=False)
GPT_OSS_ROUTING = Routing(renormalize=None, gating=GATING_SOFTMAX_WEIGHT)


def _experts(m: ArchMeta, routing: Routing) -> tuple[int, int]:
    """(expert_count, expert_used_count), the file's routing keys checked against llama.cpp's
    hard-coded routing."""
    norm = m.get("expert_weights_norm")
    if norm is not None and routing.renormalize is not None and bool(norm) != routing.renormalize:
        raise ValueError(f"this {m.arch} GGUF sets {m.arch}.expert_weights_norm={norm!r}, but "
                         f"llama.cpp runs {m.arch} with it {routing.renormalize} whatever the "
                         "file says: which one the model needs is unknown, not supported")
    gating = m.get("expert_gating_func")
    if gating is not None and int(gating) != routing.gating:
        raise ValueError(f"this {m.arch} GGUF sets {m.arch}.expert_gating_func={gating!r}; "
                         f"llama.cpp runs {m.arch} with gating {routing.gating}: not supported")
    count, used = m.integer("expert_count"), m.integer("expert_used_count")
    if not 1 <= used <= count:
        raise ValueError(f"the GGUF's {m.arch}.expert_used_count={used} must be within "
                         f"1..expert_count={count}")
    return count, used


def read_mixtral(meta: ArchMeta, cfg: dict[str, Any]) -> dict[str, Any]:
    count, used = _experts(meta, MIXTRAL_ROUTING)
    return {"num_local_experts": count, "num_experts_per_tok": used}


def _qwen_expert_size(meta: ArchMeta, cfg: Mapping[str, Any], used: int) -> int:
    """llama.cpp: n_ff_exp = expert_feed_forward_length, else n_ff / n_expert_used."""
    return meta.integer("expert_feed_forward_length", cfg["intermediate_size"] // used)


def read_qwen2moe(meta: ArchMeta, cfg: dict[str, Any]) -> dict[str, Any]:
    count, used = _experts(meta, QWEN2MOE_ROUTING)
    shared = meta.integer("expert_shared_feed_forward_length", cfg["intermediate_size"])
    return {"num_experts": count, "num_experts_per_tok": used,
            "moe_intermediate_size": _qwen_expert_size(meta, cfg, used),
            "shared_expert_intermediate_size": shared,
            "norm_topk_prob": QWEN2MOE_ROUTING.renormalize,
            "qkv_bias": cfg["attention_bias"]}


def read_qwen3moe(meta: ArchMeta, cfg: dict[str, Any]) -> dict[str, Any]:
    count, used = _experts(meta, QWEN3MOE_ROUTING)
    return {"num_experts": count, "num_experts_per_tok": used,
            "moe_intermediate_size": _qwen_expert_size(meta, cfg, used),
            "norm_topk_prob": QWEN3MOE_ROUTING.renormalize}


def read_olmoe(meta: ArchMeta, cfg: dict[str, Any]) -> dict[str, Any]:
    count, used = _experts(meta, OLMOE_ROUTING)
    return {"num_experts": count, "num_experts_per_tok": used,
            "norm_topk_prob": OLMOE_ROUTING.renormalize}


def read_gpt_oss(meta: ArchMeta, cfg: dict[str, Any]) -> dict[str, Any]:
    count, used = _experts(meta, GPT_OSS_ROUTING)
    out: dict[str, Any] = {
        "num_local_experts": count, "num_experts_per_tok": used,
        "intermediate_size": meta.integer("expert_feed_forward_length"),
        "sliding_window": meta.integer("attention.sliding_window"),
        "layer_types": sliding_layers(cfg["num_hidden_layers"], GPT_OSS_SLIDING_PATTERN),
        "swiglu_alpha": GPT_OSS_SWIGLU_ALPHA, "swiglu_limit": GPT_OSS_SWIGLU_LIMIT,
    }
    scaling = cfg.get("rope_scaling")
    if scaling is not None and scaling.get("rope_type") == "yarn":
        out["rope_scaling"] = {**scaling, "truncate": False}
    return out
