"""ProgramReplica: the backend one program sees when it runs over several replicas.

A program's calls build on each other: a fork pins its prefix on a replica and the children
must read it there; a `select` scores choices after text that an earlier `gen` computed; a pin
is a lease on one replica's cache. So a program must not be spread: all of its calls go to one
replica. `run`, `arun` and each program of `run_batch` / `arun_batch` wrap the endpoint with
`for_program()` (lang/program.py: `program_backend`), and every state of the program, its forks'
included, shares that one wrapper (`StreamExecutor.child` passes its backend on).

The wrapper chooses lazily: at the program's first call, whose text is what the program has
built so far (its few-shot examples, its fork prefix), the endpoint's ReplicaChooser picks the
replica (replica_choice.py) and the wrapper keeps it. Forks that call at the same time wait for
that one choice (a lock), so they never split.

A replica that exits or stops answering fails the programs placed on it (their prefixes and
pins were there) and is marked down: later programs go to the others.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from radixrt.frontend.backends.replica_choice import NoReplicaUp, ReplicaChooser
from radixrt.frontend.lang.backend import (
    BackendError,
    ChatFormat,
    ChoiceLogprobs,
    GenResult,
    PieceCallback,
    RuntimeUnreachable,
)


class Replicas(Protocol):
    """What a program's wrapper needs of the endpoint that made it (ReplicaEndpoint provides it):
    the replicas' backends and addresses, index for index, and the chooser that places programs
    on them. The endpoint knows its wrappers; a wrapper knows only this."""

    backends: list[Any]
    addresses: list[str]
    chooser: ReplicaChooser

    def chat_format(self) -> ChatFormat: ...

    def info(self) -> dict[str, Any]: ...


class ProgramReplica:
    def __init__(self, endpoint: Replicas) -> None:
        self._endpoint = endpoint
        self._lock = threading.Lock()
        self.replica: int | None = None  # chosen at the first call

    @property
    def address(self) -> str | None:
        """The chosen replica's address (None before the program's first call)."""
        return None if self.replica is None else self._endpoint.addresses[self.replica]

    def chat_format(self) -> ChatFormat:
        return self._endpoint.chat_format()

    # --- Backend, each call on the program's replica ----------------------------------------
    def generate(self, text: str, params: dict[str, Any], on_piece: PieceCallback | None,
                 priority: int = 0, images: Sequence[bytes] = ()) -> GenResult:
        with self._call(text) as (replica, backend):
            result = backend.generate(text, params, on_piece, priority=priority, images=images)
        self._endpoint.chooser.record(replica, text + result.text)
        return result

    async def agenerate(self, text: str, params: dict[str, Any], on_piece: PieceCallback | None,
                        priority: int = 0, images: Sequence[bytes] = ()) -> GenResult:
        with self._call(text) as (replica, backend):
            result = await backend.agenerate(text, params, on_piece, priority=priority,
                                             images=images)
        self._endpoint.chooser.record(replica, text + result.text)
        return result

    def score(self, text: str, choices: list[str], unconditional: bool,
              priority: int = 0, images: Sequence[bytes] = ()) -> list[ChoiceLogprobs]:
        with self._call(text) as (_, backend):
            return backend.score(text, choices, unconditional, priority=priority, images=images)

    async def ascore(self, text: str, choices: list[str], unconditional: bool,
                     priority: int = 0, images: Sequence[bytes] = ()) -> list[ChoiceLogprobs]:
        with self._call(text) as (_, backend):
            return await backend.ascore(text, choices, unconditional, priority=priority,
                                        images=images)

    def embed(self, text: str, dimensions: int | None, priority: int = 0) -> list[float]:
        with self._call(text) as (_, backend):
            return backend.embed(text, dimensions, priority=priority)

    async def aembed(self, text: str, dimensions: int | None,
                     priority: int = 0) -> list[float]:
        with self._call(text) as (_, backend):
            return await backend.aembed(text, dimensions, priority=priority)

    def pin(self, text: str, priority: int = 0, images: Sequence[bytes] = ()) -> Any:
        with self._call(text) as (_, backend):
            return backend.pin(text, priority=priority, images=images)

    async def apin(self, text: str, priority: int = 0, images: Sequence[bytes] = ()) -> Any:
        with self._call(text) as (_, backend):
            return await backend.apin(text, priority=priority, images=images)

    def unpin(self, handle: Any) -> None:
        self._bound().unpin(handle)

    async def aunpin(self, handle: Any) -> None:
        await self._bound().aunpin(handle)

    def token_texts(self, token_ids: list[int]) -> list[str]:
        """Decoded with the chosen replica's tokenizer (the replicas serve one model)."""
        return self._endpoint.backends[self.replica or 0].token_texts(token_ids)

    def info(self) -> dict[str, Any]:
        """The chosen replica's server_info (before the first call: the endpoint's)."""
        return self._endpoint.info() if self.replica is None else self._bound().info()

    # --- internals ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def _call(self, text: str) -> Iterator[tuple[int, Any]]:
        """One call in flight on the program's replica (chosen now if this is the first)."""
        chooser = self._endpoint.chooser
        with self._lock:
            first = self.replica is None
            if first:
                try:
                    self.replica = chooser.choose(text).replica  # counts this call in flight
                except NoReplicaUp:
                    raise BackendError("no replica answers any more: "
                                       f"{', '.join(self._endpoint.addresses)}") from None
        replica = self.replica
        assert replica is not None
        if not first:
            chooser.started(replica, text)
        try:
            yield replica, self._endpoint.backends[replica]
        except RuntimeUnreachable:
            chooser.mark_down(replica)
            raise
        finally:
            chooser.finished(replica)

    def _bound(self) -> Any:
        if self.replica is None:
            raise RuntimeError("unpin before any pin: this program has no replica yet")
        return self._endpoint.backends[self.replica]
