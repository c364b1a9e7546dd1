"""Fair-share preemption on vs off, on real `radixrt serve` processes, in one run.

Two loads, each served twice (`--fair-share-preemption`, the default, and
`--no-fair-share-preemption`), with the same prompts sent at the same times:

- two tenants: tenant "flood" sends --flood requests of about --flood-output tokens at t=0; tenant
  "calm" sends --calm requests of --calm-output tokens, one every --gap seconds from --calm-at.
  Without preemption a calm request waits until one of the flood's running requests finishes
  (a whole long generation); with it, calm takes a slot from the tenant over its share.
- one tenant: the flood alone. Fair share has nothing to do: the figures should not change.

Printed: TTFT p50 / p99 of each class, total output tokens/s, the ratios off / on, and from the
server's counters the steps (plans) and tokens computed for each load, and its preemptions by
cause. Wall-clock tokens/s on a shared 2-core VM varies by up to a third between identical runs;
tokens computed do not (with one tenant they must be equal), and steps vary only with the order
in which concurrent HTTP requests arrive. Plotted: docs/plots/fair_share.png and
fair_share_throughput.png.

    python benchmarks/fair_share.py            # about 4 minutes on 2 CPU cores
    python benchmarks/fair_share.py --quick    # the shape in under a minute (tests)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import shlex
import sys
from typing import Any

import httpx
from plots import add_plot_dir, bar_panels, plot_path
from serving_requests import Prompt, openai_client, random_text, stats_ms, token_count
from serving_sharing import Arrival, replay
from serving_systems import radixrt_system, running

MODES = {"on": [], "off": ["--no-fair-share-preemption"]}
LOADS = ("two tenants", "one tenant")
CLASSES = ("calm", "flood")


def make_loads(args: argparse.Namespace) -> dict[str, list[Arrival]]:
    from radixrt.runtime.models.loader import load_tokenizer

    tok = load_tokenizer("default")
    rng = random.Random(args.seed)

    def prompt(output: int) -> Prompt:
        text = random_text(tok, rng, rng.randint(24, 48))
        return Prompt(text, token_count(tok, text), output)

    # lengths from half to one and a half times --flood-output, as real loads vary (equal ones
    # finish in synchronized waves, and the last wave's idle slots would dominate tokens/s)
    flood = [Arrival(0.0, "flood", prompt(rng.randint(args.flood_output // 2,
                                                      args.flood_output * 3 // 2)))
             for _ in range(args.flood)]
    calm = [Arrival(args.calm_at + i * args.gap, "calm", prompt(args.calm_output))
            for i in range(args.calm)]
    return {"two tenants": flood + calm, "one tenant": flood}


def counters(info: dict[str, Any]) -> dict[str, int]:
    """The server's totals this benchmark reads: preemptions by cause, plans (steps) and
    tokens through the model (its work, free of the wall clock's noise)."""
    return {**info.get("preemptions_by_cause", {}), "steps": info["steps"],
            "computed": info["computed_tokens"]}


async def run_load(base: str, system: Any, load: list[Arrival]) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base) as http:
        (await http.post("/flush_cache")).raise_for_status()  # each load starts cold
        before = counters((await http.get("/server_info")).json())
    async with openai_client(base) as client:
        await replay(client, [Arrival(0.0, "flood", Prompt("Hello, how are you?", 6, 4))],
                     lambda a: system, CLASSES)  # warm-up
        by_class, duration = await replay(
            client, load,
            lambda a: dataclasses.replace(system, extra_body={**system.extra_body,
                                                              "user": a.klass}), CLASSES)
    async with httpx.AsyncClient(base_url=base) as http:
        after = counters((await http.get("/server_info")).json())
    moved = {key: count - before[key] for key, count in after.items()}
    steps, computed = moved.pop("steps"), moved.pop("computed")
    out: dict[str, Any] = {"duration": duration, "causes": moved, "steps": steps,
                           "computed": computed,
                           "failed": sum(not r.ok for rs in by_class.values() for r in rs)}
    tokens = 0
    for klass, results in by_class.items():
        ok = [r for r in results if r.ok]
        _, p50, p99 = stats_ms([r.ttft for r in ok])
        out[klass] = {"ttft_p50": p50, "ttft_p99": p99, "n": len(results)}
        tokens += sum(r.output_tokens for r in ok)
    out["tok_s"] = tokens / duration if duration else 0.0
    return out


def main() -> int:
    args = parse_args()
    loads = make_loads(args)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for mode, extra in MODES.items():
        system = radixrt_system("radixrt-lpm", args, [
            "--max-running-requests", str(args.slots), *extra])
        system = dataclasses.replace(system, name=f"radixrt (preemption {mode})")
        with running(system) as base:
            for name in LOADS:
                rows[(name, mode)] = asyncio.run(run_load(base, system, loads[name]))
                print(f"{name}, preemption {mode}: {rows[(name, mode)]}", flush=True)
    report(rows, args)
    plot(rows, args)
    return 0 if all(r["failed"] == 0 for r in rows.values()) else 1


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def report(rows: dict[tuple[str, str], dict[str, Any]], args: argparse.Namespace) -> None:
    print("\n| load | class | TTFT p50 on / off (ms) | TTFT p99 on / off (ms) | p50 off / on |")
    print("|---|---|---:|---:|---:|")
    for name in LOADS:
        on, off = rows[(name, "on")], rows[(name, "off")]
        for klass in CLASSES:
            a, b = on[klass], off[klass]
            if not a["n"]:
                continue
            print(f"| {name} | {klass} | {a['ttft_p50']:.0f} / {b['ttft_p50']:.0f} "
                  f"| {a['ttft_p99']:.0f} / {b['ttft_p99']:.0f} "
                  f"| {ratio(b['ttft_p50'], a['ttft_p50']):.2f}x |")
    print("\n| load | output tok/s on / off | on / off | steps on / off "
          "| tokens computed on / off | preemptions on (by cause) |")
    print("|---|---:|---:|---:|---:|---|")
    for name in LOADS:
        on, off = rows[(name, "on")], rows[(name, "off")]
        print(f"| {name} | {on['tok_s']:.1f} / {off['tok_s']:.1f} "
              f"| {ratio(on['tok_s'], off['tok_s']):.3f} | {on['steps']} / {off['steps']} "
              f"| {on['computed']} / {off['computed']} | {on['causes']} |")
    calm = rows[("two tenants", "on")]["calm"]["ttft_p50"]
    flood = rows[("two tenants", "on")]["flood"]["ttft_p50"]
    print(f"\ncalm / flood TTFT p50 with preemption: {ratio(calm, flood):.2f}x")
    print(f"{args.flood} flood requests ({args.flood_output // 2}-{args.flood_output * 3 // 2} "
          f"tokens) at t=0; {args.calm} calm "
          f"requests ({args.calm_output} tokens) every {args.gap:g} s from {args.calm_at:g} s; "
          f"--max-running-requests {args.slots}; greedy; CPU count {os.cpu_count()}")
    print(f"command: {shlex.join([os.path.basename(sys.executable), *sys.argv])}")


def plot(rows: dict[tuple[str, str], dict[str, Any]], args: argparse.Namespace) -> None:
    groups = ["calm (2 tenants)", "flood (2 tenants)", "flood (1 tenant)"]
    keys = [("two tenants", "calm"), ("two tenants", "flood"), ("one tenant", "flood")]

    def series(field: str) -> dict[str, list[float]]:
        return {f"preemption {mode}": [rows[(load, mode)][klass][field] for load, klass in keys]
                for mode in MODES}

    tok_s = {f"preemption {mode}": [rows[(load, mode)]["tok_s"] for load in LOADS]
             for mode in MODES}
    calm = ratio(rows[("two tenants", "off")]["calm"]["ttft_p50"],
                 rows[("two tenants", "on")]["calm"]["ttft_p50"])
    caption = (f"{args.flood} long requests of one tenant at t=0, {args.calm} short requests of "
               f"another arriving meanwhile; {args.slots} running slots. Calm TTFT p50 off/on: "
               f"{calm:.1f}x")
    bar_panels(plot_path("fair_share", args.plot_dir),
               "Fair-share preemption on vs off", groups,
               [("TTFT p50, ms (lower is better)", series("ttft_p50")),
                ("TTFT p99, ms (lower is better)", series("ttft_p99"))], caption)
    bar_panels(plot_path("fair_share_throughput", args.plot_dir),
               "Fair-share preemption: throughput", list(LOADS),
               [("output tokens/s (higher is better)", tok_s)], caption)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flood", type=int, default=16, help="the flood tenant's requests")
    p.add_argument("--flood-output", type=int, default=160, help="their output tokens")
    p.add_argument("--calm", type=int, default=6, help="the calm tenant's requests")
    p.add_argument("--calm-output", type=int, default=16, help="their output tokens")
    p.add_argument("--calm-at", type=float, default=1.0, help="seconds to the first calm one")
    p.add_argument("--gap", type=float, default=2.0, help="seconds between calm requests")
    p.add_argument("--slots", type=int, default=4, help="--max-running-requests")
    p.add_argument("--max-total-tokens", type=int, default=16384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a small load, for the tests")
    add_plot_dir(p)
    args = p.parse_args(argv)
    if args.quick:
        args.flood, args.flood_output, args.calm, args.gap, args.calm_at = 6, 128, 2, 0.5, 0.3
    return args


if __name__ == "__main__":
    sys.exit(main())
