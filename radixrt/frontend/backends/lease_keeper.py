"""The client side of pin leases: the runtime releases a pinned prefix (a fork's) that its client
stops renewing, so a live program renews every pin it holds in the background, a few times per
lease; a program that dies stops renewing and its pins go with it."""

from __future__ import annotations

import threading
from collections.abc import Callable


class LeaseKeeper:
    def __init__(self, renew: Callable[[list[int]], object], interval_s: float) -> None:
        """renew(pin_ids): one call to the runtime; interval_s: how often it is made."""
        self._renew = renew
        self._interval_s = interval_s
        self._pins: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="radixrt-leases")
        self._thread.start()

    def hold(self, pin_id: int) -> None:
        with self._lock:
            self._pins.add(pin_id)

    def drop(self, pin_id: int) -> None:
        with self._lock:
            self._pins.discard(pin_id)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._interval_s + 5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            with self._lock:
                pins = sorted(self._pins)
            if not pins:
                continue
            try:
                self._renew(pins)
            except Exception:  # the runtime is gone: the program's next call says so
                continue
