"""OpenAI's Responses API routes: create, get, delete, cancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI, Path, Request
from starlette.responses import Response

from radixrt.runtime.server.core.http_openapi import GENERATION_ERRORS, documented
from radixrt.runtime.server.responses.responses_protocol import (
    RESPONSE_ID_CHARS,
    DeletedResponse,
    ResponseObject,
    ResponsesRequest,
)
from radixrt.runtime.server.responses.responses_serving import ResponsesServing

ResponseId = Annotated[str, Path(min_length=1, max_length=RESPONSE_ID_CHARS)]


def add_responses_routes(app: FastAPI, serving: ResponsesServing) -> None:
    """OpenAI's Responses API; stored responses are the API key's tenant's own."""
    @app.post("/v1/responses", responses=documented(ResponseObject, (*GENERATION_ERRORS, 404),
                                                    stream=True))
    async def create_response(body: ResponsesRequest, request: Request) -> Response:
        return await serving.create(body, request)

    @app.get("/v1/responses/{response_id}", responses=documented(ResponseObject, (404,)))
    async def get_response(response_id: ResponseId, request: Request) -> Response:
        return serving.get(response_id, request)

    @app.delete("/v1/responses/{response_id}", responses=documented(DeletedResponse, (404,)))
    async def delete_response(response_id: ResponseId, request: Request) -> Response:
        return await serving.delete(response_id, request)

    @app.post("/v1/responses/{response_id}/cancel",
              responses=documented(ResponseObject, (400, 404)))
    async def cancel_response(response_id: ResponseId, request: Request) -> Response:
        return await serving.cancel(response_id, request)
