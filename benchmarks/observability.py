"""What seeing inside costs: the same load on `radixrt serve` with nothing watching, with the
live dashboard open (its two JSON routes polled as a page does, or faster), and with every
request traced to an OTLP collector (--otlp-traces-endpoint), in one run.

Two servers run side by side (one started with tracing, one without); the rounds alternate
between the configurations so the machine's drift touches each alike:

- off: the load alone (tracing off costs nothing but a None check per stage: the baseline);
- dashboard: the load while --pages open dashboards each poll /dashboard/stats and
  /debug/radix_tree every --poll-s seconds (the page polls every 2 s);
- traced: the load on the tracing server, its spans sent to a collector in this process.

The load: --requests chat requests, --concurrency at a time, behind one shared system prompt,
--max-tokens each (ignore_eos). Printed: per configuration the median over its rounds of output
tokens/s and of TTFT p50, and the ratio to off; the radix tree view's own cost (the scheduler's
`elapsed_s` and the round trip, over the tree the load left); spans and bytes the collector got.
Plotted: docs/plots/observability.png.

    python benchmarks/observability.py            # about 4 minutes on 2 CPU cores
    python benchmarks/observability.py --quick    # the shape in about a minute
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from plots import add_plot_dir, bar_panels, plot_path
from serving_requests import openai_client
from serving_systems import radixrt_system, running

CONFIGS = ("off", "dashboard", "traced")
SYSTEM = ("You are the assistant of a public library. Answer the reader's question in two or "
          "three sentences, suggest one book when it helps, and mention the opening hours only "
          "if they ask. ") * 3
TOPICS = ["volcanoes", "the Roman empire", "bees", "jazz", "black holes", "knitting", "chess",
          "the Silk Road", "origami", "tides", "coral reefs", "the printing press"]


class Collector:
    """An OTLP/HTTP endpoint that takes the traces and counts them (requests, bytes)."""

    def __init__(self) -> None:
        self.posts = 0
        self.bytes = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                owner.posts += 1
                owner.bytes += len(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


async def one(client: Any, question: str, max_tokens: int) -> tuple[float, int]:
    """(TTFT seconds, output tokens) of one streamed chat request."""
    start = time.perf_counter()
    ttft, tokens = 0.0, 0
    stream = await client.chat.completions.create(
        model="default", max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
    async for chunk in stream:
        if not ttft and chunk.choices and chunk.choices[0].delta.content:
            ttft = time.perf_counter() - start
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return ttft, tokens


async def load(base: str, args: argparse.Namespace, rng: random.Random) -> dict[str, float]:
    questions = [f"What should I read about {rng.choice(TOPICS)}? (reader {rng.randrange(10**6)})"
                 for _ in range(args.requests)]
    gate = asyncio.Semaphore(args.concurrency)
    async with openai_client(base) as client:
        async def bounded(q: str) -> tuple[float, int]:
            async with gate:
                return await one(client, q, args.max_tokens)

        start = time.perf_counter()
        results = await asyncio.gather(*(bounded(q) for q in questions))
        wall = time.perf_counter() - start
    return {"tokens_s": sum(t for _, t in results) / wall,
            "ttft_ms": 1000 * statistics.median(t for t, _ in results)}


async def watch(base: str, pages: int, poll_s: float, stop: asyncio.Event) -> int:
    """`pages` dashboards polling their two routes until `stop`; returns the polls made."""
    polls = 0
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        async def page() -> None:
            nonlocal polls
            while not stop.is_set():
                await asyncio.gather(http.get("/dashboard/stats"),
                                     http.get("/debug/radix_tree?depth=6&limit=150"))
                polls += 1
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), poll_s)

        await asyncio.gather(*(page() for _ in range(pages)))
    return polls


async def rounds(plain: str, traced: str, args: argparse.Namespace) -> dict[str, list[dict]]:
    rng = random.Random(args.seed)
    out: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    await load(plain, args, rng)  # warm-up: both servers, the shared prompt cached
    await load(traced, args, rng)
    for r in range(args.rounds):
        order = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
        for config in order:
            if config == "dashboard":
                stop = asyncio.Event()
                watcher = asyncio.create_task(watch(plain, args.pages, args.poll_s, stop))
                result = await load(plain, args, rng)
                stop.set()
                result["polls"] = await watcher
            else:
                result = await load(traced if config == "traced" else plain, args, rng)
            out[config].append(result)
            print(f"round {r + 1} {config:9s} {result['tokens_s']:7.1f} tokens/s  "
                  f"TTFT p50 {result['ttft_ms']:6.0f} ms", flush=True)
    return out


def tree_cost(base: str, calls: int) -> tuple[float, float, int]:
    """The tree view over what the load left: medians of the scheduler's time taking it and of
    the round trip (ms), and its node count."""
    inside, trips, nodes = [], [], 0
    with httpx.Client(base_url=base, timeout=60) as http:
        for i in range(calls):  # each a new question: no caller shares another's snapshot
            start = time.perf_counter()
            view = http.get("/debug/radix_tree", params={"depth": 16, "limit": 1000 - i}).json()
            trips.append(time.perf_counter() - start)
            inside.append(view["elapsed_s"])
            nodes = view["scanned"]
    return 1000 * statistics.median(inside), 1000 * statistics.median(trips), nodes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="16 requests, 1 round")
    p.add_argument("--requests", type=int, default=None, help="per round (default 48)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=None, help="per configuration (default 5)")
    p.add_argument("--pages", type=int, default=4, help="dashboards open at once")
    p.add_argument("--poll-s", type=float, default=0.5,
                   help="seconds between a page's polls (the page itself: 2)")
    p.add_argument("--max-total-tokens", type=int, default=16384)
    p.add_argument("--seed", type=int, default=0)
    add_plot_dir(p)
    args = p.parse_args()
    args.requests = args.requests or (16 if args.quick else 48)
    args.rounds = args.rounds or (1 if args.quick else 5)
    collector = Collector()
    plain_system = radixrt_system("radixrt-lpm", args, flags=[])
    traced_system = radixrt_system("radixrt-lpm", args,
                                   flags=["--otlp-traces-endpoint", collector.url])
    with running(plain_system) as plain, running(traced_system) as traced:
        results = asyncio.run(rounds(plain, traced, args))
        tree_ms, trip_ms, nodes = tree_cost(plain, 20)
        time.sleep(1.0)  # the last batch of spans (sent every 0.5 s)
    med = {c: {k: statistics.median(r[k] for r in results[c]) for k in ("tokens_s", "ttft_ms")}
           for c in CONFIGS}
    print(f"\n{args.requests} requests x {args.rounds} rounds per configuration, "
          f"{args.concurrency} at a time, {args.max_tokens} tokens each; dashboard: "
          f"{args.pages} pages polling every {args.poll_s} s\n")
    print("| configuration | tokens/s | vs off (median of rounds) | TTFT p50 ms | vs off |")
    print("|---|---|---|---|---|")
    for c in CONFIGS:
        m = med[c]
        # each round's figure against the same round's off: the machine's drift cancels
        speed = statistics.median(r["tokens_s"] / o["tokens_s"]
                                  for r, o in zip(results[c], results["off"]))
        ttft = statistics.median(r["ttft_ms"] / o["ttft_ms"]
                                 for r, o in zip(results[c], results["off"]))
        print(f"| {c} | {m['tokens_s']:.1f} | {speed:.2f} | {m['ttft_ms']:.0f} | {ttft:.2f} |")
    polls = sum(r.get("polls", 0) for r in results["dashboard"])
    print(f"\ndashboard polls answered: {polls}; /debug/radix_tree over the load's tree "
          f"({nodes} nodes): {tree_ms:.2f} ms in the scheduler, {trip_ms:.1f} ms round trip "
          f"(medians of 20)")
    print(f"collector: {collector.posts} OTLP posts, {collector.bytes / 1024:.0f} KiB of spans")
    path = bar_panels(
        plot_path("observability", args.plot_dir), "What seeing inside costs (2 CPU cores)",
        list(CONFIGS),
        [("output tokens/s (higher is better)",
          {"radixrt": [med[c]["tokens_s"] for c in CONFIGS]}),
         ("TTFT p50, ms (lower is better)",
          {"radixrt": [med[c]["ttft_ms"] for c in CONFIGS]})],
        caption=f"{args.requests} chat requests per round behind one system prompt, "
                f"{args.concurrency} at a time; medians of {args.rounds} interleaved rounds")
    assert path is None or os.path.exists(path)


if __name__ == "__main__":
    main()
