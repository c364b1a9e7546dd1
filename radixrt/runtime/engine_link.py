"""A TokenizerManager's link to an in-process Engine (`Engine.generate_stream`, tests of the
HTTP layer, a server embedded in one process): the manager uses the Engine's own request front,
and whichever request waits for output takes the Engine's next step, on the event loop's thread.
`radixrt serve` links to a scheduler process instead (tokenizer/zmq_link.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from radixrt.runtime.scheduler.intake import SchedulerIntake
from radixrt.runtime.tokenizer.request_front import RequestFront, Stream


class SteppedEngine(Protocol):
    front: RequestFront
    intake: SchedulerIntake

    def step(self) -> Any: ...


class EngineLink:
    def __init__(self, engine: SteppedEngine) -> None:
        self.engine = engine
        self.front = engine.front
        self.info: dict[str, Any] = engine.intake.info()

    async def start(self, alive: Callable[[], bool], timeout_s: float) -> None:
        """An Engine is ready once made."""

    async def progress(self, stream: Stream) -> None:
        self.engine.step()
        await asyncio.sleep(0)  # the other requests' readers, and the server, get their turn

    async def close(self) -> None:
        """The Engine belongs to whoever made it: it stays open."""
