"""Shared-prefix groups of a step's decode runs, for cascade attention.

Two requests that hold the same page at the same index of their slot tables hold the same KV
there and at every index before it: pages are shared only along a radix-tree path (a cache hit
takes the path's pages, a fork's children take their parent's), and a shared page a request
must write into is copied first. So the pages two requests have in common are a prefix of both
tables, and its length can be found by binary search on single pages.

The decode runs (one new token after a prefix) are sorted by their page lists. In that order
the pages any contiguous run of requests shares are the fewest that neighbours share, so the
best group is the contiguous run that maximises the reads it saves, (members - 1) x (shared
positions), as in the largest rectangle under a histogram of the neighbours' common prefixes.
Neighbours sharing fewer than `min_len` positions count as sharing none. The best run is taken
if it saves at least `min_saved` reads, and the search goes on in what is left on either side.
The new token's own position is never part of a group's prefix: it is in a page the request
writes (private after copy-on-write).
"""

from __future__ import annotations

from collections.abc import Sequence

from radixrt.runtime.messages import PrefixGroup
from radixrt.runtime.scheduler.request import Request


def common_pages(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """How many leading pages a and b share (at most limit), by the prefix property above."""
    lo, hi = 0, min(limit, len(a), len(b))
    while lo < hi:  # invariant: the first lo pages are shared, page hi and later are not
        mid = (lo + hi + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def prefix_groups(decodes: Sequence[Request], page_size: int, min_len: int,
                  min_saved: int) -> list[PrefixGroup]:
    """Disjoint groups of at least two decode requests (each has its new position reserved:
    its kv_len counts it) whose KV begins with at least min_len shared positions, each group
    saving at least min_saved reads of a position per layer."""
    reqs = sorted((r for r in decodes if r.kv_len - 1 >= min_len and r.pages),
                  key=lambda r: r.pages)
    # shared[i]: positions requests i and i + 1 share, never either one's new position
    # (below min_len: 0, as no group may hold that pair)
    shared = [
        min(common_pages(a.pages, b.pages, len(a.pages)) * page_size, a.kv_len - 1, b.kv_len - 1)
        for a, b in zip(reqs, reqs[1:])
    ]  # fmt: skip
    shared = [n if n >= min_len else 0 for n in shared]
    groups: list[PrefixGroup] = []
    spans = [(0, len(shared))]  # half-open ranges of `shared` still to search
    while spans:
        lo, hi = spans.pop()
        best = _best_run(shared, lo, hi)
        if best is None:
            continue
        start, end, length = best  # neighbours start..end-1: requests start..end
        if (end - start) * length < min_saved:
            continue  # the best run of the span: no other one in it saves enough either
        groups.append(PrefixGroup(rids=[r.rid for r in reqs[start : end + 1]], length=length))
        spans += [(lo, max(start - 1, lo)), (min(end + 1, hi), hi)]
    return groups


def _best_run(shared: list[int], lo: int, hi: int) -> tuple[int, int, int] | None:
    """The run shared[start:end] (lo <= start < end <= hi) maximising (end - start) * min of it:
    (start, end, min), by the stack method for the largest rectangle in a histogram."""
    best: tuple[int, int, int] | None = None
    best_area = 0
    stack: list[int] = []  # indices with increasing heights
    for i in range(lo, hi + 1):
        height = shared[i] if i < hi else -1
        while stack and shared[stack[-1]] >= height:
            top = stack.pop()
            left = stack[-1] + 1 if stack else lo
            area = (i - left) * shared[top]
            if area > best_area:
                best_area, best = area, (left, i, shared[top])
        stack.append(i)
    return best
