"""Embeddings, reranking and classification routes (pooling_serving.py's handlers), with the
responses they document in the served OpenAPI schema."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from radixrt.runtime.server.core.http_openapi import GENERATION_ERRORS, documented
from radixrt.runtime.server.pooling.pooling_protocol import (
    ClassifyRequest,
    ClassifyResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    RerankRequest,
    RerankResponse,
)
from radixrt.runtime.server.pooling.pooling_serving import PoolingServing


def add_pooling_routes(app: FastAPI, serving: PoolingServing) -> None:
    @app.post("/v1/embeddings", responses=documented(EmbeddingResponse, GENERATION_ERRORS))
    async def embeddings(body: EmbeddingRequest, request: Request) -> dict[str, Any]:
        return await serving.embeddings(body, request)

    @app.post("/v1/rerank", responses=documented(RerankResponse, GENERATION_ERRORS))
    @app.post("/v2/rerank", responses=documented(RerankResponse, GENERATION_ERRORS))
    @app.post("/rerank", responses=documented(RerankResponse, GENERATION_ERRORS))
    async def rerank(body: RerankRequest, request: Request) -> dict[str, Any]:
        return await serving.rerank(body, request)

    @app.post("/classify", responses=documented(ClassifyResponse, GENERATION_ERRORS))
    @app.post("/v1/classify", responses=documented(ClassifyResponse, GENERATION_ERRORS))
    async def classify(body: ClassifyRequest, request: Request) -> Any:
        return await serving.classify(body, request)
