"""SGLang's own code against `radixrt serve`, nothing of it rewritten: its frontend test programs
(sglang/test/test_programs.py of the PyPI package) through its real frontend
(sgl.RuntimeEndpoint -> radixrt's SGLang-protocol /generate), and its load generator
(`python -m sglang.bench_serving --backend sglang`). The package is installed with --no-deps into a
throwaway folder; the test is skipped, saying why, where pip cannot install it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_server import Server

pytestmark = pytest.mark.slow  # installs a package, starts real processes

SGLANG = "sglang==0.5.23"
# what `import sglang` and its frontend need beyond radixrt's own dependencies
FRONTEND_EXTRAS = ("pybase64", "ipython", "traitlets")
DRIVER = Path(__file__).parents[1] / "sglang_frontend_driver.py"

# Every test of test_programs.py but test_image_qa (radixrt runs text-only models) runs; these
# may fail, each only in the way named:
MODEL_ANSWERS = {  # the 135M model answers wrongly: the answer check (an AssertionError) fails
    "test_few_shot_qa": "answers New York for the capital of the United States",
    "test_select": "picks True for 'The capital of France is Pairs'",
    "test_decode_int": "writes 24000... hours in a day (the regex holds, the number is wrong)",
    "test_expert_answer": "names no expert",
    "test_react": "does not reach Finish with the right country",
}
FRONTEND_SIDE = {  # SGLang's frontend itself, with any server
    "test_stream_logprobs": (
        "AssertionError", "SGLang's frontend takes each streamed event's output_token_logprobs "
        "as new since the previous event, but its server (default, non-incremental streaming, "
        "which radixrt speaks) sends them so far; the text so far is what the frontend needs"),
    "test_completion_speculative": (
        "AttributeError", "reads default_backend.token_usage, which only SGLang's OpenAI backend "
        "has (its Runtime and RuntimeEndpoint do not)"),
    "test_parallel_encoding": (
        "Timeout", "the frontend sends /concate_and_append_request its states' ids, which it "
        "never sent with any /generate (interpreter.py keeps the sid local), so no server can "
        "resolve them: radixrt answers 404 naming them and the frontend's thread dies, leaving "
        "the program waiting"),
}
PROGRAMS = ("test_few_shot_qa", "test_mt_bench", "test_select", "test_decode_int",
            "test_decode_json_regex", "test_decode_json", "test_expert_answer", "test_tool_use",
            "test_react", "test_parallel_decoding", "test_parallel_encoding:20", "test_stream",
            "test_stream_logprobs", "test_regex", "test_dtype_gen", "test_completion_speculative",
            "test_chat_completion_speculative", "test_gen_min_new_tokens")


@pytest.fixture(scope="module")
def sglang_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("sglang")
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target",
           str(target), SGLANG, *FRONTEND_EXTRAS]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.skip(f"pip could not install {SGLANG}: {done.stderr.strip()[-500:]}")
    return target


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    # No --check-integrity: these programs decode ~2000 tokens in ~1000 requests, and the full
    # check after every step made the run several times slower (past the per-program limit);
    # the end checks the KV accounts instead (no KV left held, every page accounted for).
    srv = Server("--max-total-tokens", "8192", "--log-level", "warning")
    yield srv
    srv.stop()


def test_sglang_test_programs_through_sglang_frontend(sglang_path: Path, server: Server) -> None:
    env = dict(os.environ, PYTHONPATH=str(sglang_path), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, str(DRIVER), server.url, *PROGRAMS], env=env,
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(results) == len(PROGRAMS)
    unexpected = {}
    for name, result in results.items():
        if result.get("ok"):
            continue
        if name in MODEL_ANSWERS and result["error"].startswith("AssertionError"):
            continue
        kind = FRONTEND_SIDE.get(name, ("", ""))[0]
        if kind and result["error"].startswith(kind):
            continue
        unexpected[name] = result
    assert not unexpected, json.dumps(unexpected, indent=1)
    passed = [n for n, r in results.items() if r.get("ok")]
    assert len(passed) >= len(PROGRAMS) - len(MODEL_ANSWERS) - len(FRONTEND_SIDE), passed
    info = server.wait_idle()
    assert info["kv_free"] + info["kv_evictable"] == info["kv_total"], info
