"""What llama.cpp's converter (convert_hf_to_gguf.py) writes for the DeepSeek-MoE architectures,
read back into config.json fields and HF tensor names (their table entries are in
models/gguf_archs.py): `deepseek2` (DeepSeek-V2, V2-Lite, V3, Kimi K2: multi-head latent
attention, models/mla.py) and `glm4moe` (GLM-4.5 / 4.6: GQA with a partial rotary embedding and
DeepSeek-V3's MoE). llama.cpp runs them in src/models/deepseek2.cpp and glm4-moe.cpp.

deepseek2 (the converter's DeepseekV2Model):
- kv_b_proj is written in one of two ways. Earlier converters wrote it whole (`attn_kv_b`
  [heads * (nope + v), kv_lora_rank]) with `attention.key_length` = nope + rope and
  `value_length` = v (and head_count_kv = heads). Since llama.cpp's absorbed MLA, it is split
  per head: `attn_k_b` [heads, kv_lora_rank, nope] (each head's nope rows, transposed) and
  `attn_v_b` [heads, v, kv_lora_rank]; key_length / value_length are then the latent cache's
  (kv_lora_rank + rope, kv_lora_rank), head_count_kv 1, and the heads' sizes are in
  `key_length_mla` / `value_length_mla`. Either reads back as HF's kv_b_proj (SplitKVB
  re-assembles the split one); it loads as floats whatever the file's type (models/mla.py).
- No rope permutation: llama.cpp runs deepseek2 with its NORM rope (pairs 2i, 2i + 1), which is
  DeepSeek's interleaved rotary, so q and kv_a_proj_with_mqa are written as HF has them.
- V2-Lite has no query compression: `attn_q`, and no `attention.q_lora_rank`.
- The routing is in the file, and llama.cpp honours it: expert_gating_func (1 softmax: V2; 2
  sigmoid: V3; absent: softmax, as llama.cpp reads V2 / V2.5 files), the correction bias
  `exp_probs_b.bias` (V3), expert_weights_norm (absent: false), expert_weights_scale
  (routed_scaling_factor) and expert_group_count / expert_group_used_count (n_group /
  topk_group; a file without them routes without groups, as llama.cpp runs it). A sigmoid file
  reads as DeepseekV3ForCausalLM, a softmax one as V2 (its topk_method group_limited_greedy
  where it has groups). There we follow DeepSeek-V2, whose groups compete by their best
  expert; llama.cpp's build_moe_ffn scores every group by its two best, as V3 does.
- YaRN: the converter writes 0.1 * mscale_all_dim as `rope.scaling.yarn_log_multiplier`, not
  mscale; llama.cpp runs with mscale = mscale_all_dim (the rotary unscaled, the softmax scale
  times yarn_mscale(factor, mscale_all_dim) squared), as every released DeepSeek config has it.
- Its multi-token-prediction layers are not written (skip_mtp).

glm4moe (Glm4MoeModel):
- block_count counts the multi-token-prediction layer(s) too (`nextn_predict_layers`, written
  whole with their `nextn.*` tensors): the model is the first block_count - nextn layers, the
  rest is not loaded (llama.cpp's graph skips them as well).
- NEOX rope (rotate-half, as HF's) over rope.dimension_count = a part of head_dim, no
  permutation; the pre-MoE norm is HF's post_attention_layernorm, written post_attention_norm
  (gguf-py's ATTN_POST_NORM for this architecture); q / k norms where the model has them.
- Sigmoid gating with exp_probs_b always; the other routing keys as deepseek2's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from radixrt.runtime.models.gguf_file import GGUFFile
from radixrt.runtime.models.gguf_meta import ArchMeta
from radixrt.runtime.models.gguf_moe import GATING_SOFTMAX, MOE_FEATURE_KEYS
from radixrt.runtime.models.model_config import ModelConfig

GATING_SIGMOID = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
YARN_LOG_MUL_SCALE = 0.1  # the converter writes yarn_log_multiplier = 0.1 * mscale_all_dim
KV_B_PARTS = ("attn_k_b", "attn_v_b")  # the split kv_b_proj

_NORMS = {"attn_norm": "input_layernorm"}
_DENSE_MLP = {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_DEEPSEEK_MOE = {  # + the routed experts (gguf_experts.py) and EXPERT_BIAS
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
    "ffn_up_shexp": "mlp.shared_experts.up_proj",
    "ffn_down_shexp": "mlp.shared_experts.down_proj",
}
DEEPSEEK2_LAYERS = {
    **_NORMS, "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",  # V2-Lite (the family loads it as q_b_proj)
    "attn_q_a": "self_attn.q_a_proj",
    "attn_q_a_norm": "self_attn.q_a_layernorm",
    "attn_q_b": "self_attn.q_b_proj",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
    "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_kv_b": "self_attn.kv_b_proj",  # or split: KV_B_PARTS, read by split_kv_b
    "attn_output": "self_attn.o_proj",
    **_DENSE_MLP, **_DEEPSEEK_MOE,
}
GLM4MOE_LAYERS = {
    **_NORMS, "post_attention_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    **_DENSE_MLP, **_DEEPSEEK_MOE,
}
# V3's correction bias: the converter renames e_score_correction_bias to e_score_correction.bias
EXPERT_BIAS = {"exp_probs_b.bias": "mlp.gate.e_score_correction_bias"}
DEEPSEEK_FEATURE_KEYS = MOE_FEATURE_KEYS | {
    "expert_shared_count", "expert_group_count", "expert_group_used_count",
    "expert_weights_scale", "leading_dense_block_count",
}


def _main_layers(m: ArchMeta) -> int:
    """The decoder's layers: block_count less the multi-token-prediction ones."""
    layers = m.integer("block_count") - m.integer("nextn_predict_layers", 0)
    if layers < 1:
        raise ValueError(f"the GGUF's {m.arch}.block_count leaves no layer before its "
                         "multi-token-prediction ones")
    return layers


def _moe_fields(m: ArchMeta) -> dict[str, Any]:
    """DeepSeek-MoE's config.json fields from the file's routing keys."""
    count, used = m.integer("expert_count"), m.integer("expert_used_count")
    if not 1 <= used <= count:
        raise ValueError(f"the GGUF's {m.arch}.expert_used_count={used} must be within "
                         f"1..expert_count={count}")
    return {
        "n_routed_experts": count,
        "num_experts_per_tok": used,
        "moe_intermediate_size": m.integer("expert_feed_forward_length"),
        "n_shared_experts": m.integer("expert_shared_count", 0),
        "first_k_dense_replace": m.integer("leading_dense_block_count", 0),
        "routed_scaling_factor": float(m.get("expert_weights_scale") or 1.0),
        "norm_topk_prob": bool(m.get("expert_weights_norm", False)),
        "n_group": m.integer("expert_group_count", 1) or 1,
        "topk_group": m.integer("expert_group_used_count", 1) or 1,
    }


def _gating(m: ArchMeta, default: int) -> int:
    """The file's gating (default where it has none, as llama.cpp reads it), which must come
    with the correction bias exactly when it is sigmoid."""
    gating = int(m.get("expert_gating_func") or default)
    if gating not in (GATING_SOFTMAX, GATING_SIGMOID):
        raise ValueError(f"this {m.arch} GGUF sets {m.arch}.expert_gating_func={gating}: only "
                         f"softmax ({GATING_SOFTMAX}) and sigmoid ({GATING_SIGMOID}) are "
                         "supported")
    bias = m.has_tensor(".exp_probs_b.bias")
    if bias != (gating == GATING_SIGMOID):
        kind = "sigmoid" if gating == GATING_SIGMOID else "softmax"
        raise ValueError(f"this {m.arch} GGUF has {'a' if bias else 'no'} correction bias "
                         f"(exp_probs_b) with {kind} gating: radixrt routes sigmoid with it "
                         "and softmax without, not supported")
    return gating


def _head_sizes(m: ArchMeta, rank: int, rope: int) -> tuple[int, int]:
    """(qk, v) head sizes: key_length_mla / value_length_mla where the file has them (its
    key_length / value_length are then the latent cache's), else key_length / value_length."""
    if m.get("attention.key_length_mla") is None:
        return m.integer("attention.key_length"), m.integer("attention.value_length")
    latent = (m.integer("attention.key_length", rank + rope),
              m.integer("attention.value_length", rank))
    if latent != (rank + rope, rank):
        raise ValueError(f"the GGUF's {m.arch}.attention.key_length / value_length {latent} "
                         f"are not the latent cache's ({rank + rope}, {rank})")
    return m.integer("attention.key_length_mla"), m.integer("attention.value_length_mla")


def read_deepseek2(m: ArchMeta, cfg: dict[str, Any]) -> dict[str, Any]:
    rank, rope = m.integer("attention.kv_lora_rank"), m.integer("rope.dimension_count")
    qk, v = _head_sizes(m, rank, rope)
    if not 0 < rope < qk:
        raise ValueError(f"the GGUF's rotary part ({rope}) must be within its key heads ({qk})")
    moe = _moe_fields(m)
    v3 = _gating(m, GATING_SOFTMAX) == GATING_SIGMOID
    grouped = moe["n_group"] > 1
    out: dict[str, Any] = {
        **moe,
        "architectures": ["DeepseekV3ForCausalLM" if v3 else "DeepseekV2ForCausalLM"],
        "num_hidden_layers": _main_layers(m),
        "num_key_value_heads": cfg["num_attention_heads"],
        "head_dim": qk,
        "partial_rotary_factor": 1.0,
        "q_lora_rank": m.integer("attention.q_lora_rank") if m.get("attention.q_lora_rank")
        else None,
        "kv_lora_rank": rank,
        "qk_nope_head_dim": qk - rope,
        "qk_rope_head_dim": rope,
        "v_head_dim": v,
        "scoring_func": "sigmoid" if v3 else "softmax",
        "topk_method": "noaux_tc" if v3 else "group_limited_greedy" if grouped else "greedy",
    }
    scaling = cfg.get("rope_scaling")
    log_mul = m.get("rope.scaling.yarn_log_multiplier")
    if scaling is not None and scaling.get("rope_type") == "yarn" and log_mul:
        # the quotient to the float32 precision the file holds it in (0.0707 -> 0.707)
        mscale = float(str(np.float32(float(log_mul) / YARN_LOG_MUL_SCALE)))
        out["rope_scaling"] = {**scaling, "mscale": mscale, "mscale_all_dim": mscale}
    return out


def read_glm4moe(m: ArchMeta, cfg: dict[str, Any]) -> dict[str, Any]:
    if _gating(m, GATING_SIGMOID) != GATING_SIGMOID:
        raise ValueError("this glm4moe GGUF routes by softmax: GLM-4.5's experts are chosen "
                         "by sigmoid scores with a correction bias, not supported")
    return {**_moe_fields(m), "num_hidden_layers": _main_layers(m),
            "use_qk_norm": m.has_tensor(".attn_q_norm.weight")}


def mtp_layer(name: str, meta: Mapping[str, Any], arch: str, num_layers: int) -> bool:
    """Whether a tensor belongs to a multi-token-prediction layer past the decoder's (a file
    with {arch}.nextn_predict_layers writes them after the model's layers): not loaded."""
    if not meta.get(f"{arch}.nextn_predict_layers") or not name.startswith("blk."):
        return False
    return int(name.split(".")[1]) >= num_layers


class SplitKVB:
    """HF's kv_b_proj [heads * (nope + v), kv_lora_rank] of one layer, re-assembled from the
    converter's attn_k_b [heads, kv_lora_rank, nope] and attn_v_b [heads, v, kv_lora_rank]:
    per head its nope rows (k_b's, transposed), then its v rows. A range of rows reads only the
    heads it covers (a tensor-parallel rank's)."""

    def __init__(self, gf: GGUFFile, layer: int, config: ModelConfig) -> None:
        self.gf = gf
        self.k_name, self.v_name = (f"blk.{layer}.{part}.weight" for part in KV_B_PARTS)
        heads, rank = config.num_heads, config.kv_lora_rank
        expected = {self.k_name: (heads, rank, config.qk_nope_head_dim),
                    self.v_name: (heads, config.v_head_dim, rank)}
        for name, shape in expected.items():
            if name not in gf.tensors or gf.tensors[name].shape != shape:
                found = gf.tensors[name].shape if name in gf.tensors else "missing"
                raise ValueError(f"the GGUF's {name} is {found}; the config asks for {shape}")
        self.head_rows = config.qk_nope_head_dim + config.v_head_dim
        self.shape = (heads * self.head_rows, rank)

    def read(self, dim: int, start: int, stop: int) -> Tensor:
        if dim != 0:
            return self._heads(0, self.shape[0] // self.head_rows).narrow(dim, start, stop - start)
        first, last = start // self.head_rows, -(-stop // self.head_rows)
        rows = self._heads(first, last)  # [(last - first) * head_rows, rank]
        offset = first * self.head_rows
        return rows[start - offset : stop - offset]

    def _heads(self, first: int, last: int) -> Tensor:
        k = self._read(self.k_name, first, last).transpose(1, 2)  # [heads, nope, rank]
        v = self._read(self.v_name, first, last)  # [heads, v, rank]
        return torch.cat([k, v], dim=1).reshape(-1, self.shape[1])

    def _read(self, name: str, first: int, last: int) -> Tensor:
        part = self.gf.rows(name, first, last)
        return part if part is not None else self.gf.tensor(name)[first:last]


def split_kv_b(gf: GGUFFile, name: str, config: ModelConfig) -> Iterator[tuple[str, SplitKVB]]:
    """kv_b_proj of a layer written split: yielded for its attn_k_b (attn_v_b is read with it);
    nothing where the file also has the whole attn_kv_b (loaded as it is)."""
    layer, part = int(name.split(".")[1]), name.split(".")[2]
    if part != KV_B_PARTS[0]:
        if f"blk.{layer}.{KV_B_PARTS[0]}.weight" not in gf.tensors:
            raise ValueError(f"the GGUF has {name} but no blk.{layer}.{KV_B_PARTS[0]}.weight")
        return
    if f"blk.{layer}.attn_kv_b.weight" in gf.tensors:
        return
    yield f"model.layers.{layer}.self_attn.kv_b_proj.weight", SplitKVB(gf, layer, config)


def is_split_kv_b(name: str) -> bool:
    pieces = name.split(".")
    return len(pieces) == 4 and pieces[0] == "blk" and pieces[2] in KV_B_PARTS \
        and pieces[3] == "weight"
