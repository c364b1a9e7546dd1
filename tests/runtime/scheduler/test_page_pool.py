"""PagePool: all-or-nothing allocation, refcounts, double-free detection, slot ids."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixrt.runtime.scheduler.page_pool import PagePool


def test_alloc_is_all_or_nothing() -> None:
    pool = PagePool(num_pages=8, page_size=4)
    first = pool.alloc(5)
    assert first is not None and len(set(first)) == 5
    assert pool.num_free == 3
    assert pool.alloc(4) is None
    assert pool.num_free == 3  # a failed alloc changes nothing
    rest = pool.alloc(3)
    assert rest is not None and set(first) | set(rest) == set(range(8))
    assert pool.alloc(1) is None
    assert pool.alloc(0) == []
    pool.check()


def test_alloc_sets_refcount_one_and_decref_frees() -> None:
    pool = PagePool(4, 1)
    pages = pool.alloc(2)
    assert pages is not None
    assert [pool.refcount(p) for p in pages] == [1, 1]
    assert pool.decref(pages) == pages
    assert pool.num_free == 4
    pool.check()


def test_refcount_sharing() -> None:
    pool = PagePool(4, 2)
    pages = pool.alloc(2)
    assert pages is not None
    pool.incref(pages)
    pool.incref(pages[:1])
    assert [pool.refcount(p) for p in pages] == [3, 2]
    assert pool.decref(pages) == []
    assert pool.decref(pages) == [pages[1]]
    assert pool.num_free == 3
    assert pool.decref([pages[0]]) == [pages[0]]
    assert pool.num_free == 4
    pool.check()


def test_double_free_is_an_error_and_changes_nothing() -> None:
    pool = PagePool(4, 1)
    pages = pool.alloc(2)
    assert pages is not None
    pool.decref(pages[:1])
    with pytest.raises(RuntimeError, match=f"double free of page {pages[0]}"):
        pool.decref(pages)
    assert pool.refcount(pages[1]) == 1  # checked before anything changed
    with pytest.raises(RuntimeError, match=f"double free of page {pages[1]}"):
        pool.decref([pages[1], pages[1]])
    assert pool.refcount(pages[1]) == 1
    pool.check()


def test_incref_of_free_page_is_an_error() -> None:
    pool = PagePool(4, 1)
    pages = pool.alloc(1)
    assert pages is not None
    free_page = next(p for p in range(4) if p not in pages)
    with pytest.raises(RuntimeError, match=f"incref of free page {free_page}"):
        pool.incref([pages[0], free_page])
    assert pool.refcount(pages[0]) == 1  # all or nothing
    pool.check()


def test_out_of_range_and_bad_arguments() -> None:
    pool = PagePool(4, 1)
    with pytest.raises(ValueError, match="out of range"):
        pool.refcount(4)
    with pytest.raises(ValueError, match="out of range"):
        pool.decref([-1])
    with pytest.raises(ValueError, match="alloc n=-1"):
        pool.alloc(-1)
    with pytest.raises(ValueError, match="num_pages"):
        PagePool(0, 1)
    with pytest.raises(ValueError, match="page_size"):
        PagePool(4, 0)


def test_slots() -> None:
    assert PagePool(8, 1).slots([3, 1]) == [3, 1]
    assert PagePool(8, 4).slots([2, 0]) == [8, 9, 10, 11, 0, 1, 2, 3]
    assert PagePool(8, 4).slots([]) == []


def test_check_detects_corruption() -> None:
    pool = PagePool(4, 1)
    pool.alloc(1)
    pool._free_pages.append(pool._free_pages[0])
    with pytest.raises(RuntimeError, match="twice"):
        pool.check()
    pool = PagePool(4, 1)
    page = pool.alloc(1)[0]  # type: ignore[index]
    pool._refcounts[page] = 0
    with pytest.raises(RuntimeError, match="not free"):
        pool.check()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "incref", "decref"]), st.integers(0, 6))))
def test_random_operations_match_a_model(ops: list[tuple[str, int]]) -> None:
    pool = PagePool(10, 2)
    owners: list[int] = []  # one entry per reference held
    for op, arg in ops:
        if op == "alloc":
            pages = pool.alloc(arg)
            free_before = 10 - len(set(owners))
            assert (pages is None) == (arg > free_before)
            owners.extend(pages or [])
        elif owners and op == "incref":
            page = owners[arg % len(owners)]
            pool.incref([page])
            owners.append(page)
        elif owners:
            page = owners.pop(arg % len(owners))
            freed = pool.decref([page])
            assert freed == ([] if page in owners else [page])
        pool.check()
        assert pool.num_free == 10 - len(set(owners))
        for page in set(owners):
            assert pool.refcount(page) == owners.count(page)
