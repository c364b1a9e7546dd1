"""The DSL over two replicas: two real `radixrt serve --dsl-port P --port Q --exit-with-parent`
runtimes on loopback (rx.Runtime starts each), reached as one `rx.RuntimeEndpoint([A, B])`.

Programs give the same greedy answers as on one runtime alone; a program stays on one replica,
so its fork prefix (and a run_batch's few-shot prefix) is computed once, there, and read from
the cache by every fork (the servers' own counters say so, and the other replica sees nothing);
programs with nothing in common spread over both. Each replica's /metrics also carries the
queue and KV-usage gauges a Kubernetes inference gateway reads (vLLM's and SGLang's names)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import radixrt as rx

pytestmark = pytest.mark.slow  # starts real processes

COUNTERS = ("prompt_tokens", "cached_tokens")
FACTS = ("Paris is the capital of France. Berlin is the capital of Germany. Madrid is the "
         "capital of Spain. Rome is the capital of Italy. Lisbon is the capital of Portugal. ")
SHOTS = "".join(f"Q: What is {a} plus {b}?\nA: {a + b}\n\n" for a, b in
                [(1, 2), (3, 4), (5, 6), (7, 8), (2, 2), (9, 1), (4, 4), (6, 3)])
QUESTIONS = [f"What is {a} plus {b}?" for a, b in [(1, 1), (2, 3), (3, 3), (4, 1)]]
FORK_PREFIX = FACTS * 2 + "Now three more facts about Europe."
NUM_FORKS = 3
# texts of one length with no first character in common: nothing cached anywhere draws them
UNRELATED = ["Apples grow on trees in orchards", "Bicycles have two wheels and a bell",
             "Copper conducts electricity well", "Dolphins swim in the warm oceans"]


@pytest.fixture(scope="module")
def pair() -> Iterator[list[rx.Runtime]]:
    """Two runtimes, started at once (each loads the default model)."""
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(rx.Runtime, max_total_tokens=8192, check_integrity=True,
                               log_level="warning") for _ in range(2)]
        started, failure = [], None
        for future in futures:
            try:
                started.append(future.result())
            except Exception as exc:  # noqa: BLE001 - stop the other one, then fail
                failure = exc
    if failure is not None:
        for rt in started:
            rt.close()
        raise failure
    yield started
    for rt in started:
        rt.close()
        assert rt.proc.returncode == 0, rt.log_tail()


@pytest.fixture(scope="module")
def replicas(pair: list[rx.Runtime]) -> Iterator[rx.RuntimeEndpoint]:
    endpoint = rx.RuntimeEndpoint([rt.address for rt in pair])
    yield endpoint
    endpoint.close()


def counted(runtimes: list[rx.Runtime], work: Callable[[], object]) -> list[dict[str, int]]:
    """What each runtime's counters moved by while `work` ran."""
    before = [rt.info() for rt in runtimes]
    work()
    return [{k: rt.info()[k] - b[k] for k in COUNTERS} for rt, b in zip(runtimes, before)]


def prompt_tokens_of(rt: rx.Runtime, text: str) -> int:
    """How many tokens `text` is, as the runtime counts it: pin it once, read the counter."""
    [delta] = counted([rt], lambda: rt.unpin(rt.pin(text)))
    return delta["prompt_tokens"]


def home_and_other(deltas: list[dict[str, int]]) -> tuple[dict[str, int], dict[str, int]]:
    """The replica that served (all of) the work, and the other one."""
    home = max(range(2), key=lambda i: deltas[i]["prompt_tokens"])
    return deltas[home], deltas[1 - home]


def placed(endpoint: rx.RuntimeEndpoint) -> list[int]:
    return list(endpoint.info()["routing"]["placed"])


# --- programs --------------------------------------------------------------------------------
@rx.function
def few_shot(s, question):
    s += SHOTS + "Q: " + question + "\nA:"
    s += rx.gen("answer", max_tokens=3, temperature=0, stop="\n")
    s += "\nIs that right?"
    s += rx.select("sure", [" Yes", " No"])


@rx.function
def branches(s):
    s += FORK_PREFIX
    forks = s.fork(NUM_FORKS)
    for i, f in enumerate(forks):
        f += f" Fact {i + 1}:"
        f += rx.gen("fact", max_tokens=6, temperature=0)
        f += rx.select("kind", [" (true)", " (false)"])
    forks.join()


@rx.function
def describe(s, topic):
    s += topic + ". More about it:"
    s += rx.gen("more", max_tokens=4, temperature=0)


def answers(states, *names: str) -> list[tuple]:
    return [tuple(state[name] for name in names) for state in states]


# --- tests -------------------------------------------------------------------------------------
def test_few_shot_run_batch_equals_one_runtime_and_stays_on_one_replica(pair, replicas):
    batch = [{"question": q} for q in QUESTIONS]
    pair[0].flush_cache()
    reference = few_shot.run_batch(batch, backend=pair[0])
    shot_tokens = prompt_tokens_of(pair[0], SHOTS)
    replicas.flush_cache()
    placed_before = placed(replicas)
    states: list = []
    deltas = counted(pair, lambda: states.extend(few_shot.run_batch(batch, backend=replicas)))
    assert answers(states, "answer", "sure") == answers(reference, "answer", "sure")
    home, other = home_and_other(deltas)
    assert other == {"prompt_tokens": 0, "cached_tokens": 0}  # the batch shared one replica
    # the traced few-shot prefix was computed once (its pin) and then read by every call
    assert home["cached_tokens"] >= 2 * len(batch) * (shot_tokens - 2)  # a gen and a select
    assert home["prompt_tokens"] - home["cached_tokens"] < shot_tokens + len(batch) * 60
    moved = [a - b for a, b in zip(placed(replicas), placed_before)]
    assert sorted(moved) == [0, len(batch) + 1]  # the batch's pin, then each program


def test_fork_program_equals_one_runtime_and_computes_its_prefix_once(pair, replicas):
    pair[0].flush_cache()
    reference = branches.run(backend=pair[0])
    prefix_tokens = prompt_tokens_of(pair[0], FORK_PREFIX)
    replicas.flush_cache()
    states: list = []
    deltas = counted(pair, lambda: states.append(branches.run(backend=replicas)))
    [state] = states
    assert state["fact"] == reference["fact"] and state["kind"] == reference["kind"]
    assert state.text() == reference.text()
    home, other = home_and_other(deltas)
    assert other == {"prompt_tokens": 0, "cached_tokens": 0}  # forks never left the replica
    # the prefix was computed once, by the fork's pin; each fork's gen and select read it
    assert home["cached_tokens"] >= 2 * NUM_FORKS * (prefix_tokens - 2)
    assert home["prompt_tokens"] - home["cached_tokens"] < prefix_tokens + NUM_FORKS * 30
    assert all(rt.info()["pinned"] == 0 for rt in pair)  # the join released the pin

    # the same program on asyncio (arun: the endpoint's async twins) lands where it is cached
    deltas = counted(pair, lambda: states.append(asyncio.run(branches.arun(backend=replicas))))
    assert states[-1]["fact"] == reference["fact"]
    again, elsewhere = home_and_other(deltas)
    assert elsewhere["prompt_tokens"] == 0
    assert again["cached_tokens"] >= NUM_FORKS * (prefix_tokens - 2)


def test_unrelated_programs_spread_and_a_shared_prefix_gathers(pair, replicas):
    batch = [{"topic": t} for t in UNRELATED]
    reference = describe.run_batch(batch, backend=pair[0])
    replicas.flush_cache()
    placed_before = placed(replicas)
    states: list = []
    deltas = counted(pair, lambda: states.extend(describe.run_batch(batch, backend=replicas)))
    assert answers(states, "more") == answers(reference, "more")
    moved = [a - b for a, b in zip(placed(replicas), placed_before)]
    assert sum(moved) == len(batch) and min(moved) >= 1, moved  # both replicas got some
    assert all(d["prompt_tokens"] > 0 for d in deltas)
    # a program that continues an earlier one's text goes where that one ran (and hits there)
    topic = "Emeralds are green gems"
    first = counted(pair, lambda: describe.run(topic=topic, backend=replicas))
    then = counted(pair, lambda: describe.run(topic=f"{topic}. More about it: and",
                                              backend=replicas))
    served = [i for i in range(2) if first[i]["prompt_tokens"]]
    assert len(served) == 1 and [i for i in range(2) if then[i]["prompt_tokens"]] == served
    assert then[served[0]]["cached_tokens"] > 0


def _metric(text: str, name: str) -> float:
    """The value of one sample line `name value` of a Prometheus scrape (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def test_metrics_carry_the_inference_gateways_names(pair):
    """The endpoint picker of the Gateway API Inference Extension (llm-d-router) reads queue
    length and KV-cache usage under vLLM's names by default, SGLang's for pods labelled so."""
    for rt in pair:
        info = rt.info()
        text = httpx.get(f"{rt.base_url}/metrics", timeout=30).text
        for ours, theirs in [("radixrt_num_waiting_requests", "vllm:num_requests_waiting"),
                             ("radixrt_num_waiting_requests", "sglang:num_queue_reqs"),
                             ("radixrt_num_running_requests", "vllm:num_requests_running"),
                             ("radixrt_num_running_requests", "sglang:num_running_reqs"),
                             ("radixrt_kv_usage_ratio", "vllm:kv_cache_usage_perc"),
                             ("radixrt_kv_usage_ratio", "vllm:gpu_cache_usage_perc"),
                             ("radixrt_kv_usage_ratio", "sglang:token_usage")]:
            assert f"# TYPE {theirs} gauge" in text, theirs
            assert _metric(text, theirs) == _metric(text, ours), theirs
        pages = info["kv_total"] // info["page_size"]
        assert (f'vllm:cache_config_info{{block_size="{info["page_size"]}",'
                f'num_gpu_blocks="{pages}"}} 1.0') in text
        assert (f'sglang:cache_config_info{{num_pages="{pages}",'
                f'page_size="{info["page_size"]}"}} 1.0') in text


def test_a_replica_that_dies_fails_its_programs_and_the_rest_serve_on(pair):
    """Runs last: it stops the second runtime. Replicas given as connected rx.Runtime objects
    know at once when their process is gone (over bare addresses it takes the ping timeout).
    A program placed on the dead replica fails; the replica is marked down and later programs,
    even ones whose text is cached there, go to the other."""
    endpoint = rx.RuntimeEndpoint(list(pair))
    endpoint.flush_cache()
    describe.run(topic=UNRELATED[0], backend=endpoint)  # replica 0 (both empty: the lower index)
    second = describe.run(topic=UNRELATED[1], backend=endpoint)  # replica 1 (the smaller tree)
    assert endpoint.info()["routing"]["placed"] == [1, 1]
    pair[1].proc.terminate()  # the process only: its connection stays open, as after a crash
    pair[1].proc.wait(timeout=60)
    follow_up = second.text() + " and"
    with pytest.raises(rx.BackendError, match="exited"):
        describe.run(topic=follow_up, backend=endpoint)  # cached on replica 1: placed there
    state = describe.run(topic=follow_up, backend=endpoint)
    assert state["more"]
    routing = endpoint.info()["routing"]
    assert routing["up"] == [1, 0] and routing["placed"] == [2, 2]
    assert endpoint.info()["replicas"][1]["up"] is False
