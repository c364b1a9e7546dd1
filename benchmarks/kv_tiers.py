"""KV tiers under the radix tree: many multi-turn conversations whose working set is several
times the device pool, served with the tiers off, with a host tier, and with host + disk tiers;
then the restart case, a warm restart (the disk tier of the run before) against a cold one.

    python benchmarks/kv_tiers.py            # 24 conversations x 3 turns, pool 2048 tokens
    python benchmarks/kv_tiers.py --quick    # fewer, shorter (the test's)

Each conversation has its own document (random text, --doc-tokens) after a shared system
prompt; a turn asks a question and the next turn repeats the whole conversation so far (with the
answer) plus a new question, as a chat client does. Turns go round-robin over the
conversations (every conversation's turn 1, then every turn 2, ...), one request at a time, so
between two turns of a conversation every other conversation passes through the pool: with the
working set (conversations x their length) several times the pool, an LRU pool alone has lost a
conversation's prefix by its next turn. Each system is a `radixrt serve` process on a free port;
requests stream over /v1/completions (greedy, --output-tokens each, EOS ignored).

Reported per configuration: the cache hit rate (prompt tokens served from the cache, any tier,
/server_info), TTFT p50 / p99, requests per second, and for the tiers the tokens served from each
tier and moved each way; ratios against tiers off. Restart: after the host + disk run its server
is stopped (SIGTERM: the cache goes to the disk tier) and started again on the same directory
(warm), and a server on an empty directory (cold) gets the same requests: every conversation's
next turn, TTFT p50 / p99 of each. Plots: docs/plots/kv_tiers.png.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from plots import add_plot_dir, bar_panels, plot_path  # noqa: E402
from serving_requests import (  # noqa: E402
    Prompt,
    RequestResult,
    fill_usage,
    openai_client,
    random_text,
    stats_ms,
    token_count,
)
from serving_systems import System, http_json, radixrt_system, running  # noqa: E402

SYSTEM = ("You are a research assistant. Read the document below and answer each question in "
          "one short sentence, quoting the document where you can.\n")
QUESTIONS = ["What is the document about?", "Which words appear most often?",
             "Summarize the last paragraph.", "What would you ask the author?",
             "Name three terms from the document.", "Is anything repeated?"]
CONFIGS = ("tiers off", "host", "host+disk")


@dataclass
class Run:
    """One configuration's requests and the server's counters after them."""

    name: str
    results: list[RequestResult] = field(default_factory=list)
    seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conversations", type=int, default=24)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--doc-tokens", type=int, default=360, help="each conversation's document")
    p.add_argument("--output-tokens", type=int, default=8)
    p.add_argument("--max-total-tokens", type=int, default=2048, help="the device pool")
    p.add_argument("--host-cache-tokens", type=int, default=16384)
    p.add_argument("--disk-host-cache-tokens", type=int, default=2048,
                   help="the host tier of the host+disk configuration (smaller: the disk "
                   "tier holds the rest)")
    p.add_argument("--disk-cache-tokens", type=int, default=32768)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS),
                   help="run only these (the first is the ratios' base)")
    p.add_argument("--skip-restart", action="store_true")
    p.add_argument("--quick", action="store_true",
                   help="8 conversations x 2 turns, 200-token documents, pool 512")
    add_plot_dir(p)
    args = p.parse_args(argv)
    if args.quick:
        args.conversations, args.turns, args.doc_tokens = 8, 2, 200
        args.max_total_tokens, args.host_cache_tokens = 512, 4096
        args.disk_host_cache_tokens, args.disk_cache_tokens = 512, 8192
    return args


def documents(args: argparse.Namespace, tok: Any) -> list[str]:
    rng = random.Random(args.seed)
    return [random_text(tok, rng, args.doc_tokens) for _ in range(args.conversations)]


def flags_of(name: str, args: argparse.Namespace, directory: str) -> list[str]:
    if name == "host":
        return ["--host-cache-tokens", str(args.host_cache_tokens)]
    if name == "host+disk":
        return ["--host-cache-tokens", str(args.disk_host_cache_tokens), "--disk-cache-dir",
                directory, "--disk-cache-tokens", str(args.disk_cache_tokens)]
    return []


async def turns(base: str, system: System, docs: list[str], tok: Any, args: argparse.Namespace,
                history: list[str], first_turn: int, num_turns: int) -> list[RequestResult]:
    """`num_turns` rounds from `first_turn` over every conversation, round-robin, one request at
    a time; `history` (each conversation's text so far) grows with each answer."""
    client = openai_client(base)
    results = []
    for turn in range(first_turn, first_turn + num_turns):
        for i, doc in enumerate(docs):
            if turn == 0:
                history[i] = f"{SYSTEM}Document:\n{doc}\n"
            text = f"{history[i]}Q: {QUESTIONS[turn % len(QUESTIONS)]}\nA:"
            prompt = Prompt(text, token_count(tok, text), args.output_tokens)
            result, answer = await asked(client, system, prompt)
            results.append(result)
            history[i] = f"{text}{answer}\n"
    await client.close()
    return results


async def asked(client: Any, system: System, prompt: Prompt) -> tuple[RequestResult, str]:
    """One streamed request: its timings and token counts, and its answer's text (greedy: the
    same on every configuration)."""
    result = RequestResult(prompt_len=prompt.prompt_len)
    text, usage = [], None
    start = time.perf_counter()
    stream = await client.completions.create(
        model="default", prompt=prompt.text, max_tokens=prompt.output_len, temperature=0.0,
        stream=True, extra_body=system.extra_body, stream_options={"include_usage": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            if not text:
                result.ttft = time.perf_counter() - start
            text.append(chunk.choices[0].text)
        usage = chunk.usage or usage
    result.e2e = time.perf_counter() - start
    result.ok = bool(text)
    fill_usage(result, usage, len(text))
    if not result.ok:
        raise RuntimeError("a request returned no text")
    return result, "".join(text)


def serve_run(name: str, args: argparse.Namespace, docs: list[str], tok: Any,
              directory: str, history: list[str], first_turn: int, num_turns: int) -> Run:
    system = radixrt_system(name, args, flags_of(name, args, directory))
    run = Run(name)
    with running(system) as base:
        start = time.perf_counter()
        run.results = asyncio.run(turns(base, system, docs, tok, args, history, first_turn,
                                        num_turns))
        run.seconds = time.perf_counter() - start
        run.info = http_json(base + "/server_info")
    return run


def hit_rate(run: Run) -> float:
    prompt = sum(r.prompt_len for r in run.results)
    cached = sum(r.cached_tokens or 0 for r in run.results)
    return cached / prompt if prompt else 0.0


def row(run: Run, base: Run | None) -> str:
    _, p50, p99 = stats_ms([r.ttft for r in run.results])
    rps = len(run.results) / run.seconds if run.seconds else 0.0
    cells = [run.name, f"{hit_rate(run):.1%}", f"{p50:.0f}", f"{p99:.0f}", f"{rps:.2f}"]
    if base is not None:
        _, b50, _ = stats_ms([r.ttft for r in base.results])
        b_rate = hit_rate(base)
        cells += [f"{hit_rate(run) / b_rate:.2f}x" if b_rate else "-",
                  f"{p50 / b50:.2f}x" if b50 else "-"]
    tiers = run.info.get("kv_tiers") or {}
    served = ", ".join(f"{name} {tiers[name]['hit_tokens']}" for name in ("device", "host", "disk")
                       if name in tiers)
    moved = ", ".join(f"{k} {v}" for k, v in tiers.get("moved_tokens", {}).items())
    return "| " + " | ".join([*cells, served or "-", moved or "-"]) + " |"


def ttft_ms(run: Run, q: int) -> float:
    """TTFT (q: 0 mean, 1 p50, 2 p99) over the run's requests, in ms."""
    return stats_ms([x.ttft for x in run.results])[q]


def report(runs: list[Run], restart: list[Run], args: argparse.Namespace) -> None:
    pool = args.max_total_tokens
    working = sum(r.prompt_len for r in runs[0].results[-args.conversations:])
    print(f"\n{args.conversations} conversations x {args.turns} turns, device pool {pool} tokens, "
          f"working set {working} tokens ({working / pool:.1f}x the pool)\n")
    header = ("hit rate | TTFT p50 ms | TTFT p99 ms | req/s | hit rate vs {0} | TTFT p50 vs {0} "
              "| tokens served by tier | tokens moved |")
    print("| configuration | " + header.format("off"))
    print("|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        print(row(run, runs[0]))
    for run in runs:
        slow = sorted(range(len(run.results)), key=lambda i: -run.results[i].ttft)[:3]
        print(f"{run.name}: slowest TTFTs " + ", ".join(
            f"{run.results[i].ttft * 1000:.0f} ms (turn {i // args.conversations + 1}, "
            f"conversation {i % args.conversations}, {run.results[i].cached_tokens} of "
            f"{run.results[i].prompt_len} cached)" for i in slow))
    bar_panels(plot_path("kv_tiers", args.plot_dir),
               f"KV tiers: {args.conversations} conversations x {args.turns} turns, working set "
               f"{working / pool:.1f}x the {pool}-token pool (SmolLM2-135M, CPU)",
               [r.name for r in runs],
               [("cache hit rate", {"radixrt": [hit_rate(r) for r in runs]}),
                ("TTFT p50 ms", {"radixrt": [ttft_ms(r, 1) for r in runs]}),
                ("TTFT p99 ms", {"radixrt": [ttft_ms(r, 2) for r in runs]}),
                ("requests / s", {"radixrt": [len(r.results) / r.seconds for r in runs]})],
               caption="tiers off / a host tier / host + disk tiers; hit rate from "
               "usage.cached_tokens; TTFT over every turn of every conversation (turn 1 is a "
               "miss everywhere)")
    if not restart:
        return
    print("\nrestart (the next turn of every conversation, right after the server starts):\n")
    print("| server | " + header.format("cold"))
    print("|---|---|---|---|---|---|---|---|---|")
    for run in restart:
        print(row(run, restart[0]))
    bar_panels(plot_path("kv_tiers_restart", args.plot_dir),
               "KV tiers: every conversation's next turn, right after a restart",
               [r.name for r in restart],
               [("TTFT p50 ms", {"radixrt": [ttft_ms(r, 1) for r in restart]}),
                ("TTFT p99 ms", {"radixrt": [ttft_ms(r, 2) for r in restart]}),
                ("cache hit rate", {"radixrt": [hit_rate(r) for r in restart]})],
               caption="cold: an empty disk tier; warm: the disk tier the host+disk run left "
               "when it was stopped (SIGTERM moves the cache to disk)")

def main(argv: list[str] | None = None) -> int:
    from radixrt.runtime.models.loader import load_tokenizer

    args = parse_args(argv)
    tok = load_tokenizer("default")
    docs = documents(args, tok)
    runs = []
    with tempfile.TemporaryDirectory(prefix="radixrt-kv-tiers-") as tmp:
        warm_dir = os.path.join(tmp, "warm")
        histories: dict[str, list[str]] = {}
        for name in args.configs:
            histories[name] = [""] * len(docs)
            runs.append(serve_run(name, args, docs, tok, warm_dir, histories[name], 0,
                                  args.turns))
        restart = []
        cases = (("cold", os.path.join(tmp, "cold")), ("warm", warm_dir))
        for name, directory in cases if "host+disk" in histories and not args.skip_restart else ():
            history = list(histories["host+disk"])
            run = serve_run("host+disk", args, docs, tok, directory, history, args.turns, 1)
            run.name = name
            restart.append(run)
    report(runs, restart, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
