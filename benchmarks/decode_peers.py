"""Greedy decode speed of radixrt and of HF transformers on the same checkpoint and the same
prompts, for the benchmarks that put the two side by side (moe.py, latent_attention.py):
radixrt.Engine times only its decode steps (decode_bandwidth.decode_once; the prefill step is
not timed); transformers' generate() is timed at output_len new tokens and at 1 (the prefill),
and the difference is its decode time. Medians of `runs`, after a warm-up."""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import torch
from decode_bandwidth import decode_once

import radixrt

FIRST_TOKEN_ID = 10  # prompts use ids FIRST_TOKEN_ID..vocab-1


def add_decode_args(p: argparse.ArgumentParser, output_len: int) -> None:
    """The decode comparison's flags (and --quick)."""
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=output_len)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny sizes, one run (a smoke test)")


def random_prompts(vocab: int, prompt_len: int, batch: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed + batch)
    return [[rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(prompt_len)]
            for _ in range(batch)]


def radixrt_decode(path: str, prompts: list[list[int]], output_len: int,
                   runs: int) -> tuple[float, float]:
    """(tokens/s, ms per decode step) of radixrt on the checkpoint folder `path`."""
    pool = sum(len(p) + output_len for p in prompts) + 64
    engine = radixrt.Engine(path, max_total_tokens=pool)
    try:
        decode_once(engine, prompts, output_len)  # warm-up
        timed = [decode_once(engine, prompts, output_len) for _ in range(runs)]
    finally:
        engine.close()
    seconds, steps = statistics.median(s for s, _ in timed), timed[0][1]
    return len(prompts) * steps / seconds, 1000 * seconds / steps


def hf_decode(model: Any, prompts: list[list[int]], output_len: int,
              runs: int) -> tuple[float, float]:
    """(tokens/s, ms per decode step) of transformers' generate() on the same prompts."""
    ids = torch.tensor(prompts)

    def generate(new: int) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                           max_new_tokens=new, min_new_tokens=new, pad_token_id=2)
        return time.perf_counter() - start

    generate(output_len)  # warm-up
    seconds = statistics.median(generate(output_len) - generate(1) for _ in range(runs))
    steps = output_len - 1
    return len(prompts) * steps / seconds, 1000 * seconds / steps
