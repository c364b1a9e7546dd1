"""What every route goes through: API keys (BearerAuth), the body size limit (BodyLimit),
internal errors as 500s that keep the connection (InternalErrors), and the exception handlers
that render refusals and pydantic's validation errors as a 4xx in the client's API's shape."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixrt.runtime.server.core.dashboard_auth import BrowserKeys, is_dashboard_read
from radixrt.runtime.server.core.error_shapes import APIError, error_response
from radixrt.runtime.server.core.http_metrics import HTTPMetrics
from radixrt.runtime.server.core.http_streaming import ClientGone
from radixrt.runtime.server.core.tenants import TENANT_STATE, ApiKeys

# A larger request body is refused with 413 while it is read.
MAX_REQUEST_BODY_BYTES = 4 << 20
UNAUTHENTICATED_PATHS = frozenset({"/health"})
# What a field of a union type must be (pydantic reports one error per alternative).
FIELD_HINTS = {
    "prompt": "must be a string, a list of strings, a list of token ids (ints) or a list of "
              "lists of token ids",
    "stop": "must be a string or a list of strings",
    "messages": "must be a list of {\"role\": ..., \"content\": str or [{\"type\": \"text\", "
                "\"text\": ...}]} objects",
}
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away"
log = logging.getLogger("radixrt.http")


# --- errors ------------------------------------------------------------------------------------


def install_error_handlers(app: FastAPI, metrics: HTTPMetrics) -> None:
    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        metrics.reject(exc.status)
        return error_response(request.url.path, exc.status, exc.message, exc.type, exc.param,
                              exc.code, exc.headers)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        metrics.reject(400)
        message, param = describe_validation_errors(exc.errors())
        return error_response(request.url.path, 400, message, param=param)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if isinstance(exc.__cause__, BodyTooLarge):  # FastAPI wraps errors of body reading
            return await on_body_too_large(request, exc.__cause__)
        if exc.status_code < 500:
            metrics.reject(exc.status_code)
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return error_response(request.url.path, exc.status_code, str(exc.detail), kind,
                              headers=exc.headers)

    async def on_client_gone(request: Request, exc: Exception) -> Response:
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    async def on_body_too_large(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, BodyTooLarge)
        metrics.reject(413)
        return exc.response(request.url.path)

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(ClientGone, on_client_gone)
    app.add_exception_handler(BodyTooLarge, on_body_too_large)


def describe_validation_errors(errors: Any) -> tuple[str, str | None]:
    """pydantic's errors as one message that says what to fix, and the first bad field."""
    parts: list[str] = []
    fields: list[str] = []
    for error in prefer_value_errors(errors):
        loc = [str(p) for p in error.get("loc", ()) if p != "body" and not is_type_tag(p)]
        if error.get("type") == "json_invalid":
            return f"the request body is not valid JSON: {error.get('ctx', {}).get('error')}", None
        if not loc:
            return "the request body must be a JSON object", None
        field = loc[0]
        if field in fields:  # a union type reports one error per alternative: keep the first
            continue
        fields.append(field)
        got = error.get("input")
        got_text = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
        if field in FIELD_HINTS and (len(loc) == 1 or not loc[1].isdigit()):
            parts.append(f"{field} {FIELD_HINTS[field]}")
        else:
            parts.append(f"{'.'.join(loc)}: {error.get('msg')}{got_text}")
    return "invalid request: " + "; ".join(parts), fields[0] if fields else None


def prefer_value_errors(errors: Any) -> list[Any]:
    """A union reports one error per alternative: where the value had the right type for one of
    them (a list too long, say) that error says what to fix, so it goes before the others'
    "should be a valid string"."""
    def is_type_error(error: Any) -> bool:
        return str(error.get("type", "")).endswith("_type")

    return sorted(errors, key=is_type_error)


def is_type_tag(part: Any) -> bool:
    """pydantic names the alternative of a union in the error location: 'str', 'list[int]'."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part)


# --- authentication ----------------------------------------------------------------------------


class BearerAuth:
    """Pure ASGI middleware: every path but /health needs `Authorization: Bearer <key>` with
    one of the keys (the dashboard's reads may carry it as a browser can: dashboard_auth.py);
    a named key's name becomes the request's tenant (scope state)."""

    def __init__(self, app: ASGIApp, keys: ApiKeys, metrics: HTTPMetrics | None = None,
                 browser: BrowserKeys | None = None) -> None:
        """browser: the dashboard's reads may bring the key as a browser can (None: no)."""
        self.app = app
        self.keys = keys
        self.metrics = metrics
        self.browser = browser

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNAUTHENTICATED_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        given = headers.get(b"authorization", b"")
        scheme, _, token = given.partition(b" ")
        # the scheme is case-insensitive (RFC 7235 section 2.1): "bearer KEY" is as good;
        # Anthropic's clients send the key as `x-api-key: KEY`
        if scheme.lower() != b"bearer":
            token = headers.get(b"x-api-key", b"")
            given = given or token
        found, name = self.keys.match(token.strip())
        if not found and not given and self.browser is not None and is_dashboard_read(scope):
            found, name = self.browser.match(scope)
        if found:
            if name is not None:
                scope.setdefault("state", {})[TENANT_STATE] = name
            await self.app(scope, receive, send)
            return
        message = ("a valid API key is required: send the header 'Authorization: Bearer <key>' "
                   "(or 'x-api-key: <key>')" if not given else "the API key is wrong")
        if self.metrics is not None:
            self.metrics.reject(401)
        response = error_response(scope["path"], 401, message, code="invalid_api_key",
                                  headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)


# --- body size and internal errors -------------------------------------------------------------


class BodyTooLarge(Exception):
    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"the request body is larger than {max_bytes} bytes: send less "
                         "(split a batch of prompts, shorten the prompt)")

    def response(self, path: str) -> JSONResponse:
        return error_response(path, 413, str(self), code="request_too_large")


class BodyLimit:
    """Pure ASGI middleware: a request body past `max_bytes` is refused with 413, before the app
    sees it when Content-Length says so, else as soon as the bytes read pass the limit. The rest
    of the body is read and dropped (never kept), so the connection stays usable."""

    def __init__(self, app: ASGIApp, max_bytes: int, metrics: HTTPMetrics) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self.drain(receive, {"more_body": True})
            self.metrics.reject(413)
            await BodyTooLarge(self.max_bytes).response(scope["path"])(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    await self.drain(receive, message)
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counted, send)

    @staticmethod
    async def drain(receive: Receive, message: Message) -> None:
        while message.get("more_body", False):
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away


class InternalErrors:
    """Pure ASGI middleware: an unexpected exception (a bug) becomes a 500 with an OpenAI-style
    body and a logged traceback, and is not re-raised, so the server (which closes a connection
    whose app raised) keeps the client's connection open. Mid-stream, the stream is cut."""

    def __init__(self, app: ASGIApp, metrics: HTTPMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            log.exception("internal error serving %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise
            self.metrics.reject(500)
            message = f"internal error: {type(exc).__name__}: {exc}"
            await error_response(scope["path"], 500, message, "server_error")(scope, receive,
                                                                                send)
