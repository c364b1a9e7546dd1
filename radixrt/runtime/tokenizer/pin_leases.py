"""Pins as leases. A pinned prefix (a DSL fork's, a run_batch's traced prefix, an HTTP
`/generate` with `pin: true`) stays locked in the radix tree only while its client keeps renewing
it: each pin is granted for `ttl_s` seconds, every renewal extends it by as much, and a pin whose
lease runs out is released by the server as if its client had unpinned it. A client that dies or
goes silent so loses its pins within one TTL; a live one renews in the background and keeps them
as long as it needs.

`PinLeases` is pure bookkeeping over an injectable clock; `PinService` puts it to work for the
DSL endpoint and the HTTP server alike (one per tokenizer process, so a pin is the same lease
whichever way it was asked for)"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence

from radixrt.runtime.config import MAX_PINS_PER_RENEWAL, PIN_LEASE_TTL_S, PIN_RENEWALS_PER_TTL
from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager

log = logging.getLogger("radixrt.pins")


class PinLeases:
    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not ttl_s > 0:
            raise ValueError(f"pin lease ttl={ttl_s!r} is invalid: must be > 0 seconds")
        self.ttl_s = ttl_s
        self._clock = clock
        self._expires: dict[int, float] = {}  # pin id -> when its lease runs out

    def __len__(self) -> int:
        return len(self._expires)

    def grant(self, pin_id: int, ttl_s: float | None = None) -> None:
        """ttl_s: this lease's length (default: the renewal TTL)."""
        self._expires[pin_id] = self._clock() + (self.ttl_s if ttl_s is None else ttl_s)

    def __contains__(self, pin_id: int) -> bool:
        return pin_id in self._expires

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


class PinService:
    """The pins of one tokenizer process, whoever asked for them (DSL clients, HTTP clients):
    grants a lease on each pin the runtime made, renews, releases, and sweeps the leases that
    ran out (unpinning them through the manager). The sweep task starts with the first grant,
    inside the event loop that serves the clients."""

    def __init__(self, manager: TokenizerManager, ttl_s: float = PIN_LEASE_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.manager = manager
        self.leases = PinLeases(ttl_s, clock)
        self.expired_total = 0  # leases that ran out (their clients stopped renewing)
        self._sweeper: asyncio.Task | None = None
        manager.on_pinned(self.grant)  # every pin is under a lease from the moment it is known

    @property
    def ttl_s(self) -> float:
        return self.leases.ttl_s

    def __len__(self) -> int:
        return len(self.leases)

    def info(self) -> dict[str, float | int]:
        """For server_info: the lease length (clients renew more often), leases held, expired."""
        return {"pin_lease_ttl_s": self.ttl_s, "pin_leases": len(self.leases),
                "pin_leases_expired": self.expired_total}

    def grant(self, pin_id: int) -> None:
        self.leases.grant(pin_id)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def hold(self, pin_id: int, ttl_s: float) -> bool:
        """The server itself keeps this pin for `ttl_s` seconds from now (a stored response's
        conversation, say) instead of a client renewing it; False when it is gone already."""
        if pin_id not in self.leases:
            return False
        self.leases.grant(pin_id, ttl_s)
        return True

    def renew(self, pin_ids: Sequence[int]) -> list[int]:
        """Extend these leases; returns the pins that are gone (expired or never granted)."""
        if len(pin_ids) > MAX_PINS_PER_RENEWAL:
            raise ValueError(f"renew at most {MAX_PINS_PER_RENEWAL} pins per call "
                             f"(got {len(pin_ids)})")
        return self.leases.renew(pin_ids)

    async def release(self, pin_id: int) -> bool:
        """The client unpins; False when the pin was unknown (its lease ran out already, or
        it was never granted): nothing is unpinned twice."""
        if not self.leases.release(pin_id):
            return False
        await self.manager.unpin(pin_id)
        return True

    async def sweep_once(self) -> list[int]:
        """Unpin every pin whose lease ran out; returns them."""
        gone = self.leases.take_expired()
        for pin_id in gone:
            log.warning("pin %d: its lease expired (the client stopped renewing); released",
                        pin_id)
            await self.manager.unpin(pin_id)
        self.expired_total += len(gone)
        return gone

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / PIN_RENEWALS_PER_TTL)
            await self.sweep_once()

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
