"""The registry of recent requests' token sequences (/concate_and_append_request's ids): bounded in
entries, tokens and age, LRU, and namespaced."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from radixrt.runtime.server.native.sequence_registry import SequenceRegistry

NS = ("tenant", None)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_put_get_and_namespaces() -> None:
    reg = SequenceRegistry()
    reg.put(NS, "a", [1, 2, 3])
    assert reg.get(NS, "a") == [1, 2, 3]
    assert reg.get(("other", None), "a") is None and reg.get(("tenant", "salt"), "a") is None
    reg.put(NS, "a", [4])  # replaced, and counted once
    assert reg.get(NS, "a") == [4] and reg.tokens == 1 and len(reg) == 1


def test_least_recently_used_goes_first_and_age_expires() -> None:
    clock = Clock()
    reg = SequenceRegistry(max_sequences=2, ttl_s=10.0, clock=clock)
    reg.put(NS, "a", [1])
    reg.put(NS, "b", [2])
    assert reg.get(NS, "a") == [1]  # a is now the most recent
    reg.put(NS, "c", [3])
    assert reg.get(NS, "b") is None and reg.get(NS, "a") == [1]
    clock.now = 11.0
    assert reg.get(NS, "a") is None and reg.tokens == 1  # c remains, unread


def test_a_sequence_longer_than_the_budget_is_not_kept() -> None:
    reg = SequenceRegistry(max_tokens=4)
    reg.put(NS, "a", [1, 2])
    reg.put(NS, "big", list(range(5)))
    assert reg.get(NS, "big") is None and reg.get(NS, "a") == [1, 2]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.lists(st.integers(0, 2**31 - 1),
                                                               max_size=9)), max_size=40),
       st.integers(1, 4), st.integers(1, 20))
def test_bounds_hold_and_the_count_is_exact(puts: list[tuple[str, list[int]]], max_sequences: int,
                                            max_tokens: int) -> None:
    reg = SequenceRegistry(max_sequences=max_sequences, max_tokens=max_tokens)
    last: dict[str, list[int]] = {}
    for rid, ids in puts:
        reg.put(NS, rid, ids)
        last[rid] = ids
        assert len(reg) <= max_sequences and reg.tokens <= max_tokens
    kept = {rid: reg.get(NS, rid) for rid in last}
    assert sum(len(v) for v in kept.values() if v is not None) == reg.tokens
    assert all(v is None or v == last[rid] for rid, v in kept.items())
