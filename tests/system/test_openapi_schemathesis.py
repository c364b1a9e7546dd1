"""The served OpenAPI schema is true: schemathesis (its CLI, as a user runs it) reads
`radixrt serve`'s /openapi.json and fuzzes every operation (examples, boundary coverage, random
fuzzing, and the stateful links from a created response to its id's operations), bounded, with
a fixed seed; no response may be a 5xx, or have a status, content type, headers or body the
schema does not document. A tiny random-weight model keeps each generation cheap (its context
of 160 tokens bounds every output); the server's integrity checker runs after every step and
the server must end with nothing running and no KV held but the stored responses' pins, with
no internal error logged."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_server import API_KEY, Server
from tiny_models import build_tiny

pytestmark = pytest.mark.slow  # starts real processes

CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_headers_conformance,response_schema_conformance")
EXAMPLES = 10  # per operation and phase (the coverage phase adds its boundary cases)
SEED = 1


def settled(srv: Server, timeout: float = 30) -> dict[str, Any]:
    """server_info once nothing runs (stored responses keep their conversations pinned)."""
    deadline = time.monotonic() + timeout
    while True:
        info = srv.info()
        if (info["running"] == 0 and info["kv_private"] == 0) or time.monotonic() > deadline:
            return info
        time.sleep(0.2)


def test_every_operation_answers_as_the_schema_says(tmp_path: Path, tokenizer: Any) -> None:
    folder = tmp_path / "tiny"
    build_tiny("olmo2", folder, tokenizer, seed=3)
    st = shutil.which("st", path=str(Path(sys.executable).parent))
    assert st is not None, "schemathesis is a test dependency (pyproject's [test] extra)"
    with open(tmp_path / "serve.log", "w") as log:
        srv = Server("--model", str(folder), "--max-total-tokens", "4096", "--context-length",
                     "160", "--api-key", API_KEY, "--log-level", "warning",
                     "--check-integrity", log=log)
        try:
            run = subprocess.run(
                [st, "run", f"{srv.url}/openapi.json", "-H", f"Authorization: Bearer {API_KEY}",
                 "--checks", CHECKS, "--max-examples", str(EXAMPLES), "--seed", str(SEED),
                 "--phases", "examples,coverage,fuzzing,stateful", "--workers", "1",
                 "--request-timeout", "120", "--no-color", "--output-truncate", "true"],
                capture_output=True, text=True, timeout=1200)
            info = settled(srv)
            schema = httpx.get(f"{srv.url}/openapi.json", headers=srv.headers()).json()
        finally:
            srv.stop()
    output = run.stdout + run.stderr
    assert info["running"] == 0 and info["kv_private"] == 0, info
    assert info["kv_locked"] == info["pinned_tokens"], info  # nothing else is held
    assert run.returncode == 0, output[-6000:]
    operations = sum(len(item) for item in schema["paths"].values())
    assert f"Tested: {operations}" in output, output[-3000:]  # every operation
    assert "internal error" not in (tmp_path / "serve.log").read_text(errors="replace")
