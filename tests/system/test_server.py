"""`radixrt serve` as a user runs it: three real processes, a real socket, the official openai
client. Outputs equal the in-process Engine's; disconnects free KV; a dead worker stops the
server with a non-zero exit and no process left behind."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import psutil
import pytest
from serve_process import API_KEY, Server, free_port

from radixrt import SamplingParams

pytestmark = pytest.mark.slow  # starts real processes


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    dsl_port = free_port()
    srv = Server("--max-total-tokens", "4096", "--api-key", API_KEY, "--log-level", "warning",
                 "--check-integrity", "--dsl-port", str(dsl_port))
    srv.dsl_port = dsl_port
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)


PROMPT = "The three most spoken languages in the world are"


def test_completion_equals_in_process_engine(client, make_engine):
    out = client.completions.create(model="default", prompt=PROMPT, max_tokens=16,
                                    temperature=0)
    engine = make_engine()
    ref = engine.generate(PROMPT, SamplingParams(max_tokens=16, temperature=0))[0]
    assert out.choices[0].text == ref.text
    assert out.usage.completion_tokens == ref.completion_tokens
    assert out.usage.prompt_tokens == ref.prompt_tokens


def test_chat_streaming_and_usage(client, server):
    messages = [{"role": "system", "content": "You answer in one sentence. " * 8},
                {"role": "user", "content": "What is the sun?"}]
    full = client.chat.completions.create(model="default", messages=messages, max_tokens=24,
                                          temperature=0)
    text = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model="default", messages=messages, max_tokens=24, temperature=0, stream=True)
        if chunk.choices
    )
    assert text == full.choices[0].message.content
    again = client.chat.completions.create(model="default", messages=messages, max_tokens=4,
                                           temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= again.usage.prompt_tokens - 1


def test_n_logprobs_and_stop(client):
    out = client.completions.create(model="default", prompt=PROMPT, max_tokens=8, n=2,
                                    temperature=0.8, seed=3, logprobs=2)
    assert len(out.choices) == 2
    for choice in out.choices:
        assert len(choice.logprobs.token_logprobs) == len(choice.logprobs.tokens) > 0
        assert all(len(t) <= 2 for t in choice.logprobs.top_logprobs)
    free = client.completions.create(model="default", prompt="1, 2, 3,", max_tokens=12,
                                     temperature=0)
    stop = free.choices[0].text[3:5]
    cut = client.completions.create(model="default", prompt="1, 2, 3,", max_tokens=12,
                                    temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop" and stop not in cut.choices[0].text


def test_32_concurrent_streams(server):
    async def one(i: int, aclient: openai.AsyncOpenAI) -> str:
        text = ""
        stream = await aclient.completions.create(
            model="default", prompt=f"Item {i}: the", max_tokens=8, temperature=0, stream=True)
        async for chunk in stream:
            text += chunk.choices[0].text
        return text

    async def run() -> list[str]:
        aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY,
                                     max_retries=0, timeout=300)
        return await asyncio.gather(*(one(i, aclient) for i in range(32)))

    texts = asyncio.run(run())
    assert len(texts) == 32 and all(texts)
    server.wait_idle()


DISTINCT_GRAMMARS = 200
PROCESS_GROWTH_BOUND = 1 << 30  # each server process, after 200 grammars


def test_200_distinct_grammars_in_flight_keep_every_process_bounded(server):
    """200 constrained requests at once, each with its own grammar (regexes on outlines-core,
    JSON schemas on llguidance): every answer holds, the server is idle and whole afterwards,
    masks were built for them, and no process grew by 1 GiB (the tokenizer process compiles and
    caches, the worker loads from the grammar folder and caches; both caches are bounded)."""
    def body(i: int) -> dict:
        if i % 2:
            return {"regex": f"(yes|no)-{i:03d}"}
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
            "type": "object", "properties": {f"k{i}": {"type": "integer", "minimum": 0,
                                                       "maximum": 99}},
            "required": [f"k{i}"]}}}}

    async def one(i: int, aclient: openai.AsyncOpenAI) -> str:
        out = await aclient.completions.create(model="default", prompt="Answer: ", max_tokens=16,
                                               temperature=0, extra_body=body(i))
        assert out.choices[0].finish_reason == "stop", out
        return out.choices[0].text

    async def run() -> list[str]:
        aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY,
                                     max_retries=0, timeout=600)
        return await asyncio.gather(*(one(i, aclient) for i in range(DISTINCT_GRAMMARS)))

    processes = [psutil.Process(server.proc.pid), *server.children]
    before = {p.pid: p.memory_info().rss for p in processes}
    masks_before = _scrape(server, "radixrt_grammar_masks")
    texts = asyncio.run(run())
    for i, text in enumerate(texts):
        if i % 2:
            assert re.fullmatch(f"(yes|no)-{i:03d}", text), (i, text)
        else:
            schema = body(i)["response_format"]["json_schema"]["schema"]
            jsonschema.validate(json.loads(text), schema)
    server.wait_idle()
    grown = {p.name(): p.memory_info().rss - before[p.pid] for p in processes}
    assert all(g < PROCESS_GROWTH_BOUND for g in grown.values()), grown
    assert _scrape(server, "radixrt_grammar_masks") - masks_before >= DISTINCT_GRAMMARS


def _scrape(server: Any, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", headers=server.headers(), timeout=30).text
    return next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith(name + " "))


def test_client_killed_mid_stream_frees_its_kv(server):
    code = (
        "import httpx, sys\n"
        f"with httpx.stream('POST', '{server.url}/v1/completions', headers={{'Authorization': "
        f"'Bearer {API_KEY}'}}, json={{'model': 'default', 'prompt': 'Tell a long story', "
        "'max_tokens': 2000, 'ignore_eos': True, 'stream': True}, timeout=60) as r:\n"
        "    for i, line in enumerate(r.iter_lines()):\n"
        "        if i == 6:\n"
        "            print('streaming', flush=True)\n"
    )
    before = server.wait_idle()["generated_tokens"]
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "streaming"
    assert server.info()["running"] == 1
    proc.kill()
    proc.wait()
    info = server.wait_idle()
    assert info["kv_free"] + info["kv_evictable"] == info["kv_total"]
    # aborted soon after the kill: far fewer than the 2000 tokens it would run to otherwise
    assert info["generated_tokens"] - before < 200
    check = httpx.post(f"{server.url}/generate", headers=server.headers(), timeout=60,
                       json={"text": "ok", "sampling_params": {"max_tokens": 2}})
    assert check.status_code == 200


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"model": "default", "prompt": "hi", "max_tokens": -1}, "max_tokens"),
        ({"model": "default", "prompt": "hi", "temperature": -2}, "temperature"),
        ({"model": "default", "prompt": "", "max_tokens": 2}, "empty"),
        ({"model": "default", "prompt": "hi " * 9000, "max_tokens": 2}, "context length"),
        ({"model": "default", "prompt": "hi", "max_tokens": 100000}, "max_tokens"),
        ({"model": "nope", "prompt": "hi", "max_tokens": 2}, "model"),
        ({"model": "default", "prompt": "hi", "top_p": "high"}, "top_p"),
        # past 64 bits: msgpack between the processes overflowed, an HTTP 500
        ({"model": "default", "prompt": "hi", "max_tokens": 2, "seed": 2**70}, "64 bits"),
        ({"model": "default", "prompt": "hi", "max_tokens": 2, "n": 2**70}, "64 bits"),
        ({"model": "default", "prompt": "hi", "max_tokens": 2, "logit_bias": {str(2**64): 1}},
         "64 bits"),
    ],
)
def test_bad_input_gets_400_and_the_server_keeps_serving(server, body, fragment):
    r = httpx.post(f"{server.url}/v1/completions", headers=server.headers(), json=body,
                   timeout=60)
    assert r.status_code == 400, r.text
    assert fragment in r.json()["error"]["message"]
    ok = httpx.post(f"{server.url}/v1/completions", headers=server.headers(), timeout=60,
                    json={"model": "default", "prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200


def test_malformed_json_and_api_key(server):
    r = httpx.post(f"{server.url}/v1/completions", headers={**server.headers(),
                   "Content-Type": "application/json"}, content=b"{not json", timeout=30)
    assert r.status_code == 400
    assert httpx.get(f"{server.url}/v1/models", timeout=30).status_code == 401
    wrong = {"Authorization": "Bearer wrong"}
    assert httpx.get(f"{server.url}/v1/models", headers=wrong, timeout=30).status_code == 401
    models = httpx.get(f"{server.url}/v1/models", headers=server.headers(), timeout=30)
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "default"
    assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200


def test_metrics_and_health_generate(server):
    r = httpx.get(f"{server.url}/health_generate", headers=server.headers(), timeout=60)
    assert r.status_code == 200
    metrics = httpx.get(f"{server.url}/metrics", headers=server.headers(), timeout=30).text
    for name in ("radixrt_num_running_requests", "radixrt_cache_hit_rate",
                 "radixrt_time_to_first_token_seconds"):
        assert name in metrics


def test_overlap_scheduling_under_forced_preemption(make_engine):
    """A pool too small for all requests at once: preemption (recompute and swap) with step t+1
    planned while step t runs must still give exactly the in-process Engine's outputs."""
    prompts = [f"Story {i}: once upon a time" for i in range(6)]
    ref = make_engine().generate(prompts, SamplingParams(max_tokens=24, temperature=0,
                                                         ignore_eos=True))
    for mode in ("recompute", "swap"):
        srv = Server("--max-total-tokens", "96", "--page-size", "16", "--preemption", mode,
                     "--check-integrity", "--log-level", "warning")
        try:
            aclient = openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0,
                                         timeout=300)

            async def run(client: openai.AsyncOpenAI = aclient) -> list[str]:
                outs = await asyncio.gather(*(
                    client.completions.create(model="default", prompt=p, max_tokens=24,
                                              temperature=0, extra_body={"ignore_eos": True})
                    for p in prompts))
                return [o.choices[0].text for o in outs]

            assert asyncio.run(run()) == [o.text for o in ref]
            info = srv.info()
            assert info["preemptions"] > 0 and (info["swaps"] > 0) == (mode == "swap")
            srv.wait_idle()
        finally:
            srv.stop()
        assert srv.proc.returncode == 0, srv.proc.stdout.read()


def test_dsl_endpoint_over_zeromq(server, client):
    """DSL clients speak msgspec over a ZeroMQ DEALER socket: streamed pieces, then the whole
    output; a refused request gets its error; the same greedy text as HTTP."""
    import msgspec
    import zmq

    from radixrt.runtime.messages import DslReply, DslRequest

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{server.dsl_port}")
    enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(DslReply)
    from radixrt.runtime.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=12, temperature=0)  # the wire's type, as HTTP builds it
    sock.send(enc.encode(DslRequest(call_id=1, text=PROMPT, params=params, stream=True,
                                    api_key=API_KEY)))
    pieces = []
    while True:
        assert sock.poll(120_000), "no reply from the DSL endpoint"
        reply = dec.decode(sock.recv())
        if reply.done:
            break
        pieces.append(reply.text)
    assert reply.error is None and "".join(pieces) == reply.text
    http = client.completions.create(model="default", prompt=PROMPT, max_tokens=12,
                                     temperature=0)
    assert reply.text == http.choices[0].text
    # a client of another language sends a bad field: refused on decode, naming the field, in
    # a reply to its own call
    bad_params = {"temperature": -1}
    sock.send(enc.encode(DslRequest(call_id=2, text=PROMPT, params=bad_params,
                                    api_key=API_KEY)))
    assert sock.poll(60_000)
    bad = dec.decode(sock.recv())
    assert bad.done and bad.call_id == 2 and "temperature" in bad.error
    sock.close()


def test_the_dsl_endpoint_needs_the_api_key(server):
    """With --api-key, the DSL port is no open door: a request without the key, or with a
    wrong one, is refused and nothing runs; rx.RuntimeEndpoint with the key is served."""
    import radixrt as rx

    before = server.info()["prompt_tokens"]
    for key in (None, "wrong-key"):
        with pytest.raises(rx.BackendError, match="needs its API key"):
            rx.RuntimeEndpoint(f"tcp://127.0.0.1:{server.dsl_port}", api_key=key,
                               connect_timeout=30)
    import msgspec
    import zmq

    from radixrt.runtime.messages import DslReply, DslRequest

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{server.dsl_port}")
    sock.send(msgspec.msgpack.encode(DslRequest(call_id=1, text=PROMPT, api_key="nope")))
    assert sock.poll(60_000)
    reply = msgspec.msgpack.decode(sock.recv(), type=DslReply)
    assert reply.done and "API key" in reply.error and not reply.text
    sock.close()
    assert server.info()["prompt_tokens"] == before  # nothing ran

    @rx.function
    def hello(s):
        s += PROMPT + rx.gen("x", max_tokens=4, temperature=0)

    endpoint = rx.RuntimeEndpoint(f"tcp://127.0.0.1:{server.dsl_port}", api_key=API_KEY)
    try:
        assert hello.run(backend=endpoint)["x"]
    finally:
        endpoint.close()


def test_response_format_json_schema_and_a_broken_regex(server, client):
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                               "confidence": {"type": "integer", "minimum": 0,
                                                              "maximum": 100}},
              "required": ["answer", "confidence"]}
    out = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Is water wet? Reply in JSON."}],
        max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    reply = json.loads(out.choices[0].message.content)
    assert reply["answer"] in ("yes", "no") and 0 <= reply["confidence"] <= 100
    with pytest.raises(openai.BadRequestError, match="unterminated"):
        client.completions.create(model="default", prompt="x", max_tokens=4,
                                  extra_body={"regex": "(ab"})
    again = client.completions.create(model="default", prompt="2 + 2 =", max_tokens=4,
                                      temperature=0, extra_body={"regex": "[0-9]+"})
    assert again.choices[0].text.isdigit()


SLOW_REGEX = "[ab]*a[ab]{17}"  # a DFA of 2^18 states: its check and index take long


def test_a_slow_grammar_is_stopped_at_its_limit_and_never_blocks_the_server():
    """With outlines-core and --grammar-compile-timeout 4: a grammar that would compile for
    long is refused with a 400 naming the flag after ~4 s, while a plain request sent during
    it is served at once (no grammar work runs on the server's event loop); the same grammar
    again is refused at once, and other grammars still compile."""
    srv = Server("--max-total-tokens", "2048", "--grammar-backend", "outlines",
                 "--grammar-compile-timeout", "4", "--log-level", "warning")
    try:
        http = httpx.Client(base_url=srv.url, timeout=120)
        http.post("/v1/completions", json={"model": "default", "prompt": "Hi",
                                           "max_tokens": 2, "regex": "yes|no"})  # warm
        slow: list[httpx.Response] = []
        body = {"model": "default", "prompt": "x", "max_tokens": 4, "regex": SLOW_REGEX}
        start = time.monotonic()
        thread = threading.Thread(target=lambda: slow.append(
            httpx.post(srv.url + "/v1/completions", json=body, timeout=120)))
        thread.start()
        time.sleep(1.0)  # the slow grammar is compiling
        plain_start = time.monotonic()
        plain = http.post("/v1/completions", json={"model": "default", "prompt": "Hello",
                                                   "max_tokens": 4, "temperature": 0})
        plain_s = time.monotonic() - plain_start
        thread.join(timeout=120)
        slow_s = time.monotonic() - start
        assert plain.status_code == 200 and plain_s < 3.0, plain_s
        assert slow[0].status_code == 400, slow[0].text
        assert "--grammar-compile-timeout" in slow[0].text and 4 <= slow_s < 30, slow_s
        again_start = time.monotonic()
        again = http.post("/v1/completions", json=body)
        assert again.status_code == 400 and time.monotonic() - again_start < 2.0
        ok = http.post("/v1/completions", json={"model": "default", "prompt": "Yes or no?",
                                                "max_tokens": 4, "regex": "(yes|no)"})
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"] in ("yes", "no")
    finally:
        srv.stop()


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/generate"])
def test_streaming_n_samples_each_stream_to_their_own_end(server, path):
    """Through the process trio, n = 3 seeded samples of different lengths: every sample's
    joined stream equals its non-streamed result, finish reason included (the stream used to
    end when sample 0 did, cutting the others short without a finish_reason)."""
    sampling = {"max_tokens": 24, "temperature": 1.0, "seed": 4, "n": 3, "stop": [" the", "."]}
    if path == "/generate":
        body = {"text": "Once upon a time", "sampling_params": sampling}
    elif path == "/v1/completions":
        body = {"model": "default", "prompt": "Once upon a time", **sampling}
    else:
        body = {"model": "default", "messages": [{"role": "user", "content": "A story."}],
                **sampling}
    whole = httpx.post(f"{server.url}{path}", headers=server.headers(), json=body,
                       timeout=120).json()
    if path == "/generate":
        expected = {i: (o["text"], o["meta_info"]["finish_reason"]) for i, o in enumerate(whole)}
    else:
        key = "text" if path == "/v1/completions" else "message"
        expected = {c["index"]: (c[key] if key == "text" else c[key]["content"],
                                 c["finish_reason"]) for c in whole["choices"]}
    assert len(expected) == 3
    assert len({len(text) for text, _ in expected.values()}) > 1  # samples end apart
    got: dict = {}
    with httpx.stream("POST", f"{server.url}{path}", headers=server.headers(),
                      json={**body, "stream": True}, timeout=120) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if path == "/generate":
                pieces = [(event["index"], event["text"], event["meta_info"]["finish_reason"])]
            else:
                pieces = [(c["index"], c.get("text") or (c.get("delta") or {}).get("content")
                           or "", c["finish_reason"]) for c in event["choices"]]
            for index, text, reason in pieces:
                old_text, old_reason = got.get(index, ("", None))
                if path == "/generate":  # SGLang's protocol: each event has the text so far
                    assert text.startswith(old_text)
                    old_text = ""
                got[index] = (old_text + text, reason or old_reason)
    assert got == expected
    server.wait_idle()


def test_abort_takes_the_id_the_openai_client_sees(server):
    """Through the process trio: /abort with a running stream's `cmpl-...` id ends it."""
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", headers=server.headers(),
                      json=body, timeout=120) as response:
        lines = (line for line in response.iter_lines() if line.startswith("data: "))
        client_id = json.loads(next(lines)[len("data: "):])["id"]
        answer = httpx.post(f"{server.url}/abort", headers=server.headers(),
                            json={"rid": client_id}, timeout=30).json()
        assert answer["aborted"] == 1, answer
        rest = [line[len("data: "):] for line in lines]
    assert rest[-1] == "[DONE]"
    assert json.loads(rest[-2])["choices"][0]["finish_reason"] == "abort"
    server.wait_idle()


def test_responses_and_messages_through_the_official_clients(server, client):
    """The real server's Responses and Messages APIs (the serving tests cover them in depth):
    a stored conversation continued by previous_response_id reads its earlier turn from the
    cache; the anthropic client's message, stream and tool call; count_tokens."""
    import anthropic

    first = client.responses.create(model="default", input="Name a fruit.",
                                    max_output_tokens=8, temperature=0.0)
    second = client.responses.create(model="default", input="And a colour?",
                                     previous_response_id=first.id, max_output_tokens=8,
                                     temperature=0.0)
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    events = list(client.responses.create(model="default", input="Name a fruit.",
                                          max_output_tokens=8, temperature=0.0, store=False,
                                          stream=True))
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert events[-1].response.output_text == first.output_text
    client.responses.delete(second.id)
    client.responses.delete(first.id)
    claude = anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = [{"name": "get_weather", "input_schema": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
        "required": ["city"]}}]
    message = claude.messages.create(model="default", max_tokens=48, messages=ask, tools=tools,
                                     tool_choice={"type": "tool", "name": "get_weather",
                                                  "disable_parallel_tool_use": True},
                                     extra_body={"temperature": 0.0})
    assert message.stop_reason == "tool_use"
    assert [b.type for b in message.content] == ["tool_use"]
    assert isinstance(message.content[0].input["city"], str)
    with claude.messages.stream(model="default", max_tokens=8, messages=ask,
                                extra_body={"temperature": 0.0}) as stream:
        text = "".join(stream.text_stream)
    whole = claude.messages.create(model="default", max_tokens=8, messages=ask,
                                   extra_body={"temperature": 0.0})
    assert text == whole.content[0].text
    counted = claude.messages.count_tokens(model="default", messages=ask)
    assert counted.input_tokens == whole.usage.input_tokens + \
        whole.usage.cache_read_input_tokens
    server.wait_idle()


def test_the_agents_sdk_runs_a_tool_calling_agent(server):
    """The OpenAI Agents SDK with its default (Responses) model against the real server: the
    agent calls its tool, reads the result and answers."""
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)
    seen = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"It is 18 degrees and sunny in {city}."

    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
    agent = Agent(name="weather", instructions="You are a helpful assistant.",
                  tools=[get_weather],
                  model=OpenAIResponsesModel(model="default", openai_client=client),
                  model_settings=ModelSettings(tool_choice="required", temperature=0.0,
                                               parallel_tool_calls=False, max_tokens=160,
                                               store=False))  # nothing left pinned
    result = asyncio.run(Runner.run(agent, "What is the weather in Paris?", max_turns=4))
    kinds = [item.type for item in result.new_items]
    assert seen and "tool_call_output_item" in kinds and kinds[-1] == "message_output_item"
    assert isinstance(result.final_output, str)
    server.wait_idle()


def test_killing_the_worker_stops_everything(server):
    """Last in this module: the server must exit non-zero within seconds, leaving nothing."""
    worker = next(p for p in server.children if "worker" in " ".join(p.cmdline()) or
                  p.name().startswith("radixrt::w"))
    worker.kill()
    code = server.proc.wait(timeout=30)
    assert code != 0
    output = server.proc.stdout.read()
    assert "worker process died" in output
    gone, alive = psutil.wait_procs(server.children, timeout=10)
    assert not alive, f"left behind: {alive}"
