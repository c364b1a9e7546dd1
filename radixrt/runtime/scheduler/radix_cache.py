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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from sortedcontainers import SortedKeyList

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
    )

    def __init__(
        self, key: Key, pages: list[int], parent: RadixNode | None, extra_key: str | None = None
    ) -> None:
        self.extra_key = extra_key if parent is None else parent.extra_key  # namespace
        self.key = key
        self.pages = pages
        self.parent = parent
        self.children: dict[Key, RadixNode] = {}
        self.lock_count = 0
        self.own_locks = 0
        self.last_access = 0.0
        self.tick = 0  # tie-break of last_access: later accesses get larger ticks
        self.removed = False  # set when evicted or dropped by reset

    @property
    def is_root(self) -> bool:
        return self.parent is None and not self.removed

    def __repr__(self) -> str:
        return (
            f"RadixNode(tokens={len(self.key)}, pages={len(self.pages)}, "
            f"children={len(self.children)}, lock_count={self.lock_count})"
        )


@dataclass(frozen=True, slots=True)
class MatchResult:
    """``node`` covers exactly the matched prefix; ``pages`` hold its ``length`` tokens."""

    node: RadixNode
    pages: list[int]
    length: int


@dataclass(frozen=True, slots=True)
class InsertResult:
    """``node`` covers the whole inserted key. The tree took ownership of ``new_pages``; for the
    first ``existing_len`` tokens it kept the pages it already had and ignored the passed ones."""

    node: RadixNode
    new_pages: list[int]
    existing_len: int


class TreeListener(Protocol):
    def added(self, leaf: RadixNode) -> None:
        """A new leaf (its parent already linked): its key's tokens entered the tree."""

    def split(self, upper: RadixNode, lower: RadixNode) -> None:
        """``lower`` (the same node object as before) lost the head of its key to ``upper``."""

    def removed(self, leaf: RadixNode) -> None:
        """An evicted leaf (still linked to its parent while this is called)."""

    def cleared(self) -> None:
        """Every node was dropped (reset)."""


def _lru_key(node: RadixNode) -> tuple[float, int]:
    return (node.last_access, node.tick)


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
        # Unlocked non-root leaves, least recently used first. A node's LRU key is only changed
        # while the node is out of this list.
        self._evictable_leaves: SortedKeyList = SortedKeyList(key=_lru_key)
        self._evictable_pages = 0
        self._locked_pages = 0
        self.listener = listener

    # --- counters ---------------------------------------------------------------------------

    @property
    def evictable_pages(self) -> int:
        """Pages of unlocked nodes (leaves now, inner nodes once their children are evicted)."""
        return self._evictable_pages

    @property
    def locked_pages(self) -> int:
        """Pages of nodes with a lock count > 0."""
        return self._locked_pages

    @property
    def total_pages(self) -> int:
        """Every page the tree owns."""
        return self._evictable_pages + self._locked_pages

    # --- lookup and insertion ---------------------------------------------------------------

    def root(self, extra_key: str | None = None) -> RadixNode:
        """The root of ``extra_key``'s namespace (a detached empty root if nothing is cached)."""
        root = self._roots.get(extra_key)
        return root if root is not None else RadixNode((), [], None, extra_key)

    def match_prefix(self, key: Sequence[int], extra_key: str | None = None) -> MatchResult:
        """Longest cached prefix of ``key`` in whole pages; does not lock.

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
        while pos < len(key):
            child = node.children.get(key[pos : pos + p])
            if child is None:
                break
            n = self._common_len(child.key, key, pos)
            partial = n < len(child.key)
            if partial:
                child = self._split(child, n)
            self._touch(child, now)
            pages.extend(child.pages)
            pos += n
            node = child
            if partial:
                break
        return MatchResult(node, pages, pos)

    def insert(
        self, key: Sequence[int], pages: Sequence[int], extra_key: str | None = None
    ) -> InsertResult:
        """Cache ``key`` -> ``pages`` (one page per ``page_size`` tokens).

        The part of ``key`` already cached keeps the tree's pages; the rest becomes a new leaf that
        owns the matching tail of ``pages`` (returned as ``new_pages``; the caller increfs them).
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
        while pos < len(key):
            child = node.children.get(key[pos : pos + p])
            if child is None:
                break
            n = self._common_len(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            self._touch(child, now)
            pos += n
            node = child
        existing_len = pos
        new_pages: list[int] = []
        if pos < len(key):
            new_pages = list(pages[pos // p :])
            node = self._add_leaf(node, key[pos:], new_pages, now)
        return InsertResult(node, list(new_pages), existing_len)

    # --- locking ----------------------------------------------------------------------------

    def lock(self, node: RadixNode) -> None:
        """Protect ``node`` and its ancestors from eviction. A no-op on a root."""
        if node.removed:
            raise RuntimeError(f"lock of a node that is no longer in the tree: {node!r}")
        if node.parent is None:
            return
        node.own_locks += 1
        walk: RadixNode | None = node
        while walk is not None and walk.parent is not None:
            if walk.lock_count == 0:
                if not walk.children:
                    self._evictable_leaves.remove(walk)
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
                if not walk.children:
                    self._evictable_leaves.add(walk)
            walk = walk.parent

    # --- eviction ---------------------------------------------------------------------------

    def evict(self, num_pages: int) -> list[int]:
        """Remove unlocked leaves, least recently used first, until at least ``num_pages`` pages
        are released or nothing is evictable. Returns the pages (the caller decrefs them)."""
        released: list[int] = []
        leaves = self._evictable_leaves
        while len(released) < num_pages and leaves:
            leaf = leaves.pop(0)
            parent = leaf.parent
            assert parent is not None
            if self.listener is not None:
                self.listener.removed(leaf)
            del parent.children[leaf.key[: self.page_size]]
            released.extend(leaf.pages)
            self._evictable_pages -= len(leaf.pages)
            leaf.parent = None
            leaf.removed = True
            if parent.parent is not None:
                if not parent.children and parent.lock_count == 0:
                    leaves.add(parent)
            elif not parent.children:
                del self._roots[parent.extra_key]
        return released

    def reset(self) -> list[int]:
        """Drop every node and return all pages. RuntimeError if anything is locked."""
        if self._locked_pages:
            raise RuntimeError(f"reset with {self._locked_pages} locked pages in the radix cache")
        released: list[int] = []
        for node in self._walk():
            released.extend(node.pages)
            node.removed = True
            node.parent = None
        self._roots.clear()
        self._evictable_leaves.clear()
        self._evictable_pages = 0
        if self.listener is not None:
            self.listener.cleared()
        return released

    def pages(self) -> list[int]:
        """Every page the tree owns (walks the tree; for integrity checks)."""
        return [page for node in self._walk() for page in node.pages]

    # --- integrity --------------------------------------------------------------------------

    def check(self) -> None:
        """Walk the tree and verify structure, lock counts, counters and the evictable-leaf list."""
        p = self.page_size
        evictable = locked = 0
        seen_pages: set[int] = set()
        expected_leaves: set[int] = set()
        for extra_key, root in self._roots.items():
            bad = root.parent is not None or root.key or root.pages or root.lock_count
            if bad or root.removed or root.extra_key != extra_key:
                raise RuntimeError(f"radix check: bad root of namespace {extra_key!r}: {root!r}")
            if not root.children:
                raise RuntimeError(f"radix check: empty root of namespace {extra_key!r} kept")
        for node in self._walk():
            where = f"radix check: node {node!r}"
            if node.removed:
                raise RuntimeError(f"{where} is marked removed but still in the tree")
            if not node.key or len(node.key) % p or len(node.pages) != len(node.key) // p:
                raise RuntimeError(f"{where}: key of {len(node.key)} tokens, page_size {p}")
            parent = node.parent
            if parent is None or parent.children.get(node.key[:p]) is not node:
                raise RuntimeError(f"{where} is not its parent's child under its first page")
            child_locks = 0
            for first_page, child in node.children.items():
                if child.parent is not node or child.key[:p] != first_page:
                    raise RuntimeError(f"{where}: child {child!r} is filed wrongly")
                child_locks += child.lock_count
            if node.own_locks < 0 or node.lock_count != node.own_locks + child_locks:
                raise RuntimeError(
                    f"{where}: lock_count {node.lock_count} != own {node.own_locks} "
                    f"+ children {child_locks}"
                )
            for page in node.pages:
                if page in seen_pages:
                    raise RuntimeError(f"{where}: page {page} is owned twice")
                seen_pages.add(page)
            if node.lock_count:
                locked += len(node.pages)
            else:
                evictable += len(node.pages)
                if not node.children:
                    expected_leaves.add(id(node))
        if (evictable, locked) != (self._evictable_pages, self._locked_pages):
            raise RuntimeError(
                f"radix check: counted evictable/locked pages {evictable}/{locked}, "
                f"counters say {self._evictable_pages}/{self._locked_pages}"
            )
        listed = [id(node) for node in self._evictable_leaves]
        if len(listed) != len(set(listed)) or set(listed) != expected_leaves:
            raise RuntimeError(
                f"radix check: evictable-leaf list ({len(listed)} entries) != the "
                f"{len(expected_leaves)} unlocked leaves in the tree"
            )
        keys = [_lru_key(node) for node in self._evictable_leaves]
        if keys != sorted(keys):
            raise RuntimeError("radix check: evictable-leaf list is out of LRU order")

    # --- internals --------------------------------------------------------------------------

    def _walk(self) -> Iterator[RadixNode]:
        """Every non-root node, parents before children."""
        stack = [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

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
        """Mark ``node`` as used at ``now``, keeping the evictable-leaf list ordered."""
        listed = node.lock_count == 0 and not node.children
        if listed:
            self._evictable_leaves.remove(node)
        node.last_access = now
        node.tick = self._next_tick()
        if listed:
            self._evictable_leaves.add(node)

    def _split(self, node: RadixNode, n: int) -> RadixNode:
        """Cut ``node`` after ``n`` tokens (a page boundary, 0 < n < len(key)); return the new upper
        part. ``node`` itself stays the lower part, so locks held on it stay valid."""
        p = self.page_size
        parent = node.parent
        assert parent is not None and 0 < n < len(node.key) and n % p == 0
        upper = RadixNode(node.key[:n], node.pages[: n // p], parent)
        upper.lock_count = node.lock_count  # on the path of everything below, none taken on it
        upper.last_access = node.last_access
        upper.tick = self._next_tick()
        node.key = node.key[n:]
        node.pages = node.pages[n // p :]
        node.parent = upper
        upper.children[node.key[:p]] = node
        parent.children[upper.key[:p]] = upper
        if self.listener is not None:
            self.listener.split(upper, node)
        return upper

    def _add_leaf(self, parent: RadixNode, key: Key, pages: list[int], now: float) -> RadixNode:
        p = self.page_size
        if parent.parent is not None and not parent.children and parent.lock_count == 0:
            self._evictable_leaves.remove(parent)  # no longer a leaf
        leaf = RadixNode(key, pages, parent)
        leaf.last_access = now
        leaf.tick = self._next_tick()
        parent.children[key[:p]] = leaf
        self._evictable_pages += len(pages)
        self._evictable_leaves.add(leaf)
        if self.listener is not None:
            self.listener.added(leaf)
        return leaf
