"""ReplicaEndpoint: DSL programs over several radixrt replicas, each program kept on one.

`rx.RuntimeEndpoint(["tcp://127.0.0.1:A", "tcp://127.0.0.1:B"])` (each a replica's
`--dsl-port`) returns one of these. It is a backend like any other, with one difference: a
program run on it is placed on one replica, chosen at the program's first call by the SGLang
router's cache_aware rule (replica_choice.py), and all of its calls, its forks', pins' and
selects' included, go there (program_replica.py). So a fork's prefix is computed once, on the
replica its children read it from, exactly as on one runtime; different programs of a
`run_batch` may land on different replicas, and programs that share a few-shot prefix land
where that prefix already is (unless the loads are out of balance).

Calls made on the endpoint itself, outside any program (run_batch pinning its traced prefix,
a direct `endpoint.generate(...)`), are each placed on their own by the same rule; a pin's
handle remembers its replica, so its unpin goes back there.

The replicas must serve the same model with the same chat template (checked at connection):
a program's answers must not depend on where it ran. A replica that exits or stops answering
fails the programs already on it and is marked down; the rest keep serving new programs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from radixrt.frontend.backends.program_replica import ProgramReplica
from radixrt.frontend.backends.replica_choice import ChoiceRule, ReplicaChooser
from radixrt.frontend.backends.zmq_endpoint import ZmqRuntimeEndpoint
from radixrt.frontend.lang.backend import (
    ChatFormat,
    ChoiceLogprobs,
    GenResult,
    PieceCallback,
    RuntimeUnreachable,
    SummedTokenUsage,
)
from radixrt.runtime.config import DSL_CONNECT_TIMEOUT_S

# server_info counters that add up over replicas (the rest is per replica, under "replicas")
SUMMED_COUNTERS = ("prompt_tokens", "cached_tokens", "computed_tokens", "generated_tokens",
                   "running", "waiting", "kv_total", "kv_free", "kv_evictable", "kv_locked",
                   "kv_private", "pinned", "pinned_tokens", "preemptions")
ASYNC_TWINS = ("agenerate", "ascore", "apin", "aunpin")  # what arun's programs call


@dataclass(frozen=True)
class ReplicaPin:
    """A pin made on the endpoint itself: the replica that holds it and that replica's id."""

    replica: int
    handle: Any


class ReplicaEndpoint:
    def __init__(self, addresses: Sequence[Any], connect_timeout: float = DSL_CONNECT_TIMEOUT_S,
                 alive: Callable[[], bool] | None = None, api_key: str | None = None, *,
                 rule: ChoiceRule | None = None) -> None:
        """addresses: each replica's tcp:// or ipc:// DSL address (`radixrt serve --dsl-port`),
        or a connected RuntimeEndpoint / rx.Runtime (left open by close()). rule: the placement
        rule's thresholds (ChoiceRule(); the router's defaults)."""
        if isinstance(addresses, str) or not addresses:
            raise ValueError("give a list of replica addresses, e.g. RuntimeEndpoint("
                             '["tcp://127.0.0.1:30001", "tcp://127.0.0.1:30002"])')
        self.backends: list[Any] = []
        self._owned: list[Any] = []  # connected here, closed by close()
        try:
            for item in addresses:
                if isinstance(item, str):
                    if not item.startswith(("tcp://", "ipc://")):
                        raise ValueError(f"replica {item!r}: give its DSL address, tcp://HOST:"
                                         "PORT or ipc://PATH (`radixrt serve --dsl-port PORT`)")
                    item = ZmqRuntimeEndpoint(item, connect_timeout, alive, api_key)
                    self._owned.append(item)
                missing = [m for m in ASYNC_TWINS if not hasattr(item, m)]
                if missing:
                    raise TypeError(f"replica {item!r} is not a RuntimeEndpoint (no {missing})")
                self.backends.append(item)
            self._check_same_model()
        except BaseException:
            self.close()
            raise
        self.addresses = [str(getattr(b, "address", b)) for b in self.backends]
        self.model = getattr(self.backends[0], "model", None)
        self.chooser = ReplicaChooser(len(self.backends), rule)
        # every replica's calls, summed (each replica's endpoint counts its own)
        self.token_usage = SummedTokenUsage(b.token_usage for b in self.backends
                                            if hasattr(b, "token_usage"))

    def for_program(self) -> ProgramReplica:
        """The backend of one program: every call of it (forks included) on one replica."""
        return ProgramReplica(self)

    # --- Backend: calls outside a program, each placed on its own -----------------------------
    def chat_format(self) -> ChatFormat:
        return self.backends[0].chat_format()

    def generate(self, text: str, params: dict[str, Any], on_piece: PieceCallback | None,
                 priority: int = 0, images: Sequence[bytes] = ()) -> GenResult:
        return self.for_program().generate(text, params, on_piece, priority, images)

    async def agenerate(self, text: str, params: dict[str, Any], on_piece: PieceCallback | None,
                        priority: int = 0, images: Sequence[bytes] = ()) -> GenResult:
        return await self.for_program().agenerate(text, params, on_piece, priority, images)

    def score(self, text: str, choices: list[str], unconditional: bool,
              priority: int = 0, images: Sequence[bytes] = ()) -> list[ChoiceLogprobs]:
        return self.for_program().score(text, choices, unconditional, priority, images)

    async def ascore(self, text: str, choices: list[str], unconditional: bool,
                     priority: int = 0, images: Sequence[bytes] = ()) -> list[ChoiceLogprobs]:
        return await self.for_program().ascore(text, choices, unconditional, priority, images)

    def embed(self, text: str, dimensions: int | None, priority: int = 0) -> list[float]:
        return self.for_program().embed(text, dimensions, priority)

    async def aembed(self, text: str, dimensions: int | None,
                     priority: int = 0) -> list[float]:
        return await self.for_program().aembed(text, dimensions, priority)

    def pin(self, text: str, priority: int = 0,
            images: Sequence[bytes] = ()) -> ReplicaPin | None:
        one = self.for_program()
        return self._replica_pin(one, one.pin(text, priority, images))

    async def apin(self, text: str, priority: int = 0,
                   images: Sequence[bytes] = ()) -> ReplicaPin | None:
        one = self.for_program()
        return self._replica_pin(one, await one.apin(text, priority, images))

    def unpin(self, handle: ReplicaPin) -> None:
        self.backends[handle.replica].unpin(handle.handle)

    async def aunpin(self, handle: ReplicaPin) -> None:
        await self.backends[handle.replica].aunpin(handle.handle)

    def token_texts(self, token_ids: list[int]) -> list[str]:
        return self.backends[0].token_texts(token_ids)

    def get_model_name(self) -> str:
        return str(self.backends[0].get_model_name())

    def info(self) -> dict[str, Any]:
        """Counters summed over the replicas (SUMMED_COUNTERS; cache_hit_rate of the sums),
        each replica's own server_info under "replicas", and the placement state under
        "routing": per replica, calls in flight, placements made, approximate tree size."""
        infos = self._each("info")
        live = [i for i in infos if i is not None]
        out: dict[str, Any] = {"model": self.model, "num_replicas": len(infos)}
        for key in SUMMED_COUNTERS:
            if live and all(key in i for i in live):
                out[key] = sum(int(i[key]) for i in live)
        prompt = out.get("prompt_tokens", 0)
        out["cache_hit_rate"] = out.get("cached_tokens", 0) / prompt if prompt else 0.0
        out["replicas"] = [{"address": a, "up": i is not None, **(i or {})}
                           for a, i in zip(self.addresses, infos)]
        out["routing"] = {"addresses": list(self.addresses), **self.chooser.snapshot()}
        return out

    def flush_cache(self) -> int:
        """Flush every replica's cache (and forget what was sent where); the tokens freed."""
        freed = sum(int(f) for f in self._each("flush_cache") if f is not None)
        self.chooser.forget()
        return freed

    # --- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connections this endpoint opened (replicas given connected stay open)."""
        for backend in self._owned:
            backend.close()
        self._owned.clear()

    def __enter__(self) -> ReplicaEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals ---------------------------------------------------------------------------
    def _each(self, method: str) -> list[Any]:
        """backend.method() on every replica that is up; None for one that is (or now goes)
        down."""
        out: list[Any] = []
        for i, (backend, up) in enumerate(zip(self.backends, self.chooser.snapshot()["up"])):
            try:
                out.append(getattr(backend, method)() if up else None)
            except RuntimeUnreachable:
                self.chooser.mark_down(i)
                out.append(None)
        return out

    @staticmethod
    def _replica_pin(one: ProgramReplica, handle: Any) -> ReplicaPin | None:
        if handle is None or one.replica is None:
            return None
        return ReplicaPin(one.replica, handle)

    def _check_same_model(self) -> None:
        first = self.backends[0]
        for other in self.backends[1:]:
            if getattr(other, "model", None) != getattr(first, "model", None):
                raise ValueError(f"replicas serve different models: {first.model!r} at "
                                 f"{first.address}, {other.model!r} at {other.address}")
            if other.chat_format() != first.chat_format():
                raise ValueError(f"replicas {first.address} and {other.address} have different "
                                 "chat templates: a program's text would depend on its replica")
