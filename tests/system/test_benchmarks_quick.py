"""Every benchmark script runs end to end on its smallest load, in one test (one case per
script): the tables' numbers make sense, the plots are drawn. The benchmarks' own arithmetic is
tested on made-up inputs beside (test_bench_scenarios.py, test_sharing_bench.py,
test_tool_calls_bench.py). The fair-share run compares the calm tenant's TTFTs, so it runs
alone (`serial`); every case starts real processes (`slow`)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from serving_sharing import CLASSES  # noqa: E402

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
QUICK_TIMEOUT_S = 300  # each takes well under 90 s on an idle 2-core machine


def run_quick(script: str, plot_dir: Path, *args: str, netns: bool = False) -> str:
    command = [sys.executable, f"benchmarks/{script}", "--quick", "--plot-dir", str(plot_dir),
               *args]
    if netns:  # loopback only: the SGLang router never reaches for a model hub
        command = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', *command]
    proc = subprocess.run(
        command, cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True,
        text=True, timeout=QUICK_TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def table_rows(stdout: str, header: str) -> list[list[str]]:
    """The cells of the markdown table whose header starts with `header` (no separator row)."""
    lines = stdout[stdout.rindex(header):].splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("| "):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def pair(cell: str) -> tuple[float, float]:
    a, b = cell.split("/")
    return float(a), float(b)


def check_png(path: Path) -> None:
    if HAS_MATPLOTLIB:
        assert path.read_bytes()[:8] == PNG_MAGIC


def rows_by_first_cell(out: str, header: str) -> dict[str, list[str]]:
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


# --- each script on its smallest load -------------------------------------------------------------
def check_chunked_prefill(tmp_path: Path) -> None:
    out = run_quick("chunked_prefill.py", tmp_path)
    rows = table_rows(out, "| --max-num-batched-tokens |")
    assert [int(r[0]) for r in rows] == [32, 1024], rows
    for r in rows:
        ttft_mean, ttft_p99 = pair(r[1])
        itl_p50, itl_p99 = pair(r[2])
        tpot_mean, tpot_p99 = pair(r[3])
        assert 0 < ttft_mean <= ttft_p99, r
        assert 0 < itl_p50 <= itl_p99 and 0 < tpot_mean <= tpot_p99, r
        assert float(r[4]) > 0 and float(r[5]) > 0 and r[6] == "0", r
    assert re.search(r"date: \d{4}-\d\d-\d\d .*CPU count \d+", out)
    assert "command: " in out
    check_png(tmp_path / "chunked_prefill.png")


def check_decode_breakdown(tmp_path: Path) -> None:
    """The step's phases before and after packed weights add up to the step; after is faster
    (the dequantized float32 step reads 5x the bytes and runs ~500 torch ops more)."""
    proc = subprocess.run([sys.executable, "benchmarks/decode_breakdown.py", "--quick"], cwd=ROOT,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True,
                          text=True, timeout=QUICK_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = {r[0]: [float(v.rstrip("x")) for v in r[1:]]
            for r in table_rows(proc.stdout, "| phase (ms per step) |")}
    phases = [rows[p] for p in ("forward", "LM head", "sampling", "the rest")]
    for i in (0, 1):  # before, after
        assert all(p[i] > 0 for p in phases[:3]), rows
        assert sum(p[i] for p in phases) == pytest.approx(rows["**the step**"][i], abs=0.05)
    before, after = rows["**the step**"][:2]
    assert after < before, rows


def check_decode_bandwidth(tmp_path: Path) -> None:
    out = run_quick("decode_bandwidth.py", tmp_path)
    match = re.search(r"measured read bandwidth: ([\d.]+) GB/s .*best run ([\d.]+) GB/s", out)
    assert match, out
    median, best = float(match.group(1)), float(match.group(2))
    assert 0 < median <= best
    rows = table_rows(out, "| system |")
    systems = {r[0] for r in rows}
    assert {"packed", "dequantized"} <= systems, rows
    for r in rows:
        assert int(r[1]) in (1, 2), r
        tok_s, step_ms, mb, achieved = (float(c) for c in r[2:6])
        assert tok_s > 0 and step_ms > 0, r
        # the default model's weights: about 98 MB packed (and for llama.cpp), 540 MB float32
        assert (400 < mb < 700) if r[0] == "dequantized" else (60 < mb < 150), r
        # against the best run: one that shared the CPU with other work only reads slower
        assert 0 < achieved < 2 * best, r
        assert r[7].endswith("x") if "llama.cpp" in systems else r[7] == "-", r
    assert re.search(r"date: \d{4}-\d\d-\d\d .*CPU count \d+", out)
    check_png(tmp_path / "decode_bandwidth.png")


def check_moe(tmp_path: Path) -> None:
    out = run_quick("moe.py", tmp_path)
    rows = [line.split() for line in out.splitlines() if line.startswith(("moe ", "dense "))]
    assert len(rows) == 8, out  # (moe, dense) x batches 1, 4 x (radixrt, HF)
    assert all(float(r[-2]) > 0 and float(r[-1]) > 0 for r in rows), rows
    ratios = re.findall(r"MoE step / dense step \(same active parameters\) = ([\d.]+)", out)
    assert len(ratios) == 4 and all(float(r) > 0 for r in ratios), out  # timing: the benchmark
    assert len(re.findall(r"radixrt / HF = [\d.]+x", out)) == 4
    check_png(tmp_path / "moe.png")


def netns_or_router_missing() -> str | None:
    if importlib.util.find_spec("sglang_router") is None:
        return "the SGLang router is not installed: pip install 'radixrt[router]'"
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True).returncode:
        return "cannot make a network namespace (unshare -n; root?)"
    return None


def check_serving_replicas(tmp_path: Path) -> None:
    missing = netns_or_router_missing()
    if missing:
        pytest.skip(missing)
    out = run_quick("serving.py", tmp_path, "--dp-size", "2", "--systems", "--datasets",
                    "shared-prefix", netns=True)
    rows = {r[0]: r for r in table_rows(out, "| system | dataset |")}
    assert set(rows) == {"radixrt-dp2-cache_aware", "radixrt-dp2-random"}, rows
    hits = {}
    for name, r in rows.items():
        assert r[2] == "8/8" and float(r[4]) > 0, r  # every request served; requests/s
        ttft_mean, ttft_p99 = pair(r[7])
        assert 0 < ttft_mean <= ttft_p99, r
        hits[name] = float(r[11].rstrip("%"))
    # cache_aware keeps each system prompt's questions together: the ideal hit rate, or near it
    assert hits["radixrt-dp2-cache_aware"] >= hits["radixrt-dp2-random"], hits
    check_png(tmp_path / "serving_scale_out.png")


def check_fair_share(tmp_path: Path) -> None:
    """benchmarks/fair_share.py: every request served in every run; with preemption the calm
    tenant's first tokens come sooner than without (the flood's requests run for seconds);
    preemptions happen only for fair share, and only where there are two tenants."""
    out = run_quick("fair_share.py", tmp_path)
    ttft = {(r[0], r[1]): pair(r[2]) for r in table_rows(out, "| load | class |")}
    assert set(ttft) == {("two tenants", "calm"), ("two tenants", "flood"),
                         ("one tenant", "flood")}, ttft
    calm_on, calm_off = ttft[("two tenants", "calm")]
    assert 0 < calm_on < calm_off, ttft
    runs = {r[0]: r for r in table_rows(out, "| load | output tok/s")}
    assert all(min(pair(r[1])) > 0 for r in runs.values()), runs
    one, two = runs["one tenant"], runs["two tenants"]
    assert "'fair_share': 0" in one[5] and "'memory': 0" in one[5]
    # one tenant: the same work (the steps may differ with the order the requests arrived in)
    assert pair(one[4])[0] == pair(one[4])[1] > 0, one
    assert re.search(r"'fair_share': [1-9]", two[5]), runs
    check_png(tmp_path / "fair_share.png")
    check_png(tmp_path / "fair_share_throughput.png")


def check_agent_apis(tmp_path: Path) -> None:
    """benchmarks/agent_apis.py: every session of every API finishes its three turns with a
    tool call first; the later turns read most of their prompt from the cache, and all of it
    but the new input when the conversation is stored (previous_response_id: pinned)."""
    results_path = tmp_path / "agent_apis.json"
    run_quick("agent_apis.py", tmp_path, "--skip-llama", "--json", str(results_path))
    results = json.loads(results_path.read_text())["results"]["radixrt"]
    assert set(results) == {"messages", "responses", "responses-stateful"}
    for api, r in results.items():
        assert r["errors"] == 0 and r["sessions"] == 4, (api, r)
        assert r["later_cached_fraction"] > 0.5, (api, r)
    stateful, stateless = results["responses-stateful"], results["responses"]
    assert stateful["later_prompt_tokens"] == stateless["later_prompt_tokens"]  # same prompts
    assert stateful["later_cached_tokens"] >= stateless["later_cached_tokens"]
    check_png(tmp_path / "agent_apis.png")


def check_json_decode(tmp_path: Path) -> None:
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


def check_sharing(tmp_path: Path) -> None:
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


def check_kv_tiers(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "benchmarks/kv_tiers.py", "--quick", "--plot-dir", str(tmp_path)],
        cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for name in ("kv_tiers.png", "kv_tiers_restart.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", proc.stdout[-2000:]
    main = rows_by_first_cell(proc.stdout, "| configuration |")
    assert set(main) == {"tiers off", "host", "host+disk"}, main
    rate = {name: float(cells[1].rstrip("%")) for name, cells in main.items()}
    assert rate["host"] > 2 * rate["tiers off"] and rate["host+disk"] > 2 * rate["tiers off"]
    assert "disk" in main["host+disk"][7] and "host->disk" in main["host+disk"][8]
    restart = rows_by_first_cell(proc.stdout, "| server |")
    assert set(restart) == {"cold", "warm"}
    assert float(restart["warm"][1].rstrip("%")) > 2 * float(restart["cold"][1].rstrip("%"))


def check_tool_calls(tmp_path: Path) -> None:
    out = tmp_path / "tool_calls.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/tool_calls.py", "--systems", "radixrt",
         "--num-requests", "4", "--concurrency", "4",
         "--json", str(out), "--plot-dir", str(tmp_path)],
        cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = {r["system"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {"radixrt"}, proc.stdout[-2000:]
    assert rows["radixrt"]["valid"] == rows["radixrt"]["requests"] == 4, rows["radixrt"]
    assert rows["radixrt"]["steps_per_request"] > 0
    assert "| radixrt | required |" in proc.stdout
    assert (tmp_path / "tool_calls.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def check_speculative(tmp_path: Path) -> None:
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


def check_gpu_check_dry(tmp_path: Path) -> None:
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
    assert {"tests", "copy", "decode", "cascade", "extend", "window", "packed", "model",
            "total"} <= sections
    assert "FAILED" not in table and "skipped" not in table
    assert rows[-1].startswith("total")
    for row in rows:
        # correct on the interpreter, not just timed
        if row.startswith(("decode", "cascade", "extend", "window", "packed")):
            assert float(row.rsplit("err", 1)[1]) < 1e-3, row


QUICK: dict[str, Callable[[Path], None]] = {
    "chunked_prefill": check_chunked_prefill, "decode_breakdown": check_decode_breakdown,
    "decode_bandwidth": check_decode_bandwidth, "moe": check_moe,
    "serving_replicas": check_serving_replicas, "fair_share": check_fair_share,
    "agent_apis": check_agent_apis, "json_decode": check_json_decode, "sharing": check_sharing,
    "kv_tiers": check_kv_tiers, "tool_calls": check_tool_calls, "speculative": check_speculative,
    "gpu_check_dry": check_gpu_check_dry,
}
SERIAL = {"fair_share"}  # compares timings: run alone


@pytest.mark.slow
@pytest.mark.parametrize("script", [pytest.param(name, marks=pytest.mark.serial)
                                    if name in SERIAL else name for name in QUICK])
def test_each_benchmark_runs_on_its_smallest_load(script: str, tmp_path: Path) -> None:
    QUICK[script](tmp_path)
