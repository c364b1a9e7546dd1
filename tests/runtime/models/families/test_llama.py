"""Our Llama-family model code vs Hugging Face transformers on the same weights (CPU, float32).

The default model (SmolLM2-135M-Instruct GGUF) comes from the session fixtures `loaded_model` and
`hf_model` of tests/conftest.py; tiny random Qwen2 / Qwen3 / Llama-3 / Mistral checkpoints are
built here with transformers' own classes and loaded through our HF-folder loader.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import hf_logprobs, randomize_weights
from torch import Tensor

from radixrt.runtime.forward.forward_batch import ForwardBatch
from radixrt.runtime.forward.kv_cache import KVCache
from radixrt.runtime.models import LoadedModel, default_model_path, load_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")

POOL_SLOTS = 1024
DECODE_STEPS = 16
PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "Why is the sky blue?"},
    ],
    "The quick brown fox jumps over the lazy dog. Once upon a time, in a small village,",
]


class Runner:
    """Drives our model through a KV pool whose slots are handed out in a random order."""

    def __init__(self, loaded: LoadedModel, seed: int = 0) -> None:
        self.model = loaded.model
        self.kv = KVCache.from_config(loaded.config, POOL_SLOTS, torch.float32, "cpu")
        self.free = torch.randperm(POOL_SLOTS, generator=torch.Generator().manual_seed(seed))
        self.next_free = 0

    def slots(self, n: int) -> Tensor:
        out = self.free[self.next_free : self.next_free + n]
        self.next_free += n
        return out

    def logprobs(self, batch: ForwardBatch, rows: Tensor | None = None) -> Tensor:
        hidden = self.model.forward(batch, self.kv)  # [num_tokens, hidden]
        if rows is not None:
            hidden = hidden[rows]
        return torch.log_softmax(self.model.compute_logits(hidden), dim=-1)


def encode(tokenizer: Any, prompt: str | list[dict[str, str]]) -> list[int]:
    if isinstance(prompt, str):
        return list(tokenizer(prompt).input_ids)
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


@pytest.fixture(scope="session")
def hf_tokenizer() -> Any:
    """The GGUF tokenizer converted directly by transformers (ours may come from a disk cache)."""
    from transformers import AutoTokenizer

    folder, fname = default_model_path()
    return AutoTokenizer.from_pretrained(folder, gguf_file=fname)


def test_config_and_tokenizer(loaded_model: LoadedModel, hf_tokenizer: Any) -> None:
    cfg = loaded_model.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (30, 576, 9, 3)
    assert cfg.tie_word_embeddings and cfg.vocab_size == 49152
    assert loaded_model.gguf_file is not None and loaded_model.gguf_file.endswith(".gguf")
    ours = loaded_model.tokenizer
    for prompt in PROMPTS:
        assert encode(ours, prompt) == encode(hf_tokenizer, prompt)
    assert (ours.bos_token_id, ours.eos_token_id) == (hf_tokenizer.bos_token_id, 2)


@pytest.mark.parametrize("prompt_index", range(len(PROMPTS)))
def test_prefill_and_greedy_decode_match_hf(
    loaded_model: LoadedModel, hf_model: Any, hf_tokenizer: Any, prompt_index: int
) -> None:
    ids = encode(hf_tokenizer, PROMPTS[prompt_index])
    run = Runner(loaded_model, seed=prompt_index)
    table = run.slots(len(ids) + DECODE_STEPS)
    ours = run.logprobs(ForwardBatch.build([ids], [0], [table]))  # [len, vocab]
    torch.testing.assert_close(ours, hf_logprobs(hf_model, ids), atol=1e-3, rtol=0)

    with torch.no_grad():
        gen = hf_model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.int64),
            do_sample=False,
            max_new_tokens=DECODE_STEPS,
            min_new_tokens=DECODE_STEPS,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=loaded_model.config.eos_token_id,
        )
    hf_tokens = gen.sequences[0, len(ids) :].tolist()
    eos = torch.tensor(loaded_model.config.eos_token_ids)
    step_logprobs = ours[-1:]
    tokens: list[int] = []
    for step in range(DECODE_STEPS):
        expected = torch.log_softmax(gen.logits[step][0].float(), dim=-1)
        torch.testing.assert_close(step_logprobs[0], expected, atol=1e-3, rtol=0)
        # min_new_tokens makes HF mask EOS in its choice (its raw logits keep it): do the same
        tokens.append(int(step_logprobs[0].index_fill(0, eos, float("-inf")).argmax()))
        prefix_len = len(ids) + step
        batch = ForwardBatch.build([[tokens[-1]]], [prefix_len], [table[: prefix_len + 1]])
        step_logprobs = run.logprobs(batch)
    assert tokens == hf_tokens


def test_mixed_extend_and_decode_batch(
    loaded_model: LoadedModel, hf_model: Any, hf_tokenizer: Any
) -> None:
    """One batch: A extends after a cached prefix, B decodes; equals running each alone and HF."""
    ids_a = encode(hf_tokenizer, PROMPTS[1])
    ids_b = encode(hf_tokenizer, PROMPTS[2])
    run = Runner(loaded_model, seed=7)
    table_a, table_b = run.slots(len(ids_a)), run.slots(len(ids_b) + 1)
    cut = len(ids_a) * 3 // 5
    run.logprobs(ForwardBatch.build([ids_a[:cut]], [0], [table_a]))
    first_b = run.logprobs(ForwardBatch.build([ids_b], [0], [table_b]), torch.tensor([-1]))
    token_b = int(first_b[0].argmax())

    mixed = ForwardBatch.build([ids_a[cut:], [token_b]], [cut, len(ids_b)], [table_a, table_b])
    together = run.logprobs(mixed)  # [len(ids_a) - cut + 1, vocab]
    alone_a = run.logprobs(ForwardBatch.build([ids_a[cut:]], [cut], [table_a]))
    alone_b = run.logprobs(ForwardBatch.build([[token_b]], [len(ids_b)], [table_b]))
    torch.testing.assert_close(together, torch.cat([alone_a, alone_b]), atol=1e-4, rtol=0)

    torch.testing.assert_close(alone_a, hf_logprobs(hf_model, ids_a)[cut:], atol=1e-3, rtol=0)
    expected_b = hf_logprobs(hf_model, ids_b + [token_b])[-1]
    torch.testing.assert_close(alone_b[0], expected_b, atol=1e-3, rtol=0)


# --- the engine's output logprobs vs HF, in each configuration docs/testing.md lists -----------

SHARED = "You are a helpful assistant. Answer every question in one short sentence. Question: "
ENGINE_PROMPTS = [SHARED + q for q in ("What is the capital of France?", "Why is the sky blue?",
                                       "What do bees make?", "How many legs has a spider?")]
TIGHT_POOL = 64  # every request fits alone, not all four at once
ENGINE_CONFIGS: dict[str, dict[str, Any]] = {
    "lpm-radix-cache": {},  # the defaults
    "no-radix-cache": dict(disable_radix_cache=True),
    "page-16": dict(page_size=16),
    "chunked-prefill": dict(max_num_batched_tokens=16),
    "preempt-recompute": dict(max_total_tokens=TIGHT_POOL, preemption="recompute"),
    "preempt-swap": dict(max_total_tokens=TIGHT_POOL, preemption="swap"),
    "fcfs": dict(schedule_policy="fcfs"),
    "dfs-weight": dict(schedule_policy="dfs-weight"),
}


@pytest.fixture(scope="module")
def hf_scores(hf_model: Any) -> Callable[[list[int]], Tensor]:
    """HF log-probabilities of a whole sequence, computed once per sequence."""
    cache: dict[tuple[int, ...], Tensor] = {}

    def score(ids: list[int]) -> Tensor:
        if tuple(ids) not in cache:
            cache[tuple(ids)] = hf_logprobs(hf_model, ids)
        return cache[tuple(ids)]

    return score


@pytest.mark.parametrize("name", list(ENGINE_CONFIGS))
def test_engine_logprobs_match_hf_in_every_configuration(
    make_engine: Callable[..., Any], hf_scores: Callable[[list[int]], Tensor], name: str
) -> None:
    """All four prompts at once, then again (reversed: cache hits with the radix cache), greedy
    with logprobs: each token is HF's argmax and its logprob HF's, whatever the configuration."""
    from radixrt import SamplingParams

    options = ENGINE_CONFIGS[name]
    engine = make_engine(**options)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=True)
    outs = engine.generate(ENGINE_PROMPTS, params) + engine.generate(ENGINE_PROMPTS[::-1], params)
    for out in outs:
        n = out.prompt_tokens
        ref = hf_scores(out.prompt_token_ids + out.token_ids)
        assert len(out.logprobs) == len(out.token_ids) == params.max_tokens
        for i, (token, lp) in enumerate(zip(out.token_ids, out.logprobs)):
            row = ref[n - 1 + i]
            assert lp.token_id == token and int(row.argmax()) == token, (name, i)
            assert abs(lp.logprob - row[token].item()) < 1e-3, (name, i)
    stats = engine.stats()
    assert (stats["cached_tokens"] > 0) == (not options.get("disable_radix_cache", False))
    if "preemption" in options:
        assert stats["preemptions"] > 0
        assert (stats["swaps"] > 0) == (options["preemption"] == "swap")


# --- tiny random checkpoints built with transformers' own classes --------------------------------

TINY = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=112,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def _tiny_qwen2() -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(**TINY, tie_word_embeddings=True))


def _tiny_qwen3() -> Any:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(Qwen3Config(**TINY, head_dim=24, tie_word_embeddings=False))


def _tiny_llama3() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**TINY, rope_scaling=LLAMA3_ROPE, tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def _tiny_llama_linear() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {"rope_type": "linear", "factor": 3.0, "rope_theta": 10000.0}
    return LlamaForCausalLM(LlamaConfig(**TINY, rope_scaling=rope, tie_word_embeddings=True))


def _tiny_mistral() -> Any:
    from transformers import MistralConfig, MistralForCausalLM

    return MistralForCausalLM(MistralConfig(**TINY, sliding_window=None))


TINY_BUILDERS: dict[str, Callable[[], Any]] = {
    "qwen2": _tiny_qwen2,
    "qwen3": _tiny_qwen3,
    "llama3": _tiny_llama3,
    "llama-linear-rope": _tiny_llama_linear,
    "mistral": _tiny_mistral,
}


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """name -> (folder with config.json + safetensors, the HF model) with non-trivial weights."""
    out = {}
    for i, (name, build) in enumerate(TINY_BUILDERS.items()):
        torch.manual_seed(i)
        model = build().eval()
        randomize_weights(model)
        folder = tmp_path_factory.mktemp(f"tiny_{name}")
        model.save_pretrained(folder)
        out[name] = (folder, model)
    return out


@pytest.mark.parametrize("name", list(TINY_BUILDERS))
def test_tiny_hf_checkpoint_matches(name: str, tiny_checkpoints: dict[str, Any]) -> None:
    folder, hf = tiny_checkpoints[name]
    loaded = load_model(str(folder))
    assert loaded.tokenizer is None and loaded.gguf_file is None
    cfg = loaded.config
    assert cfg.attention_bias == (name == "qwen2") and cfg.qk_norm == (name == "qwen3")
    ids = torch.randint(0, TINY["vocab_size"], (120,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0].float()  # [120, vocab]

    run = Runner(loaded, seed=11)
    table = run.slots(len(ids))
    full = loaded.model.compute_logits(
        loaded.model.forward(ForwardBatch.build([ids], [0], [table]), run.kv)
    )
    torch.testing.assert_close(full, expected, atol=1e-4, rtol=1e-4)

    # the same sequence again in other slots: a chunk, a chunk after a prefix, then decodes
    table = run.slots(len(ids))
    got = []
    for start, end in [(0, 70), (70, 110), *[(p, p + 1) for p in range(110, 120)]]:
        batch = ForwardBatch.build([ids[start:end]], [start], [table])
        got.append(loaded.model.compute_logits(loaded.model.forward(batch, run.kv)))
    torch.testing.assert_close(torch.cat(got), expected, atol=1e-4, rtol=1e-4)


def test_tiny_bfloat16_and_dummy(tiny_checkpoints: dict[str, Any]) -> None:
    folder, hf = tiny_checkpoints["llama3"]
    ids = torch.arange(1, 40)
    with torch.no_grad():
        expected = hf(ids[None]).logits[0].float()
    loaded = load_model(str(folder), dtype="bfloat16")
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    kv = KVCache.from_config(loaded.config, 64, torch.bfloat16, "cpu")
    batch = ForwardBatch.build([ids], [0], [torch.arange(len(ids))])
    logits = loaded.model.compute_logits(loaded.model.forward(batch, kv))
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, expected, atol=0.15, rtol=0.05)

    dummy = load_model(str(folder), load_format="dummy")
    assert dummy.tokenizer is None
    kv = KVCache.from_config(dummy.config, 64, torch.float32, "cpu")
    out = dummy.model.compute_logits(dummy.model.forward(batch, kv))
    assert out.shape == (len(ids), TINY["vocab_size"]) and torch.isfinite(out).all()


# --- RoPE scaling as GGUF files carry it --------------------------------------------------------
def llama_cpp_freq_factors(head_dim: int, rope: dict[str, Any]) -> list[float]:
    """The rope_freqs tensor llama.cpp's converter writes for a Llama-3.1 checkpoint (its own
    formula, written out here independently of HF's llama3 scaling)."""
    import math

    base, factor = rope["rope_theta"], rope["factor"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    old_context = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_context / low, old_context / high
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi / (1.0 / base ** (i / head_dim))
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return factors


def test_gguf_llama3_frequency_factors_match_hf(tiny_checkpoints: dict[str, Any]) -> None:
    """A Llama-3.1 GGUF stores its RoPE scaling as per-frequency factors (rope_freqs): run with
    them, the tiny llama3 model gives HF's logits past its 64-token original context."""
    from radixrt.runtime.models.rope import RotaryEmbedding

    folder, hf = tiny_checkpoints["llama3"]
    loaded = load_model(str(folder))
    cfg = loaded.config
    factors = llama_cpp_freq_factors(cfg.head_dim, LLAMA3_ROPE)
    scaling = {"rope_type": "freq_factors", "factors": tuple(factors)}  # as gguf_config reads it
    rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, scaling)
    torch.testing.assert_close(rotary.inv_freq, loaded.model.rotary.inv_freq)  # = HF's llama3
    loaded.model.rotary = rotary
    ids = torch.randint(0, TINY["vocab_size"], (120,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0].float()
    run = Runner(loaded, seed=3)
    batch = ForwardBatch.build([ids], [0], [run.slots(len(ids))])
    got = loaded.model.compute_logits(loaded.model.forward(batch, run.kv))
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    plain = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, None)  # what was run before
    assert not torch.allclose(plain.inv_freq, rotary.inv_freq)
