"""Runtime: start a local radixrt runtime (the tokenizer/scheduler/worker trio) and connect to it.

`with Runtime(model="default", max_total_tokens=8192) as rt:` runs `radixrt serve` in a child
process with those options as flags, talks to it over ZeroMQ on 127.0.0.1, and stops it on exit
(also when the Runtime object is garbage-collected or the interpreter exits). It is itself the
endpoint programs run on; `runtime.endpoint` (SGLang's name for it) is the runtime.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import weakref
from typing import Any

from radixrt.frontend.backends.runtime_endpoint import RuntimeEndpoint
from radixrt.frontend.lang.backend import BackendError
from radixrt.runtime.config import DRAIN_TIMEOUT_S, STARTUP_TIMEOUT_S

_LOG_TAIL_CHARS = 4000


class Runtime(RuntimeEndpoint):
    def __init__(self, model: str = "default", *, startup_timeout: float = STARTUP_TIMEOUT_S,
                 model_path: str | None = None, launch_timeout: float | None = None,
                 **server_config: Any) -> None:
        """server_config: `radixrt serve` options by their flag names with underscores
        (max_total_tokens=4096, schedule_policy="lpm", disable_radix_cache=True, ...).
        model_path, launch_timeout: SGLang's names for `model`, `startup_timeout`."""
        if launch_timeout is not None:
            startup_timeout = launch_timeout
        if model_path is not None:
            if model != "default":
                raise TypeError("give model= or SGLang's model_path=, not both")
            model = model_path
        self.port, dsl_port = _free_port(), _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "radixrt", "serve", "--model", model, "--host", "127.0.0.1",
               "--port", str(self.port), "--dsl-port", str(dsl_port), "--exit-with-parent",
               *_flags(server_config)]
        self.log_path = tempfile.mkstemp(prefix="radixrt-runtime-", suffix=".log")[1]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self._stop = weakref.finalize(self, _stop_process, self.proc)
        try:
            super().__init__(f"tcp://127.0.0.1:{dsl_port}", connect_timeout=startup_timeout,
                             alive=lambda: self.proc.poll() is None,
                             api_key=server_config.get("api_key"))
        except BackendError:
            self._stop()
            raise BackendError(
                f"the runtime did not start (exit code {self.proc.returncode}); its log "
                f"{self.log_path} ends with:\n{self.log_tail()}"
            ) from None

    @property
    def endpoint(self) -> Runtime:
        """SGLang's `runtime.endpoint` (its HTTP client of the runtime): here the runtime is the
        endpoint itself."""
        return self

    def log_tail(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-_LOG_TAIL_CHARS:]

    def close(self) -> None:
        """Stop the runtime; its log file is removed when it stopped cleanly."""
        super().close()
        self._stop()
        if self.proc.returncode == 0:
            with contextlib.suppress(OSError):
                os.remove(self.log_path)

    shutdown = close  # SGLang's name

    def __enter__(self) -> Runtime:
        return self


def _flags(config: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for name, value in config.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is not None and value is not False:
            out += [flag, str(value)]
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=DRAIN_TIMEOUT_S + 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
