"""Where a batch-1 decode step of the default model spends its time, before and after packed
weights, in one run.

Two configurations of radixrt.Engine on the same GGUF file (speculative decoding off: one token
a step): "before" -- the weights dequantized to float32 and every op on PyTorch
(`weight_format="dequantized"`, RADIXRT_CPU_KERNELS=0: the step as it ran before packed weights),
and "after" -- the default (packed weights, the CPU kernels, the fused decode step). For each it
times --steps greedy decode steps after a --prompt-len prompt and splits each step into:

  forward        the model's layers (Worker._forward less the LM head and sampling)
  LM head        the logits' product (CausalLM.compute_logits)
  sampling       the sampler (Worker._sample)
  the rest       the Engine's own work around the pass (scheduling, bookkeeping, outputs)

and, apart, the weight products alone: every layer's projections applied to one row, as many
times as a step does (so "forward" less that is the per-layer work of norms, rotary, KV store
and attention). Median of --runs runs.

    python benchmarks/decode_breakdown.py            # ~1 minute on 2 cores
    python benchmarks/decode_breakdown.py --quick    # 8 steps, 1 run: a smoke test
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import radixrt  # noqa: E402
from radixrt.runtime.models.loader import CPU_KERNELS_ENV  # noqa: E402

FIRST_TOKEN_ID = 100  # prompt ids clear of the special tokens
CONFIGS = {  # name -> (Engine's weight_format, RADIXRT_CPU_KERNELS)
    "before (dequantized, PyTorch ops)": ("dequantized", "0"),
    "after (packed, CPU kernels)": ("auto", "1"),
}
PHASES = ("forward", "LM head", "sampling", "the rest")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--steps", type=int, default=128, help="decode steps timed per run")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="8 steps, 1 run (a smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.runs = 8, 1
    return args


class PhaseTimer:
    """Seconds spent in chosen methods of live objects (each wrapped on the instance)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, obj: Any, method: str, phase: str) -> None:
        inner: Callable[..., Any] = getattr(obj, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - start

        setattr(obj, method, timed)


def products_ms(model: Any, repeats: int = 20) -> float:
    """Milliseconds of one step's weight products alone: every projection of every layer on
    one row (the LM head apart)."""
    from radixrt.runtime.models.linear import BlockedLinear

    layers = [m for name, m in model.named_modules()
              if isinstance(m, BlockedLinear) and "lm_head" not in name]
    inputs = [torch.randn(1, m.in_features) for m in layers]
    with torch.inference_mode():
        for m, x in zip(layers, inputs):  # warm
            m(x)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for m, x in zip(layers, inputs):
                m(x)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(weight_format: str, kernels: str, args: argparse.Namespace) -> dict[str, float]:
    """Milliseconds per step of each phase (median over runs), the step, and the products."""
    os.environ[CPU_KERNELS_ENV] = kernels  # read when the model loads
    engine = radixrt.Engine(max_total_tokens=4096, speculative_algorithm="none",
                            weight_format=weight_format)
    try:
        worker, model = engine.worker, engine.worker.model
        timer = PhaseTimer()
        timer.wrap(worker, "_forward", "pass")
        timer.wrap(model, "compute_logits", "LM head")
        timer.wrap(worker, "_sample", "sampling")
        params = radixrt.SamplingParams(max_tokens=args.steps + 1, temperature=0, ignore_eos=True)
        runs: list[dict[str, float]] = []
        for r in range(args.runs + 1):  # the first run warms up
            prompt = [FIRST_TOKEN_ID + (7 * r + i) % 5000 for i in range(args.prompt_len)]
            engine.generate([prompt], radixrt.SamplingParams(max_tokens=1, temperature=0))
            timer.seconds.clear()
            start = time.perf_counter()
            engine.generate([prompt + [FIRST_TOKEN_ID]], params)
            total = time.perf_counter() - start
            s = {k: v * 1e3 / args.steps for k, v in timer.seconds.items()}
            step = total * 1e3 / args.steps
            runs.append({"forward": s["pass"] - s["LM head"] - s["sampling"],
                         "LM head": s["LM head"], "sampling": s["sampling"],
                         "the rest": step - s["pass"], "step": step})
        out = {k: statistics.median(run[k] for run in runs[1:]) for k in runs[0]}
        out["products"] = products_ms(model)
        return out
    finally:
        engine.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = {name: measure(fmt, kernels, args) for name, (fmt, kernels) in CONFIGS.items()}
    names = list(results)
    print(f"\nbatch-1 decode step of the default model, {args.steps} steps after a "
          f"{args.prompt_len}-token prompt, median of {args.runs} runs, "
          f"{torch.get_num_threads()} threads\n")
    print("| phase (ms per step) | " + " | ".join(names) + " | after / before |")
    print("|---|" + "---:|" * (len(names) + 1))
    for phase in (*PHASES, "step", "products"):
        label = {"step": "**the step**",
                 "products": "the layers' weight products alone, a call each"}.get(phase, phase)
        values = [results[n][phase] for n in names]
        ratio = values[-1] / values[0] if values[0] > 0 else float("nan")
        print(f"| {label} | " + " | ".join(f"{v:.2f}" for v in values) + f" | {ratio:.2f}x |")
    tok_s = [1e3 / results[n]["step"] for n in names]
    print(f"\ntokens/s: {tok_s[0]:.1f} -> {tok_s[-1]:.1f} ({tok_s[-1] / tok_s[0]:.2f}x)")
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
          f"command: python benchmarks/{os.path.basename(__file__)} {shlex.join(sys.argv[1:])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
