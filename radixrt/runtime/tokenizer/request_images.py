"""A request's image references (what a client sent: data:, http(s) URLs, local paths, bytes)
turned into PIL images on an event loop, under the server's MediaPolicy (media_fetch.py): every
fetch and every decode runs on a worker thread, all of a request's images at once.

The number of images is checked before anything is fetched; a refusal is a ValueError (the
media_fetch MediaError of the first bad image, its index in front) for the HTTP layer's 400.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from radixrt.runtime.image_messages import MAX_IMAGES_PER_REQUEST
from radixrt.runtime.tokenizer.media_fetch import (
    MediaError,
    MediaPolicy,
    decode_image,
    fetch_media_bytes,
)

if TYPE_CHECKING:
    from PIL import Image

    from radixrt.runtime.tokenizer.decoded_images import DecodedImages


async def load_request_images(refs: Sequence[Any], policy: MediaPolicy,
                              decoded: DecodedImages | None = None) -> list[Image.Image]:
    """The images `refs` name, in order: a PIL image as it is (RGB), bytes decoded, a str
    fetched or read (load_media_bytes' rules) and decoded, each held in `decoded` (the
    process's bound on decoded images) while it lives. ValueError for too many images or the
    first one that cannot be used ("image i: why"); QueueFull when the decoded images of the
    requests in flight leave no room for one."""
    if len(refs) > MAX_IMAGES_PER_REQUEST:
        raise MediaError(f"{len(refs)} images in one request: at most "
                         f"{MAX_IMAGES_PER_REQUEST}; send fewer")
    if not refs:
        return []
    loads = [asyncio.ensure_future(_load(ref, policy, decoded)) for ref in refs]
    try:
        await asyncio.wait(loads)
    except BaseException:  # the caller was cancelled (its client left)
        for load in loads:
            load.cancel()  # a fetch already on its thread ends by its own deadline
        raise
    errors = [load.exception() for load in loads]  # each one retrieved
    if any(errors):
        loads.clear()  # the images that did decode are freed now (their bytes: decoded_images)
    for i, error in enumerate(errors):
        if isinstance(error, (ValueError, OSError)):
            raise MediaError(f"image {i}: {error}") from None
        if error is not None:
            raise error
    return [load.result() for load in loads]


async def _load(ref: Any, policy: MediaPolicy, decoded: DecodedImages | None) -> Image.Image:
    from PIL import Image

    if isinstance(ref, Image.Image):
        return ref if ref.mode == "RGB" else ref.convert("RGB")
    if isinstance(ref, (bytes, bytearray, memoryview)):
        data = bytes(ref)
    elif isinstance(ref, str):
        data = await fetch_media_bytes(ref, policy)
    else:
        raise MediaError(f"an image is a URL or a path, not {type(ref).__name__}")
    return await asyncio.to_thread(decode_image, data, policy, decoded)
