"""`radixrt serve` with host and disk KV tiers as a real server: killed with SIGKILL at random
points while it serves (and moves pages to disk) and started again on the same directory, it
serves the earlier prompts' cached tokens from the disk tier with the answers it gave before
(greedy text equal, logprobs within 1e-4), and never reads a torn page as KV; a graceful stop
(SIGTERM) moves the whole cache to disk first. /metrics and /server_info show the tiers."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time

import httpx
import openai
import psutil
import pytest
from test_server import API_KEY, Server

pytestmark = pytest.mark.slow  # starts and kills servers

SYSTEM = ("You are a careful assistant for a research library. Answer in one short sentence, "
          "quote the notes exactly, and never invent a source. ")
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
         "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon"]
DOCS = [SYSTEM + f"Notes {i}: " + " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)]
                                            for j in range(50)) + "\nSummary:" for i in range(8)]


def flags(directory: str) -> list[str]:
    return ["--max-total-tokens", "256", "--host-cache-tokens", "256", "--disk-cache-dir",
            directory, "--disk-cache-tokens", "8192", "--api-key", API_KEY, "--log-level",
            "warning", "--check-integrity"]


def ask(server: Server, doc: str) -> tuple[str, list[float]]:
    out = complete(server, doc)
    return out.choices[0].text, list(out.choices[0].logprobs.token_logprobs)


def complete(server: Server, doc: str):  # noqa: ANN201 (an openai Completion)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
    return client.completions.create(model="default", prompt=doc, max_tokens=6, temperature=0,
                                     logprobs=1)


def keep_asking(server: Server) -> None:
    """Requests until the server is killed under them (their errors are the point)."""
    with contextlib.suppress(openai.APIError):
        for doc in reversed(DOCS):
            ask(server, doc)


def kill_hard(server: Server) -> None:
    """SIGKILL to every process of the server at once: nothing gets to clean up."""
    procs = [psutil.Process(server.proc.pid), *server.children]
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=30)
    psutil.wait_procs(procs, timeout=30)


def assert_same(before: tuple[str, list[float]], after: tuple[str, list[float]]) -> None:
    assert after[0] == before[0]
    assert max(abs(a - b) for a, b in zip(before[1], after[1], strict=True)) < 1e-4


@pytest.mark.parametrize("seed", [1, 2])
def test_killed_mid_write_and_restarted_it_serves_the_disk_tier(tmp_path, seed: int) -> None:
    directory = str(tmp_path / "kv")
    server = Server(*flags(directory))
    try:
        answers = [ask(server, doc) for doc in DOCS]
        tiers = server.info()["kv_tiers"]
        assert tiers["moved_tokens"].get("host->disk", 0) > 0
        busy = threading.Thread(target=keep_asking, args=(server,),
                                daemon=True)  # demoting pages to disk when the kill lands
        busy.start()
        time.sleep(random.Random(seed).uniform(0.2, 2.0))
    finally:
        kill_hard(server)
    busy.join(timeout=60)
    server = Server(*flags(directory))
    try:
        info = server.info()
        assert info["kv_tiers"]["restored_tokens"] > 0
        for doc, before in zip(DOCS, answers, strict=True):
            assert_same(before, ask(server, doc))
        info = server.wait_idle()
        assert info["kv_tiers"]["disk"]["hit_tokens"] > 0
        assert info["cached_tokens"] > 0
        metrics = httpx.get(f"{server.url}/metrics", headers=server.headers(), timeout=30).text
        assert 'radixrt_kv_tier_hit_tokens{tier="disk"}' in metrics
    finally:
        server.stop()


def test_a_graceful_stop_moves_the_cache_to_disk(tmp_path) -> None:
    directory = str(tmp_path / "kv")
    server = Server(*flags(directory))
    try:
        outs = [complete(server, doc) for doc in DOCS[:3]]
        tiers = server.wait_idle()["kv_tiers"]
        held = sum(tiers[name]["cached_tokens"] for name in ("device", "host", "disk"))
    finally:
        server.stop()
    assert server.proc.returncode == 0
    server = Server(*flags(directory))
    try:
        assert server.info()["kv_tiers"]["restored_tokens"] == held  # all of it
        before = server.info()["cached_tokens"]
        for doc, out in zip(DOCS[:3], outs, strict=True):
            answer = (out.choices[0].text, list(out.choices[0].logprobs.token_logprobs))
            assert_same(answer, ask(server, doc))
        info = server.wait_idle()
        # every prompt token but the last (whose logits are needed) is a hit, from disk
        assert info["cached_tokens"] - before == sum(o.usage.prompt_tokens - 1 for o in outs)
    finally:
        server.stop()
