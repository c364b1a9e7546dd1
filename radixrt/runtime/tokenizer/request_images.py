"""A request's image references (what a client sent: data:, http(s) URLs, local paths, bytes)
turned into PIL images on an event loop, under the server's MediaPolicy (media_fetch.py): every
fetch and every decode runs on a worker thread, all of a request's images at once.

The number of images is checked before anything is fetched; a refusal is a ValueError (the
media_fetch MediaError of the first bad image, its index in front) for the HTTP layer's 400.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from radixrt.runtime.image_messages import MAX_IMAGES_PER_REQUEST
from radixrt.runtime.tokenizer.media_fetch import (
    MediaError,
    MediaPolicy,
    decode_image,
    fetch_media_bytes,
    image_size,
)

if TYPE_CHECKING:
    from PIL import Image

    from radixrt.runtime.tokenizer.decoded_images import DecodedImages

T = TypeVar("T")


async def load_request_images(refs: Sequence[Any], policy: MediaPolicy,
                              decoded: DecodedImages | None = None) -> list[Image.Image]:
    """The images `refs` name, in order: a PIL image as it is (RGB), bytes decoded, a str
    fetched or read (load_media_bytes' rules) and decoded. With `decoded` (the process's bound
    on decoded images), the pictures' bytes are reserved together from their headers before
    any is decoded, and each is held there while it lives. ValueError for too many images or
    the first one that cannot be used ("image i: why"); QueueFull when the decoded images of
    the requests in flight leave no room for this request's."""
    if len(refs) > MAX_IMAGES_PER_REQUEST:
        raise MediaError(f"{len(refs)} images in one request: at most "
                         f"{MAX_IMAGES_PER_REQUEST}; send fewer")
    if not refs:
        return []
    data = await _each([_read(ref, policy) for ref in refs])
    sizes = await _each([asyncio.to_thread(image_size, d, policy) for d in data
                         if isinstance(d, bytes)])
    shares = iter(decoded.reserve(sizes) if decoded is not None else [0] * len(sizes))
    owed = [next(shares) if isinstance(d, bytes) else 0 for d in data]
    try:
        pictures = await _each([_decode(d, policy) for d in data])
    except BaseException:
        if decoded is not None:
            decoded.release(sum(owed))  # (the pictures that did decode are freed with the tasks)
        raise
    if decoded is not None:
        for picture, share in zip(pictures, owed):
            if share:
                decoded.hold(picture, share)
    return pictures


async def _each(steps: Sequence[Awaitable[T]]) -> list[T]:
    """Every step's result, in order; all are awaited. MediaError "image i: why" for the first
    (by index) that is refused (ValueError, OSError); the caller's cancel cancels them all."""
    tasks = [asyncio.ensure_future(step) for step in steps]
    if not tasks:
        return []
    try:
        await asyncio.wait(tasks)
    except BaseException:  # the caller was cancelled (its client left)
        for task in tasks:
            task.cancel()  # a fetch already on its thread ends by its own deadline
        raise
    errors = [task.exception() for task in tasks]  # each one retrieved
    if any(errors):
        tasks.clear()  # what the others made is freed now
    for i, error in enumerate(errors):
        if isinstance(error, (ValueError, OSError)):
            raise MediaError(f"image {i}: {error}") from None
        if error is not None:
            raise error
    return [task.result() for task in tasks]


async def _read(ref: Any, policy: MediaPolicy) -> Image.Image | bytes:
    """A PIL image as RGB, or the bytes of an image to decode."""
    from PIL import Image

    if isinstance(ref, Image.Image):
        return ref if ref.mode == "RGB" else ref.convert("RGB")
    if isinstance(ref, (bytes, bytearray, memoryview)):
        return bytes(ref)
    if isinstance(ref, str):
        return await fetch_media_bytes(ref, policy)
    raise MediaError(f"an image is a URL or a path, not {type(ref).__name__}")


async def _decode(data: Image.Image | bytes, policy: MediaPolicy) -> Image.Image:
    if not isinstance(data, bytes):
        return data
    return await asyncio.to_thread(decode_image, data, policy)
