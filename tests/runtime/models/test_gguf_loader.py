"""GGUF files of every family llama.cpp's converter writes, dense and mixture-of-experts, against
the same weights as an HF folder and against transformers (CPU, float32).

Each tiny model is built with transformers' own class, given non-trivial weights (norms, biases,
routers and sinks too), saved as safetensors, and written as a GGUF the way convert_hf_to_gguf.py
writes it (tests/gguf_convert.py: its metadata keys, tensor names and transforms, the experts
stacked, fused gate / up or MXFP4 where the converter may write them so). The GGUF, the folder
and HF must give the same logits; at tp_size 2 each rank's shard from the GGUF equals the
folder's.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf_convert import EOT_TOKEN, round_experts_to_mxfp4, write_gguf
from tiny_models import randomize_weights
from torch import Tensor

from radixrt.runtime.distributed.group import TPGroup
from radixrt.runtime.forward.forward_batch import ForwardBatch
from radixrt.runtime.forward.kv_cache import KVCache
from radixrt.runtime.models import LoadedModel, load_model
from radixrt.runtime.models.gguf_archs import GGUF_ARCHITECTURES, MOE_VARIANTS

SEQ_LEN = 40
ATOL = 1e-4
TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1, pad_token_id=2)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
GEMMA3_ROPE = {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
PHI3_ROPE = {"rope_type": "longrope", "rope_theta": 10000.0,
             "long_factor": [1.0, 1.5, 2.5, 4.0], "short_factor": [1.0, 1.1, 1.2, 1.3]}
GPT_OSS = dict(num_local_experts=4, num_experts_per_tok=2, head_dim=16, sliding_window=8,
               intermediate_size=48, max_position_embeddings=128,
               layer_types=["sliding_attention", "full_attention"],
               rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                "original_max_position_embeddings": 32, "beta_fast": 32.0,
                                "beta_slow": 1.0, "truncate": False})


def _hf(config_cls: str, model_cls: str, **overrides: Any) -> Callable[[], Any]:
    def build() -> Any:
        import transformers

        config = getattr(transformers, config_cls)(**{**TINY, **overrides})
        return getattr(transformers, model_cls)(config)

    return build


# name -> (GGUF architecture, HF builder)
FAMILIES: dict[str, tuple[str, Callable[[], Any]]] = {
    "llama3": ("llama", _hf("LlamaConfig", "LlamaForCausalLM", rope_parameters=LLAMA3_ROPE,
                            tie_word_embeddings=False)),
    "smollm2": ("llama", _hf("LlamaConfig", "LlamaForCausalLM", tie_word_embeddings=True,
                             rope_parameters={"rope_type": "linear", "factor": 2.0,
                                              "rope_theta": 100000.0})),
    "mistral": ("llama", _hf("MistralConfig", "MistralForCausalLM", sliding_window=None)),
    "qwen2": ("qwen2", _hf("Qwen2Config", "Qwen2ForCausalLM", tie_word_embeddings=True)),
    "qwen3": ("qwen3", _hf("Qwen3Config", "Qwen3ForCausalLM", head_dim=24)),
    "gemma": ("gemma", _hf("GemmaConfig", "GemmaForCausalLM", head_dim=24)),
    "gemma2": ("gemma2", _hf("Gemma2Config", "Gemma2ForCausalLM", head_dim=16, sliding_window=16,
                             query_pre_attn_scalar=16, attn_logit_softcapping=4.0,
                             final_logit_softcapping=3.0)),
    "gemma3": ("gemma3", _hf("Gemma3TextConfig", "Gemma3ForCausalLM", num_hidden_layers=6,
                             head_dim=16, sliding_window=16, query_pre_attn_scalar=16,
                             rope_parameters=GEMMA3_ROPE)),
    "phi3": ("phi3", _hf("Phi3Config", "Phi3ForCausalLM", partial_rotary_factor=0.5,
                         max_position_embeddings=128, original_max_position_embeddings=32,
                         rope_parameters=PHI3_ROPE)),
    "olmo2": ("olmo2", _hf("Olmo2Config", "Olmo2ForCausalLM")),
    "granite": ("granite", _hf("GraniteConfig", "GraniteForCausalLM", embedding_multiplier=3.0,
                               residual_multiplier=0.5, attention_multiplier=0.3,
                               logits_scaling=2.0)),
    "smollm3": ("smollm3", _hf("SmolLM3Config", "SmolLM3ForCausalLM", num_hidden_layers=4)),
    # mixtures of experts
    "mixtral": ("llama", _hf("MixtralConfig", "MixtralForCausalLM", num_local_experts=4,
                             num_experts_per_tok=2, intermediate_size=48, sliding_window=None)),
    "qwen2moe": ("qwen2moe", _hf("Qwen2MoeConfig", "Qwen2MoeForCausalLM", num_experts=8,
                                 num_experts_per_tok=2, moe_intermediate_size=32,
                                 shared_expert_intermediate_size=48, norm_topk_prob=False)),
    "qwen3moe": ("qwen3moe", _hf("Qwen3MoeConfig", "Qwen3MoeForCausalLM", num_experts=8,
                                 num_experts_per_tok=2, moe_intermediate_size=32,
                                 norm_topk_prob=True, head_dim=24)),
    "olmoe": ("olmoe", _hf("OlmoeConfig", "OlmoeForCausalLM", num_experts=4,
                           num_experts_per_tok=1, intermediate_size=48)),
    "gpt-oss": ("gpt-oss", _hf("GptOssConfig", "GptOssForCausalLM", **GPT_OSS)),
}
FAMILIES["qwen2moe-squeezed"] = FAMILIES["qwen2moe"]
FAMILIES["olmoe-fused"] = FAMILIES["olmoe"]
FAMILIES["gpt-oss-fused"] = FAMILIES["gpt-oss"]
FAMILIES["gpt-oss-mxfp4"] = ("gpt-oss", _hf("GptOssConfig", "GptOssForCausalLM",
                                            **{**GPT_OSS, "intermediate_size": 64}))
# name -> how the converter ran: tensors squeezed (an earlier converter); --fuse-gate-up-exps;
# MXFP4 experts (as real gpt-oss files hold them: their rows must be whole blocks of 32, so
# inter 64; the HF model gets the dequantized values)
CONVERSIONS: dict[str, dict[str, bool]] = {
    "qwen2moe-squeezed": {"squeeze": True},
    "olmoe-fused": {"fuse_gate_up": True},
    "gpt-oss-fused": {"fuse_gate_up": True},
    "gpt-oss-mxfp4": {"mxfp4_experts": True},
}


# --- the tests ------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _tokenizer_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXRT_CACHE_DIR", str(tmp_path / "cache"))


def tiny_model(name: str, seed: int = 0) -> Any:
    """The family's tiny HF model with non-trivial weights: norms near 1, biases and the rest
    random (MXFP4 experts rounded to their MXFP4 values)."""
    torch.manual_seed(seed)
    model = FAMILIES[name][1]().eval()
    randomize_weights(model)
    if CONVERSIONS.get(name, {}).get("mxfp4_experts"):
        round_experts_to_mxfp4(model)
    return model


def hf_architecture(arch: str, experts: bool) -> str:
    """The HF architecture a GGUF architecture reads back as (Mixtral: llama with experts)."""
    table = MOE_VARIANTS if experts and arch in MOE_VARIANTS else GGUF_ARCHITECTURES
    return table[arch].hf_architecture


def run_logits(loaded: LoadedModel, ids: Tensor, chunks: list[tuple[int, int]]) -> Tensor:
    """Logits of ids computed chunk by chunk over one KV pool, slots in a random order."""
    kv = KVCache.from_config(loaded.config, 2 * SEQ_LEN, torch.float32, "cpu")
    table = torch.randperm(2 * SEQ_LEN, generator=torch.Generator().manual_seed(1))[: len(ids)]
    out = []
    for start, end in chunks:
        batch = ForwardBatch.build([ids[start:end].tolist()], [start], [table])
        out.append(loaded.model.compute_logits(loaded.model.forward(batch, kv)))
    return torch.cat(out)


# fields of ModelConfig the two loaders spell differently: Llama 3.1 scaling is per-frequency
# factors in a GGUF, LongRoPE factors come back as tuples, a GGUF lists its end-of-turn token
_SPELLED_DIFFERENTLY = {"rope_scaling", "local_rope_scaling", "eos_token_ids"}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_gguf_matches_folder_and_hf(name: str, tmp_path: Path) -> None:
    import dataclasses

    arch = FAMILIES[name][0]
    model = tiny_model(name)
    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    write_gguf(tmp_path / f"{name}.gguf", model, arch, **CONVERSIONS.get(name, {}))
    from_gguf = load_model(str(tmp_path / f"{name}.gguf"))
    from_folder = load_model(str(folder))

    ours, theirs = dataclasses.asdict(from_gguf.config), dataclasses.asdict(from_folder.config)
    for key in _SPELLED_DIFFERENTLY:
        ours.pop(key), theirs.pop(key)
    assert ours.pop("architecture") == hf_architecture(arch, ours["num_experts"] > 0)
    theirs.pop("architecture")  # MistralForCausalLM: llama.cpp writes Mistral as llama
    assert ours == theirs
    assert from_gguf.config.eos_token_ids == ((1, EOT_TOKEN) if arch.startswith("gemma") else (1,))
    for a, b in zip(from_gguf.model.rotaries(), from_folder.model.rotaries()):
        torch.testing.assert_close(a.inv_freq, b.inv_freq)
        assert a.attention_factor == pytest.approx(b.attention_factor)
    tokenizer = from_gguf.tokenizer  # transformers reads some architectures' GGUFs, not all
    assert tokenizer is not None and tokenizer.eos_token_id == 1
    assert tokenizer("!!", add_special_tokens=False).input_ids == [0, 0]

    ids = torch.randint(0, TINY["vocab_size"], (SEQ_LEN,),
                        generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model(ids[None]).logits[0].float()  # [SEQ_LEN, vocab]
    whole = [(0, SEQ_LEN)]
    pieces = [(0, 25), (25, SEQ_LEN - 2), (SEQ_LEN - 2, SEQ_LEN - 1), (SEQ_LEN - 1, SEQ_LEN)]
    gguf_logits = run_logits(from_gguf, ids, whole)
    torch.testing.assert_close(gguf_logits, run_logits(from_folder, ids, whole),
                               atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(gguf_logits, expected, atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(run_logits(from_gguf, ids, pieces), expected, atol=ATOL, rtol=ATOL)


# --- quantized files, packed -----------------------------------------------------------------
QUANTIZED = {"llama3": "Q4_0", "smollm2": "Q4_1", "qwen2": "Q8_0", "qwen3": "Q4_0",
             "gemma2": "Q4_1", "gemma3": "Q8_0", "phi3": "Q4_0", "olmo2": "Q4_1",
             "granite": "Q4_0", "smollm3": "Q8_0", "mixtral": "Q4_1", "qwen3moe": "Q8_0"}


@pytest.mark.parametrize("name", list(QUANTIZED))
def test_a_quantized_gguf_loads_packed_as_it_loads_dequantized(name: str,
                                                               tmp_path: Path) -> None:
    """gguf-py's quantizer writes the family's weights; packed (the blocks kept, the packed
    kernels) and dequantized (floats) give the same logits to float rounding, chunked or
    not, and the packed model keeps its projections packed."""
    arch = FAMILIES[name][0]
    qtype = getattr(gguf.GGMLQuantizationType, QUANTIZED[name])
    path = tmp_path / f"{name}.gguf"
    write_gguf(path, tiny_model(name), arch, **CONVERSIONS.get(name, {}), quantize=qtype)
    packed = load_model(str(path), weight_format="packed")
    dense = load_model(str(path), weight_format="dequantized")
    formats = packed.model.weight_formats()
    assert any(fmt.startswith(("u4", "i8")) for fmt in formats), formats
    assert set(dense.model.weight_formats()) == {"float32"}
    ids = torch.randint(0, TINY["vocab_size"], (SEQ_LEN,),
                        generator=torch.Generator().manual_seed(5))
    pieces = [(0, 25), (25, SEQ_LEN - 2), (SEQ_LEN - 2, SEQ_LEN - 1), (SEQ_LEN - 1, SEQ_LEN)]
    want = run_logits(dense, ids, [(0, SEQ_LEN)])
    for chunks in ([(0, SEQ_LEN)], pieces):
        torch.testing.assert_close(run_logits(packed, ids, chunks), want, atol=ATOL, rtol=ATOL)


# --- what cannot be honoured is refused -------------------------------------------------------
def _refused(tmp_path: Path, name: str, edit: Callable[[gguf.GGUFWriter], None],
             extra: list[tuple[str, Tensor]] = ()) -> str:
    path = tmp_path / "refused.gguf"
    model = tiny_model(name)
    arch = FAMILIES[name][0]

    def edit_all(w: gguf.GGUFWriter) -> None:
        edit(w)
        for tname, tensor in extra:
            w.add_tensor(tname, tensor.numpy())

    write_gguf(path, model, arch, edit_all)
    with pytest.raises(ValueError) as info:
        load_model(str(path))
    return str(info.value)


def test_unsupported_architecture_is_refused_with_the_supported_list(tmp_path: Path) -> None:
    from radixrt.runtime.models.loader import inspect_model

    w = gguf.GGUFWriter(str(tmp_path / "falcon.gguf"), "falcon")
    w.add_block_count(2)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="'falcon' is not supported; supported: llama, qwen2, "
                                         "qwen3, gemma, gemma2, gemma3, phi3, olmo2, granite"):
        inspect_model(str(tmp_path / "falcon.gguf"))


def test_feature_keys_a_family_does_not_honour_are_refused(tmp_path: Path) -> None:
    message = _refused(tmp_path, "mistral", lambda w: w.add_attn_logit_softcapping(30.0))
    assert "llama.attn_logit_softcapping=30.0" in message and "would run wrongly" in message
    message = _refused(tmp_path, "olmo2", lambda w: w.add_sliding_window(4096))  # OLMo-3
    assert "olmo2.attention.sliding_window=4096" in message
    message = _refused(tmp_path, "granite", lambda w: w.add_expert_count(8))
    assert "mixture-of-experts" in message
    message = _refused(tmp_path, "olmoe", lambda w: w.add_expert_shared_count(1))
    assert "olmoe.expert_shared_count=1" in message
    message = _refused(tmp_path, "mixtral", lambda w: w.add_expert_weights_scale(2.5))
    assert "llama.expert_weights_scale=2.5 (scaled routing weights)" in message


def test_routing_keys_llama_cpp_would_ignore_must_agree_with_it(tmp_path: Path) -> None:
    """llama.cpp's builders hard-code each architecture's routing: a file that says otherwise
    is refused; one that agrees (or sets a neutral weight scale) reads as usual."""
    from radixrt.runtime.models.loader import inspect_model

    message = _refused(tmp_path, "qwen2moe", lambda w: w.add_expert_weights_norm(True))
    assert "qwen2moe.expert_weights_norm=True" in message
    message = _refused(tmp_path, "qwen3moe", lambda w: w.add_expert_gating_func(
        gguf.ExpertGatingFuncType.SIGMOID))
    assert "qwen3moe.expert_gating_func=2" in message

    def agreeing(w: gguf.GGUFWriter) -> None:
        w.add_expert_weights_norm(True)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)
        w.add_expert_weights_scale(1.0)

    write_gguf(tmp_path / "agrees.gguf", tiny_model("qwen3moe"), "qwen3moe", agreeing)
    cfg = inspect_model(str(tmp_path / "agrees.gguf"))
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.norm_topk_prob) == (8, 2, True)


def test_unknown_tensors_and_rope_kinds_are_refused(tmp_path: Path) -> None:
    extra = [("blk.0.ffn_gate_exps.weight", torch.zeros(2, 4, 8))]
    message = _refused(tmp_path, "qwen2", lambda w: None, extra)
    assert "tensor 'blk.0.ffn_gate_exps.weight'" in message
    extra = [("blk.0.ffn_gate_shexp.weight", torch.zeros(16, 64))]  # Mixtral has no shared one
    message = _refused(tmp_path, "mixtral", lambda w: None, extra)
    assert "tensor 'blk.0.ffn_gate_shexp.weight'" in message
    message = _refused(tmp_path, "mistral",
                       lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE))
    assert "lacks rope_factors_long" in message


def test_per_layer_head_counts_must_agree() -> None:
    from radixrt.runtime.models.gguf_archs import ArchMeta

    meta = ArchMeta({"llama.attention.head_count_kv": (2, 2, 2)}, "llama")
    assert meta.integer("attention.head_count_kv") == 2
    meta = ArchMeta({"llama.attention.head_count_kv": (2, 0, 2)}, "llama")
    with pytest.raises(ValueError, match="differs between layers"):
        meta.integer("attention.head_count_kv")


def test_default_model_header_is_unchanged() -> None:
    """The default SmolLM2 GGUF: llama, its sizes, no scaling (its weights and tokenizer are
    covered by tests/runtime/models/families/test_llama.py)."""
    from radixrt.runtime.models.loader import default_model_path, inspect_model

    folder, fname = default_model_path()
    cfg = inspect_model(os.path.join(folder, fname))
    assert cfg.architecture == "LlamaForCausalLM" and cfg.rope_scaling is None
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (30, 576, 9, 3)
    assert cfg.eos_token_ids == (2,) and cfg.tie_word_embeddings


def test_every_gguf_architecture_is_a_registered_familys() -> None:
    """The GGUF table and the registry's families name the same GGUF architectures, each read
    by the family that lists it."""
    from radixrt.runtime.models.gguf_archs import all_gguf_architectures
    from radixrt.runtime.models.registry import FAMILIES as REGISTRY
    from radixrt.runtime.models.registry import family_of

    listed = {gguf_arch for family in REGISTRY for gguf_arch in family.gguf_architectures}
    assert listed == set(GGUF_ARCHITECTURES)
    for arch in all_gguf_architectures():
        assert arch.name in family_of(arch.hf_architecture).gguf_architectures


# --- mixtures of experts: tensor parallelism, MXFP4 -----------------------------------------
@pytest.mark.parametrize("name", ["mixtral", "qwen2moe", "gpt-oss-fused", "gpt-oss-mxfp4"])
def test_moe_shards_from_the_gguf_equal_the_folders(name: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """At tp_size 2 each rank's shard (its rows of every expert, of the shared expert, its
    heads and sinks) loaded from the GGUF equals the one loaded from the HF folder, and a
    rank dequantizes only its own rows of each expert's gate and up projections."""
    from radixrt.runtime.models.gguf_file import GGUFFile

    model = tiny_model(name)
    model.save_pretrained(tmp_path / "hf")
    write_gguf(tmp_path / "moe.gguf", model, FAMILIES[name][0], **CONVERSIONS.get(name, {}))
    read: dict[str, int] = {}
    flat_rows = GGUFFile.flat_rows

    def counting(self: GGUFFile, tensor: str, start: int, stop: int) -> Tensor:
        read[tensor] = read.get(tensor, 0) + stop - start
        return flat_rows(self, tensor, start, stop)

    monkeypatch.setattr(GGUFFile, "flat_rows", counting)
    for rank in range(2):
        read.clear()
        ours = load_model(str(tmp_path / "moe.gguf"), tp=TPGroup(rank=rank, size=2))
        theirs = load_model(str(tmp_path / "hf"), tp=TPGroup(rank=rank, size=2))
        expected = theirs.model.state_dict()
        for key, value in ours.model.state_dict().items():
            torch.testing.assert_close(value, expected[key], atol=0, rtol=0, msg=key)
        config = ours.config
        rows = config.num_experts * config.moe_intermediate_size  # gate and up, all ranks
        gate_up = [t for t in read if "gate" in t or "up" in t]
        assert gate_up and all(read[t] == rows * (2 if "gate_up" in t else 1) // 2
                               for t in gate_up), read


def test_mxfp4_blocks_dequantize_as_gguf_py_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The torch MXFP4 path (gpt-oss's expert weights) equals gguf-py's, subnormal scales and
    zero blocks included; a type the installed gguf package cannot dequantize is refused."""
    from radixrt.runtime.models.gguf_quants import dequantize

    mxfp4 = gguf.GGMLQuantizationType.MXFP4
    rng = np.random.default_rng(0)
    values = rng.standard_normal((6, 64)) * np.logspace(-40, 3, 6)[:, None]
    values[0, :32] = 0.0
    quantized = gguf.quants.quantize(values.astype(np.float32), mxfp4)
    expected = torch.from_numpy(gguf.quants.dequantize(quantized, mxfp4))
    assert torch.equal(dequantize(quantized.reshape(-1), mxfp4, (6, 64)), expected)

    def unsupported(data: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
        raise NotImplementedError(f"Dequantization for {qtype.name} is not yet implemented")

    monkeypatch.setattr(gguf.quants, "dequantize", unsupported)
    with pytest.raises(ValueError, match="Q5_K cannot be dequantized by the installed gguf"):
        dequantize(np.zeros(176, dtype=np.uint8), gguf.GGMLQuantizationType.Q5_K, (256,))
