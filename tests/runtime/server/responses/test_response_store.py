"""The stored responses' bookkeeping: tenants never see each other's, the bounds (count and
bytes) evict the least recently used, entries expire, and the byte count stays exact under any
sequence of puts, gets and deletes.
(Pins: tests/runtime/server/responses/test_responses_serving.py.)"""

from __future__ import annotations

import asyncio
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from radixrt.runtime.server.openai.openai_protocol import ChatMessage
from radixrt.runtime.server.responses.response_store import ResponseStore


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def put(store: ResponseStore, tenant: str, rid: str, text: str = "x") -> bool:
    return asyncio.run(store.put(tenant, rid, {"id": rid, "text": text},
                                 [ChatMessage(role="user", content=text)], None)) is not None


def test_a_tenant_sees_only_its_own_responses() -> None:
    store = ResponseStore(None)
    assert put(store, "alice", "resp_1")
    assert store.get("alice", "resp_1").response["id"] == "resp_1"
    assert store.get("bob", "resp_1") is None
    assert not asyncio.run(store.delete("bob", "resp_1"))
    assert store.get("alice", "resp_1") is not None
    assert asyncio.run(store.delete("alice", "resp_1"))
    assert store.get("alice", "resp_1") is None and store.bytes == 0


def test_the_least_recently_used_goes_first() -> None:
    store = ResponseStore(None, max_items=2)
    put(store, "", "a")
    put(store, "", "b")
    store.get("", "a")  # a is now the more recently used
    put(store, "", "c")
    assert store.get("", "b") is None and store.get("", "a") is not None
    assert store.evicted_total == 1


def test_the_byte_bound_evicts_and_refuses_what_alone_is_too_large() -> None:
    one = len(json.dumps({"id": "a", "text": "x" * 100})) + \
        len(ChatMessage(role="user", content="x" * 100).model_dump_json())
    store = ResponseStore(None, max_bytes=2 * one + 10)
    for rid in "abc":
        assert put(store, "", rid, "x" * 100)
    assert len(store) == 2 and store.get("", "a") is None and store.bytes == 2 * one
    assert not put(store, "", "big", "x" * (3 * one))
    assert store.get("", "big") is None and len(store) == 2


def test_an_entry_expires_after_the_ttl() -> None:
    clock = Clock()
    store = ResponseStore(None, ttl_s=10.0, clock=clock)
    put(store, "", "a")
    clock.now = 9.0
    assert store.get("", "a") is not None
    clock.now = 10.5
    assert store.get("", "a") is None and store.bytes == 0


ops = st.lists(st.tuples(st.sampled_from(["put", "get", "delete"]), st.sampled_from("ab"),
                         st.sampled_from(["r1", "r2", "r3", "r4"]), st.integers(0, 300)),
               max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_the_bounds_and_the_byte_count_hold_under_any_sequence(steps: list) -> None:
    store = ResponseStore(None, max_items=3, max_bytes=900)
    for op, tenant, rid, size in steps:
        if op == "put":
            put(store, tenant, rid, "y" * size)
        elif op == "get":
            store.get(tenant, rid)
        else:
            asyncio.run(store.delete(tenant, rid))
        entries = [store.get(t, r) for t in "ab" for r in ("r1", "r2", "r3", "r4")]
        held = [e for e in entries if e is not None]
        assert len(held) == len(store) <= 3
        assert store.bytes == sum(e.size for e in held) <= 900


def test_at_most_max_pins_stored_conversations_keep_a_pin() -> None:
    """Past max_pins, the least recently used response's pin goes (the response stays)."""
    store = ResponseStore(None, max_pins=2)
    for rid, pin in (("a", 1), ("b", 2), ("c", 3)):
        asyncio.run(store.put("", rid, {"id": rid}, [ChatMessage(role="user", content=rid)],
                              pin))
    assert [store.get("", r).pin_id for r in "abc"] == [None, 2, 3]
