"""benchmarks/chunked_prefill.py, benchmarks/decode_bandwidth.py, decode_breakdown.py,
benchmarks/moe.py,
benchmarks/agent_apis.py,
benchmarks/fair_share.py and serving.py's replica runs:
their arithmetic on made-up inputs, and each one's --quick run end to end (the table's numbers
make sense, the plot is drawn when matplotlib is there)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from chunked_prefill import summarize  # noqa: E402
from decode_bandwidth import StepBytes  # noqa: E402
from serving_requests import RequestResult  # noqa: E402

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


# --- arithmetic ----------------------------------------------------------------------------------
def test_step_bytes_count_the_head_once_and_the_kv_per_sequence() -> None:
    sb = StepBytes(layers=1000, final_norm=10, lm_head=500, embed_row=5, tied=True,
                   kv_per_token=2)
    assert sb.total(1, 0) == 1515
    assert sb.total(1, 100) == 1515 + 200
    assert sb.total(4, 100) == 1510 + 4 * (5 + 200)  # weights once, rows and KV per sequence


def test_summarize_splits_decoders_and_long_prompts() -> None:
    decoder = RequestResult(ok=True, output_tokens=11, ttft=0.1, e2e=1.1, itls=[0.1] * 10)
    long = RequestResult(ok=True, output_tokens=2, ttft=2.0, e2e=2.1, itls=[0.1])
    failed = RequestResult(error="boom")
    row = summarize(64, {"decoder": [decoder, decoder], "long": [long, failed]}, 5.0)
    assert row["ttft_mean"] == pytest.approx(2000.0)  # the long prompts' only
    assert row["itl_p99"] == pytest.approx(100.0)  # the decoders' only
    assert row["tpot_mean"] == pytest.approx(100.0) and row["tpot_p99"] == pytest.approx(100.0)
    assert row["failed"] == 1 and row["errors"] == ["boom"]
    assert row["decode_tok_s"] == pytest.approx(22 / 5.0)


# --- end to end ----------------------------------------------------------------------------------
@pytest.mark.slow  # starts a server per budget
def test_chunked_prefill_quick(tmp_path: Path) -> None:
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


@pytest.mark.slow  # loads the model in its own process, twice, and starts llama-server
def test_decode_breakdown_quick() -> None:
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


@pytest.mark.slow  # loads the model in its own processes
def test_decode_bandwidth_quick(tmp_path: Path) -> None:
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


@pytest.mark.slow  # builds two random checkpoints and runs both systems on each
def test_moe_quick(tmp_path: Path) -> None:
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


@pytest.mark.slow  # two deployments of two replicas and the router
def test_serving_replicas_quick(tmp_path: Path) -> None:
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


@pytest.mark.slow  # two servers, four loads
@pytest.mark.serial  # compares the calm tenant's TTFTs: runs alone
def test_fair_share_quick(tmp_path: Path) -> None:
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


@pytest.mark.slow  # a server, three APIs
def test_agent_apis_quick(tmp_path: Path) -> None:
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
    # the stored conversation loses nothing against resending it; the two runs batch their
    # sessions differently, so a greedy reply may end on another token (float rounding of
    # another batch) and its text re-tokenized may leave the cached path one token early:
    # a token per later turn either way (CI saw 7260 against 7261); a pin or a stored
    # conversation that does not hit loses a whole turn's prompt, hundreds of tokens
    later_turns = 2 * stateful["sessions"]
    assert stateful["later_cached_tokens"] >= stateless["later_cached_tokens"] - later_turns
    check_png(tmp_path / "agent_apis.png")


@pytest.mark.slow  # a process that builds a model, adapters and a merged model, and runs them
def test_lora_quick(tmp_path: Path) -> None:
    """benchmarks/lora.py: every configuration decodes; the merged model and the base read the
    same bytes; adapters read more, more adapters more."""
    results_path = tmp_path / "lora.json"
    out = run_quick("lora.py", tmp_path, "--json", str(results_path))
    results = json.loads(results_path.read_text())["results"]
    assert list(results) == ["base", "merged", "1 adapter", "2 mixed"], out
    assert all(r["tok_s"] > 0 and r["step_ms"] > 0 and r["ttft_p50_s"] > 0
               for r in results.values()), results
    assert results["merged"]["bytes_bound"] == results["base"]["bytes_bound"] == 1.0
    assert 1.0 < results["1 adapter"]["bytes_bound"] < results["2 mixed"]["bytes_bound"]
    assert "| 2 mixed |" in out
    check_png(tmp_path / "lora.png")


@pytest.mark.slow  # a process that builds a model and runs three systems on it
def test_embeddings_quick(tmp_path: Path) -> None:
    """benchmarks/embeddings.py: every system embeds every workload; radixrt's vectors equal
    sentence-transformers'; with the cache on the shared instruction is read from the cache,
    with it off nothing is."""
    results_path = tmp_path / "embeddings.json"
    out = run_quick("embeddings.py", tmp_path, "--json", str(results_path))
    saved = json.loads(results_path.read_text())
    results = saved["results"]
    systems = ["radixrt", "radixrt (no cache)", "sentence-transformers"]
    assert list(results) == ["shared instruction", "documents alone"], out
    for work, by_system in results.items():
        assert list(by_system) == systems, (work, by_system)
        assert all(r["inputs_per_s"] > 0 and r["tokens_per_s"] > 0 for r in by_system.values())
        assert all(by_system[s]["min_cosine"] > 0.9999 for s in systems[:2]), by_system
    assert saved["min_cosine"] > 0.9999, saved
    shared = results["shared instruction"]
    assert shared["radixrt"]["cached_tokens"] > 0, shared
    assert shared["radixrt (no cache)"]["cached_tokens"] == 0, shared
    assert shared["radixrt"]["prompt_tokens"] == shared["radixrt (no cache)"]["prompt_tokens"]
    assert len(table_rows(out, "| workload | system |")) == 6, out
    assert "radixrt / sentence-transformers = " in out and "command: " in out
    check_png(tmp_path / "embeddings.png")


def test_observability_quick(tmp_path: Path) -> None:
    """benchmarks/observability.py: the load runs in every configuration, the dashboards'
    polls are answered, the traced server's spans reach the collector, the tree view is timed."""
    out = run_quick("observability.py", tmp_path, "--requests", "8", "--max-tokens", "8",
                    "--pages", "2")
    rows = table_rows(out, "| configuration |")
    assert [r[0] for r in rows] == ["off", "dashboard", "traced"], out
    assert all(float(r[1]) > 0 and float(r[3]) > 0 for r in rows), rows
    polls = re.search(r"dashboard polls answered: (\d+)", out)
    posts = re.search(r"collector: (\d+) OTLP posts", out)
    assert polls and int(polls.group(1)) > 0 and posts and int(posts.group(1)) > 0, out
    assert re.search(r"/debug/radix_tree over the load's tree \(\d+ nodes\): [\d.]+ ms", out)
    check_png(tmp_path / "observability.png")


def test_latent_attention_quick(tmp_path: Path) -> None:
    """benchmarks/latent_attention.py: the latent model's pool holds more tokens in the same
    bytes and caches more of the prompts; both systems decode on both models."""
    out = run_quick("latent_attention.py", tmp_path)
    rows = {(r[0], r[1]): r for r in table_rows(out, "| model | system | KV bytes")}
    mla, gqa = rows[("mla", "radixrt")], rows[("gqa", "radixrt")]
    assert int(mla[2]) * 4 == int(gqa[2]) and int(mla[3]) // 4 - int(gqa[3]) in (0, 1), rows
    assert float(mla[4].rstrip("%")) > float(gqa[4].rstrip("%")), rows
    speeds = table_rows(out, "| model | batch | system | tokens/s |")
    assert len(speeds) == 4 and all(float(r[3]) > 0 for r in speeds), speeds
    assert len(re.findall(r"radixrt (?:TTFT )?/ HF = [\d.]+x", out)) == 4  # TTFT, decode per model
    check_png(tmp_path / "latent_attention.png")


def test_vision_quick(tmp_path: Path) -> None:
    """benchmarks/vision.py: every turn after the first finds the screenshot and the turns
    before in the tree (cached tokens), and every system answers every turn."""
    out = run_quick("vision.py", tmp_path)
    rows = table_rows(out, "| turn | prompt tokens |")
    assert [r[0] for r in rows] == ["1", "2", "3"], out
    assert int(rows[0][2]) == 0 and all(int(r[2]) > int(rows[0][1]) for r in rows[1:]), rows
    assert all(float(cell) > 0 for r in rows for cell in r[3:]), rows
    assert re.search(r"turn 2\+ / turn 1 TTFT, cache on: [\d.]+x", out)
    assert re.search(r"radixrt encoded 1 image\(s\)", out), out
    check_png(tmp_path / "vision.png")
