"""Pin leases (radixrt/runtime/tokenizer/pin_leases.py) on a hand-driven clock."""

from __future__ import annotations

import pytest

from radixrt.runtime.tokenizer.pin_leases import PinLeases


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_lease_runs_out_one_ttl_after_its_grant_or_last_renewal() -> None:
    clock = Clock()
    leases = PinLeases(10.0, clock)
    leases.grant(1)
    leases.grant(2)
    clock.now += 9
    assert leases.take_expired() == []
    assert leases.renew([1]) == []  # 1 now runs to 119; 2 still to 110
    clock.now += 1
    assert leases.take_expired() == [2] and len(leases) == 1
    clock.now += 8
    assert leases.take_expired() == []
    clock.now += 1
    assert leases.take_expired() == [1] and len(leases) == 0


def test_renewing_or_releasing_an_expired_pin_reports_it_lost() -> None:
    clock = Clock()
    leases = PinLeases(1.0, clock)
    leases.grant(5)
    clock.now += 2
    assert leases.take_expired() == [5]
    assert leases.renew([5, 6]) == [5, 6]  # gone, and never granted
    assert leases.release(5) is False  # already released by the sweep: do not unpin twice
    leases.grant(7)
    assert leases.release(7) is True and leases.take_expired() == [] and len(leases) == 0


@pytest.mark.parametrize("ttl", [0, -1.0, float("nan")])
def test_the_ttl_must_be_positive(ttl: float) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        PinLeases(ttl)
