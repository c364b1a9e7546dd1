"""Batch-1 decode against the machine's memory-bandwidth limit, in one run.

A decode step of a small model at batch 1 does little arithmetic per byte: it must read every
weight the forward pass uses once, plus the KV of the context, so bytes per step / read bandwidth
bounds its speed. This script measures:

(a) the read bandwidth of this machine with torch on the CPU: `x.sum()` over a float32 tensor much
    larger than the caches (--bandwidth-gib, capped at a quarter of the available memory), with
    the thread count the engine uses (torch's, in this process), median of --bandwidth-runs;
(b) the bytes one decode step of the default model reads: every weight tensor as loaded (float32)
    -- the layers, the final norm, the LM head (the whole matrix; with a tied embedding that is
    the embedding matrix) and one embedding row per sequence -- plus the KV of each sequence at
    the mean context length of the timed steps;
(c) the limit tokens/s = bandwidth / bytes per step (times the batch size);
(d) radixrt.Engine's greedy decode (ignore_eos, --output-len tokens after a --prompt-len prompt)
    at each batch size: only the decode steps are timed (the first step, the prefill that
    samples the first token, is not), median of --runs.

The table gives tok/s, ms per step, bytes read per step, the bandwidth that implies and its share
of (a); docs/plots/decode_bandwidth.png draws tok/s against the limit and the achieved bandwidth.

    python benchmarks/decode_bandwidth.py                 # batches 1 2 4 8, ~1 minute on 2 cores
    python benchmarks/decode_bandwidth.py --quick         # tiny sizes (a smoke test)
    python benchmarks/decode_bandwidth.py --batches 1 16 --output-len 256
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import psutil  # noqa: E402
import torch  # noqa: E402
from plots import Curve, LinePanel, add_plot_dir, line_panels, plot_path  # noqa: E402

import radixrt  # noqa: E402

FIRST_TOKEN_ID = 100  # prompts use ids FIRST_TOKEN_ID..vocab-1, clear of the special tokens
GB = 1e9


@dataclass(frozen=True)
class StepBytes:
    """What one decode step reads, in bytes: per step, and per sequence of the batch."""

    layers: int  # the decoder layers' weights
    final_norm: int
    lm_head: int  # the whole matrix: every sequence's logits need all of it
    embed_row: int  # one row per sequence
    tied: bool  # the LM head is the embedding matrix
    kv_per_token: int  # K and V of one position, all layers

    def total(self, batch: int, context: float) -> float:
        per_sequence = self.embed_row + self.kv_per_token * context
        return self.layers + self.final_norm + self.lm_head + batch * per_sequence


@dataclass(frozen=True)
class DecodeResult:
    batch: int
    tok_s: float
    step_s: float
    context: float  # mean context length of the timed steps
    steps: int  # decode steps timed in one run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--runs", type=int, default=3, help="decode runs per batch size (median)")
    p.add_argument("--bandwidth-gib", type=float, default=2.0, help="size of the summed tensor")
    p.add_argument("--bandwidth-runs", type=int, default=9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    add_plot_dir(p)
    args = p.parse_args(argv)
    if args.quick:
        args.batches, args.prompt_len, args.output_len, args.runs = [1, 2], 8, 16, 1
        args.bandwidth_gib, args.bandwidth_runs = 0.5, 7
    if args.output_len < 2:
        p.error("--output-len: 2 at least (the first token comes from the untimed prefill)")
    return args


# --- (a) bandwidth -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Bandwidth:
    median: float  # GB/s: the reference of the table
    best: float  # GB/s of the fastest run (a run that shared the CPU is slower, never faster)
    gib: float  # the size of the summed tensor
    runs: int


def measure_bandwidth(gib: float, runs: int) -> Bandwidth:
    """x.sum() over a float32 tensor of `gib` GiB (at most a quarter of the available memory),
    timed `runs` times."""
    size = min(int(gib * 2**30), psutil.virtual_memory().available // 4)
    x = torch.ones(size // 4, dtype=torch.float32)  # written once: every page is resident
    x.sum()  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - start)
    nbytes = x.numel() * x.element_size()
    del x
    return Bandwidth(nbytes / statistics.median(times) / GB, nbytes / min(times) / GB,
                     nbytes / 2**30, runs)


def l3_cache() -> str:
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


# --- (b) bytes per step ------------------------------------------------------------------------
def step_bytes(engine: Any) -> StepBytes:
    model = engine.worker.model
    embed = model.embed_tokens.weight
    head = embed if model.lm_head is None else model.lm_head.weight
    layers = sum(p.numel() * p.element_size() for p in model.layers.parameters())
    norm = sum(p.numel() * p.element_size() for p in model.norm.parameters())
    counted = layers + norm + embed.numel() * embed.element_size() + (
        0 if head is embed else head.numel() * head.element_size())
    stored = sum(p.numel() * p.element_size() for p in model.parameters())
    assert counted == stored, (counted, stored)  # every parameter is one of these
    return StepBytes(layers, norm, head.numel() * head.element_size(),
                     embed.shape[1] * embed.element_size(), model.lm_head is None,
                     engine.worker.kv_cache.bytes_per_token())


# --- (d) decode --------------------------------------------------------------------------------
def greedy(max_tokens: int) -> radixrt.SamplingParams:
    return radixrt.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def decode_once(engine: Any, prompts: list[list[int]], output_len: int) -> tuple[float, int]:
    """(seconds, steps) of the decode steps of one batch: the first step (the prefill, which
    samples every first token: the prompts fit one step's budget) is not timed."""
    engine.flush_cache()
    rids = [engine.submit(p, greedy(output_len)) for p in prompts]
    engine.step()  # the prefill
    steps, pending = 0, set(rids)
    start = time.perf_counter()
    while pending:
        engine.step()
        steps += 1
        for rid in list(pending):
            out = engine.take_output(rid)
            if out is not None:
                assert out.completion_tokens == output_len, (out.completion_tokens, output_len)
                pending.discard(rid)
    return time.perf_counter() - start, steps


def measure_decode(engine: Any, batch: int, args: argparse.Namespace) -> DecodeResult:
    rng = random.Random(args.seed + batch)
    vocab = engine.model_config.vocab_size
    seconds = []
    steps = 0
    for _ in range(args.runs):
        prompts = [[rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(args.prompt_len)]
                   for _ in range(batch)]
        s, steps = decode_once(engine, prompts, args.output_len)
        seconds.append(s)
    if steps != args.output_len - 1:
        print(f"note: batch {batch} took {steps} decode steps for {args.output_len - 1} tokens")
    step_s = statistics.median(seconds) / max(steps, 1)
    # decode step k (1..output_len-1) attends over prompt_len + k positions
    context = args.prompt_len + args.output_len / 2
    return DecodeResult(batch, batch / step_s, step_s, context, steps)


# --- reporting ---------------------------------------------------------------------------------
def print_report(rows: list[DecodeResult], sb: StepBytes, bw: Bandwidth,
                 args: argparse.Namespace) -> None:
    threads, bandwidth = torch.get_num_threads(), bw.median
    print(f"\nmeasured read bandwidth: {bandwidth:.1f} GB/s (x.sum() over {bw.gib:.2f} GiB "
          f"float32, {threads} threads, median of {bw.runs}; best run {bw.best:.1f} GB/s); "
          f"L3 cache {l3_cache()}")
    head = "tied to the embedding: the whole embedding matrix" if sb.tied else "its own matrix"
    print(f"bytes per decode step: layers {sb.layers / 1e6:.1f} MB + final norm "
          f"{sb.final_norm / 1e3:.1f} kB + LM head {sb.lm_head / 1e6:.1f} MB ({head}) "
          f"+ per sequence: embedding row {sb.embed_row / 1e3:.1f} kB + KV "
          f"{sb.kv_per_token / 1e3:.1f} kB/token x context")
    print("\n| batch | tok/s | step ms | MB read per step | achieved GB/s | % of measured "
          "bandwidth | limit tok/s | % of limit |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        nbytes = sb.total(r.batch, r.context)
        achieved = nbytes / r.step_s / GB
        limit = r.batch * bandwidth * GB / nbytes
        print(f"| {r.batch} | {r.tok_s:.1f} | {r.step_s * 1000:.1f} | {nbytes / 1e6:.1f} "
              f"| {achieved:.1f} | {achieved / bandwidth:.0%} | {limit:.1f} "
              f"| {r.tok_s / limit:.0%} |")
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    print(f"\ndefault model, float32, radixrt.Engine (inline); prompt {args.prompt_len} tokens, "
          f"{args.output_len} output tokens (ignore_eos, greedy), KV at mean context "
          f"{args.prompt_len + args.output_len / 2:g}; decode steps only, median of {args.runs} "
          f"runs; denormals flushed to zero")
    print(f"date: {date}; CPU count {os.cpu_count()}, torch threads {threads}")
    print(f"command: {shlex.join([os.path.basename(sys.executable), *sys.argv])}")


def plot_report(rows: list[DecodeResult], sb: StepBytes, bandwidth: float,
                args: argparse.Namespace) -> None:
    batches = [float(r.batch) for r in rows]
    nbytes = [sb.total(r.batch, r.context) for r in rows]
    limits = [r.batch * bandwidth * GB / b for r, b in zip(rows, nbytes)]
    achieved = [b / r.step_s / GB for r, b in zip(rows, nbytes)]
    tok = LinePanel("batch size", "decode tokens/s (higher is better)",
                    [Curve("radixrt.Engine", batches, [r.tok_s for r in rows],
                           [f"{r.tok_s:.0f}" for r in rows]),
                     Curve("bandwidth limit", batches, limits, [f"{v:.0f}" for v in limits],
                           "s--")], log_x=True)
    gbs = LinePanel("batch size", "GB/s read by a decode step",
                    [Curve("achieved", batches, achieved, [f"{v:.1f}" for v in achieved]),
                     Curve("measured bandwidth (x.sum())", batches, [bandwidth] * len(rows), (),
                           "--")], log_x=True)
    caption = (f"default model, float32; {sb.total(1, rows[0].context) / 1e6:.0f} MB read per "
               f"batch-1 step; {torch.get_num_threads()} threads; CPU count {os.cpu_count()}")
    line_panels(plot_path("decode_bandwidth", args.plot_dir),
                "Decode against the memory-bandwidth limit", [tok, gbs], caption)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # as offline_throughput.py: flush denormals to zero before torch starts its threads
    torch.set_flush_denormal(True)
    bw = measure_bandwidth(args.bandwidth_gib, args.bandwidth_runs)
    print(f"read bandwidth: {bw.median:.1f} GB/s over {bw.gib:.2f} GiB", flush=True)
    context = args.prompt_len + args.output_len + 8
    engine = radixrt.Engine(model="default", dtype="float32",
                            max_total_tokens=max(4096, 2 * max(args.batches) * context))
    sb = step_bytes(engine)
    decode_once(engine, [[FIRST_TOKEN_ID + i] * 8 for i in range(max(args.batches))], 4)  # warm
    rows = []
    for batch in args.batches:
        rows.append(measure_decode(engine, batch, args))
        print(f"batch {batch}: {rows[-1].tok_s:.1f} tok/s, {rows[-1].step_s * 1000:.1f} ms/step",
              flush=True)
    print_report(rows, sb, bw, args)
    plot_report(rows, sb, bw.median, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
