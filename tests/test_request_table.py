"""RequestTable's lifecycle transitions (radixrt/runtime/scheduler/request_table.py): each
transition leaves the queues, the KV and the swap accounting consistent."""

from __future__ import annotations

from radixrt.runtime.messages import TokenLogprob
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.scheduler.kv_manager import KVManager
from radixrt.runtime.scheduler.request import Phase, Request
from radixrt.runtime.scheduler.request_table import FORKED, RequestTable


# --- transitions ---------------------------------------------------------------------------------
def make_table(num_pages: int = 64) -> RequestTable:
    return RequestTable(KVManager(num_pages, 1), pin_budget_tokens=num_pages)


def running(table: RequestTable, rid: int, prompt: list[int], **params: object) -> Request:
    """A request admitted with its whole prompt reserved, as the planner starts one."""
    req = Request(rid=rid, prompt_ids=prompt, params=SamplingParams(**params), arrival=rid)
    table.enqueue(req)
    table.kv.admit(req)
    assert table.kv.reserve(req, req.remaining, []) is not None
    table.start(req)
    return req


def test_preempt_recompute_requeues_with_a_new_epoch_and_a_free_for_the_worker() -> None:
    table = make_table()
    req = running(table, 1, [1, 2, 3, 4, 5])
    req.prompt_logprobs.append(TokenLogprob(2, -0.5))
    table.preempt_recompute(req)
    assert req.phase is Phase.WAITING and table.waiting == [req] and table.running == []
    assert (req.epoch, req.num_preemptions, req.pages, req.kv_len) == (1, 1, [], 0)
    assert req.prompt_logprobs == []  # gathered again on re-admission
    assert table.take_pending_free() == [1]
    assert table.kv.match_len(req) == 4  # its tokens stay in the tree (one is left to compute)
    table.check_integrity()


def test_swap_out_then_swap_in_keeps_the_accounting_and_the_admission_order() -> None:
    table = make_table()
    first = running(table, 1, [1, 2, 3])
    second = running(table, 2, [4, 5, 6, 7])
    table.swap_out(first)
    assert first.phase is Phase.SWAPPED and table.swapped == [first]
    assert table.running == [second] and first.pages == [] and first.num_preemptions == 1
    assert table.swap_used == first.kv_len_swapped == 3
    assert table.take_pending_free() == []  # the worker keeps its KV, on the host
    table.check_integrity()
    assert table.kv.reserve(first, first.kv_len_swapped, []) is not None
    table.swap_in(first)
    assert first.phase is Phase.RUNNING and table.running == [first, second]
    assert table.swapped == [] and table.swap_used == 0
    table.check_integrity()


def test_ending_a_swapped_request_drops_its_host_kv() -> None:
    table = make_table()
    req = running(table, 1, [1, 2, 3])
    table.swap_out(req)
    table.end(req, "abort")
    assert req.finished and table.swapped == [] and table.swap_used == 0
    assert table.take_pending_free() == [1]
    table.check_integrity()


def test_plan_fork_names_the_children_and_fork_starts_them_after_the_parent() -> None:
    table = make_table()
    before = running(table, 1, [9, 9])
    parent = running(table, 2, [1, 2, 3, 4], n=3)
    after = running(table, 3, [8, 8])
    child_rids = table.plan_fork(parent)
    assert len(child_rids) == 3 and all(rid < 0 for rid in child_rids)
    assert table.children == {2: child_rids} and parent.forking
    assert table.abort(2) == [] and parent.abort_requested  # its children arrive with the fold
    children = [Request(rid=rid, prompt_ids=parent.prompt_ids, params=SamplingParams(),
                        arrival=parent.arrival, seed_offset=i, parent_rid=2,
                        phase=Phase.RUNNING, admitted_at=parent.admitted_at)
                for i, rid in enumerate(child_rids)]
    pages = list(parent.pages)
    table.fork(parent, children)
    assert table.running == [before, *children, after]
    assert all(table.requests[c.rid] is c and c.pages == pages for c in children)
    assert parent.finish_reason == FORKED and parent.pages == []
    assert table.take_pending_free() == []  # the worker dropped the parent when it forked
    table.check_integrity()


def test_dedupe_marks_are_handed_to_one_plan() -> None:
    table = make_table()
    table.mark_for_dedupe(4, 2)
    table.mark_for_dedupe(5, 1)
    assert table.take_dedupe() == {4: 2, 5: 1}
    assert table.take_dedupe() == {}
