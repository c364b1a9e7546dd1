"""Pins as leases. A pinned prefix (a DSL fork's, a run_batch's traced prefix) stays locked in
the radix tree only while its client keeps renewing it: each pin is granted for `ttl_s` seconds,
every renewal extends it by as much, and a pin whose lease runs out is released by the server as
if its client had unpinned it. A client that dies or goes silent so loses its pins within one
TTL; a live one renews in the background and keeps them as long as it needs.

Pure bookkeeping over an injectable clock; the DSL endpoint grants, renews and sweeps."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable


class PinLeases:
    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not ttl_s > 0:
            raise ValueError(f"pin lease ttl={ttl_s!r} is invalid: must be > 0 seconds")
        self.ttl_s = ttl_s
        self._clock = clock
        self._expires: dict[int, float] = {}  # pin id -> when its lease runs out

    def __len__(self) -> int:
        return len(self._expires)

    def grant(self, pin_id: int) -> None:
        self._expires[pin_id] = self._clock() + self.ttl_s

    def renew(self, pin_ids: Iterable[int]) -> list[int]:
        """Extend the leases of these pins; returns those that were unknown (expired or never
        granted: their client has lost them)."""
        now, lost = self._clock(), []
        for pin_id in pin_ids:
            if pin_id in self._expires:
                self._expires[pin_id] = now + self.ttl_s
            else:
                lost.append(pin_id)
        return lost

    def release(self, pin_id: int) -> bool:
        """The client unpinned it; False when its lease had already run out."""
        return self._expires.pop(pin_id, None) is not None

    def take_expired(self) -> list[int]:
        """The pins whose lease ran out (they are forgotten here; the caller unpins them)."""
        now = self._clock()
        gone = [pin_id for pin_id, expires in self._expires.items() if expires <= now]
        for pin_id in gone:
            del self._expires[pin_id]
        return gone
