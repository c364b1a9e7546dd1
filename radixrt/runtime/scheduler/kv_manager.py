"""KV slot bookkeeping for the scheduler: the page pool, the radix cache and each request's pages.

Ownership: every page has a reference count. The radix tree holds one reference on each page it
owns; a request holds one on each page of its slot table. A page is free at zero. The invariant,
checkable at any time: free + evictable + locked-in-tree + private-to-requests == total.

KV tiers (tier_mover.py): with a host or disk tier, making room demotes cached pages instead of
dropping them, and admitting a request loads its cached prefix back from them; every lower-tier
page is the tree's or free.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from radixrt.runtime.messages import (
    DEVICE_TIER,
    DISK_TIER,
    HOST_TIER,
    NUM_TIERS,
    PageMove,
    SlotCopy,
)
from radixrt.runtime.scheduler.page_pool import PagePool
from radixrt.runtime.scheduler.radix_cache import RadixCache, RadixNode, TreeListener
from radixrt.runtime.scheduler.request import Request
from radixrt.runtime.scheduler.tier_mover import TierMover

# lpm's worth of a cached token in each lower tier, against 1 for a device hit and 0 for a miss
LOWER_TIER_HIT_WEIGHTS = {HOST_TIER: 0.75, DISK_TIER: 0.5}


@dataclass(frozen=True)
class PoolCounters:
    """Sizes in tokens (pages * page_size)."""

    total: int
    free: int
    evictable: int
    locked: int
    private: int


class KVManager:
    def __init__(self, num_pages: int, page_size: int, disable_radix_cache: bool = False,
                 listener: TreeListener | None = None, host_pages: int = 0,
                 disk_pages: int = 0) -> None:
        """listener: told of every change to the tree (speculative decoding's draft index);
        host_pages / disk_pages: the KV tiers below the pool (0: none)."""
        self.page_size = page_size
        self.pool = PagePool(num_pages, page_size)
        self.tree = RadixCache(page_size, listener=listener)
        self.disable_radix_cache = disable_radix_cache
        self.tiers: TierMover | None = None
        if (host_pages or disk_pages) and not disable_radix_cache:
            self.tiers = TierMover(self.tree, [
                self.pool, PagePool(host_pages, page_size) if host_pages else None,
                PagePool(disk_pages, page_size) if disk_pages else None])

    def take_moves(self) -> list[PageMove]:
        """The KV tiers' page moves since the last plan, in order (for the next StepPlan)."""
        return self.tiers.take_moves() if self.tiers is not None else []

    # --- capacity ------------------------------------------------------------------------------
    @property
    def capacity_tokens(self) -> int:
        return self.pool.num_pages * self.page_size

    def pages_for(self, num_positions: int) -> int:
        return -(-num_positions // self.page_size)

    def available_pages(self) -> int:
        return self.pool.num_free + self.tree.evictable_pages

    def room(self, req: Request, evict: bool = True) -> int:
        """How many more positions the request could be given right now (evicting cached pages
        if needed; with evict=False, from free pages only)."""
        ps = self.page_size
        filled = req.kv_len % ps
        avail = self.available_pages() if evict else self.pool.num_free
        if not filled:
            return avail * ps
        if self.pool.refcount(req.pages[-1]) > 1:  # copy-on-write takes a page first
            return (avail - 1) * ps + (ps - filled) if avail >= 1 else 0
        return avail * ps + (ps - filled)

    # --- prefix cache --------------------------------------------------------------------------
    def match_len(self, req: Request) -> int:
        """Cached prefix length of a waiting request, without taking it (for policies)."""
        if self.disable_radix_cache:
            return 0
        return self.tree.match_prefix(self.match_key(req), req.extra_key).length

    def match_value(self, req: Request) -> float:
        """What a waiting request's cached prefix is worth to the queue's order (lpm): a device
        token counts whole, a lower tier's less (loading it back costs, computing it costs more:
        LOWER_TIER_HIT_WEIGHTS)."""
        if self.disable_radix_cache:
            return 0.0
        match = self.tree.match_prefix(self.match_key(req), req.extra_key)
        value = float(match.device_length)
        node: RadixNode | None = match.node
        while node is not None and node.parent is not None and node.tier != DEVICE_TIER:
            value += len(node.key) * LOWER_TIER_HIT_WEIGHTS[node.tier]
            node = node.parent
        return value

    def prefetch(self, req: Request) -> int:
        """KV tiers: a waiting request's cached prefix on disk comes up to the host tier ahead of
        its admission (TierMover.prefetch). Returns the tokens moved."""
        if (self.tiers is None or self.tiers.pools[HOST_TIER] is None
                or not self.tree.tier_pages(DISK_TIER)):
            return 0
        match = self.tree.match_prefix(self.match_key(req), req.extra_key)
        return self.tiers.prefetch(match) if match.length > match.device_length else 0

    def cached_prefix(self, req: Request) -> tuple[int, int]:
        """A waiting request's cached prefix, in one tree match: (its length, the pages of it
        that nothing locks now: they count as available, but admitting the request locks
        them)."""
        if self.disable_radix_cache:
            return 0, 0
        match = self.tree.match_prefix(self.match_key(req), req.extra_key)
        node: RadixNode | None = match.node
        pages = 0
        while node is not None and node.parent is not None:
            if node.lock_count == 0:
                pages += len(node.pages)
            node = node.parent
        return match.length, pages

    def match_key(self, req: Request) -> list[int]:
        ids = req.all_ids
        limit = len(ids) - 1  # the last token is always computed: its logits are needed
        start = req.prompt_logprob_from()
        if start >= 0:
            limit = min(limit, start - 1)  # prompt logprobs need the logits of earlier rows
        pooling = req.params.pooling
        if pooling is not None and pooling.whole_prompt:
            limit = 0  # mean / CLS pooling reads every row's hidden state
        return ids[: max(limit, 0)]

    def admit(self, req: Request) -> int:
        """Give a waiting request its cached prefix: lock the tree path and share its pages."""
        assert not req.pages and req.tree_node is None
        req.kv_len = 0
        if self.disable_radix_cache:
            return 0
        key = self.match_key(req)
        match = self.tree.match_prefix(key, req.extra_key)
        if req.trace is not None and req.admitted_at < 0:  # before its first admission
            req.trace.hit_tokens = tokens_by_tier(match.node)  # (the last try is the one)
        req.prefix_on_device = match.device_length
        if self.tiers is not None and match.length > match.device_length:
            on_device = self.tiers.load_back(match)  # load back what there is room for
            match = self.tree.match_prefix(key[:on_device], req.extra_key)
        if match.length:
            self.tree.lock(match.node)
            req.tree_node = match.node
            self.pool.incref(match.pages)
            req.pages = list(match.pages)
            req.kv_len = match.length
        return match.length

    def admitted(self, req: Request, first: bool) -> None:
        """The request admitted keeps the prefix `admit` gave it (a try sent back for want of
        memory counts nothing): the device tier's hit, and on its `first` admission a hit on
        each node of its cached path (the tree's live view)."""
        if self.tiers is not None:
            self.tiers.stats.hit_tokens[DEVICE_TIER] += req.prefix_on_device
        if first and req.tree_node is not None:
            req.tree_node.record_hit()

    def cache_prefix(self, req: Request) -> int:
        """Put the request's computed whole pages into the tree (so others can share them now).
        Returns how many of those pages the tree already held (possibly in other pages)."""
        if self.disable_radix_cache:
            return 0
        ps = self.page_size
        num_pages = min(req.kv_len, req.num_known) // ps  # never an in-flight placeholder
        if num_pages == 0:
            return 0
        key = req.all_ids[: num_pages * ps]
        result = self.tree.insert(key, req.pages[:num_pages], req.extra_key)
        self.pool.incref(result.new_pages)
        if self.tiers is not None:
            self.tiers.free(result.released)  # computed again while held in a lower tier
            if self.tiers.orphans:  # a warm restart's chains waiting for these tokens
                self.tiers.attach(key, req.extra_key)
        self.tree.lock(result.node)
        if req.tree_node is not None:
            self.tree.unlock(req.tree_node)
        req.tree_node = result.node
        return result.existing_len // ps

    def dedupe(self, req: Request, num_pages: int, repoints: list[SlotCopy]) -> None:
        """Where the tree holds the request's first pages' tokens in other pages (computed twice,
        by two requests at once), move the request onto the tree's pages and free its own. The
        worker learns of it through `repoints`: copies of slots onto themselves that re-point
        its slot table."""
        ps = self.page_size
        num_pages = min(num_pages, min(req.kv_len, req.num_known) // ps)
        key = req.all_ids[: num_pages * ps]
        tree_pages = self.tree.match_prefix(key, req.extra_key).pages
        for i, page in enumerate(tree_pages):
            if req.pages[i] != page:
                self.pool.incref([page])
                self.pool.decref([req.pages[i]])
                req.pages[i] = page
                slots = [page * ps + j for j in range(ps)]
                repoints.append(SlotCopy(rid=req.rid, start=i * ps, src=slots, dst=slots))

    def release(self, req: Request, cache: bool = True) -> None:
        """Drop every page reference and tree lock of the request."""
        if cache:
            self.cache_prefix(req)
        if req.tree_node is not None:
            self.tree.unlock(req.tree_node)
            req.tree_node = None
        self.pool.decref(req.pages)
        req.pages = []
        req.kv_len = 0

    def pin(self, req: Request, held: Iterable[RadixNode], budget_tokens: int) -> RadixNode | None:
        """Cache the request's computed prefix and take one more lock on it, held until unpin,
        if the pinned prefixes (`held` and this one, shared tokens counted once) stay within
        `budget_tokens`. Returns the locked node; None when the radix cache is off, nothing
        was cached or the budget refused it (the prefix then stays cached, evictable)."""
        self.cache_prefix(req)
        node = req.tree_node
        if node is None or self.pinned_tokens([*held, node]) > budget_tokens:
            return None
        self.tree.lock(node)
        return node

    def unpin(self, node: RadixNode) -> None:
        self.tree.unlock(node)

    @staticmethod
    def pinned_tokens(nodes: Iterable[RadixNode]) -> int:
        """Tokens on the tree paths of these nodes, a token shared by several counted once."""
        seen: set[int] = set()
        total = 0
        for node in nodes:
            at: RadixNode | None = node
            while at is not None and not at.is_root and id(at) not in seen:
                seen.add(id(at))
                total += len(at.key)
                at = at.parent
        return total

    def share(self, parent: Request, child: Request) -> None:
        """n > 1: the child starts with all the parent's pages, the partial last one too."""
        self.pool.incref(parent.pages)
        child.pages = list(parent.pages)
        child.kv_len = parent.kv_len
        if parent.tree_node is not None:
            self.tree.lock(parent.tree_node)
            child.tree_node = parent.tree_node

    # --- allocation ----------------------------------------------------------------------------
    def reserve(self, req: Request, num_new: int, copies: list[SlotCopy]) -> list[int] | None:
        """Slots for positions kv_len .. kv_len+num_new-1, evicting cached pages if needed.

        A shared, partially filled last page is copied first (copy-on-write); the copy is
        appended to `copies`. Returns None (changing nothing) when the memory is not there."""
        ps = self.page_size
        filled = req.kv_len % ps
        cow = filled and self.pool.refcount(req.pages[-1]) > 1
        need = self.pages_for(req.kv_len + num_new) - len(req.pages) + (1 if cow else 0)
        if need > 0 and not self._ensure_free(need):
            return None
        fresh = self.pool.alloc(need) if need > 0 else []
        assert fresh is not None
        if cow:
            old, new = req.pages[-1], fresh.pop(0)
            start = req.kv_len - filled
            src = [old * ps + i for i in range(filled)]
            dst = [new * ps + i for i in range(filled)]
            copies.append(SlotCopy(rid=req.rid, start=start, src=src, dst=dst))
            self.pool.decref([old])
            req.pages[-1] = new
        req.pages.extend(fresh)
        slots = self.slots(req, req.kv_len, req.kv_len + num_new)
        req.kv_len += num_new
        return slots

    def truncate(self, req: Request, kv_len: int) -> None:
        """Give back the positions from `kv_len` on (drafted tokens the worker rejected): the
        pages wholly past it are released. They were reserved fresh for this step, so they are
        the request's alone; a copied-on-write last page is kept (it holds earlier positions)."""
        if not 0 <= kv_len <= req.kv_len:
            raise ValueError(f"truncate request {req.rid} to {kv_len} of {req.kv_len} positions")
        keep = self.pages_for(kv_len)
        self.pool.decref(req.pages[keep:])
        del req.pages[keep:]
        req.kv_len = kv_len

    def slots(self, req: Request, start: int, end: int) -> list[int]:
        """Slots of the request's positions start .. end-1."""
        ps = self.page_size
        pages = req.pages
        return [pages[p // ps] * ps + p % ps for p in range(start, end)]

    def _ensure_free(self, num_pages: int) -> bool:
        if self.tiers is not None:
            return self.tiers.make_room(num_pages)
        short = num_pages - self.pool.num_free
        if short > 0 and self.tree.evictable_pages >= short:
            self.pool.decref(self.tree.evict(short))
        return self.pool.num_free >= num_pages

    def drop_namespaces(self, prefix: str) -> int:
        """Drop the cached KV of every namespace whose key begins with `prefix` (an unloaded
        LoRA adapter's), in every tier, but for what requests or pins still lock and what is
        being loaded up a tier; returns the tokens dropped."""
        dropped = 0
        for root in self.tree.namespaces(prefix):
            for child in list(root.children.values()):
                subtree = [child]
                for node in subtree:
                    subtree.extend(node.children.values())
                if child.lock_count or (self.tiers is not None
                                        and any(self.tiers.loading(n) for n in subtree)):
                    continue
                for tier, pages in self.tree.drop(child):
                    dropped += len(pages) * self.page_size
                    if self.tiers is not None:
                        self.tiers.free([(tier, pages)])
                    else:
                        self.pool.decref(pages)
        return dropped

    def flush(self) -> int:
        """Drop every unlocked cached page; returns how many tokens were freed."""
        if self.tiers is not None:
            return self.tiers.flush()
        freed = self.tree.evict(self.tree.evictable_pages)
        self.pool.decref(freed)
        return len(freed) * self.page_size

    # --- accounting ----------------------------------------------------------------------------
    def counters(self, requests: Iterable[Request]) -> PoolCounters:
        ps = self.page_size
        tree_pages = set(self.tree.pages(DEVICE_TIER))
        private = {p for r in requests for p in r.pages if p not in tree_pages}
        return PoolCounters(
            total=self.pool.num_pages * ps,
            free=self.pool.num_free * ps,
            evictable=self.tree.evictable_pages * ps,
            locked=self.tree.locked_pages * ps,
            private=len(private) * ps,
        )

    def check_integrity(self, requests: Iterable[Request]) -> None:
        """Raise RuntimeError on any leak, double reference or miscount."""
        requests = list(requests)
        self.pool.check()
        self.tree.check()
        holders: Counter[int] = Counter()
        tree_pages = self.tree.pages()
        holders.update(tree_pages)
        if len(set(tree_pages)) != len(tree_pages):
            raise RuntimeError("a page is owned twice by the radix tree")
        for req in requests:
            holders.update(req.pages)
            if len(req.pages) != self.pages_for(req.kv_len):
                raise RuntimeError(
                    f"request {req.rid} holds {len(req.pages)} pages for {req.kv_len} positions"
                )
        for page in range(self.pool.num_pages):
            if self.pool.refcount(page) != holders.get(page, 0):
                raise RuntimeError(
                    f"page {page}: refcount {self.pool.refcount(page)} but "
                    f"{holders.get(page, 0)} holders (leak or double free)"
                )
        c = self.counters(requests)
        if c.free + c.evictable + c.locked + c.private != c.total:
            raise RuntimeError(f"KV accounting broken: {c}")
        if self.tree.evictable_pages + self.tree.locked_pages != self.tree.total_pages:
            raise RuntimeError("radix tree evictable + locked != total")
        if self.tiers is not None:
            self.tiers.check()


def tokens_by_tier(node: RadixNode) -> list[int]:
    """The tokens of the path down to `node` in each tier (index: the tier)."""
    counts = [0] * NUM_TIERS
    while node.parent is not None:
        counts[node.tier] += len(node.key)
        node = node.parent
    return counts
