"""config.json as checkpoints ship it, not as transformers 5 writes it: only what differs from
the family's defaults (Gemma 3's multimodal text_config), legacy spellings (rope_scaling's
"type", a top-level rope_theta, Gemma's "gelu"), no layer_types (windows from
use_sliding_window / max_window_layers), biases on o and on the MLP. Each folder keeps its
config.json as written here; transformers builds the model from the same file (its own
reading), weights are drawn non-trivially, and radixrt must give transformers' logits.
Also: RMSNorm rounds in bfloat16 as each family's transformers class does, and LongRoPE picks
its factors by the context served."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import randomize_weights

from radixrt.runtime.forward.forward_batch import ForwardBatch
from radixrt.runtime.forward.kv_cache import KVCache
from radixrt.runtime.models import load_model

pytestmark = pytest.mark.model

TINY = dict(hidden_size=64, intermediate_size=112, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
            vocab_size=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
WINDOW = 8
SHIPPED: dict[str, dict[str, Any]] = {
    "gemma-legacy-gelu": dict(TINY, architectures=["GemmaForCausalLM"], model_type="gemma",
                              head_dim=24, hidden_act="gelu"),
    "qwen2-window-no-layer-types": dict(
        TINY, architectures=["Qwen2ForCausalLM"], model_type="qwen2", use_sliding_window=True,
        sliding_window=WINDOW, max_window_layers=2),
    "qwen2.5-yarn-legacy": dict(
        TINY, architectures=["Qwen2ForCausalLM"], model_type="qwen2", rope_theta=1000000.0,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
    "smollm3-window-no-layer-types": dict(
        TINY, architectures=["SmolLM3ForCausalLM"], model_type="smollm3",
        use_sliding_window=True, sliding_window=WINDOW, no_rope_layer_interval=2),
    "llama-biases": dict(TINY, architectures=["LlamaForCausalLM"], model_type="llama",
                         attention_bias=True, mlp_bias=True),
    "mistral-v0.1-bias-ignored": dict(TINY, architectures=["MistralForCausalLM"],
                                      model_type="mistral", sliding_window=WINDOW,
                                      attention_bias=True),
    "phi3-longrope-legacy": dict(
        TINY, architectures=["Phi3ForCausalLM"], model_type="phi3",
        original_max_position_embeddings=32, rope_scaling={
            "type": "longrope", "long_factor": [1.0 + 0.2 * i for i in range(8)],
            "short_factor": [1.0 + 0.03 * i for i in range(8)]}),
    "gemma3-minimal": dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                           hidden_size=64, intermediate_size=112, num_hidden_layers=6,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                           vocab_size=256, sliding_window=WINDOW,
                           rope_scaling={"rope_type": "linear", "factor": 8.0}),
}


def build(raw: dict[str, Any], folder: Path, hf_class: Any = None) -> Any:
    """transformers' model from `raw` written as config.json, weights drawn, saved; the folder
    keeps `raw` as its config.json."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    config = AutoConfig.from_pretrained(folder)
    torch.manual_seed(0)
    model = (hf_class(config) if hf_class else AutoModelForCausalLM.from_config(config)).eval()
    randomize_weights(model, 0.0 if config.model_type.startswith("gemma") else 1.0)
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(raw))
    return model


def ours(folder: Path, ids: list[int], **options: Any) -> tuple[torch.Tensor, Any]:
    loaded = load_model(str(folder), **options)
    kv = KVCache.from_config(loaded.config, 256, torch.float32, "cpu")
    batch = ForwardBatch.build([ids], [0], [torch.arange(len(ids))])
    logits = loaded.model.compute_logits(loaded.model.forward(batch, kv))
    return torch.log_softmax(logits, dim=-1), loaded.config


def theirs(model: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)


IDS = torch.randint(3, 256, (40,), generator=torch.Generator().manual_seed(1)).tolist()


@pytest.mark.parametrize("name", list(SHIPPED))
def test_a_shipped_config_reads_as_transformers_reads_it(name: str, tmp_path: Path) -> None:
    hf = build(SHIPPED[name], tmp_path)
    got, config = ours(tmp_path, IDS)
    torch.testing.assert_close(got, theirs(hf, IDS), atol=1e-4, rtol=0)
    if "window" in name:
        assert config.sliding_window == WINDOW and None in config.windows  # not every layer


def test_gemma3_multimodal_as_google_ships_it(tmp_path: Path) -> None:
    """A text_config of five keys (the 4B's shape), eos <end_of_turn> at the top level and the
    language model's tensors under the multimodal prefixes; the vision tower is skipped."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = dict(hidden_size=64, intermediate_size=112, num_hidden_layers=6,
                sliding_window=WINDOW, rope_scaling={"factor": 8.0, "rope_type": "linear"})
    vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
                  num_attention_heads=2, num_hidden_layers=1, image_size=28, patch_size=14,
                  vision_use_head=False)
    raw = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
           "eos_token_id": [1, 106], "mm_tokens_per_image": 4,
           "text_config": {"model_type": "gemma3_text", **text}, "vision_config": vision}
    hf = build(raw, tmp_path, Gemma3ForConditionalGeneration)
    assert isinstance(hf.config, Gemma3Config)
    got, config = ours(tmp_path, IDS)
    torch.testing.assert_close(got, theirs(hf, IDS), atol=1e-4, rtol=0)
    assert (config.rope_theta, config.hidden_act) == (1000000.0, "gelu_pytorch_tanh")
    assert set(config.eos_token_ids) == {1, 106}


@pytest.mark.parametrize("family", ["llama", "gemma", "olmo2", "gpt_oss"])
def test_rmsnorm_rounds_in_bfloat16_as_transformers(family: str) -> None:
    """Llama casts the normalized x to bf16, then multiplies; Gemma, OLMo-2 and gpt-oss
    multiply in float32 and cast once: bit for bit the same as their classes."""
    import importlib

    from radixrt.runtime.models.layers import RMSNorm

    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    cls = getattr(module, {"llama": "LlamaRMSNorm", "gemma": "GemmaRMSNorm",
                           "olmo2": "Olmo2RMSNorm", "gpt_oss": "GptOssRMSNorm"}[family])
    theirs_norm = cls(64, eps=1e-5)
    offset = 1.0 if family == "gemma" else 0.0
    ours_norm = RMSNorm(64, 1e-5, offset, weight_first=family in ("olmo2", "gpt_oss"))
    weight = torch.randn(64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs_norm.weight.copy_(weight)
        ours_norm.weight.copy_(weight)
    theirs_norm, ours_norm = theirs_norm.to(torch.bfloat16), ours_norm.to(torch.bfloat16)
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(ours_norm(x), theirs_norm(x))


def test_longrope_picks_its_factors_by_the_served_context(tmp_path: Path) -> None:
    """Served within its original context (--context-length 32), a LongRoPE model runs its short
    factors: transformers' on a short prompt; served longer, the long ones."""
    hf = build(SHIPPED["phi3-longrope-legacy"], tmp_path)
    short = IDS[:20]
    got, config = ours(tmp_path, short, context_length=32)
    assert config.served_context == 32
    torch.testing.assert_close(got, theirs(hf, short), atol=1e-4, rtol=0)
    got, _ = ours(tmp_path, IDS)  # served at the model's 512 positions: the long factors
    torch.testing.assert_close(got, theirs(hf, IDS), atol=1e-4, rtol=0)
    wrong, _ = ours(tmp_path, short)
    assert (wrong - theirs(hf, short)).abs().max() > 1e-2
