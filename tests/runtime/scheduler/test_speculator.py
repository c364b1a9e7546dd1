"""The speculator's choices (scheduler/speculator.py): which steps draft, what a request drafts
(the longer match of the tree and its own tokens, within its room), and how the draft length
follows acceptance."""

from __future__ import annotations

import pytest

from radixrt.runtime.config import EngineConfig
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.scheduler.draft_index import DraftIndex
from radixrt.runtime.scheduler.radix_cache import RadixCache
from radixrt.runtime.scheduler.request import Request
from radixrt.runtime.scheduler.scheduler import Scheduler
from radixrt.runtime.scheduler.speculator import Speculator
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
    assert spec.draft(req, room=3) == [5, 6, 7]
    assert spec.draft(req, room=0) == []
    assert spec.draft(request([2, 3], [4], extra_key="x"), room=3) == []
    req.pending = 1  # its last token is in flight: nothing to draft after
    assert spec.draft(req, room=3) == []
    assert stats.draft_lookups == 2 and stats.draft_lookup_seconds > 0


def test_the_longer_match_wins_and_the_own_context_on_a_tie() -> None:
    spec, tree, _ = speculator()
    tree.insert([7, 7, 2, 3, 4, 50, 51], list(range(7)))
    own = request([1, 2, 3, 4, 60, 61, 9, 2, 3], [4])  # (2, 3, 4) earlier in its own prompt
    assert spec.draft(own, room=2) == [60, 61]  # tie (nothing before 2 matches): its own
    longer = request([7, 2, 3, 4, 60, 61, 9, 7, 2, 3], [4])
    assert spec.draft(longer, room=2) == [60, 61]  # its own reaches back as far: still its own
    tree.insert([9, 7, 2, 3, 4, 70], list(range(7, 13)))
    assert spec.draft(longer, room=2)[:1] == [70]  # the tree's now reaches further back


def test_the_draft_length_follows_acceptance() -> None:
    spec, tree, stats = speculator()
    tree.insert(list(range(1, 40)), list(range(39)))
    req = request([1, 2, 3])
    assert len(spec.draft(req, room=64)) == 8
    spec.verified(req, drafted=8, accepted=2)
    assert len(spec.draft(req, room=64)) == 3  # accepted + 1
    spec.verified(req, drafted=3, accepted=3)
    assert len(spec.draft(req, room=64)) == 7  # all accepted: rows verified (1 + 3) doubled
    spec.verified(req, drafted=7, accepted=7)
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
        spec.verified(req, drafted=1, accepted=0)
        n = 0
        while not spec.drafts_next(req):
            assert spec.draft(req, room=64) == []
            n += 1
        skipped.append(n)
    assert skipped == [1, 2, 4, 8]
    assert spec.draft(req, room=64)
    spec.verified(req, drafted=1, accepted=1)
    spec.verified(req, drafted=1, accepted=0)  # after a hit, a miss backs off one step again
    assert not spec.drafts_next(req) and spec.draft(req, room=64) == []
    assert spec.drafts_next(req)
    lost = request([30, 31, 77])  # nothing follows (31, 77) anywhere: backs off too
    assert spec.draft(lost, room=64) == [] and not spec.drafts_next(lost)


def test_none_is_off_and_an_unknown_algorithm_is_refused() -> None:
    """`--speculative-algorithm none` (and None) builds no speculator; anything else but radix
    is refused with the choices."""
    for algorithm, on in ((None, False), ("none", False), ("radix", True)):
        sched = Scheduler(EngineConfig(speculative_algorithm=algorithm), 64, 256, [0])
        assert (sched.speculator is not None) == on
    with pytest.raises(ValueError, match=r"speculative_algorithm.*'radix', 'none'"):
        EngineConfig(speculative_algorithm="ngram")
