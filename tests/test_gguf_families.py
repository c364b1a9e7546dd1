"""GGUF files of every family llama.cpp's converter writes, against the same weights as an HF
folder and against transformers (CPU, float32).

Each tiny model is built with transformers' own class, given non-trivial weights (norms and
biases too), saved as safetensors, and written as a GGUF the way convert_hf_to_gguf.py writes it:
its metadata keys, llama.cpp's tensor names (gguf-py's own TensorNameMap), the Q/K row
permutation of LlamaModel subclasses, Gemma's norms stored as w + 1, Phi-3's fused tensors and
LongRoPE factor tensors, plus a minimal byte-level tokenizer. The GGUF, the folder and HF must
give the same logits.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from torch import Tensor

from radixrt.runtime.forward.forward_batch import ForwardBatch
from radixrt.runtime.forward.kv_cache import KVCache
from radixrt.runtime.models import LoadedModel, load_model
from radixrt.runtime.models.gguf_archs import GGUF_ARCHITECTURES

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
EOT_TOKEN = 3  # written for Gemma, as llama.cpp's converter does (<end_of_turn>)


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
}


# --- a GGUF written as llama.cpp's converter writes it ----------------------------------------
def converter_permute(w: Tensor, n_head: int) -> Tensor:
    """LlamaModel.permute: rotate-half pairs of each head -> llama.cpp's interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def converter_tensors(model: Any, arch: str) -> list[tuple[str, Tensor]]:
    """The model's tensors under llama.cpp's names, transformed as the converter does."""
    cfg = model.config
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg.num_hidden_layers)
    out = []
    for name, tensor in model.state_dict().items():
        if arch.startswith("gemma") and name == "lm_head.weight":
            continue  # GemmaModel's filter: the head is the embedding
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        tensor = tensor.detach().float().clone()
        if arch in ("llama", "granite", "smollm3"):  # LlamaModel subclasses: undo_permute
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                tensor = converter_permute(tensor, cfg.num_attention_heads)
            elif name.endswith(("k_proj.weight", "k_proj.bias")):
                tensor = converter_permute(tensor, cfg.num_key_value_heads)
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            tensor = tensor + 1
        new_name = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new_name is not None, name
        out.append((new_name, tensor))
    return out


def _rope_params(cfg: Any) -> dict[str, Any]:
    params = dict(cfg.rope_parameters or {})
    return dict(params.get("full_attention", params))


def write_metadata(w: gguf.GGUFWriter, cfg: Any, arch: str) -> None:
    """set_gguf_parameters of the converter's model class for this architecture."""
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
    if arch == "phi3":
        w.add_rope_scaling_orig_ctx_len(cfg.original_max_position_embeddings)
        w.add_rope_dimension_count(int(cfg.partial_rotary_factor * cfg.hidden_size)
                                   // cfg.num_attention_heads)
        w.add_sliding_window(cfg.sliding_window or 0)


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
    tokens = [chr(c) for c in range(33, 127)] + ["\u0120", "\u0120\u0120"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
    w.add_token_merges(["\u0120 \u0120"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    if arch.startswith("gemma"):
        w.add_eot_token_id(EOT_TOKEN)


def write_gguf(path: Path, model: Any, arch: str,
               edit: Callable[[gguf.GGUFWriter], None] | None = None) -> None:
    w = gguf.GGUFWriter(str(path), arch)
    write_metadata(w, model.config, arch)
    if arch == "phi3":
        cfg = model.config
        scale = cfg.max_position_embeddings / cfg.original_max_position_embeddings
        orig = cfg.original_max_position_embeddings
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)))
    write_tokenizer(w, arch)
    if edit is not None:
        edit(w)
    for name, tensor in converter_tensors(model, arch) + extra_tensors(model.config, arch):
        w.add_tensor(name, tensor.numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# --- the tests ------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _tokenizer_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXRT_CACHE_DIR", str(tmp_path / "cache"))


def tiny_model(name: str, seed: int = 0) -> Any:
    """The family's tiny HF model with non-trivial weights: norms near 1, biases and the rest
    random."""
    torch.manual_seed(seed)
    model = FAMILIES[name][1]().eval()
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if pname.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.3 if pname.endswith(".bias") else 0.15)
    return model


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
    write_gguf(tmp_path / f"{name}.gguf", model, arch)
    from_gguf = load_model(str(tmp_path / f"{name}.gguf"))
    from_folder = load_model(str(folder))

    ours, theirs = dataclasses.asdict(from_gguf.config), dataclasses.asdict(from_folder.config)
    for key in _SPELLED_DIFFERENTLY:
        ours.pop(key), theirs.pop(key)
    assert ours.pop("architecture") == GGUF_ARCHITECTURES[arch].hf_architecture
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


def test_unknown_tensors_and_rope_kinds_are_refused(tmp_path: Path) -> None:
    extra = [("blk.0.ffn_gate_exps.weight", torch.zeros(2, 4, 8))]
    message = _refused(tmp_path, "qwen2", lambda w: None, extra)
    assert "tensor 'blk.0.ffn_gate_exps.weight'" in message
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
    covered by tests/test_model_vs_hf.py)."""
    from radixrt.runtime.models.loader import default_model_path, inspect_model

    folder, fname = default_model_path()
    cfg = inspect_model(os.path.join(folder, fname))
    assert cfg.architecture == "LlamaForCausalLM" and cfg.rope_scaling is None
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (30, 576, 9, 3)
    assert cfg.eos_token_ids == (2,) and cfg.tie_word_embeddings


def test_every_gguf_architecture_is_a_registered_familys() -> None:
    """The GGUF table and the registry's families name the same GGUF architectures, each read
    by the family that lists it."""
    from radixrt.runtime.models.registry import FAMILIES as REGISTRY
    from radixrt.runtime.models.registry import family_of

    listed = {gguf_arch for family in REGISTRY for gguf_arch in family.gguf_architectures}
    assert listed == set(GGUF_ARCHITECTURES)
    for name, arch in GGUF_ARCHITECTURES.items():
        assert name in family_of(arch.hf_architecture).gguf_architectures
