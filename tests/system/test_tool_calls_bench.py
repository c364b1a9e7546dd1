"""benchmarks/tool_calls.py: its scoring of responses (a valid call, a broken one, no call), its
requests (deterministic, every tool asked for), and, end to end with a real server, that radixrt
with enforcement returns only valid calls in tool_choice="required" (the unenforced server and
llama.cpp run to max_tokens on most requests: too slow for a test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jsonschema
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from tool_calls_workload import SCHEMAS, TOOLS, judge, make_requests  # noqa: E402

GOOD = {
    "get_weather": {"city": "Oslo", "unit": "celsius"},
    "calculator": {"operation": "add", "a": 2, "b": 3.5},
    "search_web": {"query": "black holes", "keywords": ["space"], "max_results": 3},
    "book_hotel": {"guest": {"name": "Ada", "email": "ada@example.com"},
                   "stay": {"city": "Lima", "check_in": "2025-03-04", "nights": 2}, "rooms": 1},
}


def test_schemas_are_valid_and_accept_a_good_call() -> None:
    assert set(GOOD) == set(SCHEMAS) == {t["function"]["name"] for t in TOOLS}
    for name, schema in SCHEMAS.items():
        jsonschema.Draft202012Validator.check_schema(schema)
        out = judge(None, [(name, json.dumps(GOOD[name]))], name)
        assert out.valid and out.right_tool and not out.broken, (name, out.problem)


def test_judge_tells_valid_broken_and_missing_calls() -> None:
    wrong_tool = judge(None, [("calculator", GOOD["calculator"])], "get_weather")
    assert wrong_tool.valid and not wrong_tool.right_tool and not wrong_tool.broken
    out_of_range = judge(None, [("calculator", '{"operation": "add", "a": 1, "b": 1e9}')], "x")
    assert not out_of_range.valid and out_of_range.broken
    assert out_of_range.problem.startswith("arguments do not match the schema")
    bad_date = dict(GOOD["book_hotel"], stay={"city": "Lima", "check_in": "soon", "nights": 2})
    assert judge(None, [("book_hotel", json.dumps(bad_date))], "book_hotel").broken
    assert judge(None, [("get_weather", '{"city": "Oslo"')], "x").problem == \
        "arguments are not JSON"
    assert judge(None, [("send_email", "{}")], "x").problem == "unknown tool 'send_email'"
    opener = judge('<tool_call>\n{"name": "get_weather", "arguments": {"city"', [], "x")
    assert opener.broken and not opener.valid and opener.problem == "call opener in the content"
    text = judge("It is sunny.", [], "get_weather")
    assert not text.valid and not text.broken and text.problem == "no tool call"
    one_bad = judge(None, [("get_weather", GOOD["get_weather"]), ("get_weather", "{}")], "x")
    assert not one_bad.valid and one_bad.broken and one_bad.calls == 2


def test_requests_are_deterministic_and_cover_every_tool() -> None:
    requests = make_requests(8, seed=0)
    assert requests == make_requests(8, seed=0) != make_requests(8, seed=1)
    assert [r.tool for r in requests[:4]] == list(SCHEMAS)
    assert len({r.seed for r in requests}) == 8
    assert all("{" not in r.user for r in requests)  # every placeholder filled


@pytest.mark.slow  # starts real processes
def test_tool_calls_bench_end_to_end(tmp_path) -> None:
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
