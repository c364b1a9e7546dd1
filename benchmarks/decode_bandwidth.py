"""Decode against the machine's memory-bandwidth limit, radixrt's packed and dequantized weights
and llama.cpp on the same GGUF file, in one run.

A decode step of a small model at batch 1 does little arithmetic per byte: it must read every
weight the forward pass uses once, plus the KV of the context, so bytes per step / read bandwidth
bounds its speed. This script measures:

(a) the read bandwidth of this machine with torch on the CPU: `x.sum()` over a float32 tensor much
    larger than the caches (--bandwidth-gib, capped at a quarter of the available memory), with
    the thread count the engine uses (torch's, in this process), median of --bandwidth-runs;
(b) the bytes one decode step of the default model reads, per weight format: every weight
    tensor as held (packed: the GGUF's blocks as radixrt packs them; dequantized: float32) --
    the layers, the final norm, the LM head (the whole matrix; with a tied embedding that is
    the embedding matrix) and one embedding row per sequence -- plus the KV of each sequence
    at the mean context length of the timed steps;
(c) the limit tokens/s = bandwidth / bytes per step (times the batch size);
(d) radixrt.Engine's greedy decode (ignore_eos, --output-len tokens after a --prompt-len prompt,
    speculative decoding off: one token a step, as llama.cpp here) at each batch size, with
    packed and with dequantized weights: only the decode steps are timed (the first step, the
    prefill that samples the first token, is not), median of --runs;
(e) llama.cpp's llama-server (../shared/llama-server, --llama-server) on the same file and the
    same prompts: its own timings of the generated tokens (decode_peer.py).

The table gives tok/s, ms per step, bytes read per step, the bandwidth that implies and its share
of (a), and radixrt packed / llama.cpp; docs/plots/decode_bandwidth.png draws tok/s against the
limits.

    python benchmarks/decode_bandwidth.py                 # batches 1 2 4 8, ~3 minutes on 2 cores
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
from decode_peer import llama_decode, llama_server_binary  # noqa: E402
from plots import Curve, LinePanel, add_plot_dir, line_panels, plot_path  # noqa: E402

import radixrt  # noqa: E402

FIRST_TOKEN_ID = 100  # prompts use ids FIRST_TOKEN_ID..vocab-1, clear of the special tokens
GB = 1e9


SYSTEMS = ("packed", "dequantized", "llama.cpp")  # radixrt's two weight formats, the peer


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
    system: str
    batch: int
    tok_s: float
    step_s: float
    context: float  # mean context length of the timed steps
    steps: int  # decode steps timed in one run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--runs", type=int, default=3, help="decode runs per batch size (median)")
    p.add_argument("--bandwidth-gib", type=float, default=2.0, help="size of the summed tensor")
    p.add_argument("--bandwidth-runs", type=int, default=9)
    p.add_argument("--llama-server", default=None,
                   help="llama.cpp's llama-server binary (default: ../shared/llama-server)")
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
def _nbytes(module: Any) -> int:
    """Bytes of a module's weights as held: float parameters and packed weights."""
    own = sum(p.numel() * p.element_size() for p in module.parameters())
    packed = [m.packed for m in module.modules() if getattr(m, "packed", None) is not None]
    return own + sum(w.nbytes for w in packed)


def step_bytes(engine: Any) -> StepBytes:
    model = engine.worker.model
    embed = model.embed_tokens
    head = embed if model.lm_head is None else model.lm_head
    layers = _nbytes(model.layers)
    norm = _nbytes(model.norm)
    embed_bytes = _nbytes(embed)
    counted = layers + norm + embed_bytes + (0 if head is embed else _nbytes(head))
    assert counted == _nbytes(model), (counted, _nbytes(model))  # every weight is one of these
    rows = model.shard.vocab.size
    return StepBytes(layers, norm, _nbytes(head), embed_bytes // rows, model.lm_head is None,
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


def prompts_for(args: argparse.Namespace, vocab: int) -> Any:
    """prompts_of(batch): the same random prompts for every system (a fresh set each call,
    from a generator per batch size)."""
    generators: dict[int, random.Random] = {}

    def prompts_of(batch: int) -> list[list[int]]:
        rng = generators.setdefault(batch, random.Random(args.seed + batch))
        return [[rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(args.prompt_len)]
                for _ in range(batch)]

    return prompts_of


def measure_decode(system: str, engine: Any, batch: int, args: argparse.Namespace,
                   prompts_of: Any) -> DecodeResult:
    seconds = []
    steps = 0
    for _ in range(args.runs):
        s, steps = decode_once(engine, prompts_of(batch), args.output_len)
        seconds.append(s)
    if steps != args.output_len - 1:
        print(f"note: batch {batch} took {steps} decode steps for {args.output_len - 1} tokens")
    step_s = statistics.median(seconds) / max(steps, 1)
    # decode step k (1..output_len-1) attends over prompt_len + k positions
    context = args.prompt_len + args.output_len / 2
    return DecodeResult(system, batch, batch / step_s, step_s, context, steps)


def radixrt_rows(system: str, args: argparse.Namespace, vocab: int
                 ) -> tuple[list[DecodeResult], StepBytes]:
    context = args.prompt_len + args.output_len + 8
    engine = radixrt.Engine(model="default", dtype="float32", weight_format=system,
                            speculative_algorithm="none",
                            max_total_tokens=max(4096, 2 * max(args.batches) * context))
    sb = step_bytes(engine)
    decode_once(engine, [[FIRST_TOKEN_ID + i] * 8 for i in range(max(args.batches))], 4)  # warm
    rows = []
    prompts_of = prompts_for(args, vocab)
    for batch in args.batches:
        rows.append(measure_decode(system, engine, batch, args, prompts_of))
        print(f"radixrt {system} batch {batch}: {rows[-1].tok_s:.1f} tok/s, "
              f"{rows[-1].step_s * 1000:.1f} ms/step", flush=True)
    engine.close()
    return rows, sb


def llama_rows(args: argparse.Namespace, vocab: int) -> list[DecodeResult]:
    binary = llama_server_binary(args.llama_server)
    if binary is None:
        print("llama.cpp: skipped (no llama-server binary; --llama-server PATH)")
        return []
    context = args.prompt_len + args.output_len / 2
    peer = llama_decode(binary, args.batches, prompts_for(args, vocab), args.output_len,
                        args.runs)
    return [DecodeResult("llama.cpp", r.batch, r.tok_s, r.step_s, context, args.output_len)
            for r in peer]


# --- reporting ---------------------------------------------------------------------------------
def print_report(rows: list[DecodeResult], bytes_of: dict[str, StepBytes], bw: Bandwidth,
                 args: argparse.Namespace) -> None:
    threads, bandwidth = torch.get_num_threads(), bw.median
    print(f"\nmeasured read bandwidth: {bandwidth:.1f} GB/s (x.sum() over {bw.gib:.2f} GiB "
          f"float32, {threads} threads, median of {bw.runs}; best run {bw.best:.1f} GB/s); "
          f"L3 cache {l3_cache()}")
    for name, sb in bytes_of.items():
        head = "tied to the embedding: the whole matrix" if sb.tied else "its own matrix"
        print(f"bytes per decode step ({name}): layers {sb.layers / 1e6:.1f} MB + final norm "
              f"{sb.final_norm / 1e3:.1f} kB + LM head {sb.lm_head / 1e6:.1f} MB ({head}) "
              f"+ per sequence: embedding row {sb.embed_row / 1e3:.1f} kB + KV "
              f"{sb.kv_per_token / 1e3:.1f} kB/token x context")
    peer = {r.batch: r.tok_s for r in rows if r.system == "llama.cpp"}
    print("\n| system | batch | tok/s | step ms | MB read per step | achieved GB/s | % of "
          "measured bandwidth | vs llama.cpp |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        sb = bytes_of.get(r.system, bytes_of.get("packed"))  # llama.cpp reads the file's blocks
        nbytes = sb.total(r.batch, r.context) if sb else float("nan")
        achieved = nbytes / r.step_s / GB
        ratio = f"{r.tok_s / peer[r.batch]:.2f}x" if r.batch in peer else "-"
        print(f"| {r.system} | {r.batch} | {r.tok_s:.1f} | {r.step_s * 1000:.1f} "
              f"| {nbytes / 1e6:.1f} | {achieved:.1f} | {achieved / bandwidth:.0%} | {ratio} |")
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    print(f"\ndefault model (SmolLM2-135M-Instruct Q4_1 GGUF); radixrt.Engine (inline, float32 "
          f"activations, speculative decoding off); prompt {args.prompt_len} random tokens, "
          f"{args.output_len} output tokens (ignore_eos, greedy), KV at mean context "
          f"{args.prompt_len + args.output_len / 2:g}; decode steps only, median of {args.runs} "
          "runs; llama.cpp: llama-server on the same file and prompts, its own timings; "
          "llama.cpp's bytes counted as radixrt's packed ones")
    print(f"date: {date}; CPU count {os.cpu_count()}, torch threads {threads}")
    print(f"command: {shlex.join([os.path.basename(sys.executable), *sys.argv])}")


def plot_report(rows: list[DecodeResult], bytes_of: dict[str, StepBytes], bandwidth: float,
                args: argparse.Namespace) -> None:
    curves = []
    for system in SYSTEMS:
        mine = [r for r in rows if r.system == system]
        if mine:
            curves.append(Curve(f"radixrt {system}" if system != "llama.cpp" else system,
                                [float(r.batch) for r in mine], [r.tok_s for r in mine],
                                [f"{r.tok_s:.0f}" for r in mine]))
    for name, sb in bytes_of.items():
        batches = [float(b) for b in args.batches]
        context = args.prompt_len + args.output_len / 2
        limits = [b * bandwidth * GB / sb.total(int(b), context) for b in batches]
        curves.append(Curve(f"bandwidth limit ({name})", batches, limits, (), "s--"))
    tok = LinePanel("batch size", "decode tokens/s (higher is better)", curves, log_x=True)
    caption = (f"default model Q4_1 GGUF, speculative decoding off; "
               f"{torch.get_num_threads()} threads; CPU count {os.cpu_count()}; measured read "
               f"bandwidth {bandwidth:.1f} GB/s")
    line_panels(plot_path("decode_bandwidth", args.plot_dir),
                "Decode: packed and dequantized weights, llama.cpp, the bandwidth limits", [tok],
                caption)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # as offline_throughput.py: flush denormals to zero before torch starts its threads
    torch.set_flush_denormal(True)
    bw = measure_bandwidth(args.bandwidth_gib, args.bandwidth_runs)
    print(f"read bandwidth: {bw.median:.1f} GB/s over {bw.gib:.2f} GiB", flush=True)
    from radixrt.runtime.models.loader import inspect_model

    vocab = inspect_model("default").vocab_size
    rows: list[DecodeResult] = []
    bytes_of: dict[str, StepBytes] = {}
    for system in ("packed", "dequantized"):
        if system in args.systems:
            found, bytes_of[system] = radixrt_rows(system, args, vocab)
            rows += found
    if "llama.cpp" in args.systems:
        rows += llama_rows(args, vocab)
    print_report(rows, bytes_of, bw, args)
    plot_report(rows, bytes_of, bw.median, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
