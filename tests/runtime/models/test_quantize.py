"""Weight-only quantization at load: int8 (absmax / 127 per group of 32) and int4 (min to max in
15 steps per group) round-trip within half a step of every weight, hold exactly what their layout
says, and a safetensors checkpoint loaded with --quantization keeps its projections, embedding
and head packed, runs the fused decode step, and stays close to the float model (KL of the
next-token distributions); what cannot be quantized this way is refused with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixrt.kernels.packed_reference import dequantize_ref
from radixrt.runtime.config import EngineConfig
from radixrt.runtime.forward.forward_batch import ForwardBatch
from radixrt.runtime.forward.kv_cache import KVCache
from radixrt.runtime.models import load_model
from radixrt.runtime.models.quantize import QuantizedSource, quantize_int4, quantize_int8


def test_int8_and_int4_round_trip_within_half_a_step() -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(40, 256, generator=gen) * torch.rand(40, 1, generator=gen) * 3
    w[3] = 0.0  # an all-zero row: scale 0, codes 0
    for quantize, steps in ((quantize_int8, 254), (quantize_int4, 15)):
        packed = quantize(w)
        back = dequantize_ref(packed)
        groups = w.reshape(40, 8, 32)
        step = (groups.amax(-1) - groups.amin(-1)) if steps == 15 else 2 * groups.abs().amax(-1)
        bound = step / steps * 0.5 + 1e-3 * groups.abs().amax(-1) + 1e-6  # + float16 rounding
        assert ((back - w).reshape(40, 8, 32).abs() <= bound.unsqueeze(-1)).all()
        assert torch.equal(back[3], torch.zeros(256))
    assert quantize_int8(w).kind == "i8" and quantize_int4(w).kind == "u4"


def test_a_source_quantizes_the_rows_it_is_asked_for() -> None:
    w = torch.randn(16, 64)
    source = QuantizedSource(w, "int4")
    part = source.read_packed(4, 9)
    assert part is not None and torch.equal(dequantize_ref(part),
                                            dequantize_ref(quantize_int4(w[4:9])))
    assert torch.equal(source.read(1, 0, 32), w[:, :32])
    assert QuantizedSource(torch.randn(4, 40), "int8").read_packed(0, 4) is None  # 40 % 32


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import transformers

    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).eval()
    for p in model.parameters():  # weights of the size trained models have
        torch.nn.init.normal_(p, 0.0, 0.05) if p.dim() == 2 else torch.nn.init.ones_(p)
    model.save_pretrained(folder)
    return folder


def logprobs(loaded, ids: list[int]) -> torch.Tensor:
    kv = KVCache.from_config(loaded.config, 64, torch.float32, "cpu")
    batch = ForwardBatch.build([ids], [0], [list(range(len(ids)))])
    return torch.log_softmax(loaded.model.compute_logits(loaded.model(batch, kv)).double(), -1)


@pytest.mark.parametrize("scheme,max_kl", [("int8", 1e-3), ("int4", 5e-2)])
def test_a_quantized_checkpoint_runs_packed_close_to_its_floats(tiny_checkpoint: Path,
                                                                scheme: str,
                                                                max_kl: float) -> None:
    dense = load_model(str(tiny_checkpoint))
    quantized = load_model(str(tiny_checkpoint), quantization=scheme)
    formats = quantized.model.weight_formats()
    assert formats.get("i8/g32/f16") and ("u4/g32/f16" in formats) == (scheme == "int4")
    assert set(formats) - {"i8/g32/f16", "u4/g32/f16"} == {"float32"}  # the norms
    assert formats["float32"] < 2048
    assert quantized.model.fused is not None and dense.model.fused is None
    ids = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    ref, got = logprobs(dense, ids), logprobs(quantized, ids)
    assert (ref.exp() * (ref - got)).sum(-1).mean().item() <= max_kl


def test_what_cannot_be_quantized_so_is_refused(tiny_checkpoint: Path) -> None:
    with pytest.raises(ValueError, match="GGUF file, quantized already"):
        load_model("default", quantization="int8")
    with pytest.raises(ValueError, match="cannot go with weight_format='dequantized'"):
        EngineConfig(quantization="int4", weight_format="dequantized")
    with pytest.raises(ValueError, match="use one of"):
        EngineConfig(quantization="fp4")
    with pytest.raises(ValueError, match="give quantization"):
        load_model(str(tiny_checkpoint), weight_format="packed")
    with pytest.raises(ValueError, match="cannot run here: packed products run on the CPU"):
        load_model(str(tiny_checkpoint), quantization="int8", dtype="bfloat16")
