"""The step loop (radixrt/runtime/scheduler/loop.py) over a recording executor: the order in
which plans are handed over and results taken, with and without overlap, the early fold a
preemption needs, and what each turn reports. The simulation (test_scheduler_sim.py) runs the
same loop over random request streams; these pin its contract."""

from __future__ import annotations

from sim_worker import CONTEXT, EOS, SimWorker

from radixrt.runtime.config import EngineConfig
from radixrt.runtime.messages import StepPlan, StepResult
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.scheduler.loop import StepLoop
from radixrt.runtime.scheduler.scheduler import Scheduler


class Recording:
    """Executes on the simulated worker at submit; logs ("submit", id) and ("take", id)."""

    def __init__(self, worker: SimWorker) -> None:
        self.worker = worker
        self.log: list[tuple[str, int]] = []
        self.results: list[StepResult] = []

    def submit(self, plan: StepPlan) -> None:
        self.log.append(("submit", plan.step_id))
        self.results.append(self.worker.execute(plan))

    def take(self) -> StepResult:
        result = self.results.pop(0)
        self.log.append(("take", result.step_id))
        return result


def make_loop(overlap: bool, pool_tokens: int = 256,
              **options: object) -> tuple[StepLoop, Recording]:
    options.setdefault("speculative_algorithm", None)  # the loop's own turns, step for step
    config = EngineConfig(max_total_tokens=pool_tokens, page_size=1,
                          **options)  # type: ignore[arg-type]
    sched = Scheduler(config, pool_tokens, CONTEXT, [EOS])
    executor = Recording(SimWorker(pool_tokens))
    return StepLoop(sched, executor, overlap, check_integrity=True), executor


def drain(loop: StepLoop, limit: int = 200) -> list[int]:
    """Turn until idle; the rids reported finished, in order."""
    finished = []
    for _ in range(limit):
        if loop.idle:
            return finished
        finished += [r.rid for r in loop.step() if r.finished]
    raise AssertionError("the loop never went idle")


LONG = SamplingParams(max_tokens=3, ignore_eos=True)


def test_without_overlap_each_turn_runs_and_folds_its_own_plan() -> None:
    loop, ex = make_loop(overlap=False)
    rid = loop.scheduler.add_request([1, 2, 3], LONG).rid
    assert drain(loop) == [rid]
    steps = [s for kind, s in ex.log if kind == "submit"]
    assert ex.log == [entry for s in steps for entry in (("submit", s), ("take", s))]
    assert not loop.in_flight


def test_with_overlap_the_next_plan_is_handed_over_before_a_result_is_taken() -> None:
    loop, ex = make_loop(overlap=True)
    rid = loop.scheduler.add_request([1, 2, 3], LONG).rid
    first = loop.step()
    assert ex.log == [("submit", 1)] and first == [] and len(loop.in_flight) == 1
    loop.step()
    assert ex.log == [("submit", 1), ("submit", 2), ("take", 1)]
    assert drain(loop) == [rid]
    assert not loop.in_flight and loop.idle
    # step 3 samples the last token: nothing to plan while it is in flight, so that turn only
    # folds; step 4 only frees the finished request
    assert ex.log == [("submit", 1), ("submit", 2), ("take", 1), ("submit", 3), ("take", 2),
                      ("take", 3), ("submit", 4), ("take", 4)]


def test_overlap_outputs_equal_the_inline_ones() -> None:
    outputs = []
    for overlap in (False, True):
        loop, _ = make_loop(overlap=overlap)
        reqs = [loop.scheduler.add_request([1 + i, 2, 3, 4], SamplingParams(max_tokens=6))
                for i in range(4)]
        drain(loop)
        outputs.append([(r.output_ids, r.finish_reason) for r in reqs])
    assert outputs[0] == outputs[1]


def test_a_preemption_of_a_request_in_flight_folds_first() -> None:
    """Three requests decode in a pool too small for all: when the victim's token is in flight,
    the loop folds that step in (a turn that takes a result and hands over no plan) before the
    preemption is planned; outputs stay those of a roomy pool."""
    loop, ex = make_loop(overlap=True, pool_tokens=16)
    roomy, _ = make_loop(overlap=False)
    outputs = []
    for lp in (loop, roomy):
        reqs = [lp.scheduler.add_request([1 + i, 2, 3, 4],
                                         SamplingParams(max_tokens=6, ignore_eos=True))
                for i in range(3)]
        drain(lp)
        outputs.append([r.output_ids for r in reqs])
    assert loop.syncs > 0 and loop.scheduler.stats.preemptions > 0
    assert outputs[0] == outputs[1]
    pairs = list(zip(ex.log, ex.log[1:]))
    assert any(a[0] == "take" and b[0] == "take" for a, b in pairs)


def test_a_turn_with_nothing_to_plan_reports_requests_that_ended_outside_a_step() -> None:
    loop, ex = make_loop(overlap=True, pool_tokens=16)
    huge = loop.scheduler.add_request([1] * 8, SamplingParams(max_tokens=64))  # never fits
    assert [r.rid for r in loop.step()] == [huge.rid]
    assert huge.finish_reason.startswith("error") and ex.log == [] and loop.idle
