"""benchmarks/serving.py --scenario sharing: the load it sends differs between the two runs
(features on and off) only in the priority field. Its run end to end:
test_benchmarks_quick.py."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from serving_sharing import CLASSES, body_of  # noqa: E402


def test_the_two_runs_differ_only_in_priority() -> None:
    for klass in CLASSES:
        on, off = body_of(klass, "on"), body_of(klass, "off")
        assert {k: v for k, v in on.items() if k != "priority"} == off
        assert on.get("priority") == (-1 if klass == "urgent" else None)
    assert body_of("flooded tenant", "on")["user"] != body_of("flood", "on")["user"]
    assert body_of("urgent", "on")["user"] == body_of("flood", "on")["user"]
