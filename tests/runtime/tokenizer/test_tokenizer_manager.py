"""The tokenizer process's TokenizerManager, over its ZeroMQ link to the real scheduler and worker
processes, driven directly from a test event loop: what HTTP and DSL handlers rely on when they
read streams at their own pace."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest

from radixrt.runtime.config import EngineConfig
from radixrt.runtime.ipc import Addresses, ServiceArgs
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.tokenizer.pin_leases import PinService

pytestmark = pytest.mark.slow  # starts the scheduler and worker processes

PROMPT = "The capital of France is Paris. The capital of Germany is"
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


class Trio:
    def __init__(self, loop: asyncio.AbstractEventLoop, manager: Any, procs: list[Any]) -> None:
        self.loop = loop
        self.manager = manager
        self.procs = procs

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)


@pytest.fixture(scope="module")
def trio(tokenizer: Any) -> Iterator[Trio]:
    from radixrt.runtime.helper_process import HelperProcess
    from radixrt.runtime.scheduler.scheduler_process import run_scheduler
    from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager
    from radixrt.runtime.tokenizer.zmq_link import ZmqSchedulerLink
    from radixrt.runtime.worker.worker_process import run_worker

    config = EngineConfig(max_total_tokens=2048, check_integrity=True)
    addrs, ipc_dir = Addresses.in_private_dir()
    args = ServiceArgs(config, addrs, "warning")
    procs = [HelperProcess(run_scheduler, args, name="radixrt-scheduler"),
             HelperProcess(run_worker, args, name="radixrt-worker")]
    for proc in procs:
        proc.start()
    loop = asyncio.new_event_loop()
    try:
        async def start() -> Any:
            manager = TokenizerManager(ZmqSchedulerLink(tokenizer, addrs), "default")
            await manager.wait_ready(lambda: all(p.is_alive() for p in procs), 300)
            return manager

        manager = loop.run_until_complete(start())
        yield Trio(loop, manager, procs)
        loop.run_until_complete(manager.close())
    finally:
        loop.close()
        for proc in procs:
            proc.terminate()
            proc.join(timeout=10)
        shutil.rmtree(ipc_dir, ignore_errors=True)


async def read_all(manager: Any, params: SamplingParams, pause: bool = False) -> list[Any]:
    """Every chunk of one request; with pause, the reader stops after the first chunk until the
    runtime has finished the request (the rest of its chunks then wait in its queue)."""
    chunks = []
    stream = manager.generate(manager.encode(PROMPT), params)

    async def idle() -> bool:
        info = await manager.server_info()
        return info["running"] == 0 and info["waiting"] == 0

    async with contextlib.aclosing(stream):
        async for chunk in stream:
            chunks.append(chunk)
            if pause and len(chunks) == 1:
                assert await wait_until(idle, 60)
                await asyncio.sleep(0.5)  # its last output deltas reach the manager
    return chunks


async def wait_until(predicate: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.1)
    return bool(await predicate())


def test_a_slow_reader_gets_every_chunk_and_the_final_one(trio: Trio) -> None:
    """A reader that falls behind the steps used to lose the chunks still queued when the
    request finished (the stream ended as soon as the output was complete)."""
    fast = trio.run(read_all(trio.manager, GREEDY))
    slow = trio.run(read_all(trio.manager, GREEDY, pause=True))
    for chunks in (fast, slow):
        assert sum(len(c.token_ids) for c in chunks) == 8
        assert chunks[-1].finish_reason == "length"
        assert [c.finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert "".join(c.text for c in slow) == "".join(c.text for c in fast)


def test_a_pin_is_leased_even_when_its_reader_stopped_before_the_final_chunk(trio: Trio) -> None:
    """The pin service hears of every pin the runtime makes, so a pin whose client never read
    the chunk that carried it is still released when its lease runs out."""
    manager = trio.manager
    pins = PinService(manager, ttl_s=1.0)

    async def pinned() -> int:
        return int((await manager.server_info())["pinned"])

    async def abandon() -> None:
        params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
        stream = manager.generate(manager.encode(PROMPT), params, pin=True)
        first = await stream.__anext__()
        assert first.finish_reason is None
        assert await wait_until(lambda: _ready(pinned), 30)  # finished and pinned meanwhile
        await stream.aclose()  # the final chunk, which carries the pin, was never read
        assert len(pins) == 1
        assert await wait_until(lambda: _none(pinned), 5)
        info = await manager.server_info()
        assert info["kv_locked"] == 0 and pins.expired_total == 1 and len(pins) == 0

    try:
        trio.run(abandon())
    finally:
        pins.close()


async def _ready(pinned: Any) -> bool:
    return await pinned() == 1


async def _none(pinned: Any) -> bool:
    return await pinned() == 0



def test_samples_that_end_on_the_same_step_all_get_their_last_chunk(trio: Trio) -> None:
    """n = 2 whose samples finish together: the second used to lose its last token and its
    finish_reason (the stream ended once the output was complete, chunks still queued)."""
    for max_tokens in (1, 5):
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, n=2)
        chunks = trio.run(read_all(trio.manager, params))
        for index in (0, 1):
            mine = [c for c in chunks if c.index == index]
            assert sum(len(c.token_ids) for c in mine) == max_tokens, (index, chunks)
            assert mine[-1].finish_reason == "length"
