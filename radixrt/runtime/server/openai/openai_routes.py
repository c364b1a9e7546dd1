"""OpenAI's completions, chat and model list routes, with the responses they document in the
served OpenAPI schema; the handlers are OpenAIServing's."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI, Request
from pydantic import BaseModel
from starlette.responses import Response

from radixrt.runtime.server.core.http_openapi import GENERATION_ERRORS, documented
from radixrt.runtime.server.openai.openai_protocol import (
    ChatRequest,
    ChatResponse,
    CompletionRequest,
    CompletionResponse,
)
from radixrt.runtime.server.openai.openai_serving import OpenAIServing, model_card
from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    parent: str | None = None  # a LoRA adapter's base model
    root: str | None = None  # a LoRA adapter's folder


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


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
        adapters = [model_card(name, manager.model_name, a["path"])
                    for name, a in manager.loras.items()]
        return {"object": "list", "data": [model_card(manager.model_name), *adapters]}
