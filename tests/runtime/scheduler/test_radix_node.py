"""The radix tree's parts: a node takes its namespace from its parent and its tier from what it
is given (a root is on the device); a match result's device part defaults to all of it; an
insert result's released pages default to none."""

from __future__ import annotations

from radixrt.runtime.messages import DEVICE_TIER, DISK_TIER
from radixrt.runtime.scheduler.radix_cache import RadixCache
from radixrt.runtime.scheduler.radix_node import MatchResult, RadixNode


def test_nodes_take_their_namespace_from_the_parent() -> None:
    root = RadixNode((), [], None, "salt")
    child = RadixNode((1,), [5], root, "ignored", tier=DISK_TIER)
    assert (root.tier, root.extra_key, root.is_root) == (DEVICE_TIER, "salt", True)
    assert (child.tier, child.extra_key, child.is_root) == (DISK_TIER, "salt", False)
    assert "tier=2" in repr(child)


def test_result_defaults() -> None:
    node = RadixNode((), [], None)
    assert MatchResult(node, [1, 2], 2).device_length == 2
    assert MatchResult(node, [1], 4, 1).device_length == 1
    tree = RadixCache(1)
    result = tree.insert([1, 2], [7, 8])
    assert (result.new_pages, result.existing_len, result.released) == ([7, 8], 0, [])
    # device pages inserted over a lower tier's node take its place; its pages are released
    tree.demote(result.node, DISK_TIER, [3, 4])
    again = tree.insert([1, 2, 3], [9, 10, 11])
    assert again.released == [(DISK_TIER, [3, 4])] and again.new_pages == [9, 10, 11]
    assert again.existing_len == 0
    tree.check()
