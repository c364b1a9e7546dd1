"""Sharing one server over HTTP, in process (the app over an Engine's TokenizerManager, real
uvicorn sockets, the official openai client): named API keys become tenants, queue caps
answer 429 with Retry-After and the server keeps serving, a queue timeout is a 408,
/health_generate reports overload, cache_salt separates cached prefixes, and /metrics counts by
priority and tenant."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from http_serving import serve_in_thread

from radixrt.runtime.server.core.tenants import ApiKeys

MODEL = "default"
KEYS = {"alice": "key-alice-123", "bob": "key-bob-456"}
LONG_PREFIX = " ".join(f"Rule {i}: keep the number {i} in mind." for i in range(24))
QUEUE_CAP = 2  # waiting requests in all


class Tenancy:
    def __init__(self, engine: Any, port: int) -> None:
        self.engine = engine
        self.url = f"http://127.0.0.1:{port}"

    def client(self, tenant: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=KEYS[tenant], max_retries=0)

    def http(self, tenant: str = "alice") -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120,
                            headers={"Authorization": f"Bearer {KEYS[tenant]}"})


@pytest.fixture(scope="module")
def tenancy(loaded_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenancy]:
    from radixrt import Engine
    from radixrt.runtime.server.http_server import create_app

    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text("# name:key\n" + "".join(f"{n}:{k}\n" for n, k in KEYS.items()))
    # speculation off: hold_the_slot's request must hold the one slot for as long as its
    # tokens take one step each (drafts would end it early, and the waits here are timed)
    engine = Engine(model=loaded_model, max_total_tokens=4096, check_integrity=True,
                    max_running_requests=1, max_queued_requests=QUEUE_CAP,
                    speculative_algorithm=None)
    manager = engine.tokenizer_manager("smollm2")
    ports, stop = serve_in_thread([create_app(manager, keys=ApiKeys.from_file(key_file))])
    yield Tenancy(engine, ports[0])
    stop()
    engine.check_integrity()


def hold_the_slot(srv: Tenancy, tokens: int = 120) -> tuple[threading.Thread, list]:
    """Start a long request in a thread (it takes the one running slot); returns the thread
    and a list that gets its finish reason."""
    done: list = []

    def run() -> None:
        out = srv.client("alice").completions.create(
            model=MODEL, prompt="Count: 1, 2, 3,", max_tokens=tokens, temperature=0,
            extra_body={"ignore_eos": True})
        done.append(out.choices[0].finish_reason)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while srv.engine.stats()["running"] == 0:
        assert time.monotonic() < deadline, "the long request never started"
        time.sleep(0.01)
    return thread, done


def wait_for(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_full_queue_is_a_429_with_retry_after_and_the_server_serves_on(
    tenancy: Tenancy,
) -> None:
    thread, done = hold_the_slot(tenancy)
    waiting: list = []

    def queued(i: int) -> None:  # alice's own: another tenant would take her slot (fair share)
        out = tenancy.client("alice").completions.create(
            model=MODEL, prompt=f"Say {i}:", max_tokens=2, temperature=0)
        waiting.append(out.choices[0].finish_reason)

    queued_threads = [threading.Thread(target=queued, args=(i,), daemon=True)
                      for i in range(QUEUE_CAP)]
    for t in queued_threads:
        t.start()
    wait_for(lambda: tenancy.engine.stats()["waiting"] == QUEUE_CAP)
    with tenancy.http("bob") as http:
        response = http.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                                      "max_tokens": 2})
        assert response.status_code == 429
        assert int(response.headers["Retry-After"]) >= 1
        error = response.json()["error"]
        assert error["code"] == "queue_full" and "max-queued-requests" in error["message"]
        overloaded = http.get("/health_generate")
        assert overloaded.status_code == 503 and "overloaded" in overloaded.text
    with pytest.raises(openai.RateLimitError):
        tenancy.client("alice").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    for t in [thread, *queued_threads]:
        t.join(timeout=120)
    assert done == ["length"] and waiting == ["length"] * QUEUE_CAP  # nothing lost
    with tenancy.http() as http:
        assert http.get("/health_generate").status_code == 200
        info = http.get("/server_info").json()
    assert info["queue_full"] >= 3 and info["kv_private"] == 0


def test_a_request_waiting_past_its_timeout_is_a_408(tenancy: Tenancy) -> None:
    thread, _ = hold_the_slot(tenancy, tokens=300)  # outlasts the three 0.2 s timeouts below
    with tenancy.http() as http:
        response = http.post("/v1/completions", json={
            "model": MODEL, "prompt": "x", "max_tokens": 2, "timeout": 0.2})
        assert response.status_code == 408, response.text
        assert response.headers["x-should-retry"] == "false"  # the clients would retry a 408
        error = response.json()["error"]
        assert error["code"] == "queue_timeout" and "timeout=0.2s" in error["message"]
        generate = http.post("/generate", json={"text": "x", "timeout": 0.2,
                                                "sampling_params": {"max_tokens": 2}})
        assert generate.status_code == 408
    sent: list = []  # the official client, with its default retries, sends it once
    counted = httpx.Client(timeout=120, event_hooks={"request": [sent.append]})
    patient = openai.OpenAI(base_url=f"{tenancy.url}/v1", api_key=KEYS["alice"],
                            http_client=counted)
    with pytest.raises(openai.APIStatusError) as refused:
        patient.completions.create(model=MODEL, prompt="x", max_tokens=2,
                                   extra_body={"timeout": 0.2})
    assert refused.value.status_code == 408 and len(sent) == 1
    thread.join(timeout=120)


@pytest.mark.parametrize("body", [
    {"priority": 2**21}, {"priority": 2**70}, {"priority": "high"}, {"cache_salt": "s" * 300},
    {"timeout": 0}, {"timeout": -1}, {"timeout": 10**9}, {"timeout": "soon"},
])
def test_bad_scheduling_fields_are_a_400_that_names_them(tenancy: Tenancy,
                                                         body: dict) -> None:
    field = next(iter(body))
    with tenancy.http() as http:
        for path, request in (
            ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1, **body}),
            ("/v1/chat/completions", {"model": MODEL, "max_tokens": 1, **body,
                                      "messages": [{"role": "user", "content": "x"}]}),
            ("/generate", {"text": "x", "sampling_params": {"max_tokens": 1}, **body}),
        ):
            response = http.post(path, json=request)
            assert response.status_code == 400, (path, body, response.text)
            assert field in response.json()["error"]["message"], response.text
        assert http.get("/health_generate").status_code == 200


def test_cache_salt_keeps_tenants_prefixes_apart(tenancy: Tenancy) -> None:
    def cached(salt: str | None, tail: str) -> int:
        extra = {} if salt is None else {"cache_salt": salt}
        out = tenancy.client("alice").completions.create(
            model=MODEL, prompt=LONG_PREFIX + tail, max_tokens=1, temperature=0,
            extra_body=extra)
        return out.usage.prompt_tokens_details.cached_tokens

    prompt_tokens = len(tenancy.engine.tokenizer.encode(LONG_PREFIX))
    cached("salt-a", " A")
    assert cached("salt-b", " B") == 0  # another namespace: nothing of salt-a's
    assert cached(None, " C") == 0  # nor of the unsalted one
    assert cached("salt-a", " D") >= prompt_tokens - 2  # the same salt hits
    with tenancy.http() as http:  # /generate takes it too
        meta = http.post("/generate", json={"text": LONG_PREFIX + " E", "cache_salt": "salt-b",
                                            "sampling_params": {"max_tokens": 1}}).json()
    assert meta["meta_info"]["cached_tokens"] >= prompt_tokens - 2


def test_keys_name_tenants_and_metrics_count_by_priority_and_tenant(tenancy: Tenancy) -> None:
    for tenant, priority in (("alice", 3), ("bob", -2)):
        tenancy.client(tenant).completions.create(
            model=MODEL, prompt="Hi", max_tokens=2, temperature=0,
            extra_body={"priority": priority})
    with tenancy.http() as http:
        text = http.get("/metrics").text
        bad = httpx.get(f"{tenancy.url}/v1/models", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401
    assert 'radixrt_class_requests_total{priority="3",tenant="alice"}' in text
    assert 'radixrt_class_requests_total{priority="-2",tenant="bob"}' in text
    assert 'radixrt_class_tokens_total{kind="generated",priority="-2",tenant="bob"} 2.0' in text


def test_a_key_file_is_checked_line_by_line(tmp_path: Path) -> None:
    cases = {
        "alice\n": "line 1: expected 'name:key'",
        "a:1\na:2\n": "line 2: the name or the key appears twice",
        "a:1\nb:1\n": "appears twice",
        "# only a comment\n": "no 'name:key' lines",
        f"{'n' * 300}:k\n": "longer than",
    }
    for text, message in cases.items():
        path = tmp_path / "keys.txt"
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            ApiKeys.from_file(path)
    path.write_text("a: k1 \n\nb:k2:with:colons\n")
    keys = ApiKeys.from_file(path)
    assert keys.match(b"k1") == (True, "a")
    assert keys.match(b"k2:with:colons") == (True, "b")
    assert keys.match(b"k3") == (False, None)


def test_a_key_file_may_weigh_its_tenants(tmp_path: Path) -> None:
    from radixrt.runtime.config import EngineConfig, parse_tenant_weights
    from radixrt.runtime.server.core.tenants import with_key_weights

    path = tmp_path / "keys.txt"
    path.write_text("alice:k1 weight=2\nbob:my key\ncarol:k3:x  weight=0.25\ndave:abc 2\n")
    keys = ApiKeys.from_file(path)
    assert keys.weights == (("alice", 2.0), ("carol", 0.25))
    assert keys.match(b"k3:x") == (True, "carol")
    assert keys.match(b"my key") == (True, "bob")  # keys may hold spaces, as before
    assert keys.match(b"abc 2") == (True, "dave")
    config = with_key_weights(EngineConfig(tenant_weights="erin:3"), keys)
    assert parse_tenant_weights(config.tenant_weights) == {"erin": 3.0, "alice": 2.0,
                                                           "carol": 0.25}
    assert with_key_weights(EngineConfig(), ApiKeys.single("k")) == EngineConfig()
    with pytest.raises(ValueError, match=r"\['alice'\] weighed by both"):
        with_key_weights(EngineConfig(tenant_weights="alice:1"), keys)
    for text, message in {"a:k weight=0\n": "line 1: tenant 'a': the weight '0' is not a number",
                          "a:k weight=two\n": "the weight 'two'",
                          "a:k weight=\n": "the weight '' is not a number",
                          ":k weight=2\n": "expected 'name:key' or 'name:key weight=W'",
                          "a,b:k weight=1\n": "has a comma"}.items():
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            ApiKeys.from_file(path)


def test_tenant_weights_are_checked_when_the_config_is_made() -> None:
    from radixrt.runtime.config import EngineConfig, parse_tenant_weights

    assert parse_tenant_weights(" a:2, b:0.5 ,") == {"a": 2.0, "b": 0.5}
    assert parse_tenant_weights("") == {}
    for text, message in {"a": "expected name:weight", ":2": "expected name:weight",
                          "a:2,a:3": "'a' is weighed twice", "a:2;b:1": "has a comma or a colon",
                          "a:inf": "not a number", "a:-1": "not a number",
                          "a:2000": "not a number from 0.001 to 1000"}.items():
        with pytest.raises(ValueError, match=f"EngineConfig.tenant_weights=.*{message}"):
            EngineConfig(tenant_weights=text)
    with pytest.raises(ValueError, match="fair_share_quantum=0 is invalid: must be >= 1"):
        EngineConfig(fair_share_quantum=0)


def test_a_tenant_holding_no_slot_preempts_and_metrics_count_it(tenancy: Tenancy) -> None:
    """One running slot, held by alice's long request: bob's request takes it within a
    quantum (fair share), alice's resumes and finishes; /metrics counts the preemption by
    cause and the running requests by tenant."""
    thread, done = hold_the_slot(tenancy, tokens=200)
    with tenancy.http() as http:
        text = http.get("/metrics").text
    assert 'radixrt_tenant_running_requests{tenant="alice"} 1.0' in text
    out = tenancy.client("bob").completions.create(model=MODEL, prompt="Hi", max_tokens=2,
                                                   temperature=0)
    assert out.choices[0].finish_reason == "length"
    assert thread.is_alive()  # bob did not wait for alice's 200 tokens
    thread.join(timeout=120)
    assert done == ["length"]
    with tenancy.http() as http:
        text = http.get("/metrics").text
    line = next(x for x in text.splitlines()
                if x.startswith('radixrt_preemptions_by_cause{cause="fair_share"}'))
    assert float(line.split()[-1]) >= 1


def test_the_tenant_is_the_keys_name_else_user_else_shared() -> None:
    from starlette.requests import Request

    from radixrt.runtime.server.core.tenants import TENANT_STATE, tenant_of

    named = Request({"type": "http", "state": {TENANT_STATE: "alice"}})
    anonymous = Request({"type": "http"})
    assert tenant_of(named, "someone") == "alice"  # a named key wins over `user`
    assert tenant_of(anonymous, "someone") == "someone"
    assert tenant_of(anonymous, None) == ""
