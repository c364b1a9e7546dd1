"""POST /generate: the native API.

Request: {"text": str} or {"input_ids": [int]}, "sampling_params": {any SamplingParams field},
"stream": bool, "pin": bool, and the scheduling fields "priority", "cache_salt", "timeout",
"user" (as on the OpenAI endpoints). Response: {"text", "output_ids", "meta_info": {rid,
prompt_tokens, cached_tokens, completion_tokens, finish_reason}}, a list of those when n > 1.
Streamed, each event carries the new text and ids of one sample ("index") and meta_info so far,
then `data: [DONE]`.

Pins: with "pin": true (n = 1, no stop strings) the finished prompt and output stay locked in the
radix cache, so later requests that start with them never recompute them; meta_info then has
"pin_id" (null when the pin was refused, with "pin_error" saying why: the pin budget). A pin is a
lease: POST /renew_pins {"pin_ids": [...]} more often than server_info's pin_lease_ttl_s keeps it
(the reply lists the ones already "lost"), POST /unpin {"pin_id": N} releases it; one its client
stops renewing is released by the server.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from typing import Annotated, Any

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from radixrt.runtime.config import INT64_MAX, MAX_NAME_CHARS, MAX_PINS_PER_RENEWAL
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
    parse_logit_bias,
)
from radixrt.runtime.server.tenants import scheduling_for
from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager

SAMPLING_FIELDS = frozenset(SamplingParams.__struct_fields__)


class GenerateRequest(BaseModel):
    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    stream: bool = False
    pin: bool = False
    # scheduling, as on the OpenAI endpoints: see tenants.scheduling_for
    priority: int | None = None
    cache_salt: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    timeout: float | None = None
    user: str | None = Field(default=None, max_length=MAX_NAME_CHARS)


class UnpinBody(BaseModel):
    pin_id: Annotated[int, Field(ge=0, le=INT64_MAX)]


class RenewPinsBody(BaseModel):
    pin_ids: Annotated[list[Annotated[int, Field(ge=0, le=INT64_MAX)]],
                       Field(max_length=MAX_PINS_PER_RENEWAL)]


class NativeServing:
    def __init__(self, manager: TokenizerManager) -> None:
        self.manager = manager

    def encode(self, body: GenerateRequest) -> list[int]:
        if (body.text is None) == (body.input_ids is None):
            raise APIError("give exactly one of 'text' and 'input_ids'", param="text")
        prompt = body.text if body.text is not None else body.input_ids
        param = "text" if body.text is not None else "input_ids"
        try:  # the limits that need the model are checked where the request is queued
            return self.manager.encode(prompt)  # type: ignore[arg-type]
        except ValueError as exc:
            raise APIError(str(exc), param=param) from None

    @staticmethod
    def check_pin(params: SamplingParams) -> None:
        if params.n != 1:
            raise APIError(f"pin needs n=1 (got n={params.n}): a pin keeps one sample's prefix",
                           param="pin")
        if params.stop:
            raise APIError("pin cannot be combined with stop strings (a stop string ends the "
                           "request where the pinned prefix is not defined): drop 'stop' or "
                           "'pin'", param="pin")

    def params(self, values: dict[str, Any]) -> SamplingParams:
        unknown = sorted(set(values) - SAMPLING_FIELDS)
        if unknown:
            raise APIError(f"unknown sampling_params field(s) {unknown}; known fields: "
                           f"{sorted(SAMPLING_FIELDS)}", param="sampling_params")
        values = dict(values)
        if isinstance(values.get("logit_bias"), dict):
            values["logit_bias"] = parse_logit_bias(values["logit_bias"])
        return build_sampling_params(values)

    async def generate(self, body: GenerateRequest, request: Request) -> Response:
        ids = self.encode(body)
        params = self.params(body.sampling_params)
        if body.pin:
            self.check_pin(params)
        rid = f"gen-{uuid.uuid4().hex}"
        scheduling = scheduling_for(request, body)
        streams = await until_disconnected(
            request, open_streams(self.manager, [ids], [params], rid, scheduling, pin=body.pin)
        )
        if body.stream:
            return SSEResponse(self.stream(streams[0], len(ids), body.pin))
        out = await until_disconnected(request, collect(streams[0], len(ids), params.n))
        results = [result_of(sample, out, streams[0].rid) for sample in out.samples]
        if body.pin:
            results[0]["meta_info"].update(pin_info(out.pinned, out.pin_error, streams[0].rid))
        return JSONResponse(results[0] if params.n == 1 else results)

    async def stream(self, stream: PrimedStream, prompt_tokens: int,
                     pin: bool) -> AsyncGenerator[bytes, None]:
        counts: dict[int, int] = {}
        async for _, chunk in merge_streams([stream]):
            counts[chunk.index] = counts.get(chunk.index, 0) + len(chunk.token_ids)
            meta = {
                "rid": chunk.rid,
                "prompt_tokens": prompt_tokens,
                "cached_tokens": chunk.cached_tokens,
                "completion_tokens": counts[chunk.index],
                "finish_reason": chunk.finish_reason,
            }
            if pin and chunk.finish_reason is not None:
                meta.update(pin_info(chunk.pinned, chunk.pin_error, chunk.rid))
            yield sse({"index": chunk.index, "text": chunk.text, "output_ids": chunk.token_ids,
                       "meta_info": meta})
        yield SSE_DONE


def pin_info(pinned: bool, error: str | None, rid: int | None) -> dict[str, Any]:
    if pinned:
        return {"pin_id": rid}
    return {"pin_id": None, "pin_error": error or "not pinned: the request did not finish "
            "normally, or the radix cache is off (--disable-radix-cache)"}


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
