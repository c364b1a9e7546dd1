"""Seeing inside a real `radixrt serve` (with an API key, --dashboard-show-text and
--otlp-traces-endpoint): the live page in a real browser (Debian's Chromium, headless) whose
counters move and whose tree shows the shared prefix with its hits, refused without the key;
and one OpenTelemetry trace per request, in the caller's trace, with its stages, received by an
OTLP collector on loopback."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from headless_browser import Browser, chromium_path
from otlp_receiver import OtlpReceiver, Span
from test_server import API_KEY, Server

pytestmark = pytest.mark.slow  # a server as real processes

SYSTEM = ("You are the concierge of a small hotel in Lisbon. Answer every guest in one short "
          "sentence and always name one place in the city they could visit.")
QUESTIONS = ["Where can I eat fish tonight?", "Is there a museum nearby?",
             "Where do I see the sunset?"]
SCREENSHOT_ENV = "RADIXRT_DASHBOARD_SCREENSHOT"  # a path: the test saves the page there


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


@pytest.fixture(scope="module")
def server(receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log_path = tmp_path_factory.mktemp("observability") / "server.log"
    with open(log_path, "w") as log:  # info: the access log too (it must not show the key)
        srv = Server("--max-total-tokens", "4096", "--api-key", API_KEY, "--log-level", "info",
                     "--check-integrity", "--dashboard-show-text",
                     "--otlp-traces-endpoint", receiver.url, log=log)
        srv.log_path = log_path
        yield srv
        srv.stop()


def client(server: Server, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0,
                         default_headers=headers or None)


def ask(server: Server, question: str, **headers: str) -> Any:
    return client(server, **headers).chat.completions.with_raw_response.create(
        model="default", max_tokens=8, temperature=0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])


def test_the_dashboard_in_a_real_browser(server: Server) -> None:
    chromium_path()  # skips (or fails under make test) before anything when it is missing
    with Browser() as browser:
        # without the key: refused, nothing of the page
        browser.open(f"{server.url}/dashboard")
        assert "a valid API key is required" in browser.evaluate("document.body.innerText")
        assert browser.evaluate("document.getElementById('tree') === null")
        # the key once in the address: the page, the key off the address bar
        browser.open(f"{server.url}/dashboard?api_key={API_KEY}")
        assert browser.evaluate("location.href") == f"{server.url}/dashboard"
        browser.wait_for("Number(document.body.dataset.updates) >= 1")
        assert not browser.evaluate("document.getElementById('status').className"
                                    ".includes('error')")
        before = _count(browser.evaluate("document.getElementById('requests-total')"
                                         ".textContent"))
        for question in QUESTIONS:
            ask(server, question)
        # the counters move and the tree shows the shared prefix with its hits
        browser.wait_for(f"Number(document.getElementById('requests-total').textContent"
                         f".replace(/,/g, '')) >= {before + len(QUESTIONS)}")
        shared = browser.wait_for("""(() => {
            const nodes = [...document.querySelectorAll('#tree .node')]
              .filter((g) => Number(g.dataset.depth) === 1 && Number(g.dataset.hits) >= 2);
            return nodes.length ? {tokens: Number(nodes[0].dataset.tokens),
                                   hits: Number(nodes[0].dataset.hits),
                                   tier: nodes[0].dataset.tier} : null;
        })()""")
        assert shared["tokens"] >= 30 and shared["tier"] == "device"
        hottest = browser.evaluate(
            "document.querySelector('#hot-nodes tr:nth-child(2)').innerText")
        assert "concierge of a small hotel" in hottest, hottest
        assert _count(browser.evaluate(
            "document.getElementById('generated-total').textContent")) >= len(QUESTIONS)
        assert browser.evaluate("document.getElementById('hit-rate').textContent") != "0.0 %"
        if os.environ.get(SCREENSHOT_ENV):
            browser.screenshot(os.environ[SCREENSHOT_ENV])
    logged = server.log_path.read_text()
    assert "GET /dashboard?api_key=*** HTTP/1.1" in logged  # the access log saw it, redacted
    assert API_KEY not in logged


def _count(text: str) -> int:
    return int(text.replace(",", "")) if re.fullmatch(r"[\d,]+", text) else 0


def test_one_trace_per_request_with_its_stages_in_the_callers_trace(
        server: Server, receiver: OtlpReceiver) -> None:
    traces = ["4bf92f3577b34da6a3ce929d0e0e4736", "5cf92f3577b34da6a3ce929d0e0e4737"]
    caller_span = "00f067aa0ba902b7"
    drafted_before = server.info()["spec_drafted_tokens"]
    first = ask(server, "A question to put the system prompt in the cache.",
                traceparent=f"00-{traces[0]}-{caller_span}-01")
    schema = {"type": "object", "properties": {"place": {"type": "string"}},
              "required": ["place"]}
    second = client(server, traceparent=f"00-{traces[1]}-{caller_span}-01").chat.completions \
        .with_raw_response.create(
            model="default", max_tokens=24, temperature=0,
            messages=[{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": "Name a place, as JSON."}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "place", "schema": schema}})
    drafted = server.info()["spec_drafted_tokens"] - drafted_before
    assert drafted > 0  # the JSON answer copies its schema's keys: the tree drafts them
    for response, trace_id in ((first, traces[0]), (second, traces[1])):
        # the answer names the server's span in the caller's trace: the caller can pass it on
        assert response.headers["traceparent"].split("-")[1] == trace_id
    spans = receiver.wait_for(lambda spans: _requests(spans, traces))
    decodes = []
    for response, trace_id in ((first, traces[0]), (second, traces[1])):
        usage = response.parse().usage
        mine = [s for s in spans if s.trace_id == trace_id]
        by_id = {s.span_id: s for s in mine}
        [request] = [s for s in mine if s.name == "radixrt.request"]  # one per request
        http = by_id[request.parent_id]
        assert http.name == "POST /v1/chat/completions" and http.parent_id == caller_span
        assert http.attributes["http.response.status_code"] == 200
        stages = {s.name: s for s in mine if s.parent_id == request.span_id}
        assert {"queued", "prefix_match", "prefill", "decode"} <= set(stages), stages
        assert http.start_ns <= request.start_ns <= request.end_ns <= http.end_ns
        for s in mine:
            if s.parent_id != request.span_id:
                continue
            assert request.start_ns <= s.start_ns <= s.end_ns <= request.end_ns + 1_000_000
        assert request.attributes["radixrt.prompt_tokens"] == usage.prompt_tokens
        assert request.attributes["radixrt.completion_tokens"] == usage.completion_tokens
        cached = usage.prompt_tokens_details.cached_tokens
        match = stages["prefix_match"].attributes
        assert match["radixrt.cached_tokens"] == cached
        assert match["radixrt.hit_tokens.device"] >= cached  # whole pages matched, one to compute
        chunks = [s for s in mine if s.name == "prefill"]
        assert sum(c.attributes["radixrt.tokens"] for c in chunks) == usage.prompt_tokens - cached
        assert stages["queued"].end_ns <= min(c.start_ns for c in chunks) + 1_000_000
        decode = stages["decode"]
        assert decode.attributes["radixrt.tokens"] == usage.completion_tokens
        decodes.append(decode)
    [compiled] = [s for s in spans if s.trace_id == traces[1] and s.name == "grammar_compile"]
    assert compiled.attributes["radixrt.cached"] is False  # a schema no request had before
    assert "grammar_compile" not in {s.name for s in spans if s.trace_id == traces[0]}
    second_match = next(s for s in spans if s.trace_id == traces[1]
                        and s.name == "prefix_match")
    assert second_match.attributes["radixrt.cached_tokens"] >= 30  # the system prompt
    # speculation: the drafts each request's decode verified are the server's
    assert sum(d.attributes["radixrt.spec_drafted_tokens"] for d in decodes) == drafted
    for d in decodes:
        assert 0 <= d.attributes["radixrt.spec_accepted_tokens"] <= \
            d.attributes["radixrt.spec_drafted_tokens"]
    # a stop string ends the answer here, before the scheduler's last output (with the
    # stages) comes: the trace still has them
    stopped_trace = "7df92f3577b34da6a3ce929d0e0e4739"
    stopped = client(server, traceparent=f"00-{stopped_trace}-{caller_span}-01").completions \
        .create(model="default", prompt=SYSTEM + " Guest: hello", max_tokens=16, stop=[" "],
                temperature=0)
    assert stopped.choices[0].finish_reason == "stop"
    stop_spans = receiver.wait_for(lambda spans: {
        s.name for s in spans if s.trace_id == stopped_trace} >= {
        "radixrt.request", "queued", "prefix_match", "prefill"} and spans)
    assert any(s.name == "radixrt.request" and s.trace_id == stopped_trace
               and s.attributes["radixrt.finish_reasons"] == ["stop"] for s in stop_spans)
    # a caller that asks for no sampling gets no spans; every span names the service
    requests_before = len(_all(receiver.spans))
    unsampled = "6cf92f3577b34da6a3ce929d0e0e4738"
    ask(server, "Not traced, please.", traceparent=f"00-{unsampled}-{caller_span}-00")
    ask(server, "Traced without a caller.")  # ends after the unsampled one: exported after it
    later = receiver.wait_for(lambda spans: len(_all(spans)) > requests_before and spans)
    assert len(_all(later)) == requests_before + 1
    assert all(s.trace_id != unsampled for s in later)
    assert {s.service for s in later} == {"radixrt"}
    assert not [s for s in later if s.name.startswith(("GET /health", "GET /metrics"))]


def _requests(spans: list[Span], traces: list[str]) -> list[Span] | None:
    """All spans once each trace has its request span and the HTTP span above it."""
    done = all(any(s.trace_id == t and s.name == "radixrt.request" for s in spans)
               and any(s.trace_id == t and s.name.startswith("POST ") for s in spans)
               for t in traces)
    return spans if done else None


def _all(spans: list[Span]) -> list[Span]:
    return [s for s in spans if s.name == "radixrt.request"]
