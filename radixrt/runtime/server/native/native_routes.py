"""SGLang's native routes: /generate, /abort and /abort_request, /concate_and_append_request,
pins (/unpin, /renew_pins) and /flush_cache."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, Field
from starlette.responses import JSONResponse, Response

from radixrt.runtime.config import INT64_MAX, INT64_MIN
from radixrt.runtime.server.core.error_shapes import error_body
from radixrt.runtime.server.core.http_openapi import GENERATION_ERRORS, documented
from radixrt.runtime.server.core.operations_routes import Status
from radixrt.runtime.server.native.native_protocol import (
    AbortRequestBody,
    ConcatAppendBody,
    ConcatAppended,
    GenerateRequest,
)
from radixrt.runtime.server.native.native_serving import NativeServing, RenewPinsBody, UnpinBody
from radixrt.runtime.tokenizer.pin_leases import PinService
from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager


class AbortRequest(BaseModel):
    # the runtime's id (meta_info.rid) or the id the client saw (cmpl-..., chatcmpl-..., gen-...)
    rid: Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)] | Annotated[str, Field(max_length=128)]


class GenerateOut(BaseModel):
    text: str
    output_ids: list[int]
    meta_info: dict[str, Any]


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


def add_native_routes(app: FastAPI, serving: NativeServing, manager: TokenizerManager,
                      pins: PinService) -> None:
    """SGLang's native API: /generate, abort, append to a running request, pins, the cache."""
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
