"""LoRA adapters in the fused decode step (kernels/cpu/decoder.cpp's lora_add) against the path
it replaces, the layers one by one with the PyTorch products (models/lora_layer.py): the same
hidden states and KV pool to float rounding, step after step, on a tiny packed (Q4_1) Llama
with three PEFT adapters and the base model mixed in one batch; and the fused step does run."""

from __future__ import annotations

import copy
from typing import Any

import gguf
import pytest
import torch
from gguf_convert import write_gguf
from lora_adapters import make_adapter
from tiny_models import randomize_weights

from radixrt.runtime.forward.forward_batch import ForwardBatch
from radixrt.runtime.forward.kv_cache import KVCache
from radixrt.runtime.lora_messages import LoraAdapter
from radixrt.runtime.models import load_model
from radixrt.runtime.models.lora_format import read_spec
from radixrt.runtime.worker.lora_manager import LoraManager
from radixrt.runtime.worker.setup import lora_shapes

TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1, pad_token_id=2,
            tie_word_embeddings=False)
KINDS = ("attn-r4", "all-r8-rslora", "mlp-patterns")
TOLERANCE = 1e-5  # the same sums in another order: C++ dot products against MKL's


@pytest.fixture(scope="module")
def packed_with_adapters(tmp_path_factory: pytest.TempPathFactory,
                         ) -> tuple[Any, LoraManager, dict[str, str]]:
    """The tiny packed model, its LoRA manager, and each adapter's key (its files' digest)."""
    import transformers

    root = tmp_path_factory.mktemp("lora_fused")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).eval()
    randomize_weights(hf)
    write_gguf(root / "tiny.gguf", hf, "llama", quantize=gguf.GGMLQuantizationType.Q4_1)
    loaded = load_model(str(root / "tiny.gguf"), weight_format="packed")
    assert loaded.model.fused is not None
    manager = LoraManager(loaded.model, lora_shapes(loaded.config), num_slots=4, max_rank=8,
                          max_loaded=None)
    keys = {}
    for i, kind in enumerate(KINDS):
        make_adapter(copy.deepcopy(hf), root / kind, kind, seed=i, std=0.1)
        keys[kind] = read_spec(str(root / kind), manager.shapes, 8).digest[:16]
        manager.register([LoraAdapter(keys[kind], str(root / kind))])
    return loaded, manager, keys


def steps(loaded: Any, manager: LoraManager, fused: bool,
          adapters: list[str | None]) -> tuple[list[torch.Tensor], KVCache, int]:
    # adapters: the worker's keys (None: the base model)
    """Prefill four prompts (layers one by one), then 5 decode steps with the fused step on or
    off; each step's hidden states, the KV pool, and how often the layers ran one by one."""
    model, config = loaded.model, loaded.config
    kv = KVCache.from_config(config, 256, torch.float32, "cpu")
    prompts = [[5 + 3 * i + j for j in range(6 + i)] for i in range(len(adapters))]
    tables = [list(range(64 * i, 64 * i + len(p))) for i, p in enumerate(prompts)]
    calls = 0
    layer_forward = type(model.layers[0]).forward

    def counted(self: Any, *args: Any) -> Any:
        nonlocal calls
        calls += 1
        return layer_forward(self, *args)

    def run(tokens: list[list[int]], prefix: list[int]) -> torch.Tensor:
        batch = ForwardBatch.build(tokens, prefix, tables)
        batch.lora = manager.batch(adapters, batch.extend_lens, torch.device("cpu"))
        return model(batch, kv).clone()

    saved, model.fused = model.fused, model.fused if fused else None
    try:
        run(prompts, [0] * len(prompts))
        type(model.layers[0]).forward = counted
        out = []
        for step in range(5):
            for i, table in enumerate(tables):
                table.append(64 * i + 40 + step)
            out.append(run([[(7 * step + i) % 90 + 3] for i in range(len(prompts))],
                           [len(t) - 1 for t in tables]))
    finally:
        type(model.layers[0]).forward = layer_forward
        model.fused = saved
    return out, kv, calls


@pytest.mark.parametrize("adapters", [
    [None, "attn-r4", "all-r8-rslora", "mlp-patterns"],  # the base and every adapter mixed
    ["all-r8-rslora"],  # one request under one adapter
])
def test_fused_lora_step_equals_the_layers(
        packed_with_adapters: tuple[Any, LoraManager, dict[str, str]],
        adapters: list[str | None]) -> None:
    loaded, manager, keys = packed_with_adapters
    adapters = [None if a is None else keys[a] for a in adapters]
    fused, kv_fused, fused_calls = steps(loaded, manager, True, adapters)
    layers, kv_layers, layer_calls = steps(loaded, manager, False, adapters)
    assert fused_calls == 0 and layer_calls > 0  # the fused step took every decode step
    for a, b in zip(fused, layers):
        torch.testing.assert_close(a, b, rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(kv_fused.buffer, kv_layers.buffer, rtol=TOLERANCE,
                               atol=TOLERANCE)
    base, _, _ = steps(loaded, manager, True, [None] * len(adapters))
    assert not torch.allclose(base[-1], fused[-1])  # the adapters change the states
