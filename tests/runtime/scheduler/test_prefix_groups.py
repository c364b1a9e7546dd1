"""The scheduler's shared-prefix groups (cascade attention), property-tested on random radix
trees of page lists: groups are disjoint, every member holds the group's prefix pages and has
its new position outside it, every group saves enough reads, and the first group found saves
as many as the best subset of requests could (brute force)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from radixrt.runtime.scheduler.prefix_groups import common_pages, prefix_groups


@dataclass
class Decoding:
    """What prefix_groups reads of a scheduler Request."""

    rid: int
    kv_len: int  # positions with KV, the new one included
    pages: list[int] = field(default_factory=list)


@st.composite
def tree_requests(draw: st.DrawFn) -> tuple[list[Decoding], int]:
    """Requests whose page lists follow a radix tree: each takes a prefix of an earlier one's
    pages (or none) and continues on fresh pages."""
    page_size = draw(st.sampled_from([1, 4, 16]))
    fresh = itertools.count()
    reqs: list[Decoding] = []
    for rid in range(draw(st.integers(0, 7))):
        pages: list[int] = []
        if reqs and draw(st.booleans()):
            parent = draw(st.sampled_from(reqs))
            pages = parent.pages[: draw(st.integers(0, len(parent.pages)))]
        pages = pages + [next(fresh) for _ in range(draw(st.integers(1, 12)))]
        kv_len = (len(pages) - 1) * page_size + draw(st.integers(1, page_size))
        reqs.append(Decoding(rid, kv_len, pages))
    return reqs, page_size


def saved(members: list[Decoding], page_size: int) -> int:
    """Reads a group of these requests saves: (members - 1) x the positions all share."""
    first = members[0]
    shared = min(min(common_pages(first.pages, r.pages, len(first.pages)) * page_size,
                     r.kv_len - 1, first.kv_len - 1) for r in members[1:])
    return (len(members) - 1) * shared


@settings(max_examples=300, deadline=None)
@given(case=tree_requests(), min_len=st.sampled_from([1, 8, 32]),
       min_saved=st.sampled_from([1, 16, 64]))
def test_groups_are_sound_and_the_first_is_the_best(case: tuple, min_len: int,
                                                    min_saved: int) -> None:
    reqs, page_size = case
    by_rid = {r.rid: r for r in reqs}
    groups = prefix_groups(reqs, page_size, min_len, min_saved)  # type: ignore[arg-type]
    seen: set[int] = set()
    for group in groups:
        members = [by_rid[rid] for rid in group.rids]
        assert len(members) >= 2 and not seen & set(group.rids)
        seen |= set(group.rids)
        assert group.length >= min_len and (len(members) - 1) * group.length >= min_saved
        pages = -(-group.length // page_size)
        for r in members:
            assert group.length <= r.kv_len - 1  # the new position is its own
            assert r.pages[:pages] == members[0].pages[:pages]
    def qualifies(s: tuple[Decoding, ...]) -> bool:
        n = saved(list(s), page_size)
        return n >= min_saved and n >= min_len * (len(s) - 1) and n > 0

    subsets = [s for n in range(2, len(reqs) + 1) for s in itertools.combinations(reqs, n)
               if all(r.kv_len - 1 >= min_len for r in s) and qualifies(s)]
    if not subsets:
        assert groups == []
    else:
        best = max(saved(list(s), page_size) for s in subsets)
        assert groups and (len(groups[0].rids) - 1) * groups[0].length == best
