"""Chunks that never cut an image whose rows attend to each other both ways (Gemma 3).

Such an image's placeholder run must be computed in one forward pass: its first row attends to
its last. A chunk of a request's prompt (positions start .. start+chunk-1) that would end
inside a run is adjusted: `whole_runs` cuts it back to the run's start when the run begins
after the chunk's start, else takes the run whole (a run the chunk begins in or at: the
budget's soft limit is passed by at most one image; a prefix the radix cache matched may end
inside a run, whose rows' KV is final, so the chunk takes the rest of it). `cut_runs` only
cuts back (0: the chunk cannot start here now), for when the KV pool's room is what bounds it.
"""

from __future__ import annotations

from collections.abc import Sequence

from radixrt.runtime.image_messages import ImageInput


def _runs(images: Sequence[ImageInput]) -> list[tuple[int, int]]:
    return sorted((start, start + length) for image in images for start, length in image.runs)


def whole_runs(images: Sequence[ImageInput], start: int, chunk: int) -> int:
    """The chunk from `start`, ending at no run's inside (cut back, or grown to its end)."""
    end = start + chunk
    for first, last in _runs(images):
        if first < end < last:
            return (first if first > start else last) - start
    return chunk


def cut_runs(images: Sequence[ImageInput], start: int, chunk: int) -> int:
    """The chunk from `start`, cut back to the start of a run it would end inside (0: it
    begins in or at that run)."""
    end = start + chunk
    for first, last in _runs(images):
        if first < end < last:
            return max(first - start, 0)
    return chunk
