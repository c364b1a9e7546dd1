"""A request's image references loaded on the event loop (tokenizer/request_images.py): PIL
images pass (as RGB), bytes and data: URLs are decoded, the count is checked before anything is
fetched, and a refusal names the image by its index. (Fetching itself: test_media_fetch.py.)"""

from __future__ import annotations

import asyncio
import base64
import io
from typing import Any

import pytest
from PIL import Image

from radixrt.runtime.image_messages import MAX_IMAGES_PER_REQUEST
from radixrt.runtime.tokenizer.media_fetch import MediaError, MediaPolicy
from radixrt.runtime.tokenizer.request_images import load_request_images

POLICY = MediaPolicy()


def png(size: tuple[int, int], mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.new(mode, size).save(out, format="PNG")
    return out.getvalue()


def load(refs: list[Any], policy: MediaPolicy = POLICY) -> list[Any]:
    return asyncio.run(load_request_images(refs, policy))


def test_images_bytes_and_urls_come_back_in_order_as_rgb() -> None:
    gray = Image.new("L", (5, 6))
    url = "data:image/png;base64," + base64.b64encode(png((7, 8))).decode()
    out = load([gray, png((3, 4), "RGBA"), url])
    assert [(im.mode, im.size) for im in out] == [("RGB", (5, 6)), ("RGB", (3, 4)),
                                                  ("RGB", (7, 8))]
    assert load([]) == []


def test_a_refusal_names_the_image() -> None:
    with pytest.raises(MediaError, match="image 1: not an image"):
        load([png((2, 2)), b"no picture"])
    with pytest.raises(MediaError, match="image 0: local files are refused"):
        load(["/etc/hostname"])
    with pytest.raises(MediaError, match="image 0: .* more than 10"):
        load([png((4, 4))], MediaPolicy(max_pixels=10))
    with pytest.raises(MediaError, match="image 0: an image is a URL or a path, not int"):
        load([3])


def test_too_many_images_are_refused_before_any_fetch() -> None:
    never = "http://192.0.2.1/never-fetched.png"  # TEST-NET-1: a fetch would hang, not fail
    with pytest.raises(MediaError, match=f"at most {MAX_IMAGES_PER_REQUEST}"):
        load([never] * (MAX_IMAGES_PER_REQUEST + 1))
