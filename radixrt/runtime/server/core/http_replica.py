"""What the SGLang router (`radixrt serve --dp-size N`, runtime/replicas/) reads from a replica,
beyond the OpenAI and native routes it forwards.

sglang-router 0.3.2 registers a worker in this order: GET /health (and an HTTP/2 gRPC probe,
which uvicorn refuses), then GET /server_info, whose `served_model_name` becomes the worker's
model id and whose `model_path` is where it loads a tokenizer from, then GET /model_info
(`model_type`, `architectures`). A `model_path` that is not a local path sends it to the
Hugging Face hub, so a replica reports only a path that exists on this machine: the folder its
tokenizer was loaded from (for a GGUF model, the converted tokenizer in radixrt's cache), or
nothing, and then the router loads no tokenizer at all (it needs none to forward HTTP). With
`--policy power_of_two` it polls GET /get_load every 30 s: a list with one entry per
data-parallel rank, of which it sums `num_tokens`.

Every response of a replica carries `x-radixrt-replica: <name>` (REPLICA_HEADER), so tests and
operators can see where the router sent a request; the router passes the header through.
"""

from __future__ import annotations

import os
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager

# The response header naming the replica that served a request (`radixrt serve --dp-size N`).
REPLICA_HEADER = "x-radixrt-replica"


class ReplicaHeader:
    """Pure ASGI middleware: adds `REPLICA_HEADER: name` to every HTTP response."""

    def __init__(self, app: ASGIApp, name: str) -> None:
        self.app = app
        self.header = (REPLICA_HEADER.encode("latin-1"), name.encode("latin-1"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def named(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), self.header]}
            await send(message)

        await self.app(scope, receive, named)


def local_tokenizer_path(tokenizer: Any) -> str | None:
    """The folder (or file) the tokenizer was loaded from, if it is a path on this machine."""
    path = getattr(tokenizer, "name_or_path", None)
    if not isinstance(path, str) or not path or not os.path.exists(path):
        return None
    return os.path.abspath(path)


def router_metadata(manager: TokenizerManager) -> dict[str, Any]:
    """The /server_info fields the router reads: the model id it lists, and a local path (only
    when there is one: a missing key makes it skip the tokenizer, a name would be fetched)."""
    info: dict[str, Any] = {"served_model_name": manager.model_name}
    path = local_tokenizer_path(manager.tokenizer)
    if path is not None:
        info["model_path"] = path
    return info


def add_router_routes(app: FastAPI, manager: TokenizerManager) -> None:
    @app.get("/model_info")
    @app.get("/get_model_info")  # SGLang's name (its RuntimeEndpoint connects with it)
    async def model_info() -> dict[str, Any]:
        path = local_tokenizer_path(manager.tokenizer)
        return {"model_path": path, "tokenizer_path": path, "is_generation": True,
                "served_model_name": manager.model_name}

    @app.get("/get_load")
    async def get_load() -> list[dict[str, Any]]:
        info = await manager.server_info()
        running, waiting = info.get("running", 0), info.get("waiting", 0)
        return [{
            "dp_rank": 0,
            "num_reqs": running + waiting,
            "num_waiting_reqs": waiting,
            # the KV held by live requests (a cached prefix nobody uses is no load)
            "num_tokens": info.get("kv_locked", 0) + info.get("kv_private", 0),
        }]
