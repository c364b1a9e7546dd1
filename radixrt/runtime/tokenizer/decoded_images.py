"""The tokenizer process's decoded images, bounded in bytes across every request in flight.

One request's images are bounded (how many, each one's bytes and pixels: media_fetch.py), but
requests come at once: decoded pictures are 4 bytes a pixel, and a burst of requests each with
sixteen 40-megapixel images would hold tens of GiB before any reaches the scheduler (which bounds
what it holds itself). Every decode reserves its picture's bytes here once its header has given
its size: a request's pictures all at once, from their headers, before any pixels are decoded;
each counts until it is freed (a finalizer on the PIL image: however long the request keeps
it). A request that would pass the bound is refused with QueueFull (HTTP 429 with Retry-After:
the server is busy, the request is fine), holding nothing. The bound holds a whole request of
the largest images, so a request alone is never refused.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from radixrt.runtime.errors import QueueFull

DECODED_BYTES_PER_PIXEL = 4  # RGBA as decoded (RGB once converted, a copy on the way)
DEFAULT_MAX_DECODED_BYTES = 4 << 30  # >= MAX_IMAGES_PER_REQUEST images of the largest size
RETRY_AFTER_S = 1


class DecodedImages:
    """Bytes of decoded images alive in the process, at most `limit`; thread-safe (images are
    decoded on worker threads, and freed where their last reference goes)."""

    def __init__(self, limit: int = DEFAULT_MAX_DECODED_BYTES) -> None:
        self.limit = limit
        self.held = 0
        self.refused = 0  # decodes refused at the bound
        self._lock = threading.Lock()

    def reserve(self, sizes: list[tuple[int, int]]) -> list[int]:
        """Reserve the bytes of a request's pictures (width, height each), all or none: each
        one's share (returned), or QueueFull past the bound."""
        shares = [width * height * DECODED_BYTES_PER_PIXEL for width, height in sizes]
        need = sum(shares)
        with self._lock:  # (nothing allocated under it: a finalizer may release meanwhile)
            held = self.held
            fits = held + need <= self.limit
            if fits:
                self.held += need
            else:
                self.refused += 1
        if not fits:
            raise QueueFull(f"the server holds {held / 2**20:.1f} MiB of decoded images, and "
                            f"this request's {len(sizes)} need {need / 2**20:.1f} MiB more than "
                            f"its {self.limit >> 20} MiB allow: retry shortly", RETRY_AFTER_S)
        return shares

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.held -= nbytes

    def hold(self, image: Any, nbytes: int) -> None:
        """The reserved bytes count until `image` is freed."""
        weakref.finalize(image, self.release, nbytes)
