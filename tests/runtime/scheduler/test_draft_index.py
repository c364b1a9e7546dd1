"""The draft index against brute force over the radix tree it listens to: random inserts, matches
(which split nodes), evictions and resets; after each, every draft it returns is a run of tokens
that really follows the context's last n-gram on a path of the tree, in the asked namespace only;
its entries never outnumber the tree's tokens and are gone with them. A request's own n-grams
(ContextIndex) give the newest earlier continuation."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixrt.runtime.scheduler.draft_index import NGRAM, ContextIndex, DraftIndex
from radixrt.runtime.scheduler.radix_cache import RadixCache, RadixNode

NAMESPACES = [None, "salt"]


def paths(tree: RadixCache, extra_key: str | None) -> list[tuple[int, ...]]:
    """Every root-to-node token path of one namespace."""
    out: list[tuple[int, ...]] = []
    stack: list[tuple[RadixNode, tuple[int, ...]]] = [(tree.root(extra_key), ())]
    while stack:
        node, above = stack.pop()
        for child in node.children.values():
            path = above + child.key
            out.append(path)
            stack.append((child, path))
    return out


def occurs(needle: tuple[int, ...], haystacks: list[tuple[int, ...]]) -> bool:
    n = len(needle)
    return any(h[i : i + n] == needle for h in haystacks for i in range(len(h) - n + 1))


def tree_tokens(tree: RadixCache) -> int:
    return len(tree.pages()) * tree.page_size


ops = st.one_of(
    st.tuples(st.just("insert"), st.sampled_from(NAMESPACES),
              st.lists(st.integers(0, 5), min_size=0, max_size=24)),
    st.tuples(st.just("match"), st.sampled_from(NAMESPACES),
              st.lists(st.integers(0, 5), min_size=1, max_size=24)),
    st.tuples(st.just("evict"), st.none(), st.integers(1, 6)),
    st.tuples(st.just("reset"), st.none(), st.none()),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(page_size=st.sampled_from([1, 2, 4]), steps=st.lists(ops, max_size=30),
       contexts=st.lists(st.lists(st.integers(0, 5), min_size=NGRAM, max_size=10), max_size=8),
       k=st.integers(1, 12))
def test_drafts_are_paths_of_the_tree(page_size: int, steps: list, contexts: list,
                                      k: int) -> None:
    index = DraftIndex()
    tree = RadixCache(page_size, clock=lambda: 0.0, listener=index)
    pages = iter(range(1 << 20))
    for op, extra_key, arg in steps:
        if op == "insert":
            key = arg[: len(arg) // page_size * page_size]
            tree.insert(key, [next(pages) for _ in range(len(key) // page_size)], extra_key)
        elif op == "match":
            tree.match_prefix(arg, extra_key)
        elif op == "evict":
            tree.evict(arg)
        else:
            tree.reset()
        tree.check()
        assert index.entries <= tree_tokens(tree)
        for extra_key in NAMESPACES:
            haystacks = paths(tree, extra_key)
            for context in contexts:
                matched, draft = index.lookup(extra_key, context, k)
                assert len(draft) <= k
                if draft:
                    assert occurs(tuple(context[-matched:]) + tuple(draft), haystacks)
                    assert NGRAM <= matched <= len(context)
                found = index.lookup_paths(extra_key, context, k, 3)  # a draft tree's paths
                alts = [path for _, path in found]
                assert (found[0] if found else (0, [])) == (matched, draft) and len(alts) <= 3
                assert [n for n, _ in found] == sorted((n for n, _ in found), reverse=True)
                assert len({tuple(a) for a in alts}) == len(alts)
                for alt in alts:
                    assert 0 < len(alt) <= k
                    assert occurs(tuple(context[-NGRAM:]) + tuple(alt), haystacks)
    tree.evict(tree.evictable_pages)
    assert index.entries == 0 and not index._spans  # noqa: SLF001


def test_a_continuation_runs_on_down_the_most_recent_branch() -> None:
    ticks = iter(range(1000))
    index = DraftIndex()
    tree = RadixCache(1, clock=lambda: float(next(ticks)), listener=index)
    system = [9, 8, 7, 6, 5]
    tree.insert(system, list(range(5)))  # a system prompt, then two answers after it
    tree.insert(system + [1, 1, 1], list(range(8)))
    tree.insert(system + [2, 2, 2], [0, 1, 2, 3, 4, 8, 9, 10])  # the newer branch
    assert index.lookup(None, [3, 7, 6, 5], 4) == (3, [2, 2, 2])
    assert index.lookup(None, [8, 7, 6], 4) == (3, [5, 2, 2, 2])  # its run, then down
    tree.match_prefix(system + [1, 1], None)  # the first branch is used again: now the newest
    assert index.lookup(None, [9, 8, 7, 6], 6) == (4, [5, 1, 1, 1])
    assert index.lookup("other", [9, 8, 7, 6], 6) == (0, [])  # never across namespaces


def test_other_continuations_are_where_later_sequences_parted() -> None:
    """A draft tree's paths: the best continuation, then the others that followed the same
    tokens: down the other children where the reading passes a fork, inside the candidate's run
    (a later sequence split it) or below it, the most recent first; then other places."""
    ticks = iter(range(1000))
    index = DraftIndex()
    tree = RadixCache(1, clock=lambda: float(next(ticks)), listener=index)
    tree.insert([9, 8, 7, 6, 5, 4, 3], list(range(7)))
    tree.insert([9, 8, 7, 6, 1, 1], list(range(7, 13)))  # parts inside the first run, after 6
    tree.insert([9, 8, 7, 6, 5, 4, 3, 2], list(range(13, 21)))  # runs on below the first
    tree.insert([9, 8, 7, 6, 5, 4, 3, 0, 0], list(range(21, 30)))  # and parts below it
    assert index.lookup_paths(None, [8, 7, 6], 6, 4) == [(3, [5, 4, 3, 0, 0]), (3, [1, 1]),
                                                         (3, [5, 4, 3, 2])]
    assert index.lookup_paths(None, [8, 7, 6], 6, 2) == [(3, [5, 4, 3, 0, 0]), (3, [1, 1])]
    assert index.lookup_paths(None, [8, 7, 6], 2, 4) == [(3, [5, 4]), (3, [1, 1])]  # within k
    tree.insert([2, 7, 6, 5, 4, 3, 7], list(range(30, 37)))  # another place of (7, 6, 5)
    assert index.lookup_paths(None, [8, 7, 6, 5], 6, 4) == [(4, [4, 3, 0, 0]), (4, [4, 3, 2]),
                                                            (3, [4, 3, 7])]


def test_drafts_never_follow_evicted_tokens() -> None:
    """A later sequence parts from an earlier one inside it (the tree splits the earlier leaf),
    then the earlier one's tail below the split is evicted: its tokens are drafted no more, and
    the draft reads on down what the tree still holds."""
    ticks = iter(range(1000))
    index = DraftIndex()
    tree = RadixCache(1, clock=lambda: float(next(ticks)), listener=index)
    tree.insert([9, 8, 7, 6, 5, 4, 3], list(range(7)))
    tree.insert([9, 8, 7, 6, 1, 1], list(range(7, 13)))  # parts after 6
    assert index.lookup_paths(None, [8, 7, 6], 4, 2) == [(3, [5, 4, 3]), (3, [1, 1])]
    assert sorted(tree.evict(3)) == [4, 5, 6]  # the least recently used leaf: 5, 4, 3
    assert paths(tree, None) == [(9, 8, 7, 6), (9, 8, 7, 6, 1, 1)]
    assert index.lookup(None, [8, 7, 6], 4) == (3, [1, 1])
    assert index.lookup_paths(None, [8, 7, 6], 4, 2) == [(3, [1, 1])]
    assert index.lookup(None, [7, 6, 5], 4) == (0, [])
    assert index.entries <= tree_tokens(tree)


def test_the_longest_back_match_wins() -> None:
    index = DraftIndex()
    tree = RadixCache(1, listener=index)
    tree.insert([1, 2, 3, 4, 5, 6, 40, 41], list(range(8)))
    tree.insert([7, 3, 4, 5, 6, 50, 51], list(range(8, 15)))  # newer, matches less far back
    assert index.lookup(None, [2, 3, 4, 5, 6], 2) == (5, [40, 41])
    assert index.lookup(None, [0, 4, 5, 6], 2) == (3, [50, 51])  # a tie: the newest
    tree.evict(100)
    assert index.lookup(None, [2, 3, 4, 5, 6], 2) == (0, []) and index.entries == 0


@given(st.lists(st.integers(0, 3), min_size=0, max_size=40), st.integers(1, 6))
def test_own_context_gives_the_newest_earlier_continuation(tokens: list[int], k: int) -> None:
    """Of the longest last n-gram (NGRAM tokens down to one) that occurred before."""
    index = ContextIndex()
    grown: list[int] = []
    for token in tokens:  # the request's tokens grow one at a time, as decoding does
        grown.append(token)
        matched, draft = index.lookup(grown, k)
        for n in range(min(NGRAM, len(grown)), 0, -1):
            last = tuple(grown[-n:])
            places = [p for p in range(n, len(grown)) if tuple(grown[p - n : p]) == last]
            if places:
                p = max(places)
                assert draft == grown[p : p + k] and matched >= n
                break
        else:
            assert (matched, draft) == (0, [])
