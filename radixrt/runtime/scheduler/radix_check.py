"""The radix tree's integrity proof: one walk that verifies its structure, its tiers, its lock
counts, its page counters and each tier's LRU list against the tree's own incremental state.
RadixCache.check() hands its state here; nothing is changed."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from sortedcontainers import SortedKeyList

from radixrt.runtime.messages import DEVICE_TIER
from radixrt.runtime.scheduler.radix_node import RadixNode, lru_key


def _walk(roots: dict[str | None, RadixNode]) -> Iterator[RadixNode]:
    stack = [child for root in roots.values() for child in root.children.values()]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def _check_roots(roots: dict[str | None, RadixNode]) -> None:
    for extra_key, root in roots.items():
        bad = root.parent is not None or root.key or root.pages or root.lock_count
        if bad or root.removed or root.extra_key != extra_key or root.tier != DEVICE_TIER:
            raise RuntimeError(f"radix check: bad root of namespace {extra_key!r}: {root!r}")
        if not root.children:
            raise RuntimeError(f"radix check: empty root of namespace {extra_key!r} kept")


def _check_node(node: RadixNode, page_size: int) -> None:
    p = page_size
    where = f"radix check: node {node!r}"
    if node.removed:
        raise RuntimeError(f"{where} is marked removed but still in the tree")
    if not node.key or len(node.key) % p or len(node.pages) != len(node.key) // p:
        raise RuntimeError(f"{where}: key of {len(node.key)} tokens, page_size {p}")
    parent = node.parent
    if parent is None or parent.children.get(node.key[:p]) is not node:
        raise RuntimeError(f"{where} is not its parent's child under its first page")
    if node.tier < parent.tier:
        raise RuntimeError(f"{where} is in a higher tier than its parent ({parent.tier})")
    if node.lock_count and node.tier != DEVICE_TIER:
        raise RuntimeError(f"{where} is locked outside the device")
    child_locks = same_tier = 0
    for first_page, child in node.children.items():
        if child.parent is not node or child.key[:p] != first_page:
            raise RuntimeError(f"{where}: child {child!r} is filed wrongly")
        child_locks += child.lock_count
        same_tier += child.tier == node.tier
    if node.own_locks < 0 or node.lock_count != node.own_locks + child_locks:
        raise RuntimeError(
            f"{where}: lock_count {node.lock_count} != own {node.own_locks} "
            f"+ children {child_locks}"
        )
    if node.tier_children != same_tier:
        raise RuntimeError(f"{where}: tier_children {node.tier_children} != {same_tier}")


def check_tree(
    page_size: int,
    roots: dict[str | None, RadixNode],
    leaves: Sequence[SortedKeyList],
    listed: Callable[[RadixNode], bool],
    counters: tuple[int, int, Sequence[int]],
) -> None:
    """Raise RuntimeError on the first fault. `leaves`: each tier's LRU list; `listed(node)`:
    whether a node belongs in its list; `counters`: (device evictable pages, device locked pages,
    each tier's pages), as the tree keeps them."""
    _check_roots(roots)
    evictable = locked = 0
    lower = [0] * len(leaves)
    seen_pages: list[set[int]] = [set() for _ in leaves]
    expected: list[set[int]] = [set() for _ in leaves]
    for node in _walk(roots):
        _check_node(node, page_size)
        seen = seen_pages[node.tier]
        for page in node.pages:
            if page in seen:
                raise RuntimeError(f"radix check: {node!r}: page {page} is owned twice")
            seen.add(page)
        if node.tier != DEVICE_TIER:
            lower[node.tier] += len(node.pages)
        elif node.lock_count:
            locked += len(node.pages)
        else:
            evictable += len(node.pages)
        if listed(node):
            expected[node.tier].add(id(node))
    kept_evictable, kept_locked, kept_lower = counters
    if (evictable, locked) != (kept_evictable, kept_locked):
        raise RuntimeError(
            f"radix check: counted evictable/locked pages {evictable}/{locked}, "
            f"counters say {kept_evictable}/{kept_locked}"
        )
    if lower[1:] != list(kept_lower[1:]):
        raise RuntimeError(f"radix check: lower tiers hold {lower[1:]} pages, "
                           f"counters say {list(kept_lower[1:])}")
    for tier, tier_leaves in enumerate(leaves):
        ids = [id(node) for node in tier_leaves]
        if len(ids) != len(set(ids)) or set(ids) != expected[tier]:
            raise RuntimeError(
                f"radix check: tier {tier}'s LRU list ({len(ids)} entries) != its "
                f"{len(expected[tier])} tier leaves"
            )
        keys = [lru_key(node) for node in tier_leaves]
        if keys != sorted(keys):
            raise RuntimeError(f"radix check: tier {tier}'s LRU list is out of LRU order")
