"""Errors in the shape of the API a route speaks: Anthropic's under /v1/messages, OpenAI's
elsewhere, the status the same."""

from __future__ import annotations

import json

from radixrt.runtime.server.core.error_shapes import error_response, speaks_anthropic


def test_the_shape_follows_the_route() -> None:
    assert speaks_anthropic("/v1/messages") and speaks_anthropic("/v1/messages/count_tokens")
    assert not speaks_anthropic("/v1/messagesx") and not speaks_anthropic("/v1/responses")
    anthropic = error_response("/v1/messages", 413, "too big", code="request_too_large")
    assert anthropic.status_code == 413 and json.loads(anthropic.body) == {
        "type": "error", "error": {"type": "request_too_large", "message": "too big"}}
    openai = error_response("/v1/chat/completions", 400, "bad", param="n",
                            headers={"x-should-retry": "false"})
    assert json.loads(openai.body) == {"error": {"message": "bad", "type":
                                                 "invalid_request_error", "param": "n",
                                                 "code": None}}
    assert openai.headers["x-should-retry"] == "false"
