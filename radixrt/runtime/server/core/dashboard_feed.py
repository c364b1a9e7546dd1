"""The dashboard's recent history: what finished requests did over the last minutes, in fixed
time buckets, fed by the manager's on_finish callback (as /metrics is).

A bucket holds the requests that *finished* in its BUCKET_S seconds: their count, prompt, cached
and generated tokens, the sum of their times to first token and of their mean times per output
token, and requests by priority and by tenant. Tokens are counted when their request finishes
(as the Prometheus counters do), so a long request shows in the bucket where it ended. At most
HISTORY_BUCKETS buckets are kept and at most MAX_METRIC_LABELS distinct tenants / priorities per
bucket (the rest as "other"): memory is bounded whatever the traffic.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from radixrt.runtime.config import MAX_METRIC_LABELS
from radixrt.runtime.scheduler.stats import OTHER_LABEL
from radixrt.runtime.tokenizer.request_metrics import RequestMetrics
from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager

BUCKET_S = 5.0
HISTORY_BUCKETS = 72  # six minutes


@dataclass
class Bucket:
    start: float  # wall-clock seconds (time.time) at the bucket's start
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    ttft_sum: float = 0.0
    ttft_count: int = 0
    tpot_sum: float = 0.0  # of each request's mean seconds per output token after the first
    tpot_count: int = 0
    by_priority: dict[str, int] = field(default_factory=dict)
    by_tenant: dict[str, int] = field(default_factory=dict)

    def add(self, m: RequestMetrics) -> None:
        self.requests += 1
        self.errors += any(r.startswith("error") for r in m.finish_reasons)
        self.prompt_tokens += m.prompt_tokens
        self.cached_tokens += m.cached_tokens
        self.generated_tokens += m.completion_tokens
        if m.first_token is not None:
            self.ttft_sum += m.first_token - m.arrival
            self.ttft_count += 1
        if m.inter_token:
            self.tpot_sum += sum(m.inter_token) / len(m.inter_token)
            self.tpot_count += 1
        _count(self.by_priority, str(m.priority))
        _count(self.by_tenant, m.tenant)


def _count(table: dict[str, int], label: str) -> None:
    if label not in table and len(table) >= MAX_METRIC_LABELS:
        label = OTHER_LABEL
    table[label] = table.get(label, 0) + 1


class DashboardFeed:
    """The last HISTORY_BUCKETS buckets of finished requests (see the module's docstring)."""

    def __init__(self, manager: TokenizerManager,
                 clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._buckets: deque[Bucket] = deque(maxlen=HISTORY_BUCKETS)
        manager.on_finish(self.record)

    def record(self, m: RequestMetrics) -> None:
        self._current().add(m)

    def history(self) -> dict[str, Any]:
        """{"bucket_s", "window" (buckets kept at most), "now", "buckets": [...]}, oldest
        first, the empty ones included."""
        self._current()
        return {"bucket_s": BUCKET_S, "window": HISTORY_BUCKETS, "now": self._clock(),
                "buckets": [asdict(b) for b in self._buckets]}

    def _current(self) -> Bucket:
        """The bucket of now, with empty buckets for the quiet time since the last one."""
        start = self._clock() // BUCKET_S * BUCKET_S
        last = self._buckets[-1].start if self._buckets else start - BUCKET_S
        gap = min(int(round((start - last) / BUCKET_S)), HISTORY_BUCKETS)
        for k in range(gap - 1, -1, -1):
            self._buckets.append(Bucket(start=start - k * BUCKET_S))
        return self._buckets[-1]
