"""Anthropic's Messages API routes (errors in its shape, see core/error_shapes.py)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.responses import Response

from radixrt.runtime.server.anthropic.anthropic_protocol import (
    CountTokensOut,
    CountTokensRequest,
    MessageOut,
    MessagesRequest,
)
from radixrt.runtime.server.anthropic.anthropic_serving import AnthropicServing
from radixrt.runtime.server.core.http_openapi import GENERATION_ERRORS, documented


def add_anthropic_routes(app: FastAPI, serving: AnthropicServing) -> None:
    """Anthropic's Messages API (the anthropic-version header is accepted, whatever it says)."""
    @app.post("/v1/messages", responses=documented(MessageOut, GENERATION_ERRORS, stream=True,
                                                   anthropic=True))
    async def messages(body: MessagesRequest, request: Request) -> Response:
        return await serving.messages(body, request)

    @app.post("/v1/messages/count_tokens", responses=documented(CountTokensOut, (400,),
                                                                anthropic=True))
    async def count_tokens(body: CountTokensRequest) -> Response:
        return await serving.count_tokens(body)
