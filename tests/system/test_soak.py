"""Soak test: `radixrt serve --check-integrity` on a KV pool far too small for its load, over
loopback, in each preemption mode. A few hundred seeded, mixed requests (chat and completions,
streamed or not, n = 1..3, stop strings, logprobs, a regex, three priorities, two tenants) run
16 at a time; a quarter of the
clients walk away at a random moment. Nothing may be lost: every request not abandoned ends with
HTTP 200 and a proper finish for each of its samples; every greedy answer equals the same
request sent alone on the idle server afterwards; preemptions happened; the pool ends idle and
the server alive, with no traceback in its log, and exits cleanly. Urgent requests preempted
less urgent ones along the way.

A longer run, or another draw:

    RADIXRT_SOAK_REQUESTS=2000 RADIXRT_SOAK_SEED=7 python -m pytest -q tests/system/test_soak.py
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import threading
import time

import httpx
import pytest
from test_server import API_KEY, Server

pytestmark = pytest.mark.slow  # starts real processes

REQUESTS = int(os.environ.get("RADIXRT_SOAK_REQUESTS", "130"))  # per preemption mode
SEED = int(os.environ.get("RADIXRT_SOAK_SEED", "0"))
CONCURRENCY = 16
ABANDONED = 0.25
POOL_TOKENS = "160"  # 16 clients of 30-110 tokens each: preemption is routine

PROMPTS = ["The capital of France is", "1, 2, 3,", "Once upon a time", "def fib(n):",
           "The three most spoken languages in the world are", "Q: What is 7 times 6?\nA:"]
QUESTIONS = ["Name a color.", "What is the sun?", "Tell me a joke.", "Count to five.",
             "Write a haiku about rain.", "Is water wet? Answer yes or no."]
STOPS = [".", ",", " the", "\n", "!"]
REGEXES = [r"[0-9]{1,3}", r"(yes|no)\.", r"[a-z]+( [a-z]+){0,4}"]


def draw(rng: random.Random) -> tuple[str, dict, int | None]:
    """One request: its path, its body, and (if abandoned) after how many events it is."""
    chat = rng.random() < 0.5
    body: dict = {"model": "default", "max_tokens": rng.randint(8, 24)}
    if chat:
        body["messages"] = [{"role": "user", "content": rng.choice(QUESTIONS)}]
    else:
        body["prompt"] = rng.choice(PROMPTS)
    if rng.random() < 0.5:
        body["temperature"] = 0
    else:
        body["temperature"] = rng.choice([0.7, 1.0])
        body["seed"] = rng.randrange(1000)
    body["n"] = rng.choice([1, 1, 2, 3])
    extra = rng.random()
    if extra < 0.25:
        body["stop"] = rng.sample(STOPS, rng.randint(1, 2))
    elif extra < 0.4:
        body["regex"] = rng.choice(REGEXES)
    if rng.random() < 0.3:
        body.update({"logprobs": True, "top_logprobs": 2} if chat else {"logprobs": 2})
    body["stream"] = rng.random() < 0.5
    body["priority"] = rng.choice([-1, 0, 0, 2])
    body["user"] = rng.choice(["tenant-a", "tenant-b"])
    abandon_after = rng.randint(0, 12) if rng.random() < ABANDONED else None
    return ("/v1/chat/completions" if chat else "/v1/completions"), body, abandon_after


def greedy_key(path: str, body: dict) -> str:
    """Streamed or not, the same greedy request must give the same text."""
    return json.dumps([path, {k: v for k, v in body.items() if k != "stream"}], sort_keys=True)


def logprob_count(choice: dict) -> int:
    lp = choice.get("logprobs") or {}
    return len(lp.get("content") or lp.get("tokens") or [])


async def send(client: httpx.AsyncClient, path: str, body: dict,
               abandon_after: int | None = None) -> dict[int, list] | None:
    """{choice index: [text, finish_reason, logprob entries]}; None if abandoned first.
    A streamed request is abandoned after `abandon_after` events, any other after as many
    tenths of a second: the connection closes mid-flight."""
    if not body["stream"]:
        work = client.post(path, json=body)
        if abandon_after is None:
            response = await work
        else:
            try:
                response = await asyncio.wait_for(work, abandon_after / 10)
            except asyncio.TimeoutError:
                return None
        assert response.status_code == 200, (path, body, response.text)
        out = response.json()
        assert out["usage"]["completion_tokens"] <= body["n"] * body["max_tokens"]
        return {c["index"]: [c["text"] if "text" in c else c["message"]["content"],
                             c["finish_reason"], logprob_count(c)] for c in out["choices"]}
    got: dict[int, list] = {}
    async with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, (path, body, (await response.aread()).decode())
        events = []
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(line)
                if abandon_after is not None and len(events) > abandon_after:
                    return None
    assert events and events[-1] == "data: [DONE]", (path, body, events[-3:])
    for event in events[:-1]:
        for c in json.loads(event[len("data: "):])["choices"]:
            sample = got.setdefault(c["index"], ["", None, 0])
            assert sample[1] is None, f"choice {c['index']} went on after its finish: {body}"
            sample[0] += c["text"] if "text" in c else c["delta"].get("content") or ""
            sample[1] = c["finish_reason"]
            sample[2] += logprob_count(c)
    return got


def check_finished(path: str, body: dict, got: dict[int, list]) -> None:
    where = f"{path} {json.dumps(body)} -> {got}"
    assert sorted(got) == list(range(body["n"])), where
    for text, reason, logprobs in got.values():
        assert reason in ("stop", "length"), where
        assert not any(stop in text for stop in body.get("stop", [])), where
        if "regex" in body and reason == "stop":
            assert re.fullmatch(body["regex"], text), where
        if body.get("logprobs"):
            assert 0 < logprobs <= body["max_tokens"], where
            assert reason != "length" or logprobs == body["max_tokens"], where


async def soak(url: str, requests: list[tuple[str, dict, int | None]]) -> list:
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(client: httpx.AsyncClient, request: tuple) -> dict | None:
        async with limit:
            return await send(client, *request)

    headers = {"Authorization": f"Bearer {API_KEY}"}
    limits = httpx.Limits(max_connections=CONCURRENCY + 4)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120,
                                 limits=limits) as client:
        return await asyncio.gather(*(one(client, r) for r in requests))


async def alone(url: str, requests: list[tuple[str, dict]]) -> list:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {API_KEY}"},
                                 timeout=120) as client:
        return [await send(client, path, {**body, "stream": False}) for path, body in requests]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_soak_under_preemption(mode: str) -> None:
    rng = random.Random(f"{SEED}-{mode}")
    requests = [draw(rng) for _ in range(REQUESTS)]
    server = Server("--max-total-tokens", POOL_TOKENS, "--preemption", mode, "--api-key", API_KEY,
                    "--check-integrity", "--log-level", "warning")
    log: list[str] = []  # drained as it comes, so a chatty server never blocks on its pipe
    drain = threading.Thread(target=lambda: log.extend(server.proc.stdout), daemon=True)
    drain.start()
    try:
        started = time.monotonic()
        results = asyncio.run(soak(server.url, requests))
        elapsed = time.monotonic() - started
        finished = {}  # greedy key -> every result of a request with that key
        for (path, body, abandoned), got in zip(requests, results):
            if abandoned is None:
                check_finished(path, body, got)
                if body["temperature"] == 0:
                    finished.setdefault(greedy_key(path, body), []).append(got)
        info = server.wait_idle(timeout=60)
        assert info["waiting"] == info["swapped"] == 0, info
        assert info["kv_free"] + info["kv_evictable"] == info["kv_total"], info
        keys = sorted(finished)
        started = time.monotonic()
        references = asyncio.run(alone(server.url, [json.loads(k) for k in keys]))
        alone_s = time.monotonic() - started
        for key, reference in zip(keys, references):
            check_finished(*json.loads(key), reference)
            expected = [reference[i][:2] for i in sorted(reference)]  # text, finish_reason
            for got in finished[key]:
                assert [got[i][:2] for i in sorted(got)] == expected, \
                    f"batched {got} != alone {reference} for {key}"
        print(f"\n{mode}: {len(requests)} requests ({sum(r[2] is not None for r in requests)} "
              f"abandoned) in {elapsed:.1f} s; {len(keys)} greedy sent alone in {alone_s:.1f} s; "
              f"preemptions {info['preemptions']} ({info['priority_preemptions']} for urgent "
              f"requests), swaps {info['swaps']}")
        assert info["preemptions"] > 0, info
        assert info["priority_preemptions"] > 0, info
        assert (info["swaps"] > 0) == (mode == "swap"), info
        server.wait_idle()
        assert server.proc.poll() is None, "".join(log)
    finally:
        server.stop()
        drain.join(timeout=10)
    output = "".join(log)
    assert server.proc.returncode == 0, output
    assert "Traceback" not in output and "integrity" not in output.lower(), output
