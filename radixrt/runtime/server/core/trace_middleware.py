"""Pure ASGI middleware of `radixrt serve --otlp-traces-endpoint`: W3C trace context in and out
of every HTTP request (the spans themselves: tokenizer/request_tracer.py)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixrt.runtime.tokenizer.request_tracer import RequestTracer

TRACEPARENT = "traceparent"
# not traced: probes, scrapes and the dashboard's polling would bury the requests' traces
UNTRACED_PATHS = ("/health", "/metrics", "/dashboard", "/debug/")


class TraceContext:
    """Pure ASGI middleware (installed only with a tracer): each HTTP request (but UNTRACED_PATHS)
    gets a server span, a child of the caller's `traceparent` when it sent one; the request's
    own spans go under it, and the response carries its `traceparent`."""

    def __init__(self, app: ASGIApp, tracer: RequestTracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(UNTRACED_PATHS):
            await self.app(scope, receive, send)
            return
        from opentelemetry import context, trace

        carrier = _headers(scope["headers"])
        parent = self.tracer.propagator.extract(carrier)
        name = f"{scope.get('method', 'GET')} {scope['path']}"
        span = self.tracer.tracer.start_span(name, context=parent, kind=trace.SpanKind.SERVER,
                                             start_time=time.time_ns())
        under = trace.set_span_in_context(span, parent)
        answer: dict[str, str] = {}
        self.tracer.propagator.inject(answer, context=under)
        token = context.attach(under)

        async def traced(message: Message) -> None:
            if message["type"] == "http.response.start":
                span.set_attribute("http.response.status_code", message["status"])
                if TRACEPARENT in answer:
                    headers = list(message.get("headers", []))
                    headers.append((TRACEPARENT.encode(), answer[TRACEPARENT].encode()))
                    message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, traced)
        finally:
            context.detach(token)
            span.end()


def _headers(raw: list[tuple[bytes, bytes]]) -> Mapping[str, str]:
    return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in raw}
