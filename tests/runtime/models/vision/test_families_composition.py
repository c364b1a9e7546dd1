"""Images compose with the rest of the runtime: a grammar on the answer (JSON from a picture),
the host KV tier under an image's placeholders, tensor parallelism of the decoder (two gloo
ranks, each with the vision tower) equal to one rank, and n = 2 samples under a repetition
penalty (which counts the image token, as transformers' does) on multimodal RoPE."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tiny_vlms import BUILDERS, images

from radixrt import Engine, SamplingParams

pytestmark = pytest.mark.model

PICTURES = images([(40, 50), (64, 30)], seed=3)
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=True)


def chat(question: str, picture: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image", "image": picture},
                                         {"type": "text", "text": question}]}]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any
          ) -> dict[str, tuple[Path, Any, Any]]:
    """name -> (folder, transformers model, processor)."""
    out = {}
    for name in ("llava", "qwen2-vl"):
        folder = tmp_path_factory.mktemp(name)
        out[name] = (folder, *BUILDERS[name](folder, tokenizer))
    return out


@pytest.fixture(scope="module")
def folders(built: dict[str, tuple[Path, Any, Any]]) -> dict[str, Path]:
    return {name: folder for name, (folder, _, _) in built.items()}


def test_json_from_a_picture(folders: dict[str, Path]) -> None:
    """A JSON schema constrains the answer about an image: it parses and fits the schema."""
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12},
                                               "count": {"type": "integer"}},
              "required": ["colour", "count"], "additionalProperties": False}
    engine = Engine(str(folders["llava"]), check_integrity=True)
    try:
        out = engine.generate(chat("Answer in JSON.", PICTURES[0]),
                              SamplingParams(max_tokens=64, temperature=0.7, seed=1,
                                             json_schema=schema))[0]
    finally:
        engine.close()
    value = json.loads(out.text)
    assert set(value) == {"colour", "count"} and isinstance(value["count"], int)


def test_host_tier_keeps_an_images_prefix(folders: dict[str, Path]) -> None:
    """An image prompt's KV evicted to the host tier by other prompts comes back: the same
    prompt again is a cache hit past its image and answers as it did."""
    engine = Engine(str(folders["llava"]), check_integrity=True, max_total_tokens=96,
                    host_cache_tokens=512)
    try:
        first = engine.generate(chat("Describe it.", PICTURES[0]), GREEDY)[0]
        for i, other in enumerate(images([(40, 50)] * 4, seed=4)):  # push it out of the pool
            engine.generate(chat(f"Question {i}?", other), GREEDY)
        again = engine.generate(chat("Describe it.", PICTURES[0]), GREEDY)[0]
        stats = engine.stats()
    finally:
        engine.close()
    assert again.token_ids == first.token_ids
    assert again.cached_tokens >= first.prompt_tokens - 1
    assert stats["kv_tiers"]["host"]["hit_tokens"] > 0, "its image came back from the host"


def test_tp2_equals_tp1(folders: dict[str, Path]) -> None:
    """Qwen2-VL (multimodal RoPE) over two decoder ranks: the tokens of one rank, logprobs
    within 1e-4."""
    prompts = [chat("What is it?", PICTURES[0]), chat("And this?", PICTURES[1]),
               [{"role": "user", "content": "No picture here."}]]
    outs = {}
    for tp in (1, 2):
        engine = Engine(str(folders["qwen2-vl"]), tp_size=tp, check_integrity=True)
        try:
            outs[tp] = engine.generate(prompts, GREEDY)
        finally:
            engine.close()
    for one, two in zip(outs[1], outs[2], strict=True):
        assert one.token_ids == two.token_ids
        for a, b in zip(one.logprobs, two.logprobs, strict=True):
            assert abs(a.logprob - b.logprob) < 1e-4


def test_two_samples_under_a_repetition_penalty(built: dict[str, tuple[Path, Any, Any]]
                                                 ) -> None:
    """Qwen2-VL, n = 2 greedy samples with repetition_penalty 1.5: both are transformers'
    greedy generation with the same penalty (its input_ids hold the image token where the
    prompt holds placeholders, and its decode steps keep multimodal RoPE's shift)."""
    import torch

    folder, hf, processor = built["qwen2-vl"]
    message = chat("Describe the picture in detail.", PICTURES[1])
    params = SamplingParams(n=2, max_tokens=8, temperature=0, ignore_eos=True,
                            repetition_penalty=1.5)
    engine = Engine(str(folder), check_integrity=True)
    try:
        out = engine.generate(message, params)[0]
    finally:
        engine.close()
    text = processor.apply_chat_template(message, add_generation_prompt=True)
    inputs = dict(processor(text=text, images=[PICTURES[1]], return_tensors="pt"))
    inputs.pop("attention_mask", None)
    inputs["mm_token_type_ids"] = (inputs["input_ids"] == hf.config.image_token_id).int()
    with torch.no_grad():
        want = hf.generate(**inputs, do_sample=False, max_new_tokens=8, repetition_penalty=1.5,
                           pad_token_id=processor.tokenizer.eos_token_id)
    expected = want[0, inputs["input_ids"].shape[1]:].tolist()
    assert [s.token_ids for s in out.samples] == [expected, expected]
