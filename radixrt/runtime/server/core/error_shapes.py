"""Every error the server answers, in the shape of the API the client speaks: Anthropic's
({"type": "error", "error": {"type", "message"}}) on its routes (/v1/messages...), OpenAI's
({"error": {"message", "type", "param", "code"}}) everywhere else. The status is the same.
APIError is the refusal every surface raises; the app renders it in the client's shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError
from starlette.responses import JSONResponse

T = TypeVar("T")
ANTHROPIC_PREFIX = "/v1/messages"


class APIError(Exception):
    """A request the server refuses; rendered as OpenAI's {"error": {...}} body."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.headers = headers
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def translated(build: Callable[[], T]) -> T:
    """The chat request another API's (validated) request becomes: a bound of the chat request
    that the other shape did not check is a 400 naming it, never a 500."""
    try:
        return build()
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error.get("loc", ()))
        raise APIError(f"invalid request: {where}: {error.get('msg')}") from None


def error_body(
    message: str, type: str = "invalid_request_error", param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def param_of(message: str) -> str | None:
    """The field a runtime error message starts with ("top_p=0.0 is invalid: ..."), if any."""
    head = message.split("=", 1)[0]
    return head if "=" in message and head.isidentifier() else None


def error_message(reason: str | None) -> str | None:
    """The text after "error: " of an error finish reason, else None."""
    if reason is None or not reason.startswith("error"):
        return None
    return reason.split(":", 1)[1].strip() if ":" in reason else reason


# Anthropic's error "type" per HTTP status (its API's; what its client maps to exceptions).
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 408: "timeout_error",
               413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               503: "overloaded_error"}


def anthropic_error_body(message: str, status: int) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def speaks_anthropic(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def error_response(
    path: str, status: int, message: str, type: str = "invalid_request_error",
    param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = (anthropic_error_body(message, status) if speaks_anthropic(path)
            else error_body(message, type, param, code))
    return JSONResponse(body, status_code=status, headers=headers)
