"""Multimodal RoPE's positions (Qwen2-VL): where images move the decoder's positions.

Text tokens before any image sit at (p, p, p) for prompt position p. An image whose run starts
at position `first`, with a merged grid of t x h x w rows, puts row k at
(base + k // (h w), base + (k // w) mod h, base + k mod w), base = its first position after the
shifts of the images before it; the text after it goes on from base + max(h, w), so every
position after the image shifts by max(h, w) - t h w (as transformers' get_rope_index). A
request's positions thus depend on its prefix only: its KV in the radix tree stays valid for
every request sharing that prefix, and a decode step's position is its index plus the shift of
all its images.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from radixrt.runtime.image_messages import ImageInput

Grid = Callable[[ImageInput], tuple[int, int, int]]  # an image's merged grid (t, h, w)


def entry_positions(images: Sequence[ImageInput], start: int, length: int, grid: Grid
                    ) -> Tensor:
    """[3, length] positions of a request's positions start .. start+length-1."""
    out = torch.arange(start, start + length, dtype=torch.int64).expand(3, -1).clone()
    shift = 0  # of the positions after the images so far
    for image in sorted(images, key=lambda im: im.runs[0][0]):
        if len(image.runs) != 1:
            raise ValueError("multimodal RoPE takes an image's placeholders as one run")
        first, n = image.runs[0]
        t, h, w = grid(image)
        if t * h * w != n:
            raise ValueError(f"an image of {n} placeholders has a grid of {t} x {h} x {w}")
        lo, hi = max(start, first), min(start + length, first + n)
        if lo < hi:
            k = torch.arange(lo - first, hi - first, dtype=torch.int64)
            base = first + shift
            out[:, lo - start : hi - start] = torch.stack(
                (base + k // (h * w), base + (k // w) % h, base + k % w))
        after = max(first + n - start, 0)
        shift += max(h, w) - n
        out[:, after:] += max(h, w) - n
    return out


def mrope_positions(entries: Sequence[tuple[Sequence[ImageInput], int, int]], grid: Grid,
                    device: torch.device) -> Tensor | None:
    """[3, num_tokens] of a batch's entries (images, start, length), in batch order; None when
    none has an image (then every stream is the 1-D position)."""
    if not any(images for images, _, _ in entries):
        return None
    parts = [entry_positions(images, start, length, grid) for images, start, length in entries]
    return torch.cat(parts, dim=1).to(device)
