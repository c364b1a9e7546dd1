"""Offline throughput: radixrt.Engine against Hugging Face transformers with static batching.

Both systems run the same model (the default SmolLM2-135M-Instruct GGUF, float32), the same
requests (random token ids from a fixed seed, greedy, EOS ignored) and generate exactly each
request's output length. HF pads every batch to its longest prompt and runs it to its longest
output; tokens generated past a request's own output length are wasted and are not counted.

    python benchmarks/offline_throughput.py                 # both workloads, default sizes
    python benchmarks/offline_throughput.py --quick         # tiny sizes, well under a minute
    python benchmarks/offline_throughput.py --workload shared-prefix --skip-hf
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import random
import shlex
import sys
import time
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from plots import add_plot_dir, bar_panels, plot_path  # noqa: E402

import radixrt  # noqa: E402
from radixrt.runtime.models.loader import default_model_path  # noqa: E402

WORKLOADS = ("random", "shared-prefix")
FIRST_TOKEN_ID = 100  # prompts use ids FIRST_TOKEN_ID..vocab-1, clear of the special tokens
AGREEMENT_PREFIX = 8  # greedy outputs are compared on their first this many tokens


@dataclass
class Workload:
    name: str
    prompts: list[list[int]]
    output_lens: list[int]


@dataclass
class Result:
    system: str
    requests: int
    output_tokens: int  # useful tokens only
    seconds: float
    outputs: list[list[int]]
    hit_rate: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0


# --- arguments ---------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workload", choices=(*WORKLOADS, "all"), default="all")
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--min-prompt", type=int, default=32)
    p.add_argument("--max-prompt", type=int, default=256)
    p.add_argument("--min-output", type=int, default=16)
    p.add_argument("--max-output", type=int, default=128)
    p.add_argument("--prefix-len", type=int, default=512, help="shared-prefix: common prefix")
    p.add_argument("--min-suffix", type=int, default=16, help="shared-prefix: unique suffix")
    p.add_argument("--max-suffix", type=int, default=64)
    p.add_argument("--min-shared-output", type=int, default=16, help="shared-prefix: outputs")
    p.add_argument("--max-shared-output", type=int, default=64)
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--max-total-tokens", type=int, default=32768, help="radixrt KV pool")
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    p.add_argument("--skip-hf", action="store_true", help="run radixrt only")
    p.add_argument("--profile", action="store_true", help="cProfile radixrt's generate calls")
    add_plot_dir(p)
    args = p.parse_args(argv)
    if args.quick:
        args.num_requests, args.hf_batch_size = 8, 4
        args.min_prompt, args.max_prompt, args.min_output, args.max_output = 8, 32, 4, 16
        args.prefix_len, args.min_suffix, args.max_suffix = 64, 4, 16
        args.min_shared_output, args.max_shared_output = 4, 16
        args.max_total_tokens = min(args.max_total_tokens, 4096)
    return args


# --- request sets ------------------------------------------------------------------------------
def random_ids(rng: random.Random, n: int, vocab_size: int) -> list[int]:
    return [rng.randrange(FIRST_TOKEN_ID, vocab_size) for _ in range(n)]


def random_workload(args: argparse.Namespace, vocab_size: int) -> Workload:
    rng = random.Random(args.seed)
    prompts, output_lens = [], []
    for _ in range(args.num_requests):
        prompts.append(random_ids(rng, rng.randint(args.min_prompt, args.max_prompt), vocab_size))
        output_lens.append(rng.randint(args.min_output, args.max_output))
    return Workload("random", prompts, output_lens)


def shared_prefix_workload(args: argparse.Namespace, vocab_size: int) -> Workload:
    rng = random.Random(args.seed + 1)
    prefix = random_ids(rng, args.prefix_len, vocab_size)
    prompts, output_lens = [], []
    for _ in range(args.num_requests):
        suffix = random_ids(rng, rng.randint(args.min_suffix, args.max_suffix), vocab_size)
        prompts.append(prefix + suffix)
        output_lens.append(rng.randint(args.min_shared_output, args.max_shared_output))
    return Workload("shared-prefix", prompts, output_lens)


def build_workloads(args: argparse.Namespace, vocab_size: int) -> list[Workload]:
    names = WORKLOADS if args.workload == "all" else (args.workload,)
    makers = {"random": random_workload, "shared-prefix": shared_prefix_workload}
    return [makers[name](args, vocab_size) for name in names]


# --- radixrt -----------------------------------------------------------------------------------
def greedy(max_tokens: int) -> radixrt.SamplingParams:
    return radixrt.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def run_radixrt(engine: Any, work: Workload, profile: bool) -> Result:
    engine.flush_cache()  # each workload starts cold, so its hit rate is its own
    before = engine.stats()
    params = [greedy(n) for n in work.output_lens]
    profiler = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    outs = engine.generate(work.prompts, params)
    if profiler is not None:
        profiler.disable()
    seconds = time.perf_counter() - start
    after = engine.stats()
    for out, want in zip(outs, work.output_lens):
        assert out.completion_tokens == want, (out.completion_tokens, want)
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    cached = after["cached_tokens"] - before["cached_tokens"]
    if profiler is not None:
        print_profile(profiler, work.name)
    tokens = sum(out.completion_tokens for out in outs)
    outputs = [list(out.token_ids) for out in outs]
    return Result("radixrt", len(outs), tokens, seconds, outputs, cached / max(prompt, 1))


def print_profile(profiler: cProfile.Profile, name: str, top: int = 20) -> None:
    buf = io.StringIO()
    pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(top)
    print(f"\n--- cProfile of radixrt, {name}: top {top} by tottime ---")
    print(buf.getvalue())


# --- Hugging Face baseline ---------------------------------------------------------------------
def load_hf() -> Any:
    from transformers import AutoModelForCausalLM

    folder, fname = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    return model.eval()


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # [batch, width]
    mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [batch, width]
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


@torch.inference_mode()
def hf_batch(model: Any, prompts: list[list[int]], output_lens: list[int]) -> list[list[int]]:
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    ids, mask = left_pad(prompts, pad_id)
    steps = max(output_lens)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=steps,
        min_new_tokens=steps,  # masks EOS, like ignore_eos
        do_sample=False,
        pad_token_id=pad_id,
    )  # [batch, width + steps]
    new = out[:, ids.shape[1] :]
    assert new.shape[1] == steps, (new.shape, steps)
    return [new[row, :n].tolist() for row, n in enumerate(output_lens)]


def run_hf(model: Any, work: Workload, batch_size: int) -> Result:
    outputs: list[list[int]] = []
    start = time.perf_counter()
    for lo in range(0, len(work.prompts), batch_size):
        hi = lo + batch_size
        outputs += hf_batch(model, work.prompts[lo:hi], work.output_lens[lo:hi])
    seconds = time.perf_counter() - start
    tokens = sum(len(o) for o in outputs)
    return Result("hf-static", len(outputs), tokens, seconds, outputs)


# --- reporting ---------------------------------------------------------------------------------
def agreement(a: Result, b: Result) -> int:
    """Requests whose first AGREEMENT_PREFIX greedy tokens are the same in both systems."""
    return sum(x[:AGREEMENT_PREFIX] == y[:AGREEMENT_PREFIX] for x, y in zip(a.outputs, b.outputs))


def print_workload(work: Workload, results: list[Result]) -> None:
    prompt_tokens = sum(len(p) for p in work.prompts)
    print(f"\n== workload {work.name}: {len(work.prompts)} requests, "
          f"{prompt_tokens} prompt tokens, {sum(work.output_lens)} output tokens ==")
    head = f"{'system':<10} {'requests':>8} {'out tokens':>10} {'seconds':>9} {'out tok/s':>10}"
    print(head)
    print("-" * len(head))
    for r in results:
        print(f"{r.system:<10} {r.requests:>8} {r.output_tokens:>10} "
              f"{r.seconds:>9.2f} {r.tokens_per_s:>10.1f}")
    rt = results[0]
    print(f"radixrt cache hit rate: {rt.hit_rate:.1%}")
    if len(results) > 1:
        hf = results[1]
        print(f"radixrt / HF throughput: {rt.tokens_per_s / hf.tokens_per_s:.2f}x")
        print(f"greedy agreement (first {AGREEMENT_PREFIX} tokens): "
              f"{agreement(rt, hf)}/{rt.requests} requests")


def print_summary(rows: list[tuple[Workload, list[Result]]], args: argparse.Namespace) -> None:
    hf_cols = "" if args.skip_hf else " HF tok/s | speed-up |"
    print("\n| workload | requests | output tokens | radixrt tok/s | cache hit |" + hf_cols)
    print("|---|---:|---:|---:|---:|" + ("" if args.skip_hf else "---:|---:|"))
    for work, results in rows:
        rt = results[0]
        line = (f"| {work.name} | {rt.requests} | {rt.output_tokens} | "
                f"{rt.tokens_per_s:.1f} | {rt.hit_rate:.0%} |")
        if not args.skip_hf:
            hf = results[1]
            line += f" {hf.tokens_per_s:.1f} | {rt.tokens_per_s / hf.tokens_per_s:.2f}x |"
        print(line)
    print(f"\nfloat32, CPU threads: {torch.get_num_threads()}, HF batch size {args.hf_batch_size}, "
          f"page size {args.page_size}")
    command = " ".join(shlex.quote(a) for a in [os.path.basename(sys.executable), *sys.argv])
    print(f"command: {command}")


# --- main --------------------------------------------------------------------------------------
def warm_up(engine: Any, hf_model: Any | None, vocab_size: int) -> None:
    rng = random.Random(12345)
    prompts = [random_ids(rng, 12, vocab_size), random_ids(rng, 20, vocab_size)]
    engine.generate(prompts, greedy(4))
    if hf_model is not None:
        hf_batch(hf_model, prompts, [4, 4])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # denormal floats slow HF's forward pass on the CPU by 15-30x (radixrt's not): flush them
    # to zero before torch starts its threads, for every system alike
    torch.set_flush_denormal(True)
    engine = radixrt.Engine(
        model="default",
        dtype="float32",
        max_total_tokens=args.max_total_tokens,
        page_size=args.page_size,
    )
    hf_model = None if args.skip_hf else load_hf()
    vocab_size = engine.model_config.vocab_size
    warm_up(engine, hf_model, vocab_size)
    rows: list[tuple[Workload, list[Result]]] = []
    for work in build_workloads(args, vocab_size):
        results = [run_radixrt(engine, work, args.profile)]
        if hf_model is not None:
            results.append(run_hf(hf_model, work, args.hf_batch_size))
        print_workload(work, results)
        rows.append((work, results))
    print_summary(rows, args)
    plot_summary(rows, args.plot_dir)


def plot_summary(rows: list[tuple[Workload, list[Result]]], plot_dir: str | None) -> None:
    """Output tokens/s of radixrt and HF on each workload, with the speed-up."""
    names = list(dict.fromkeys(r.system for _, results in rows for r in results))
    series = {name: [next((r.tokens_per_s for r in results if r.system == name), 0.0)
                     for _, results in rows] for name in names}
    speedups = ", ".join(f"{work.name} {results[0].tokens_per_s / results[1].tokens_per_s:.2f}x"
                         for work, results in rows if len(results) > 1)
    bar_panels(plot_path("offline_throughput", plot_dir), "Offline batch generation (Engine vs HF)",
               [work.name for work, _ in rows],
               [("output tokens/s (higher is better)", series)],
               f"radixrt over HF: {speedups}" if speedups else "")


if __name__ == "__main__":
    main()
