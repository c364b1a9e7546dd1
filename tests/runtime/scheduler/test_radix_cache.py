"""RadixCache: match/insert/split at page boundaries, path locking, LRU eviction, namespaces,
and a stateful property test that drives the tree and the page pool the way the scheduler does."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixrt.runtime.scheduler.page_pool import PagePool
from radixrt.runtime.scheduler.radix_cache import RadixCache, RadixNode


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pages_of(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


# --- match / insert / split --------------------------------------------------------------------


def test_insert_and_match_page_size_1() -> None:
    tree = RadixCache(1)
    res = tree.insert([1, 2, 3, 4], [10, 11, 12, 13])
    assert (res.new_pages, res.existing_len) == ([10, 11, 12, 13], 0)
    m = tree.match_prefix([1, 2, 3, 4, 5])
    assert (m.pages, m.length, m.node) == ([10, 11, 12, 13], 4, res.node)
    m = tree.match_prefix([1, 2, 9])
    assert (m.pages, m.length) == ([10, 11], 2)
    assert m.node.key == (1, 2) and m.node.pages == [10, 11]  # split so node covers the match
    assert tree.match_prefix([7]).length == 0
    assert tree.total_pages == 4
    tree.check()


def test_insert_reports_existing_len_and_keeps_tree_pages() -> None:
    tree = RadixCache(1)
    tree.insert([1, 2, 3], [10, 11, 12])
    res = tree.insert([1, 2, 5, 6], [90, 91, 92, 93])
    assert (res.existing_len, res.new_pages) == (2, [92, 93])
    assert tree.match_prefix([1, 2, 5, 6]).pages == [10, 11, 92, 93]
    res = tree.insert([1, 2], [80, 81])  # already cached: nothing new, ends at a split node
    assert (res.existing_len, res.new_pages, res.node.key) == (2, [], (1, 2))
    res = tree.insert([1], [70])  # ends inside a node: split
    assert (res.existing_len, res.new_pages, res.node.pages) == (1, [], [10])
    assert sorted(tree.pages()) == [10, 11, 12, 92, 93]
    tree.check()


@pytest.mark.parametrize("p", [4, 16])
def test_page_aligned_matching(p: int) -> None:
    tree = RadixCache(p)
    key = list(range(3 * p))
    tree.insert(key, [7, 8, 9])
    assert tree.match_prefix(key + [1]).length == 3 * p
    # A key that is not whole pages is truncated to whole pages first.
    m = tree.match_prefix(key[: 2 * p + 1])
    assert (m.length, m.pages) == (2 * p, [7, 8])
    # A mismatch inside the second page: only the first page matches.
    probe = key[:]
    probe[p + 1] = -1
    m = tree.match_prefix(probe)
    assert (m.length, m.pages, m.node.key) == (p, [7], tuple(key[:p]))
    assert tree.match_prefix(key[: p - 1]).length == 0
    res = tree.insert(probe[: 2 * p], [1, 2])
    assert (res.existing_len, res.new_pages) == (p, [2])
    tree.check()
    assert sorted(tree.pages()) == [2, 7, 8, 9]


def test_insert_validation() -> None:
    tree = RadixCache(4)
    with pytest.raises(ValueError, match="multiple of page_size 4"):
        tree.insert([1, 2, 3], [0])
    with pytest.raises(ValueError, match="need 2"):
        tree.insert(list(range(8)), [0])
    with pytest.raises(ValueError, match="page_size"):
        RadixCache(0)
    res = tree.insert([], [])
    assert (res.new_pages, res.existing_len, res.node.is_root) == ([], 0, True)
    tree.check()


# --- locking -----------------------------------------------------------------------------------


def test_lock_and_unlock_along_the_path() -> None:
    tree = RadixCache(1)
    tree.insert([1, 2], [10, 11])
    leaf = tree.insert([1, 2, 3, 4], [10, 11, 12, 13]).node
    upper = tree.match_prefix([1, 2]).node
    tree.lock(leaf)
    assert (leaf.lock_count, upper.lock_count) == (1, 1)
    assert (tree.locked_pages, tree.evictable_pages, tree.total_pages) == (4, 0, 4)
    tree.lock(upper)
    assert (leaf.lock_count, upper.lock_count) == (1, 2)
    tree.unlock(leaf)
    assert (tree.locked_pages, tree.evictable_pages) == (2, 2)
    tree.check()
    with pytest.raises(RuntimeError, match="unlock underflow"):
        tree.unlock(leaf)
    tree.unlock(upper)
    assert (tree.locked_pages, tree.evictable_pages) == (0, 4)
    with pytest.raises(RuntimeError, match="unlock underflow"):
        tree.unlock(upper)
    tree.check()


def test_unlock_of_an_ancestor_that_was_not_locked_is_underflow() -> None:
    tree = RadixCache(1)
    tree.insert([1, 2], [10, 11])
    leaf = tree.insert([1, 2, 3], [10, 11, 12]).node
    tree.lock(leaf)
    with pytest.raises(RuntimeError, match="unlock underflow"):
        tree.unlock(leaf.parent)  # type: ignore[arg-type]
    tree.check()


def test_root_lock_is_a_noop() -> None:
    tree = RadixCache(1)
    root = tree.match_prefix([1, 2]).node
    tree.lock(root)
    tree.unlock(root)
    tree.unlock(root)
    tree.insert([1], [5])
    root = tree.match_prefix([9]).node
    assert root.is_root
    tree.lock(root)
    assert tree.locked_pages == 0
    tree.check()


def test_split_keeps_locks_on_the_original_node() -> None:
    tree = RadixCache(2)
    node = tree.insert([1, 2, 3, 4, 5, 6], [10, 11, 12]).node
    tree.lock(node)
    upper = tree.match_prefix([1, 2, 3, 4, 9, 9]).node  # splits the locked node
    assert upper is not node and upper.pages == [10, 11] and node.pages == [12]
    assert upper.lock_count == 1 and node.lock_count == 1 and node.parent is upper
    tree.check()
    tree.unlock(node)
    assert upper.lock_count == 0 and tree.evictable_pages == 3
    tree.check()


def test_lock_of_evicted_node_is_an_error() -> None:
    tree = RadixCache(1)
    node = tree.insert([1], [5]).node
    assert tree.evict(1) == [5]
    with pytest.raises(RuntimeError, match="no longer in the tree"):
        tree.lock(node)


# --- eviction ----------------------------------------------------------------------------------


def test_lru_eviction_order_with_injected_clock() -> None:
    clock = FakeClock()
    tree = RadixCache(1, clock=clock)
    for t, (tok, page) in enumerate([(1, 10), (2, 20), (3, 30)]):
        clock.now = float(t)
        tree.insert([tok, tok], [page, page + 1])
    clock.now = 5.0
    tree.match_prefix([1, 1])  # 1 is now the most recently used
    assert tree.evict(1) == [20, 21]
    assert tree.evict(2) == [30, 31]
    assert tree.evict(100) == [10, 11]
    assert tree.evict(1) == []
    assert tree.total_pages == 0
    tree.check()


def test_lru_ties_are_broken_by_access_order() -> None:
    tree = RadixCache(1, clock=lambda: 0.0)
    for tok in (3, 1, 2):
        tree.insert([tok], [tok])
    tree.match_prefix([3])
    assert [tree.evict(1) for _ in range(3)] == [[1], [2], [3]]


def test_locked_nodes_are_never_evicted() -> None:
    tree = RadixCache(1)
    keep = tree.insert([1, 2, 3], [10, 11, 12]).node
    tree.insert([1, 2, 4], [10, 11, 14])
    tree.insert([5], [15])
    tree.lock(keep)
    assert sorted(tree.evict(100)) == [14, 15]
    assert (tree.locked_pages, tree.evictable_pages) == (3, 0)
    assert tree.match_prefix([1, 2, 3]).pages == [10, 11, 12]
    tree.check()
    tree.unlock(keep)
    assert sorted(tree.evict(100)) == [10, 11, 12]
    tree.check()


def test_evicting_a_leaf_makes_its_parent_evictable() -> None:
    clock = FakeClock()
    tree = RadixCache(1, clock=clock)
    tree.insert([1, 2, 3], [10, 11, 12])
    clock.now = 1.0
    tree.insert([1, 2, 4], [10, 11, 14])
    clock.now = 2.0
    tree.insert([9], [19])
    # [1,2] is an inner node: evictable pages but not a leaf yet.
    assert tree.evictable_pages == 5
    assert tree.evict(1) == [12]
    assert tree.evict(1) == [14]
    # [1,2] became a leaf; it was last used at 1.0, before [9] at 2.0.
    assert tree.evict(1) == [10, 11]
    assert tree.evict(1) == [19]
    tree.check()


def test_evict_releases_at_least_the_request_in_whole_nodes() -> None:
    tree = RadixCache(1)
    tree.insert([1, 2, 3], [1, 2, 3])
    tree.insert([4], [4])
    assert tree.evict(0) == []
    released = tree.evict(2)
    assert len(released) >= 2
    tree.check()


# --- namespaces, reset, check ------------------------------------------------------------------


def test_extra_key_namespaces_are_isolated() -> None:
    tree = RadixCache(1)
    tree.insert([1, 2], [10, 11])
    res = tree.insert([1, 2], [20, 21], extra_key="lora-a")
    assert (res.existing_len, res.new_pages) == (0, [20, 21])
    assert tree.match_prefix([1, 2], extra_key="lora-a").pages == [20, 21]
    assert tree.match_prefix([1, 2]).pages == [10, 11]
    assert tree.match_prefix([1, 2], extra_key="lora-b").length == 0
    assert tree.root("lora-a") is not tree.root(None)
    assert tree.total_pages == 4
    tree.check()
    tree.match_prefix([1, 2])  # None namespace used last: lora-a goes first
    assert tree.evict(2) == [20, 21]
    assert tree.match_prefix([1, 2], extra_key="lora-a").length == 0
    tree.check()


def test_reset() -> None:
    tree = RadixCache(1)
    node = tree.insert([1, 2], [10, 11]).node
    tree.insert([3], [13], extra_key="x")
    tree.lock(node)
    with pytest.raises(RuntimeError, match="locked"):
        tree.reset()
    tree.unlock(node)
    assert sorted(tree.reset()) == [10, 11, 13]
    assert (tree.total_pages, tree.pages(), tree.match_prefix([1, 2]).length) == (0, [], 0)
    tree.check()


# --- stateful property test: tree + pool driven like the scheduler -----------------------------

NAMESPACES = (None, "x")


class RadixPoolMachine(RuleBasedStateMachine):
    """Requests match a prefix (lock + share its pages), allocate the rest, and on finish insert
    their sequence and drop their references; other rules lock/unlock cached prefixes, insert
    directly and evict. A dict model says which page caches each page-aligned prefix."""

    @initialize(page_size=st.sampled_from([1, 4]), num_pages=st.integers(6, 40))
    def setup(self, page_size: int, num_pages: int) -> None:
        self.p = page_size
        self.clock = FakeClock()
        self.tree = RadixCache(page_size, clock=self.clock)
        self.pool = PagePool(num_pages, page_size)
        self.model: dict[tuple[str | None, tuple[int, ...]], int] = {}
        self.inserted: list[tuple[str | None, tuple[int, ...]]] = []
        self.requests: list[tuple[str | None, tuple[int, ...], RadixNode, list[int]]] = []
        self.locks: list[RadixNode] = []

    def _draw_key(self, data: st.DataObject) -> tuple[str | None, tuple[int, ...]]:
        ns = data.draw(st.sampled_from(NAMESPACES))
        n = data.draw(st.integers(1, 5)) * self.p
        # A tiny alphabet, sometimes extending an earlier key, so prefixes are shared a lot.
        tokens = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
        if self.inserted and data.draw(st.booleans()):
            ns, base = data.draw(st.sampled_from(self.inserted))
            tokens = list(base[: data.draw(st.integers(0, len(base)))]) + tokens
        return ns, tuple(tokens)

    def _expected(self, ns: str | None, key: tuple[int, ...]) -> list[int]:
        pages: list[int] = []
        for end in range(self.p, len(key) // self.p * self.p + 1, self.p):
            page = self.model.get((ns, key[:end]))
            if page is None:
                break
            pages.append(page)
        return pages

    def _alloc(self, n: int) -> list[int] | None:
        if n > self.pool.num_free:
            self._evict(n - self.pool.num_free)
        return self.pool.alloc(n)

    def _evict(self, n: int) -> None:
        released = self.tree.evict(n)
        assert len(released) >= n or self.tree.evictable_pages == 0
        assert self.pool.decref(released) == [p for p in released if self._held(p) == 0]
        gone = set(released)
        self.model = {k: v for k, v in self.model.items() if v not in gone}

    def _held(self, page: int) -> int:
        return sum(pages.count(page) for _, _, _, pages in self.requests)

    def _record_insert(self, ns: str | None, key: tuple[int, ...], pages: list[int]) -> None:
        expected = self._expected(ns, key)
        res = self.tree.insert(key, pages, ns)
        assert res.existing_len == len(expected) * self.p
        assert res.new_pages == pages[len(expected) :]
        self.pool.incref(res.new_pages)
        for i, page in enumerate(res.new_pages, start=len(expected) + 1):
            self.model[(ns, key[: i * self.p])] = page
        self.inserted.append((ns, key))
        assert len(res.node.key) > 0 or not key

    @rule(data=st.data())
    def start_request(self, data: st.DataObject) -> None:
        self.clock.now += 1
        ns, key = self._draw_key(data)
        match = self.tree.match_prefix(key, ns)
        assert match.pages == self._expected(ns, key)
        assert match.length == len(match.pages) * self.p
        self.tree.lock(match.node)
        self.pool.incref(match.pages)
        fresh = self._alloc(-(-len(key) // self.p) - len(match.pages))
        if fresh is None:
            self.tree.unlock(match.node)
            self.pool.decref(match.pages)
            return
        self.requests.append((ns, key, match.node, match.pages + fresh))

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def finish_request(self, data: st.DataObject) -> None:
        self.clock.now += 1
        ns, key, node, pages = self.requests.pop(data.draw(st.integers(0, len(self.requests) - 1)))
        whole = len(key) // self.p
        if data.draw(st.booleans()):  # cache the computed whole pages
            self._record_insert(ns, key[: whole * self.p], pages[:whole])
        self.tree.unlock(node)
        self.pool.decref(pages)

    @rule(data=st.data())
    def insert_direct(self, data: st.DataObject) -> None:
        self.clock.now += data.draw(st.sampled_from([0, 1]))
        ns, key = self._draw_key(data)
        key = key[: len(key) // self.p * self.p]
        pages = self._alloc(len(key) // self.p)
        if pages is not None:
            self._record_insert(ns, key, pages)
            self.pool.decref(pages)  # the caller's copies

    @precondition(lambda self: self.inserted)
    @rule(data=st.data())
    def lock_prefix(self, data: st.DataObject) -> None:
        self.clock.now += 1
        ns, key = data.draw(st.sampled_from(self.inserted))
        key = key[: data.draw(st.integers(0, len(key)))]
        match = self.tree.match_prefix(key, ns)
        assert match.pages == self._expected(ns, key)
        self.tree.lock(match.node)
        self.locks.append(match.node)

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock_prefix(self, data: st.DataObject) -> None:
        self.tree.unlock(self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1))))

    @rule(n=st.integers(0, 12))
    def evict(self, n: int) -> None:
        self._evict(n)

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "tree"):
            return
        tree, pool = self.tree, self.pool
        pool.check()
        tree.check()
        tree_pages = tree.pages()
        assert sorted(tree_pages) == sorted(self.model.values())
        in_tree = set(tree_pages)
        private = {p for _, _, _, pages in self.requests for p in pages if p not in in_tree}
        assert pool.num_free + len(tree_pages) + len(private) == pool.num_pages
        assert tree.evictable_pages + tree.locked_pages == tree.total_pages == len(tree_pages)
        for page in range(pool.num_pages):
            assert pool.refcount(page) == (page in in_tree) + self._held(page)
        for node in self.locks + [node for _, _, node, _ in self.requests]:
            assert not node.removed and (node.is_root or node.lock_count > 0)
        for ns, key in self.inserted:
            match = tree.match_prefix(key, ns)
            assert match.pages == self._expected(ns, key)
            assert match.length == len(match.pages) * self.p


TestRadixPoolMachine = RadixPoolMachine.TestCase
TestRadixPoolMachine.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
