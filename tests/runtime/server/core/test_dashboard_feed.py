"""The dashboard's history (server/core/dashboard_feed.py): finished requests in 5-second
buckets by the time they ended, quiet buckets kept as empty ones, at most six minutes and a
bounded number of tenants kept whatever the traffic."""

from __future__ import annotations

from typing import Any

from radixrt.runtime.config import MAX_METRIC_LABELS
from radixrt.runtime.server.core.dashboard_feed import BUCKET_S, HISTORY_BUCKETS, DashboardFeed
from radixrt.runtime.tokenizer.request_metrics import RequestMetrics


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Manager:
    def __init__(self) -> None:
        self.callbacks: list[Any] = []

    def on_finish(self, callback: Any) -> None:
        self.callbacks.append(callback)


def finished(tenant: str = "", priority: int = 0, tokens: int = 4,
             error: bool = False) -> RequestMetrics:
    return RequestMetrics(arrival=10.0, first_token=10.2, last_token=10.5, finished=10.5,
                          prompt_tokens=20, cached_tokens=8, completion_tokens=tokens,
                          tenant=tenant, priority=priority, inter_token=[0.1, 0.2],
                          finish_reasons=["error: boom" if error else "stop"])


def make() -> tuple[DashboardFeed, Clock, Manager]:
    clock, manager = Clock(), Manager()
    return DashboardFeed(manager, clock=clock), clock, manager  # type: ignore[arg-type]


def test_requests_land_in_the_bucket_where_they_finished() -> None:
    feed, clock, manager = make()
    assert manager.callbacks == [feed.record]
    feed.record(finished("alice", 1))
    feed.record(finished("bob", 0, tokens=6, error=True))
    clock.now += 3 * BUCKET_S  # two quiet buckets, then one more request
    feed.record(finished("alice"))
    history = feed.history()
    buckets = history["buckets"]
    assert history["bucket_s"] == BUCKET_S and history["window"] == HISTORY_BUCKETS
    assert [b["requests"] for b in buckets] == [2, 0, 0, 1]
    assert [b["start"] for b in buckets] == [1000.0 + i * BUCKET_S for i in range(4)]
    first = buckets[0]
    assert (first["generated_tokens"], first["prompt_tokens"], first["cached_tokens"],
            first["errors"]) == (10, 40, 16, 1)
    assert abs(first["ttft_sum"] - 0.4) < 1e-9 and first["ttft_count"] == 2
    assert abs(first["tpot_sum"] - 0.3) < 1e-9 and first["tpot_count"] == 2
    assert first["by_tenant"] == {"alice": 1, "bob": 1}
    assert first["by_priority"] == {"1": 1, "0": 1}


def test_history_is_bounded_in_time_and_labels() -> None:
    feed, clock, _ = make()
    for i in range(MAX_METRIC_LABELS + 5):
        feed.record(finished(f"tenant-{i}"))
    assert len(feed.history()["buckets"][-1]["by_tenant"]) == MAX_METRIC_LABELS + 1  # + other
    clock.now += 1000 * BUCKET_S  # a long quiet time: the window, all empty
    buckets = feed.history()["buckets"]
    assert len(buckets) == HISTORY_BUCKETS and not any(b["requests"] for b in buckets)
    for _ in range(3 * HISTORY_BUCKETS):
        clock.now += BUCKET_S
        feed.record(finished())
    assert len(feed.history()["buckets"]) == HISTORY_BUCKETS


def test_a_clock_that_steps_back_keeps_the_latest_bucket() -> None:
    feed, clock, _ = make()
    feed.record(finished())
    clock.now -= 60  # the wall clock was set back
    feed.record(finished())
    assert [b["requests"] for b in feed.history()["buckets"]] == [2]
