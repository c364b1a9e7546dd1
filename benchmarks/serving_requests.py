"""One streamed request of the serving benchmarks and what it measures: the prompt, the result
(TTFT, inter-token gaps, end-to-end time, token counts from usage), random prompt text, and the
statistics the tables print. Shared by serving.py and serving_sharing.py."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from serving_systems import System

FIRST_TOKEN_ID = 100  # random prompts use ids FIRST_TOKEN_ID..vocab-1, clear of special tokens


@dataclass(frozen=True)
class Prompt:
    text: str
    prompt_len: int  # by the local tokenizer; the server's own count comes back in usage
    output_len: int


@dataclass
class RequestResult:
    ok: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itls: list[float] = field(default_factory=list)
    cached_tokens: int | None = None


REQUEST_TIMEOUT_S = 600.0


def openai_client(base: str) -> Any:
    """An `openai.AsyncOpenAI` client for base (http://host:port) that opens a fresh connection
    per request, for every system alike: llama-server drops idle keep-alive connections, and a
    request on one it just closed failed as a connection error. No retries."""
    import httpx
    from openai import AsyncOpenAI

    http = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0),
                             timeout=REQUEST_TIMEOUT_S)
    return AsyncOpenAI(base_url=base + "/v1", api_key="none", timeout=REQUEST_TIMEOUT_S,
                       max_retries=0, http_client=http)


def random_text(tok: Any, rng: random.Random, n: int) -> str:
    vocab = len(tok)
    return tok.decode([rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(n)])


def token_count(tok: Any, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=True))


def ideal_hit_rate(token_lists: list[list[int]]) -> float:
    """The hit rate of computing every distinct prefix once: 1 - (nodes of the token trie of
    all prompts) / (all prompt tokens), where a prompt that is whole in the trie already still
    computes its last token (its logits are needed). Order-independent."""
    total = sum(len(t) for t in token_lists)
    computed, previous = 0, None
    for tokens in sorted(token_lists):  # a sorted list's trie: each adds its part past the LCP
        common = 0
        if previous is not None:
            limit = min(len(tokens), len(previous))
            while common < limit and tokens[common] == previous[common]:
                common += 1
        computed += max(len(tokens) - common, 1)
        previous = tokens
    return 1 - computed / total if total else 0.0


async def one_request(client: Any, system: System, prompt: Prompt) -> RequestResult:
    if system.protocol == "sglang":
        return await sglang_request(str(client.base_url).rstrip("/").removesuffix("/v1"),
                                    prompt)
    result = RequestResult(prompt_len=prompt.prompt_len)
    chunks, usage = 0, None
    start = last = time.perf_counter()
    try:
        stream = await client.completions.create(
            model="default", prompt=prompt.text, max_tokens=prompt.output_len, temperature=0.0,
            stream=True, extra_body=system.extra_body,
            **({"stream_options": {"include_usage": True}} if system.stream_usage else {}),
        )
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices and chunk.choices[0].text:
                if chunks == 0:
                    result.ttft = now - start
                else:
                    result.itls.append(now - last)
                chunks, last = chunks + 1, now
            usage = chunk.usage or usage
    except Exception as exc:  # a failed request is reported, not fatal
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.e2e = time.perf_counter() - start
    result.ok = chunks > 0
    result.error = "" if result.ok else "no text came back"
    fill_usage(result, usage, chunks)
    return result


async def sglang_request(base: str, prompt: Prompt) -> RequestResult:
    """One streamed request in SGLang's /generate protocol, the body `python -m
    sglang.bench_serving --backend sglang` sends (greedy, EOS ignored, no LoRA, no logprobs);
    each event carries the text so far and meta_info's completion_tokens."""
    import json

    import httpx

    result = RequestResult(prompt_len=prompt.prompt_len)
    body = {"text": prompt.text, "stream": True, "lora_path": None, "return_logprob": False,
            "logprob_start_len": -1, "return_routed_experts": False,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": prompt.output_len,
                                "ignore_eos": True}}
    start = last = time.perf_counter()
    seen, meta = 0, None
    try:
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as http, http.stream(
                "POST", base + "/generate", json=body) as response:
            if response.status_code != 200:
                raise RuntimeError(f"{response.status_code}: {(await response.aread())[:300]!r}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: "):])
                meta = event["meta_info"]
                now = time.perf_counter()
                if event["text"] and meta["completion_tokens"] > seen:
                    if seen == 0:
                        result.ttft = now - start
                    else:
                        gap = (now - last) / (meta["completion_tokens"] - seen)
                        result.itls += [gap] * (meta["completion_tokens"] - seen)
                    seen, last = meta["completion_tokens"], now
    except Exception as exc:  # a failed request is reported, not fatal
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.e2e = time.perf_counter() - start
    result.ok = seen > 0 and meta is not None and meta["finish_reason"] is not None
    result.error = "" if result.ok else "no text came back"
    if meta is not None:
        result.output_tokens = meta["completion_tokens"]
        result.prompt_len = meta["prompt_tokens"]
        result.cached_tokens = meta["cached_tokens"]
    return result


def fill_usage(result: RequestResult, usage: Any, chunks: int) -> None:
    """Token counts from usage when the server sends it, else one token per text chunk."""
    if usage is None:
        result.output_tokens = chunks
        return
    result.output_tokens = usage.completion_tokens
    result.prompt_len = usage.prompt_tokens
    details = usage.prompt_tokens_details
    result.cached_tokens = details.cached_tokens if details is not None else None


def stats_ms(values: list[float]) -> tuple[float, float, float]:
    """(mean, median, p99) in milliseconds; zeros for an empty list."""
    if not values:
        return 0.0, 0.0, 0.0
    ms = np.asarray(values) * 1000.0
    return float(ms.mean()), float(np.median(ms)), float(np.percentile(ms, 99))
