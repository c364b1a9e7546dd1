"""Users run scripts, not pytest: real user code run the way users run it, `python script.py` in a
fresh interpreter with no `if __name__ == "__main__":` guard (and `python -c`, and a script on
standard input, which is how notebooks and REPLs look to multiprocessing). Every helper process
radixrt starts must come up without re-running the user's script, and none may outlive its owner,
whether it exits normally, raises, or is killed.

- Every Python example of README.md and docs/ runs as a script: those that talk to `radixrt
  serve` on 127.0.0.1:30000 against a real server the test starts (on a free port, written into
  the script), those that start an Engine or a Runtime as they are. An example that needs what a
  test machine cannot have (two replicas' DSL ports, a Kubernetes service) says so on its first
  line (`# needs: ...`) and is only compiled.
- The Engine with every kind of constraint, a disk KV tier named by its folder alone (sized from
  its free space), and speculative decoding on (the default), in one script.
- The issue's five lines as `python -c` and from standard input.
- Helper lifetimes: an Engine script with a tensor-parallel rank and a grammar compile process
  that returns, raises, or is SIGKILLed leaves none of them behind; nor does a SIGKILLed server.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow  # real interpreters, real servers

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOCS_PORT = "127.0.0.1:30000"  # where the pages' examples expect `radixrt serve`
NEEDS = "# needs:"
SCRIPT_TIMEOUT_S = 300
GONE_WITHIN_S = 20.0  # a helper's lifeline grace (10 s) and a margin

FIVE_LINES = (  # the script, as a user wrote it
    "import radixrt\n"
    "eng = radixrt.Engine(max_total_tokens=2048)\n"
    'out = eng.generate(["Write one word:"], '
    'radixrt.SamplingParams(regex=r"[a-z]{2,12}", max_tokens=12))[0]\n'
    "print(out.text)\n")

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def examples() -> list[tuple[str, str]]:
    """(page#index, code) of every ```python block of the README and docs/."""
    found = []
    for page in PAGES:
        for i, code in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S)):
            found.append((f"{page.relative_to(ROOT).as_posix()}#{i}", code))
    return found


def run_script(path: Path, timeout: float = SCRIPT_TIMEOUT_S) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, str(path)], cwd=path.parent, env=env, text=True,
                          capture_output=True, timeout=timeout)


def assert_ran(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "bootstrapping phase" not in result.stderr


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """`radixrt serve` with the defaults the pages assume; its host:port."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixrt", "serve", "--port", str(port), "--log-level", "warning",
         "--max-total-tokens", "8192"],
        env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    import httpx

    deadline = time.monotonic() + 300
    while True:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                break
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.5)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.mark.parametrize("name,code", examples(), ids=[name for name, _ in examples()])
def test_every_python_example_of_the_pages_runs_as_a_script(name, code, tmp_path, request):
    if code.startswith(NEEDS):
        compile(code, name, "exec")  # at least it is Python
        pytest.skip(code.splitlines()[0])
    if DOCS_PORT in code:
        code = code.replace(DOCS_PORT, request.getfixturevalue("server"))
    script = tmp_path / "example.py"
    script.write_text(code)
    assert_ran(run_script(script))


def test_an_engine_script_with_every_constraint_tiers_and_speculation(tmp_path):
    """One script as a user writes it: the regex, a JSON schema, choices, a GBNF grammar and a
    tool call on an Engine whose disk tier is a folder alone, speculation on by default."""
    script = tmp_path / "constraints.py"
    script.write_text(textwrap.dedent(f"""\
        import json
        import radixrt
        from radixrt import SamplingParams

        eng = radixrt.Engine(max_total_tokens=4096, disk_cache_dir={str(tmp_path / "kv")!r})
        prompt = "Answer briefly:"
        # bounded: a sampled integer always ends within max_tokens
        schema = {{"type": "object", "required": ["n"],
                  "properties": {{"n": {{"type": "integer", "minimum": 0, "maximum": 999}}}}}}
        tools = {{"format": "hermes", "mode": "required", "tools": [{{"name": "add",
                 "parameters": {{"type": "object", "properties": {{"a": {{"type": "integer"}}}},
                                "required": ["a"]}}}}]}}
        asks = dict(regex=SamplingParams(regex=r"[a-z]{{2,12}}", max_tokens=12),
                    json_schema=SamplingParams(json_schema=schema, max_tokens=32),
                    choices=SamplingParams(choices=["yes", "no"]),
                    ebnf=SamplingParams(ebnf='root ::= "x" [0-9]+', max_tokens=6),
                    tool_calls=SamplingParams(tool_calls=json.dumps(tools), max_tokens=48))
        outs = eng.generate([prompt] * len(asks), list(asks.values()))
        again = eng.generate(prompt + " " + outs[0].text, SamplingParams(max_tokens=8))[0]
        print(json.dumps({{"texts": dict(zip(asks, [o.text for o in outs])),
                          "stats": {{k: v for k, v in eng.stats().items()
                                    if k in ("kv_tiers", "speculative_algorithm")}},
                          "again": again.text}}))
    """))
    try:
        result = run_script(script)
    finally:
        shutil.rmtree(tmp_path / "kv", ignore_errors=True)  # preallocated: gigabytes
    assert_ran(result)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    texts = report["texts"]
    assert re.fullmatch(r"[a-z]{2,12}", texts["regex"])
    assert isinstance(json.loads(texts["json_schema"])["n"], int)
    assert texts["choices"] in ("yes", "no")
    assert re.fullmatch(r"x[0-9]+", texts["ebnf"])
    assert "<tool_call>" in texts["tool_calls"] and '"add"' in texts["tool_calls"]
    assert report["stats"]["kv_tiers"]["disk"]["tokens"] > 0  # sized from the free space
    assert report["stats"]["speculative_algorithm"] == "radix"


@pytest.mark.parametrize("how", ["-c", "stdin"])
def test_the_same_lines_from_python_c_and_standard_input(how, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    argv, stdin = ([sys.executable, "-c", FIVE_LINES], None) if how == "-c" else (
        [sys.executable, "-"], FIVE_LINES)
    result = subprocess.run(argv, input=stdin, cwd=tmp_path, env=env, text=True,
                            capture_output=True, timeout=SCRIPT_TIMEOUT_S)
    assert_ran(result)
    assert re.fullmatch(r"[a-z]{2,12}", result.stdout.strip())


def wait_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + GONE_WITHIN_S
    while True:
        alive = [pid for pid in pids if psutil.pid_exists(pid)
                 and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return
        if time.monotonic() > deadline:
            for pid in alive:
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).kill()
            pytest.fail(f"helper processes {alive} outlived their owner")
        time.sleep(0.2)


@pytest.mark.parametrize("ending", ["returns", "raises", "killed"])
def test_no_helper_outlives_its_engine(ending, tmp_path):
    """An Engine with a tensor-parallel rank and a grammar compile process, never closed: the
    script returns, raises, or is SIGKILLed while it waits; its helpers go with it."""
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent(f"""\
        import os, sys, time
        import psutil
        import radixrt

        eng = radixrt.Engine(tp_size=2, max_total_tokens=1024)
        eng.generate("Hi", radixrt.SamplingParams(regex="[a-z]{{3}}", max_tokens=4))
        kids = psutil.Process().children(recursive=True)
        print(" ".join(str(p.pid) for p in kids), flush=True)
        if {ending!r} == "raises":
            raise RuntimeError("the user's script fails")
        if {ending!r} == "killed":
            time.sleep(600)
    """))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) >= 2, (line, owner.stderr.read() if owner.poll() is not None else "")
        if ending == "killed":
            owner.send_signal(signal.SIGKILL)
        code = owner.wait(timeout=SCRIPT_TIMEOUT_S)
        assert code == {"returns": 0, "raises": 1, "killed": -signal.SIGKILL}[ending]
        wait_gone(pids)
    finally:
        if owner.poll() is None:
            owner.kill()


def test_no_process_outlives_a_killed_server():
    """`radixrt serve` SIGKILLed: its scheduler and worker processes end on their own."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixrt", "serve", "--port", str(port), "--log-level",
         "warning", "--max-total-tokens", "1024"], env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        launcher = psutil.Process(proc.pid)
        deadline = time.monotonic() + 120
        while len(launcher.children()) < 2:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        pids = [p.pid for p in launcher.children(recursive=True)]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        wait_gone(pids)
    finally:
        if proc.poll() is None:
            proc.kill()
