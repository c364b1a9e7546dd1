"""PagePool: which KV pages are free, and how many owners each used page has.

Bookkeeping only: no tensors live here. The KV pool has ``num_pages`` pages of ``page_size`` slots;
slot id = ``page * page_size + offset``. A page is free when its reference count is 0. Owners
(the radix tree, running requests) each hold one reference; ``decref`` reports newly free pages.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence


class PagePool:
    """Free list (a stack, O(1) per page) plus a reference count per page."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 1:
            raise ValueError(f"PagePool num_pages={num_pages!r} is invalid: must be >= 1")
        if page_size < 1:
            raise ValueError(f"PagePool page_size={page_size!r} is invalid: must be >= 1")
        self.num_pages = num_pages
        self.page_size = page_size
        # Popped from the end, so low page ids are handed out first on a fresh pool.
        self._free_pages: list[int] = list(range(num_pages - 1, -1, -1))
        self._refcounts: list[int] = [0] * num_pages

    @property
    def num_free(self) -> int:
        """Pages with no owner."""
        return len(self._free_pages)

    @property
    def num_used(self) -> int:
        """Pages with at least one owner."""
        return self.num_pages - len(self._free_pages)

    def alloc(self, n: int) -> list[int] | None:
        """Take ``n`` free pages, each with refcount 1; None (and no change) if fewer are free."""
        if n < 0:
            raise ValueError(f"PagePool.alloc n={n!r} is invalid: must be >= 0")
        if n > len(self._free_pages):
            return None
        if n == 0:
            return []
        start = len(self._free_pages) - n
        pages = self._free_pages[start:]
        del self._free_pages[start:]
        pages.reverse()
        refcounts = self._refcounts
        for page in pages:
            refcounts[page] = 1
        return pages

    def claim(self, pages: Sequence[int]) -> None:
        """Take these free pages, each with refcount 1 (a warm restart's pages, whose ids are
        given). All or nothing: a page out of range, in use or listed twice raises ValueError."""
        refcounts = self._refcounts
        for page in pages:
            self._check_range(page)
        if len(set(pages)) != len(pages) or any(refcounts[p] for p in pages):
            raise ValueError(f"claim of pages in use or listed twice: {sorted(pages)[:8]}...")
        if not pages:
            return
        taken = set(pages)
        self._free_pages = [p for p in self._free_pages if p not in taken]
        for page in pages:
            refcounts[page] = 1

    def incref(self, pages: Iterable[int]) -> None:
        """Add one owner to each page (a page listed twice gains two). Every page must be in use."""
        pages = list(pages)
        refcounts = self._refcounts
        for page in pages:
            self._check_range(page)
            if refcounts[page] == 0:
                raise RuntimeError(f"incref of free page {page}: only pages in use can be shared")
        for page in pages:
            refcounts[page] += 1

    def decref(self, pages: Iterable[int]) -> list[int]:
        """Drop one owner from each page; return the pages that became free (in the given order).

        Checked before anything changes: a page with fewer owners than the times it is listed is a
        double free and raises RuntimeError, leaving the pool untouched.
        """
        pages = list(pages)
        refcounts = self._refcounts
        for page, times in Counter(pages).items():
            self._check_range(page)
            if refcounts[page] < times:
                raise RuntimeError(
                    f"double free of page {page}: refcount {refcounts[page]}, decref'd {times}x"
                )
        freed: list[int] = []
        for page in pages:
            count = refcounts[page] - 1
            refcounts[page] = count
            if count == 0:
                freed.append(page)
        self._free_pages.extend(freed)
        return freed

    def refcount(self, page: int) -> int:
        """Number of owners of ``page`` (0 = free)."""
        self._check_range(page)
        return self._refcounts[page]

    def slots(self, pages: Sequence[int]) -> list[int]:
        """The KV slot ids of ``pages``, page by page, in order."""
        size = self.page_size
        if size == 1:
            return list(pages)
        return [page * size + offset for page in pages for offset in range(size)]

    def check(self) -> None:
        """Verify the free list and refcounts agree; RuntimeError describes the first fault."""
        free = self._free_pages
        refcounts = self._refcounts
        if len(refcounts) != self.num_pages:
            raise RuntimeError(f"PagePool: {len(refcounts)} refcounts for {self.num_pages} pages")
        seen: set[int] = set()
        for page in free:
            if not 0 <= page < self.num_pages:
                raise RuntimeError(f"PagePool: free list holds out-of-range page {page}")
            if page in seen:
                raise RuntimeError(f"PagePool: page {page} is on the free list twice")
            seen.add(page)
            if refcounts[page] != 0:
                raise RuntimeError(f"PagePool: free page {page} has refcount {refcounts[page]}")
        for page, count in enumerate(refcounts):
            if count < 0:
                raise RuntimeError(f"PagePool: page {page} has negative refcount {count}")
            if count == 0 and page not in seen:
                raise RuntimeError(f"PagePool: page {page} has refcount 0 but is not free (leak)")
        if len(free) + sum(1 for c in refcounts if c > 0) != self.num_pages:
            raise RuntimeError("PagePool: free + used pages != num_pages")

    def _check_range(self, page: int) -> None:
        if not 0 <= page < self.num_pages:
            raise ValueError(f"page {page!r} is out of range [0, {self.num_pages})")

    def __repr__(self) -> str:
        return (
            f"PagePool(num_pages={self.num_pages}, page_size={self.page_size}, "
            f"num_free={self.num_free})"
        )
