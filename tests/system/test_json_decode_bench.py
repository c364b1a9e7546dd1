"""benchmarks/json_decode.py --quick --skip-outlines runs end to end and both radixrt systems
(with and without jump-forward) return only JSON that is valid under the benchmark's schema."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # starts real processes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_json_decode_bench_quick(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "benchmarks/json_decode.py", "--quick", "--skip-outlines",
         "--num-passages", "4", "--plot-dir", str(tmp_path)],
        cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    table = [line for line in proc.stdout[proc.stdout.rindex("| system |") :].splitlines()
             if line.startswith("|")]
    png = tmp_path / "json_decode.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", proc.stdout[-2000:]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")]
            for r in table[2:]}
    assert set(rows) == {"radixrt-jf", "radixrt-no-jf"}, table
    for row in rows.values():
        assert row[header.index("valid")] == "100%", table
        assert row[header.index("outputs")] == "4", table
