"""POST /generate: the native API.

Request: {"text": str} or {"input_ids": [int]}, "sampling_params": {any SamplingParams field},
"stream": bool. Response: {"text", "output_ids", "meta_info": {rid, prompt_tokens, cached_tokens,
completion_tokens, finish_reason}}, a list of those when n > 1. Streamed, each event carries the
new text and ids of one sample ("index") and meta_info so far, then `data: [DONE]`.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from dataclasses import fields
from typing import Any

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.server.http_streaming import (
    SSE_DONE,
    PrimedStream,
    PromptOutput,
    SampleOutput,
    SSEResponse,
    collect,
    merge_streams,
    open_streams,
    sse,
    until_disconnected,
)
from radixrt.runtime.server.openai_protocol import (
    APIError,
    build_sampling_params,
    default_max_tokens,
    parse_logit_bias,
)
from radixrt.runtime.tokenizer.manager_base import TokenizerManager

SAMPLING_FIELDS = frozenset(f.name for f in fields(SamplingParams))


class GenerateRequest(BaseModel):
    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    stream: bool = False


class NativeServing:
    def __init__(self, manager: TokenizerManager) -> None:
        self.manager = manager

    def encode(self, body: GenerateRequest) -> list[int]:
        if (body.text is None) == (body.input_ids is None):
            raise APIError("give exactly one of 'text' and 'input_ids'", param="text")
        prompt = body.text if body.text is not None else body.input_ids
        param = "text" if body.text is not None else "input_ids"
        try:
            ids = self.manager.encode(prompt)  # type: ignore[arg-type]
        except ValueError as exc:
            raise APIError(str(exc), param=param) from None
        limit = self.manager.context_length
        if len(ids) >= limit:
            raise APIError(f"the prompt has {len(ids)} tokens but the context length is "
                           f"{limit}: shorten it to at most {limit - 1} tokens", param=param)
        return ids

    def params(self, values: dict[str, Any], prompt_tokens: int) -> SamplingParams:
        unknown = sorted(set(values) - SAMPLING_FIELDS)
        if unknown:
            raise APIError(f"unknown sampling_params field(s) {unknown}; known fields: "
                           f"{sorted(SAMPLING_FIELDS)}", param="sampling_params")
        values = dict(values)
        if values.get("max_tokens") is None:
            values["max_tokens"] = default_max_tokens(prompt_tokens, self.manager.context_length)
        if isinstance(values.get("logit_bias"), dict):
            values["logit_bias"] = parse_logit_bias(values["logit_bias"])
        return build_sampling_params(values)

    async def generate(self, body: GenerateRequest, request: Request) -> Response:
        ids = self.encode(body)
        params = self.params(body.sampling_params, len(ids))
        rid = f"gen-{uuid.uuid4().hex}"
        streams = await until_disconnected(
            request, open_streams(self.manager, [ids], [params], rid)
        )
        if body.stream:
            return SSEResponse(self.stream(streams[0], len(ids)))
        out = await until_disconnected(request, collect(streams[0], len(ids), params.n))
        results = [result_of(sample, out, streams[0].rid) for sample in out.samples]
        return JSONResponse(results[0] if params.n == 1 else results)

    async def stream(self, stream: PrimedStream, prompt_tokens: int) -> AsyncGenerator[bytes, None]:
        counts: dict[int, int] = {}
        async for _, chunk in merge_streams([stream]):
            counts[chunk.index] = counts.get(chunk.index, 0) + len(chunk.token_ids)
            yield sse({
                "index": chunk.index,
                "text": chunk.text,
                "output_ids": chunk.token_ids,
                "meta_info": {
                    "rid": chunk.rid,
                    "prompt_tokens": prompt_tokens,
                    "cached_tokens": chunk.cached_tokens,
                    "completion_tokens": counts[chunk.index],
                    "finish_reason": chunk.finish_reason,
                },
            })
        yield SSE_DONE


def result_of(sample: SampleOutput, out: PromptOutput, rid: int | None) -> dict[str, Any]:
    return {
        "text": sample.text,
        "output_ids": sample.token_ids,
        "meta_info": {
            "rid": rid,
            "prompt_tokens": out.prompt_tokens,
            "cached_tokens": out.cached_tokens,
            "completion_tokens": len(sample.token_ids),
            "finish_reason": sample.finish_reason,
        },
    }
