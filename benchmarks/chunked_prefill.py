"""Chunked prefill, measured: long prompts arriving while many requests decode, swept over the
server's per-step token budget (`radixrt serve --max-num-batched-tokens B`).

At t=0, --decoders "decoder" requests (short prompts, long outputs, ignore_eos) start and keep
decoding. While they decode, --long "long" requests (--long-input tokens of prompt, a few output
tokens) arrive one at a time, the first at --long-start s and then every --gap s. Every step the
scheduler gives each running decode its one token first and fills the rest of the budget B with
prefill chunks, so B trades the decoders' inter-token latency (a step that carries a B-token chunk
stalls every decoder) against the long prompts' TTFT (a small B spreads a prompt over many steps,
each of which reads all the weights again).

Each budget gets a fresh server (warmed up with one request of about B prompt tokens, its cache
then flushed), and the same prompts at the same times (fixed seed, greedy). The table gives the
long prompts' TTFT (mean, p99), the decoders' ITL (median, p99) and TPOT ((e2e - TTFT) / (output
tokens - 1); mean, p99) and the run's duration; docs/plots/chunked_prefill.png draws the
trade-off curve (decoder ITL p99 and TPOT p99 against long-prompt TTFT, a point per budget) and
the TTFTs against B.

    python benchmarks/chunked_prefill.py                        # 7 budgets, ~4 minutes on 2 cores
    python benchmarks/chunked_prefill.py --quick                # 2 budgets, tiny sizes (a test)
    python benchmarks/chunked_prefill.py --budgets 128 512 2048 --long 6 --gap 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import os
import random
import shlex
import signal
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
from plots import Curve, LinePanel, add_plot_dir, line_panels, plot_path  # noqa: E402
from serving import exit_on_sigterm  # noqa: E402
from serving_requests import (  # noqa: E402
    Prompt,
    RequestResult,
    one_request,
    openai_client,
    random_text,
    stats_ms,
    token_count,
)
from serving_sharing import Arrival, replay  # noqa: E402
from serving_systems import System, http_json, radixrt_system, running  # noqa: E402

KINDS = ("decoder", "long")
DEFAULT_BUDGETS = (64, 128, 256, 512, 1024, 2048, 4096)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--budgets", type=int, nargs="+", default=list(DEFAULT_BUDGETS),
                   help="values of --max-num-batched-tokens (16 at least), a server each")
    p.add_argument("--decoders", type=int, default=8, help="requests decoding from t=0")
    p.add_argument("--decoder-input", type=int, nargs=2, default=(32, 64), metavar=("MIN", "MAX"))
    p.add_argument("--decoder-output", type=int, nargs=2, default=(96, 128),
                   metavar=("MIN", "MAX"))
    p.add_argument("--long", type=int, default=4, help="long prompts, one at a time")
    p.add_argument("--long-input", type=int, nargs=2, default=(1500, 2000), metavar=("MIN", "MAX"))
    p.add_argument("--long-output", type=int, default=8, help="output tokens of a long prompt")
    p.add_argument("--long-start", type=float, default=1.0, help="s: the first long prompt")
    p.add_argument("--gap", type=float, default=1.0, help="s between long prompts")
    p.add_argument("--max-total-tokens", type=int, default=16384, help="radixrt KV pool")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="2 budgets, tiny sizes (a smoke test)")
    add_plot_dir(p)
    args = p.parse_args(argv)
    if args.quick:
        args.budgets, args.decoders = [32, 1024], 3
        args.decoder_input, args.decoder_output = (8, 16), (24, 24)
        args.long, args.long_input, args.long_output = 2, (200, 300), 4
        args.long_start, args.gap = 0.3, 0.3
        args.max_total_tokens = min(args.max_total_tokens, 4096)
    if min(args.budgets) < 16:
        p.error("--budgets: the server takes --max-num-batched-tokens 16 or more")
    return args


# --- load --------------------------------------------------------------------------------------
def build_load(args: argparse.Namespace, tok: Any) -> list[Arrival]:
    rng = random.Random(args.seed)

    def prompt(lengths: tuple[int, int], output: int) -> Prompt:
        text = random_text(tok, rng, rng.randint(*lengths))
        return Prompt(text, token_count(tok, text), output)

    load = [Arrival(0.0, "decoder", prompt(args.decoder_input, rng.randint(*args.decoder_output)))
            for _ in range(args.decoders)]
    load += [Arrival(args.long_start + i * args.gap, "long", prompt(args.long_input,
                                                                    args.long_output))
             for i in range(args.long)]
    return load


def warm_up_prompt(tok: Any, budget: int, seed: int) -> Prompt:
    """About `budget` prompt tokens (at most 1024): the first big forward pass of a fresh server
    pays for its allocations here, not in the first long prompt's TTFT."""
    text = random_text(tok, random.Random(seed + 99), min(budget, 1024))
    return Prompt(text, token_count(tok, text), 2)


async def run_load(base: str, system: System, load: list[Arrival], warm: Prompt
                   ) -> tuple[dict[str, list[RequestResult]], float]:
    async with openai_client(base) as client:
        await one_request(client, system, warm)
        http_json(base + "/flush_cache", method="POST")  # every budget starts cold
        return await replay(client, load, lambda _: system, KINDS)


# --- metrics -----------------------------------------------------------------------------------
def summarize(budget: int, by_kind: dict[str, list[RequestResult]], duration: float
              ) -> dict[str, Any]:
    decoders = [r for r in by_kind["decoder"] if r.ok]
    longs = [r for r in by_kind["long"] if r.ok]
    tpots = [(r.e2e - r.ttft) / (r.output_tokens - 1) * 1000.0 for r in decoders
             if r.output_tokens > 1]
    ttft_mean, _, ttft_p99 = stats_ms([r.ttft for r in longs])
    _, itl_p50, itl_p99 = stats_ms([gap for r in decoders for gap in r.itls])
    return {
        "budget": budget, "duration": duration,
        "failed": sum(not r.ok for rs in by_kind.values() for r in rs),
        "errors": [r.error for rs in by_kind.values() for r in rs if not r.ok][:3],
        "ttft_mean": ttft_mean, "ttft_p99": ttft_p99,
        "itl_p50": itl_p50, "itl_p99": itl_p99,
        "tpot_mean": float(np.mean(tpots)) if tpots else 0.0,
        "tpot_p99": float(np.percentile(tpots, 99)) if tpots else 0.0,
        "decode_tok_s": sum(r.output_tokens for r in decoders) / max(duration, 1e-9),
        "long_lens": [r.prompt_len for r in longs],
    }


# --- reporting ---------------------------------------------------------------------------------
def print_table(rows: list[dict[str, Any]], args: argparse.Namespace, load: list[Arrival]) -> None:
    print("\n| --max-num-batched-tokens | long TTFT mean / p99 (ms) | decoder ITL p50 / p99 (ms) "
          "| decoder TPOT mean / p99 (ms) | decoder tok/s | run (s) | failed |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['budget']} | {r['ttft_mean']:.0f} / {r['ttft_p99']:.0f} "
              f"| {r['itl_p50']:.1f} / {r['itl_p99']:.1f} "
              f"| {r['tpot_mean']:.1f} / {r['tpot_p99']:.1f} | {r['decode_tok_s']:.1f} "
              f"| {r['duration']:.1f} | {r['failed']} |")
    lens = sorted(a.prompt.prompt_len for a in load if a.klass == "long")
    outs = [a.prompt.output_len for a in load if a.klass == "decoder"]
    print(f"\n{args.decoders} decoders ({args.decoder_input[0]}-{args.decoder_input[1]} prompt "
          f"tokens, {min(outs, default=0)}-{max(outs, default=0)} output tokens, ignore_eos) "
          f"from t=0; {args.long} long prompts ({lens[0] if lens else 0}-"
          f"{lens[-1] if lens else 0} tokens, {args.long_output} output tokens) at "
          f"t={args.long_start:g} s and every {args.gap:g} s after; a fresh server per budget, "
          f"--max-total-tokens {args.max_total_tokens}; greedy, streaming")
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    print(f"date: {date}; CPU count {os.cpu_count()}")
    print(f"command: {shlex.join([os.path.basename(sys.executable), *sys.argv])}")


def plot_rows(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    ttft_s = [r["ttft_mean"] / 1000.0 for r in rows]
    labels = [str(r["budget"]) for r in rows]
    budgets = [float(r["budget"]) for r in rows]
    trade_off = LinePanel("long-prompt TTFT mean, s (lower is better)",
                          "decoder latency, ms (lower is better)",
                          [Curve("decoder ITL p99", ttft_s, [r["itl_p99"] for r in rows], labels),
                           Curve("decoder TPOT p99", ttft_s, [r["tpot_p99"] for r in rows],
                                 labels)], log_y=True)
    by_budget = LinePanel("--max-num-batched-tokens B", "seconds",
                          [Curve("long-prompt TTFT mean", budgets, ttft_s),
                           Curve("long-prompt TTFT p99", budgets,
                                 [r["ttft_p99"] / 1000.0 for r in rows]),
                           Curve("run duration", budgets, [r["duration"] for r in rows], (),
                                 "s--")], log_x=True)
    caption = (f"{args.decoders} requests decode from t=0 while {args.long} long prompts arrive "
               f"every {args.gap:g} s; a fresh `radixrt serve --max-num-batched-tokens B` per "
               f"point (labelled B); CPU count {os.cpu_count()}")
    line_panels(plot_path("chunked_prefill", args.plot_dir),
                "Chunked prefill: long-prompt TTFT vs decoder latency, by token budget",
                [trade_off, by_budget], caption)


# --- main --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    from radixrt.runtime.models.loader import load_tokenizer

    tok = load_tokenizer("default")
    load = build_load(args, tok)
    rows: list[dict[str, Any]] = []
    for budget in args.budgets:
        system = radixrt_system("radixrt-lpm", args)
        system = dataclasses.replace(system, name=f"radixrt (B={budget})", command=[
            *system.command, "--max-num-batched-tokens", str(budget)])
        with running(system) as base:
            by_kind, duration = asyncio.run(run_load(base, system, load,
                                                     warm_up_prompt(tok, budget, args.seed)))
        rows.append(summarize(budget, by_kind, duration))
        row = rows[-1]
        print(f"B={budget}: long TTFT mean {row['ttft_mean']:.0f} ms, decoder ITL p99 "
              f"{row['itl_p99']:.1f} ms, TPOT p99 {row['tpot_p99']:.1f} ms, run "
              f"{duration:.1f} s" + (f", errors {row['errors']}" if row["failed"] else ""),
              flush=True)
    print_table(rows, args, load)
    plot_rows(rows, args)
    return 0 if all(r["failed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
