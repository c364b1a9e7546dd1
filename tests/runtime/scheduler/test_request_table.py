"""RequestTable's lifecycle transitions (radixrt/runtime/scheduler/request_table.py) and the
in-flight ledger (in_flight.py): each transition leaves the queues, the KV and the swap
accounting consistent; a result planned before a recompute preemption is dropped; a presolved
token is skipped once; a sync is settled by folding the newest plan in. And the rule that keeps
the lifecycle in one file: the planner (its preemption too) and the folder never write the
table's fields."""

from __future__ import annotations

import ast
from pathlib import Path

from sim_worker import CONTEXT, EOS

from radixrt.runtime.config import EngineConfig
from radixrt.runtime.messages import RunResult, StepPlan, StepResult, TokenLogprob
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.scheduler.fair_share import FairShare
from radixrt.runtime.scheduler.in_flight import SYNC_FORK, SYNC_PREEMPT, InFlightLedger
from radixrt.runtime.scheduler.kv_manager import KVManager
from radixrt.runtime.scheduler.request import Phase, Request
from radixrt.runtime.scheduler.request_table import FORKED, RequestTable
from radixrt.runtime.scheduler.scheduler import Scheduler

SCHEDULER = Path(__file__).resolve().parents[3] / "radixrt" / "runtime" / "scheduler"
MUTATORS = {"append", "extend", "insert", "remove", "pop", "popitem", "clear", "sort",
            "reverse", "update", "setdefault", "add", "discard", "__setitem__", "__delitem__"}


# --- no direct writes ----------------------------------------------------------------------------
def _is_table(node: ast.expr) -> bool:
    """`table` or `self.table`."""
    if isinstance(node, ast.Name):
        return node.id == "table"
    return (isinstance(node, ast.Attribute) and node.attr == "table"
            and isinstance(node.value, ast.Name) and node.value.id == "self")


def _table_field(node: ast.expr) -> str | None:
    """The table field a target or receiver reaches (`table.x`, `self.table.x[k]`), or None."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute) and _is_table(node.value):
        return node.attr
    return None


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = node.targets
    else:
        return []
    flat: list[ast.expr] = []
    for target in targets:
        flat += target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
    return flat


def table_writes(source: str) -> list[str]:
    """Every assignment to, or mutating call on, a field of the request table: 'line: field'."""
    writes = []
    for node in ast.walk(ast.parse(source)):
        for target in _targets(node):
            field = _table_field(target)
            if field is not None:
                writes.append(f"{node.lineno}: {field}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATORS):
            field = _table_field(node.func.value)
            if field is not None:
                writes.append(f"{node.lineno}: {field}.{node.func.attr}")
    return writes


def test_the_write_finder_sees_every_kind_of_write() -> None:
    source = """
def f(self, table, req):
    table.running.remove(req)
    self.table.dedupe[req.rid] = 3
    table.swap_used += 1
    pending, self.table.dedupe = self.table.dedupe, {}
    table.children[1].append(2)
    del table.requests[1]
    table.end(req, "stop")          # a method: fine
    n = len(table.running)          # a read: fine
    other.running.append(req)       # not the table
"""
    assert sorted(table_writes(source)) == [
        "3: running.remove", "4: dedupe", "5: swap_used", "6: dedupe", "7: children.append",
        "8: requests",
    ]


def test_planner_and_folder_move_requests_only_through_table_methods() -> None:
    for name in ("planner.py", "preemption.py", "folding.py"):
        assert table_writes((SCHEDULER / name).read_text()) == [], name


# --- transitions ---------------------------------------------------------------------------------
def make_table(num_pages: int = 64) -> RequestTable:
    return RequestTable(KVManager(num_pages, 1), pin_budget_tokens=num_pages, fair=FairShare())


def running(table: RequestTable, rid: int, prompt: list[int], **params: object) -> Request:
    """A request admitted with its whole prompt reserved, as the planner starts one."""
    sp = SamplingParams(**params)
    req = Request(rid=rid, prompt_ids=prompt, params=sp, max_tokens=sp.max_tokens or 16,
                  arrival=rid)
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
    children = [Request(rid=rid, prompt_ids=parent.prompt_ids, params=parent.params,
                        max_tokens=parent.max_tokens, arrival=parent.arrival, seed_offset=i,
                        parent_rid=2, phase=Phase.RUNNING, admitted_at=parent.admitted_at)
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


# --- the in-flight ledger ------------------------------------------------------------------------
def make_scheduler(**options: object) -> Scheduler:
    config = EngineConfig(max_total_tokens=256, page_size=1, **options)  # type: ignore[arg-type]
    return Scheduler(config, 256, CONTEXT, [EOS])


def fold_chunk_preempted_or_not(preempt: bool) -> tuple[Scheduler, Request]:
    """A prompt chunk with prompt logprobs is planned; with `preempt`, its request is preempted
    by recompute before the result is folded in."""
    sched = make_scheduler(max_num_batched_tokens=16)
    in_flight = InFlightLedger()
    req = sched.add_request(list(range(1, 41)), SamplingParams(max_tokens=2,
                                                              prompt_logprobs_start=0))
    plan = sched.schedule(in_flight)
    assert plan is not None and [(r.rid, r.num_new, r.sample) for r in plan.runs] == [
        (req.rid, 16, False)]
    if preempt:
        sched.table.preempt_recompute(req)
    logprobs = [TokenLogprob(t, -1.0) for t in range(2, 5)]
    result = StepResult(plan.step_id, [RunResult(req.rid, prompt_logprobs=logprobs)])
    sched.process_results(plan, result, in_flight)
    return sched, req


def test_a_result_planned_before_a_recompute_preemption_is_dropped() -> None:
    sched, req = fold_chunk_preempted_or_not(preempt=False)
    assert sched.stats.computed_tokens == 16 and len(req.prompt_logprobs) == 3
    sched, req = fold_chunk_preempted_or_not(preempt=True)
    assert req.phase is Phase.WAITING and req.epoch == 1
    assert sched.stats.computed_tokens == 0 and req.prompt_logprobs == []


def test_a_stale_run_is_told_by_its_epoch() -> None:
    in_flight = InFlightLedger()
    req = Request(rid=7, prompt_ids=[1], params=SamplingParams(), max_tokens=16, arrival=0)
    in_flight.record_plan(1, {7: 0}, set())
    req.epoch += 1  # a recompute preemption
    assert in_flight.fold(1).is_stale(req)
    assert not in_flight.fold(2).is_stale(req)  # not recorded: nothing to tell it by


def test_a_presolved_token_is_skipped_by_the_newest_step_only() -> None:
    in_flight = InFlightLedger()
    in_flight.record_plan(1, {7: 0}, set())
    in_flight.record_plan(2, {7: 0}, set())
    in_flight.presolve(7)
    assert [step.presolved for step in in_flight.presolving(7)] == [{7}]
    assert in_flight.fold(1).presolved == set()
    assert in_flight.fold(2).presolved == {7}
    assert in_flight.presolving(7) == []  # the marker goes with its step


def test_prefilling_covers_every_step_in_flight() -> None:
    in_flight = InFlightLedger()
    in_flight.record_plan(1, {}, {1, 2})
    in_flight.record_plan(2, {}, {3})
    assert in_flight.prefilling() == {1, 2, 3}
    in_flight.fold(1)
    assert in_flight.prefilling() == {3}


def test_a_sync_keeps_its_first_reason_and_is_settled_by_the_newest_fold() -> None:
    in_flight = InFlightLedger()
    in_flight.record_plan(1, {}, set())
    in_flight.record_plan(2, {}, set())
    in_flight.request_sync(SYNC_PREEMPT)
    in_flight.request_sync(SYNC_FORK)
    assert in_flight.needs_sync and in_flight.sync_reason == SYNC_PREEMPT
    in_flight.fold(1)
    assert in_flight.needs_sync  # step 2 is still in flight
    in_flight.fold(2)
    assert not in_flight.needs_sync


def test_planning_a_fork_asks_for_a_sync() -> None:
    sched = make_scheduler()
    in_flight = InFlightLedger()
    parent = sched.add_request([1, 2, 3], SamplingParams(max_tokens=2, n=2))
    plan = sched.schedule(in_flight)
    assert plan is not None and plan.runs[0].fork_into == sched.children[parent.rid]
    assert in_flight.sync_reason == SYNC_FORK


def test_the_loop_takes_plans_back_in_the_order_it_handed_them_over() -> None:
    in_flight = InFlightLedger()
    assert in_flight.oldest is None and not in_flight
    first, second = StepPlan(step_id=1), StepPlan(step_id=2)
    in_flight.handed_over(first)
    in_flight.handed_over(second)
    assert len(in_flight) == 2 and in_flight.oldest is first
    assert in_flight.take_oldest() is first and in_flight.oldest is second
