"""TierMover: which KV pages move between the device pool and the tiers below it (host memory,
disk), and the bookkeeping of every move. Pure bookkeeping: the worker copies (worker/kv_tiers.py).

- Making room on the device demotes the least recently used unlocked device leaf one tier down
  (to the host tier, or the disk tier when there is no host tier) instead of dropping it; a tier
  that is full makes room the same way (host -> disk), and the lowest tier drops its LRU leaf.
  A node too big for the tier below is dropped with everything below it.
- A match that reaches into a lower tier loads that part back (``load_back``): top-down, each
  node once there are device pages for it (made the same way), locked while the rest loads so
  that making room never demotes what was just loaded.
- Each move is a ``PageMove`` appended to ``moves`` in the order the bookkeeping happened; the
  worker applies them in that order, so a page freed by one move and filled by a later one is
  read before it is overwritten.

Ownership: a lower tier's page has one owner, the tree (refcount 1 in its pool), or is free.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from radixrt.runtime.messages import DEVICE_TIER, DISK_TIER, HOST_TIER, NUM_TIERS, PageMove
from radixrt.runtime.scheduler.page_pool import PagePool
from radixrt.runtime.scheduler.radix_cache import MatchResult, RadixCache, RadixNode
from radixrt.runtime.worker.disk_format import (
    RestoredPrefix,
    chain_digest,
    namespace_digest,
    prefix_digest,
)

# A warm restart's orphans wait this long for a request to compute their head again; then their
# disk pages are given back (attaching costs a hash per page of every prefix cached meanwhile).
ORPHAN_TTL_S = 600.0


@dataclass
class TierStats:
    """Tokens served from each tier by admissions (a device hit, or loaded back), and pages
    moved each way, (src tier, dst tier) -> pages."""

    hit_tokens: list[int] = field(default_factory=lambda: [0] * NUM_TIERS)
    moved_pages: Counter[tuple[int, int]] = field(default_factory=Counter)


class TierMover:
    def __init__(self, tree: RadixCache, pools: list[PagePool | None]) -> None:
        """pools: the device pool, then the host and disk tiers' (None: that tier is off)."""
        self.tree = tree
        self.pools = pools
        self.page_size = tree.page_size
        self.moves: list[PageMove] = []
        self.stats = TierStats()
        self._loading: set[int] = set()  # ids of the nodes a load-back is bringing up
        # a warm restart's disk chains whose head never reached the disk, by the digest of the
        # tokens before them, until a request computes those tokens again (attach); the disk
        # pages they hold, and how many of them hold each
        self.orphans: dict[bytes, list[RestoredPrefix]] = {}
        self._orphan_pages: Counter[int] = Counter()
        self._orphans_until = 0.0  # monotonic time past which waiting orphans are dropped

    def pool(self, tier: int) -> PagePool:
        pool = self.pools[tier]
        assert pool is not None
        return pool

    def _below(self, tier: int) -> int | None:
        """The next tier that exists below `tier`."""
        for lower in range(tier + 1, NUM_TIERS):
            if self.pools[lower] is not None:
                return lower
        return None

    def loading(self, node: RadixNode) -> bool:
        """Is a load of this node's pages up a tier under way?"""
        return id(node) in self._loading

    def free(self, released: Iterable[tuple[int, list[int]]]) -> None:
        """Give back pages the tree let go of (drop, an insert over a lower tier)."""
        for tier, pages in released:
            self.pool(tier).decref(pages)

    # --- down -----------------------------------------------------------------------------
    def make_room(self, num_pages: int) -> bool:
        """At least `num_pages` free device pages, moving unlocked device leaves down. Refused
        up front (nothing changed) when the device's unlocked pages cannot make it; it can
        still fall short after moving some, where a request shares an unlocked page."""
        device = self.pool(DEVICE_TIER)
        if num_pages - device.num_free > self.tree.evictable_pages:
            return False
        while device.num_free < num_pages:
            leaf = self.tree.lru_leaf(DEVICE_TIER)
            if leaf is None:
                break
            self.move_down(leaf)
        return device.num_free >= num_pages

    def _target(self, node: RadixNode) -> int | None:
        """The tier a tier leaf goes down to: the next one below that can hold it and that
        its children are in or below (a node too big for the host tier goes to disk)."""
        lowest_child = min((c.tier for c in node.children.values()), default=None)
        tier = self._below(node.tier)
        while tier is not None:
            if lowest_child is not None and lowest_child < tier:
                return None
            if len(node.pages) <= self.pool(tier).num_pages:
                return tier
            tier = self._below(tier)
        return None

    def move_down(self, node: RadixNode) -> None:
        """A tier leaf goes down to the next tier that can hold it, else it is dropped with
        what is below it."""
        target = self._target(node)
        if target is not None and self._room_in(target, len(node.pages)):
            pages = self.pool(target).alloc(len(node.pages))
            assert pages is not None
            self._move(node, target, pages)
            return
        self.free(self.tree.drop(node))

    def _room_in(self, tier: int, num_pages: int) -> bool:
        """At least `num_pages` free pages in lower `tier`, its LRU leaves moving down (never a
        node being loaded up; on the disk, orphans go first when nothing else can)."""
        pool = self.pool(tier)
        while pool.num_free < num_pages:
            other = next((n for n in self.tree.lru_leaves(tier) if id(n) not in self._loading),
                         None)
            if other is not None:
                self.move_down(other)
            elif tier == DISK_TIER and self.orphans:
                self._drop_orphan()
            else:
                return False
        return True

    def _move(self, node: RadixNode, tier: int, pages: list[int]) -> None:
        """`node`'s KV goes to `pages` of `tier`, up or down: the PageMove (one to the disk says
        what its records need: the namespace, the digest of the tokens before the node, its
        tokens), the tree's bookkeeping, and its old pages freed."""
        src = node.tier
        if tier == DISK_TIER:
            head: list[int] = []
            parent = node.parent
            while parent is not None and parent.parent is not None:
                head[:0] = parent.key
                parent = parent.parent
            move = PageMove(src_tier=src, dst_tier=tier, src=list(node.pages), dst=pages,
                            namespace=node.extra_key,
                            prefix=prefix_digest(node.extra_key, head, self.page_size),
                            tokens=list(node.key))
        else:
            move = PageMove(src_tier=src, dst_tier=tier, src=list(node.pages), dst=pages)
        self.moves.append(move)
        self.stats.moved_pages[(src, tier)] += len(pages)
        old = (self.tree.demote(node, tier, pages) if tier > src
               else self.tree.promote(node, pages, tier))
        self.free([(src, old)])

    # --- up -------------------------------------------------------------------------------
    @staticmethod
    def _lower_path(match: MatchResult) -> tuple[list[RadixNode], RadixNode | None]:
        """The matched path's nodes below the device, top-down, and the deepest device node
        above them (None: the root)."""
        lower: list[RadixNode] = []
        node: RadixNode | None = match.node
        while node is not None and node.tier != DEVICE_TIER:
            lower.append(node)
            node = node.parent
        lower.reverse()
        return lower, node if node is not None and node.parent is not None else None

    def load_back(self, match: MatchResult) -> int:
        """Bring the matched path's lower-tier part to the device, top-down, as far as device
        pages can be made for it. Returns the matched length now on the device."""
        lower, anchor = self._lower_path(match)
        length = match.device_length
        if anchor is not None:
            self.tree.lock(anchor)
        self._loading = {id(n) for n in lower}
        try:
            for node in lower:
                if not self.make_room(len(node.pages)) or node.removed:
                    break  # no room, or making it dropped the rest of the path
                pages = self.pool(DEVICE_TIER).alloc(len(node.pages))
                assert pages is not None
                self.stats.hit_tokens[node.tier] += len(node.key)
                self._move(node, DEVICE_TIER, pages)
                length += len(node.key)
                self.tree.lock(node)
                if anchor is not None:
                    self.tree.unlock(anchor)
                anchor = node
        finally:
            self._loading = set()
            if anchor is not None:
                self.tree.unlock(anchor)
        return length

    def prefetch(self, match: MatchResult) -> int:
        """A waiting request's prefix on disk comes up to the host tier before the request is
        admitted (the host tier's own LRU making room, never at the expense of this path), so
        its load-back then reads host memory. Returns the tokens moved."""
        if self.pools[HOST_TIER] is None:
            return 0
        lower, _ = self._lower_path(match)
        self._loading = {id(n) for n in lower}
        moved = 0
        try:
            for node in lower:
                if node.tier != DISK_TIER:
                    continue
                if not self._room_in(HOST_TIER, len(node.pages)) or node.removed:
                    break
                pages = self.pool(HOST_TIER).alloc(len(node.pages))
                assert pages is not None
                self._move(node, HOST_TIER, pages)
                moved += len(node.key)
        finally:
            self._loading = set()
        return moved

    # --- everything -----------------------------------------------------------------------
    def flush(self) -> int:
        """Drop every unlocked node of every tier; returns the device tokens freed."""
        device = self.pool(DEVICE_TIER)
        before = device.num_free
        while self.orphans:
            self._drop_orphan()
        for tier in range(NUM_TIERS):
            while (leaf := self.tree.lru_leaf(tier)) is not None:
                self.free(self.tree.drop(leaf))
        return (device.num_free - before) * self.page_size

    def persist(self) -> None:
        """Before a shutdown: every unlocked node goes down to the disk tier (least recently
        used first, so the disk's own LRU keeps the most recent), for a warm restart."""
        for tier in range(DISK_TIER):
            while (leaf := self.tree.lru_leaf(tier)) is not None:
                self.move_down(leaf)

    def restore(self, prefixes: Iterable[RestoredPrefix]) -> int:
        """A warm restart: the disk tier's prefixes go into the (empty) tree as disk nodes, each
        page claimed in the disk pool once; orphans wait for their head (``attach``). Returns
        the tokens restored (orphans' included)."""
        disk = self.pool(DISK_TIER)
        orphans: list[RestoredPrefix] = []
        taken: list[int] = []
        for prefix in prefixes:
            if prefix.parent:
                orphans.append(prefix)
                continue
            taken += self.tree.insert(prefix.tokens, prefix.pages, prefix.extra_key,
                                      DISK_TIER).new_pages
        for prefix in orphans:
            taken += [p for p in prefix.pages if p not in self._orphan_pages]
            self._orphan_pages.update(prefix.pages)
            self.orphans.setdefault(prefix.parent, []).append(prefix)
        disk.claim(taken)  # once: the free list is rebuilt once
        self._orphans_until = time.monotonic() + ORPHAN_TTL_S
        return (self.tree.tier_pages(DISK_TIER) + len(self._orphan_pages)) * self.page_size

    def attach(self, key: Sequence[int], extra_key: str | None) -> None:
        """`key` (whole pages) was just cached: orphans waiting under any page boundary of it
        go into the tree below it, as disk nodes. Hashes `key` page by page: only while
        orphans wait."""
        if time.monotonic() > self._orphans_until:  # their heads never came back: let go
            while self.orphans:
                self._drop_orphan()
            return
        ps = self.page_size
        digest = namespace_digest(extra_key)
        for end in range(ps, len(key) + 1, ps):
            digest = chain_digest(digest, key[end - ps : end])
            for prefix in self.orphans.pop(digest, []):
                self._adopt(key[:end], prefix)
            if not self.orphans:
                return

    def _adopt(self, head: Sequence[int], prefix: RestoredPrefix) -> None:
        ps = self.page_size
        result = self.tree.insert([*head, *prefix.tokens],
                                  [-1] * (len(head) // ps) + prefix.pages, prefix.extra_key,
                                  DISK_TIER)
        taken = set(result.new_pages)
        assert -1 not in taken, "an orphan attached under tokens the tree does not hold"
        for page in taken:
            self._orphan_pages.pop(page, None)  # the tree's now
        self._release_orphan([p for p in prefix.pages if p not in taken])

    def _drop_orphan(self) -> None:
        parent = next(iter(self.orphans))
        waiting = self.orphans[parent]
        self._release_orphan(waiting.pop().pages)
        if not waiting:
            del self.orphans[parent]

    def _release_orphan(self, pages: Iterable[int]) -> None:
        """An orphan entry lets go of its pages: those no other entry (nor the tree) holds are
        freed."""
        for page in pages:
            if page not in self._orphan_pages:
                continue  # the tree's
            self._orphan_pages[page] -= 1
            if not self._orphan_pages[page]:
                del self._orphan_pages[page]
                self.pool(DISK_TIER).decref([page])

    def take_moves(self) -> list[PageMove]:
        moves, self.moves = self.moves, []
        return moves

    def check(self) -> None:
        """Every lower-tier page is the tree's (refcount 1) or free."""
        for tier in (HOST_TIER, DISK_TIER):
            pool = self.pools[tier]
            if pool is None:
                if self.tree.tier_pages(tier):
                    raise RuntimeError(f"tier {tier} is off but the tree holds pages in it")
                continue
            pool.check()
            owned = Counter(self.tree.pages(tier))
            if tier == DISK_TIER:
                owned.update(self._orphan_pages.keys())
            for page in range(pool.num_pages):
                if pool.refcount(page) != owned.get(page, 0):
                    raise RuntimeError(f"tier {tier} page {page}: refcount "
                                       f"{pool.refcount(page)}, {owned.get(page, 0)} owners")
