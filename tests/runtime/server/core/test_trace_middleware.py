"""W3C trace context through the HTTP layer (server/core/trace_middleware.py), on a real socket:
the caller's traceparent becomes the parent of the request's server span, the route runs inside
that span (so the request's own spans go under it), the answer names it, and probes, scrapes and
the dashboard are not traced."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from http_serving import serve_in_thread
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from radixrt.runtime.server.core.trace_middleware import TraceContext
from radixrt.runtime.tokenizer.request_tracer import RequestTracer

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


class Served:
    def __init__(self, url: str, tracer: RequestTracer, exporter: InMemorySpanExporter) -> None:
        self.http = httpx.Client(base_url=url, timeout=30)
        self.tracer = tracer
        self.exporter = exporter

    def spans(self, expected: int = 1) -> Any:
        """The spans ended so far, once `expected` have (a server span ends just after the
        answer is sent)."""
        deadline = time.monotonic() + 5
        while True:
            self.tracer.flush()
            spans = self.exporter.get_finished_spans()
            if len(spans) >= expected or time.monotonic() > deadline:
                return spans
            time.sleep(0.01)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    async def seen(request: Request) -> JSONResponse:  # what a route sees as its context
        context = trace.get_current_span().get_span_context()
        return JSONResponse({"trace": f"{context.trace_id:032x}",
                             "span": f"{context.span_id:016x}"})

    exporter = InMemorySpanExporter()
    tracer = RequestTracer("http://127.0.0.1:4318", exporter=exporter)
    app = Starlette(routes=[Route("/v1/completions", seen, methods=["POST"]),
                            Route("/health", seen), Route("/dashboard/stats", seen)])
    app.add_middleware(TraceContext, tracer=tracer)
    ports, stop = serve_in_thread([app])
    srv = Served(f"http://127.0.0.1:{ports[0]}", tracer, exporter)
    yield srv
    srv.http.close()
    stop()
    tracer.shutdown()


def test_the_callers_trace_goes_through(served: Served) -> None:
    served.exporter.clear()
    answer = served.http.post("/v1/completions",
                              headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
    inside = answer.json()
    assert inside["trace"] == CALLER_TRACE
    _, trace_id, span_id, flags = answer.headers["traceparent"].split("-")
    assert (trace_id, span_id, flags) == (CALLER_TRACE, inside["span"], "01")
    [span] = served.spans()
    assert span.name == "POST /v1/completions" and span.kind == trace.SpanKind.SERVER
    assert f"{span.context.span_id:016x}" == inside["span"]
    assert f"{span.parent.span_id:016x}" == CALLER_SPAN
    assert span.attributes["http.response.status_code"] == 200


def test_without_a_caller_a_trace_begins_here(served: Served) -> None:
    served.exporter.clear()
    answer = served.http.post("/v1/completions")
    [span] = served.spans()
    assert span.parent is None
    assert answer.headers["traceparent"].split("-")[1] == f"{span.context.trace_id:032x}"


def test_probes_and_the_dashboard_are_not_traced(served: Served) -> None:
    served.exporter.clear()
    for path in ("/health", "/dashboard/stats"):
        answer = served.http.get(path, headers={"traceparent":
                                                f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
        assert "traceparent" not in answer.headers
    served.http.post("/v1/completions")  # the one span that comes
    assert [s.name for s in served.spans()] == ["POST /v1/completions"]
