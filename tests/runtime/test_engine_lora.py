"""LoRA adapters in the Engine: the radix tree keeps adapters apart, adapters load and unload
while requests run (never a request served under the wrong adapter), fewer slots than adapters
and fewer adapters in host memory than served, grammars under an adapter, and every adapter a
server cannot serve refused with a message. References: transformers + PEFT on the same
weights (a tiny Llama, tests/tiny_models.py)."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from lora_adapters import make_adapter
from tiny_models import build_tiny, cached_scorer

from radixrt import Engine, SamplingParams
from radixrt.runtime.models import load_model

pytestmark = pytest.mark.model

NAME = "llama-yarn"
PROMPT = ("You are a careful assistant. Read the question, think about it, and answer in one "
          "short, plain sentence without any lists. Question: why is the sky blue?")
PARAMS = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=True)
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("lora_engine")
    base = build_tiny(NAME, root / "base", tokenizer, seed=3)
    refs: dict[str | None, Any] = {None: base}
    for name, kind, seed in (("a", "attn-r4", 1), ("b", "all-r8-rslora", 2),
                             ("c", "mlp-patterns", 3)):
        refs[name] = make_adapter(copy.deepcopy(base), root / name, kind, seed)
    return {"root": root, "loaded": load_model(str(root / "base")),
            "scorers": {k: cached_scorer(m) for k, m in refs.items()}}


def engine_of(tiny: dict[str, Any], **options: Any) -> Engine:
    return Engine(tiny["loaded"], check_integrity=True, max_total_tokens=2048, **options)


def paths(tiny: dict[str, Any], *names: str) -> list[str]:
    return [f"{n}={tiny['root'] / n}" for n in names]


def assert_matches(out: Any, scorer: Callable[[list[int]], Any], label: object = "") -> None:
    ref = scorer(out.prompt_token_ids + out.token_ids)
    n = out.prompt_tokens
    for i, (token, lp) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
        assert int(ref[n - 1 + i].argmax()) == token, (label, i)
        assert abs(lp.logprob - ref[n - 1 + i][token].item()) < TOLERANCE, (label, i)


def test_a_prefix_is_reused_only_under_its_adapter(tiny: dict[str, Any]) -> None:
    """The same prompt under a, then a again (a hit), then b and the base (computed anew: KV
    of one adapter is wrong for another), then b again (a hit in b's own branch)."""
    engine = engine_of(tiny, lora_paths=paths(tiny, "a", "b"))
    try:
        runs = [(lora, engine.generate(PROMPT, PARAMS, lora=lora)[0])
                for lora in ("a", "a", "b", None, "b")]
    finally:
        engine.close()
    cached = [out.cached_tokens for _, out in runs]
    assert cached[0] == 0 and cached[1] > 0 and cached[2] == 0 and cached[3] == 0, cached
    assert cached[4] == cached[1], cached
    for lora, out in runs:
        assert_matches(out, tiny["scorers"][lora], lora)


def test_load_and_unload_under_traffic(tiny: dict[str, Any]) -> None:
    """Requests under an adapter that is unloaded while they wait or run finish under it;
    new ones are refused; its cached KV goes; the name loaded again with other files serves
    the new files, never the old KV."""
    engine = engine_of(tiny, enable_lora=True, max_lora_rank=8)
    try:
        assert engine.load_lora("x", str(tiny["root"] / "a"))["rank"] == 4
        rids = [engine.submit(PROMPT, PARAMS, lora="x") for _ in range(3)]
        base_rid = engine.submit(PROMPT, PARAMS)
        engine.step()  # they start
        engine.unload_lora("x")
        with pytest.raises(ValueError, match="no LoRA adapter named 'x'"):
            engine.submit(PROMPT, PARAMS, lora="x")
        while engine.scheduler.has_work:
            engine.step()
        outs = [engine.take_output(r) for r in rids]
        base = engine.take_output(base_rid)
        engine.step()  # a plan after the last request under it: forgotten, its KV dropped
        assert engine.scheduler.stats.lora_dropped_tokens > 0
        engine.load_lora("x", str(tiny["root"] / "b"))  # the same name, other files
        again = engine.generate(PROMPT, PARAMS, lora="x")[0]
        with pytest.raises(KeyError, match="no LoRA adapter named 'y'"):
            engine.unload_lora("y")
    finally:
        engine.close()
    for out in outs:
        assert_matches(out, tiny["scorers"]["a"], "unloaded while running")
    assert_matches(base, tiny["scorers"][None], "base")
    assert again.cached_tokens == 0
    assert_matches(again, tiny["scorers"]["b"], "reloaded")


def test_fewer_slots_and_host_copies_than_adapters(tiny: dict[str, Any]) -> None:
    """One adapter slot and one adapter in host memory for three adapters and the base: the
    requests of the others wait for the slot (never mixed past it), adapters are read again
    from their folders, and every output is its adapter's."""
    engine = engine_of(tiny, lora_paths=paths(tiny, "a", "b", "c"), max_loras_per_batch=1,
                       max_loaded_loras=1)
    which = ["a", "b", None, "c", "a", "b"]
    try:
        outs = engine.generate([PROMPT] * len(which), PARAMS, lora=which)
        manager = engine.worker.lora
        assert manager is not None and manager.loads >= 3 and len(manager.host) == 1
    finally:
        engine.close()
    for lora, out in zip(which, outs):
        assert_matches(out, tiny["scorers"][lora], lora)


def test_samples_of_a_prompt_stay_under_its_adapter(tiny: dict[str, Any]) -> None:
    """n = 2: the prompt is computed once and each sample forks from it; every token of every
    sample is the adapter's (seeded sampling, its logprobs against PEFT's distribution)."""
    engine = engine_of(tiny, lora_paths=paths(tiny, "b"))
    try:
        params = SamplingParams(n=2, max_tokens=8, temperature=1.0, seed=5, ignore_eos=True,
                                logprobs=True)
        out = engine.generate(PROMPT, params, lora="b")[0]
    finally:
        engine.close()
    scorer = tiny["scorers"]["b"]
    for sample in out.samples:
        ref = scorer(out.prompt_token_ids + sample.token_ids)
        n = out.prompt_tokens
        for i, (token, lp) in enumerate(zip(sample.token_ids, sample.logprobs, strict=True)):
            assert abs(lp.logprob - ref[n - 1 + i][token].item()) < TOLERANCE, i


def test_a_grammar_under_an_adapter(tiny: dict[str, Any]) -> None:
    engine = engine_of(tiny, lora_paths=paths(tiny, "b"))
    try:
        params = SamplingParams(max_tokens=12, temperature=0, regex=r"[a-z]{3,8}")
        out = engine.generate(PROMPT, params, lora="b")[0]
    finally:
        engine.close()
    assert re.fullmatch(r"[a-z]{3,8}", out.text), out.text


def test_refusals_name_the_fix(tiny: dict[str, Any], tmp_path: Path) -> None:
    """Each refused load changes nothing and the engine goes on serving (every kind of
    unservable adapter: tests/runtime/models/test_lora_format.py)."""
    engine = engine_of(tiny, enable_lora=True, max_lora_rank=4)
    try:
        with pytest.raises(ValueError, match="rank 8, above the server's --max-lora-rank 4"):
            engine.load_lora("b", str(tiny["root"] / "b"))
        with pytest.raises(ValueError, match="not a PEFT LoRA adapter folder"):
            engine.load_lora("none", str(tmp_path))
        assert engine.lora_adapters() == []
        assert_matches(engine.generate(PROMPT, PARAMS)[0], tiny["scorers"][None])
        engine.load_lora("a", str(tiny["root"] / "a"))
        with pytest.raises(ValueError, match="loaded already"):
            engine.load_lora("a", str(tiny["root"] / "a"))
        with pytest.raises(ValueError, match=r"no LoRA adapter named 'b' is loaded \(loaded: a\)"):
            engine.generate(PROMPT, PARAMS, lora="b")
    finally:
        engine.close()
    plain = engine_of(tiny)
    try:
        with pytest.raises(ValueError, match="--lora-paths or --enable-lora"):
            plain.load_lora("a", str(tiny["root"] / "a"))
        with pytest.raises(ValueError, match="no LoRA adapter named 'a'"):
            plain.generate(PROMPT, PARAMS, lora="a")
    finally:
        plain.close()


@pytest.mark.slow  # a second rank as a process
def test_tensor_parallel_ranks_shard_the_adapters(tiny: dict[str, Any]) -> None:
    """TP 2 = TP 1 with adapters: each rank holds its rows of B (q, k, v; gate, up) and its
    columns of A (o, down), and the ranks' partial products sum to the whole one."""
    which = ["a", "b", "c", None]
    engine = Engine(str(tiny["root"] / "base"), tp_size=2, check_integrity=True,
                    max_total_tokens=2048, lora_paths=paths(tiny, "a", "b", "c"))
    try:
        outs = engine.generate([PROMPT] * len(which), PARAMS, lora=which)
    finally:
        engine.close()
    for lora, out in zip(which, outs):
        assert_matches(out, tiny["scorers"][lora], f"tp2 {lora}")
