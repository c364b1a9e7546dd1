"""The HTTP routes, each with the responses it documents in the served OpenAPI schema
(http_openapi.documented): OpenAI's (completions, chat, models, Responses), Anthropic's
(messages, count_tokens), the native ones (/generate, pins, abort, flush, server_info) and the
operations' (health, metrics). The handlers are the servings'."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Path, Request
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field
from starlette.responses import JSONResponse, PlainTextResponse, Response

from radixrt.runtime.config import INT64_MAX, INT64_MIN
from radixrt.runtime.errors import QueueFull
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.server.anthropic_protocol import (
    CountTokensOut,
    CountTokensRequest,
    MessageOut,
    MessagesRequest,
)
from radixrt.runtime.server.anthropic_serving import AnthropicServing
from radixrt.runtime.server.chat_tool_plan import ChatFeatures
from radixrt.runtime.server.dsl_scoring import start_text
from radixrt.runtime.server.http_metrics import HTTPMetrics
from radixrt.runtime.server.http_native import NativeServing, RenewPinsBody, UnpinBody
from radixrt.runtime.server.http_openapi import GENERATION_ERRORS, documented
from radixrt.runtime.server.http_replica import router_metadata
from radixrt.runtime.server.native_protocol import (
    AbortRequestBody,
    ConcatAppendBody,
    ConcatAppended,
    GenerateRequest,
)
from radixrt.runtime.server.openai_protocol import (
    ChatRequest,
    ChatResponse,
    CompletionRequest,
    CompletionResponse,
    error_body,
)
from radixrt.runtime.server.openai_serving import OpenAIServing, model_card
from radixrt.runtime.server.response_store import ResponseStore
from radixrt.runtime.server.responses_protocol import (
    RESPONSE_ID_CHARS,
    DeletedResponse,
    ResponseObject,
    ResponsesRequest,
)
from radixrt.runtime.server.responses_serving import ResponsesServing
from radixrt.runtime.tokenizer.chat_tool_prompts import dsl_chat_info
from radixrt.runtime.tokenizer.pin_leases import PinService
from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager

HEALTH_GENERATE_TIMEOUT_S = 60.0  # /health_generate answers 503 past this

ResponseId = Annotated[str, Path(min_length=1, max_length=RESPONSE_ID_CHARS)]


class AbortRequest(BaseModel):
    # the runtime's id (meta_info.rid) or the id the client saw (cmpl-..., chatcmpl-..., gen-...)
    rid: Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)] | Annotated[str, Field(max_length=128)]


# --- response models of the routes that answer plain objects -------------------------------------


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class GenerateOut(BaseModel):
    text: str
    output_ids: list[int]
    meta_info: dict[str, Any]


class Status(BaseModel):
    status: Literal["ok"]


class Aborted(Status):
    rid: int | str | None
    aborted: int  # how many running requests it ended


class Unpinned(Status):
    pin_id: int
    released: bool


class Renewed(Status):
    lost: list[int]
    ttl_s: float


class Flushed(Status):
    freed_tokens: int


# --- routes ---------------------------------------------------------------------------------------


def add_openai_routes(app: FastAPI, serving: OpenAIServing, manager: TokenizerManager) -> None:
    @app.post("/v1/completions", responses=documented(CompletionResponse, GENERATION_ERRORS,
                                                      stream=True))
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await serving.completions(body, request)

    @app.post("/v1/chat/completions", responses=documented(ChatResponse, GENERATION_ERRORS,
                                                           stream=True))
    async def chat_completions(body: ChatRequest, request: Request) -> Response:
        return await serving.chat(body, request)

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card(manager.model_name)]}


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


def add_native_routes(app: FastAPI, serving: NativeServing, manager: TokenizerManager,
                      pins: PinService, features: ChatFeatures, store: ResponseStore) -> None:
    @app.post("/generate", responses=documented(GenerateOut | list[GenerateOut],
                                                GENERATION_ERRORS, stream=True))
    async def generate(body: GenerateRequest, request: Request) -> Response:
        return await serving.generate(body, request)

    @app.post("/abort", response_model=Aborted)
    async def abort(body: AbortRequest) -> dict[str, Any]:
        aborted = await manager.abort(body.rid)
        return {"status": "ok", "rid": body.rid, "aborted": aborted}

    @app.post("/abort_request", responses=documented(Aborted, (400,)))
    async def abort_request(body: AbortRequestBody) -> Response:
        """SGLang's: {"rid": id} or {"abort_all": true}."""
        if body.abort_all == (body.rid is not None):
            return JSONResponse(error_body("give one of 'rid' and 'abort_all': true",
                                           "invalid_request_error", param="rid"),
                                status_code=400)
        aborted = await (manager.abort_all() if body.abort_all else manager.abort(body.rid))
        return JSONResponse({"status": "ok", "rid": body.rid, "aborted": aborted})

    @app.post("/concate_and_append_request", responses=documented(ConcatAppended,
                                                                  (*GENERATION_ERRORS, 404)))
    async def concate_and_append_request(body: ConcatAppendBody, request: Request) -> Response:
        return await serving.concat_and_append(body, request)

    @app.post("/unpin", response_model=Unpinned)
    async def unpin(body: UnpinBody) -> dict[str, Any]:
        released = await pins.release(body.pin_id)  # False: its lease ran out already
        return {"status": "ok", "pin_id": body.pin_id, "released": released}

    @app.post("/renew_pins", response_model=Renewed)
    async def renew_pins(body: RenewPinsBody) -> dict[str, Any]:
        return {"status": "ok", "lost": pins.renew(body.pin_ids), "ttl_s": pins.ttl_s}

    @app.post("/flush_cache", response_model=Flushed)
    async def flush_cache() -> dict[str, Any]:
        return {"status": "ok", "freed_tokens": await manager.flush_cache()}

    @app.get("/server_info")
    @app.get("/get_server_info")  # SGLang's name
    async def server_info() -> dict[str, Any]:
        info = await manager.server_info()
        info["chat"] = dsl_chat_info(manager.tokenizer, features.tool_format)  # DSL clients
        info["chat_features"] = features.info()
        info["score_start"] = start_text(manager.tokenizer)  # unconditional select scores
        info.update(pins.info())
        info.update(store.info())
        info.update(serving.registry.info())
        info.update(router_metadata(manager))
        return info


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
