"""What multi-head latent attention buys a radix-tree runtime, and its speed against HF
transformers on the same random weights, in one run, on this CPU.

Two checkpoints are built with transformers' own classes (random weights, nothing downloaded)
and saved with the default model's tokenizer (its 49152-token vocabulary):

- mla: DeepSeek-V3's architecture, every layer dense (no experts: the attention is what
  differs), --heads heads of 64 + 32 query-key dims and 64 value dims over a latent of
  --latent + 32 dims;
- gqa: its twin with Llama's attention: the same width, heads and MLP, --heads / 2 KV heads
  of 64 dims (a usual 2:1 grouping).

1. The tree under a fixed KV budget: --kv-mib of KV memory (the pool gets budget // its bytes per
   token), --docs documents of --doc-words words, each asked --turns questions in turn (doc 0's
   first, doc 1's first, ..., then every document's second ...), each request timed to its
   first token (the whole request: one token). A
   latent row is smaller than per-head K and V, so the same bytes hold more of the tree: the
   cached fraction of the prompt tokens and the time to first token show what that is worth.
   HF transformers (no cache across requests) computes every prompt whole: its TTFT is the
   peer's.
2. Decode: greedy tokens/s at batches 1 and 8 after a --prompt-len prompt, radixrt (its decode
   steps timed) against transformers' generate() (time at --output-len new tokens minus at 1).
   Medians of --runs.

    python benchmarks/latent_attention.py            # a few minutes on 2 cores
    python benchmarks/latent_attention.py --quick    # tiny sizes (a smoke test)
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from decode_peers import add_decode_args, hf_decode, radixrt_decode, random_prompts  # noqa: E402
from plots import add_plot_dir, bar_panels, plot_path  # noqa: E402

import radixrt  # noqa: E402

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
         "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi",
         "chi", "psi", "omega")
MODELS = ("mla", "gqa")


@dataclass(frozen=True)
class TreeRow:
    model: str
    system: str
    kv_bytes_per_token: int
    pool_tokens: int
    cached_fraction: float
    ttft_ms: float  # median over the requests


@dataclass(frozen=True)
class DecodeRow:
    model: str
    batch: int
    system: str
    tokens_per_s: float


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--latent", type=int, default=128, help="kv_lora_rank")
    p.add_argument("--kv-mib", type=float, default=10.0, help="the KV budget of part 1")
    p.add_argument("--docs", type=int, default=6)
    p.add_argument("--doc-words", type=int, default=160)
    p.add_argument("--turns", type=int, default=3)
    add_decode_args(p, output_len=32)
    add_plot_dir(p)
    args = p.parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.heads, args.latent = 128, 2, 4, 32
        args.kv_mib, args.docs, args.doc_words, args.turns = 0.4, 3, 60, 2
        args.batches, args.prompt_len, args.output_len, args.runs = [2], 16, 8, 1
    if args.heads % 2 or args.output_len < 2:
        p.error("--heads must be even (the GQA twin has half as many KV heads) and "
                "--output-len >= 2")
    return args


def build_models(args: argparse.Namespace, folder: str) -> dict[str, tuple[str, Any]]:
    """name -> (checkpoint folder, the HF model)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, LlamaConfig, LlamaForCausalLM

    from radixrt.runtime.models.loader import load_tokenizer

    tokenizer = load_tokenizer("default")
    args.vocab = len(tokenizer)
    shared = dict(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                  num_attention_heads=args.heads, intermediate_size=2 * args.hidden,
                  max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=1,
                  eos_token_id=2, pad_token_id=2)
    configs = {
        "mla": (DeepseekV3ForCausalLM, DeepseekV3Config(
            **shared, num_key_value_heads=args.heads, kv_lora_rank=args.latent,
            q_lora_rank=args.hidden // 2, qk_rope_head_dim=32, qk_nope_head_dim=64,
            v_head_dim=64, first_k_dense_replace=args.layers, n_routed_experts=8,
            num_experts_per_tok=2, n_group=1, topk_group=1, moe_intermediate_size=64)),
        "gqa": (LlamaForCausalLM, LlamaConfig(**shared, num_key_value_heads=args.heads // 2,
                                              head_dim=64)),
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


def documents(args: argparse.Namespace) -> list[str]:
    """Every turn's prompt, in the order asked: each document with a question after it."""
    rng = random.Random(args.seed)
    docs = [f"Document {d}: " + " ".join(rng.choice(WORDS) for _ in range(args.doc_words))
            for d in range(args.docs)]
    return [f"{docs[d]}\nQuestion {t}: which word comes first?\nAnswer:"
            for t in range(args.turns) for d in range(args.docs)]


def kv_bytes(path: str) -> int:
    from radixrt.runtime.models.loader import inspect_model
    from radixrt.runtime.worker.capacity import kv_bytes_per_token

    return kv_bytes_per_token(inspect_model(path).kv_layout, 4)  # float32 on the CPU


def tree_row(name: str, path: str, args: argparse.Namespace) -> TreeRow:
    per_token = kv_bytes(path)
    pool = int(args.kv_mib * (1 << 20)) // per_token
    engine = radixrt.Engine(path, max_total_tokens=pool)
    params = radixrt.SamplingParams(max_tokens=1, temperature=0)
    try:
        ttfts = []
        for prompt in documents(args):
            start = time.perf_counter()
            out = engine.generate([prompt], params)[0]
            ttfts.append(time.perf_counter() - start)
            if out.finish_reason not in ("length", "stop"):
                raise SystemExit(f"{name}: a request ended {out.finish_reason!r} (a pool of "
                                 f"{pool} tokens): give more --kv-mib")
        stats = engine.stats()
    finally:
        engine.close()
    return TreeRow(name, "radixrt", per_token, pool,
                   stats["cached_tokens"] / stats["prompt_tokens"], 1000 * statistics.median(ttfts))


def hf_tree_row(name: str, path: str, model: Any, args: argparse.Namespace) -> TreeRow:
    from radixrt.runtime.models.loader import load_tokenizer

    tokenizer = load_tokenizer(path)
    ttfts = []
    for prompt in documents(args):
        ids = torch.tensor([tokenizer.encode(prompt)])
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                           max_new_tokens=1, pad_token_id=2)
        ttfts.append(time.perf_counter() - start)
    return TreeRow(name, "HF transformers", 0, 0, 0.0, 1000 * statistics.median(ttfts))


def decode_rows(name: str, path: str, model: Any, batch: int,
                args: argparse.Namespace) -> list[DecodeRow]:
    prompts = random_prompts(args.vocab, args.prompt_len, batch, args.seed)
    ours = radixrt_decode(path, prompts, args.output_len, args.runs)[0]
    theirs = hf_decode(model, prompts, args.output_len, args.runs)[0]
    return [DecodeRow(name, batch, "radixrt", ours), DecodeRow(name, batch, "HF transformers",
                                                               theirs)]


def report(tree: list[TreeRow], decode: list[DecodeRow], args: argparse.Namespace) -> list[str]:
    turns = args.docs * args.turns
    lines = [f"models: hidden {args.hidden}, {args.layers} layers, {args.heads} heads; mla: "
             f"latent {args.latent} + 32; gqa: {args.heads // 2} KV heads of 64; vocab "
             f"{args.vocab}",
             f"1. the tree under {args.kv_mib:g} MiB of KV: {args.docs} documents of "
             f"{args.doc_words} words x {args.turns} turns ({turns} requests, timed to the first "
             "token)",
             "| model | system | KV bytes per token | pool tokens | prompt tokens cached | "
             "TTFT p50 (ms) |", "|---|---|---|---|---|---|"]
    lines += [f"| {r.model} | {r.system} | {r.kv_bytes_per_token or '-'} | "
              f"{r.pool_tokens or '-'} | {r.cached_fraction:.0%} | {r.ttft_ms:.1f} |"
              for r in tree]

    def find(rows: list[Any], **key: Any) -> Any:
        return next(r for r in rows if all(getattr(r, k) == v for k, v in key.items()))

    mla, gqa = find(tree, model="mla", system="radixrt"), find(tree, model="gqa", system="radixrt")
    lines.append(f"the latent holds {gqa.kv_bytes_per_token / mla.kv_bytes_per_token:.1f}x the "
                 f"tokens in the same bytes; TTFT mla / gqa = {mla.ttft_ms / gqa.ttft_ms:.2f}x")
    for model in MODELS:
        ours, peer = (find(tree, model=model, system=s) for s in ("radixrt", "HF transformers"))
        lines.append(f"{model}: radixrt TTFT / HF = {ours.ttft_ms / peer.ttft_ms:.2f}x")
    lines += ["2. decode", "| model | batch | system | tokens/s |", "|---|---|---|---|"]
    lines += [f"| {r.model} | {r.batch} | {r.system} | {r.tokens_per_s:.1f} |" for r in decode]
    for batch in args.batches:
        for model in MODELS:
            ours, peer = (find(decode, model=model, batch=batch, system=s)
                          for s in ("radixrt", "HF transformers"))
            lines.append(f"batch {batch} {model}: radixrt / HF = "
                         f"{ours.tokens_per_s / peer.tokens_per_s:.2f}x")
    return lines


def draw(tree: list[TreeRow], decode: list[DecodeRow], args: argparse.Namespace) -> str | None:
    systems = ("radixrt", "HF transformers")

    def tree_series(value: Any) -> dict[str, list[float]]:
        return {s: [next(value(r) for r in tree if (r.model, r.system) == (m, s))
                    for m in MODELS] for s in systems}

    panels = [("% of prompt tokens cached", tree_series(lambda r: 100 * r.cached_fraction)),
              ("TTFT p50 (ms)", tree_series(lambda r: r.ttft_ms))]
    for batch in args.batches:
        panels.append((f"decode tokens/s, batch {batch}", {
            s: [next(r.tokens_per_s for r in decode if (r.model, r.batch, r.system)
                     == (m, batch, s)) for m in MODELS] for s in systems}))
    return bar_panels(plot_path("latent_attention", args.plot_dir),
                      f"Latent attention (mla) and per-head K/V (gqa) under {args.kv_mib:g} MiB "
                      "of KV, and decode; this CPU", list(MODELS), panels)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tree: list[TreeRow] = []
    decode: list[DecodeRow] = []
    with tempfile.TemporaryDirectory() as folder:
        models = build_models(args, folder)
        for name, (path, model) in models.items():
            tree += [tree_row(name, path, args), hf_tree_row(name, path, model, args)]
        for batch in args.batches:
            for name, (path, model) in models.items():
                decode += decode_rows(name, path, model, batch, args)
    print(f"# benchmarks/latent_attention.py {' '.join(sys.argv[1:])} "
          f"({datetime.date.today()}, {torch.get_num_threads()} threads)")
    print("\n".join(report(tree, decode, args)))
    if draw(tree, decode, args) is None:
        print("plot skipped (no matplotlib)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
