"""scripts/test_times.py: the durations report of pytest summed by file and phase, largest first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REPORT = """\
============================= slowest durations ==============================
12.50s call     tests/a/test_x.py::test_one[p1]
3.00s setup    tests/a/test_x.py::test_one[p1]
1.50s call     tests/a/test_x.py::test_two
20.00s call     tests/b/test_y.py::test_big
0.25s teardown tests/b/test_y.py::test_big
(3 durations < 0.005s hidden.  Use -vv to show these durations.)
"""


def test_the_table_sums_by_file_and_phase(tmp_path: Path) -> None:
    report = tmp_path / "durations.txt"
    report.write_text(REPORT)
    proc = subprocess.run([sys.executable, "scripts/test_times.py", str(report)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in proc.stdout.splitlines()]
    assert rows[2] == ["`tests/b/test_y.py`", "1", "0", "20", "0", "20", "54.4%"]
    assert rows[3] == ["`tests/a/test_x.py`", "2", "3", "14", "0", "17", "45.6%"]
    assert rows[4] == ["**all**", "3", "", "", "", "37", "100%"]


def test_a_report_without_durations_is_refused(tmp_path: Path) -> None:
    report = tmp_path / "empty.txt"
    report.write_text("3 passed in 1.00s\n")
    proc = subprocess.run([sys.executable, "scripts/test_times.py", str(report)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "--durations=0" in proc.stderr
