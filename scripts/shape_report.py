"""The codebase's shape, counted (issue "One way in"):

- SamplingParams constructions per request on the server path, counted in each real process of
  `radixrt serve` (tokenizer, scheduler, worker): every run of `SamplingParams.__post_init__`
  (a construction, a msgspec decode or a `with_` copy) is seen by a profile hook that a
  `sitecustomize` module installs in each process; one request of each API is sent and the
  counts before and after are compared;
- import circles inside radixrt/ (tests/system/test_layering.py's strongly connected
  components);
- README.md's line count;
- source modules without a test file found by name (tests/layout.py's rule).

    python scripts/shape_report.py            # everything (starts a server: ~1 minute)
    python scripts/shape_report.py --no-server  # the static counts only
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 120.0
SETTLE_S = 1.0  # after a reply, for the processes' last constructions (the request's end)
COUNT_DIR_ENV = "SHAPE_REPORT_COUNT_DIR"
# Installed in every process of the server (PYTHONPATH): counts runs of SamplingParams'
# __post_init__ and writes "<process name> <count>" to COUNT_DIR/<pid> after each one.
SITECUSTOMIZE = f'''
import multiprocessing, os, sys, threading

_OUT = os.environ.get("{COUNT_DIR_ENV}")
_FILE = os.path.join("runtime", "sampling_params.py")
_state = {{"count": 0}}


def _profile(frame, event, arg):
    code = frame.f_code
    if event == "call" and code.co_name == "__post_init__" and code.co_filename.endswith(_FILE):
        _state["count"] += 1
        with open(os.path.join(_OUT, str(os.getpid())), "w") as f:
            f.write(f"{{multiprocessing.current_process().name}} {{_state['count']}}\\n")


if _OUT:
    sys.setprofile(_profile)
    threading.setprofile(_profile)
'''
REQUESTS = {  # path -> body: one request of each API, 4 tokens each
    "/v1/completions": {"model": "default", "prompt": "The capital of France is",
                        "max_tokens": 4, "temperature": 0},
    "/v1/chat/completions": {"model": "default", "max_tokens": 4, "temperature": 0,
                             "messages": [{"role": "user", "content": "Hi"}]},
    "/generate": {"text": "The capital of France is",
                  "sampling_params": {"max_tokens": 4, "temperature": 0}},
}
PROCESS_NAMES = {"MainProcess": "tokenizer", "radixrt-scheduler": "scheduler",
                 "radixrt-worker": "worker"}


def load(path: Path) -> ModuleType:
    """A module of tests/ (the layering test, the layout rule), loaded by its path."""
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def static_counts() -> dict[str, Any]:
    layering = load(ROOT / "tests" / "system" / "test_layering.py")
    layout = load(ROOT / "tests" / "layout.py")
    circles = layering.import_circles(ROOT / "radixrt")
    untested = layout.untested_modules()
    modules = layout.source_modules()
    return {"import_circles": circles, "readme_lines": len((ROOT / "README.md").read_text()
                                                            .splitlines()),
            "modules": len(modules), "without_test_file": untested}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_counts(folder: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for f in folder.iterdir():
        text = f.read_text().split()
        if len(text) == 2:
            name = PROCESS_NAMES.get(text[0], text[0])
            counts[name] = counts.get(name, 0) + int(text[1])
    return counts


def post(port: int, path: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
        resp.read()


def wait_healthy(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError("the server did not start")


def constructions_per_request() -> dict[str, dict[str, int]]:
    """path -> {process: SamplingParams constructions that one request caused there}."""
    with tempfile.TemporaryDirectory() as tmp:
        hook, counts = Path(tmp) / "hook", Path(tmp) / "counts"
        hook.mkdir()
        counts.mkdir()
        (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
        port = free_port()
        env = dict(os.environ, HF_HUB_OFFLINE="1", **{COUNT_DIR_ENV: str(counts)},
                   PYTHONPATH=os.pathsep.join([str(hook), str(ROOT),
                                               os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.Popen([sys.executable, "-m", "radixrt", "serve", "--port", str(port),
                                 "--log-level", "warning"], env=env, cwd=ROOT)
        try:
            wait_healthy(port, proc)
            out: dict[str, dict[str, int]] = {}
            for path, body in REQUESTS.items():
                post(port, path, body)  # warm: the first request of a kind may build more
                time.sleep(SETTLE_S)
                before = read_counts(counts)
                post(port, path, body)
                time.sleep(SETTLE_S)
                after = read_counts(counts)
                out[path] = {name: after.get(name, 0) - before.get(name, 0)
                             for name in ("tokenizer", "scheduler", "worker")}
            return out
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-server", action="store_true",
                        help="skip the count that starts a server")
    args = parser.parse_args()
    report = static_counts()
    print(f"import circles in radixrt/: {len(report['import_circles'])}")
    for circle in report["import_circles"]:
        print("  " + " -> ".join(circle))
    print(f"README.md: {report['readme_lines']} lines")
    print(f"modules without a test file found by name: {len(report['without_test_file'])} "
          f"of {report['modules']}")
    for module in report["without_test_file"]:
        print(f"  {module}")
    if args.no_server:
        return
    print("SamplingParams constructions per request (radixrt serve; per process):")
    for path, counts in constructions_per_request().items():
        total = sum(counts.values())
        parts = ", ".join(f"{name} {n}" for name, n in counts.items())
        print(f"  POST {path}: {total} ({parts})")


if __name__ == "__main__":
    main()
