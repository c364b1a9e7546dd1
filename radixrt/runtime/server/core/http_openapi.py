"""The served OpenAPI schema (GET /openapi.json, its page at GET /docs), true to what the routes
answer: each route's response model, its stream as text/event-stream, /metrics as text, and
every error status it can answer with the body of that API's error shape. FastAPI's own "422
Validation Error" entries are removed: a body that does not validate is a 400 here.

`documented(...)` gives a route decorator's `responses`; `install_openapi(app, keys)` replaces
the app's schema builder (security schemes when keys are required; the statuses every route may
answer: 401 with keys, 413 for a body too large)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from radixrt.runtime.server.core.error_shapes import speaks_anthropic

# What each error status means here (the body's message says more).
STATUS_MEANINGS = {
    400: "The request is invalid: the message names the field and what to fix.",
    401: "An API key is required (Authorization: Bearer KEY, or x-api-key: KEY), or the key "
         "is wrong.",
    404: "Not found (an unknown or another API key's stored response).",
    408: "The request waited in the queue past its `timeout`; x-should-retry: false.",
    413: "The request body is too large.",
    429: "A queue is full: retry after Retry-After seconds.",
    503: "The server cannot generate now.",
}
HEADERS = {
    408: {"x-should-retry": {"schema": {"type": "string", "enum": ["false"]},
                             "description": "Clients should not retry a queue timeout."}},
    429: {"Retry-After": {"schema": {"type": "string"},
                          "description": "Seconds to wait before retrying."}},
}
# The statuses a request that generates can answer besides 401 and 413.
GENERATION_ERRORS = (400, 408, 429)
SSE = "text/event-stream"
SSE_EVENT = {"type": "object", "required": ["data"],
             "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}
VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorBody(BaseModel):
    error: OpenAIErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorBody(BaseModel):
    type: Literal["error"]
    error: AnthropicErrorDetail


def documented(ok: Any = None, errors: Sequence[int] = (), stream: bool = False,
               anthropic: bool = False) -> dict[int | str, Any]:
    """A route's `responses`: 200 with the model `ok` (and text/event-stream when it streams),
    and each error status in the API's error shape."""
    ok_doc: dict[str, Any] = {"description": "OK"}
    if ok is not None:
        ok_doc["model"] = ok
    content: dict[str, Any] = {}
    if stream:
        content[SSE] = {"schema": SSE_EVENT,
                        "description": "Server-sent events (stream: true): each event's data "
                                       "is a JSON object (OpenAI's chat and completion streams "
                                       "end with data: [DONE])."}
    if content:
        ok_doc["content"] = content
    doc: dict[int | str, Any] = {200: ok_doc}
    error_model = AnthropicErrorBody if anthropic else OpenAIErrorBody
    for status in errors:
        doc[status] = {"model": error_model, "description": STATUS_MEANINGS[status]}
        if status in HEADERS:
            doc[status]["headers"] = HEADERS[status]
    return doc


def install_openapi(app: FastAPI, keys_required: bool, unauthenticated: frozenset[str],
                    model_names: Sequence[str] | None) -> None:
    """The app's schema: 422s removed; 401 (with keys, on every path but the unauthenticated
    ones) and 413 (on every operation with a body) added, in each path's error shape; `model`
    fields list the names served (any other is a 400; None: any name, with LoRA adapters); a
    created response links to the operations on its id."""

    def build() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version,
                             description=app.description, routes=app.routes)
        components = schema.setdefault("components", {})
        shapes = components.setdefault("schemas", {})
        for shape in shapes.values():
            model = shape.get("properties", {}).get("model")
            if model_names is not None and model is not None and model.get(
                    "type") == "string" and "model" in shape.get("required", ()):
                model["enum"] = list(dict.fromkeys(model_names))
        link_responses(schema.get("paths", {}))
        for name in VALIDATION_SCHEMAS:
            shapes.pop(name, None)
        for model in (OpenAIErrorBody, AnthropicErrorBody):
            shapes.setdefault(model.__name__, model.model_json_schema(
                ref_template="#/components/schemas/{model}"))
            for name, sub in shapes[model.__name__].pop("$defs", {}).items():
                shapes.setdefault(name, sub)
        if keys_required:
            components["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}}
        for path, item in schema.get("paths", {}).items():
            error_ref = {"$ref": "#/components/schemas/" + (
                "AnthropicErrorBody" if speaks_anthropic(path) else "OpenAIErrorBody")}
            for operation in item.values():
                responses = operation.setdefault("responses", {})
                responses.pop("422", None)
                statuses = []
                if "requestBody" in operation:
                    statuses.append(413)
                if operation.get("parameters") or "requestBody" in operation:
                    statuses.append(400)
                if keys_required and path not in unauthenticated:
                    statuses.append(401)
                    operation["security"] = [{"bearer": []}, {"apiKey": []}]
                for status in statuses:
                    responses.setdefault(str(status), {
                        "description": STATUS_MEANINGS[status],
                        "content": {"application/json": {"schema": error_ref}}})
        app.openapi_schema = schema
        return schema

    app.openapi = build  # type: ignore[method-assign]


def link_responses(paths: dict[str, Any]) -> None:
    """OpenAPI links from POST /v1/responses to the operations on the id it returns (API
    clients and fuzzers follow them)."""
    create = paths.get("/v1/responses", {}).get("post")
    by_id = paths.get("/v1/responses/{response_id}", {})
    cancel = paths.get("/v1/responses/{response_id}/cancel", {}).get("post")
    if create is None:
        return
    targets = {"GetResponse": by_id.get("get"), "DeleteResponse": by_id.get("delete"),
               "CancelResponse": cancel}
    create["responses"]["200"]["links"] = {
        name: {"operationId": op["operationId"],
               "parameters": {"response_id": "$response.body#/id"}}
        for name, op in targets.items() if op is not None}
