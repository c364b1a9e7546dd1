"""`radixrt serve` as a real process for the tests that need one (tests/system/test_server.py
and the surfaces' end-to-end tests): started on a free port with the flags given, waited for until
/health answers, stopped with SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import httpx
import psutil

API_KEY = "test-key-123"
STARTUP_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args: str, env: dict[str, str] | None = None,
                 log: Any = None) -> None:
        """log: an open file for the server's output (default: a pipe, read at start-up)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "radixrt", "serve", "--port", str(self.port), *args]
        env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", **(env or {}))
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE if log is None
                                     else log, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                output = self.proc.stdout.read() if self.proc.stdout is not None else ""
                raise RuntimeError(f"server exited at start-up:\n{output}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            self.stop()
            raise RuntimeError("server did not become healthy")
        self.children = psutil.Process(self.proc.pid).children(recursive=True)
        self.dsl_port: int | None = None

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {API_KEY}"}

    def info(self) -> dict:
        return httpx.get(f"{self.url}/server_info", headers=self.headers(), timeout=30).json()

    def wait_idle(self, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            info = self.info()
            if info["running"] == 0 and info["kv_private"] == 0 and info["kv_locked"] == 0:
                return info
            if time.monotonic() > deadline:
                raise AssertionError(f"server not idle: {info}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
