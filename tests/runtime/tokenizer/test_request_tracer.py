"""The spans of one traced request (tokenizer/request_tracer.py), made from what the front and
the scheduler recorded, into the SDK's in-memory exporter: the stages as children of
`radixrt.request`, at the times they had, under the caller's context; an untraced request
makes none."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import context, trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from radixrt.runtime.outputs import StreamChunk
from radixrt.runtime.tokenizer.request_front import GrammarTiming
from radixrt.runtime.tokenizer.request_metrics import RequestMetrics
from radixrt.runtime.tokenizer.request_tracer import RequestTracer, traces_url
from radixrt.runtime.trace_messages import MAX_CHUNKS, PrefillChunk, RequestTrace, add_chunk

T0 = 1_800_000_000.0  # wall clock of the arrival
M0 = 500.0  # monotonic clock of the arrival


@pytest.fixture()
def traced() -> Iterator[tuple[RequestTracer, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    tracer = RequestTracer("http://127.0.0.1:4318", exporter=exporter)
    yield tracer, exporter
    tracer.shutdown()


def metrics(trace_context: object, **extra: object) -> RequestMetrics:
    m = RequestMetrics(arrival=M0, first_token=M0 + 0.30, finished=M0 + 0.50, prompt_tokens=40,
                       cached_tokens=32, completion_tokens=6, tenant="alice",
                       finish_reasons=["stop"], wall_arrival=T0, trace_context=trace_context,
                       grammar=compiled(M0 + 0.001, M0 + 0.051))
    m.trace = RequestTrace(queued_at=T0 + 0.01, admitted_at=T0 + 0.10, hit_tokens=[24, 8, 0],
                           chunks=[PrefillChunk(T0 + 0.10, T0 + 0.20, 5),
                                   PrefillChunk(T0 + 0.20, T0 + 0.29, 3)],
                           drafted_tokens=4, accepted_tokens=2, preemptions=1)
    for key, value in extra.items():
        setattr(m, key, value)
    return m


def compiled(started: float, ended: float | None, cached: bool = False) -> GrammarTiming:
    timing = GrammarTiming(started, cached)
    timing.ended = ended if not cached else started
    return timing


def ns(seconds: float) -> int:
    return int(seconds * 1e9)


def test_a_request_is_one_span_with_a_child_per_stage(traced) -> None:
    tracer, exporter = traced
    tracer.record(metrics(context.get_current()))
    tracer.flush()
    spans = exporter.get_finished_spans()
    [root] = [s for s in spans if s.name == "radixrt.request"]
    assert root.parent is None and root.resource.attributes["service.name"] == "radixrt"
    assert (root.start_time, root.end_time) == (ns(T0), ns(T0) + ns(0.50))
    assert root.attributes["radixrt.tenant"] == "alice"
    assert root.attributes["radixrt.preemptions"] == 1
    children = [s for s in spans if s is not root]
    assert all(s.parent.span_id == root.context.span_id for s in children)
    assert all(s.context.trace_id == root.context.trace_id for s in children)
    named = {s.name: s for s in children}
    assert [s.name for s in children].count("prefill") == 2
    assert set(named) == {"grammar_compile", "queued", "prefix_match", "prefill", "decode"}
    assert (named["queued"].start_time, named["queued"].end_time) == (ns(T0 + 0.01),
                                                                      ns(T0 + 0.10))
    compile_span = named["grammar_compile"]
    assert abs(compile_span.start_time - ns(T0) - ns(0.001)) <= 1000
    assert abs(compile_span.end_time - compile_span.start_time - ns(0.05)) <= 1000
    assert compile_span.attributes["radixrt.cached"] is False
    match = named["prefix_match"].attributes
    assert (match["radixrt.cached_tokens"], match["radixrt.hit_tokens.device"],
            match["radixrt.hit_tokens.host"], match["radixrt.hit_tokens.disk"]) == (32, 24, 8, 0)
    prefill = sorted((s for s in children if s.name == "prefill"), key=lambda s: s.start_time)
    assert [s.attributes["radixrt.tokens"] for s in prefill] == [5, 3]
    decode = named["decode"]
    assert decode.start_time == ns(T0) + ns(0.30) and decode.end_time == root.end_time
    assert (decode.attributes["radixrt.tokens"], decode.attributes["radixrt.spec_drafted_tokens"],
            decode.attributes["radixrt.spec_accepted_tokens"]) == (6, 4, 2)


def test_the_request_span_goes_under_the_callers_span(traced) -> None:
    tracer, exporter = traced
    caller = trace.SpanContext(trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
                               span_id=0x00F067AA0BA902B7, is_remote=True,
                               trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
    under = trace.set_span_in_context(trace.NonRecordingSpan(caller))
    token = context.attach(under)
    try:
        assert tracer.context() is not None
        tracer.record(metrics(tracer.context()))
    finally:
        context.detach(token)
    tracer.flush()
    [root] = [s for s in exporter.get_finished_spans() if s.name == "radixrt.request"]
    assert root.context.trace_id == caller.trace_id and root.parent.span_id == caller.span_id


def test_an_unsampled_caller_and_an_untraced_request_make_no_spans(traced) -> None:
    tracer, exporter = traced
    caller = trace.SpanContext(trace_id=1, span_id=2, is_remote=True,
                               trace_flags=trace.TraceFlags(0))
    token = context.attach(trace.set_span_in_context(trace.NonRecordingSpan(caller)))
    try:
        assert tracer.context() is None  # the scheduler is not even asked to record
    finally:
        context.detach(token)
    tracer.record(metrics(None))  # never traced
    tracer.record(metrics(context.get_current(), finished=None))  # never ended
    tracer.flush()
    assert exporter.get_finished_spans() == ()


def test_a_request_refused_before_admission_has_no_prefix_match(traced) -> None:
    tracer, exporter = traced
    m = metrics(context.get_current(), first_token=None, completion_tokens=0,
                grammar=compiled(M0, None))  # refused while its grammar compiled
    m.trace = RequestTrace(queued_at=T0 + 0.01)
    tracer.record(m)
    tracer.flush()
    names = sorted(s.name for s in exporter.get_finished_spans())
    assert names == ["queued", "radixrt.request"]
    queued = next(s for s in exporter.get_finished_spans() if s.name == "queued")
    assert queued.end_time == ns(T0) + ns(0.50)  # waited until it ended


def test_the_collector_url() -> None:
    assert traces_url("http://127.0.0.1:4318") == "http://127.0.0.1:4318/v1/traces"
    assert traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert traces_url("https://c.example/otlp/v1/traces") == "https://c.example/otlp/v1/traces"
    for bad in ("127.0.0.1:4318", "grpc://c:4317", "http://"):
        with pytest.raises(ValueError, match="OTLP/HTTP"):
            traces_url(bad)


def test_a_request_that_ended_here_first_waits_for_the_schedulers_record(traced) -> None:
    """A stop string ends the reader before the scheduler's final output (with the stages)
    comes: the spans wait for it, and go without it only past the wait or at shutdown."""
    tracer, exporter = traced
    m = metrics(context.get_current(), rid=7)
    stages, m.trace = m.trace, None
    tracer.record(m)
    tracer.flush()
    assert exporter.get_finished_spans() == ()  # waiting for the scheduler's record
    tracer.late(8, stages)  # another request's: nothing
    tracer.late(7, stages)
    tracer.flush()
    names = sorted(s.name for s in exporter.get_finished_spans())
    assert names == ["decode", "grammar_compile", "prefill", "prefill", "prefix_match",
                     "queued", "radixrt.request"]
    exporter.clear()
    never = metrics(context.get_current(), rid=9)
    never.trace = None
    tracer.record(never)
    tracer.shutdown()  # it goes out without the stages rather than never
    assert sorted(s.name for s in exporter.get_finished_spans()) == [
        "decode", "grammar_compile", "radixrt.request"]


def test_n_samples_add_their_drafts_and_share_the_prompts_stages() -> None:
    first = RequestTrace(queued_at=1.0, admitted_at=2.0, hit_tokens=[4, 0, 0],
                         chunks=[PrefillChunk(2.0, 3.0, 9)], drafted_tokens=4,
                         accepted_tokens=1, preemptions=1)
    second = RequestTrace(queued_at=1.0, admitted_at=2.0, hit_tokens=[4, 0, 0],
                          chunks=[PrefillChunk(2.0, 3.0, 9)], drafted_tokens=6,
                          accepted_tokens=3)
    m = RequestMetrics(arrival=0.0)
    for sample in (first, second):
        m.record(StreamChunk(rid=1, index=0, text="", token_ids=[], trace=sample), 1.0)
    assert m.trace is not None
    assert (m.trace.drafted_tokens, m.trace.accepted_tokens, m.trace.preemptions) == (10, 4, 1)
    assert m.trace.chunks == first.chunks


def test_prefill_chunks_are_bounded() -> None:
    trace = RequestTrace()
    for i in range(MAX_CHUNKS + 10):
        add_chunk(trace, PrefillChunk(float(i), i + 0.5, 2))
    assert len(trace.chunks) == MAX_CHUNKS
    assert sum(c.tokens for c in trace.chunks) == 2 * (MAX_CHUNKS + 10)
    assert trace.chunks[-1].end == MAX_CHUNKS + 9.5


def test_the_record_may_come_before_the_reader_ends(traced) -> None:
    """On the in-process link the scheduler's record of a request a stop string ended comes
    inside the front's receive, before the reader's end is recorded: it is kept for it."""
    tracer, exporter = traced
    m = metrics(context.get_current(), rid=11)
    stages, m.trace = m.trace, None
    tracer.late(11, stages)
    tracer.record(m)
    tracer.flush()
    assert "prefill" in {s.name for s in exporter.get_finished_spans()}


def test_a_stop_string_keeps_the_stages_through_a_real_engine(loaded_model: Any) -> None:
    from radixrt import Engine
    from radixrt.runtime.sampling_params import SamplingParams

    engine = Engine(model=loaded_model, max_total_tokens=1024, check_integrity=True)
    manager = engine.tokenizer_manager()
    exporter = InMemorySpanExporter()
    tracer = RequestTracer("http://127.0.0.1:4318", exporter=exporter)
    manager.trace_with(tracer)
    ids = manager.encode("The capital of France is")

    async def run(params: SamplingParams) -> list[Any]:
        return [c async for c in manager.generate(ids, params)]

    plain = asyncio.run(run(SamplingParams(max_tokens=8, temperature=0)))
    word = "".join(c.text for c in plain).split()[1]
    stopped = asyncio.run(run(SamplingParams(max_tokens=16, temperature=0, stop=[word])))
    assert stopped[-1].finish_reason == "stop"
    tracer.shutdown()
    spans = exporter.get_finished_spans()
    requests = [s for s in spans if s.name == "radixrt.request"]
    assert len(requests) == 2
    for request in requests:
        stages = {s.name for s in spans if s.parent is not None
                  and s.parent.span_id == request.context.span_id}
        assert {"queued", "prefix_match", "prefill", "decode"} <= stages, stages
    engine.check_integrity()
