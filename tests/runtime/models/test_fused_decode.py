"""The fused decode step (every layer in one call of the CPU kernels) against the path it replaces,
the layers run one by one: the same hidden states and the same KV pool, bit for bit, step after
step, on the default model and on tiny quantized models of the families it supports (biases,
per-head q/k norms, NoPE layers, partial rotary, residual scales, sliding windows); it takes only
plain decode steps, and says why a model cannot run fused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import pytest
import torch
from gguf_convert import write_gguf
from tiny_models import randomize_weights

from radixrt.runtime.forward.forward_batch import ForwardBatch, PrefixGroup
from radixrt.runtime.forward.kv_cache import KVCache
from radixrt.runtime.models import load_model
from radixrt.runtime.models.fused_decode import unsupported

TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1, pad_token_id=2)
# family -> (GGUF architecture, transformers config and model classes, overrides)
FAMILIES: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "llama": ("llama", "LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": False}),
    "qwen2": ("qwen2", "Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}),
    "qwen3": ("qwen3", "Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),
    "granite": ("granite", "GraniteConfig", "GraniteForCausalLM",
                {"embedding_multiplier": 3.0, "residual_multiplier": 0.5,
                 "attention_multiplier": 0.3, "logits_scaling": 2.0}),
    "smollm3": ("smollm3", "SmolLM3Config", "SmolLM3ForCausalLM", {"num_hidden_layers": 4}),
    "phi3": ("phi3", "Phi3Config", "Phi3ForCausalLM",
             {"partial_rotary_factor": 0.5, "sliding_window": 6, "max_position_embeddings": 128,
              "original_max_position_embeddings": 32,
              "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                  "long_factor": [1.0, 1.5, 2.5, 4.0],
                                  "short_factor": [1.0, 1.1, 1.2, 1.3]}}),
}


def decode_steps(model: Any, kv: KVCache, prompts: list[list[int]], steps: int,
                 fused: bool) -> tuple[list[torch.Tensor], list[int]]:
    """Prefill the prompts (the layers one by one), then `steps` decode steps with the fused
    step on or off; the hidden states of each step and the KV positions read."""
    saved, model.fused = model.fused, model.fused if fused else None
    tables = [list(range(64 * i, 64 * i + len(p))) for i, p in enumerate(prompts)]
    model(ForwardBatch.build(prompts, [0] * len(prompts), tables), kv)
    backend = model.attn_backend
    reads, out = backend.kv_positions_read, []
    try:
        for step in range(steps):
            for i, table in enumerate(tables):
                table.append(64 * i + 40 + step)  # a slot away from the prompt's
            tokens = [[(7 * step + i) % 90 + 3] for i in range(len(prompts))]
            out.append(model(ForwardBatch.build(tokens, [len(t) - 1 for t in tables], tables),
                             kv).clone())
    finally:
        model.fused = saved
    return out, [backend.kv_positions_read - reads]


def assert_fused_equals_layers(model: Any, config: Any, prompts: list[list[int]],
                               steps: int = 4) -> None:
    assert model.fused is not None, unsupported(model)
    kv_fused = KVCache.from_config(config, 64 * len(prompts), torch.float32, "cpu")
    kv_layers = KVCache.from_config(config, 64 * len(prompts), torch.float32, "cpu")
    fused, fused_reads = decode_steps(model, kv_fused, prompts, steps, fused=True)
    layers, layer_reads = decode_steps(model, kv_layers, prompts, steps, fused=False)
    for a, b in zip(fused, layers):
        assert torch.equal(a, b), (a - b).abs().max()
    assert torch.equal(kv_fused.buffer, kv_layers.buffer)
    assert fused_reads == layer_reads


@pytest.mark.parametrize("batch", [1, 3, 16])
def test_the_default_model_fused_equals_its_layers(loaded_model: Any, batch: int) -> None:
    prompts = [[100 + 3 * i + j for j in range(5 + 2 * i)] for i in range(batch)]
    assert_fused_equals_layers(loaded_model.model, loaded_model.config, prompts)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_tiny_quantized_families_fused_equal_their_layers(name: str, tmp_path: Path) -> None:
    import transformers

    arch, config_cls, model_cls, overrides = FAMILIES[name]
    torch.manual_seed(0)
    hf = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**{**TINY,
                                                                             **overrides}))
    randomize_weights(hf.eval())
    path = tmp_path / f"{name}.gguf"
    write_gguf(path, hf, arch, quantize=gguf.GGMLQuantizationType.Q4_1)
    loaded = load_model(str(path), weight_format="packed")
    prompts = [[5 + j for j in range(9)], [40 + j for j in range(3)]]
    assert_fused_equals_layers(loaded.model, loaded.config, prompts, steps=8)


def test_small_passes_run_fused(loaded_model: Any) -> None:
    """Decode rows, a few new tokens of a request (speculative drafts, a short prompt), at most
    16 rows; not more, and not a pass with a shared-prefix group (cascade attention)."""
    fused = loaded_model.model.fused
    assert fused.applies(ForwardBatch.build([[5], [6]], [3, 4], [[0, 1, 2, 3], [4, 5, 6, 7, 8]]))
    assert fused.applies(ForwardBatch.build([[5, 6]], [3], [[0, 1, 2, 3, 4]]))  # an extend
    assert fused.applies(ForwardBatch.build([[5]], [0], [[0]]))  # a first token
    assert not fused.applies(ForwardBatch.build([[5]] * 17, [1] * 17,
                                                [[2 * i, 2 * i + 1] for i in range(17)]))
    grouped = ForwardBatch.build([[5], [6]], [3, 3], [[0, 1, 2, 9], [0, 1, 2, 8]],
                                 prefix_groups=[PrefixGroup([0, 1], 2)])
    assert not fused.applies(grouped)  # cascade attention reads the shared prefix once


def test_a_mixed_small_pass_fused_equals_its_layers(loaded_model: Any) -> None:
    """Decode rows beside a request's three drafted tokens and a new four-token prompt."""
    model, config = loaded_model.model, loaded_model.config
    caches = [KVCache.from_config(config, 128, torch.float32, "cpu") for _ in range(2)]
    prompts = [[100 + j for j in range(9)], [300 + j for j in range(12)]]
    tables = [list(range(0, 9)), list(range(20, 32))]
    outs = []
    for kv, fused in zip(caches, (True, False)):
        saved, model.fused = model.fused, model.fused if fused else None
        try:
            model(ForwardBatch.build(prompts, [0, 0], tables), kv)
            batch = ForwardBatch.build([[7], [8, 9, 10], [11, 12, 13, 14]], [9, 12, 0],
                                       [tables[0] + [50], tables[1] + [51, 52, 53],
                                        [60, 61, 62, 63]])
            outs.append(model(batch, kv))
        finally:
            model.fused = saved
    assert torch.equal(outs[0], outs[1]) and torch.equal(caches[0].buffer, caches[1].buffer)


def test_why_a_model_cannot_run_fused(tmp_path: Path) -> None:
    import transformers

    hf = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**{**TINY, "head_dim": 16}))
    randomize_weights(hf.eval())
    write_gguf(tmp_path / "g.gguf", hf, "gemma2", quantize=gguf.GGMLQuantizationType.Q8_0)
    gemma = load_model(str(tmp_path / "g.gguf"), weight_format="packed").model
    assert gemma.fused is None and "sandwich-norm" in (unsupported(gemma) or "")
    dense = load_model(str(tmp_path / "g.gguf"), weight_format="dequantized").model
    assert dense.fused is None


def on_storage(kv: KVCache, storage: torch.Tensor) -> KVCache:
    """kv's pool moved onto the front of `storage` (zeroed): pools of other sizes at one address,
    as the allocator hands out after a pool is freed."""
    shape = tuple(kv.buffer.shape)
    kv.buffer = storage[: kv.buffer.numel()].view(shape).zero_()
    kv.k = [kv.buffer[0, i] for i in range(kv.num_layers)]
    kv.v = [kv.buffer[1, i] for i in range(kv.num_layers)]
    return kv


def test_a_pool_of_another_size_at_the_same_address(loaded_model: Any) -> None:
    """The fused step's arguments point into the pool: after a pool of another size took the
    freed one's address, every layer's K and V are elsewhere, and the step still matches the
    layers run one by one (its arguments are keyed by the pool's address and shape)."""
    model, config = loaded_model.model, loaded_model.config
    # 21 prompt rows: the prefill runs layer by layer (past MAX_GEMM_ROWS), the decode fused
    prompts = [[100 + j for j in range(12)], [200 + j for j in range(9)]]
    storage = torch.empty(KVCache.from_config(config, 256, torch.float32, "cpu").buffer.numel())
    small = on_storage(KVCache.from_config(config, 128, torch.float32, "cpu"), storage)
    decode_steps(model, small, prompts, 2, fused=True)
    large = on_storage(KVCache.from_config(config, 256, torch.float32, "cpu"), storage)
    assert large.buffer.data_ptr() == small.buffer.data_ptr()
    fused, _ = decode_steps(model, large, prompts, 3, fused=True)
    layers, _ = decode_steps(model, KVCache.from_config(config, 256, torch.float32, "cpu"),
                             prompts, 3, fused=False)
    for a, b in zip(fused, layers):
        assert torch.equal(a, b), (a - b).abs().max()
