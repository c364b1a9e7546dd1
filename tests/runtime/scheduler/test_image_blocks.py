"""Chunks around images computed whole (Gemma 3): a chunk that would end inside an image's run
is cut back to the run's start when the run begins after the chunk's start, else grows to the
run's end; cut_runs only cuts back (0 where the chunk begins in or at the run)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from radixrt.runtime.image_messages import ImageInput
from radixrt.runtime.scheduler.image_blocks import cut_runs, whole_runs


def images(*runs: tuple[int, int]) -> list[ImageInput]:
    return [ImageInput(digest=f"{i:064x}", runs=[[s, n]], tensors=[])
            for i, (s, n) in enumerate(runs)]


def test_the_three_cases() -> None:
    two = images((4, 8), (20, 8))  # runs 4..11 and 20..27
    assert whole_runs(two, 0, 6) == 4  # cut back to the first run's start
    assert whole_runs(two, 4, 2) == 8  # begins at a run: grows to its end
    assert whole_runs(two, 7, 2) == 5  # begins inside one (a tree match): its rest
    assert whole_runs(two, 0, 12) == 12 and whole_runs(two, 12, 8) == 8  # ends between runs
    assert cut_runs(two, 0, 6) == 4 and cut_runs(two, 4, 2) == 0 and cut_runs(two, 7, 2) == 0


@given(st.lists(st.tuples(st.integers(1, 5), st.integers(1, 9)), max_size=4),
       st.integers(0, 60), st.integers(1, 30))
def test_no_chunk_ends_inside_a_run(gaps: list[tuple[int, int]], start: int, chunk: int) -> None:
    runs, p = [], 0
    for gap, length in gaps:
        runs.append((p + gap, length))
        p += gap + length
    placed = images(*runs)
    for adjust in (whole_runs, cut_runs):
        size = adjust(placed, start, chunk)
        assert size >= 0 and (size > 0 or adjust is cut_runs)  # 0: no chunk starts here now
        end = start + size
        assert size == 0 or not any(s < end < s + n for s, n in runs), (
            adjust.__name__, runs, start, end)
    assert whole_runs(placed, start, chunk) >= cut_runs(placed, start, chunk)
