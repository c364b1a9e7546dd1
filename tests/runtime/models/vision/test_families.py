"""Every vision-language family against transformers on the same weights and images, through
the Engine.

For each tiny checkpoint of tests/tiny_vlms.py, chat prompts with one image, two images of
different sizes, the first image again under another question, and no image at all run greedy
in one batch, twice (the second time reversed: radix-cache hits), in each engine configuration
below; every token must be transformers' argmax and its logprob transformers' within 1e-3
(float32), the prompt's ids what the processor makes of the whole prompt, with the KV
invariants checked after every step and the pool clean at the end."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tiny_vlms import BUILDERS, hf_vlm_logprobs, images

from radixrt import Engine, SamplingParams
from radixrt.runtime.models import load_model
from radixrt.runtime.models.vision.processors import placeholder_token

pytestmark = pytest.mark.model

PICTURES = images([(40, 50), (64, 30), (33, 33)], seed=1)
TWIN = images([(40, 50)], seed=2)[0]  # the first picture's size, other pixels
PARAMS = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=True)
TOLERANCE = 1e-3
CONFIGS: dict[str, dict[str, Any]] = {
    "radix-cache": {},
    # chunks of 16 cut every image; pages of 16 put an image's tail and text in one page
    "chunked-pages": dict(max_num_batched_tokens=16, page_size=16),
    "preempt-recompute": dict(preemption="recompute"),  # a pool the longest prompt fits alone
}
# preemption by recompute re-encodes (or finds cached) the images of a request admitted again:
# one family with placeholder runs, one with multimodal RoPE's positions, one whose image runs
# are computed whole (re-admitted, its tree match may end inside one)
PREEMPTED = ("llava", "qwen2-vl", "gemma3")
CASES = [(name, config) for name in BUILDERS for config in CONFIGS
         if config != "preempt-recompute" or name in PREEMPTED]


def chat(question: str, *pictures: Any) -> list[dict[str, Any]]:
    parts = [{"type": "image", "image": p} for p in pictures]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}]


PROMPTS = [
    (chat("What is in this picture?", PICTURES[0]), [PICTURES[0]]),
    (chat("Compare the two pictures.", PICTURES[1], PICTURES[2]), [PICTURES[1], PICTURES[2]]),
    (chat("What colour is it mostly?", PICTURES[0]), [PICTURES[0]]),
    ([{"role": "user", "content": "Say something about bees."}], []),
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory,
                tokenizer: Any) -> Iterator[dict[str, tuple[Path, Any, Any]]]:
    built: dict[str, tuple[Path, Any, Any]] = {}

    class Lazy(dict):
        def __missing__(self, name: str) -> tuple[Path, Any, Any]:
            folder = tmp_path_factory.mktemp(name)
            built[name] = (folder, *BUILDERS[name](folder, tokenizer))
            return built[name]

    yield Lazy()


@pytest.fixture(scope="module")
def loaded(checkpoints: dict[str, tuple[Path, Any, Any]]) -> Callable[[str], Any]:
    models: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in models:
            models[name] = load_model(str(checkpoints[name][0]))
        return models[name]

    return get


def processor_ids(processor: Any, message: list[dict[str, Any]], pictures: list[Any]
                  ) -> list[int]:
    text = processor.apply_chat_template(message, add_generation_prompt=True)
    return processor(text=text, images=pictures or None, add_special_tokens=False,
                     return_tensors="pt")["input_ids"][0].tolist()


def assert_idle(engine: Engine) -> None:
    engine.check_integrity()
    stats = engine.stats()
    assert stats["running"] == stats["waiting"] == stats["swapped"] == 0
    assert stats["kv_private"] == stats["kv_locked"] == 0


@pytest.mark.parametrize(("name", "config"), CASES)
def test_family_matches_transformers(name: str, config: str, loaded: Callable[[str], Any],
                                     checkpoints: dict[str, tuple[Path, Any, Any]]) -> None:
    _, hf, processor = checkpoints[name]
    options = dict(CONFIGS[config])
    if "preemption" in options:
        longest = max(len(processor_ids(processor, m, p)) for m, p in PROMPTS)
        options["max_total_tokens"] = longest + 2 * PARAMS.max_tokens
    engine = Engine(loaded(name), check_integrity=True, **{"max_total_tokens": 2048, **options})
    messages = [m for m, _ in PROMPTS]
    try:
        outs = engine.generate(messages, PARAMS) + engine.generate(messages[::-1], PARAMS)
        stats = engine.stats()
        assert_idle(engine)
    finally:
        engine.close()
    specs = PROMPTS + PROMPTS[::-1]
    for out, (message, pictures) in zip(outs, specs, strict=True):
        text = processor.apply_chat_template(message, add_generation_prompt=True)
        whole = dict(processor(text=text, images=pictures or None, add_special_tokens=False,
                               return_tensors="pt"))
        assert out.prompt_token_ids == whole.pop("input_ids")[0].tolist(), "the processor's"
        whole.pop("attention_mask", None)
        ref = hf_vlm_logprobs(hf, out.prompt_token_ids + out.token_ids, whole)
        n = out.prompt_tokens
        for i, (token, lp) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
            row = ref[n - 1 + i]
            assert int(row.argmax()) == token, (name, config, i)
            assert abs(lp.logprob - row[token].item()) < TOLERANCE, (name, config, i)
    assert stats["cached_tokens"] > 0
    if "preemption" in CONFIGS[config]:
        assert stats["preemptions"] > 0


@pytest.mark.parametrize("name", list(BUILDERS))
def test_repeated_image_hits_and_a_different_one_misses(
        name: str, loaded: Callable[[str], Any]) -> None:
    """The same picture under a new question reuses its placeholders' KV and its features; a
    different picture of the same size shares only the text before it, and is encoded."""
    engine = Engine(loaded(name), check_integrity=True)
    try:
        images_of = engine.worker.images
        first = engine.generate(chat("Describe it.", PICTURES[0]), PARAMS)[0]
        encoded = images_of.encoded
        again = engine.generate(chat("Describe it briefly.", PICTURES[0]), PARAMS)[0]
        assert images_of.encoded == encoded, "its features came from the cache"
        twin = engine.generate(chat("Describe it.", TWIN), PARAMS)[0]
        assert images_of.encoded == encoded + 1
    finally:
        engine.close()
    processor = loaded(name).processor
    image_id = processor.tokenizer.convert_tokens_to_ids(placeholder_token(processor))
    start = first.prompt_token_ids.index(image_id)
    end = len(first.prompt_token_ids) - first.prompt_token_ids[::-1].index(image_id)
    assert again.cached_tokens >= end, "the image's placeholders came from the tree"
    assert twin.cached_tokens <= start, "a different image shares nothing past its start"


def test_a_text_model_refuses_images(loaded_model: Any) -> None:
    """The default (text) model: a chat with an image part is a ValueError saying the model
    takes no images, before anything is queued; the engine goes on serving text."""
    engine = Engine(loaded_model, check_integrity=True)
    try:
        with pytest.raises(ValueError, match="takes no images"):
            engine.generate(chat("What is it?", PICTURES[0]), PARAMS)
        assert engine.generate("The capital of France is", PARAMS)[0].completion_tokens == 6
    finally:
        engine.close()


@pytest.mark.parametrize("name", ["llava", "qwen2-vl"])
def test_prompt_logprobs_with_an_image(name: str, loaded: Callable[[str], Any],
                                       checkpoints: dict[str, tuple[Path, Any, Any]]) -> None:
    """Every prompt token's logprob, the image's rows included (the image token's, as
    transformers' input_ids hold it), within 1e-3 of transformers' (what select scores by)."""
    _, hf, processor = checkpoints[name]
    message, pictures = PROMPTS[1]
    engine = Engine(loaded(name), check_integrity=True)
    try:
        out = engine.generate(message, SamplingParams(max_tokens=1, temperature=0,
                                                      prompt_logprobs_start=0))[0]
    finally:
        engine.close()
    whole = dict(processor(text=processor.apply_chat_template(message, add_generation_prompt=True),
                           images=pictures, add_special_tokens=False, return_tensors="pt"))
    ids = whole.pop("input_ids")[0].tolist()
    whole.pop("attention_mask", None)
    ref = hf_vlm_logprobs(hf, ids, whole)
    got = out.prompt_logprobs  # positions 1 .. n-1: the first token has none
    assert [lp.token_id for lp in got] == ids[1:]
    for i, lp in enumerate(got, start=1):
        assert abs(lp.logprob - ref[i - 1, ids[i]].item()) < TOLERANCE, (name, i)
