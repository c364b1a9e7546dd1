"""The shapes benchmarks/gpu_check.py runs: Llama-3-8B's on a GPU, tiny ones for --dry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "vocab_size": 128256, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 8192, "tie_word_embeddings": False,
}  # fmt: skip
TINY_LLAMA = LLAMA3_8B | {
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 512,
}  # fmt: skip


@dataclass(frozen=True)
class Sizes:
    heads: int
    kv_heads: int
    head_dim: int
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    extend_cases: tuple[tuple[int, int, int], ...]  # (requests, new tokens each, prefix each)
    cascade_cases: tuple[tuple[int, int, int, int], ...]  # (requests, groups, prefix, own each)
    # (requests, context each, sliding window, logit cap: 0 = off)
    window_decode_cases: tuple[tuple[int, int, int, float], ...]
    # (requests, new tokens each, prefix each, sliding window, logit cap: 0 = off)
    window_extend_cases: tuple[tuple[int, int, int, int, float], ...]
    model_config: dict[str, Any]
    model_cases: tuple[tuple[int, int], ...]  # (batch, context)
    copy_bytes: int
    test_filter: str | None  # pytest -k expression; None runs the whole kernel and model tests


GPU_SIZES = Sizes(
    32, 8, 128, (1, 16, 64, 256), (512, 2048, 8192),
    ((1, 4096, 0), (4, 1024, 3072), (32, 128, 1920)),
    ((32, 1, 4096, 16), (64, 1, 2048, 64), (64, 1, 4096, 32), (64, 2, 4096, 32)),
    ((1, 8192, 1024, 0.0), (64, 8192, 4096, 0.0), (64, 8192, 4096, 50.0), (256, 2048, 1024, 50.0)),
    ((1, 8192, 0, 4096, 0.0), (1, 8192, 0, 4096, 50.0), (4, 1024, 7168, 4096, 50.0)),
    LLAMA3_8B, ((1, 1024), (16, 1024), (64, 2048), (128, 2048)), 2 << 30, None,
)  # fmt: skip
DRY_SIZES = Sizes(
    8, 2, 64, (1, 3), (16, 40), ((1, 24, 0), (2, 8, 20)), ((3, 1, 40, 3), (4, 2, 24, 5)),
    ((2, 40, 16, 0.0), (2, 40, 16, 5.0)), ((1, 24, 0, 10, 0.0), (2, 8, 20, 10, 5.0)),
    TINY_LLAMA, ((1, 16), (2, 24)), 64 << 20, "store_kv",
)  # fmt: skip
