"""RadixCache: a radix tree over token-id sequences whose values are KV pages.

Pure mechanism (match, insert, lock, unlock, evict, check); it knows nothing of requests. Keys are
compared and split only at page boundaries, so every node's key is a whole number of pages and the
node holds exactly ``len(key) // page_size`` pages. The tree holds one reference on each page it
owns: the caller increfs ``InsertResult.new_pages`` and decrefs what ``evict``/``reset`` return.

Each ``extra_key`` (None included) is a separate namespace with its own root; keys in different
namespaces never share nodes. Locks are taken on a node and count on it and all its ancestors, so a
locked node's whole path stays cached. Unlocked leaves wait in an LRU-ordered sorted list, which is
what ``evict`` consumes; page counters are kept incrementally, never by walking the tree.

A ``TreeListener`` (the speculative decoder's draft index, draft_index.py) hears of every change
to the tree's token content and shape as it happens: a leaf added, a node split in two, a leaf
removed, everything dropped. Tokens enter the tree only as new leaves and leave it only as
evicted leaves, so an index kept by these four events is exact without ever walking the tree.

Tiers (docs/architecture.md, "KV tiers"): a node's pages live in one tier, the device pool
(``DEVICE_TIER``) or a lower one (host memory, disk); ``node.pages`` are page ids of that tier's
pool. Down every path the tier never rises (a node's children are in its tier or lower), only
device nodes are locked, and each tier keeps its own LRU list of its *tier leaves* (nodes with no
child in their own tier; on the device, unlocked ones only). ``demote`` moves a tier leaf one way
down, ``promote`` brings a lower node under a device parent back, ``drop`` removes a node with
everything below it; the caller moves the data and owns the page ids of every tier.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from sortedcontainers import SortedKeyList

from radixrt.runtime.messages import DEVICE_TIER, NUM_TIERS
from radixrt.runtime.scheduler.radix_check import check_tree
from radixrt.runtime.scheduler.radix_node import (
    InsertResult,
    Key,
    MatchResult,
    RadixNode,
    TreeListener,
    lru_key,
)

__all__ = ["InsertResult", "MatchResult", "RadixCache", "RadixNode", "TreeListener"]

class RadixCache:
    """Radix tree of token ids -> KV pages with path locking and LRU eviction of unlocked leaves."""

    def __init__(self, page_size: int, clock: Callable[[], float] = time.monotonic,
                 listener: TreeListener | None = None) -> None:
        if page_size < 1:
            raise ValueError(f"RadixCache page_size={page_size!r} is invalid: must be >= 1")
        self.page_size = page_size
        self._clock = clock
        self._tick = 0
        self._roots: dict[str | None, RadixNode] = {}
        # Each tier's tier leaves (device: unlocked ones), least recently used first. A node's
        # LRU key is only changed while the node is out of its list.
        self._leaves: list[SortedKeyList] = [SortedKeyList(key=lru_key)
                                             for _ in range(NUM_TIERS)]
        self._evictable_pages = 0
        self._locked_pages = 0
        self._lower_pages = [0] * NUM_TIERS  # pages of each lower tier (index 0 unused)
        self.listener = listener

    # --- counters ---------------------------------------------------------------------------

    @property
    def evictable_pages(self) -> int:
        """Device pages of unlocked nodes (they can leave the device: evicted or demoted)."""
        return self._evictable_pages

    @property
    def locked_pages(self) -> int:
        """Pages of nodes with a lock count > 0."""
        return self._locked_pages

    @property
    def total_pages(self) -> int:
        """Every device page the tree owns."""
        return self._evictable_pages + self._locked_pages

    def tier_pages(self, tier: int) -> int:
        """Pages the tree holds in ``tier``."""
        return self.total_pages if tier == DEVICE_TIER else self._lower_pages[tier]

    # --- lookup and insertion ---------------------------------------------------------------

    def root(self, extra_key: str | None = None) -> RadixNode:
        """The root of ``extra_key``'s namespace (a detached empty root if nothing is cached)."""
        root = self._roots.get(extra_key)
        return root if root is not None else RadixNode((), [], None, extra_key)

    def match_prefix(self, key: Sequence[int], extra_key: str | None = None) -> MatchResult:
        """Longest cached prefix of ``key`` in whole pages, in any tier; does not lock.

        Splits a node so that the returned node ends exactly where the match ends, and marks the
        matched path as just used.
        """
        p = self.page_size
        key = tuple(key[: len(key) // p * p])
        node = self._roots.get(extra_key)
        if node is None:
            return MatchResult(RadixNode((), [], None, extra_key), [], 0)
        now = self._clock()
        pages: list[int] = []
        pos = 0
        device_len = 0
        while pos < len(key):
            child = node.children.get(key[pos : pos + p])
            if child is None:
                break
            n = self._common_len(child.key, key, pos)
            partial = n < len(child.key)
            if partial:
                child = self._split(child, n)
            self._touch(child, now)
            if child.tier == DEVICE_TIER:
                pages.extend(child.pages)
                device_len = pos + n
            pos += n
            node = child
            if partial:
                break
        return MatchResult(node, pages, pos, device_len)

    def insert(
        self, key: Sequence[int], pages: Sequence[int], extra_key: str | None = None,
        tier: int = DEVICE_TIER,
    ) -> InsertResult:
        """Cache ``key`` -> ``pages`` (one page per ``page_size`` tokens, in ``tier``).

        The part of ``key`` already cached keeps the tree's pages (device pages replace a lower
        tier's: ``InsertResult.released``); the rest becomes a new leaf that owns the matching
        tail of ``pages`` (returned as ``new_pages``; the caller increfs them). Pages of a lower
        tier go only where the path above them is in a tier no lower (a warm restart's
        index).
        """
        p = self.page_size
        if len(key) % p:
            raise ValueError(f"insert: key length {len(key)} is not a multiple of page_size {p}")
        if len(pages) != len(key) // p:
            raise ValueError(
                f"insert: {len(pages)} pages given for {len(key)} tokens; need {len(key) // p}"
            )
        if not key:
            return InsertResult(self.root(extra_key), [], 0)
        key = tuple(key)
        node = self._roots.get(extra_key)
        if node is None:  # created with its first leaf; dropped by evict when it empties again
            node = self._roots[extra_key] = RadixNode((), [], None, extra_key)
        now = self._clock()
        pos = 0
        existing_len = 0
        taken: list[int] = []
        released: list[tuple[int, list[int]]] = []
        while pos < len(key):
            child = node.children.get(key[pos : pos + p])
            if child is None:
                break
            n = self._common_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            self._touch(child, now)
            if child.tier > tier:  # ours are in a higher tier: they take its place
                own = list(pages[pos // p : (pos + n) // p])
                released.append((child.tier, self._retier(child, tier, own)))
                taken.extend(own)
            elif child.tier == tier:
                existing_len = pos + n
            pos += n
            node = child
        if node.tier > tier:
            raise ValueError(f"insert: pages of tier {tier} under a node of tier {node.tier}")
        if pos < len(key):
            own = list(pages[pos // p :])
            taken.extend(own)
            node = self._add_leaf(node, key[pos:], own, now, tier)
        return InsertResult(node, taken, existing_len, released)

    # --- locking ----------------------------------------------------------------------------

    def lock(self, node: RadixNode) -> None:
        """Protect ``node`` and its ancestors from eviction. A no-op on a root."""
        if node.removed:
            raise RuntimeError(f"lock of a node that is no longer in the tree: {node!r}")
        if node.parent is None:
            return
        if node.tier != DEVICE_TIER:
            raise RuntimeError(f"lock of a node whose pages are not on the device: {node!r}")
        node.own_locks += 1
        walk: RadixNode | None = node
        while walk is not None and walk.parent is not None:
            if walk.lock_count == 0:
                if not walk.tier_children:
                    self._leaves[DEVICE_TIER].remove(walk)
                self._evictable_pages -= len(walk.pages)
                self._locked_pages += len(walk.pages)
            walk.lock_count += 1
            walk = walk.parent

    def unlock(self, node: RadixNode) -> None:
        """Undo one ``lock(node)``. A no-op on a root; RuntimeError if ``node`` holds no lock."""
        if node.parent is None and not node.removed:
            return
        if node.own_locks <= 0 or node.removed:
            raise RuntimeError(
                f"unlock underflow: {node!r} has no lock taken on it (own_locks={node.own_locks})"
            )
        node.own_locks -= 1
        walk: RadixNode | None = node
        while walk is not None and walk.parent is not None:
            walk.lock_count -= 1
            if walk.lock_count == 0:
                self._locked_pages -= len(walk.pages)
                self._evictable_pages += len(walk.pages)
                if not walk.tier_children:
                    self._leaves[DEVICE_TIER].add(walk)
            walk = walk.parent

    # --- eviction and tiers -----------------------------------------------------------------

    def evict(self, num_pages: int) -> list[int]:
        """Remove unlocked device leaves, least recently used first, until at least
        ``num_pages`` pages are released or nothing is evictable. Returns the pages (the caller
        decrefs them). A tree with lower tiers moves pages with ``demote`` and ``drop`` instead:
        a device leaf with lower-tier children is refused here."""
        released: list[int] = []
        leaves = self._leaves[DEVICE_TIER]
        while len(released) < num_pages and leaves:
            leaf = leaves[0]
            if leaf.children:
                raise RuntimeError(f"evict of {leaf!r}: lower-tier nodes below it (use drop)")
            released.extend(leaf.pages)
            self._remove_leaf(leaf)
        return released

    def lru_leaf(self, tier: int) -> RadixNode | None:
        """The least recently used tier leaf of ``tier`` (device: unlocked), if any."""
        leaves = self._leaves[tier]
        return leaves[0] if leaves else None

    def lru_leaves(self, tier: int) -> Iterator[RadixNode]:
        """The tier leaves of ``tier``, least recently used first (do not change the tree while
        iterating)."""
        return iter(self._leaves[tier])

    def demote(self, node: RadixNode, tier: int, pages: list[int]) -> list[int]:
        """Move a tier leaf's KV to a lower ``tier``, now in ``pages`` (the caller copied it);
        returns the pages it leaves (the caller frees them). Its children must be in ``tier``
        or lower."""
        old = node.tier
        if (node.parent is None or tier <= old or not self._listed(node)
                or any(c.tier < tier for c in node.children.values())):
            raise RuntimeError(f"demote of {node!r} to tier {tier}: not a tier leaf above it")
        if len(pages) != len(node.pages):
            raise ValueError(f"demote: {len(pages)} pages for a node of {len(node.pages)}")
        return self._retier(node, tier, pages)

    def promote(self, node: RadixNode, pages: list[int], tier: int = DEVICE_TIER) -> list[int]:
        """Bring a lower-tier node up to ``tier`` (the device by default; the host for a
        prefetch from disk), in ``pages`` (the caller copies the KV); its parent must be in
        ``tier`` or higher. Returns the pages it leaves."""
        parent = node.parent
        if (parent is None or not tier < node.tier or parent.tier > tier
                or node.lock_count):
            raise RuntimeError(f"promote of {node!r} to tier {tier}: its parent is lower")
        if len(pages) != len(node.pages):
            raise ValueError(f"promote: {len(pages)} pages for a node of {len(node.pages)}")
        return self._retier(node, tier, pages)

    def drop(self, node: RadixNode) -> list[tuple[int, list[int]]]:
        """Remove an unlocked node and everything below it; returns (tier, pages) of each
        removed node, deepest first (the caller frees them)."""
        if node.parent is None or node.lock_count:
            raise RuntimeError(f"drop of {node!r}: a root or locked")
        order: list[RadixNode] = []
        stack = [node]
        while stack:
            at = stack.pop()
            order.append(at)
            stack.extend(at.children.values())
        released: list[tuple[int, list[int]]] = []
        for at in reversed(order):  # children before parents: each is a leaf when removed
            released.append((at.tier, at.pages))
            self._remove_leaf(at)
        return released

    def reset(self) -> list[int]:
        """Drop every node and return all device pages. RuntimeError if anything is locked or
        lower tiers hold pages (free them with ``drop``)."""
        if self._locked_pages or any(self._lower_pages):
            raise RuntimeError(f"reset with {self._locked_pages} locked pages or lower-tier "
                               "pages in the radix cache")
        released: list[int] = []
        for node in self._walk():
            released.extend(node.pages)
            node.removed = True
            node.parent = None
        self._roots.clear()
        for leaves in self._leaves:
            leaves.clear()
        self._evictable_pages = 0
        if self.listener is not None:
            self.listener.cleared()
        return released

    def namespaces(self, prefix: str) -> list[RadixNode]:
        """The roots of the namespaces whose key begins with `prefix` (those with nodes)."""
        return [root for key, root in self._roots.items()
                if key is not None and key.startswith(prefix)]

    def pages(self, tier: int = DEVICE_TIER) -> list[int]:
        """Every page the tree owns in ``tier`` (walks the tree; for integrity checks)."""
        return [page for node in self._walk() if node.tier == tier for page in node.pages]

    def nodes(self) -> Iterator[RadixNode]:
        """Every non-root node, parents before children (walks the tree)."""
        return self._walk()

    def check(self) -> None:
        """Walk the tree and verify structure, tiers, lock counts, counters and LRU lists."""
        check_tree(self.page_size, self._roots, self._leaves, self._listed,
                   (self._evictable_pages, self._locked_pages, self._lower_pages))

    # --- internals --------------------------------------------------------------------------

    def _walk(self) -> Iterator[RadixNode]:
        """Every non-root node, parents before children."""
        stack = [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    @staticmethod
    def _listed(node: RadixNode) -> bool:
        """Whether ``node`` belongs in its tier's LRU list: a non-root tier leaf, unlocked."""
        return node.parent is not None and not node.tier_children and not node.lock_count

    def _common_len(self, node_key: Key, key: Key, start: int) -> int:
        """Length of the common prefix of ``node_key`` and ``key[start:]``, in whole pages."""
        p = self.page_size
        limit = min(len(node_key), len(key) - start)
        n = 0
        if p == 1:
            while n < limit and node_key[n] == key[start + n]:
                n += 1
            return n
        while n + p <= limit and node_key[n : n + p] == key[start + n : start + n + p]:
            n += p
        return n

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick

    def _touch(self, node: RadixNode, now: float) -> None:
        """Mark ``node`` as used at ``now``, keeping its tier's LRU list ordered."""
        listed = self._listed(node)
        if listed:
            self._leaves[node.tier].remove(node)
        node.last_access = now
        node.tick = self._next_tick()
        if listed:
            self._leaves[node.tier].add(node)

    def _count(self, node: RadixNode, sign: int) -> None:
        """Add (sign 1) or take (-1) ``node``'s pages to or from its tier's counters."""
        n = sign * len(node.pages)
        if node.tier != DEVICE_TIER:
            self._lower_pages[node.tier] += n
        elif node.lock_count:
            self._locked_pages += n
        else:
            self._evictable_pages += n

    def _retier(self, node: RadixNode, tier: int, pages: list[int]) -> list[int]:
        """Move unlocked ``node`` to ``tier`` in ``pages``; its parent's tier and its
        children's must allow it. Returns its old pages."""
        parent = node.parent
        assert parent is not None and not node.lock_count
        if self._listed(node):
            self._leaves[node.tier].remove(node)
        if parent.parent is not None:  # the parent's tier-leaf status may change
            was = self._listed(parent)
            parent.tier_children += (parent.tier == tier) - (parent.tier == node.tier)
            if was != self._listed(parent):
                (self._leaves[parent.tier].add if was is False else
                 self._leaves[parent.tier].remove)(parent)
        self._count(node, -1)
        old, node.pages, node.tier = node.pages, pages, tier
        node.tier_children = sum(1 for c in node.children.values() if c.tier == tier)
        self._count(node, 1)
        if self._listed(node):
            self._leaves[tier].add(node)
        return old

    def _split(self, node: RadixNode, n: int) -> RadixNode:
        """Cut ``node`` after ``n`` tokens (a page boundary, 0 < n < len(key)); return the new upper
        part. ``node`` itself stays the lower part, so locks held on it stay valid."""
        p = self.page_size
        parent = node.parent
        assert parent is not None and 0 < n < len(node.key) and n % p == 0
        upper = RadixNode(node.key[:n], node.pages[: n // p], parent, tier=node.tier)
        upper.lock_count = node.lock_count  # on the path of everything below, none taken on it
        upper.tier_children = 1  # the lower part
        upper.last_access = node.last_access
        upper.hits = node.hits  # every match through the lower part went through this one
        upper.tick = self._next_tick()
        node.key = node.key[n:]
        node.pages = node.pages[n // p :]
        node.parent = upper
        upper.children[node.key[:p]] = node
        parent.children[upper.key[:p]] = upper
        if self.listener is not None:
            self.listener.split(upper, node)
        return upper

    def _add_leaf(self, parent: RadixNode, key: Key, pages: list[int], now: float,
                  tier: int = DEVICE_TIER) -> RadixNode:
        p = self.page_size
        if parent.tier == tier and parent.parent is not None:
            if self._listed(parent):
                self._leaves[tier].remove(parent)  # no longer a tier leaf
            parent.tier_children += 1
        leaf = RadixNode(key, pages, parent, tier=tier)
        leaf.last_access = now
        leaf.tick = self._next_tick()
        parent.children[key[:p]] = leaf
        self._count(leaf, 1)
        self._leaves[tier].add(leaf)
        if self.listener is not None:
            self.listener.added(leaf)
        return leaf

    def _remove_leaf(self, leaf: RadixNode) -> None:
        """Unlink an unlocked childless node; its parent may become a tier leaf, a root left
        empty is dropped."""
        parent = leaf.parent
        assert parent is not None and not leaf.children and not leaf.lock_count
        if self.listener is not None:
            self.listener.removed(leaf)
        self._leaves[leaf.tier].remove(leaf)
        del parent.children[leaf.key[: self.page_size]]
        self._count(leaf, -1)
        leaf.parent = None
        leaf.removed = True
        if parent.parent is not None:
            if parent.tier == leaf.tier:
                parent.tier_children -= 1
                if self._listed(parent):
                    self._leaves[parent.tier].add(parent)
        elif not parent.children:
            del self._roots[parent.extra_key]
