"""llama.cpp's llama-server decoding the same GGUF file as radixrt, for decode_bandwidth.py: B
greedy requests at once (a server of B parallel slots), each a prompt of token ids and a fixed
number of output tokens (ignore_eos), and their decode speed from llama-server's own timings
(the tokens each request generated over the time it spent generating them; requests decoded
together overlap, so the batch's speed is their tokens over the longest of those times)."""

from __future__ import annotations

import json
import os
import statistics
import threading
import urllib.request
from dataclasses import dataclass, replace
from typing import Any

from serving_systems import LLAMA_SERVER, System, llama_server_system, running

REQUEST_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class PeerDecode:
    batch: int
    tok_s: float  # every request's generated tokens over the longest generation time
    step_s: float  # seconds per decode step (one token of every request)


def llama_server_binary(path: str | None) -> str | None:
    binary = path or LLAMA_SERVER
    return binary if os.access(binary, os.X_OK) else None


def _complete(base: str, prompt: list[int], tokens: int, out: list[dict[str, Any]]) -> None:
    body = {"prompt": prompt, "n_predict": tokens, "temperature": 0.0, "ignore_eos": True,
            "cache_prompt": False, "stream": False}
    req = urllib.request.Request(f"{base}/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
        out.append(json.loads(resp.read()))


def decode_batch(base: str, prompts: list[list[int]], tokens: int) -> tuple[float, int]:
    """(seconds of the batch's decoding, tokens generated) for prompts sent at once."""
    replies: list[dict[str, Any]] = []
    threads = [threading.Thread(target=_complete, args=(base, p, tokens, replies))
               for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(replies) != len(prompts):
        raise RuntimeError(f"llama-server answered {len(replies)} of {len(prompts)} requests")
    generated = sum(int(r["timings"]["predicted_n"]) for r in replies)
    seconds = max(float(r["timings"]["predicted_ms"]) for r in replies) / 1000
    return seconds, generated


def server_for(binary: str, slots: int) -> System:
    """llama-server with `slots` parallel slots (-np): each batch size on a server of its own
    size, the peer's best configuration for it (one slot decodes a single request fastest)."""
    base = llama_server_system(binary)
    command = list(base.command)
    command[command.index("-np") + 1] = str(slots)
    return replace(base, command=command)


def llama_decode(binary: str, batches: list[int], prompts_of: Any, tokens: int,
                 runs: int) -> list[PeerDecode]:
    """llama-server's decode speed at each batch size: `prompts_of(batch)` gives each run's
    prompts (token ids); median of `runs` runs after one warm-up, a server per batch size."""
    out = []
    for batch in batches:
        with running(server_for(binary, batch)) as base:
            decode_batch(base, prompts_of(1), 8)  # warm-up
            speeds = []
            for _ in range(runs):
                seconds, generated = decode_batch(base, prompts_of(batch), tokens)
                speeds.append(generated / seconds)
        tok_s = statistics.median(speeds)
        out.append(PeerDecode(batch, tok_s, batch / tok_s))
        print(f"llama.cpp batch {batch}: {tok_s:.1f} tok/s", flush=True)
    return out
