"""The speculator's choices (scheduler/speculator.py): which steps draft, what a request drafts
(the longer match of the tree and its own tokens, within its room; a tree of the continuations
found once its main line is cut short), and how the draft length follows acceptance."""

from __future__ import annotations

import pytest

from radixrt.runtime.config import EngineConfig
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.scheduler.draft_index import DraftIndex
from radixrt.runtime.scheduler.radix_cache import RadixCache
from radixrt.runtime.scheduler.request import Request
from radixrt.runtime.scheduler.scheduler import Scheduler
from radixrt.runtime.scheduler.speculator import Draft, Speculator
from radixrt.runtime.scheduler.stats import SchedulerStats


def request(prompt: list[int], outputs: list[int] = (), extra_key: str | None = None) -> Request:
    req = Request(rid=1, prompt_ids=list(prompt), params=SamplingParams(max_tokens=64),
                  max_tokens=64, arrival=0, extra_key=extra_key)
    req.output_ids = list(outputs)
    return req


def speculator(max_batch_size: int = 4) -> tuple[Speculator, RadixCache, SchedulerStats]:
    index = DraftIndex()
    stats = SchedulerStats()
    return Speculator(index, 8, max_batch_size, stats), RadixCache(1, listener=index), stats


def test_steps_with_many_decodes_draft_nothing() -> None:
    spec, _, _ = speculator(max_batch_size=4)
    assert spec.drafts_in(1) and spec.drafts_in(4)
    assert not spec.drafts_in(5) and not spec.drafts_in(0)


def test_drafts_come_from_the_tree_in_the_requests_namespace_within_its_room() -> None:
    spec, tree, stats = speculator()
    tree.insert([1, 2, 3, 4, 5, 6, 7, 8, 9], list(range(9)))
    req = request([0, 2, 3], [4])
    assert spec.draft(req, room=3).tokens == [5, 6, 7]
    assert spec.draft(req, room=0).tokens == []
    assert spec.draft(request([2, 3], [4], extra_key="x"), room=3).tokens == []
    req.pending = 1  # its last token is in flight: nothing to draft after
    assert spec.draft(req, room=3).tokens == []
    assert stats.draft_lookups == 2 and stats.draft_lookup_seconds > 0


def test_the_longer_match_wins_and_the_own_context_on_a_tie() -> None:
    spec, tree, _ = speculator()
    tree.insert([7, 7, 2, 3, 4, 50, 51], list(range(7)))
    own = request([1, 2, 3, 4, 60, 61, 9, 2, 3], [4])  # (2, 3, 4) earlier in its own prompt
    # a tie (nothing before 2 matches): its own is the main line, the tree's keeps a branch
    assert spec.draft(own, room=3) == Draft([60, 61, 50], [-1, 0, -1])
    longer = request([7, 2, 3, 4, 60, 61, 9, 7, 2, 3], [4])
    assert spec.draft(longer, room=3) == Draft([60, 61, 50], [-1, 0, -1])  # as far: its own
    tree.insert([9, 7, 2, 3, 4, 70], list(range(7, 13)))
    # the tree's now reaches further back: its main line (one token), then its own as a branch
    assert spec.draft(longer, room=3) == Draft([70, 60, 61], [-1, -1, 1])


def test_the_draft_length_follows_acceptance() -> None:
    spec, tree, stats = speculator()
    tree.insert(list(range(1, 40)), list(range(39)))
    req = request([1, 2, 3])
    assert len(spec.draft(req, room=64)) == 8
    spec.verified(req, drafted=8, chain=8, accepted=2)
    assert len(spec.draft(req, room=64)) == 3  # accepted + 1
    spec.verified(req, drafted=3, chain=3, accepted=3)
    assert len(spec.draft(req, room=64)) == 7  # all accepted: rows verified (1 + 3) doubled
    spec.verified(req, drafted=7, chain=7, accepted=7)
    assert len(spec.draft(req, room=64)) == 8  # up to num_draft_tokens
    assert (stats.spec_verifications, stats.spec_drafted_tokens,
            stats.spec_accepted_tokens) == (3, 18, 12)
    assert stats.spec_accepted_lengths == {2: 1, 3: 1, 7: 1}


def test_missing_requests_back_off_and_an_accepted_token_resets_it() -> None:
    spec, tree, _ = speculator()
    tree.insert(list(range(1, 40)), list(range(39)))
    req = request([1, 2, 3])
    skipped = []
    for _ in range(4):  # four rejected drafts: 1, 2, 4, 8 steps without drafting after each
        assert spec.draft(req, room=64) and spec.drafts_next(req)
        spec.verified(req, drafted=1, chain=1, accepted=0)
        n = 0
        while not spec.drafts_next(req):
            assert spec.draft(req, room=64).tokens == []
            n += 1
        skipped.append(n)
    assert skipped == [1, 2, 4, 8]
    assert spec.draft(req, room=64)
    spec.verified(req, drafted=1, chain=1, accepted=1)
    spec.verified(req, drafted=1, chain=1, accepted=0)  # after a hit, a miss backs off 1 step
    assert not spec.drafts_next(req) and spec.draft(req, room=64).tokens == []
    assert spec.drafts_next(req)
    lost = request([30, 31, 77])  # nothing follows (31, 77) anywhere: backs off too
    assert spec.draft(lost, room=64).tokens == [] and not spec.drafts_next(lost)


def test_none_is_off_and_an_unknown_algorithm_is_refused() -> None:
    """`--speculative-algorithm none` (and None) builds no speculator; anything else but radix
    is refused with the choices."""
    for algorithm, on in ((None, False), ("none", False), ("radix", True)):
        sched = Scheduler(EngineConfig(speculative_algorithm=algorithm), 64, 256, [0])
        assert (sched.speculator is not None) == on
    with pytest.raises(ValueError, match=r"speculative_algorithm.*'radix', 'none'"):
        EngineConfig(speculative_algorithm="ngram")


def test_a_tree_grows_from_where_each_path_leaves_it() -> None:
    draft = Draft.grow([[1, 2, 3, 4], [1, 2, 9, 9], [5, 6], [1, 7]], chain=3, size=7)
    # the main line's 3; each other path's first token where it parts (9 under 2, 5, 7 under
    # 1); then the rest of the paths in turn while nodes are left (the second 9, not 6)
    assert draft.tokens == [1, 2, 3, 9, 5, 7, 9]
    assert draft.parents == [-1, 0, 1, 1, -1, 0, 3]
    chain = Draft.grow([[1, 2, 3], [1, 2]], chain=3, size=7)
    assert chain.tokens == [1, 2, 3] and chain.parents == []  # a chain: parents left out
    draft.cut(4)
    assert draft.tokens == [1, 2, 3, 9] and draft.parents == [-1, 0, 1, 1]


def test_a_main_line_cut_short_leaves_its_nodes_to_other_continuations() -> None:
    """After a miss the main line is as long as acceptance earned; the rest of the nodes go to
    what else followed the same tokens: a later sequence that parted from the main one inside
    its run, and the request's own context."""
    spec, tree, stats = speculator()
    tree.insert([1, 2, 3, 4, 5, 6, 7, 8, 9], list(range(9)))
    tree.insert([1, 2, 3, 4, 50, 60, 70], list(range(9, 16)))  # parts from it after 4
    req = request([0, 2, 3, 4])
    first = spec.draft(req, room=64)  # the main line ends where the tree does: 3 nodes left
    assert first.tokens == [5, 6, 7, 8, 9, 50, 60, 70]
    assert first.parents == [-1, 0, 1, 2, 3, -1, 5, 6]
    spec.verified(req, drafted=8, chain=5, accepted=1)
    second = spec.draft(req, room=64)  # main line 2, then the branch that parted after 4
    assert second.tokens == [5, 6, 50, 60, 70] and second.parents == [-1, 0, -1, 2, 3]
    assert stats.draft_lookups == 2
