"""The sharing scenario of `serving.py --scenario sharing`: one server, two tenants, two
priorities, with priorities and fair share on and then off, in one run.

Tenant "batch" floods the server at t=0 with --flood requests at the default priority. While the
flood drains, two classes arrive one request at a time, alternating, every --gap seconds:

- urgent: tenant "batch" at priority -1 (only priority can help it: it is the flood's tenant);
- flooded tenant: tenant "interactive" at the default priority (only fair share can help it).

"on": the server's defaults (priority preemption, fair share) and requests that carry their
priority and tenant (`user`). "off": the same server with `--no-priority-preemption
--no-fair-share` and requests without a priority, so the queue is plain lpm/fcfs. Both runs
send the same prompts at the same times. The table gives TTFT p50 / p99 of each class and the
flood's throughput (what the urgent requests' preemptions cost it), the ratio off / on, and the
plot docs/plots/sharing.png.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from plots import bar_panels, plot_path
from serving_requests import (
    Prompt,
    RequestResult,
    one_request,
    openai_client,
    random_text,
    stats_ms,
    token_count,
)
from serving_systems import System, radixrt_system, running

CLASSES = ("urgent", "flooded tenant", "flood")
MODES = {"on": [], "off": ["--no-priority-preemption", "--no-fair-share"]}


@dataclasses.dataclass(frozen=True)
class Arrival:
    at: float  # seconds after the flood
    klass: str
    prompt: Prompt


def sharing_load(args: argparse.Namespace) -> list[Arrival]:
    from radixrt.runtime.models.loader import load_tokenizer

    tok = load_tokenizer("default")
    rng = random.Random(args.seed + 3)

    def prompt(output: int) -> Prompt:
        text = random_text(tok, rng, rng.randint(*args.random_input))
        return Prompt(text, token_count(tok, text), output)

    load = [Arrival(0.0, "flood", prompt(args.flood_output)) for _ in range(args.flood)]
    for i in range(2 * args.probes):
        klass = "urgent" if i % 2 == 0 else "flooded tenant"
        load.append(Arrival(args.gap * (i + 1) / 2, klass, prompt(args.probe_output)))
    return load


def body_of(klass: str, mode: str) -> dict[str, Any]:
    body: dict[str, Any] = {"ignore_eos": True,
                            "user": "interactive" if klass == "flooded tenant" else "batch"}
    if mode == "on" and klass == "urgent":
        body["priority"] = -1
    return body


async def replay(client: Any, load: list[Arrival], system_of: Callable[[Arrival], System],
                 classes: Sequence[str]) -> tuple[dict[str, list[RequestResult]], float]:
    """Send every arrival at its time (seconds from now) as system_of(arrival) would, all
    concurrently; the results by class, and the seconds until the last one ended."""
    start = time.perf_counter()

    async def one(arrival: Arrival) -> tuple[str, RequestResult]:
        await asyncio.sleep(max(0.0, start + arrival.at - time.perf_counter()))
        return arrival.klass, await one_request(client, system_of(arrival), arrival.prompt)

    done = await asyncio.gather(*(one(a) for a in load))
    duration = time.perf_counter() - start
    by_class: dict[str, list[RequestResult]] = {k: [] for k in classes}
    for klass, result in done:
        by_class[klass].append(result)
    return by_class, duration


async def run_load(base: str, system: System, load: list[Arrival], mode: str
                   ) -> tuple[dict[str, list[RequestResult]], float]:
    async with openai_client(base) as client:
        await one_request(client, system, Prompt("Hello, how are you?", 6, 4))  # warm-up
        return await replay(
            client, load,
            lambda a: dataclasses.replace(system, extra_body=body_of(a.klass, mode)), CLASSES)


def summarize(by_class: dict[str, list[RequestResult]], duration: float) -> dict[str, Any]:
    out: dict[str, Any] = {"duration": duration,
                           "failed": sum(not r.ok for rs in by_class.values() for r in rs)}
    for klass, results in by_class.items():
        ok = [r for r in results if r.ok]
        _, p50, p99 = stats_ms([r.ttft for r in ok])
        out[klass] = {"ttft_p50": p50, "ttft_p99": p99, "n": len(results),
                      "tokens": sum(r.output_tokens for r in ok),
                      "last_done": max((r.e2e for r in ok), default=0.0)}
    flood = out["flood"]
    flood["tok_s"] = flood["tokens"] / duration if duration else 0.0
    return out


def run_sharing(args: argparse.Namespace) -> int:
    load = sharing_load(args)
    flags = ["--max-running-requests", str(args.sharing_slots)]
    rows: dict[str, dict[str, Any]] = {}
    for mode, extra in MODES.items():
        system = radixrt_system("radixrt-lpm", args)
        system = dataclasses.replace(system, name=f"radixrt ({mode})",
                                     command=[*system.command, *flags, *extra])
        with running(system) as base:
            by_class, duration = asyncio.run(run_load(base, system, load, mode))
        rows[mode] = summarize(by_class, duration)
        print(f"{mode}: {rows[mode]}", flush=True)
    print_sharing(rows, args)
    plot_sharing(rows, args)
    return 0 if all(r["failed"] == 0 for r in rows.values()) else 1


def print_sharing(rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    on, off = rows["on"], rows["off"]
    print("\n| class | requests | TTFT p50 on / off (ms) | TTFT p99 on / off (ms) "
          "| p50 off / on |")
    print("|---|---:|---:|---:|---:|")
    for klass in CLASSES:
        a, b = on[klass], off[klass]
        ratio = b["ttft_p50"] / a["ttft_p50"] if a["ttft_p50"] else float("nan")
        print(f"| {klass} | {a['n']} | {a['ttft_p50']:.0f} / {b['ttft_p50']:.0f} "
              f"| {a['ttft_p99']:.0f} / {b['ttft_p99']:.0f} | {ratio:.2f}x |")
    print(f"\nflood throughput on / off: {on['flood']['tok_s']:.1f} / "
          f"{off['flood']['tok_s']:.1f} output tok/s; run {on['duration']:.1f} / "
          f"{off['duration']:.1f} s")
    print(f"{args.flood} flood requests ({args.flood_output} tokens) at t=0 from tenant batch; "
          f"{args.probes} urgent (priority -1, tenant batch) and {args.probes} from tenant "
          f"interactive ({args.probe_output} tokens), alternating every {args.gap / 2:.2f} s; "
          f"--max-running-requests {args.sharing_slots}; greedy; CPU count {os.cpu_count()}")
    print(f"command: {shlex.join([os.path.basename(sys.executable), *sys.argv])}")


def plot_sharing(rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    def series(key: str) -> dict[str, list[float]]:
        return {f"features {mode}": [rows[mode][k][key] for k in CLASSES] for mode in MODES}

    urgent = rows["off"]["urgent"]["ttft_p50"] / max(rows["on"]["urgent"]["ttft_p50"], 1e-9)
    tenant = (rows["off"]["flooded tenant"]["ttft_p50"]
              / max(rows["on"]["flooded tenant"]["ttft_p50"], 1e-9))
    caption = (f"{args.flood} requests flood at t=0; urgent (priority -1) and another tenant's "
               f"requests arrive meanwhile; {args.sharing_slots} running slots. TTFT p50 off/on: "
               f"urgent {urgent:.1f}x, flooded tenant {tenant:.1f}x")
    bar_panels(plot_path("sharing", args.plot_dir),
               "One server, two tenants: priorities and fair share on vs off", list(CLASSES),
               [("TTFT p50, ms (lower is better)", series("ttft_p50")),
                ("TTFT p99, ms (lower is better)", series("ttft_p99"))], caption)


def add_sharing_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", choices=["datasets", "sharing"], default="datasets",
                   help="sharing: the mixed-priority, two-tenant load (serving_sharing.py)")
    p.add_argument("--flood", type=int, default=48, help="sharing: the flood's requests")
    p.add_argument("--flood-output", type=int, default=32, help="sharing: their output tokens")
    p.add_argument("--probes", type=int, default=6, help="sharing: requests of each class")
    p.add_argument("--probe-output", type=int, default=8, help="sharing: their output tokens")
    p.add_argument("--gap", type=float, default=2.0, help="sharing: seconds between probes")
    p.add_argument("--sharing-slots", type=int, default=8,
                   help="sharing: --max-running-requests of the server")
