"""The HTTP layer over a real socket: the official openai client and httpx against create_app,
served by uvicorn in a background thread, on an in-process Engine (engine.tokenizer_manager())."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from http_serving import Served, serve_in_thread, sse_events, wait_idle

API_KEY = "sk-test-key"
MODEL = "default"
PROMPT = "The capital of France is"
PIN_TTL_S = 2.0
LONG_PREFIX = " ".join(f"Fact {i}: the number {i} is written as {i}." for i in range(20))


@pytest.fixture(scope="module")
def served(loaded_model: Any) -> Iterator[Served]:
    from radixrt import Engine
    from radixrt.runtime.server.http_server import create_app
    from radixrt.runtime.tokenizer.pin_leases import PinService

    engine = Engine(model=loaded_model, max_total_tokens=4096, check_integrity=True)
    manager = engine.tokenizer_manager("smollm2")
    pins = PinService(manager, ttl_s=PIN_TTL_S)  # both apps: one set of leases
    ports, stop = serve_in_thread([create_app(manager, pins=pins),
                                   create_app(manager, api_key=API_KEY, pins=pins)])
    srv = Served(engine, ports)
    yield srv
    srv.http.close()
    stop()
    engine.check_integrity()


def complete(srv: Served, **kwargs: Any) -> Any:
    kwargs.setdefault("model", MODEL)
    kwargs.setdefault("prompt", PROMPT)
    kwargs.setdefault("max_tokens", 6)
    kwargs.setdefault("temperature", 0)
    return srv.client.completions.create(**kwargs)


# --- conversion (no server) ----------------------------------------------------------------------


def test_request_to_sampling_params() -> None:
    from radixrt.runtime.server.openai.openai_protocol import CompletionRequest, to_sampling_params

    req = CompletionRequest(model=MODEL, prompt="x", temperature=0, stop="END",
                            logit_bias={"5": 2}, seed=3, n=2)
    params = to_sampling_params(req, None)
    assert params.max_tokens is None and params.stop == ("END",) and params.n == 2
    assert dict(params.logit_bias or {}) == {5: 2.0} and params.seed == 3 and params.is_greedy
    assert to_sampling_params(req, 7, logprobs=True, top_logprobs=2).top_logprobs == 2


def test_max_tokens_left_out_means_the_same_at_every_entry_point(loaded_model: Any) -> None:
    """One default rule: the rest of the context (here a 40-token context), at most 256, for
    the Engine, /v1/completions, /v1/chat/completions and /generate alike."""
    from radixrt import Engine, SamplingParams
    from radixrt.runtime.server.http_server import create_app

    engine = Engine(model=loaded_model, max_total_tokens=512, context_length=40,
                    check_integrity=True)
    prompt = "One, two, three,"
    out = engine.generate(prompt, SamplingParams(ignore_eos=True, temperature=0))[0]
    assert out.prompt_tokens + out.completion_tokens == 40
    ports, stop = serve_in_thread([create_app(engine.tokenizer_manager("smollm2"))])
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{ports[0]}", timeout=120) as http:
            completion = http.post("/v1/completions", json={
                "model": MODEL, "prompt": prompt, "ignore_eos": True, "temperature": 0}).json()
            assert completion["usage"]["completion_tokens"] == out.completion_tokens
            assert completion["choices"][0]["text"] == out.text
            native = http.post("/generate", json={
                "text": prompt, "sampling_params": {"ignore_eos": True, "temperature": 0}}).json()
            assert native["meta_info"]["completion_tokens"] == out.completion_tokens
            chat = http.post("/v1/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                "ignore_eos": True, "temperature": 0}).json()
            usage = chat["usage"]
            assert usage["prompt_tokens"] + usage["completion_tokens"] == 40
    finally:
        stop()
    engine.check_integrity()


# --- OpenAI API --------------------------------------------------------------------------------


def test_models_lists_the_served_name(served: Served) -> None:
    assert [m.id for m in served.client.models.list().data] == ["smollm2"]


def test_completion_stream_matches_non_stream(served: Served) -> None:
    whole = complete(served, model="smollm2", extra_body={"ignore_eos": True})
    choice = whole.choices[0]
    assert whole.object == "text_completion" and choice.index == 0 and choice.text
    assert choice.finish_reason == "length"
    assert whole.usage.completion_tokens == 6
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 6
    stream = complete(served, stream=True, stream_options={"include_usage": True},
                      extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert chunks[-1].usage.completion_tokens == 6 and not chunks[-1].choices


def test_chat_and_chat_stream(served: Served) -> None:
    messages = [{"role": "user", "content": "Say hello."}]
    whole = served.client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=6, temperature=0
    )
    assert whole.object == "chat.completion"
    text = whole.choices[0].message.content
    assert text and whole.choices[0].message.role == "assistant"
    stream = served.client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_n_and_prompt_list_index_choices(served: Served) -> None:
    out = complete(served, prompt=["One, two,", "A, B,"], n=2, max_tokens=3,
                   temperature=0.8, seed=1)
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    assert all(c.finish_reason in ("length", "stop") for c in out.choices)
    single = complete(served, prompt="One, two,", max_tokens=3)
    assert single.usage.prompt_tokens * 2 <= out.usage.prompt_tokens + single.usage.prompt_tokens


def test_logprobs(served: Served) -> None:
    out = complete(served, logprobs=2, max_tokens=3, extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert all(len(top) <= 2 and lp.token_logprobs[i] <= 0 for i, top in enumerate(lp.top_logprobs))
    assert "".join(lp.tokens) == out.choices[0].text and lp.text_offset[0] == 0
    chat = served.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0,
        logprobs=True, top_logprobs=2,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(len(item.top_logprobs) == 2 and item.logprob <= 0 for item in content)
    assert content[0].top_logprobs[0].logprob >= content[0].top_logprobs[1].logprob


def post_completion(srv: Served, **body: Any) -> dict[str, Any]:
    body = {"model": MODEL, "temperature": 0, **body}
    response = srv.http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def assert_offsets_index_text(lp: dict[str, Any], text: str) -> None:
    assert "".join(lp["tokens"]) == text
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"])
    for token, offset in zip(lp["tokens"], lp["text_offset"], strict=True):
        assert text[offset : offset + len(token)] == token


def test_echo_returns_prompt_then_completion(served: Served) -> None:
    plain = complete(served, max_tokens=4, extra_body={"ignore_eos": True})
    echoed = complete(served, max_tokens=4, echo=True, extra_body={"ignore_eos": True})
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    assert echoed.choices[0].logprobs is None
    assert echoed.usage.completion_tokens == 4


def test_echo_scores_prompts_like_the_engine(served: Served, make_engine: Any) -> None:
    from radixrt import SamplingParams

    prompts = [PROMPT + " Paris.", PROMPT + " a city in Germany."]
    out = post_completion(served, prompt=prompts, echo=True, logprobs=1, max_tokens=0)
    assert out["usage"]["completion_tokens"] == 0
    engine = make_engine()
    for choice, prompt in zip(out["choices"], prompts, strict=True):
        expect = engine.generate(prompt, SamplingParams(max_tokens=1, prompt_logprobs_start=1))
        lp, text = choice["logprobs"], choice["text"]
        assert text == prompt and choice["finish_reason"] == "length"
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert len(lp["token_logprobs"]) == expect[0].prompt_tokens
        want = [p.logprob for p in expect[0].prompt_logprobs]
        assert lp["token_logprobs"][1:] == pytest.approx(want, abs=1e-4)
        assert all(len(top) == 1 for top in lp["top_logprobs"][1:])
        assert_offsets_index_text(lp, text)
    one = post_completion(served, prompt=prompts[0], echo=True, logprobs=1, max_tokens=1)
    lp = one["choices"][0]["logprobs"]
    scored = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(scored["tokens"]) + 1
    assert lp["token_logprobs"][:-1] == pytest.approx(scored["token_logprobs"], abs=1e-4)
    assert lp["text_offset"][-1] == len(prompts[0]) and one["usage"]["completion_tokens"] == 1
    assert_offsets_index_text(lp, one["choices"][0]["text"])


def test_echo_streams_the_prompt_first(served: Served) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 3,
            "temperature": 0, "ignore_eos": True, "n": 2}
    whole = post_completion(served, **{**body, "n": 1})["choices"][0]
    with served.http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        events = [e for e in sse_events(response) if e != "[DONE]"]
    for index in (0, 1):
        chunks = [e["choices"][0] for e in events if e["choices"][0]["index"] == index]
        assert chunks[0]["text"].startswith(PROMPT)
        assert "".join(c["text"] for c in chunks) == whole["text"]
        merged = {k: sum((c["logprobs"][k] for c in chunks), []) for k in whole["logprobs"]}
        assert merged["tokens"] == whole["logprobs"]["tokens"]
        assert merged["text_offset"] == whole["logprobs"]["text_offset"]
        assert merged["token_logprobs"][0] is None


ARITHMETIC_GBNF = 'root ::= term (op term)?\nterm ::= [0-9] [0-9]?\nop ::= "+" | "*"'


@pytest.mark.parametrize("fields", [
    {"ebnf": ARITHMETIC_GBNF},
    {"lark": 'start: TERM (OP TERM)?\nTERM: /[0-9]{1,2}/\nOP: "+" | "*"'},
    {"response_format": {"type": "grammar", "grammar": ARITHMETIC_GBNF}},
])
def test_context_free_grammars_over_http(served: Served, fields: dict[str, Any]) -> None:
    """ebnf / lark extra fields (SGLang's and vLLM's names) and vLLM's response_format of type
    grammar: the output is in the grammar's language."""
    body = post_completion(served, prompt="Write a sum: ", max_tokens=16, temperature=0.8,
                           seed=3, n=3, **fields)
    for choice in body["choices"]:
        assert choice["finish_reason"] == "stop"
        assert re.fullmatch(r"[0-9]{1,2}([+*][0-9]{1,2})?", choice["text"]), choice["text"]


def test_stop_string_trims_output(served: Served) -> None:
    text = complete(served, max_tokens=12, extra_body={"ignore_eos": True}).choices[0].text
    assert len(text) >= 8, text
    stop = text[5:8]
    out = complete(served, max_tokens=12, stop=[stop], extra_body={"ignore_eos": True})
    assert out.choices[0].text == text[: text.index(stop)]
    assert out.choices[0].finish_reason == "stop"


def test_repeated_prefix_reports_cached_tokens(served: Served) -> None:
    first = complete(served, prompt=LONG_PREFIX + " Question one?", max_tokens=1)
    second = complete(served, prompt=LONG_PREFIX + " Question two?", max_tokens=1)
    assert first.usage.prompt_tokens > 100
    assert second.usage.prompt_tokens_details.cached_tokens > 100


# --- native API --------------------------------------------------------------------------------


def test_generate_plain_and_streaming(served: Served) -> None:
    sp = {"max_tokens": 5, "temperature": 0, "ignore_eos": True}
    out = served.http.post("/generate", json={"text": PROMPT, "sampling_params": sp}).json()
    meta = out["meta_info"]
    assert len(out["output_ids"]) == meta["completion_tokens"] == 5
    assert meta["finish_reason"] == {"type": "length", "length": 5} and meta["prompt_tokens"] > 0
    ids = served.engine.tokenizer.encode(PROMPT)
    by_ids = served.http.post("/generate", json={"input_ids": ids, "sampling_params": sp}).json()
    assert by_ids["output_ids"] == out["output_ids"]
    body = {"text": PROMPT, "sampling_params": sp, "stream": True}
    with served.http.stream("POST", "/generate", json=body) as response:
        events = list(sse_events(response))
    assert events[-1] == "[DONE]"
    # as SGLang's server: each event carries the text and ids so far
    texts = [e["text"] for e in events[:-1]]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])) and texts[-1] == out["text"]
    assert events[-2]["output_ids"] == out["output_ids"]
    assert events[-2]["meta_info"]["finish_reason"]["type"] == "length"


def test_abort_endpoint_ends_a_stream(served: Served) -> None:
    body = {"text": PROMPT, "sampling_params": {"max_tokens": 200, "ignore_eos": True},
            "stream": True}
    with served.http.stream("POST", "/generate", json=body) as response:
        events = sse_events(response)
        rid = next(events)["meta_info"]["rid"]
        with httpx.Client(base_url=served.url, timeout=60) as other:
            assert other.post("/abort", json={"rid": rid}).status_code == 200
        rest = list(events)
    assert rest[-1] == "[DONE]" and rest[-2]["meta_info"]["finish_reason"]["type"] == "abort"
    wait_idle(served)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_abort_takes_the_id_the_openai_client_sees(served: Served, path: str) -> None:
    """/abort with the `cmpl-...` / `chatcmpl-...` id of a running stream (a prompt list of two
    is two runtime requests) ends all of it; only the runtime's integer id used to work."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2000, "ignore_eos": True,
                            "stream": True}
    if path == "/v1/completions":
        body["prompt"] = [PROMPT, PROMPT + " and"]
    else:
        body["messages"] = [{"role": "user", "content": PROMPT}]
    before = served.http.get("/server_info").json()["generated_tokens"]
    with served.http.stream("POST", path, json=body) as response:
        events = sse_events(response)
        client_id = next(events)["id"]
        with httpx.Client(base_url=served.url, timeout=60) as other:
            answer = other.post("/abort", json={"rid": client_id}).json()
        assert answer["aborted"] == (2 if path == "/v1/completions" else 1), answer
        rest = list(events)
    reasons = [c["finish_reason"] for e in rest if e != "[DONE]" for c in e["choices"]]
    assert rest[-1] == "[DONE]" and reasons.count("abort") == answer["aborted"]
    info = wait_idle(served)
    assert info["generated_tokens"] - before < 500  # far below 2 x 2000
    with httpx.Client(base_url=served.url, timeout=60) as other:  # gone: nothing to abort
        assert other.post("/abort", json={"rid": client_id}).json()["aborted"] == 0


def _metric(text: str, name: str) -> float:
    """The value of one sample line `name value` of a Prometheus scrape (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def test_metrics_count_finish_reasons_rejections_and_preemptions(served: Served) -> None:
    """What an operator needs on /metrics: finished samples by reason, refused requests by
    status, preemptions by mode and pinned prefixes, each moving with what really happened."""
    before = served.http.get("/metrics").text
    complete(served, max_tokens=2, n=2)  # two samples ending with "length"
    bad = served.http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "n": 0})
    assert bad.status_code == 400
    assert served.http.post("/v1/completions", json={"prompt": 5}).status_code == 400
    after = served.http.get("/metrics").text
    length = 'radixrt_request_finish_total{reason="length"}'
    rejected = 'radixrt_rejected_requests_total{status="400"}'
    assert _metric(after, length) - _metric(before, length) == 2
    assert _metric(after, rejected) - _metric(before, rejected) == 2
    for timing in ("radixrt_queue_time_seconds_count", "radixrt_prefill_time_seconds_count"):
        assert _metric(after, timing) - _metric(before, timing) == 1, timing  # one request
    assert _metric(after, "radixrt_prefill_time_seconds_sum") > _metric(
        before, "radixrt_prefill_time_seconds_sum")
    for name in ('radixrt_preemptions{mode="recompute"}', 'radixrt_preemptions{mode="swap"}',
                 "radixrt_pinned_prefixes", "radixrt_pinned_tokens", "radixrt_pins_refused",
                 "radixrt_pin_leases"):
        assert name in after, name
    wait_idle(served)


def test_metrics_count_grammar_masks(served: Served) -> None:
    """Each constrained row of each sampled step builds one mask (jump-forward's appended
    tokens build none), timed on the worker's mask thread; an unconstrained request builds
    none."""
    names = ("radixrt_grammar_masks", "radixrt_grammar_mask_seconds",
             "radixrt_grammar_mask_wait_seconds")
    before = served.http.get("/metrics").text
    complete(served, max_tokens=3)
    plain = served.http.get("/metrics").text
    assert [_metric(plain, n) for n in names] == [_metric(before, n) for n in names]
    answer = served.http.post("/v1/completions", json={
        "model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0,
        "regex": "[a-z]{6}"}).json()
    after = served.http.get("/metrics").text
    tokens = answer["usage"]["completion_tokens"]
    masks = _metric(after, names[0]) - _metric(plain, names[0])
    assert 1 <= masks <= tokens + 1, (masks, tokens)  # the last step may sample EOS
    seconds = _metric(after, names[1]) - _metric(plain, names[1])
    assert 0 < seconds < 1.0 * masks  # microseconds each, not seconds
    assert 0 <= _metric(after, names[2]) - _metric(plain, names[2]) <= seconds + 0.5
    wait_idle(served)


def test_operations_endpoints(served: Served) -> None:
    assert served.http.get("/health").status_code == 200
    assert served.http.get("/health_generate").json() == {"status": "ok"}
    info = served.http.get("/server_info").json()
    assert info["model"] == "smollm2" and info["kv_total"] == 4096
    metrics = served.http.get("/metrics").text
    for name in ("radixrt_num_running_requests", "radixrt_num_waiting_requests",
                 "radixrt_kv_usage_ratio", "radixrt_cache_hit_rate",
                 "radixrt_time_to_first_token_seconds_bucket",
                 "radixrt_inter_token_latency_seconds_bucket",
                 "radixrt_e2e_request_latency_seconds_count", "radixrt_prompt_tokens_total",
                 "radixrt_generation_tokens_total"):
        assert name in metrics, name
    assert "radixrt_generation_tokens_total 0.0" not in metrics
    flushed = served.http.post("/flush_cache").json()
    assert flushed["freed_tokens"] > 0
    assert served.http.get("/server_info").json()["kv_evictable"] == 0


# --- pins over HTTP ----------------------------------------------------------------------------


def pin(srv: Served, text: str, **extra: Any) -> dict[str, Any]:
    response = srv.http.post("/generate", json={"text": text, "pin": True, **extra,
                                                "sampling_params": {"max_tokens": 1,
                                                                    "temperature": 0}})
    assert response.status_code == 200, response.text
    return response.json()["meta_info"]


def test_generate_with_pin_keeps_the_prefix_until_unpin(served: Served) -> None:
    """pin: true returns a pin id; the prefix stays locked (a flush cannot drop it) and later
    requests starting with it find it cached; /unpin releases it, once."""
    wait_idle(served)
    meta = pin(served, LONG_PREFIX)
    pin_id = meta["pin_id"]
    assert isinstance(pin_id, int) and "pin_error" not in meta
    info = served.http.get("/server_info").json()
    assert info["pinned"] == 1 and info["kv_locked"] >= meta["prompt_tokens"] - 1
    assert info["pinned_tokens"] == info["kv_locked"] and info["pin_leases"] == 1
    served.http.post("/flush_cache")
    again = served.http.post("/generate", json={
        "text": LONG_PREFIX + " Fact 20:", "sampling_params": {"max_tokens": 2}}).json()
    assert again["meta_info"]["cached_tokens"] >= meta["prompt_tokens"] - 1
    released = served.http.post("/unpin", json={"pin_id": pin_id}).json()
    assert released == {"status": "ok", "pin_id": pin_id, "released": True}
    assert served.http.post("/unpin", json={"pin_id": pin_id}).json()["released"] is False
    info = wait_idle(served)
    assert info["pinned"] == 0 and info["pin_leases"] == 0


def test_streamed_pin_reports_its_id_on_the_final_event(served: Served) -> None:
    with served.http.stream("POST", "/generate", json={
            "text": LONG_PREFIX, "pin": True, "stream": True,
            "sampling_params": {"max_tokens": 2, "temperature": 0}}) as response:
        events = [e for e in sse_events(response) if e != "[DONE]"]
    final = events[-1]["meta_info"]
    assert final["finish_reason"]["type"] == "length" and isinstance(final["pin_id"], int)
    assert all("pin_id" not in e["meta_info"] for e in events[:-1])
    assert served.http.post("/unpin", json={"pin_id": final["pin_id"]}).json()["released"]
    wait_idle(served)


def test_an_http_pin_is_a_lease_renewed_or_lost(served: Served) -> None:
    """A pin whose client renews (POST /renew_pins) outlives the TTL; one left alone is released
    by the server within a TTL or so, and renewing it then reports it lost."""
    wait_idle(served)
    kept = pin(served, LONG_PREFIX)["pin_id"]
    left = pin(served, "Another prefix, pinned and then forgotten by its client.")["pin_id"]
    assert served.http.get("/server_info").json()["pinned"] == 2
    deadline = time.monotonic() + 2.5 * PIN_TTL_S
    while time.monotonic() < deadline:
        renewed = served.http.post("/renew_pins", json={"pin_ids": [kept]}).json()
        assert renewed["lost"] == [] and renewed["ttl_s"] == PIN_TTL_S
        time.sleep(PIN_TTL_S / 4)
    info = served.http.get("/server_info").json()
    assert info["pinned"] == 1 and info["pin_leases"] == 1 and info["pin_leases_expired"] >= 1
    assert served.http.post("/renew_pins", json={"pin_ids": [kept, left]}).json()["lost"] == [
        left]
    metrics = served.http.get("/metrics").text
    assert _metric(metrics, "radixrt_pin_leases_expired") >= 1
    assert _metric(metrics, "radixrt_pinned_tokens") > 0
    served.http.post("/unpin", json={"pin_id": kept})
    assert wait_idle(served)["pinned"] == 0


# --- refusals ----------------------------------------------------------------------------------

TOO_LONG = [1] * 9000
USER_X = [{"role": "user", "content": "x"}]
BIG = 4 << 20  # MAX_REQUEST_BODY_BYTES


@dataclass(frozen=True)
class Bad:
    path: str
    body: Any  # JSON, or bytes sent as they are
    expect: str  # in the error message
    status: int = 400


BAD_REQUESTS: list[Bad] = [Bad(*case) for case in [
    ("/v1/completions", b'{"model": "default", "prompt": ', "not valid JSON"),
    ("/v1/completions", b'["not", "an", "object"]', "must be a JSON object"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": "hot"}, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "many"}, "max_tokens"),
    ("/v1/completions", {"prompt": "x"}, "model: Field required"),
    ("/v1/completions", {"model": MODEL, "prompt": {"a": 1}}, "prompt must be a string"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": -1}, "temperature=-1.0"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 0}, "top_p=0.0"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 0}, "n=0"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens=0"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                              "max_tokens": 0}, "max_tokens=0"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": {"a": 1}}, "logit_bias"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": {"99999999": 1}},
     "vocab_size"),
    ("/v1/completions", {"model": MODEL, "prompt": ""}, "prompt is empty"),
    ("/v1/completions", {"model": MODEL, "prompt": []}, "prompt is empty"),
    ("/v1/completions", {"model": MODEL, "prompt": TOO_LONG}, "shorten it"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 100000}, "lower max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 2, "max_tokens": 4000},
     "KV pool holds"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, "is not served here"),
    ("/v1/completions", {"model": MODEL, "prompt": [5, 10_000_000]}, "outside the vocabulary"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "regex": "(ab"}, "unterminated"),
    ("/v1/completions", {"model": MODEL, "prompt": "x",
                         "response_format": {"type": "json_schema",
                                             "json_schema": {"schema": {"type": "nope"}}}},
     "json_schema is invalid"),
    ("/v1/completions", {"model": MODEL, "prompt": "x",
                         "response_format": {"type": "json_schema", "json_schema": {}}},
     '"schema"'),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "regex": "a+", "choices": ["a"]},
     "at most one of"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "lark": 'start: "a" bar'},
     "lark is invalid: at 1(8): unknown name"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "ebnf": 'root ::= ("a"'},
     "ebnf is invalid: Expected ')' at line 1"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "response_format": {"type": "grammar"}},
     '"grammar"'),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "lark": "start: x\n" * 40000},
     "65536"),
    ("/generate", {"text": "x", "sampling_params": {"choices": []}}, "choices"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, "messages is empty"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
     "messages.0.role"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": 5}]},
     "messages.0.content"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": 5}, "stop must be a string"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                              "top_logprobs": 2}, "top_logprobs needs logprobs"),
    ("/generate", {"sampling_params": {}}, "exactly one of"),
    ("/generate", {"text": "x", "sampling_params": {"temprature": 0}}, "unknown sampling_params"),
    ("/generate", {"input_ids": [-1]}, "outside the vocabulary"),
    ("/abort", {"rid": [7]}, "rid"),
    ("/abort", {"rid": 2**70}, "rid"),
    ("/abort", {"rid": "x" * 129}, "rid"),
    # bounds: checked before anything is allocated (n = 2**70 once grew the process by GBs), and
    # integers past 64 bits are refused instead of overflowing msgpack (an HTTP 500)
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 2**70}, "n=1180591620717411303424"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                              "n": 129}, "[1, 128]"),
    ("/generate", {"text": "x", "sampling_params": {"n": 2**70}}, "64 bits"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "seed": 2**70}, "64 bits"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                              "seed": -(2**70)}, "64 bits"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_k": 2**70}, "64 bits"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2**70}, "64 bits"),
    ("/generate", {"text": "x", "sampling_params": {"stop_token_ids": [2**70]}}, "64 bits"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": {str(2**70): 1}},
     "64 bits"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": ["x"] * 17}, "at most 16"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": ["x" * 257]}, "256"),
    ("/generate", {"text": "x", "sampling_params": {"stop_token_ids": [1] * 257}}, "256"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "choices": ["a"] * 257}, "256"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "regex": "a" * 70000}, "65536"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "frequency_penalty": 3},
     "frequency_penalty"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "presence_penalty": -3},
     "presence_penalty"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": {"5": 500}}, "logit_bias"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 4, "min_tokens": 5},
     "min_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": [[1, 2], [3, -5]]}, "outside the vocabulary"),
    ("/v1/completions", {"model": MODEL, "prompt": [2**70]}, "prompt"),
    ("/v1/completions", b"", "must be a JSON object"),
    # whole-request bounds: prompts per batch, samples, messages, content parts, names, bytes
    ("/v1/completions", {"model": MODEL, "prompt": ["x"] * 129}, "at most 128"),
    ("/v1/completions", {"model": MODEL, "prompt": ["x"] * 100, "n": 3}, "at most 256"),
    ("/v1/chat/completions", {"model": MODEL, "messages": USER_X * 1025}, "at most 1024"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "x"}] * 257}]}, "256"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"content": "x"}]},
     "messages.0.role"),
    ("/v1/chat/completions", {"model": MODEL, "messages": USER_X, "logprobs": True,
                              "top_logprobs": 21}, "top_logprobs"),
    ("/v1/completions", {"model": "m" * 300, "prompt": "x"}, "model"),
    ("/v1/chat/completions", {"model": MODEL, "messages": USER_X, "user": "u" * 300}, "user"),
    ("/v1/completions", b'{"model": "default", "prompt": "' + b"a" * BIG + b'"}',
     "larger than", 413),
    ("/generate", b'{"input_ids": [' + b"1, " * (BIG // 3) + b'1]}', "larger than", 413),
    ("/generate", {"text": "x", "input_ids": [1]}, "exactly one of"),
    ("/generate", {"input_ids": ["a"]}, "input_ids"),
    ("/generate", {"text": "x", "stream": "maybe"}, "stream"),
    ("/generate", {"text": 5}, "text"),
    ("/abort", {}, "rid: Field required"),
    ("/v1/chat/completions", {"model": MODEL, "messages": USER_X, "echo": True},
     "echo is not supported on /v1/chat/completions"),
    # pins over HTTP
    ("/generate", {"text": "x", "pin": True, "sampling_params": {"n": 2}}, "pin needs n=1"),
    ("/generate", {"text": "x", "pin": True, "sampling_params": {"stop": ["."]}},
     "stop strings"),
    ("/unpin", {"pin_id": -1}, "pin_id"),
    ("/unpin", {"pin_id": "seven"}, "pin_id"),
    ("/unpin", {}, "pin_id: Field required"),
    ("/renew_pins", {"pin_ids": 5}, "pin_ids"),
    ("/renew_pins", {"pin_ids": [0] * 4097}, "pin_ids"),
    ("/renew_pins", {"pin_ids": [2**70]}, "pin_ids"),
    # text that is not Unicode (a lone UTF-16 surrogate, valid JSON): a 400 naming the field on
    # every route, never a 500 from the tokenizer or the error's own encoding
    ("/v1/completions", b'{"model": "default", "prompt": "\\ud800"}',
     "prompt: the text is not valid Unicode"),
    ("/v1/completions", b'{"model": "default", "prompt": ["ok", "a\\uDFFFb"]}',
     "prompt.1: the text is not valid Unicode (a lone UTF-16 surrogate at character 1)"),
    ("/v1/completions", b'{"model": "default", "prompt": "x", "stop": ["\\ud83d"]}', "stop.0"),
    ("/v1/completions", b'{"model": "default", "prompt": "x", "logit_bias": {"\\udc00": 1}}',
     "logit_bias.\\udc00"),
    ("/v1/chat/completions",
     b'{"model": "default", "messages": [{"role": "user", "content": "hi \\ud800"}]}',
     "messages.0.content"),
    ("/generate", b'{"text": "\\udbff"}', "text: the text is not valid Unicode"),
    ("/abort", b'{"rid": "\\ud800"}', "rid"),
]]


@pytest.fixture(scope="module")
def good_answer(served: Served) -> str:
    """What the good request answers on a fresh server."""
    return good_request(served.http)


def good_request(http: httpx.Client) -> str:
    response = http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT,
                                                  "max_tokens": 3, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def connection_of(response: httpx.Response) -> Any:
    return response.extensions["network_stream"].get_extra_info("client_addr")


@pytest.mark.parametrize("bad", BAD_REQUESTS, ids=[f"{b.path}-{b.expect}" for b in BAD_REQUESTS])
def test_bad_input_is_a_helpful_4xx_and_changes_nothing(served: Served, good_answer: str,
                                                        bad: Bad) -> None:
    """Each bad request gets its 4xx with a message that says what to fix; the next good
    request on the same connection is answered exactly as before; nothing is left running."""
    with httpx.Client(base_url=served.url, timeout=120) as http:
        before = http.get("/health")
        if isinstance(bad.body, bytes):
            response = http.post(bad.path, content=bad.body,
                                 headers={"Content-Type": "application/json"})
        else:
            response = http.post(bad.path, json=bad.body)
        assert response.status_code == bad.status, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert bad.expect in error["message"], error["message"]
        after = http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT,
                                                   "max_tokens": 3, "temperature": 0})
        assert after.status_code == 200 and after.json()["choices"][0]["text"] == good_answer
        assert connection_of(before) == connection_of(response) == connection_of(after)
    wait_idle(served)


def test_the_bad_input_corpus_covers_every_endpoint() -> None:
    paths = {b.path for b in BAD_REQUESTS}
    assert len(BAD_REQUESTS) >= 60
    assert paths >= {"/v1/completions", "/v1/chat/completions", "/generate", "/abort", "/unpin",
                     "/renew_pins"}


def test_a_body_past_the_limit_is_refused_while_it_streams_in(served: Served,
                                                              good_answer: str) -> None:
    """Without a Content-Length (chunked upload), the limit is enforced as the bytes arrive."""
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "default", "prompt": "'
        for _ in range(5):
            yield b"a" * (1 << 20)
        yield b'"}'

    with httpx.Client(base_url=served.url, timeout=120) as http:
        response = http.post("/v1/completions", content=chunks(),
                             headers={"Content-Type": "application/json"})
        assert response.status_code == 413, response.text
        assert "larger than 4194304 bytes" in response.json()["error"]["message"]
        assert good_request(http) == good_answer
    wait_idle(served)


def test_an_internal_error_is_a_500_with_a_body_and_the_connection_stays_usable(
        served: Served, good_answer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug (here: server_info made to raise) answers 500 in OpenAI's error format; the
    server keeps the connection (it used to close it after the app raised)."""
    intake = served.engine.intake  # the manager's server_info asks the scheduler's intake

    def broken() -> dict:
        raise RuntimeError("injected fault")

    with httpx.Client(base_url=served.url, timeout=120) as http:
        first = http.get("/health")
        monkeypatch.setattr(intake, "info", broken)
        response = http.get("/server_info")
        monkeypatch.undo()
        assert response.status_code == 500
        error = response.json()["error"]
        assert error["type"] == "server_error" and "injected fault" in error["message"]
        assert good_request(http) == good_answer
        assert connection_of(first) == connection_of(response)
    wait_idle(served)
def test_a_refused_huge_integer_leaves_the_connection_usable(served: Served) -> None:
    """A 2**70 seed used to end in an HTTP 500 (msgpack overflow) that also dropped the
    keep-alive connection: the next request on it failed too."""
    with httpx.Client(base_url=served.url, timeout=60) as http:
        bad = http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT,
                                                  "seed": 2**70, "max_tokens": 2})
        assert bad.status_code == 400 and "64 bits" in bad.json()["error"]["message"]
        good = http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT,
                                                   "max_tokens": 2, "temperature": 0})
        assert good.status_code == 200 and good.json()["choices"][0]["text"]
        assert good.headers.get("connection", "keep-alive") != "close"
    wait_idle(served)


def test_server_keeps_serving_after_refusals(served: Served) -> None:
    with pytest.raises(openai.BadRequestError):
        complete(served, model="nope")
    assert served.http.get("/nope").json()["error"]["message"] == "Not Found"
    assert complete(served, max_tokens=2).choices[0].text
    wait_idle(served)


# --- authentication ----------------------------------------------------------------------------


def test_api_key_is_required(served: Served) -> None:
    with httpx.Client(base_url=served.auth_url, timeout=60) as http:
        assert http.get("/health").status_code == 200
        for headers in ({}, {"Authorization": f"Bearer {API_KEY}x"}, {"Authorization": API_KEY}):
            response = http.get("/v1/models", headers=headers)
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "invalid_api_key"
        assert http.get("/metrics").status_code == 401
    wrong = openai.OpenAI(base_url=f"{served.auth_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    right = openai.OpenAI(base_url=f"{served.auth_url}/v1", api_key=API_KEY, max_retries=0)
    out = right.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0)
    assert out.usage.completion_tokens >= 1
    with httpx.Client(base_url=served.auth_url, timeout=60) as http:
        for scheme in ("bearer", "BEARER", "Bearer "):  # the scheme is case-insensitive
            response = http.get("/v1/models", headers={"Authorization": f"{scheme} {API_KEY}"})
            assert response.status_code == 200, scheme


# --- disconnects -------------------------------------------------------------------------------


DISCONNECT_MAX_TOKENS = 2000  # a request that is never aborted runs for a long while


def spy_aborts(monkeypatch: pytest.MonkeyPatch, engine: Any) -> list[str | None]:
    """Record the finish reason of every request the engine is asked to abort."""
    reasons: list[str | None] = []
    real = engine.front.abort

    def abort(rid: int) -> None:
        real(rid)
        reasons.append(engine.front.tracker(rid).output.finish_reason)

    monkeypatch.setattr(engine.front, "abort", abort)
    return reasons


def test_streaming_client_disconnect_frees_kv(served: Served, monkeypatch) -> None:
    aborted = spy_aborts(monkeypatch, served.engine)
    before = served.engine.stats()["generated_tokens"]
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": DISCONNECT_MAX_TOKENS,
            "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=served.url, timeout=60) as http, \
            http.stream("POST", "/v1/completions", json=body) as response:
        events = sse_events(response)
        next(events), next(events)
        assert served.http.get("/server_info").json()["running"] == 1
    info = wait_idle(served)
    assert info["waiting"] == 0
    assert aborted == ["abort"]
    # aborted soon after the disconnect, not run to max_tokens
    assert info["generated_tokens"] - before < DISCONNECT_MAX_TOKENS // 10


def test_non_streaming_client_disconnect_frees_kv(served: Served, monkeypatch) -> None:
    aborted = spy_aborts(monkeypatch, served.engine)
    before = served.engine.stats()["generated_tokens"]
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": DISCONNECT_MAX_TOKENS,
            "ignore_eos": True}
    with httpx.Client(base_url=served.url, timeout=1.5) as http, \
            pytest.raises(httpx.ReadTimeout):
        http.post("/v1/completions", json=body)
    info = wait_idle(served)
    assert aborted == ["abort"]
    assert info["generated_tokens"] - before < DISCONNECT_MAX_TOKENS // 4


def test_engine_integrity_at_the_end(served: Served) -> None:
    wait_idle(served)
    served.engine.check_integrity()
    stats = served.engine.stats()
    assert stats["kv_free"] + stats["kv_evictable"] == stats["kv_total"]


# --- streaming n > 1 ---------------------------------------------------------------------------


def _joined(events: list[Any], text_of: Any) -> dict[int, tuple[str, str | None]]:
    out: dict[int, list] = {}
    for event in events:
        if event == "[DONE]":
            continue
        for choice in event["choices"]:
            text, reason = out.setdefault(choice["index"], ["", None])
            out[choice["index"]] = [text + text_of(choice), choice["finish_reason"] or reason]
    return {i: (t, r) for i, (t, r) in out.items()}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_streaming_n_samples_each_stream_to_their_own_end(served: Served, path: str) -> None:
    """n = 3 seeded samples of different lengths (a stop string ends some early): the joined
    stream of every sample equals its non-streamed result, finish reason included. The stream
    used to end with sample 0, cutting the others short without a finish_reason."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 24, "temperature": 1.0, "seed": 4,
                            "n": 3, "stop": [" the", "."], "logprobs": True}
    if path == "/v1/completions":
        body["prompt"] = "Once upon a time"
        text_of = lambda c: c.get("text", "")  # noqa: E731
        whole_of = lambda c: c["text"]  # noqa: E731
    else:
        body["messages"] = [{"role": "user", "content": "Tell me a story."}]
        text_of = lambda c: c["delta"].get("content") or ""  # noqa: E731
        whole_of = lambda c: c["message"]["content"]  # noqa: E731
    whole = served.http.post(path, json=body).json()
    expected = {c["index"]: (whole_of(c), c["finish_reason"]) for c in whole["choices"]}
    assert len(expected) == 3
    assert len({len(text) for text, _ in expected.values()}) > 1  # samples end apart
    with served.http.stream("POST", path, json={**body, "stream": True}) as response:
        events = list(sse_events(response))
    assert events[-1] == "[DONE]"
    assert _joined(events, text_of) == expected
    wait_idle(served)


def test_generate_streams_every_sample_to_its_end(served: Served) -> None:
    body = {"text": "Once upon a time", "stream": True,
            "sampling_params": {"max_tokens": 24, "temperature": 1.0, "seed": 4, "n": 3,
                                "stop": [" the", "."]}}
    whole = served.http.post("/generate", json={**body, "stream": False}).json()
    expected = {i: (out["text"], out["meta_info"]["finish_reason"]) for i, out in enumerate(whole)}
    assert len(expected[0][0]) < max(len(text) for text, _ in expected.values())  # 0 ends first
    with served.http.stream("POST", "/generate", json=body) as response:
        events = [e for e in sse_events(response) if e != "[DONE]"]
    got: dict[int, tuple[str, Any]] = {}
    for event in events:  # each event: that sample so far
        got[event["index"]] = (event["text"], event["meta_info"]["finish_reason"])
    assert got == expected
    wait_idle(served)
