"""Online serving benchmark: an OpenAI-client load generator against `radixrt serve` variants
(and llama.cpp's server when it is installed), with bench_serving-style results.

Every system is launched here as a subprocess on a free port, warmed up with one request, then
fed the same prompts (fixed seed) through `openai.AsyncOpenAI` streaming completions (greedy,
fixed max_tokens, EOS ignored where the server supports it). Per request it measures TTFT, TPOT
((e2e - ttft) / (output tokens - 1)), ITL (gaps between streamed chunks that carry text) and
end-to-end latency; per run, request and token throughput and the prefix-cache hit rate.

Systems: radixrt-lpm (the default), radixrt-fcfs (`--schedule-policy fcfs`), radixrt-no-cache
(`--disable-radix-cache`), radixrt-sglang-api (the default server loaded through SGLang's native
/generate protocol, with the requests `sglang.bench_serving --backend sglang` sends) and
llama.cpp on the same GGUF file: its C++ `llama-server` (8 parallel slots, a thread per core,
ignore_eos) when `--llama-server` or ../shared/llama-server/ has it, else `llama_cpp.server`
from a venv (no ignore_eos: a request may stop early; its table counts the tokens it really
produced). The summary is also drawn as docs/plots/serving*.png.

Scale-out runs: --dp-size N adds N replicas behind the SGLang router (`radixrt serve --dp-size N`,
needs `pip install 'radixrt[router]'`), once with its cache_aware and once with its random
policy; their server-side hit rate sums every replica's counters. --tp-size N adds radixrt with
N tensor-parallel ranks (on a 2-core CPU a correctness feature, not a speed-up: the ranks split
the same cores and add an all-reduce per layer). Run the router inside a network namespace, as
the tests do, to be sure it never reaches for a model hub.

    python benchmarks/serving.py                       # default sizes, ~10 minutes on 2 cores
    python benchmarks/serving.py --quick               # tiny sizes, ~2 minutes
    python benchmarks/serving.py --request-rate 2      # Poisson arrivals instead of concurrency
    python benchmarks/serving.py --llama-cpp-venv DIR  # a venv with llama-cpp-python[server]
    python benchmarks/serving.py --install-llama-cpp   # build it into benchmarks/.llama-venv
    python benchmarks/serving.py --scenario sharing    # priorities and tenants on vs off
    # the shared-prefix dataset on 1 replica vs 2 with cache_aware vs 2 with random:
    unshare -n sh -c 'ip link set lo up && exec python benchmarks/serving.py --dp-size 2 \
        --systems radixrt-lpm --datasets shared-prefix'
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shlex
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any

from plots import add_plot_dir, bar_panels, plot_path
from serving_requests import (
    Prompt,
    RequestResult,
    ideal_hit_rate,
    one_request,
    openai_client,
    random_text,
    stats_ms,
    token_count,
)
from serving_sharing import add_sharing_args, run_sharing
from serving_systems import (
    LLAMA_VENV,
    SYSTEMS,
    System,
    build_systems,
    http_json,
    replica_urls,
    running,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DATASETS = ("random", "shared-prefix")
DEFAULT_CONCURRENCY = 8


@dataclass(frozen=True)
class Dataset:
    name: str
    prompts: list[Prompt]
    ideal_hit_rate: float = 0.0  # every distinct prefix computed once (serving_requests)


@dataclass
class RunResult:
    system: str
    dataset: str
    duration: float
    requests: list[RequestResult]
    server_hit_rate: float | None
    ideal_hit_rate: float = 0.0


# --- arguments ---------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--systems", nargs="*", choices=SYSTEMS, default=list(SYSTEMS),
                   help="(none with --dp-size / --tp-size: only their runs)")
    p.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    p.add_argument("--num-prompts", type=int, default=32, help="requests per dataset")
    p.add_argument("--request-rate", type=float, default=None,
                   help="Poisson arrivals at this many requests/s (default: all at once, "
                   "limited by --max-concurrency)")
    p.add_argument("--max-concurrency", type=int, default=None,
                   help=f"requests in flight at most (default {DEFAULT_CONCURRENCY} without "
                   "--request-rate, unlimited with it)")
    p.add_argument("--random-input", type=int, nargs=2, default=(64, 256), metavar=("MIN", "MAX"))
    p.add_argument("--random-output", type=int, nargs=2, default=(16, 32), metavar=("MIN", "MAX"))
    p.add_argument("--groups", type=int, default=4, help="shared-prefix: system prompts")
    p.add_argument("--system-prompt-len", type=int, default=400, help="shared-prefix: tokens")
    p.add_argument("--question-len", type=int, nargs=2, default=(16, 48), metavar=("MIN", "MAX"))
    p.add_argument("--shared-output", type=int, nargs=2, default=(16, 32), metavar=("MIN", "MAX"))
    p.add_argument("--max-total-tokens", type=int, default=8192, help="radixrt KV pool")
    p.add_argument("--llama-cpp-venv", default=None,
                   help=f"venv with llama-cpp-python[server] (default: {LLAMA_VENV} if present)")
    p.add_argument("--llama-server", default=None,
                   help="llama.cpp's C++ llama-server binary (default: ../shared/llama-server/ "
                   "when it is there; else the Python server of --llama-cpp-venv)")
    p.add_argument("--install-llama-cpp", action="store_true",
                   help=f"create {LLAMA_VENV} and pip install llama-cpp-python[server] there "
                   "(builds from source: minutes)")
    p.add_argument("--radixrt-args", default="",
                   help='more `radixrt serve` flags for every radixrt system, e.g. '
                   '"--max-num-batched-tokens 2048 --no-cascade-attention"')
    p.add_argument("--dp-size", type=int, default=1,
                   help="also N replicas behind the SGLang router, with cache_aware and random")
    p.add_argument("--tp-size", type=int, default=1,
                   help="also radixrt with N tensor-parallel ranks (and replicas of N ranks)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    add_sharing_args(p)
    add_plot_dir(p)
    args = p.parse_args(argv)
    if args.quick:
        args.num_prompts, args.groups = 8, 2
        args.random_input, args.random_output = (32, 96), (8, 8)
        args.question_len, args.shared_output = (8, 16), (8, 8)
        args.flood, args.flood_output, args.probes, args.gap = 16, 8, 2, 1.0
    if args.request_rate is None and args.max_concurrency is None:
        args.max_concurrency = DEFAULT_CONCURRENCY
    return args


# --- datasets ----------------------------------------------------------------------------------
def random_dataset(args: argparse.Namespace, tok: Any) -> Dataset:
    rng = random.Random(args.seed)
    prompts = []
    for _ in range(args.num_prompts):
        text = random_text(tok, rng, rng.randint(*args.random_input))
        prompts.append(Prompt(text, token_count(tok, text), rng.randint(*args.random_output)))
    return Dataset("random", prompts)


def shared_prefix_dataset(args: argparse.Namespace, tok: Any) -> Dataset:
    """args.groups system prompts, num_prompts questions dealt round-robin, then shuffled."""
    rng = random.Random(args.seed + 1)
    systems = [random_text(tok, rng, args.system_prompt_len) for _ in range(args.groups)]
    prompts = []
    for i in range(args.num_prompts):
        question = random_text(tok, rng, rng.randint(*args.question_len))
        text = f"{systems[i % args.groups]}\n\nQuestion: {question}\nAnswer:"
        prompts.append(Prompt(text, token_count(tok, text), rng.randint(*args.shared_output)))
    rng.shuffle(prompts)
    return Dataset("shared-prefix", prompts)


def build_datasets(args: argparse.Namespace) -> list[Dataset]:
    from radixrt.runtime.models.loader import load_tokenizer

    tok = load_tokenizer("default")
    makers = {"random": random_dataset, "shared-prefix": shared_prefix_dataset}
    datasets = []
    for name in args.datasets:
        data = makers[name](args, tok)
        ideal = ideal_hit_rate([tok.encode(p.text, add_special_tokens=True) for p in data.prompts])
        datasets.append(Dataset(data.name, data.prompts, ideal))
    return datasets


# --- systems -----------------------------------------------------------------------------------
async def generate_load(
    client: Any, system: System, prompts: list[Prompt], args: argparse.Namespace
) -> tuple[list[RequestResult], float]:
    limit = asyncio.Semaphore(args.max_concurrency or len(prompts))
    gaps = random.Random(args.seed + 2)

    async def limited(prompt: Prompt) -> RequestResult:
        async with limit:
            return await one_request(client, system, prompt)

    start = time.perf_counter()
    tasks = []
    for i, prompt in enumerate(prompts):
        tasks.append(asyncio.create_task(limited(prompt)))
        if args.request_rate and i + 1 < len(prompts):
            await asyncio.sleep(gaps.expovariate(args.request_rate))
    results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - start


async def run_dataset(base: str, system: System, data: Dataset, args: argparse.Namespace
                      ) -> RunResult:
    async with openai_client(base) as client:
        await one_request(client, system, Prompt("Hello, how are you?", 6, 4))  # warm-up
        before = server_counters(base, system, flush=True)
        results, duration = await generate_load(client, system, data.prompts, args)
        after = server_counters(base, system, flush=False)
    return RunResult(system.name, data.name, duration, results, hit_rate_delta(before, after),
                     data.ideal_hit_rate)


def server_counters(base: str, system: System, flush: bool) -> dict[str, Any] | None:
    """The prompt and cached token counts of the server (behind the router: of all replicas;
    the router's own /flush_cache flushes every one)."""
    if not system.flushable:
        return None
    if flush:  # each dataset starts cold, so its hit rate is its own
        http_json(base + "/flush_cache", method="POST")
    servers = [base] if system.replicas == 1 else replica_urls(base)
    infos = [http_json(url + "/server_info") for url in servers]
    return {key: sum(info[key] for info in infos) for key in ("prompt_tokens", "cached_tokens")}


def hit_rate_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> float | None:
    if before is None or after is None:
        return None
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    cached = after["cached_tokens"] - before["cached_tokens"]
    return cached / prompt if prompt > 0 else None


# --- metrics -----------------------------------------------------------------------------------
def metrics(run: RunResult) -> dict[str, Any]:
    ok = [r for r in run.requests if r.ok]
    inputs = sum(r.prompt_len for r in ok)
    outputs = sum(r.output_tokens for r in ok)
    reported = [r for r in ok if r.cached_tokens is not None]
    tpots = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    seconds = max(run.duration, 1e-9)
    return {
        "completed": len(ok),
        "failed": len(run.requests) - len(ok),
        "input_tokens": inputs,
        "output_tokens": outputs,
        "request_throughput": len(ok) / seconds,
        "output_throughput": outputs / seconds,
        "total_throughput": (inputs + outputs) / seconds,
        "usage_hit_rate": (sum(r.cached_tokens or 0 for r in reported)
                           / max(sum(r.prompt_len for r in reported), 1)) if reported else None,
        "ttft": stats_ms([r.ttft for r in ok]),
        "tpot": stats_ms(tpots),
        "itl": stats_ms([gap for r in ok for gap in r.itls]),
        "e2e": stats_ms([r.e2e for r in ok]),
    }


# --- reporting ---------------------------------------------------------------------------------
def percent(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:.1%}"


def print_run(run: RunResult, m: dict[str, Any]) -> None:
    width = 50
    rows = [
        ("System:", run.system), ("Dataset:", run.dataset),
        ("Successful requests:", m["completed"]), ("Failed requests:", m["failed"]),
        ("Benchmark duration (s):", f"{run.duration:.2f}"),
        ("Total input tokens:", m["input_tokens"]), ("Total generated tokens:", m["output_tokens"]),
        ("Request throughput (req/s):", f"{m['request_throughput']:.2f}"),
        ("Output token throughput (tok/s):", f"{m['output_throughput']:.2f}"),
        ("Total token throughput (tok/s):", f"{m['total_throughput']:.2f}"),
        ("Cache hit rate (usage):", percent(m["usage_hit_rate"])),
        ("Cache hit rate (server_info):", percent(run.server_hit_rate)),
        ("Cache hit rate (ideal):", percent(run.ideal_hit_rate)),
    ]
    print("\n" + " Serving Benchmark Result ".center(width, "="))
    for label, value in rows:
        print(f"{label:<40}{value:>10}")
    for key, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token"),
                       ("itl", "Inter-token Latency"), ("e2e", "End-to-end Latency")):
        print(f" {title} ".center(width, "-"))
        for label, value in zip(("Mean", "Median", "P99"), m[key]):
            print(f"{f'{label} {key.upper()} (ms):':<40}{value:>10.2f}")
    print("=" * width)
    print_errors(run)


def print_errors(run: RunResult, limit: int = 3) -> None:
    errors = [r.error for r in run.requests if not r.ok]
    for error in errors[:limit]:
        print(f"  error: {error}")
    if len(errors) > limit:
        print(f"  ... and {len(errors) - limit} more errors")


def print_summary(rows: list[tuple[RunResult, dict[str, Any]]], args: argparse.Namespace,
                  notes: list[str]) -> None:
    print("\n| system | dataset | ok/total | out tokens | req/s | out tok/s | total tok/s "
          "| TTFT mean / p99 (ms) | TPOT mean / p99 (ms) | ITL median / p99 (ms) "
          "| E2E mean (ms) | cache hit | of ideal |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run, m in rows:
        hit = m["usage_hit_rate"] if m["usage_hit_rate"] is not None else run.server_hit_rate
        ideal = run.ideal_hit_rate
        of_ideal = f"{hit / ideal:.0%}" if hit is not None and ideal else "—"
        print(f"| {run.system} | {run.dataset} | {m['completed']}/{len(run.requests)} "
              f"| {m['output_tokens']} | {m['request_throughput']:.2f} "
              f"| {m['output_throughput']:.1f} | {m['total_throughput']:.1f} "
              f"| {m['ttft'][0]:.0f} / {m['ttft'][2]:.0f} "
              f"| {m['tpot'][0]:.1f} / {m['tpot'][2]:.1f} "
              f"| {m['itl'][1]:.1f} / {m['itl'][2]:.1f} | {m['e2e'][0]:.0f} | {percent(hit)} "
              f"| {of_ideal} |")
    ideals = {run.dataset: run.ideal_hit_rate for run, _ in rows}
    print("\nideal hit rate (every distinct prefix computed once): "
          + ", ".join(f"{d} {percent(r)}" for d, r in ideals.items()))
    print_ratios(rows)
    load = (f"Poisson {args.request_rate} req/s" if args.request_rate else "all at t=0")
    if args.max_concurrency:
        load += f", max concurrency {args.max_concurrency}"
    print(f"\n{args.num_prompts} prompts per dataset, {load}; greedy; CPU count {os.cpu_count()}; "
          f"{time.strftime('%Y-%m-%d')}")
    command = shlex.join([os.path.basename(sys.executable), *sys.argv])
    print(f"command: {command}")
    for note in notes:
        print(note)


def print_ratios(rows: list[tuple[RunResult, dict[str, Any]]]) -> None:
    """Each radixrt system against llama.cpp on the same dataset: requests/s and TPOT."""
    by = {(run.system, run.dataset): m for run, m in rows}
    for (system, dataset), m in by.items():
        peer = by.get(("llama.cpp", dataset))
        if system == "llama.cpp" or peer is None or not peer["request_throughput"]:
            continue
        print(f"{system} / llama.cpp on {dataset}: "
              f"{m['request_throughput'] / peer['request_throughput']:.2f}x requests/s, "
              f"TPOT mean {m['tpot'][0]:.1f} vs {peer['tpot'][0]:.1f} ms "
              f"({m['tpot'][0] / peer['tpot'][0]:.2f}x), "
              f"ITL p99 {m['itl'][2]:.1f} vs {peer['itl'][2]:.1f} ms")


def plot_summary(rows: list[tuple[RunResult, dict[str, Any]]], args: argparse.Namespace) -> None:
    """Throughput, TTFT and TPOT of every system on every dataset (and, for replicas, the
    server-side cache hit rate), and, when llama.cpp ran, radixrt's throughput ratio to it."""
    systems = list(dict.fromkeys(run.system for run, _ in rows))
    datasets = list(dict.fromkeys(run.dataset for run, _ in rows))
    by = {(run.system, run.dataset): m for run, m in rows}
    hits = {(run.system, run.dataset): 100 * (run.server_hit_rate or 0.0) for run, _ in rows}

    def series(key: Any) -> dict[str, list[float]]:
        return {s: [key(by[s, d]) if (s, d) in by else 0.0 for d in datasets] for s in systems}

    panels = [("total tokens/s (higher is better)", series(lambda m: m["total_throughput"])),
              ("TTFT mean, ms (lower is better)", series(lambda m: m["ttft"][0])),
              ("TPOT mean, ms (lower is better)", series(lambda m: m["tpot"][0]))]
    ours = systems[0]
    ratios = [f"{d} {by[ours, d]['total_throughput'] / by['llama.cpp', d]['total_throughput']:.2f}x"
              for d in datasets if (ours, d) in by and ("llama.cpp", d) in by
              and by["llama.cpp", d]["total_throughput"]]
    load = (f"concurrency {args.max_concurrency}" if args.max_concurrency
            else f"{args.request_rate} req/s")
    caption = (f"{args.num_prompts} prompts per dataset, {load}; "
               + (f"{ours} / llama.cpp total tokens/s: " + ", ".join(ratios) if ratios
                  else "greedy, streaming"))
    scaled = args.dp_size > 1 or args.tp_size > 1
    if scaled:
        panels.append(("cache hit rate, % (higher is better)",
                       {s: [hits.get((s, d), 0.0) for d in datasets] for s in systems}))
    name = ("serving_vs_llama_cpp" if "llama.cpp" in systems
            else "serving_scale_out" if scaled else "serving")
    title = ("radixrt serve: one replica vs replicas behind the router" if scaled
             else "radixrt serve vs peers (same GGUF, same client)")
    bar_panels(plot_path(name, args.plot_dir), title, datasets, panels, caption)


# --- main --------------------------------------------------------------------------------------
def exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through `running`, which stops the server


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    if args.scenario == "sharing":
        return run_sharing(args)
    datasets = build_datasets(args)
    systems, notes = build_systems(args)
    rows: list[tuple[RunResult, dict[str, Any]]] = []
    for system in systems:
        try:
            with running(system) as base:
                for data in datasets:
                    run = asyncio.run(run_dataset(base, system, data, args))
                    rows.append((run, metrics(run)))
                    print_run(*rows[-1])
        except (RuntimeError, TimeoutError) as exc:
            print(f"{system.name}: {exc}", file=sys.stderr)
    print_summary(rows, args, notes)
    plot_summary(rows, args)
    return 0 if rows and all(m["failed"] == 0 for _, m in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
