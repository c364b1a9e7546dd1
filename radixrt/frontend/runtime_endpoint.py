"""RuntimeEndpoint: run DSL programs on a radixrt runtime over ZeroMQ (`radixrt serve`).

The frontend sends text; the runtime tokenizes it and its radix tree finds what earlier calls
already computed. `select` is one call (all choices scored in one batch), and a fork's prefix is
computed once and pinned in the radix cache until the fork is joined.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from radixrt.frontend.backend import (
    BackendError,
    ChatFormat,
    ChoiceLogprobs,
    GenResult,
    PieceCallback,
)
from radixrt.frontend.lease_keeper import LeaseKeeper
from radixrt.frontend.zmq_client import DslClient
from radixrt.runtime.config import DSL_CONNECT_TIMEOUT_S, PIN_LEASE_TTL_S, PIN_RENEWALS_PER_TTL

_PREFILL_ONLY = {"max_tokens": 1, "temperature": 0.0}


class RuntimeEndpoint:
    """`RuntimeEndpoint("tcp://127.0.0.1:PORT")` for `radixrt serve --dsl-port PORT`, or the
    ipc:// address its log names; `api_key`: the server's `--api-key`, if it has one."""

    def __init__(self, address: str, connect_timeout: float = DSL_CONNECT_TIMEOUT_S,
                 alive: Callable[[], bool] | None = None, api_key: str | None = None) -> None:
        if not address.startswith(("tcp://", "ipc://")):
            raise ValueError(f"address {address!r} must be tcp://HOST:PORT or ipc://PATH")
        self.address = address
        self._client = DslClient(address, alive, api_key)
        try:
            reply = self._client.call(op="info", timeout=connect_timeout)
        except BackendError as exc:
            self._client.close()
            raise BackendError(
                f"no radixrt runtime answered at {address} ({exc}); start one with "
                "`radixrt serve --dsl-port PORT`"
            ) from None
        self._chat = ChatFormat.from_info(reply.info.get("chat", {}))
        self._cache_on = not reply.info.get("disable_radix_cache", False)
        self.model = reply.info.get("model")
        ttl = float(reply.info.get("pin_lease_ttl_s", PIN_LEASE_TTL_S))
        self._leases = LeaseKeeper(lambda ids: self._client.call(op="renew", pin_ids=ids),
                                   ttl / PIN_RENEWALS_PER_TTL)

    # --- Backend ------------------------------------------------------------------------------
    def chat_format(self) -> ChatFormat:
        return self._chat

    def generate(self, text: str, params: dict[str, Any], constraint: tuple[str, Any] | None,
                 on_piece: PieceCallback | None, priority: int = 0) -> GenResult:
        if constraint is not None:  # the runtime compiles it; a broken pattern is refused
            kind, pattern = constraint
            params = {**params, kind: list(pattern) if kind == "choices" else pattern}
        forward = None if on_piece is None else (lambda reply: on_piece(reply.text))
        reply = self._client.call(forward, op="generate", text=text, params=params,
                                  stream=on_piece is not None, priority=priority)
        return GenResult(reply.text, reply.finish_reason, reply.prompt_tokens,
                         reply.cached_tokens, len(reply.token_ids))

    def score(self, text: str, choices: list[str], unconditional: bool,
              priority: int = 0) -> list[ChoiceLogprobs]:
        reply = self._client.call(op="score", text=text, choices=choices,
                                  unconditional=unconditional, priority=priority)
        return [ChoiceLogprobs(list(c.logprobs), list(c.unconditional_logprobs))
                for c in reply.choices]

    def pin(self, text: str) -> int | None:
        if not self._cache_on:  # nothing to keep: computing the prefix first would be waste
            return None
        reply = self._client.call(op="generate", text=text, params=_PREFILL_ONLY, pin=True)
        if reply.pin_id < 0:
            if reply.pin_error:  # the pin budget: the program runs on, its forks uncached
                warnings.warn(f"radixrt: {reply.pin_error}", RuntimeWarning, stacklevel=2)
            return None
        self._leases.hold(reply.pin_id)  # renewed in the background until unpinned
        return reply.pin_id

    def unpin(self, handle: Any) -> None:
        self._leases.drop(int(handle))
        self._client.call(op="unpin", pin_id=int(handle))

    def info(self) -> dict[str, Any]:
        """The runtime's server_info: cache_hit_rate, cached_tokens, kv counters, ..."""
        return dict(self._client.call(op="info").info)

    # --- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        self._leases.stop()
        self._client.close()

    def __enter__(self) -> RuntimeEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
