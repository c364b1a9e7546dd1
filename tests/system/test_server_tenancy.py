"""Priorities and fair share in `radixrt serve` as an operator runs it: real processes, named
API keys (--api-key-file), two running slots, one tenant flooding the queue. An urgent request's
time to first token is a fraction of what the same request waits at the flood's priority, and
another tenant's first request goes ahead of the flood's queue."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from test_server import Server, free_port

# starts real processes; compares TTFTs, so it runs alone (make test's serial part)
pytestmark = [pytest.mark.slow, pytest.mark.serial]

KEYS = {"alice": "key-alice-123", "bob": "key-bob-456", "carol": "key-carol-789"}
FLOOD = 8  # alice's requests: 2 run, 6 wait
FLOOD_TOKENS = 48
# the two that take the running slots hold them while the other six arrive: at 48 tokens they
# finished in ~0.3 s here, and on a loaded 2-core CI machine before the six were all queued.
# Longer holds widen that window; under 4.5x FLOOD_TOKENS keeps the other tenant's wait for a
# slot below 0.6x the wait behind the queue
HOLD_TOKENS = 128
TENANT_CAP = FLOOD - 1  # alice may queue one more than the flood's 6 waiting


class TenantServer(Server):
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {KEYS['alice']}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    keys: Path = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("".join(f"{name}:{key}\n" for name, key in KEYS.items()))
    dsl_port = free_port()
    srv = TenantServer("--max-total-tokens", "4096", "--api-key-file", str(keys), "--log-level",
                       "warning", "--check-integrity", "--max-running-requests", "2",
                       "--max-queued-per-tenant", str(TENANT_CAP), "--dsl-port", str(dsl_port))
    srv.dsl_port = dsl_port
    yield srv
    srv.stop()


def client(server: Server, tenant: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEYS[tenant], max_retries=0)


async def ttft(server: Server, tenant: str, priority: int, prompt: str) -> float:
    """Seconds to the first streamed token of a short request."""
    start = time.monotonic()
    stream = await client(server, tenant).completions.create(
        model="default", prompt=prompt, max_tokens=4, temperature=0, stream=True,
        extra_body={"priority": priority})
    first = None
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].text:
            first = time.monotonic() - start
    assert first is not None
    return first


async def flood_then_probe(server: Server, tenant: str, priority: int,
                           fill_to_cap: bool = False) -> tuple[float, list]:
    """alice queues FLOOD requests at priority 5; once they are all in, `tenant` sends one at
    `priority`. Returns its TTFT and the flood's finish reasons (every one must finish). With
    fill_to_cap, alice first queues one more and is refused the one after (429)."""
    alice = client(server, "alice")

    async def background(i: int) -> str | None:
        out = await alice.completions.create(
            model="default", prompt=f"Story {i}: once upon a time",
            max_tokens=HOLD_TOKENS if i < 2 else FLOOD_TOKENS,
            temperature=0, extra_body={"priority": 5, "ignore_eos": True})
        return out.choices[0].finish_reason

    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {KEYS['alice']}"}) as http:

        async def until(running: int, waiting: int) -> None:
            deadline = time.monotonic() + 60
            while True:
                info = (await http.get(f"{server.url}/server_info")).json()
                if info["running"] == running and info["waiting"] == waiting:
                    return
                assert time.monotonic() < deadline, info
                await asyncio.sleep(0.02)

        # two take the running slots, then six wait: alice's cap of waiting requests
        flood = [asyncio.ensure_future(background(i)) for i in range(2)]
        await until(2, 0)
        flood += [asyncio.ensure_future(background(i)) for i in range(2, FLOOD)]
        await until(2, FLOOD - 2)
        if fill_to_cap:
            flood.append(asyncio.ensure_future(background(FLOOD)))
            await until(2, TENANT_CAP)
            with pytest.raises(openai.RateLimitError) as refused:
                await alice.completions.create(model="default", prompt="x", max_tokens=1,
                                               extra_body={"priority": 5})
            assert refused.value.response.headers["Retry-After"] == "1"
        probe = await ttft(server, tenant, priority, "The capital of France is")
    return probe, await asyncio.gather(*flood)


def test_urgent_requests_and_other_tenants_are_not_stuck_behind_a_flood(server: Server) -> None:
    async def scenario(tenant: str, priority: int, fill_to_cap: bool = False) -> float:
        probe, reasons = await flood_then_probe(server, tenant, priority, fill_to_cap)
        assert reasons == ["length"] * (FLOOD + fill_to_cap)  # nothing lost, preempted or not
        server.wait_idle()
        return probe

    async def main() -> tuple[float, float, float]:
        behind = await scenario("bob", 5, fill_to_cap=True)  # fair share: bob goes ahead
        same = await scenario("alice", 5)  # alice's own: behind her 6 waiting requests
        urgent = await scenario("alice", 0)  # urgent: preempts a priority-5 request
        return behind, same, urgent

    fair, same, urgent = asyncio.run(main())
    print(f"TTFT: other tenant {fair:.3f}s, same priority {same:.3f}s, urgent {urgent:.3f}s")
    assert urgent < 0.4 * same, (urgent, same)
    assert fair < 0.6 * same, (fair, same)
    info = server.info()
    assert info["priority_preemptions"] >= 1
    assert info["preemptions_caused_by_tenant"].get("alice", 0) >= 1
    assert info["queue_full"] >= 1
    text = httpx.get(f"{server.url}/metrics", headers=server.headers()).text
    assert 'radixrt_class_requests_total{priority="5",tenant="alice"}' in text
    assert 'radixrt_preemptions_caused{by="priority",value="0"}' in text


def test_the_dsl_endpoint_takes_named_keys_as_tenants(server: Server) -> None:
    import radixrt as rx

    address = f"tcp://127.0.0.1:{server.dsl_port}"
    with pytest.raises(rx.BackendError, match="needs its API key"):
        rx.RuntimeEndpoint(address, api_key="wrong", connect_timeout=30)
    runtime = rx.RuntimeEndpoint(address, api_key=KEYS["carol"])

    @rx.function
    def hello(s):
        s += "Hello, my name is" + rx.gen("name", max_tokens=3, temperature=0)
        s += " and I like" + rx.gen("like", max_tokens=3, temperature=0, priority=-1)

    try:
        assert hello.run(backend=runtime, priority=2)["name"]
    finally:
        runtime.close()
    text = httpx.get(f"{server.url}/metrics", headers=server.headers()).text
    # the run's priority, and the gen that names its own, under the key's tenant
    assert 'radixrt_class_requests_total{priority="2",tenant="carol"} 1.0' in text
    assert 'radixrt_class_requests_total{priority="-1",tenant="carol"} 1.0' in text
