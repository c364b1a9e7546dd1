"""The plan link between tensor-parallel ranks: idle followers stay inside the collective timeout
because rank 0 broadcasts heartbeats, plans arrive as the exact msgspec bytes rank 0 sent, and
STOP ends a follower cleanly. Without heartbeats the same idle spell times the follower out,
which is what the heartbeat is for (the control case).

Real gloo groups over loopback, with the ranks as threads of this process, on a tiny
random-weight model built from a config.json the test writes."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from radixrt.runtime.distributed.group import TPGroup, bind_listener
from radixrt.runtime.messages import Run, StepPlan, WorkerRequest
from radixrt.runtime.models.loader import load_model
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.worker.tp_ranks import TPLeader, follow
from radixrt.runtime.worker.worker import Worker

TINY = {"architectures": ["LlamaForCausalLM"], "vocab_size": 96, "hidden_size": 64,
        "intermediate_size": 112, "num_hidden_layers": 2, "num_attention_heads": 6,
        "num_key_value_heads": 3, "max_position_embeddings": 256, "rms_norm_eps": 1e-5}
COLLECTIVE_TIMEOUT_S = 1.5
IDLE_S = 3 * COLLECTIVE_TIMEOUT_S


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny")
    (path / "config.json").write_text(json.dumps(TINY))
    return path


def two_ranks(folder: Path, timeout_s: float,
              body: Callable[[int, TPGroup, Worker, dict[str, Any]], None]) -> dict[str, Any]:
    """body(rank, group, worker, out) on two rank threads of one real gloo group (collective
    timeout timeout_s), each with a tiny model's worker; what a rank raises is out["error<r>"]."""
    listen = bind_listener("127.0.0.1", 0)
    addr = f"127.0.0.1:{listen.getsockname()[1]}"
    out: dict[str, Any] = {}

    def rank(r: int) -> None:
        try:
            group = TPGroup.join(r, 2, addr, "gloo", timeout_s, listen if r == 0 else None)
            worker = Worker(load_model(str(folder), load_format="dummy", tp=group), 16)
            body(r, group, worker, out)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out[f"error{r}"] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return out


def run_pair(folder: Path, heartbeat_s: float) -> dict[str, Any]:
    """Rank 0 idles IDLE_S, then runs one real plan (a 3-token prefill that samples), then
    closes; rank 1 follows. Returns what each rank produced or raised."""
    params = SamplingParams(max_tokens=4, temperature=0)
    new = WorkerRequest(rid=7, prompt_ids=[1, 2, 3], output_ids=[], params=params, max_tokens=4)
    plan = StepPlan(step_id=1, new_requests=[new],
                    runs=[Run(rid=7, start=0, num_new=3, new_slots=[0, 1, 2], sample=True)])

    def body(r: int, group: TPGroup, worker: Worker, out: dict[str, Any]) -> None:
        if r == 0:
            leader = TPLeader(worker, group, heartbeat_s=heartbeat_s)
            time.sleep(IDLE_S)
            out["result"] = leader.execute(plan)
            leader.close()
        else:
            follow(worker, group)
            out["follower_tokens"] = worker.states[7].token_ids

    return two_ranks(folder, COLLECTIVE_TIMEOUT_S, body)


def test_heartbeats_keep_an_idle_follower_alive_and_plans_arrive(folder):
    out = run_pair(folder, heartbeat_s=COLLECTIVE_TIMEOUT_S / 4)
    assert "error0" not in out and "error1" not in out, out
    token = out["result"].results[0].token.token_id
    # the follower ran the same plan on its shard and sampled the same token
    assert out["follower_tokens"] == [1, 2, 3, token]


def test_without_heartbeats_the_idle_follower_times_out(folder):
    out = run_pair(folder, heartbeat_s=60.0)
    assert "error1" in out, "the follower should have hit the collective timeout"


def test_a_failed_step_leaves_the_group_closed_not_hung(folder):
    """A step that raises on rank 0 after its broadcast (here a plan for a request no rank
    knows, so the follower fails on it too) marks the group failed: the next plan is refused
    with a message, and close() returns at once instead of sending STOP into a group whose
    ranks may stand at different collectives (which would wait out the collective timeout)."""
    bad = StepPlan(step_id=1, runs=[Run(rid=99, start=0, num_new=1, new_slots=[0], sample=True)])

    def body(r: int, group: TPGroup, worker: Worker, out: dict[str, Any]) -> None:
        if r == 1:
            follow(worker, group)
            return
        leader = TPLeader(worker, group, heartbeat_s=0.2)
        with pytest.raises(KeyError):
            leader.execute(bad)
        with pytest.raises(RuntimeError, match="rank failed"):
            leader.execute(StepPlan(step_id=2))
        start = time.monotonic()
        leader.close()
        out["close_s"] = time.monotonic() - start

    out = two_ranks(folder, 30.0, body)
    assert "error0" not in out, out
    assert isinstance(out.get("error1"), KeyError)  # the follower failed on the same plan
    assert out["close_s"] < 2.0
