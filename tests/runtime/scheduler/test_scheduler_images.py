"""The scheduler's side of images, without a model: a prompt's placeholders checked against its
images (prompt logprobs too), a model without images refusing them, and the
images the requests hold bounded (QueueFull past MAX_HELD_IMAGE_BYTES, free again once the
request ends)."""

from __future__ import annotations

import pytest

from radixrt.runtime.config import EngineConfig
from radixrt.runtime.errors import QueueFull
from radixrt.runtime.image_messages import ImageInput, ImageTensor, id_seed, placeholder_ids
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.scheduler import scheduler as scheduler_module
from radixrt.runtime.scheduler.scheduler import Scheduler

PARAMS = SamplingParams(max_tokens=4)


def image(size: int, seed: int = 0) -> tuple[list[int], ImageInput]:
    """A prompt of text, an image of 4 placeholders, text; and the image (size bytes)."""
    tensors = [ImageTensor(name="pixel_values", dtype="float32", shape=[size // 4],
                           data=bytes([seed]) * size)]
    digest = f"{seed:064x}"
    seed_hex = id_seed(b"k" * 32, digest)
    ids = [5, 6] + placeholder_ids(seed_hex, 4) + [7]
    return ids, ImageInput(digest=digest, runs=[[2, 4]], tensors=tensors, id_seed=seed_hex)


def scheduler(takes_images: bool = True) -> Scheduler:
    return Scheduler(EngineConfig(max_total_tokens=256), 256, 128, [2], vocab_size=100,
                     takes_images=takes_images)


def test_placeholders_checked_and_refusals() -> None:
    sched = scheduler()
    ids, im = image(64)
    sched.add_request(ids, PARAMS, images=[im])
    with pytest.raises(ValueError, match="of no image"):
        sched.add_request(ids, PARAMS)  # placeholder ids without their image
    sched.add_request(ids, SamplingParams(max_tokens=4, prompt_logprobs_start=0), images=[im])
    with pytest.raises(ValueError, match="takes no images"):
        scheduler(takes_images=False).add_request(ids, PARAMS, images=[im])


def test_the_images_held_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler_module, "MAX_HELD_IMAGE_BYTES", 1000)
    sched = scheduler()
    first = sched.add_request(*image(600, 1)[:1], PARAMS, images=[image(600, 1)[1]])
    ids, im = image(600, 2)
    with pytest.raises(QueueFull, match="bytes of images"):
        sched.add_request(ids, PARAMS, images=[im])
    sched.add_request([5, 6, 7], PARAMS)  # text is not held back
    sched.abort(first.rid)
    sched.add_request(ids, PARAMS, images=[im])  # room again once the first one ended
