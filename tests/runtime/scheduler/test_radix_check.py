"""The radix tree's integrity proof finds each kind of corruption, tiers included: counters, lock
counts, LRU lists, a node in a higher tier than its parent, a locked node outside the device, a
wrong same-tier child count, a lower tier's page counter."""

from __future__ import annotations

import pytest

from radixrt.runtime.messages import DEVICE_TIER, HOST_TIER
from radixrt.runtime.scheduler.radix_cache import RadixCache


def test_check_detects_corruption() -> None:
    tree = RadixCache(1)
    node = tree.insert([1, 2], [10, 11]).node
    tree.check()
    tree._evictable_pages += 1
    with pytest.raises(RuntimeError, match="counters"):
        tree.check()
    tree._evictable_pages -= 1
    node.lock_count = 1
    with pytest.raises(RuntimeError, match="lock_count"):
        tree.check()
    node.lock_count = 0
    tree._leaves[DEVICE_TIER].remove(node)
    with pytest.raises(RuntimeError, match="LRU list"):
        tree.check()


def tiered() -> tuple[RadixCache, object, object]:
    """[1, 2] on the device with [3, 4] below it on the host."""
    tree = RadixCache(1)
    upper = tree.insert([1, 2], [10, 11]).node
    lower = tree.insert([1, 2, 3, 4], [10, 11, 12, 13]).node
    assert tree.demote(lower, HOST_TIER, [0, 1]) == [12, 13]
    tree.check()
    return tree, upper, lower


def test_check_detects_tier_faults() -> None:
    tree, upper, lower = tiered()
    upper.tier = HOST_TIER  # a host node above ... and its page counted nowhere
    with pytest.raises(RuntimeError):
        tree.check()
    upper.tier = DEVICE_TIER
    lower.tier = DEVICE_TIER
    with pytest.raises(RuntimeError):
        tree.check()
    lower.tier = HOST_TIER
    lower.lock_count = lower.own_locks = 1
    upper.lock_count = 1
    with pytest.raises(RuntimeError, match="locked outside the device"):
        tree.check()
    lower.lock_count = lower.own_locks = upper.lock_count = 0
    lower.tier_children = 1
    with pytest.raises(RuntimeError, match="tier_children"):
        tree.check()
    lower.tier_children = 0
    tree._lower_pages[HOST_TIER] += 1
    with pytest.raises(RuntimeError, match="lower tiers"):
        tree.check()
    tree._lower_pages[HOST_TIER] -= 1
    tree.check()


def test_a_page_owned_twice_in_one_tier_is_found() -> None:
    tree, _, lower = tiered()
    lower.pages = [0, 0]
    with pytest.raises(RuntimeError, match="owned twice"):
        tree.check()
