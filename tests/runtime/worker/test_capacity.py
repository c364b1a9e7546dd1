"""KV capacity, stated: the worked case of a Llama-3-8B config on an 80 GiB device through
`radixrt plan` (the config alone, nothing loaded), the pool arithmetic the worker uses, and on
the default model: its parameter count against the loaded weights, and the capacity the running
engine reports against its pool."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from radixrt.cli import main
from radixrt.plan_cli import parse_memory
from radixrt.runtime.models.loader import inspect_model
from radixrt.runtime.worker.capacity import (
    Capacity,
    Workload,
    kv_bytes_per_token,
    parameter_count,
    plan,
    tier_tokens,
)

LLAMA3_8B = {  # Meta-Llama-3-8B's config.json
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "bos_token_id": 128000,
    "eos_token_id": 128001, "torch_dtype": "bfloat16",
}


@pytest.fixture
def llama3(tmp_path: Path) -> str:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    return str(tmp_path)


def test_llama3_8b_on_80gib_is_the_worked_case(llama3: str, capsys: Any) -> None:
    """8,030,261,248 parameters (the published count): 16.06 GB in bf16; 128 KiB of KV per
    token (32 layers x 8 KV heads x 128 x K and V x 2 bytes); 0.9 of the 65.04 GiB left is
    479,545 tokens, 29,971 pages of 16. Requests of 1024 prompt tokens, 512 output on average
    and 2048 at most: contiguous reservation holds 479,536 // 3072 = 156 at once, paged
    allocation 479,536 // 1536 = 312, and with a 512-token prefix held once 467."""
    code = main(["plan", "--model", llama3, "--memory", "80GiB", "--mem-fraction", "0.9",
                 "--page-size", "16", "--prompt-tokens", "1024", "--mean-output-tokens", "512",
                 "--max-output-tokens", "2048", "--shared-prefix-tokens", "512",
                 "--requests", "64", "--json"])
    assert code == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["parameters"] == 8_030_261_248
    assert figures["weight_bytes"] == 16_060_522_496
    assert figures["kv_bytes_per_token"] == 131_072
    assert figures["pool_pages"] == 29_971 and figures["pool_tokens"] == 479_536
    assert figures["concurrent_contiguous"] == 156
    assert figures["concurrent_paged"] == 312
    assert figures["concurrent_paged_worst_case"] == 156
    assert figures["concurrent_paged_shared_prefix"] == 467
    assert figures["prefill_tokens_saved"] == 63 * 512
    assert figures["max_concurrency_at_context_length"] == 479_536 // 8192 == 58
    main(["plan", "--model", llama3, "--memory", "80GiB", "--shared-prefix-tokens", "64"])
    text = capsys.readouterr().out
    assert "8.03 B parameters" in text and "128 KiB" in text and "held once" in text


def test_the_kv_tiers_are_sized_from_host_memory_and_disk_space(llama3: str,
                                                               capsys: Any) -> None:
    """128 KiB per token: 256 GiB of host memory hold 2,097,152 tokens (whole pages of 16);
    1 TB of disk holds its pages and their records (16 pages' tokens plus 124 record bytes a
    page), less the file's header and record area."""
    code = main(["plan", "--model", llama3, "--memory", "80GiB", "--page-size", "16",
                 "--host-memory", "256GiB", "--disk-space", "1TB", "--json"])
    assert code == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["host_tier_tokens"] == 256 * 8192 == 2_097_152
    page = 131_072 * 16 + 60 + 4 * 16
    assert figures["disk_tier_tokens"] == (10**12 - 4096 - 4096) // page * 16
    main(["plan", "--model", llama3, "--memory", "80GiB", "--host-memory", "256GiB"])
    text = capsys.readouterr().out
    assert "--host-cache-tokens 2097152" in text and "disk KV tier" not in text
    assert tier_tokens(100, 4, 0, 0) == (0, 0)


@pytest.mark.parametrize(("args", "message"), [
    (["--memory", "lots"], "give a size such as 80GiB"),
    (["--memory", "80GiB", "--host-memory", "much"], "give a size such as 80GiB"),
    (["--memory", "8GiB"], "the weights alone take 14.96 GiB"),
    (["--memory", "80GiB", "--prompt-tokens", "8000", "--max-output-tokens", "1024"],
     "exceed the context length 8192"),
    (["--memory", "80GiB", "--shared-prefix-tokens", "600", "--prompt-tokens", "500"],
     "shared prefix must be part of the prompt"),
])
def test_plans_that_cannot_be_are_refused_by_name(llama3: str, capsys: Any, args: list[str],
                                                   message: str) -> None:
    assert main(["plan", "--model", llama3, *args]) == 2
    assert message in capsys.readouterr().err


def test_memory_sizes_and_page_rounding() -> None:
    assert parse_memory("80GiB") == 80 << 30 and parse_memory("24 GB") == 24 * 10**9
    assert parse_memory("512MiB") == 512 << 20
    pool = Capacity(bytes_per_token=100, page_size=16, pages=10, context_length=4096)
    assert pool.tokens == 160
    assert pool.concurrency(17) == 5  # 17 tokens take two pages of 16
    assert pool.concurrency(40, shared_prefix=32) == 8  # 32 held once (2 pages), 8 own (1 page)
    assert pool.info(64)["max_concurrency_at_typical_length"] == 2
    assert "10 pages of 16 = 160 tokens" in pool.describe(64)


def test_the_default_models_plan_counts_its_loaded_weights(loaded_model: Any) -> None:
    """From the GGUF header alone, the parameters and KV bytes the loaded model has, and the
    bytes its weights take packed (what `radixrt plan` counts for weight_format auto)."""
    from types import SimpleNamespace

    from radixrt.plan_cli import held_weight_bytes

    config = inspect_model("default")
    assert parameter_count(config) == loaded_model.model.weight_count()
    figures = plan(config, 1 << 30, 4, 1, 0.5, 8192, Workload(100, 50, 200))
    assert figures["kv_bytes_per_token"] == kv_bytes_per_token(loaded_model.config.kv_layout, 4)
    engine = SimpleNamespace(model="default", weight_format="auto", quantization=None)
    assert held_weight_bytes(engine, config, 4) == sum(
        loaded_model.model.weight_formats().values())


def test_the_engine_states_its_capacity(make_engine: Any) -> None:
    engine = make_engine(max_total_tokens=4096, page_size=16)
    capacity = engine.stats()["capacity"]
    per_token = kv_bytes_per_token(engine.model_config.kv_layout, 4)  # float32 on the CPU
    assert capacity["bytes_per_token"] == per_token
    assert capacity["pages"] * capacity["page_size"] == capacity["tokens"] == 4096
    assert capacity["bytes"] == 4096 * per_token
    assert capacity["max_concurrency_at_context_length"] == 4096 // engine.context_length
    assert capacity["max_concurrency_at_typical_length"] == 4096 // 1024


@pytest.mark.parametrize("name", ["gemma2", "gemma3", "olmo2", "phi3-window", "granite",
                                  "mixtral", "qwen2-moe", "qwen3-moe", "olmoe", "gpt-oss"])
def test_every_familys_plan_counts_its_weights(name: str, tmp_path: Path) -> None:
    """config.json alone gives the parameters the family's model holds (dummy weights drawn
    for the same config), and for a mixture of experts the active ones: all but the experts a
    token does not use."""
    from tiny_models import build_config

    from radixrt.runtime.models.loader import load_model

    build_config(name, vocab_size=96).save_pretrained(tmp_path)
    config = inspect_model(str(tmp_path))
    held = sum(p.numel() for p in load_model(str(tmp_path), load_format="dummy").model.parameters())
    assert parameter_count(config) == held
    unused = sum(config.moe_kinds) * (config.num_experts - config.num_experts_per_tok)
    figures = plan(config, 1 << 30, 4, 1, 0.5, 256, Workload(100, 50, 100))
    per_expert = figures["expert_parameters"] // max(sum(config.moe_kinds) * config.num_experts, 1)
    assert figures["active_parameters"] == held - unused * per_expert
    assert (figures["expert_parameters"] > 0) == (config.num_experts > 0)


QWEN3_30B_A3B = {  # Qwen3-30B-A3B's config.json (the fields the plan reads)
    "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
    "norm_topk_prob": True, "vocab_size": 151936, "max_position_embeddings": 40960,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
}


def test_qwen3_30b_a3b_plan_states_its_experts(tmp_path: Path, capsys: Any) -> None:
    """The published 30.5 B parameters, 3.3 B active, from the config alone."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_30B_A3B))
    assert main(["plan", "--model", str(tmp_path), "--memory", "80GiB"]) == 0
    out = capsys.readouterr().out
    assert "30.53 B parameters" in out
    assert "mixture of experts: 28.99 B parameters in experts, 3.35 B active per token" in out
