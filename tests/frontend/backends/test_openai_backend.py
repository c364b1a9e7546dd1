"""rx.OpenAICompatible against the response shapes of the servers it names, replayed from what
each server answers (no model): radixrt / vLLM legacy echo logprobs with `text_offset`, a server
whose echo logprobs have no `text_offset`, and llama.cpp's llama-server, which ignores `echo`
(generated-token logprobs only, "content" entries with token ids) but has /tokenize and answers
a batch of token-id prompts; and a server with neither route is refused with a message that
says what it lacks."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest

import radixrt as rx

CHAT = "chatml"
# a toy vocabulary: each word is a token, a leading space kept with it
VOCAB = {"The": 1, " sky": 2, " is": 3, " blue": 4, " green": 5, " very": 6}
# next-token logprobs after each prefix (token ids), the rest of the vocabulary far below
NEXT = {(1, 2, 3): {4: -0.5, 5: -2.0, 6: -3.0}, (1, 2, 3, 6): {4: -0.1, 5: -4.0}}


def tokenize(text: str) -> list[int]:
    ids, rest = [], text
    while rest:
        word = max((w for w in VOCAB if rest.startswith(w)), key=len)
        ids.append(VOCAB[word])
        rest = rest[len(word):]
    return ids


def logprob(prefix: tuple[int, ...], token: int) -> float:
    return NEXT.get(prefix, {}).get(token, -9.0)


def legacy_echo(prompt: str, with_offsets: bool) -> dict[str, Any]:
    ids = tokenize(prompt)
    words = {v: k for k, v in VOCAB.items()}
    lp: dict[str, Any] = {"tokens": [words[i] for i in ids],
                          "token_logprobs": [None] + [logprob(tuple(ids[:i]), ids[i])
                                                      for i in range(1, len(ids))]}
    if with_offsets:
        lp["text_offset"] = [sum(len(words[j]) for j in ids[:i]) for i in range(len(ids))]
    return {"text": prompt, "logprobs": lp}


def llama_server(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    if request.url.path == "/tokenize":
        return httpx.Response(200, json={"tokens": tokenize(body["content"])})
    prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
    choices = []
    for i, prompt in enumerate(prompts):
        ids = tuple(prompt) if isinstance(prompt, list) else tuple(tokenize(prompt))
        top = sorted(((lp, t) for t, lp in NEXT.get(ids, {4: -1.0}).items()), reverse=True)
        entries = [{"id": t, "token": "?", "logprob": lp} for lp, t in top]
        choices.append({"index": i, "text": "?", "finish_reason": "length",
                        "logprobs": {"content": [{**entries[0], "top_logprobs": entries}]}})
    return httpx.Response(200, json={"choices": choices})


def echo_server(with_offsets: bool) -> Any:
    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path.endswith("/server_info"):
            return httpx.Response(404, json={"error": {"message": "Not Found"}})
        choices = [{"index": i, "finish_reason": "length", **legacy_echo(p, with_offsets)}
                   for i, p in enumerate(body["prompt"])]
        return httpx.Response(200, json={"choices": choices})
    return handle


def select_scores(handler: Any) -> tuple[str, list[float]]:
    backend = rx.OpenAICompatible("http://server/v1", "m", chat_format=CHAT,
                                  transport=httpx.MockTransport(handler))

    @rx.function
    def pick(s):
        s += "The sky is" + rx.select("c", [" blue", " green", " very blue"])

    state = pick.run(backend=backend)
    return state["c"], state.get_meta_info("c")["token_logprobs"]


WANT = (" blue", [[-0.5], [-2.0], [-3.0, -0.1]])


@pytest.mark.parametrize("with_offsets", [True, False])
def test_legacy_echo_with_and_without_text_offset(with_offsets: bool) -> None:
    assert select_scores(echo_server(with_offsets)) == WANT


def test_llama_server_is_scored_from_next_token_logprobs() -> None:
    calls: list[str] = []

    def counted(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return llama_server(request)

    assert select_scores(counted) == WANT
    # one echo attempt, then tokenize, then ONE batch of the distinct scored prefixes
    assert calls.count("/v1/completions") == 2


def test_a_server_with_no_scoring_route_is_refused_with_what_to_use() -> None:
    def no_route(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/tokenize":
            return httpx.Response(404, json={"error": {"message": "Not Found"}})
        return httpx.Response(200, json={"choices": [
            {"index": i, "text": "x", "logprobs": None} for i in range(3)]})

    with pytest.raises(rx.BackendError, match="ignores echo.*rx.RuntimeEndpoint"):
        select_scores(no_route)


def test_top_logprobs_come_back_in_sglang_shape() -> None:
    def completion(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"choices": [{
            "index": 0, "text": " blue", "finish_reason": "length",
            "logprobs": {"tokens": [" blue"], "token_logprobs": [-0.5],
                         "top_logprobs": [{" blue": -0.5, " green": -2.0}]}}]})

    backend = rx.OpenAICompatible("http://server/v1", "m", chat_format=CHAT,
                                  transport=httpx.MockTransport(completion))

    @rx.function
    def gen(s):
        s += "The sky is" + rx.gen("x", max_tokens=1, return_logprob=True, top_logprobs_num=2)

    meta = gen.run(backend=backend).get_meta_info("x")
    assert meta["output_token_logprobs"] == [(-0.5, None, " blue")]
    assert meta["output_top_logprobs"] == [[(-0.5, None, " blue"), (-2.0, None, " green")]]
    assert not math.isnan(meta["output_token_logprobs"][0][0])


def test_arun_on_an_openai_compatible_server_waits_on_the_loop_not_on_threads() -> None:
    """Under arun the backend's HTTP runs on the caller's event loop (an AsyncClient per loop):
    64 programs have their requests in flight at once, with no worker thread."""
    import asyncio
    import threading

    state = {"in_flight": 0, "peak": 0}

    async def slow_echo(request: httpx.Request) -> httpx.Response:
        state["in_flight"] += 1
        state["peak"] = max(state["peak"], state["in_flight"])
        await asyncio.sleep(0.05)
        state["in_flight"] -= 1
        body = json.loads(request.content)
        if body.get("echo"):
            return echo_server(True)(request)
        return httpx.Response(200, json={"choices": [
            {"index": 0, "text": " very", "finish_reason": "length"}]})

    backend = rx.OpenAICompatible("http://server/v1", "m", chat_format=CHAT,
                                  transport=httpx.MockTransport(slow_echo))

    @rx.function
    def pick(s):
        s += "The sky is" + rx.gen("x", max_tokens=1) + rx.select("c", [" blue", " green"])

    async def main() -> tuple[list[str], int]:
        before = threading.active_count()
        states = await asyncio.gather(*(pick.arun(backend=backend) for _ in range(64)))
        return [s["c"] for s in states], threading.active_count() - before

    picks, extra_threads = asyncio.run(main())
    assert picks == [" blue"] * 64 and extra_threads == 0
    assert state["peak"] == 64  # every program's request in flight at once
