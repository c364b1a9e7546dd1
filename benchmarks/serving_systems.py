"""The systems `serving.py` compares: radixrt variants and llama.cpp's OpenAI server, each run
as a subprocess on a free port, health-checked, and stopped with SIGTERM. With --dp-size N,
also N replicas behind the SGLang router with its cache_aware and its random policy; with
--tp-size N, radixrt with N tensor-parallel ranks."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

RADIXRT_SYSTEMS: dict[str, list[str]] = {
    "radixrt-lpm": [],
    "radixrt-fcfs": ["--schedule-policy", "fcfs"],
    "radixrt-no-cache": ["--disable-radix-cache"],
    "radixrt-sglang-api": [],  # the default server, loaded through SGLang's /generate protocol
}
SGLANG_PROTOCOL_SYSTEMS = ("radixrt-sglang-api",)
LLAMA_CPP = "llama.cpp"
SYSTEMS = (*RADIXRT_SYSTEMS, LLAMA_CPP)
ROUTER_POLICIES_COMPARED = ("cache_aware", "random")  # --dp-size N runs both
STARTUP_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
PORTABLE_CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
LLAMA_VENV = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".llama-venv")
# llama.cpp's C++ server, built from the vendored sources of the llama-cpp-python sdist with
# GGML_NATIVE=OFF (see its BUILD.md); used when present, else the venv's Python server
LLAMA_SERVER = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                             "..", "shared", "llama-server", "llama-server"))
LLAMA_SERVER_SLOTS = 8  # -np: requests decoded in parallel
LLAMA_SERVER_CONTEXT = 8192  # -c: shared by the slots


@dataclass(frozen=True)
class System:
    name: str
    command: list[str]
    health_path: str
    extra_body: dict[str, Any]
    stream_usage: bool  # sends stream_options.include_usage and expects usage back
    flushable: bool  # has POST /flush_cache and GET /server_info
    env: dict[str, str] | None = None  # added to the environment of its process
    replicas: int = 1  # > 1: replicas behind the SGLang router (its /workers lists them)
    protocol: str = "openai"  # "sglang": requests as bench_serving's --backend sglang sends


def gguf_path() -> str:
    from radixrt.runtime.models.loader import default_model_path

    return os.path.join(*default_model_path())


def radixrt_system(name: str, args: argparse.Namespace, flags: list[str] | None = None,
                   replicas: int = 1) -> System:
    command = [sys.executable, "-m", "radixrt", "serve", "--max-total-tokens",
               str(args.max_total_tokens), "--log-level", "warning",
               *(RADIXRT_SYSTEMS[name] if flags is None else flags),
               *shlex.split(getattr(args, "radixrt_args", "") or "")]
    health = "/health" if replicas == 1 else "/readiness"  # the router's: replicas registered
    protocol = "sglang" if name in SGLANG_PROTOCOL_SYSTEMS else "openai"
    return System(name, command, health, {"ignore_eos": True}, True, True, replicas=replicas,
                  protocol=protocol)


def scale_out_systems(args: argparse.Namespace) -> list[System]:
    """--tp-size N: radixrt-tpN (the default radixrt with N tensor-parallel ranks); --dp-size N:
    N replicas (each at --tp-size) behind the router, once per policy compared."""
    tp, dp = getattr(args, "tp_size", 1), getattr(args, "dp_size", 1)
    tp_flags = ["--tp-size", str(tp)] if tp > 1 else []
    systems = [radixrt_system(f"radixrt-tp{tp}", args, tp_flags)] if tp > 1 else []
    for policy in ROUTER_POLICIES_COMPARED if dp > 1 else ():
        name = f"radixrt-dp{dp}{f'-tp{tp}' if tp > 1 else ''}-{policy}"
        flags = ["--dp-size", str(dp), "--router-policy", policy, *tp_flags]
        systems.append(radixrt_system(name, args, flags, replicas=dp))
    return systems


def llama_cpp_python(args: argparse.Namespace) -> str | None:
    """The venv's python if llama_cpp.server imports there, else None."""
    venv = args.llama_cpp_venv or LLAMA_VENV
    python = os.path.join(venv, "bin", "python")
    if not os.path.isfile(python):
        return None
    probe = subprocess.run([python, "-c", "import llama_cpp.server"], capture_output=True)
    return python if probe.returncode == 0 else None


def install_llama_cpp() -> None:
    print(f"creating {LLAMA_VENV} and building llama-cpp-python[server] (minutes) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", LLAMA_VENV], check=True)
    with open(os.path.join(LLAMA_VENV, ".gitignore"), "w") as f:
        f.write("*\n")  # keep the venv out of git
    pip = os.path.join(LLAMA_VENV, "bin", "pip")
    # a portable build: -march=native can pick instructions (AMX) that a VM does not allow
    env = {**os.environ, "CMAKE_ARGS": os.environ.get("CMAKE_ARGS", PORTABLE_CMAKE_ARGS)}
    subprocess.run([pip, "install", "llama-cpp-python[server]"], check=True, env=env)


def llama_cpp_system(python: str) -> System:
    command = [python, "-m", "llama_cpp.server", "--model", gguf_path(), "--n_ctx", "4096",
               "--n_threads", str(os.cpu_count() or 1)]
    return System(LLAMA_CPP, command, "/v1/models", {}, False, False)


def llama_server_system(binary: str, context: int = LLAMA_SERVER_CONTEXT) -> System:
    """The C++ llama-server: LLAMA_SERVER_SLOTS parallel slots sharing `context` tokens, a
    thread per core."""
    command = [binary, "-m", gguf_path(), "-c", str(context), "-np",
               str(LLAMA_SERVER_SLOTS), "-t", str(os.cpu_count() or 1), "--host", "127.0.0.1",
               "--threads-http", str(2 * LLAMA_SERVER_SLOTS)]  # its default refused connections
    env = {"LD_LIBRARY_PATH": library_dir(os.path.dirname(binary))}
    return System(LLAMA_CPP, command, "/health", {"ignore_eos": True}, False, False, env)


def library_dir(folder: str) -> str:
    """A folder of the build's shared libraries that the loader can use. A copy of the build that
    turned its symlinks into small files naming their targets (libllama.so.0 holding the text
    "libllama.so.0.5.0") is mended in a temporary folder of real symlinks."""
    links = {}
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if ".so" in name and os.path.isfile(path) and os.path.getsize(path) < 256:
            with open(path, "rb") as f:
                target = f.read().decode(errors="replace").strip()
            if os.path.isfile(os.path.join(folder, target)):
                links[name] = target
    if not links:
        return folder
    mended = tempfile.mkdtemp(prefix="llama-server-libs-")
    for name in os.listdir(folder):
        if ".so" in name:
            target = links.get(name, name)
            while target in links:  # libllama.so -> libllama.so.0 -> libllama.so.0.5.0
                target = links[target]
            os.symlink(os.path.join(folder, target), os.path.join(mended, name))
    return mended


def build_systems(args: argparse.Namespace) -> tuple[list[System], list[str]]:
    """The systems to run, and notes on those skipped."""
    systems = [radixrt_system(name, args) for name in args.systems if name in RADIXRT_SYSTEMS]
    systems += scale_out_systems(args)
    if LLAMA_CPP not in args.systems:
        return systems, []
    binary = args.llama_server or (LLAMA_SERVER if os.access(LLAMA_SERVER, os.X_OK) else None)
    if binary is not None:
        return [*systems, llama_server_system(binary)], []
    if args.install_llama_cpp and llama_cpp_python(args) is None:
        args.llama_cpp_venv = LLAMA_VENV
        install_llama_cpp()
    python = llama_cpp_python(args)
    if python is None:
        note = (f"llama.cpp: skipped (llama_cpp.server is not importable from "
                f"{args.llama_cpp_venv or LLAMA_VENV}); enable it with --llama-cpp-venv DIR "
                "(a venv with llama-cpp-python[server]) or --install-llama-cpp")
        print(note)
        return systems, [note]
    return [*systems, llama_cpp_system(python)], []


# --- server processes --------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_json(url: str, method: str = "GET", timeout: float = 10.0) -> dict[str, Any]:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def wait_healthy(proc: subprocess.Popen[bytes], url: str, log_path: str,
                 replicas: int = 1) -> None:
    """Until url answers with JSON (behind the router: listing every replica healthy)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}):\n{tail(log_path)}")
        try:
            body = http_json(url, timeout=2.0)
            if replicas == 1 or body.get("healthy_workers") == replicas:
                return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"no answer from {url} in {STARTUP_TIMEOUT_S:.0f} s:\n{tail(log_path)}")


def tail(path: str, lines: int = 20) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def running(system: System) -> Iterator[str]:
    """Launch the server, yield its base URL once it answers, SIGTERM it and wait."""
    port = free_port()
    fd, log_path = tempfile.mkstemp(prefix=f"serving-{system.name}-", suffix=".log")
    command = [*system.command, "--port", str(port)]
    print(f"\n$ {shlex.join(command)}   (log: {log_path})", flush=True)
    start = time.perf_counter()
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, **(system.env or {})})
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(proc, base + system.health_path, log_path, system.replicas)
        print(f"{system.name} is up after {time.perf_counter() - start:.1f} s", flush=True)
        yield base
        if proc.poll() is not None:
            raise RuntimeError(f"{system.name} died during the run (exit code "
                               f"{proc.returncode}):\n{tail(log_path)}")
    finally:
        stop(proc)


def replica_urls(base: str) -> list[str]:
    """The replicas behind the router at base, from its /workers."""
    return [worker["url"] for worker in http_json(base + "/workers")["workers"]]


# --- load generation ---------------------------------------------------------------------------
