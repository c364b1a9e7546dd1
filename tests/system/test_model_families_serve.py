"""Every family served as an operator runs it: `radixrt serve --model <folder>` on a tiny
checkpoint of each (tests/tiny_models.py) starts, and the official openai client gets the
completion the Engine gives for the same prompt; Gemma 2, Gemma 3, Qwen2-MoE, gpt-oss and
DeepSeek-V3 at tp_size 2 equal tp_size 1 (windows, soft-caps, q/k norms, local RoPE, every
expert's intermediate rows, the shared expert, biases, sinks, and latent attention's heads
split across two gloo ranks, its latent pool replicated)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from test_server import API_KEY, Server
from tiny_models import build_tiny, tiny_moe_names, tiny_names

from radixrt import Engine, SamplingParams

pytestmark = pytest.mark.slow  # starts real processes

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time, in a small village,"
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=True,
                        top_logprobs=2)
TOLERANCE = 1e-4
# one checkpoint per family file, windows and the rarer RoPE kinds included
SERVED = ["mistral-window", "gemma", "gemma2", "gemma3", "phi4-mini-longrope", "olmo2",
          "granite", "smollm3", "mixtral", "qwen2-moe", "olmoe", "gpt-oss"]
TP_ONLY = ["deepseek-v3"]  # (its HTTP path is every family's: only its ranks are its own)
ALL = tiny_names() + tiny_moe_names()


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> dict[str, Path]:
    out = {}
    for name in SERVED + TP_ONLY:
        folder = tmp_path_factory.mktemp(f"served_{name}")
        build_tiny(name, folder, tokenizer, seed=ALL.index(name))
        out[name] = folder
    return out


def engine_answer(folder: Path, **options: Any) -> Any:
    engine = Engine(str(folder), max_total_tokens=512, check_integrity=True, **options)
    try:
        return engine.generate([PROMPT], GREEDY)[0]
    finally:
        engine.close()


@pytest.mark.parametrize("name", SERVED)
def test_serve_each_family_answers_through_openai(name: str, folders: dict[str, Path]) -> None:
    expected = engine_answer(folders[name])
    srv = Server("--model", str(folders[name]), "--max-total-tokens", "512", "--api-key",
                 API_KEY, "--log-level", "warning", "--check-integrity")
    try:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=API_KEY, max_retries=0)
        out = client.completions.create(model="default", prompt=PROMPT, max_tokens=6,
                                        temperature=0, logprobs=1,
                                        extra_body={"ignore_eos": True})
        assert out.choices[0].text == expected.text
        got = out.choices[0].logprobs.token_logprobs
        assert len(got) == len(expected.logprobs)
        for ref, lp in zip(expected.logprobs, got):
            assert abs(ref.logprob - lp) < TOLERANCE
        srv.wait_idle()
    finally:
        srv.stop()


@pytest.fixture(scope="module", params=["gemma2", "gemma3", "qwen2-moe", "gpt-oss",
                                        "deepseek-v3"])
def tp_pair(request: pytest.FixtureRequest, folders: dict[str, Path]) -> Iterator[Any]:
    folder = folders[request.param]
    yield engine_answer(folder), engine_answer(folder, tp_size=2)


def test_tp2_equals_tp1(tp_pair: Any) -> None:
    single, split = tp_pair
    assert split.token_ids == single.token_ids
    for a, b in zip(single.logprobs, split.logprobs):
        assert abs(a.logprob - b.logprob) < TOLERANCE
