"""The tokenizer process's bound on decoded images (tokenizer/decoded_images.py), through the real
loading path (request_images.py, media_fetch.decode_image): a decoded picture's bytes count while
it lives and no longer; a request that would pass the bound while other requests hold their
pictures is refused with QueueFull (HTTP 429 with Retry-After, image_parts.py) and goes through
once they are freed; a request reserves all its pictures or none; a refused or undecodable
image leaves nothing reserved."""

from __future__ import annotations

import asyncio
import gc
import io
from types import SimpleNamespace
from typing import Any

import pytest
from PIL import Image

from radixrt.runtime.errors import QueueFull
from radixrt.runtime.image_messages import MAX_IMAGES_PER_REQUEST
from radixrt.runtime.server.core.error_shapes import APIError
from radixrt.runtime.server.core.image_parts import load_images
from radixrt.runtime.tokenizer.decoded_images import (
    DECODED_BYTES_PER_PIXEL,
    DEFAULT_MAX_DECODED_BYTES,
    DecodedImages,
)
from radixrt.runtime.tokenizer.media_fetch import DEFAULT_MAX_IMAGE_PIXELS, MediaPolicy
from radixrt.runtime.tokenizer.request_images import load_request_images

POLICY = MediaPolicy()
SIDE = 40  # a 40 x 40 picture: 6,400 bytes decoded
ONE = SIDE * SIDE * DECODED_BYTES_PER_PIXEL


def png(side: int = SIDE) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (side, side), (200, 10, 10)).save(out, format="PNG")
    return out.getvalue()


def load(refs: list[Any], decoded: DecodedImages) -> list[Any]:
    return asyncio.run(load_request_images(refs, POLICY, decoded))


def test_a_request_alone_always_fits_the_default_bound() -> None:
    largest = MAX_IMAGES_PER_REQUEST * DEFAULT_MAX_IMAGE_PIXELS * DECODED_BYTES_PER_PIXEL
    assert largest <= DEFAULT_MAX_DECODED_BYTES


def test_decoded_pictures_count_while_they_live() -> None:
    decoded = DecodedImages(limit=3 * ONE)
    first = load([png(), png()], decoded)  # one request holds two pictures
    assert decoded.held == 2 * ONE
    with pytest.raises(QueueFull, match="decoded images") as refused:
        load([png(), png()], decoded)  # another request's two would pass the bound
    assert refused.value.retry_after_s >= 1
    assert decoded.refused == 1
    assert decoded.held == 2 * ONE + 0, "the refused request keeps nothing reserved"
    del first
    gc.collect()
    assert decoded.held == 0
    second = load([png(), png()], decoded)  # the same request, once the first is done
    assert [im.size for im in second] == [(SIDE, SIDE)] * 2
    assert decoded.held == 2 * ONE
    del second
    gc.collect()
    assert decoded.held == 0


def test_a_request_reserves_all_its_pictures_or_none() -> None:
    """Two requests of 3 pictures at once under a bound of 4: one goes through whole, the other
    is refused holding nothing (reserved per picture, both could end refused)."""
    decoded = DecodedImages(limit=4 * ONE)

    async def both() -> list[Any]:
        return await asyncio.gather(*(load_request_images([png()] * 3, POLICY, decoded)
                                      for _ in range(2)), return_exceptions=True)

    outcomes = asyncio.run(both())
    assert sorted(type(o).__name__ for o in outcomes) == ["QueueFull", "list"]
    assert decoded.held == 3 * ONE
    del outcomes
    gc.collect()
    assert decoded.held == 0


def test_an_image_that_fails_to_decode_releases_its_reservation() -> None:
    decoded = DecodedImages(limit=10 * ONE)
    whole = png()
    truncated = whole[: len(whole) // 2]  # its header gives the size; its pixels are cut
    with pytest.raises(ValueError, match="image 0: not an image"):
        load([truncated], decoded)
    gc.collect()
    assert decoded.held == 0


def test_the_http_surfaces_answer_429_with_retry_after() -> None:
    decoded = DecodedImages(limit=ONE)
    held = load([png()], decoded)
    manager = SimpleNamespace(  # the surfaces' path: image_parts.load_images
        takes_images=True, load_images=lambda refs: load_request_images(refs, POLICY, decoded))
    with pytest.raises(APIError) as refused:
        asyncio.run(load_images(manager, [png()], "messages"))
    assert refused.value.status == 429 and refused.value.headers["Retry-After"] == "1"
    del held
    gc.collect()
    assert len(asyncio.run(load_images(manager, [png()], "messages"))) == 1
