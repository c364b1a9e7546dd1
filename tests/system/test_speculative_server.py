"""`radixrt serve --speculative-algorithm radix` as a real server process (overlap scheduling,
ZeroMQ between the processes) through the official openai client: answers equal the in-process
engine's without speculation, streamed text equals the whole, a JSON schema holds, concurrent
requests keep the KV invariants, and /metrics shows drafts made and accepted."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator

import httpx
import openai
import pytest
from test_server import API_KEY, Server

from radixrt import SamplingParams

pytestmark = pytest.mark.slow  # a real server

RECORD = ('{"name": "Grace Hopper", "born": 1906, "field": "computer science", '
          '"known_for": ["COBOL", "the first compiler"], "city": "New York"}')
COPY = f"Repeat this JSON record exactly:\n{RECORD}\nRepeated:\n"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server("--max-total-tokens", "4096", "--api-key", API_KEY, "--log-level", "warning",
                 "--check-integrity", "--speculative-algorithm", "radix",
                 "--speculative-num-draft-tokens", "6")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)


def metric(server: Server, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", headers=server.headers(), timeout=30).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def test_answers_equal_the_engine_without_speculation(server, client, make_engine):
    before = metric(server, "radixrt_spec_accepted_tokens")
    out = client.completions.create(model="default", prompt=COPY, max_tokens=48, temperature=0,
                                    logprobs=1)
    ref = make_engine(speculative_algorithm=None).generate(
        COPY, SamplingParams(max_tokens=48, temperature=0, logprobs=True))[0]
    assert out.choices[0].text == ref.text
    assert out.usage.completion_tokens == ref.completion_tokens
    got = out.choices[0].logprobs.token_logprobs
    want = [t.logprob for t in ref.samples[0].logprobs]
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4
    assert metric(server, "radixrt_spec_accepted_tokens") - before >= 12
    assert "radixrt_spec_accept_length{" in httpx.get(
        f"{server.url}/metrics", headers=server.headers(), timeout=30).text
    info = server.wait_idle()
    assert info["speculative_algorithm"] == "radix" and info["draft_index_entries"] > 0


def test_streamed_text_is_the_whole_text(client):
    whole = client.completions.create(model="default", prompt=COPY, max_tokens=40,
                                      temperature=0).choices[0].text
    stream = client.completions.create(model="default", prompt=COPY, max_tokens=40,
                                       temperature=0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in stream) == whole


def test_a_json_schema_holds_and_concurrent_requests_leave_nothing(server, client):
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "born": {"type": "integer"}},
              "required": ["name", "born"], "additionalProperties": False}

    def ask(i: int) -> str:
        return client.chat.completions.create(
            model="default", max_tokens=48, temperature=0.7 if i % 2 else 0, seed=i,
            messages=[{"role": "user", "content": COPY}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "person", "schema": schema}},
        ).choices[0].message.content

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(8)))
    for answer in answers:
        data = json.loads(answer)
        assert set(data) == {"name", "born"} and isinstance(data["born"], int)
    info = server.wait_idle()
    assert info["kv_private"] == 0 and info["kv_locked"] == 0
