"""Every supported family, dense and mixture-of-experts, against transformers on the same
weights, through the Engine.

For each tiny checkpoint of tests/tiny_models.py (a family's traits on: sliding windows shorter
than every prompt, soft-capping, sandwich and post norms, multipliers, NoPE layers, YaRN and
LongRoPE past their original context, partial rotary), four prompts sharing a prefix run greedy
twice (the second time reversed: radix-cache hits), in each engine configuration below; every
token must be transformers' argmax and its logprob transformers' within 1e-3 (float32), with
the KV invariants checked after every step and the pool clean at the end."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import build_tiny, cached_scorer, tiny_moe_names, tiny_names

from radixrt import Engine, SamplingParams
from radixrt.runtime.models import load_model

pytestmark = pytest.mark.model

SHARED = ("You are a careful assistant. Read the question, think about it, and answer in one "
          "short, plain sentence without any lists. Question: ")
PROMPTS = [SHARED + q for q in ("What is the capital of France?", "Why is the sky blue?",
                                "What do bees make?", "How many legs has a spider?")]
TIGHT_POOL = 56  # every request fits alone, not all four at once
CONFIGS: dict[str, dict[str, Any]] = {
    "radix-cache": {},
    "page-16": dict(page_size=16),
    "chunked-prefill": dict(max_num_batched_tokens=16),
    "preempt-recompute": dict(max_total_tokens=TIGHT_POOL, preemption="recompute"),
    "preempt-swap": dict(max_total_tokens=TIGHT_POOL, preemption="swap"),
}
PARAMS = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=True)
TOLERANCE = 1e-3
ALL = tiny_names() + tiny_moe_names()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory,
                tokenizer: Any) -> Iterator[dict[str, tuple[Path, Any]]]:
    """name -> (checkpoint folder, transformers model), built on first use."""
    built: dict[str, tuple[Path, Any]] = {}

    class Lazy(dict):  # type: ignore[type-arg]
        def __missing__(self, name: str) -> tuple[Path, Any]:
            folder = tmp_path_factory.mktemp(f"tiny_{name}")
            built[name] = (folder, build_tiny(name, folder, tokenizer,
                                              seed=ALL.index(name)))
            return built[name]

    yield Lazy()


@pytest.fixture(scope="module")
def loaded(checkpoints: dict[str, tuple[Path, Any]]) -> Callable[[str], Any]:
    models: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in models:
            models[name] = load_model(str(checkpoints[name][0]))
        return models[name]

    return get


@pytest.fixture(scope="module")
def scorers(checkpoints: dict[str, tuple[Path, Any]]) -> Callable[[str], Any]:
    made: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in made:
            made[name] = cached_scorer(checkpoints[name][1])
        return made[name]

    return get


def assert_idle(engine: Engine) -> None:
    engine.check_integrity()
    stats = engine.stats()
    assert stats["running"] == stats["waiting"] == stats["swapped"] == 0
    assert stats["kv_private"] == stats["kv_locked"] == 0
    assert stats["kv_free"] + stats["kv_evictable"] == stats["kv_total"]


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("name", ALL)
def test_family_matches_transformers(name: str, config: str, loaded: Callable[[str], Any],
                                     scorers: Callable[[str], Any]) -> None:
    model = loaded(name)
    options = CONFIGS[config]
    engine = Engine(model, check_integrity=True, **{"max_total_tokens": 2048, **options})
    try:
        outs = engine.generate(PROMPTS, PARAMS) + engine.generate(PROMPTS[::-1], PARAMS)
        stats = engine.stats()
        assert_idle(engine)
    finally:
        engine.close()
    window = model.config.sliding_window
    for out in outs:
        n = out.prompt_tokens
        assert window is None or n > window, "the prompts must outrun the window"
        ref = scorers(name)(out.prompt_token_ids + out.token_ids)
        assert len(out.logprobs) == len(out.token_ids) == PARAMS.max_tokens
        for i, (token, lp) in enumerate(zip(out.token_ids, out.logprobs)):
            row = ref[n - 1 + i]
            assert int(row.argmax()) == token, (name, config, i)
            assert abs(lp.logprob - row[token].item()) < TOLERANCE, (name, config, i)
    assert stats["cached_tokens"] > 0
    if "preemption" in options:
        assert stats["preemptions"] > 0
        assert (stats["swaps"] > 0) == (options["preemption"] == "swap")


@pytest.mark.parametrize("name", ["gemma2", "gemma3", "mistral-window", "gpt-oss"])
def test_windowed_prefill_in_pieces_equals_whole(name: str, loaded: Callable[[str], Any],
                                                 scorers: Callable[[str], Any]) -> None:
    """A 200-token sequence (25 windows) prefilled in chunks of 7 after a cached prefix, and
    decoded token by token, gives transformers' logprobs at every position."""
    from radixrt.runtime.forward.forward_batch import ForwardBatch
    from radixrt.runtime.forward.kv_cache import KVCache

    model = loaded(name)
    ids = torch.randint(0, model.config.vocab_size, (200,),
                        generator=torch.Generator().manual_seed(1)).tolist()
    expected = scorers(name)(ids)
    kv = KVCache.from_config(model.config, 512, torch.float32, "cpu")
    table = torch.randperm(512, generator=torch.Generator().manual_seed(2))[:200]
    pieces = [(0, 150), *[(s, min(s + 7, 190)) for s in range(150, 190, 7)],
              *[(p, p + 1) for p in range(190, 200)]]
    rows = []
    for start, end in pieces:
        batch = ForwardBatch.build([ids[start:end]], [start], [table])
        rows.append(model.model.compute_logits(model.model.forward(batch, kv)))
    got = torch.log_softmax(torch.cat(rows), dim=-1)
    torch.testing.assert_close(got, expected, atol=TOLERANCE, rtol=0)


def test_longrope_short_factors_below_the_original_context(tmp_path: Path,
                                                           tokenizer: Any) -> None:
    """A LongRoPE model whose positions do not exceed its original context runs its short
    factors: it then equals transformers on a short prompt as well."""
    import json

    from transformers import AutoModelForCausalLM

    build_tiny("phi4-mini-longrope", tmp_path, tokenizer)
    config = json.loads((tmp_path / "config.json").read_text())
    config["max_position_embeddings"] = config["original_max_position_embeddings"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    model = load_model(str(tmp_path))
    engine = Engine(model, max_total_tokens=256, check_integrity=True)
    try:
        out = engine.generate(["Why is the sky blue?"], PARAMS)[0]
    finally:
        engine.close()
    ref = cached_scorer(hf)(out.prompt_token_ids + out.token_ids)
    for i, lp in enumerate(out.logprobs):
        assert abs(lp.logprob - ref[out.prompt_tokens - 1 + i][lp.token_id].item()) < TOLERANCE
