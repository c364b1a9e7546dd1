"""The radix tree's parts: a node (one edge of token ids and the KV pages that hold them), the
typed results of a match and of an insert, and the listener protocol that hears of every change to
the tree's tokens (radix_cache.py has the tree and its contract)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from radixrt.runtime.messages import DEVICE_TIER

Key = tuple[int, ...]


class RadixNode:
    """One edge of the tree: a run of tokens (whole pages) and the KV pages that hold them.

    ``lock_count`` counts the locks on this node and on every node below it; ``own_locks`` counts
    only the locks taken on this node, so ``lock_count == own_locks + sum(children's lock_count)``.
    """

    __slots__ = (
        "key",
        "pages",
        "parent",
        "children",
        "lock_count",
        "own_locks",
        "last_access",
        "tick",
        "removed",
        "extra_key",
        "tier",
        "tier_children",
        "hits",
    )

    def __init__(
        self, key: Key, pages: list[int], parent: RadixNode | None, extra_key: str | None = None,
        tier: int = DEVICE_TIER,
    ) -> None:
        self.extra_key = extra_key if parent is None else parent.extra_key  # namespace
        self.tier = tier  # where `pages` live (a root is on the device)
        self.tier_children = 0  # children in this node's own tier
        self.key = key
        self.pages = pages
        self.parent = parent
        self.children: dict[Key, RadixNode] = {}
        self.lock_count = 0
        self.own_locks = 0
        self.last_access = 0.0
        self.tick = 0  # tie-break of last_access: later accesses get larger ticks
        self.removed = False  # set when evicted or dropped by reset
        self.hits = 0  # requests that took a cached prefix through this node (record_hit)

    @property
    def is_root(self) -> bool:
        return self.parent is None and not self.removed

    def record_hit(self) -> None:
        """Count a request taking the cached prefix that ends here (for the tree's live view):
        one hit on this node and on each node above it."""
        walk: RadixNode | None = self
        while walk is not None and walk.parent is not None:
            walk.hits += 1
            walk = walk.parent

    def __repr__(self) -> str:
        return (
            f"RadixNode(tokens={len(self.key)}, pages={len(self.pages)}, tier={self.tier}, "
            f"children={len(self.children)}, lock_count={self.lock_count})"
        )


@dataclass(frozen=True, slots=True)
class MatchResult:
    """``node`` covers exactly the matched prefix (``length`` tokens); its first
    ``device_length`` tokens are on the device, in ``pages``, the rest in lower tiers."""

    node: RadixNode
    pages: list[int]
    length: int
    device_length: int = -1  # -1: all of it (set in __post_init__)

    def __post_init__(self) -> None:
        if self.device_length < 0:
            object.__setattr__(self, "device_length", self.length)


@dataclass(frozen=True, slots=True)
class InsertResult:
    """``node`` covers the whole inserted key. The tree took ownership of ``new_pages``; for the
    first ``existing_len`` tokens it kept the pages it already had and ignored the passed ones.
    Inserting device pages over nodes of a lower tier takes the device pages in their place (they
    count in ``new_pages``); the lower tiers' pages they replace are ``released``, (tier, pages)
    for the caller to free."""

    node: RadixNode
    new_pages: list[int]
    existing_len: int
    released: list[tuple[int, list[int]]] = field(default_factory=list)


class TreeListener(Protocol):
    def added(self, leaf: RadixNode) -> None:
        """A new leaf (its parent already linked): its key's tokens entered the tree."""

    def split(self, upper: RadixNode, lower: RadixNode) -> None:
        """``lower`` (the same node object as before) lost the head of its key to ``upper``."""

    def removed(self, leaf: RadixNode) -> None:
        """An evicted leaf (still linked to its parent while this is called)."""

    def cleared(self) -> None:
        """Every node was dropped (reset)."""


def lru_key(node: RadixNode) -> tuple[float, int]:
    return (node.last_access, node.tick)
