"""LoRA adapters on every dense family, against transformers + PEFT on the same weights.

For each tiny checkpoint (tests/tiny_models.py), three random PEFT adapters (tests/
lora_adapters.py: attention only, every projection under rsLoRA, the MLP with per-module ranks
and scales) and the base model run greedy in the same forward passes, twice (the second time
reversed: radix-cache hits within each adapter); every token must be the PEFT model's argmax and
its logprob PEFT's within 1e-3, with the KV invariants checked after every step."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lora_adapters import ADAPTERS, make_adapter
from tiny_models import build_tiny, cached_scorer, tiny_names

from radixrt import Engine, SamplingParams
from radixrt.runtime.models import load_model

pytestmark = pytest.mark.model

# past the window of the windowed families and the original context of the LongRoPE one
SHARED = ("You are a careful assistant. Read the question, think about it, and answer in one "
          "short, plain sentence without any lists. Question: ")
QUESTIONS = ("What is the capital of France?", "Why is the sky blue?")
PARAMS = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=True)
TOLERANCE = 1e-3
KINDS = list(ADAPTERS)


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory,
           tokenizer: Any) -> Iterator[Callable[[str], tuple[Path, dict[str | None, Any]]]]:
    """name -> (checkpoint folder, {adapter kind or None: its reference model}), the adapters
    saved in the folder's siblings named after their kind."""
    built: dict[str, tuple[Path, dict[str | None, Any]]] = {}

    def get(name: str) -> tuple[Path, dict[str | None, Any]]:
        if name not in built:
            root = tmp_path_factory.mktemp(f"lora_{name}")
            base = build_tiny(name, root / "base", tokenizer, seed=tiny_names().index(name))
            refs: dict[str | None, Any] = {None: base}
            for i, kind in enumerate(KINDS):
                refs[kind] = make_adapter(copy.deepcopy(base), root / kind, kind, seed=i)
            built[name] = (root, refs)
        return built[name]

    yield get


def check_outputs(outs: list[Any], which: list[str | None],
                  scorers: dict[str | None, Callable[[list[int]], Any]], label: str) -> None:
    for out, kind in zip(outs, which, strict=True):
        ref = scorers[kind](out.prompt_token_ids + out.token_ids)
        n = out.prompt_tokens
        assert len(out.token_ids) == PARAMS.max_tokens
        for i, (token, lp) in enumerate(zip(out.token_ids, out.logprobs)):
            row = ref[n - 1 + i]
            assert int(row.argmax()) == token, (label, kind, i)
            assert abs(lp.logprob - row[token].item()) < TOLERANCE, (label, kind, i)


@pytest.mark.parametrize("name", tiny_names())
def test_adapters_match_peft_mixed_in_one_batch(name: str, family: Any) -> None:
    root, refs = family(name)
    scorers = {kind: cached_scorer(model) for kind, model in refs.items()}
    engine = Engine(load_model(str(root / "base")), check_integrity=True, max_total_tokens=4096,
                    lora_paths=[f"{kind}={root / kind}" for kind in KINDS])
    which: list[str | None] = [None, *KINDS]
    prompts = [SHARED + q for q in QUESTIONS for _ in which]
    adapters = which * len(QUESTIONS)
    try:
        first = engine.generate(prompts, PARAMS, lora=adapters)
        again = engine.generate(prompts[::-1], PARAMS, lora=adapters[::-1])
        stats = engine.stats()
    finally:
        engine.close()
    check_outputs(first, adapters, scorers, f"{name} first")
    check_outputs(again, adapters[::-1], scorers, f"{name} again")
    # the adapters change the outputs (a product added nowhere would pass the rest by luck)
    assert len({tuple(o.token_ids) for o in first[: len(which)]}) == len(which), name
    assert all(o.cached_tokens > 0 for o in again), [o.cached_tokens for o in again]
    assert stats["kv_private"] == stats["kv_locked"] == 0
