"""The shapes of the pooling surface: OpenAI's POST /v1/embeddings, the Cohere / Jina rerank
(POST /v1/rerank, /v2/rerank, /rerank), vLLM's POST /classify and SGLang's reward scoring
(POST /classify with `text`). Unknown request fields are ignored, as on the OpenAI routes; the
scheduling extras (priority, cache_salt, timeout, user) are the same."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from radixrt.runtime.config import MAX_NAME_CHARS


class PoolingFields(BaseModel):
    model: str = Field(default="default", max_length=MAX_NAME_CHARS)
    user: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    priority: int | None = None
    cache_salt: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    timeout: float | None = None


class EmbeddingRequest(PoolingFields):
    model: str = Field(max_length=MAX_NAME_CHARS)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    normalize: bool | None = None  # extra: unit length or not (default: the checkpoint's)


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # base64: float32 little-endian bytes


class PoolingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    cached_tokens: int = 0  # of the prompt tokens, served from the radix cache


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: PoolingUsage


class RerankDocument(BaseModel):
    text: str


class RerankRequest(PoolingFields):
    query: str
    documents: list[str | RerankDocument]
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = True
    instruction: str | None = None  # extra: an LM reranker's <Instruct> (default: web search)


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: PoolingUsage


class ClassifyRequest(PoolingFields):
    """vLLM's {"input": ...}; or SGLang's reward scoring {"text": ...} / {"input_ids": ...}
    (then its shape back)."""

    input: str | list[str] | list[int] | list[list[int]] | None = None
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None


class ClassifyData(BaseModel):
    index: int
    label: str
    probs: list[float]
    num_classes: int


class ClassifyResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ClassifyData]
    usage: PoolingUsage
