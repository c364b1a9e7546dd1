"""Decode speed of a mixture of experts against a dense model with the same active parameters,
radixrt beside HF transformers on the same random weights, in one run, on this CPU.

Two Qwen3-style checkpoints are built with transformers' own classes (random weights, nothing
downloaded) and saved to a temporary folder with the default model's tokenizer (so the
vocabulary is its 49152 tokens):

- moe:   every layer's MLP is --experts experts of --expert-inter, top --top-k per token;
- dense: the same attention, one MLP of top_k x expert_inter: the same parameters per token.

For each model and batch size, greedy decode of --output-len tokens after a --prompt-len prompt
of random ids: radixrt.Engine times only its decode steps (the prefill step is not timed); HF
transformers' generate() is timed at --output-len new tokens and at 1 (the prefill), and the
difference is its decode time. Medians of --runs.

What it reports: tokens/s of each (model, batch, system), radixrt / HF per model and batch, and
the MoE step's cost against the dense step's (MoE ms per step / dense ms per step) beside what
the weights explain. A decode step is bound by the weights it reads: the dense step reads all of
its MLP, of the size of top_k experts; the MoE step reads the experts its tokens chose, which at
batch 1 is top_k of them (the same bytes) and at batch b is the union of b tokens' choices,
expected E (1 - (1 - k/E)^b) for uniform routing. "explained" is the ratio of those bytes
(weights of the whole model, in float32); a measured ratio near it means the MoE block costs
what the parameters it runs explain (the step's tokens grouped by expert, one product per chosen
expert), and one above it, time spent beyond them. docs/plots/moe.png draws both.

    python benchmarks/moe.py             # batches 1 and 8, a few minutes on 2 cores
    python benchmarks/moe.py --quick     # tiny sizes (a smoke test)
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from decode_peers import add_decode_args, hf_decode, radixrt_decode, random_prompts  # noqa: E402
from plots import add_plot_dir, bar_panels, plot_path  # noqa: E402


@dataclass(frozen=True)
class Row:
    model: str
    batch: int
    system: str
    tokens_per_s: float
    ms_per_step: float


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--expert-inter", type=int, default=512)
    add_decode_args(p, output_len=48)
    add_plot_dir(p)
    args = p.parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.experts, args.expert_inter = 128, 2, 8, 64
        args.top_k, args.batches = 2, [1, 4]
        args.prompt_len, args.output_len, args.runs = 16, 8, 1
    if args.output_len < 2 or not 1 <= args.top_k <= args.experts:
        p.error("--output-len >= 2 and 1 <= --top-k <= --experts")
    return args


def build_models(args: argparse.Namespace, folder: str) -> dict[str, Any]:
    """name -> (checkpoint folder, the HF model): the MoE and its dense twin."""
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from radixrt.runtime.models.loader import load_tokenizer

    tokenizer = load_tokenizer("default")
    args.vocab = len(tokenizer)
    heads = max(args.hidden // 64, 1)
    shared = dict(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                  num_attention_heads=heads, num_key_value_heads=max(heads // 2, 1),
                  head_dim=64, max_position_embeddings=1024, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2, pad_token_id=2)
    configs = {
        "moe": (Qwen3MoeForCausalLM, Qwen3MoeConfig(
            **shared, intermediate_size=args.expert_inter * args.top_k,
            moe_intermediate_size=args.expert_inter, num_experts=args.experts,
            num_experts_per_tok=args.top_k, norm_topk_prob=True)),
        "dense": (Qwen3ForCausalLM, Qwen3Config(
            **shared, intermediate_size=args.expert_inter * args.top_k)),
    }
    out = {}
    for name, (cls, config) in configs.items():
        torch.manual_seed(args.seed)
        model = cls(config).eval()
        path = os.path.join(folder, name)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        out[name] = (path, model)
    return out


def radixrt_row(name: str, path: str, batch: int, args: argparse.Namespace) -> Row:
    prompts = random_prompts(args.vocab, args.prompt_len, batch, args.seed)
    return Row(name, batch, "radixrt", *radixrt_decode(path, prompts, args.output_len, args.runs))


def hf_row(name: str, model: Any, batch: int, args: argparse.Namespace) -> Row:
    prompts = random_prompts(args.vocab, args.prompt_len, batch, args.seed)
    return Row(name, batch, "HF transformers", *hf_decode(model, prompts, args.output_len,
                                                          args.runs))


def explained_ratio(args: argparse.Namespace, batch: int) -> float:
    """Bytes the MoE step reads over the dense step's: the same but for the experts touched."""
    experts, k = args.experts, args.top_k
    heads = max(args.hidden // 64, 1)
    attention = args.hidden * 64 * (2 * heads + 2 * max(heads // 2, 1))
    expert = 3 * args.hidden * args.expert_inter
    rest = args.layers * attention + 2 * args.vocab * args.hidden  # embedding row + LM head
    touched = experts * (1 - (1 - k / experts) ** batch)
    moe = rest + args.layers * (touched * expert + experts * args.hidden)  # + the router
    return moe / (rest + args.layers * k * expert)


def report(rows: list[Row], args: argparse.Namespace) -> list[str]:
    def find(model: str, batch: int, system: str) -> Row:
        return next(r for r in rows if (r.model, r.batch, r.system) == (model, batch, system))

    lines = [f"MoE: {args.experts} experts of {args.expert_inter}, top {args.top_k}; dense: one "
             f"MLP of {args.expert_inter * args.top_k}; hidden {args.hidden}, {args.layers} "
             f"layers, vocab {args.vocab}; prompt {args.prompt_len}, {args.output_len} tokens",
             f"{'model':6} {'batch':>5} {'system':16} {'tok/s':>9} {'ms/step':>9}"]
    lines += [f"{r.model:6} {r.batch:>5} {r.system:16} {r.tokens_per_s:>9.1f} "
              f"{r.ms_per_step:>9.2f}" for r in rows]
    for batch in args.batches:
        for model in ("moe", "dense"):
            ours, peer = find(model, batch, "radixrt"), find(model, batch, "HF transformers")
            lines.append(f"batch {batch} {model}: radixrt / HF = "
                         f"{ours.tokens_per_s / peer.tokens_per_s:.2f}x")
        for system in ("radixrt", "HF transformers"):
            ratio = find("moe", batch, system).ms_per_step / find("dense", batch,
                                                                     system).ms_per_step
            lines.append(f"batch {batch} {system}: MoE step / dense step (same active "
                         f"parameters) = {ratio:.2f} (the weights read explain "
                         f"{explained_ratio(args, batch):.2f})")
    return lines


def draw(rows: list[Row], args: argparse.Namespace) -> str | None:
    groups = [f"{m} b{b}" for b in args.batches for m in ("moe", "dense")]
    series: dict[str, list[float]] = {}
    for system in ("radixrt", "HF transformers"):
        series[system] = [next(r.tokens_per_s for r in rows if (r.model, r.batch, r.system)
                               == (m, b, system)) for b in args.batches for m in ("moe", "dense")]
    ratios: dict[str, list[float]] = {
        system: [next(r.ms_per_step for r in rows if (r.model, r.batch, r.system)
                      == ("moe", b, system))
                 / next(r.ms_per_step for r in rows if (r.model, r.batch, r.system)
                        == ("dense", b, system)) for b in args.batches]
        for system in ("radixrt", "HF transformers")}
    ratios["explained by the weights read"] = [explained_ratio(args, b) for b in args.batches]
    path = plot_path("moe", args.plot_dir)
    first = bar_panels(path, "Decode: a mixture of experts and its dense twin (same active "
                       "parameters), this CPU", groups, [("decode tokens/s", series)])
    if first is None:
        return None
    ratio_path = plot_path("moe_step_ratio", args.plot_dir)
    bar_panels(ratio_path, "MoE step time / dense step time (1 = the active parameters "
               "explain it)", [f"batch {b}" for b in args.batches], [("ratio", ratios)])
    return first


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as folder:
        models = build_models(args, folder)
        for batch in args.batches:
            for name, (path, model) in models.items():
                rows.append(radixrt_row(name, path, batch, args))
                rows.append(hf_row(name, model, batch, args))
    lines = report(rows, args)
    print(f"# benchmarks/moe.py {' '.join(sys.argv[1:])} "
          f"({datetime.date.today()}, {torch.get_num_threads()} threads)")
    print("\n".join(lines))
    if draw(rows, args) is None:
        print("plot skipped (no matplotlib)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
