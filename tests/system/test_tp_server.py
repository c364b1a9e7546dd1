"""`radixrt serve --tp-size 2` as an operator runs it: the tokenizer, the scheduler, the worker
(rank 0) and a follower rank as real processes over gloo. Through the official openai client it
answers what the TP=1 Engine answers; killing rank 0 or the follower takes the server down
non-zero within seconds with nothing left; two "nodes" on loopback (--nnodes 2 --node-rank 0|1)
give the same output, and the second node stops when the first one does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import openai
import psutil
import pytest
from test_server import API_KEY, Server, free_port

from radixrt import SamplingParams

pytestmark = pytest.mark.slow  # starts real processes

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,"]
MAX_TOKENS = 10
TOLERANCE = 1e-4
COMMON = ("--max-total-tokens", "2048", "--api-key", API_KEY, "--log-level", "warning",
          "--check-integrity")


@pytest.fixture(scope="module")
def tp_server() -> Iterator[Server]:
    srv = Server("--tp-size", "2", *COMMON)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def reference(loaded_model) -> list:
    from radixrt import Engine

    engine = Engine(loaded_model, max_total_tokens=2048, check_integrity=True)
    try:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True,
                                logprobs=True, top_logprobs=2)
        return engine.generate(PROMPTS, params)
    finally:
        engine.close()


def assert_answers_like(srv: Server, reference: list) -> None:
    """Greedy completions through the openai client: the reference's tokens (tie-aware) and
    logprobs within TOLERANCE."""
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=API_KEY, max_retries=0)
    for prompt, ref in zip(PROMPTS, reference):
        out = client.completions.create(model="default", prompt=prompt, max_tokens=MAX_TOKENS,
                                        temperature=0, logprobs=1,
                                        extra_body={"ignore_eos": True})
        got = out.choices[0].logprobs.token_logprobs
        for i, (r, lp) in enumerate(zip(ref.samples[0].logprobs, got)):
            assert abs(r.logprob - lp) < TOLERANCE, (prompt, i, r.logprob, lp)
            if abs(r.top[0][1] - r.top[1][1]) < TOLERANCE:
                break  # a near-tie: the rounding may pick either token; stop comparing
        else:
            assert out.choices[0].text == ref.samples[0].text, prompt


def child(srv: Server, title: str) -> psutil.Process:
    return next(p for p in srv.children if title in " ".join(p.cmdline()))


def assert_stops_everything(srv: Server, victim: psutil.Process) -> None:
    victim.kill()
    code = srv.proc.wait(timeout=30)
    assert code != 0
    gone, alive = psutil.wait_procs(srv.children, timeout=10)
    assert not alive, f"left behind: {alive}"


def test_tp2_server_equals_the_tp1_engine(tp_server, reference):
    assert_answers_like(tp_server, reference)
    layout = tp_server.info()["tensor_parallel"]
    assert layout["tp_size"] == 2 and layout["heads_per_rank"] == 6
    assert layout["kv_heads"] == "padded" and layout["padded_heads"] == 3
    tp_server.wait_idle()


def test_killing_the_follower_stops_everything(tp_server):
    """Last for this server: a follower rank that dies takes the server down."""
    assert_stops_everything(tp_server, child(tp_server, "radixrt::tp1"))
    assert "process died" in tp_server.proc.stdout.read()


def test_killing_rank0_stops_everything():
    srv = Server("--tp-size", "2", *COMMON)
    try:
        follower = child(srv, "radixrt::tp1")
        assert_stops_everything(srv, child(srv, "radixrt::worker"))
        assert not follower.is_running()
    finally:
        srv.stop()


def test_two_nodes_on_loopback(reference):
    addr = f"127.0.0.1:{free_port()}"
    multi = ("--tp-size", "2", "--nnodes", "2", "--dist-init-addr", addr)
    # both "nodes" share this machine's cores: one thread each (each would take them all)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    node1 = subprocess.Popen(
        [sys.executable, "-m", "radixrt", "serve", *multi, "--node-rank", "1", *COMMON],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        node0 = Server(*multi, "--node-rank", "0", *COMMON, env={"OMP_NUM_THREADS": "1"})
        node1_children = psutil.Process(node1.pid).children(recursive=True)
        try:
            assert_answers_like(node0, reference)
            assert node0.info()["tensor_parallel"]["nnodes"] == 2
        finally:
            node0.stop()
        assert node0.proc.returncode == 0
        # rank 0 closed the group: the second node stops by itself, cleanly
        assert node1.wait(timeout=30) == 0, node1.stdout.read()
        gone, alive = psutil.wait_procs(node1_children, timeout=10)
        assert not alive, f"left behind on node 1: {alive}"
    finally:
        if node1.poll() is None:
            node1.send_signal(signal.SIGTERM)
            node1.wait(timeout=30)
