"""TokenizerManager over an in-process Engine: for tests of the HTTP layer and for embedding a
server in one process. `radixrt serve` uses the ZeroMQ process trio instead."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from radixrt.runtime.engine import Engine
from radixrt.runtime.messages import Scheduling
from radixrt.runtime.outputs import StreamChunk
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.tokenizer.manager_base import ClientIds, RequestMetrics
from radixrt.runtime.tokenizer.prompts import Prompt, encode_checked


class EngineManager:
    def __init__(self, engine: Engine, model_name: str = "default") -> None:
        self.engine = engine
        self.model_name = model_name
        self.context_length = engine.context_length
        self.vocab_size = engine.model_config.vocab_size
        self.tokenizer = engine.tokenizer
        self._callbacks: list[Callable[[RequestMetrics], None]] = []
        self._client_ids = ClientIds()
        self._pin_callbacks: list[Callable[[int], None]] = []

    def encode(self, prompt: Prompt) -> list[int]:
        return encode_checked(self.tokenizer, prompt, self.vocab_size)

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        rid_hint: str | None = None,
        pin: bool = False,
        scheduling: Scheduling | None = None,
    ) -> AsyncIterator[StreamChunk]:
        s = scheduling or Scheduling()
        metrics = RequestMetrics(arrival=time.monotonic(), prompt_tokens=len(prompt_ids),
                                 priority=s.priority, tenant=s.tenant)
        submitted = False
        rid: int | None = None
        try:
            async with contextlib.aclosing(
                self.engine.generate_stream(prompt_ids, params, pin, s.priority, s.tenant,
                                            s.timeout_s, s.extra_key)
            ) as stream:
                async for chunk in stream:
                    if not submitted:
                        rid = chunk.rid
                        self._client_ids.add(rid_hint, rid)
                    submitted = True
                    metrics.record(chunk, time.monotonic())
                    if chunk.pinned:
                        for on_pinned in self._pin_callbacks:
                            on_pinned(chunk.rid)
                    yield chunk
        finally:
            if rid is not None:
                self._client_ids.remove(rid_hint, rid)
            metrics.finished = time.monotonic()
            if submitted:  # refused requests are not in the latency figures
                for callback in self._callbacks:
                    callback(metrics)

    async def abort(self, rid: int | str) -> int:
        rids = self._client_ids.resolve(rid)
        for one in rids:
            self.engine.abort(one)
        return len(rids)

    async def unpin(self, rid: int) -> None:
        self.engine.unpin(rid)

    async def flush_cache(self) -> int:
        return self.engine.flush_cache()

    async def server_info(self) -> dict[str, Any]:
        info = dict(self.engine.stats())
        info["model"] = self.model_name
        info["context_length"] = self.context_length
        return info

    def on_finish(self, callback: Callable[[RequestMetrics], None]) -> None:
        self._callbacks.append(callback)

    def on_pinned(self, callback: Callable[[int], None]) -> None:
        self._pin_callbacks.append(callback)
