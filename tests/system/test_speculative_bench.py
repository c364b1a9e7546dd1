"""benchmarks/speculative.py --quick (radixrt only, small) runs end to end: the tables (one paired
round of on and off too), both plots, and drafts accepted where the output copies the prompt."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # starts real processes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_speculative_bench_quick(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "benchmarks/speculative.py", "--quick", "--skip-llama-server",
         "--requests", "1", "--max-tokens", "24", "--curve-batches", "1", "2", "--pairs", "1",
         "--plot-dir", str(tmp_path)],
        cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for name in ("speculative.png", "speculative_batch.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", proc.stdout[-2000:]
    out = proc.stdout
    table = [line for line in out[out.index("| batch 1 |"):].splitlines() if line.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")]
            for r in table[2:7]}
    assert set(rows) == {"json", "code", "agent", "few-shot", "prose"}, table
    accepted, drafted = rows["json"][header.index("accepted / drafted (radixrt-spec)")].split("/")
    assert 0 < int(accepted) <= int(drafted), table
    assert "| 2 |" in out[out.index("| batch | json on/off"):], out[-2000:]
    paired = out[out.index("| paired rounds |"):].splitlines()
    assert [tuple(c.strip() for c in r.split("|")[1:3]) for r in paired[2:5]] == [
        ("prose", "1"), ("prose", "8"), ("json", "8")], paired
