"""An app (or several sharing one engine) served by uvicorn in a thread of the test process,
and what the in-process HTTP tests do with it: read SSE events, wait for the engine to be idle."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import uvicorn


class Served:
    def __init__(self, engine: Any, ports: list[int]) -> None:
        self.engine = engine
        self.url = f"http://127.0.0.1:{ports[0]}"
        self.auth_url = f"http://127.0.0.1:{ports[1]}"
        self.http = httpx.Client(base_url=self.url, timeout=120)
        self.client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)


def serve_in_thread(apps: list[Any]) -> tuple[list[int], Callable[[], None]]:
    """Run several apps on one event loop in a daemon thread (they share one engine, which must
    only ever be driven from one loop); returns their ports and a stop function."""
    servers = [
        uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                      lifespan="off", loop="asyncio"))
        for app in apps
    ]

    async def main() -> None:
        await asyncio.gather(*(server.serve() for server in servers))

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not all(server.started for server in servers):
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    ports = [server.servers[0].sockets[0].getsockname()[1] for server in servers]

    def stop() -> None:
        for server in servers:
            server.should_exit = True
        thread.join(timeout=30)

    return ports, stop


def sse_events(response: httpx.Response) -> Iterator[Any]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            yield data if data == "[DONE]" else json.loads(data)


def wait_idle(srv: Served, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        info = srv.http.get("/server_info").json()
        if info["running"] == 0 and info["kv_private"] == 0 and info["kv_locked"] == 0:
            return info
        assert time.monotonic() < deadline, f"request not freed: {info}"
        time.sleep(0.1)
