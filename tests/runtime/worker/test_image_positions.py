"""Multimodal RoPE's positions: in any chunks, what transformers' get_rope_index gives for the
whole prompt (Qwen2-VL's rule, written out here independently as a walk over the prompt)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixrt.runtime.image_messages import ImageInput
from radixrt.runtime.worker.image_positions import entry_positions, mrope_positions


def whole_prompt(length: int, images: list[tuple[int, tuple[int, int, int]]]) -> torch.Tensor:
    """get_rope_index's walk: text at the running position, an image's rows on its grid from
    the running position, which then moves on by max(h, w)."""
    out = torch.zeros(3, length, dtype=torch.int64)
    starts = dict(images)
    p, pos = 0, 0
    while p < length:
        if p in starts:
            t, h, w = starts[p]
            for k in range(t * h * w):
                out[:, p + k] = torch.tensor([pos + k // (h * w), pos + (k // w) % h, pos + k % w])
            p += t * h * w
            pos += max(h, w)
        else:
            out[:, p] = pos
            p += 1
            pos += 1
    return out


@st.composite
def prompts(draw: st.DrawFn) -> tuple[int, list[tuple[int, tuple[int, int, int]]]]:
    images, p = [], draw(st.integers(0, 5))
    for _ in range(draw(st.integers(0, 3))):
        grid = (1, draw(st.integers(1, 4)), draw(st.integers(1, 4)))
        images.append((p, grid))
        p += grid[1] * grid[2] + draw(st.integers(0, 4))
    return p + draw(st.integers(1, 6)), images


@settings(max_examples=60, deadline=None)
@given(prompts(), st.lists(st.integers(1, 9), min_size=1, max_size=8))
def test_chunks_give_the_whole_prompts_positions(
        prompt: tuple[int, list[tuple[int, tuple[int, int, int]]]], chunks: list[int]) -> None:
    length, placed = prompt
    grids = {}
    inputs = []
    for i, (start, grid) in enumerate(placed):
        image = ImageInput(digest=f"{i:064x}", runs=[[start, grid[0] * grid[1] * grid[2]]],
                           tensors=[])
        grids[image.digest] = grid
        inputs.append(image)
    entries, start = [], 0
    for size in chunks * (length // sum(chunks) + 1):
        if start >= length:
            break
        size = min(size, length - start)
        entries.append((inputs, start, size))
        start += size
    got = mrope_positions(entries, lambda im: grids[im.digest], torch.device("cpu"))
    want = whole_prompt(length, placed)
    if not placed:
        assert got is None
    else:
        assert torch.equal(got, want)


def test_a_decode_step_after_an_image_goes_on_from_the_grid() -> None:
    """Text after a 2 x 3 image at position 1 continues from 1 + max(2, 3)."""
    image = ImageInput(digest="0" * 64, runs=[[1, 6]], tensors=[])
    got = entry_positions([image], 9, 1, lambda im: (1, 2, 3))
    assert got.tolist() == [[1 + 3 + 2]] * 3  # positions 7, 8 are text: 4, 5; 9 -> 6
