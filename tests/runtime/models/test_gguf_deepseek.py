"""DeepSeek-V2-Lite, DeepSeek-V3 and GLM-4.5 from GGUF files as llama.cpp's converter writes them
(tests/gguf_convert.py: `deepseek2` with kv_b_proj split per head into attn_k_b / attn_v_b, as
current converters write it, or whole with the heads' sizes as key_length, as earlier ones did;
`glm4moe` with its multi-token-prediction layer), against transformers on the same weights and
against the same checkpoint's folder (CPU, float32).

Each tiny model (tests/tiny_models.py) is built once per module, with the GGUF test vocabulary;
greedy decoding through the KV cache must pick transformers' argmax at every step, each token's
logprob within 1e-3 of transformers'."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import pytest
import torch
from gguf_convert import tiny_tokenizer, write_gguf
from tiny_models import build_tiny
from torch import Tensor

from radixrt.runtime.distributed.group import TPGroup
from radixrt.runtime.forward.forward_batch import ForwardBatch
from radixrt.runtime.forward.kv_cache import KVCache
from radixrt.runtime.models import LoadedModel, load_model
from radixrt.runtime.models.gguf_config import gguf_hf_config
from radixrt.runtime.models.loader import cpu_kernels_for

TOLERANCE = 1e-3  # logprob, float32
PROMPT_LEN, STEPS = 24, 8
# file -> (tiny model, GGUF architecture, how the converter ran)
FILES: dict[str, tuple[str, str, dict[str, bool]]] = {
    "deepseek-v2-lite": ("deepseek-v2-lite", "deepseek2", {}),
    "deepseek-v2-lite-earlier": ("deepseek-v2-lite", "deepseek2", {"earlier": True}),
    "deepseek-v3": ("deepseek-v3", "deepseek2", {}),
    "glm4-moe": ("glm4-moe", "glm4moe", {}),
}


@pytest.fixture(scope="module", autouse=True)
def _cpu_kernels() -> None:
    """The CPU kernels built (or found) in the user's cache before _tokenizer_cache moves
    RADIXRT_CACHE_DIR, which names their folder too, to a test's own (a build takes seconds)."""
    cpu_kernels_for(torch.device("cpu"), torch.float32)


@pytest.fixture(autouse=True)
def _tokenizer_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXRT_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Any]]:
    """tiny model name -> (its checkpoint folder, the transformers model), built on first use."""
    built: dict[str, tuple[Path, Any]] = {}
    tokenizer = tiny_tokenizer()

    def get(name: str) -> tuple[Path, Any]:
        if name not in built:
            folder = tmp_path_factory.mktemp(name)
            built[name] = (folder, build_tiny(name, folder, tokenizer, seed=len(built)))
        return built[name]

    return get


def converted(tiny: Callable[[str], tuple[Path, Any]], file: str, tmp_path: Path,
              **options: Any) -> tuple[Path, Path, Any]:
    """(the GGUF written from the file's tiny model, its folder, the transformers model)."""
    name, arch, conversion = FILES[file]
    folder, model = tiny(name)
    path = tmp_path / f"{file}.gguf"
    write_gguf(path, model, arch, **conversion, **options)
    return path, folder, model


def greedy(loaded: LoadedModel, prompt: list[int], steps: int) -> tuple[list[int], Tensor]:
    """The prompt prefilled, then `steps` tokens decoded one at a time over the KV cache (slots
    in a random order): the tokens and each chosen token's logprob [steps]."""
    total = len(prompt) + steps
    kv = KVCache.from_config(loaded.config, 2 * total, torch.float32, "cpu")
    table = torch.randperm(2 * total, generator=torch.Generator().manual_seed(1))[:total]
    ids, chosen, start = list(prompt), [], 0
    while len(ids) < total:
        batch = ForwardBatch.build([ids[start:]], [start], [table])
        logits = loaded.model.compute_logits(loaded.model.forward(batch, kv))[-1]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        start = len(ids)
        ids.append(int(logprobs.argmax()))
        chosen.append(logprobs[ids[-1]])
    return ids[len(prompt) :], torch.stack(chosen)


def hf_logprobs(model: Any, ids: list[int]) -> Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def assert_greedy_matches_hf(loaded: LoadedModel, model: Any, tolerance: float) -> None:
    prompt = torch.randint(3, 96, (PROMPT_LEN,), generator=torch.Generator().manual_seed(3))
    tokens, ours = greedy(loaded, prompt.tolist(), STEPS)
    theirs = hf_logprobs(model, prompt.tolist() + tokens)[PROMPT_LEN - 1 : -1]  # [STEPS, vocab]
    assert tokens == theirs.argmax(dim=-1).tolist()
    expected = theirs.gather(1, torch.tensor(tokens)[:, None])[:, 0]
    torch.testing.assert_close(ours, expected, atol=tolerance, rtol=0)


@pytest.mark.parametrize("file", list(FILES))
def test_gguf_greedy_matches_transformers_and_the_folder(
        file: str, tmp_path: Path, tiny: Callable[[str], tuple[Path, Any]]) -> None:
    path, folder, model = converted(tiny, file, tmp_path)
    from_gguf, from_folder = load_model(str(path)), load_model(str(folder))
    ours, theirs = (dataclasses.asdict(m.config) for m in (from_gguf, from_folder))
    ours.pop("rope_scaling"), theirs.pop("rope_scaling")  # spelled differently
    assert ours == theirs
    for a, b in zip(from_gguf.model.rotaries(), from_folder.model.rotaries()):
        torch.testing.assert_close(a.inv_freq, b.inv_freq)
        assert a.attention_factor == pytest.approx(b.attention_factor)
    assert_greedy_matches_hf(from_gguf, model, TOLERANCE)


@pytest.mark.parametrize("file", ["deepseek-v2-lite-earlier", "deepseek-v3", "glm4-moe"])
def test_a_q8_0_gguf_loads_packed_as_it_loads_dequantized(
        file: str, tmp_path: Path, tiny: Callable[[str], tuple[Path, Any]]) -> None:
    """gguf-py's Q8_0 (attn_kv_b, or attn_v_b per head, quantized too): the projections stay
    packed and kv_b_proj loads as floats; packed and dequantized decode the same tokens with
    the same logprobs (to float rounding), and every dequantized weight is the folder's to
    Q8_0's rounding: half a step (1/127 of the block's largest value), and the step's own
    float16 rounding times up to 127."""
    path, folder, _ = converted(tiny, file, tmp_path, quantize=gguf.GGMLQuantizationType.Q8_0)
    packed = load_model(str(path), weight_format="packed")
    dense = load_model(str(path), weight_format="dequantized")
    assert any(fmt.startswith("i8") for fmt in packed.model.weight_formats())
    latent = [m for name, m in packed.model.named_modules() if name.endswith("kv_b_proj")]
    assert all(m.weight.dtype == torch.float32 for m in latent)
    prompt = torch.randint(3, 96, (PROMPT_LEN,), generator=torch.Generator().manual_seed(5))
    tokens, logprobs = greedy(packed, prompt.tolist(), STEPS)
    dense_tokens, dense_logprobs = greedy(dense, prompt.tolist(), STEPS)
    assert tokens == dense_tokens
    torch.testing.assert_close(logprobs, dense_logprobs, atol=1e-4, rtol=0)
    expected = load_model(str(folder)).model.state_dict()
    for key, value in dense.model.state_dict().items():
        step = expected[key].abs().max() / 127
        torch.testing.assert_close(value, expected[key], atol=0.6 * step, rtol=0, msg=key)


def test_split_kv_b_shards_read_only_their_heads(
        tmp_path: Path, tiny: Callable[[str], tuple[Path, Any]]) -> None:
    """At tp_size 2 each rank's kv_b_proj (its heads' rows, re-assembled from attn_k_b /
    attn_v_b) and every other shard from the GGUF equal the folder's."""
    path, folder, _ = converted(tiny, "deepseek-v3", tmp_path)
    for rank in range(2):
        ours = load_model(str(path), tp=TPGroup(rank=rank, size=2)).model.state_dict()
        theirs = load_model(str(folder), tp=TPGroup(rank=rank, size=2)).model.state_dict()
        assert ours.keys() == theirs.keys()
        for key, value in ours.items():
            torch.testing.assert_close(value, theirs[key], atol=0, rtol=0, msg=key)


# --- the metadata alone ------------------------------------------------------------------------
def _deepseek2_meta(**keys: Any) -> dict[str, Any]:
    """DeepSeek-V2's (236B) keys as the current converter writes them, shrunk."""
    meta = {"block_count": 3, "embedding_length": 64, "feed_forward_length": 112,
            "attention.head_count": 4, "attention.head_count_kv": 1,
            "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 10000.0,
            "attention.q_lora_rank": 48, "attention.kv_lora_rank": 32,
            "attention.key_length": 48, "attention.value_length": 32,
            "attention.key_length_mla": 40, "attention.value_length_mla": 20,
            "rope.dimension_count": 16, "expert_count": 8, "expert_used_count": 2,
            "expert_group_count": 4, "expert_group_used_count": 2,
            "expert_feed_forward_length": 32, "expert_shared_count": 2,
            "leading_dense_block_count": 1, "expert_weights_scale": 16.0,
            "expert_gating_func": 1, "rope.scaling.type": "yarn", "rope.scaling.factor": 40.0,
            "rope.scaling.original_context_length": 4096,
            "rope.scaling.yarn_log_multiplier": 0.0707, **keys}
    return {"general.architecture": "deepseek2",
            **{f"deepseek2.{key}": value for key, value in meta.items() if value is not None}}


def test_deepseek2_metadata_reads_as_deepseeks_config() -> None:
    shapes = {"token_embd.weight": (96, 64), "output.weight": (96, 64)}
    cfg = gguf_hf_config(_deepseek2_meta(), shapes, {})
    assert cfg["architectures"] == ["DeepseekV2ForCausalLM"]
    assert (cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]) == (24, 16, 20)
    assert (cfg["kv_lora_rank"], cfg["q_lora_rank"], cfg["num_key_value_heads"]) == (32, 48, 4)
    assert (cfg["n_group"], cfg["topk_group"], cfg["topk_method"]) == (4, 2,
                                                                      "group_limited_greedy")
    assert (cfg["routed_scaling_factor"], cfg["norm_topk_prob"]) == (16.0, False)
    assert cfg["rope_scaling"]["mscale"] == cfg["rope_scaling"]["mscale_all_dim"] == 0.707
    earlier = _deepseek2_meta(**{"attention.key_length": 40, "attention.value_length": 20,
                                 "attention.key_length_mla": None,
                                 "attention.value_length_mla": None,
                                 "expert_gating_func": None, "expert_group_count": None,
                                 "expert_group_used_count": None})
    cfg = gguf_hf_config(earlier, shapes, {})
    assert (cfg["qk_nope_head_dim"], cfg["v_head_dim"], cfg["topk_method"]) == (24, 20, "greedy")
    v3 = _deepseek2_meta(expert_gating_func=2, expert_weights_norm=True)
    cfg = gguf_hf_config(v3, {**shapes, "blk.1.exp_probs_b.bias": (8,)}, {})
    assert (cfg["architectures"], cfg["topk_method"]) == (["DeepseekV3ForCausalLM"], "noaux_tc")


def test_deepseek2_metadata_it_cannot_honour_is_refused() -> None:
    shapes = {"token_embd.weight": (96, 64)}
    with pytest.raises(ValueError, match="not the latent cache's"):
        gguf_hf_config(_deepseek2_meta(**{"attention.key_length": 40}), shapes, {})
    with pytest.raises(ValueError, match="no correction bias .exp_probs_b. with sigmoid"):
        gguf_hf_config(_deepseek2_meta(expert_gating_func=2), shapes, {})
    with pytest.raises(ValueError, match="expert_gating_func=3"):
        gguf_hf_config(_deepseek2_meta(expert_gating_func=3), shapes, {})
    latent = ("attention.key_length", "attention.value_length", "attention.key_length_mla",
              "attention.value_length_mla", "rope.scaling.yarn_log_multiplier")
    glm = {key.replace("deepseek2.", "glm4moe."): value for key, value in
           _deepseek2_meta(**dict.fromkeys(latent)).items()}
    with pytest.raises(ValueError, match="glm4moe GGUF routes by softmax"):
        gguf_hf_config({**glm, "general.architecture": "glm4moe"}, shapes, {})
