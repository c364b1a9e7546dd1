"""Every error the server answers, in the shape of the API the client speaks: Anthropic's
({"type": "error", "error": {"type", "message"}}) on its routes (/v1/messages...), OpenAI's
({"error": {"message", "type", "param", "code"}}) everywhere else. The status is the same."""

from __future__ import annotations

from starlette.responses import JSONResponse

from radixrt.runtime.server.anthropic_protocol import anthropic_error_body
from radixrt.runtime.server.openai_protocol import error_body

ANTHROPIC_PREFIX = "/v1/messages"


def speaks_anthropic(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def error_response(
    path: str, status: int, message: str, type: str = "invalid_request_error",
    param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = (anthropic_error_body(message, status) if speaks_anthropic(path)
            else error_body(message, type, param, code))
    return JSONResponse(body, status_code=status, headers=headers)
