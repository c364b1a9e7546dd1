"""Many LoRA adapters on one base model, mixed in one batch, against the base model alone and
against one adapter merged into the weights -- the same work in one run.

The base is the default model's weights as a float32 safetensors checkpoint (transformers reads
the GGUF file, the folder is written once per run), so that the merged model (PEFT's
merge_and_unload of one adapter, saved beside it) has the same weight format. The adapters are
random PEFT LoRA adapters of rank --rank on every projection (q, k, v, o, gate, up, down; the
"all-linear" fine-tune), made here by PEFT.

Load: --requests requests (prompts of --prompt-len tokens, none shared), greedy, --max-tokens
tokens each (ignore_eos), submitted at once to radixrt.Engine (speculative decoding off: one
token a step); the requests take the adapters round-robin. Configurations:

  base          the base model, no adapter
  merged        one adapter merged into the weights (a model of its own: one adapter only)
  1 adapter     every request under the same adapter (the LoRA products of one slot)
  4 / 16 mixed  the requests spread over 4 / 16 adapters, all in the same forward passes
                (--max-loras-per-batch 16)

Each configuration is warmed up first with one request per adapter (so every adapter was read
from its folder into memory once: the steady state). Measured per configuration (median of
--runs, configurations interleaved): output tokens/s
(wall, submission to the last token), the decode step (ms: the wall time of the steps after
the last first token, per step), the bytes a decode step reads against the base's (the weights
and the adapters' slots: the step's floor where reading weights is its time), and the time to
first token (p50 over the requests). The table gives each against the base; the goal is 16
mixed adapters at <= 1.3x the base's step.

    python benchmarks/lora.py           # ~3 minutes on 2 cores
    python benchmarks/lora.py --quick   # a tiny random-weight Llama, 4 requests, 2 adapters
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from plots import add_plot_dir, bar_panels, plot_path  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the adapters the tests make

from lora_adapters import make_adapter  # noqa: E402

import radixrt  # noqa: E402
from radixrt.runtime.models.loader import default_model_path, load_model  # noqa: E402

DEFAULT_JSON = os.path.join(HERE, "results", "lora.json")
FIRST_TOKEN_ID = 100  # prompt ids clear of the special tokens
STEP_GOAL = 1.3  # 16 mixed adapters' step against the base's


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--adapters", type=int, nargs="+", default=[1, 4, 16],
                   help="numbers of adapters the requests are spread over")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", default=DEFAULT_JSON, help="write the results here")
    p.add_argument("--quick", action="store_true",
                   help="a smoke test: a tiny random-weight Llama, 4 requests, 1 run")
    add_plot_dir(p)
    args = p.parse_args(argv)
    if args.quick:
        args.requests, args.max_tokens, args.runs, args.adapters = 4, 8, 1, [1, 2]
        args.prompt_len = 16
    return args


def build(root: str, rank: int, count: int, tiny: bool) -> dict[str, Any]:
    """The base checkpoint, `count` adapters and the first one merged, in `root`. tiny: a
    tiny random-weight Llama instead of the default model (the smoke test's)."""
    from transformers import AutoModelForCausalLM

    tokenizer = load_model("default").tokenizer
    base = os.path.join(root, "base")
    if tiny:
        from tiny_models import build_tiny

        hf = build_tiny("llama-yarn", base, tokenizer)
    else:
        folder, fname = default_model_path()
        read = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname,
                                                    dtype=torch.float32)
        hf = type(read)(read.config).eval()  # the same weights, no longer marked as GGUF's
        hf.load_state_dict(read.state_dict())
        hf.save_pretrained(base)
        tokenizer.save_pretrained(base)
    spec = {"r": rank, "lora_alpha": 2 * rank, "targets": "all"}
    adapters = {}
    for i in range(count):
        model = make_adapter(copy.deepcopy(hf), os.path.join(root, f"a{i}"), spec, i, std=0.02)
        if i == 0:
            merged = os.path.join(root, "merged")
            model.merge_and_unload().save_pretrained(merged)
            tokenizer.save_pretrained(merged)
        adapters[f"a{i}"] = os.path.join(root, f"a{i}")
    return {"base": base, "merged": os.path.join(root, "merged"), "adapters": adapters}


def prompts(args: argparse.Namespace) -> list[list[int]]:
    return [[FIRST_TOKEN_ID + (7 * r + 13 * i) % 20000 for i in range(args.prompt_len)]
            for r in range(args.requests)]


def run_once(engine: radixrt.Engine, args: argparse.Namespace,
             loras: list[str | None]) -> dict[str, float]:
    params = radixrt.SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    rids = [engine.submit(p, params, lora=lora) for p, lora in zip(prompts(args), loras)]
    first: dict[int, float] = {}
    tokens, steps_after, decode_start = 0, 0, None
    while engine.scheduler.has_work:
        chunks = engine.step()
        now = time.perf_counter()
        for chunk in chunks:
            tokens += len(chunk.token_ids)
            if chunk.token_ids and chunk.rid not in first:
                first[chunk.rid] = now - start
        if decode_start is None and len(first) == len(rids):
            decode_start = now
        elif decode_start is not None:
            steps_after += 1
    end = time.perf_counter()
    for rid in rids:
        engine.take_output(rid)
    step_ms = 1e3 * (end - decode_start) / steps_after if decode_start and steps_after else 0.0
    return {"tok_s": tokens / (end - start), "step_ms": step_ms,
            "ttft_p50_s": statistics.median(first.values())}


def configurations(args: argparse.Namespace, paths: dict[str, Any]) -> dict[str, Any]:
    """name -> (model folder, engine options, each request's adapter)."""
    names = list(paths["adapters"])
    lora_paths = [f"{n}={p}" for n, p in paths["adapters"].items()]
    served = dict(lora_paths=lora_paths, max_loras_per_batch=max(args.adapters),
                  max_lora_rank=args.rank)
    out: dict[str, Any] = {"base": (paths["base"], {}, [None] * args.requests),
                           "merged": (paths["merged"], {}, [None] * args.requests)}
    for k in args.adapters:
        label = "1 adapter" if k == 1 else f"{k} mixed"
        out[label] = (paths["base"], served, [names[r % k] for r in range(args.requests)])
    return out


def bytes_bound(engine: radixrt.Engine, adapters: int) -> float:
    """What a decode step reads against the base model's step: the weights, and the slots of
    `adapters` adapters (each slot as wide as the largest rank, a fused projection's parts
    stacked) -- the floor of the step's ratio where reading weights is the step's time."""
    base = sum(engine.worker.model.weight_formats().values())
    manager = engine.worker.lora
    if manager is None or not adapters:
        return 1.0
    per_slot = manager.slot_bytes / manager.num_slots
    return (base + adapters * per_slot) / base


def measure(args: argparse.Namespace, paths: dict[str, Any]) -> dict[str, dict[str, float]]:
    configs = configurations(args, paths)
    models = {folder: load_model(folder) for folder in {c[0] for c in configs.values()}}
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
    bounds: dict[str, float] = {}
    for _ in range(args.runs):
        for name, (folder, options, loras) in configs.items():  # interleaved: drift shared
            engine = radixrt.Engine(models[folder], speculative_algorithm=None,
                                    max_total_tokens=args.requests * (
                                        args.prompt_len + args.max_tokens) + 1024, **options)
            try:
                # warm-up: a request per adapter (each read from its folder into the slots)
                run_once(engine, args, list(dict.fromkeys(loras)))
                engine.scheduler.flush_cache()
                samples[name].append(run_once(engine, args, loras))
                bounds[name] = bytes_bound(engine, len(set(loras) - {None}))
            finally:
                engine.close()
    return {name: {**{key: statistics.median(s[key] for s in runs) for key in runs[0]},
                   "bytes_bound": bounds[name]} for name, runs in samples.items()}


def table(results: dict[str, dict[str, float]]) -> str:
    base = results["base"]
    rows = ["| configuration | output tok/s | step ms | step vs base | bytes read vs base | "
            "TTFT p50 s |", "|---|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        ratio = r["step_ms"] / base["step_ms"] if base["step_ms"] else 0.0
        rows.append(f"| {name} | {r['tok_s']:.1f} | {r['step_ms']:.1f} | {ratio:.2f}x | "
                    f"{r['bytes_bound']:.2f}x | {r['ttft_p50_s']:.2f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="radixrt-lora-bench-") as root:
        paths = build(root, args.rank, max(args.adapters), args.quick)
        results = measure(args, paths)
    print(f"radixrt LoRA: {args.requests} requests x {args.max_tokens} tokens, prompts of "
          f"{args.prompt_len}, rank {args.rank} on every projection, "
          f"{torch.get_num_threads()} threads")
    print(table(results))
    most = [n for n in results if n.endswith("mixed")]
    if most:
        worst = results[most[-1]]["step_ms"] / max(results["base"]["step_ms"], 1e-9)
        print(f"{most[-1]}: step {worst:.2f}x the base's (goal <= {STEP_GOAL}x)")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)
    names = list(results)
    path = bar_panels(
        plot_path("lora", args.plot_dir), "LoRA adapters mixed in one batch (radixrt, CPU)",
        names, [("output tokens/s", {"radixrt": [results[n]["tok_s"] for n in names]}),
                ("decode step, ms", {"radixrt": [results[n]["step_ms"] for n in names]}),
                ("TTFT p50, s", {"radixrt": [results[n]["ttft_p50_s"] for n in names]})],
        caption=f"{args.requests} requests, rank {args.rank} adapters on every projection; "
                "benchmarks/lora.py")
    if path is None:
        print("plot skipped (no matplotlib)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
