"""OpenTelemetry traces of requests (`radixrt serve --otlp-traces-endpoint URL`), exported over
OTLP/HTTP by the official SDK (`pip install radixrt[otel]`); off by default, and then nothing
here is imported and no request is traced.

One trace per request, in the caller's trace when its HTTP request carried a W3C `traceparent`
(server/core/trace_middleware.py makes the HTTP span its child and answers with its own
`traceparent`, so the caller can pass it on). Below the HTTP span, `radixrt.request` spans the
request from submission to its end, with a child span per stage:

    grammar_compile   submission -> its grammar compiled (constrained requests)
    queued            the scheduler got it -> first admitted
    prefix_match      at admission: tokens found in the radix tree, by tier (device/host/disk)
    prefill           one per step that computed a part of its prompt (tokens)
    decode            first token -> end: tokens generated, drafts verified and accepted

The scheduler records the stages of a request submitted with Scheduling.trace
(trace_messages.RequestTrace) and sends them with its final output; the spans are made when the
request ends (on_finish), with the times the stages had (wall clock: one clock on one machine).
A request whose reader ended before the scheduler did (a stop string seen by the front, a client
gone) waits for its record up to LATE_TRACE_S (the front hands it over: `late`); past that, or
past MAX_WAITING such requests, its spans go without the scheduler's stages.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

from radixrt.runtime.messages import TIER_NAMES
from radixrt.runtime.tokenizer.request_metrics import RequestMetrics
from radixrt.runtime.trace_messages import RequestTrace

OTLP_TRACES_PATH = "/v1/traces"  # where an OTLP/HTTP collector takes traces
EXPORT_DELAY_MS = 500  # spans wait at most this long in the batch before they are sent
SERVICE_NAME = "radixrt"
LATE_TRACE_S = 10.0
MAX_WAITING = 4096
NS = 1_000_000_000


def traces_url(endpoint: str) -> str:
    """`http://host:4318` -> `http://host:4318/v1/traces`; a URL with a path is kept."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--otlp-traces-endpoint {endpoint!r} is not an http(s) URL: give the "
                         "collector's OTLP/HTTP address, e.g. http://127.0.0.1:4318")
    return endpoint if parts.path not in ("", "/") else endpoint.rstrip("/") + OTLP_TRACES_PATH


class RequestTracer:
    """The SDK's tracer provider with a batching OTLP/HTTP exporter, and the spans of one
    request made from its RequestMetrics."""

    def __init__(self, endpoint: str, service_name: str = SERVICE_NAME,
                 exporter: Any = None) -> None:
        """exporter: where the batched spans go (default: OTLP/HTTP to `endpoint`)."""
        try:
            from opentelemetry import trace
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError as exc:
            raise RuntimeError("--otlp-traces-endpoint needs the OpenTelemetry SDK: pip "
                               f"install 'radixrt[otel]' ({exc})") from exc
        self.url = traces_url(endpoint)
        self._trace = trace
        self._provider = TracerProvider(resource=Resource.create({"service.name":
                                                                  service_name}))
        exporter = exporter if exporter is not None else OTLPSpanExporter(endpoint=self.url)
        self._provider.add_span_processor(BatchSpanProcessor(
            exporter, schedule_delay_millis=EXPORT_DELAY_MS))
        self.tracer = self._provider.get_tracer("radixrt")
        self.propagator = TraceContextTextMapPropagator()
        # rid -> (a finished request waiting for the scheduler's record, until when), and
        # rid -> (a record that came before its request finished here, until when); both in
        # the order they came, which is their order of expiry
        self._waiting: dict[int, tuple[RequestMetrics, float]] = {}
        self._early: dict[int, tuple[RequestTrace, float]] = {}

    # --- at submission -----------------------------------------------------------------------
    def context(self) -> Any | None:
        """The caller's trace context to record under, or None when the caller asked for its
        trace not to be sampled (then the scheduler records nothing either)."""
        current = self._trace.get_current_span().get_span_context()
        if current.is_valid and not current.trace_flags.sampled:
            return None
        from opentelemetry import context

        return context.get_current()

    # --- at the end ----------------------------------------------------------------------------
    def record(self, m: RequestMetrics) -> None:
        """on_finish callback: the request's spans, if it was traced (once the scheduler's
        record of it is here)."""
        if m.trace_context is None or m.finished is None:
            return
        now = time.monotonic()
        self._expire(now)
        if m.trace is None and m.rid >= 0:
            early = self._early.pop(m.rid, None)
            if early is None:
                self._waiting[m.rid] = (m, now + LATE_TRACE_S)
                return
            m.trace = early[0]
        self._spans(m)

    def late(self, rid: int, trace: RequestTrace) -> None:
        """The front's on_late_trace: the scheduler's record of a request whose reader ended
        (or is ending: it may come before the reader's own end is recorded)."""
        entry = self._waiting.pop(rid, None)
        if entry is not None:
            entry[0].trace = trace
            self._spans(entry[0])
        else:
            self._early[rid] = (trace, time.monotonic() + LATE_TRACE_S)
            self._expire(time.monotonic())

    def _expire(self, now: float) -> None:
        """Requests waiting past LATE_TRACE_S (or past MAX_WAITING of them) go without the
        scheduler's stages; records nobody claimed are dropped. Oldest first, stopping at the
        first that may still wait."""
        for table in (self._waiting, self._early):
            while table:
                rid, (item, until) = next(iter(table.items()))
                if until >= now and len(table) <= MAX_WAITING:
                    break
                del table[rid]
                if isinstance(item, RequestMetrics):
                    self._spans(item)

    def _spans(self, m: RequestMetrics) -> None:
        assert m.finished is not None
        start = _ns(m.wall_arrival)
        end = start + _ns(m.finished - m.arrival)
        attributes: dict[str, Any] = {
            "radixrt.prompt_tokens": m.prompt_tokens,
            "radixrt.cached_tokens": m.cached_tokens,
            "radixrt.completion_tokens": m.completion_tokens,
            "radixrt.finish_reasons": list(m.finish_reasons),
            "radixrt.priority": m.priority,
        }
        for key, value in (("tenant", m.tenant), ("lora", m.lora), ("pooling", m.pooling)):
            if value:
                attributes[f"radixrt.{key}"] = value
        root = self.tracer.start_span("radixrt.request", context=m.trace_context,
                                      start_time=start, attributes=attributes)
        under = self._trace.set_span_in_context(root)

        def stage(name: str, begin: int, finish: int, **attrs: Any) -> None:
            span = self.tracer.start_span(name, context=under, start_time=begin,
                                          attributes={f"radixrt.{k}": v
                                                      for k, v in attrs.items()})
            span.end(end_time=max(finish, begin))

        grammar = m.grammar
        if grammar is not None and grammar.ended is not None:
            stage("grammar_compile", start + _ns(grammar.started - m.arrival),
                  start + _ns(grammar.ended - m.arrival), cached=grammar.cached)
        t = m.trace
        if t is not None:
            root.set_attribute("radixrt.preemptions", t.preemptions)
            admitted = _ns(t.admitted_at) if t.admitted_at >= 0 else end
            stage("queued", _ns(t.queued_at), admitted)
            if t.admitted_at >= 0:
                hits = {f"hit_tokens.{TIER_NAMES[i]}": n for i, n in enumerate(t.hit_tokens)}
                stage("prefix_match", admitted, admitted, cached_tokens=m.cached_tokens,
                      **hits)
            for chunk in t.chunks:
                stage("prefill", _ns(chunk.start), _ns(chunk.end), tokens=chunk.tokens)
        if m.first_token is not None:
            drafted = t.drafted_tokens if t is not None else 0
            accepted = t.accepted_tokens if t is not None else 0
            stage("decode", start + _ns(m.first_token - m.arrival), end,
                  tokens=m.completion_tokens, spec_drafted_tokens=drafted,
                  spec_accepted_tokens=accepted)
        root.end(end_time=end)

    def flush(self) -> None:
        """Send what is batched now."""
        self._provider.force_flush()

    def shutdown(self) -> None:
        """Send what is batched (the requests still waiting for their record without it), then
        stop the exporter."""
        for m, _ in self._waiting.values():
            self._spans(m)
        self._waiting.clear()
        self._early.clear()
        self._provider.shutdown()


def _ns(seconds: float) -> int:
    return int(seconds * NS)
