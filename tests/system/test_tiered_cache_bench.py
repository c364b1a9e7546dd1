"""benchmarks/kv_tiers.py --quick runs end to end: both tables, both plots; the tiers raise the
hit rate over tiers off, and a warm restart's first requests hit the disk tier where a cold
server's miss."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # starts real servers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rows(out: str, header: str) -> dict[str, list[str]]:
    """The rows of the table that starts at `header` (its lines up to the first that is not
    a table line), by their first cell."""
    table = []
    for line in out[out.index(header):].splitlines():
        if not line.startswith("|"):
            break
        table.append(line)
    parsed = {}
    for line in table[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        parsed[cells[0]] = cells
    return parsed


def test_kv_tiers_bench_quick(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "benchmarks/kv_tiers.py", "--quick", "--plot-dir", str(tmp_path)],
        cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for name in ("kv_tiers.png", "kv_tiers_restart.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", proc.stdout[-2000:]
    main = rows(proc.stdout, "| configuration |")
    assert set(main) == {"tiers off", "host", "host+disk"}, main
    rate = {name: float(cells[1].rstrip("%")) for name, cells in main.items()}
    assert rate["host"] > 2 * rate["tiers off"] and rate["host+disk"] > 2 * rate["tiers off"]
    assert "disk" in main["host+disk"][7] and "host->disk" in main["host+disk"][8]
    restart = rows(proc.stdout, "| server |")
    assert set(restart) == {"cold", "warm"}
    assert float(restart["warm"][1].rstrip("%")) > 2 * float(restart["cold"][1].rstrip("%"))
