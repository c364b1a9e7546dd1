"""benchmarks/gpu_check.py --dry: the GPU check script runs end to end on the CPU (tiny shapes,
Triton's interpreter), so it is known to work before it meets a GPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # runs the script in a process of its own

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_gpu_check_dry_run() -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.pop("TRITON_INTERPRET", None)  # the script must turn the interpreter on by itself
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--dry"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    table = proc.stdout[proc.stdout.index("=== gpu_check summary") :]
    rows = table.splitlines()[2:]
    sections = {row.split()[0] for row in rows}
    assert {"tests", "copy", "decode", "cascade", "extend", "window", "packed", "mla", "model",
            "total"} <= sections
    assert "FAILED" not in table and "skipped" not in table
    assert rows[-1].startswith("total")
    for row in rows:
        # correct on the interpreter, not just timed
        if row.startswith(("decode", "cascade", "extend", "window", "packed", "mla")):
            assert float(row.rsplit("err", 1)[1]) < 1e-3, row
