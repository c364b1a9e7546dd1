"""Programs on asyncio against a live runtime (`rx.Runtime`, the real process trio): 500 programs
with forks and selects at once on one event loop give the answers their threaded `run` gives
(greedy), on a handful of threads; a cancelled program aborts its requests and frees their KV;
`atext_iter` streams."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

import radixrt as rx

pytestmark = pytest.mark.slow  # starts real processes

PROGRAMS = 500


@pytest.fixture(scope="module")
def rt() -> Iterator[rx.Runtime]:
    runtime = rx.Runtime(max_total_tokens=16384, check_integrity=True, log_level="warning")
    yield runtime
    runtime.close()
    assert runtime.proc.returncode == 0, runtime.log_tail()


@rx.function
def judge(s, n):
    s += f"Is {n} an even number? Think about it."
    forks = s.fork(2)
    for f, aspect in zip(forks, ("digits", "parity")):
        f += f" Looking at its {aspect}:" + rx.gen("note", max_tokens=2)
    forks.join()
    s += " Answer:" + rx.select("answer", ["yes", "no"])


def wait_idle(rt: rx.Runtime, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        info = rt.info()
        if info["running"] == 0 and info["waiting"] == 0 and info["kv_private"] == 0 \
                and info["kv_locked"] == 0:
            return info
        assert time.monotonic() < deadline, info
        time.sleep(0.1)


def test_500_concurrent_programs_on_one_loop_match_their_threaded_runs(rt):
    numbers = list(range(PROGRAMS))
    distinct = numbers[:10]  # the threaded reference, for the distinct prompts' answers
    want = {n: judge.run(n=n, backend=rt, temperature=0).variables for n in distinct}

    async def main() -> tuple[list[rx.ProgramState], int]:
        before = threading.active_count()
        peak = before

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, threading.active_count())
                await asyncio.sleep(0.05)

        watcher = asyncio.ensure_future(watch())
        states = await asyncio.gather(*(judge.arun(n=n % 10, backend=rt, temperature=0)
                                        for n in numbers))
        watcher.cancel()
        return states, peak - before

    states, extra_threads = asyncio.run(main())
    assert extra_threads <= 2, f"{extra_threads} threads made for {PROGRAMS} programs"
    for n, state in zip(numbers, states):
        assert state.variables == want[n % 10], n
    wait_idle(rt)


def test_a_cancelled_program_aborts_its_requests_and_frees_their_kv(rt):
    @rx.function
    def long_story(s):
        s += "Once upon a time"
        forks = s.fork(2)
        forks += rx.gen("story", max_tokens=2000, ignore_eos=True)
        forks.join()

    async def main() -> None:
        task = asyncio.ensure_future(long_story.arun(backend=rt, temperature=0.8))
        deadline = time.monotonic() + 60
        while (await asyncio.to_thread(rt.info))["running"] < 2:
            assert time.monotonic() < deadline, "the forks never ran"
            await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    before = rt.info()["generated_tokens"]
    asyncio.run(main())
    info = wait_idle(rt, timeout=30)
    assert info["generated_tokens"] - before < 1000  # aborted long before 2 x 2000 tokens
    assert info["pinned"] == 0


def test_atext_iter_follows_a_streamed_arun(rt):
    @rx.function
    def poem(s):
        s += "Write one line about the sea:" + rx.gen("line", max_tokens=12, temperature=0)

    async def main() -> tuple[list[str], rx.ProgramState]:
        state = await poem.arun(backend=rt, stream=True)
        pieces = [piece async for piece in state.atext_iter("line")]
        return pieces, await state.await_done()

    pieces, state = asyncio.run(main())
    assert len(pieces) > 1 and "".join(pieces) == state["line"]
    assert state["line"] == poem.run(backend=rt)["line"]
