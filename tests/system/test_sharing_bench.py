"""benchmarks/serving.py --scenario sharing --quick runs end to end: both servers (features on
and off) answer every request of every class, the table has a row per class, the plot is drawn;
and the load it sends differs between the two runs only in the priority field."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

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


@pytest.mark.slow  # starts real processes
def test_sharing_scenario_quick(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "benchmarks/serving.py", "--scenario", "sharing", "--quick",
         "--plot-dir", str(tmp_path)],
        cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True,
        timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    table = proc.stdout[proc.stdout.rindex("| class |"):].splitlines()
    rows = {line.split("|")[1].strip() for line in table if line.startswith("| ")}
    assert set(CLASSES) <= rows, table
    assert (tmp_path / "sharing.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
