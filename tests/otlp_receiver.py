"""An OTLP/HTTP trace receiver on loopback for the tests: what a collector would get, decoded
with OpenTelemetry's own protobuf definitions.

    with OtlpReceiver() as receiver:         # receiver.url: give it to --otlp-traces-endpoint
        ...
        spans = receiver.wait_for(lambda spans: ..., timeout_s=20)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    service: str
    attributes: dict[str, Any] = field(default_factory=dict)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                ok = (self.path == "/v1/traces"
                      and self.headers.get("Content-Type") == "application/x-protobuf")
                if ok:
                    receiver._take(body)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        found = []
        for resource_spans in request.resource_spans:
            service = next((_value(a.value) for a in resource_spans.resource.attributes
                            if a.key == "service.name"), "")
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    found.append(Span(
                        name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(), start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano, service=service,
                        attributes={a.key: _value(a.value) for a in s.attributes}))
        with self._lock:
            self.spans += found
            self.requests += 1

    def wait_for(self, done: Callable[[list[Span]], Any], timeout_s: float = 30.0) -> Any:
        """Poll until done(spans) is truthy; returns it."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                spans = list(self.spans)
            result = done(spans)
            if result:
                return result
            if time.monotonic() > deadline:
                names = sorted({s.name for s in spans})
                raise TimeoutError(f"the spans never came: {len(spans)} received ({names})")
            time.sleep(0.1)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
