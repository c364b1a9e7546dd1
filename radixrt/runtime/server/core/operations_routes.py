"""The operations' routes: /health (no auth, no work), /health_generate (one token through the
whole runtime) and /metrics (Prometheus' text format)."""

from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.responses import JSONResponse, PlainTextResponse, Response

from radixrt.runtime.errors import QueueFull
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.server.core.error_shapes import error_body
from radixrt.runtime.server.core.http_metrics import HTTPMetrics
from radixrt.runtime.server.core.http_openapi import documented
from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager

HEALTH_GENERATE_TIMEOUT_S = 60.0  # /health_generate answers 503 past this


class Status(BaseModel):
    status: Literal["ok"]


def add_operations_routes(app: FastAPI, manager: TokenizerManager, metrics: HTTPMetrics) -> None:
    @app.get("/health", response_model=Status)
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/health_generate", responses=documented(Status, (503,)))
    async def health_generate() -> Response:
        try:
            await asyncio.wait_for(generate_one_token(manager), HEALTH_GENERATE_TIMEOUT_S)
        except QueueFull as exc:  # it works, but takes no more requests now
            return JSONResponse(error_body(f"overloaded: {exc}", "server_error",
                                           code="overloaded"), status_code=503,
                                headers={"Retry-After": str(exc.retry_after_s)})
        except Exception as exc:
            message = f"generation failed: {type(exc).__name__}: {exc}"
            return JSONResponse(error_body(message, "server_error"), status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics", response_class=PlainTextResponse)  # Prometheus' text format
    async def prometheus_metrics() -> Response:
        return Response(await metrics.scrape(), media_type=CONTENT_TYPE_LATEST)


async def generate_one_token(manager: TokenizerManager) -> None:
    ids = manager.encode("Hello")
    params = SamplingParams(max_tokens=1, temperature=0.0)
    stream = manager.generate(ids, params, "health_generate")
    try:
        async for chunk in stream:
            if chunk.finish_reason is not None and chunk.finish_reason.startswith("error"):
                raise RuntimeError(chunk.finish_reason)
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()
