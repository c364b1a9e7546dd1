"""TierMover: KV tiers under the radix tree. Demotion instead of eviction, load-back on a match,
the lowest tier's LRU, a node too big for the tier below, flush, persist and restore; and the
KV manager's stateful property test run again with host and disk tiers, whose model now follows
every page through every move and checks that each tier's pages hold their node's tokens."""

from __future__ import annotations

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule
from test_kv_manager import KVManagerMachine, make_req

from radixrt.runtime.messages import DEVICE_TIER, DISK_TIER, HOST_TIER, TIER_NAMES, PageMove
from radixrt.runtime.scheduler.kv_manager import KVManager
from radixrt.runtime.scheduler.policy import make_policy
from radixrt.runtime.worker.disk_format import RestoredPrefix, prefix_digest


def cached(kv: KVManager, tokens: list[int], extra_key: str | None = None) -> None:
    """A finished request's prompt, computed and cached (as the scheduler leaves it)."""
    req = make_req(0, tokens + [0], extra_key)
    kv.admit(req)
    assert kv.reserve(req, len(tokens) + 1 - req.kv_len, []) is not None
    kv.release(req)


def tiers_of(kv: KVManager, tokens: list[int]) -> list[int]:
    """The tier of each node on the cached path of `tokens`."""
    node = kv.tree.match_prefix(tokens).node
    out = []
    while node.parent is not None:
        out.append(node.tier)
        node = node.parent
    return out[::-1]


def test_eviction_demotes_and_a_match_loads_back() -> None:
    kv = KVManager(8, 1, host_pages=8)
    cached(kv, [1, 2, 3, 4, 5, 6])
    cached(kv, [7, 8, 9, 10, 11, 12])  # room for it demotes the first prompt's tail to host
    assert kv.tree.tier_pages(HOST_TIER) >= 4
    moves = kv.take_moves()
    assert moves and all(m.src_tier == DEVICE_TIER and m.dst_tier == HOST_TIER for m in moves)
    req = make_req(1, [1, 2, 3, 4, 5, 6, 0])
    assert kv.admit(req) == 6  # all of it, loaded back
    back = kv.take_moves()
    assert back[-1].dst_tier == DEVICE_TIER and back[-1].src_tier == HOST_TIER
    assert tiers_of(kv, [1, 2, 3, 4, 5, 6]) == [DEVICE_TIER]
    assert kv.tiers is not None and kv.tiers.stats.hit_tokens[HOST_TIER] > 0
    kv.check_integrity([req])
    kv.release(req)
    kv.check_integrity([])


def test_the_host_tier_demotes_to_disk_and_the_disk_drops_its_lru() -> None:
    kv = KVManager(6, 1, host_pages=6, disk_pages=12)
    prompts = [[10 * i + j for j in range(5)] for i in range(1, 7)]
    for tokens in prompts:
        cached(kv, tokens)
        kv.check_integrity([])
    moves = kv.take_moves()
    kinds = {(m.src_tier, m.dst_tier) for m in moves}
    assert (DEVICE_TIER, HOST_TIER) in kinds and (HOST_TIER, DISK_TIER) in kinds
    assert kv.tree.tier_pages(DISK_TIER) <= 12
    assert kv.match_len(make_req(2, prompts[0] + [0])) == 0  # the oldest fell off the disk
    assert kv.match_len(make_req(3, prompts[-2] + [0])) == 5
    for move in moves:  # what the disk's records need: its tokens and the digest before them
        if move.dst_tier == DISK_TIER:  # each prompt is one node under the root
            assert move.tokens in [p + [0] for p in prompts]
            assert move.prefix == prefix_digest(None, [], 1)


def test_a_node_bigger_than_the_host_tier_goes_to_disk_or_is_dropped() -> None:
    for disk, kept in ((0, 0), (16, 8)):
        kv = KVManager(10, 1, host_pages=3, disk_pages=disk)
        cached(kv, list(range(1, 9)))  # one node of 9 pages
        cached(kv, list(range(20, 28)))
        assert kv.match_len(make_req(1, list(range(1, 9)) + [0])) == kept
        moves = kv.take_moves()
        assert not [m for m in moves if m.dst_tier == HOST_TIER]
        assert [(m.src_tier, m.dst_tier) for m in moves] == ([(DEVICE_TIER, DISK_TIER)]
                                                             if disk else [])
        kv.check_integrity([])


def test_flush_drops_every_tier_and_persist_moves_everything_to_disk() -> None:
    kv = KVManager(6, 1, host_pages=8, disk_pages=20)
    for i in range(4):
        cached(kv, [i + 1, 50, 51, 52])
    assert kv.tiers is not None
    kv.tiers.persist()
    assert kv.tree.total_pages == 0 and kv.tree.tier_pages(HOST_TIER) == 0
    assert kv.tree.tier_pages(DISK_TIER) == 20  # 4 prompts of 5 cached tokens
    kv.check_integrity([])
    assert kv.flush() == 0
    assert kv.tree.tier_pages(DISK_TIER) == 0
    kv.check_integrity([])


def test_restore_claims_the_disk_pages_once() -> None:
    kv = KVManager(6, 2, disk_pages=8)
    assert kv.tiers is not None
    restored = kv.tiers.restore([RestoredPrefix(None, [1, 2, 3, 4], [5, 2]),
                                 RestoredPrefix(None, [1, 2, 7, 8], [5, 6]),
                                 RestoredPrefix("salt", [1, 2], [0])])
    assert restored == 8
    assert tiers_of(kv, [1, 2, 3, 4]) == [DISK_TIER, DISK_TIER]
    kv.check_integrity([])
    req = make_req(1, [1, 2, 7, 8, 9])
    assert kv.admit(req) == 4
    assert [(m.src_tier, m.src) for m in kv.take_moves()] == [(DISK_TIER, [5]), (DISK_TIER, [6])]
    other = make_req(2, [1, 2, 3], "salt")
    assert kv.match_len(other) == 2 and kv.match_len(make_req(3, [1, 2, 3], "pepper")) == 0
    kv.release(req)
    kv.check_integrity([])


def test_an_orphan_attaches_once_its_head_is_computed_again() -> None:
    """A warm restart's chain whose head (a shared system prompt, hot on the device at the
    kill) never reached the disk waits until a request computes that head again."""
    kv = KVManager(16, 2, disk_pages=8)
    assert kv.tiers is not None
    head, tail = [1, 2, 3, 4], [5, 6, 7, 8]
    orphan = RestoredPrefix(None, tail, [6, 2], prefix_digest(None, head, 2))
    other = RestoredPrefix(None, [5, 6, 9, 9], [6, 3], prefix_digest(None, head, 2))
    assert kv.tiers.restore([orphan, other]) == 6  # pages 6, 2, 3: shared 6 held once
    kv.check_integrity([])
    assert kv.match_len(make_req(1, head + tail + [0])) == 0  # nothing rooted yet
    cached(kv, head)  # a request computes the head (and its next token: [1, 2, 3, 4, 0])
    assert not kv.tiers.orphans
    kv.check_integrity([])
    req = make_req(2, head + [5, 6, 9, 9, 0])
    assert kv.admit(req) == 8
    assert {m.src_tier for m in kv.take_moves()} == {DISK_TIER}
    kv.release(req)
    kv.check_integrity([])


def test_orphans_give_their_pages_up_first_and_on_flush() -> None:
    kv = KVManager(16, 1, disk_pages=4)
    assert kv.tiers is not None
    kv.tiers.restore([RestoredPrefix(None, [5, 6, 7], [0, 1, 2], b"x" * 16)])
    kv.check_integrity([])
    kv.tiers.persist()
    cached(kv, [9, 9, 9])  # 4 tokens cached, persisted to disk: the orphan makes room
    kv.tiers.persist()
    assert not kv.tiers.orphans and kv.tree.tier_pages(DISK_TIER) == 4
    kv.check_integrity([])
    fresh = KVManager(16, 1, disk_pages=4)
    assert fresh.tiers is not None
    fresh.tiers.restore([RestoredPrefix(None, [5, 6], [3, 1], b"y" * 16)])
    assert fresh.flush() == 0 and not fresh.tiers.orphans
    assert fresh.tiers.pools[DISK_TIER].num_free == 4
    fresh.check_integrity([])


def test_lpm_counts_a_lower_tier_hit_between_a_device_hit_and_a_miss() -> None:
    kv = KVManager(16, 1, host_pages=8, disk_pages=8)
    assert kv.tiers is not None
    on_disk, on_host, on_device = [10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]
    for tokens in (on_disk, on_host, on_device):
        cached(kv, tokens)
    kv.tiers.move_down(kv.tree.match_prefix(on_disk + [0]).node)  # device -> host
    kv.tiers.move_down(kv.tree.match_prefix(on_disk + [0]).node)  # host -> disk
    kv.tiers.move_down(kv.tree.match_prefix(on_host + [0]).node)  # device -> host
    assert [tiers_of(kv, t + [0]) for t in (on_disk, on_host, on_device)] == [
        [DISK_TIER], [HOST_TIER], [DEVICE_TIER]]
    reqs = [make_req(i, tokens + [0]) for i, tokens in
            enumerate(([40, 41, 42, 43], on_disk, on_host, on_device))]
    assert [kv.match_value(r) for r in reqs] == [0.0, 4 * 0.5, 4 * 0.75, 4.0]
    assert [r.rid for r in make_policy("lpm").order(reqs, kv)] == [3, 2, 1, 0]
    kv.check_integrity([])


def test_a_waiting_requests_prefix_is_prefetched_from_disk_to_host() -> None:
    kv = KVManager(16, 1, host_pages=8, disk_pages=16)
    assert kv.tiers is not None
    tokens = [10, 11, 12, 13]
    cached(kv, tokens)
    node = kv.tree.match_prefix(tokens + [0]).node
    kv.tiers.move_down(node)
    kv.tiers.move_down(node)
    assert node.tier == DISK_TIER
    kv.take_moves()
    req = make_req(1, tokens + [0])
    assert kv.prefetch(req) == 4  # the match split the node: its first 4 tokens came up
    assert [(m.src_tier, m.dst_tier) for m in kv.take_moves()] == [(DISK_TIER, HOST_TIER)]
    assert tiers_of(kv, tokens) == [HOST_TIER]
    kv.check_integrity([])
    assert kv.prefetch(req) == 0  # nothing left on disk on its path
    assert kv.admit(req) == 4
    assert [(m.src_tier, m.dst_tier) for m in kv.take_moves()] == [(HOST_TIER, DEVICE_TIER)]
    kv.release(req)
    kv.check_integrity([])
    assert KVManager(8, 1, disk_pages=8).prefetch(req) == 0  # no host tier: nothing to do


class TieredMachine(KVManagerMachine):
    """The KV manager's machine with host and disk tiers: the worker is simulated by applying
    each PageMove to a model of every tier's slots before anything is written or checked."""

    @initialize(page_size=st.sampled_from([1, 2, 4]), num_pages=st.integers(3, 8),
                host=st.sampled_from([0, 3, 8]), disk=st.sampled_from([0, 4, 16]))
    def setup(self, page_size: int, num_pages: int, host: int, disk: int) -> None:  # type: ignore[override]
        self.ps = page_size
        self.kv = KVManager(num_pages, page_size, host_pages=host, disk_pages=disk or
                            (0 if host else 4))
        self.live = []
        self.pins = []
        self.pin_budget = num_pages * page_size // 2
        self.content = {}
        self.lower: dict[tuple[int, int], tuple] = {}  # (tier, slot) -> what it holds
        self.seen_prompts = []
        self.next_rid = 0

    @precondition(lambda self: self.seen_prompts)
    @rule(data=st.data())
    def prefetch(self, data: st.DataObject) -> None:
        """A waiting request's prefix comes up from disk to host ahead of its admission."""
        tokens = data.draw(st.sampled_from(self.seen_prompts))
        req = make_req(self._new_rid(), tokens, data.draw(st.sampled_from([None, "x"])))
        self.kv.prefetch(req)

    def _slot_value(self, tier: int, slot: int) -> tuple | None:
        return self.content.get(slot) if tier == DEVICE_TIER else self.lower.get((tier, slot))

    def _apply(self, move: PageMove) -> None:
        ps = self.ps
        values = [self._slot_value(move.src_tier, p * ps + i) for p in move.src for i in range(ps)]
        slots = [p * ps + i for p in move.dst for i in range(ps)]
        for slot, value in zip(slots, values, strict=True):
            if move.dst_tier == DEVICE_TIER:
                self.content[slot] = value
            else:
                self.lower[(move.dst_tier, slot)] = value
        if move.dst_tier == DISK_TIER:  # the records a warm restart reads
            assert len(move.tokens) == len(move.dst) * ps

    def _sync(self) -> None:
        for move in self.kv.take_moves():
            event(f"move {TIER_NAMES[move.src_tier]} -> {TIER_NAMES[move.dst_tier]}")
            self._apply(move)
        kv = self.kv
        for node in kv.tree.nodes():  # every tier's pages hold their node's tokens
            path: list[int] = []
            at = node
            while at.parent is not None:
                path[:0] = at.key
                at = at.parent
            start = len(path) - len(node.key)
            for i, page in enumerate(node.pages):
                for off in range(self.ps):
                    q = start + i * self.ps + off
                    want = (node.extra_key, tuple(path[: q + 1]))
                    got = self._slot_value(node.tier, page * self.ps + off)
                    assert got == want, f"tier {node.tier} page {page} holds {got}, not {want}"


TestTieredMachine = TieredMachine.TestCase
TestTieredMachine.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
