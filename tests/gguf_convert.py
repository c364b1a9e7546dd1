"""A GGUF written from a tiny transformers model the way llama.cpp's convert_hf_to_gguf.py writes
it, for tests/runtime/models/test_gguf_loader.py: the metadata keys of each architecture's converter
class, llama.cpp's tensor names (gguf-py's own TensorNameMap), the Q/K row permutation of LlamaModel
subclasses, Gemma's norms stored as w + 1, Phi-3's fused tensors and LongRoPE factor tensors, the
experts stacked per layer (gpt-oss's de-interleaved and transposed; optionally fused gate / up as
--fuse-gate-up-exps writes them; optionally MXFP4 as real gpt-oss files hold them), DeepSeek's
kv_b_proj split per head (or whole, as earlier converters wrote it) and GLM-4.5's
multi-token-prediction layer, plus a minimal byte-level tokenizer (and the same vocabulary as a
transformers tokenizer, for tiny_models.build_tiny)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from torch import Tensor

EOT_TOKEN = 3  # written for Gemma, as llama.cpp's converter does (<end_of_turn>)
TOKENS = [chr(c) for c in range(33, 127)] + ["\u0120", "\u0120\u0120"]  # byte-level BPE
DEEPSEEK_MOE = ("deepseek2", "glm4moe")  # written by write_deepseek_metadata
_ARCH_ENUMS = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}
MXFP4 = gguf.GGMLQuantizationType.MXFP4


def converter_permute(w: Tensor, n_head: int) -> Tensor:
    """LlamaModel.permute: rotate-half pairs of each head -> llama.cpp's interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def converter_tensors(model: Any, arch: str, fuse_gate_up: bool = False,
                      earlier: bool = False) -> list[tuple[str, Tensor]]:
    """The model's tensors under llama.cpp's names, transformed as the converter does (earlier:
    DeepSeek's kv_b_proj whole, as converters before llama.cpp's absorbed MLA wrote it)."""
    cfg = model.config
    name_map = gguf.get_tensor_name_map(_ARCH_ENUMS[arch], cfg.num_hidden_layers)
    out = []
    for name, tensor in model.state_dict().items():
        if arch.startswith("gemma") and name == "lm_head.weight":
            continue  # GemmaModel's filter: the head is the embedding
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        tensor = tensor.detach().float().clone()
        if ".mlp.experts." in name:
            out += expert_tensors(name, tensor, arch, fuse_gate_up)
            continue
        if name.endswith("e_score_correction_bias"):  # DeepseekV2Model / Glm4MoeModel
            name = name.replace("e_score_correction_bias", "e_score_correction.bias")
        if arch == "deepseek2" and not earlier and name.endswith("kv_b_proj.weight"):
            out += split_kv_b(name, tensor, cfg)
            continue
        if arch in ("llama", "granite", "smollm3"):  # LlamaModel subclasses: undo_permute
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                tensor = converter_permute(tensor, cfg.num_attention_heads)
            elif name.endswith(("k_proj.weight", "k_proj.bias")):
                tensor = converter_permute(tensor, cfg.num_key_value_heads)
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            tensor = tensor + 1
        if name.endswith(".sinks"):  # GptOssModel.filter_tensors
            name += ".weight"
        new_name = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new_name is not None, name
        out.append((new_name, tensor))
    return out


def expert_tensors(name: str, tensor: Tensor, arch: str,
                   fuse_gate_up: bool) -> list[tuple[str, Tensor]]:
    """One layer's experts as the converter stacks them: [E, inter, hidden] gate and up,
    [E, hidden, inter] down. transformers >= 5 holds them stacked already (gate_up_proj
    [E, 2 * inter, hidden], gate rows then up rows: the same values as the converter's
    torch.stack of each expert's gate_proj / up_proj); gpt-oss's gate_up_proj [E, hidden,
    2 * inter] alternates gate and up by column, which GptOssModel.modify_tensors
    de-interleaves and transposes (and the same for its biases)."""
    layer, kind = int(name.split(".")[2]), name.rsplit(".", 1)[1]
    blk = f"blk.{layer}"
    if kind in ("down_proj", "down_proj_bias"):
        suffix = "bias" if kind.endswith("_bias") else "weight"
        down = tensor.transpose(-1, -2) if arch == "gpt-oss" and suffix == "weight" else tensor
        return [(f"{blk}.ffn_down_exps.{suffix}", down.contiguous())]
    if kind == "gate_up_proj_bias":
        gate, up, dim, suffix = tensor[..., ::2], tensor[..., 1::2], -1, "bias"
    elif arch == "gpt-oss":
        both = tensor.transpose(-1, -2)
        gate, up, dim, suffix = both[:, ::2], both[:, 1::2], 1, "weight"
    else:
        gate, up = tensor.chunk(2, dim=1)
        dim, suffix = 1, "weight"
    if fuse_gate_up:  # --fuse-gate-up-exps: gate, then up
        return [(f"{blk}.ffn_gate_up_exps.{suffix}", torch.cat([gate, up], dim=dim))]
    return [(f"{blk}.ffn_gate_exps.{suffix}", gate.contiguous()),
            (f"{blk}.ffn_up_exps.{suffix}", up.contiguous())]


def split_kv_b(name: str, tensor: Tensor, cfg: Any) -> list[tuple[str, Tensor]]:
    """DeepseekV2Model.modify_tensors: kv_b_proj [heads * (nope + v), rank] viewed per head and
    split, k_b transposed: attn_k_b [heads, rank, nope], attn_v_b [heads, v, rank]."""
    nope, v = cfg.qk_nope_head_dim, cfg.v_head_dim
    kv_b = tensor.view(cfg.num_key_value_heads, nope + v, tensor.shape[-1])
    k_b, v_b = torch.split(kv_b, [nope, v], dim=1)
    blk = f"blk.{name.split('.')[2]}"
    return [(f"{blk}.attn_k_b.weight", k_b.transpose(1, 2).contiguous()),
            (f"{blk}.attn_v_b.weight", v_b.contiguous())]


def mtp_tensors(tensors: list[tuple[str, Tensor]], cfg: Any) -> list[tuple[str, Tensor]]:
    """GLM-4.5's multi-token-prediction layer, which transformers does not build: Glm4MoeModel
    writes it as one more block (a decoder layer, here the last one's weights, and its nextn.*
    tensors)."""
    last, hidden = cfg.num_hidden_layers - 1, cfg.hidden_size
    out = [(name.replace(f"blk.{last}.", f"blk.{last + 1}.", 1), tensor.clone())
           for name, tensor in tensors if name.startswith(f"blk.{last}.")]
    draw = torch.Generator().manual_seed(0)
    nextn = {"eh_proj": torch.randn(hidden, 2 * hidden, generator=draw),
             "enorm": torch.ones(hidden), "hnorm": torch.ones(hidden),
             "shared_head_norm": torch.ones(hidden)}
    return out + [(f"blk.{last + 1}.nextn.{part}.weight", t) for part, t in nextn.items()]


def _rope_params(cfg: Any) -> dict[str, Any]:
    params = dict(cfg.rope_parameters or {})
    return dict(params.get("full_attention", params))


def write_metadata(w: gguf.GGUFWriter, cfg: Any, arch: str, earlier: bool = False) -> None:
    """set_gguf_parameters of the converter's model class for this architecture."""
    if arch in DEEPSEEK_MOE:
        write_deepseek_metadata(w, cfg, arch, earlier)
        return
    rope = _rope_params(cfg)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    head_dim = getattr(cfg, "head_dim", None) if arch != "granite" else None
    if head_dim:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch in ("gemma", "gemma2"):  # GemmaModel / Gemma2Model write no RoPE base
        if arch == "gemma2":
            w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
            w.add_final_logit_softcapping(cfg.final_logit_softcapping)
            w.add_sliding_window(cfg.sliding_window)
        return
    w.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if arch in ("llama", "granite", "smollm3"):
        w.add_vocab_size(cfg.vocab_size)
        w.add_rope_dimension_count(head_dim or cfg.hidden_size // cfg.num_attention_heads)
    if arch == "gemma3":
        w.add_sliding_window(cfg.sliding_window)
    if arch == "granite":
        w.add_attention_scale(cfg.attention_multiplier)
        w.add_embedding_scale(cfg.embedding_multiplier)
        w.add_residual_scale(cfg.residual_multiplier)
        w.add_logit_scale(cfg.logits_scaling)
    if rope.get("rope_type") == "yarn":  # TextModel.set_gguf_parameters
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    write_moe_metadata(w, cfg, arch)
    if arch == "phi3":
        w.add_rope_scaling_orig_ctx_len(cfg.original_max_position_embeddings)
        w.add_rope_dimension_count(int(cfg.partial_rotary_factor * cfg.hidden_size)
                                   // cfg.num_attention_heads)
        w.add_sliding_window(cfg.sliding_window or 0)


def write_moe_metadata(w: gguf.GGUFWriter, cfg: Any, arch: str) -> None:
    """TextModel's expert_count / expert_used_count, and what Qwen2MoeModel (Qwen3MoeModel)
    and GptOssModel add."""
    experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
    if not experts:
        return
    w.add_expert_count(experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    if arch in ("qwen2moe", "qwen3moe"):
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    if arch == "gpt-oss":
        w.add_sliding_window(cfg.sliding_window)
        w.add_expert_feed_forward_length(cfg.intermediate_size)


def write_deepseek_metadata(w: gguf.GGUFWriter, cfg: Any, arch: str, earlier: bool) -> None:
    """TextModel.set_gguf_parameters, then DeepseekV2Model's or Glm4MoeModel's. earlier: as
    converters before llama.cpp's absorbed MLA wrote deepseek2 (a V2-era file: the heads' sizes
    as key / value_length, head_count_kv = heads, no group keys, the gating only for V3)."""
    rope = _rope_params(cfg)
    mtp = cfg.num_nextn_predict_layers if arch == "glm4moe" else 0  # DeepSeek's: skipped
    w.add_block_count(cfg.num_hidden_layers + mtp)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    latent = arch == "deepseek2" and not earlier
    w.add_head_count_kv(1 if latent else cfg.num_key_value_heads)  # MLA as MQA
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        for key, add in (("beta_fast", w.add_rope_scaling_yarn_beta_fast),
                         ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):
            if key in rope and not earlier:
                add(rope[key])
    w.add_expert_count(cfg.n_routed_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    if cfg.n_group is not None and not earlier:
        w.add_expert_group_count(cfg.n_group)
        w.add_expert_group_used_count(cfg.topk_group)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    w.add_expert_shared_count(cfg.n_shared_experts)
    w.add_leading_dense_block_count(cfg.first_k_dense_replace)
    w.add_expert_weights_scale(cfg.routed_scaling_factor)
    if arch == "glm4moe":
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
        w.add_rope_dimension_count(int(cfg.head_dim * rope.get("partial_rotary_factor", 0.5)))
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_weights_norm(cfg.norm_topk_prob)
        w.add_nextn_predict_layers(mtp)
        return
    # DeepSeek's config.json says scoring_func (sigmoid for V3); transformers' config drops it
    v3 = cfg.model_type == "deepseek_v3"
    nope, rope_dim, rank = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
    w.add_vocab_size(cfg.vocab_size)
    if cfg.q_lora_rank is not None:
        w.add_q_lora_rank(cfg.q_lora_rank)
    w.add_kv_lora_rank(rank)
    if latent:
        w.add_key_length(rank + rope_dim)
        w.add_value_length(rank)
        w.add_key_length_mla(nope + rope_dim)
        w.add_value_length_mla(cfg.v_head_dim)
    else:
        w.add_key_length(nope + rope_dim)
        w.add_value_length(cfg.v_head_dim)
    if v3 or not earlier:
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if v3
                                 else gguf.ExpertGatingFuncType.SOFTMAX)
    if cfg.norm_topk_prob:
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(rope_dim)
    if rope.get("mscale_all_dim") is not None:
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])


def extra_tensors(cfg: Any, arch: str) -> list[tuple[str, Tensor]]:
    """generate_extra_tensors: Llama 3.1's rope_freqs, Phi-3's LongRoPE factors (and the
    attention factor it writes beside them)."""
    rope = _rope_params(cfg)
    if rope.get("rope_type") == "llama3":
        dim = cfg.head_dim
        base, factor = rope["rope_theta"], rope["factor"]
        low, high = rope["low_freq_factor"], rope["high_freq_factor"]
        old = rope["original_max_position_embeddings"]
        factors = []
        for i in range(0, dim, 2):
            wavelen = 2 * math.pi * base ** (i / dim)
            if wavelen < old / high:
                factors.append(1.0)
            elif wavelen > old / low:
                factors.append(factor)
            else:
                smooth = (old / wavelen - low) / (high - low)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        return [("rope_freqs.weight", torch.tensor(factors))]
    if arch == "phi3":
        return [("rope_factors_long.weight", torch.tensor(rope["long_factor"])),
                ("rope_factors_short.weight", torch.tensor(rope["short_factor"]))]
    return []


def write_tokenizer(w: gguf.GGUFWriter, arch: str) -> None:
    """A byte-level BPE vocabulary of 96 tokens: printable ASCII, a space, two spaces."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(TOKENS)
    w.add_token_types([gguf.TokenType.NORMAL] * len(TOKENS))
    w.add_token_merges(["\u0120 \u0120"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    if arch.startswith("gemma"):
        w.add_eot_token_id(EOT_TOKEN)


def tiny_tokenizer() -> Any:
    """write_tokenizer's vocabulary as a transformers tokenizer (bos 0, eos 1), to build a tiny
    model of that vocabulary with tiny_models.build_tiny."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(TOKENS)},
                                   merges=[("\u0120", "\u0120")]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=TOKENS[0],
                                   eos_token=TOKENS[1])


def write_gguf(path: Path, model: Any, arch: str,
               edit: Callable[[gguf.GGUFWriter], None] | None = None,
               fuse_gate_up: bool = False, mxfp4_experts: bool = False,
               squeeze: bool = False,
               quantize: gguf.GGMLQuantizationType | None = None,
               earlier: bool = False) -> None:
    """squeeze: every tensor squeezed, as an earlier convert_hf_to_gguf.py wrote them (its
    prepare_tensors keeps the call commented out now): Qwen2-MoE's shared-expert gate [hidden].
    quantize: every 2-D weight (and DeepSeek's per-head attn_k_b / attn_v_b) whose rows are
    whole blocks written in that type by gguf-py's quantizer, the token embedding in Q8_0 (as
    llama.cpp's quantize leaves it at low bit widths); norms, 1-D tensors and rows of odd
    lengths stay float32. earlier: deepseek2 as converters before llama.cpp's absorbed MLA
    wrote it (write_deepseek_metadata)."""
    w = gguf.GGUFWriter(str(path), arch)
    write_metadata(w, model.config, arch, earlier)
    if arch == "phi3":
        cfg = model.config
        scale = cfg.max_position_embeddings / cfg.original_max_position_embeddings
        orig = cfg.original_max_position_embeddings
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)))
    write_tokenizer(w, arch)
    if edit is not None:
        edit(w)
    tensors = converter_tensors(model, arch, fuse_gate_up, earlier)
    if arch == "glm4moe":
        tensors += mtp_tensors(tensors, model.config)
    for name, tensor in tensors + extra_tensors(model.config, arch):
        data = (tensor.squeeze() if squeeze else tensor).numpy().astype(np.float32)
        per_head = name.endswith(("attn_k_b.weight", "attn_v_b.weight"))
        if mxfp4_experts and name.endswith("_exps.weight"):
            w.add_tensor(name, gguf.quants.quantize(data, MXFP4), raw_dtype=MXFP4)
        elif quantize is not None and (data.ndim == 2 or per_head) and "norm" not in name:
            qtype = gguf.GGMLQuantizationType.Q8_0 if name == "token_embd.weight" else quantize
            if data.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0:
                w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
            else:
                w.add_tensor(name, data)
        else:
            w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def mxfp4_values(t: Tensor) -> Tensor:
    """t's values once quantized to MXFP4 along its last dimension, as gguf-py dequantizes."""
    quantized = gguf.quants.quantize(t.contiguous().numpy(), MXFP4)
    return torch.from_numpy(gguf.quants.dequantize(quantized, MXFP4))


def round_experts_to_mxfp4(model: Any) -> None:
    """Give a gpt-oss model's expert weights their MXFP4 values as a GGUF holds them (blocks of
    32 along the converter's rows, hidden for gate / up, inter for down); writing them as
    MXFP4 again gives the same values."""
    with torch.no_grad():
        for layer in model.model.layers:
            for param in (layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj):
                param.copy_(mxfp4_values(param.transpose(-1, -2)).transpose(-1, -2))
