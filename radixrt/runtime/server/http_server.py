"""The HTTP server: every API surface over any TokenizerManager, in one app.

    app = create_app(manager, api_key=None)   # serve with uvicorn

Each surface is a folder beside this file, over the common core (core/: errors in each API's
shape, middleware, streaming, metrics, OpenAPI, text checks, tenants, the router's routes):
openai/ (POST /v1/completions, POST /v1/chat/completions, GET /v1/models, and the chat pieces
the other surfaces reuse: tool calls, reasoning, logprobs), responses/ (POST /v1/responses, GET
and DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel), anthropic/ (POST /v1/messages,
POST /v1/messages/count_tokens), native/ (SGLang's POST /generate, /abort, /abort_request,
/concate_and_append_request, /unpin, /renew_pins, /flush_cache) and dsl/ (the ZeroMQ endpoint of
DSL clients, started beside the app by the launcher). This file adds GET /server_info, which
gathers what each surface reports; core/operations_routes.py GET /health (no auth, no work), GET
/health_generate and GET /metrics; core/http_replica.py the SGLang router's GET /model_info and
GET /get_load (a replica's responses name it in the `x-radixrt-replica` header);
core/dashboard_routes.py the operator's live page GET /dashboard, its GET /dashboard/stats and
GET /debug/radix_tree.

Every refusal is an HTTP 4xx in the client's API's error format (a body past
MAX_REQUEST_BODY_BYTES: 413); an internal error is a 500 in the same format that leaves the
connection usable. Only pure ASGI middleware is used, so a client that disconnects is noticed and
its request aborted.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from fastapi import FastAPI

from radixrt.runtime.server.anthropic.anthropic_routes import add_anthropic_routes
from radixrt.runtime.server.anthropic.anthropic_serving import AnthropicServing
from radixrt.runtime.server.core.dashboard_auth import BrowserKeys
from radixrt.runtime.server.core.dashboard_routes import add_dashboard_routes
from radixrt.runtime.server.core.http_metrics import HTTPMetrics
from radixrt.runtime.server.core.http_middleware import (
    MAX_REQUEST_BODY_BYTES,
    UNAUTHENTICATED_PATHS,
    BearerAuth,
    BodyLimit,
    InternalErrors,
    install_error_handlers,
)
from radixrt.runtime.server.core.http_openapi import install_openapi
from radixrt.runtime.server.core.http_replica import (
    ReplicaHeader,
    add_router_routes,
    router_metadata,
)
from radixrt.runtime.server.core.lora_routes import add_lora_routes
from radixrt.runtime.server.core.operations_routes import add_operations_routes
from radixrt.runtime.server.core.tenants import ApiKeys
from radixrt.runtime.server.core.text_check import CheckedTextRoute
from radixrt.runtime.server.core.trace_middleware import TraceContext
from radixrt.runtime.server.dsl.dsl_images import program_chat
from radixrt.runtime.server.dsl.dsl_scoring import start_text
from radixrt.runtime.server.native.native_routes import add_native_routes
from radixrt.runtime.server.native.native_serving import NativeServing
from radixrt.runtime.server.openai.chat_tool_plan import ChatFeatures
from radixrt.runtime.server.openai.openai_routes import add_openai_routes
from radixrt.runtime.server.openai.openai_serving import MODEL_ALIAS, OpenAIServing
from radixrt.runtime.server.pooling.pooling_routes import add_pooling_routes
from radixrt.runtime.server.pooling.pooling_serving import PoolingServing
from radixrt.runtime.server.responses.response_store import ResponseStore
from radixrt.runtime.server.responses.responses_routes import add_responses_routes
from radixrt.runtime.server.responses.responses_serving import ResponsesServing
from radixrt.runtime.tokenizer.pin_leases import PinService
from radixrt.runtime.tokenizer.request_tracer import RequestTracer
from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager

API_DESCRIPTION = ("OpenAI's API (completions, chat, models, Responses), Anthropic's Messages "
                   "API and radixrt's native API over one runtime.")


def radixrt_version() -> str:
    try:
        return importlib.metadata.version("radixrt")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def create_app(manager: TokenizerManager, api_key: str | None = None,
               pins: PinService | None = None, keys: ApiKeys | None = None,
               features: ChatFeatures | None = None, replica: str | None = None,
               openapi: bool = True, dashboard: bool = True,
               dashboard_show_text: bool = False,
               tracer: RequestTracer | None = None) -> FastAPI:
    """api_key: the one key every request needs; keys: named keys instead (--api-key-file),
    each naming its requests' tenant. pins: the process's pin leases, shared with the DSL
    endpoint (made here if not given). features: tool calls and reasoning (default: the
    template's tool-call format, no reasoning parser, calls enforced). replica: the name every
    response carries in the REPLICA_HEADER (one of `radixrt serve --dp-size N`'s replicas).
    openapi: serve GET /openapi.json and its page GET /docs (behind the keys, like every route
    but /health; `radixrt serve --disable-openapi` turns them off). dashboard: serve the live
    page /dashboard, /dashboard/stats and /debug/radix_tree (core/dashboard_routes.py), each
    node's first words only with dashboard_show_text. tracer: each HTTP request gets a span in
    its caller's W3C trace context (core/trace_middleware.py; the manager traces the rest)."""
    features = features if features is not None else ChatFeatures.of(manager.tokenizer)
    pins = pins if pins is not None else PinService(manager)
    if keys is None and api_key:
        keys = ApiKeys.single(api_key)
    app = FastAPI(title="radixrt", version=radixrt_version(), description=API_DESCRIPTION,
                  docs_url="/docs" if openapi else None, redoc_url=None,
                  openapi_url="/openapi.json" if openapi else None)
    app.router.route_class = CheckedTextRoute  # every route: text that is not Unicode is a 400
    metrics = HTTPMetrics(manager, pins)
    install_error_handlers(app, metrics)
    app.add_middleware(BodyLimit, max_bytes=MAX_REQUEST_BODY_BYTES, metrics=metrics)
    if tracer is not None:  # inside the keys: a request refused by them is not traced
        app.add_middleware(TraceContext, tracer=tracer)
    browser = BrowserKeys(keys) if keys is not None and dashboard else None
    if keys is not None:
        app.add_middleware(BearerAuth, keys=keys, metrics=metrics, browser=browser)
    app.add_middleware(InternalErrors, metrics=metrics)  # catches the others'
    if replica is not None:  # the outermost: names even InternalErrors' 500s
        app.add_middleware(ReplicaHeader, name=replica)
    chat = OpenAIServing(manager, features)
    add_openai_routes(app, chat, manager)
    add_anthropic_routes(app, AnthropicServing(chat))
    store = ResponseStore(pins)
    add_responses_routes(app, ResponsesServing(chat, store))
    native = NativeServing(manager)
    add_native_routes(app, native, manager, pins)
    add_info_routes(app, manager, native, pins, features, store)
    add_operations_routes(app, manager, metrics)
    add_lora_routes(app, manager)
    add_pooling_routes(app, PoolingServing(chat))
    add_router_routes(app, manager)
    if dashboard:
        add_dashboard_routes(app, manager, browser, dashboard_show_text)
    # with LoRA adapters, `model` may name any adapter loaded while serving: no list
    install_openapi(app, keys is not None, UNAUTHENTICATED_PATHS,
                    None if manager.lora_enabled else [manager.model_name, MODEL_ALIAS])
    return app


def add_info_routes(app: FastAPI, manager: TokenizerManager, native: NativeServing,
                    pins: PinService, features: ChatFeatures, store: ResponseStore) -> None:
    """GET /server_info (SGLang's /get_server_info too): the runtime's state and what each
    surface adds (the DSL's chat info, pins, stored responses, named sequences, the router's)."""
    chat = program_chat(manager, features.tool_format)

    @app.get("/server_info")
    @app.get("/get_server_info")  # SGLang's name
    async def server_info() -> dict[str, Any]:
        info = await manager.server_info()
        info["chat"] = chat  # DSL clients
        info["chat_features"] = features.info()
        info["score_start"] = start_text(manager.tokenizer)  # unconditional select scores
        info.update(pins.info())
        info.update(store.info())
        info.update(native.registry.info())
        info.update(router_metadata(manager))
        return info
