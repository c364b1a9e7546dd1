"""Speculative decoding from the radix tree: radixrt with it off and on, against llama.cpp's
`llama-server` without speculation and with its n-gram speculation, on the same prompts, greedy.

    python benchmarks/speculative.py              # both parts below, plot
    python benchmarks/speculative.py --quick      # fewer requests, shorter outputs
    python benchmarks/speculative.py --skip-llama-server --skip-curve

Part 1, serving (each system a server process on a free port, the same raw prompts over
/v1/completions, temperature 0, the outputs ending where the model ends them or at max_tokens):
five workloads at batch 1 (requests one after another) and batch 8 (8 at once): four that copy
text the model has seen — re-writing a JSON record from the prompt, editing a code file, an agent
loop whose tool output recurs in every turn, a few-shot transform — and free prose, which copies
nothing. Reported: output tokens/s of each system and on/off ratios; for radixrt its drafted and
accepted tokens per verified run (from /server_info) and tokens per model step; for llama-server
its own draft counters where its responses carry them.

Paired rounds, the verdict on the default: radixrt off and on, both servers up, take turns on
the same fresh prompts (prose at batch 1 and 8, json at 8), the order flipped every round; the
on/off ratio of every round and their median (--pairs rounds, default 6).

Part 2, the batch-size curve that sets the default of --speculative-max-batch-size: the Engine in
one process, drafting at every batch size vs off, on one copying workload and on prose, at batch
sizes 1..16: where drafting stops paying, a step should not draft.

llama-server: ../shared/llama-server (BUILD.md), `--spec-type ngram-simple` with its default
lookup (12-token n-grams, 48-token drafts) and, as a second row, a 3-token lookup like radixrt's.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
from plots import Curve, LinePanel, add_plot_dir, bar_panels, line_panels, plot_path  # noqa: E402
from serving_systems import (  # noqa: E402
    LLAMA_SERVER,
    System,
    llama_server_system,
    radixrt_system,
    running,
)

RT_OFF, RT_ON = "radixrt", "radixrt-spec"
LLAMA_OFF, LLAMA_NGRAM, LLAMA_NGRAM3 = "llama-server", "llama-ngram", "llama-ngram3"
WORKLOADS = ("json", "code", "agent", "few-shot", "prose")
COPYING = WORKLOADS[:-1]
# paired rounds: the workload that copies nothing (alone and in a batch), and one that copies
PAIRED = (("prose", 1), ("prose", 8), ("json", 8))
REQUEST_TIMEOUT_S = 600.0

NAMES = ["Ada Lovelace", "Grace Hopper", "Alan Turing", "Edsger Dijkstra", "Barbara Liskov",
         "Donald Knuth", "Margaret Hamilton", "John McCarthy", "Frances Allen", "Ken Thompson"]
CITIES = ["London", "New York", "Manchester", "Rotterdam", "Los Angeles", "Milwaukee", "Boston",
          "Paoli", "Peru", "New Orleans"]
TOOL_OUTPUT = ("search_results: [1] 'Radix trees store strings by shared prefixes; each edge holds "
               "a run of symbols.' [2] 'KV caches hold the keys and values of earlier tokens so a "
               "transformer does not recompute them.' [3] 'Speculative decoding drafts tokens "
               "cheaply and verifies them with the large model in one pass.'")
ANSWER = ("The sources say that radix trees share prefixes, that KV caches save recomputing "
          "earlier tokens, and that speculative decoding verifies cheap drafts in one pass.")
CODE = '''def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    total = 0.0
    out = []
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out
'''


def prompt(workload: str, i: int) -> str:
    """Request i of a workload (every i its own prompt: the shared parts recur)."""
    name, city = NAMES[i % len(NAMES)], CITIES[(3 * i) % len(CITIES)]
    if workload == "json":
        record = json.dumps({"name": name, "born": 1900 + 7 * i, "city": city,
                             "fields": ["mathematics", "computing"], "id": f"rec-{1000 + i}"})
        return f"Repeat this JSON record exactly:\n{record}\nRepeated:\n"
    if workload == "code":
        code = CODE.replace("moving_average", f"moving_average_{i}")
        return (f"Here is a Python function:\n```python\n{code}```\nThe same function with the "
                f"variable `total` renamed to `running_sum`:\n```python\n")
    if workload == "agent":  # the tool returns what it returned last turn
        turn = (f"User: what do the sources say about topic {i}?\nTool call: search('radix "
                f"tree kv cache speculative decoding')\nTool output: {TOOL_OUTPUT}\nAssistant:")
        return f"{turn} {ANSWER}\n{turn}"
    if workload == "few-shot":
        def shot(n: str, c: str, year: int) -> str:
            return f"Input: {n}, born {year} in {c}.\nOutput:"
        shots = "".join(shot(n, c, 1900 + j) + " " + json.dumps({"name": n, "born": 1900 + j,
                                                             "city": c}) + "\n\n"
                        for j, (n, c) in enumerate(zip(NAMES[:4], CITIES[:4], strict=True)))
        return shots + shot(name, city, 1000 + i)
    return (f"Once upon a time, a lighthouse keeper named {name} lived on rocky island number "
            f"{i} near {city}. Every evening, before the storms came,")


@dataclass
class Run:
    system: str
    workload: str
    batch: int
    seconds: float
    tokens: int
    drafted: int = 0
    accepted: int = 0
    verified: int = 0
    steps: int = 0
    trees: int = 0  # verified drafts that were trees, and tokens accepted on their branches
    branch: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def systems(args: argparse.Namespace) -> list[System]:
    ns = argparse.Namespace(max_total_tokens=args.max_total_tokens, radixrt_args="")
    out = [dataclasses.replace(radixrt_system(RT_OFF, ns, ["--speculative-algorithm", "none"]),
                               extra_body={}),
           dataclasses.replace(radixrt_system(RT_ON, ns, ["--speculative-algorithm", "radix"]),
                               extra_body={})]
    binary = args.llama_server or LLAMA_SERVER
    if not args.skip_llama_server and os.access(binary, os.X_OK):
        base = dataclasses.replace(llama_server_system(binary), extra_body={})
        out.append(base)
        out.append(dataclasses.replace(base, name=LLAMA_NGRAM,
                                       command=[*base.command, "--spec-type", "ngram-simple"]))
        out.append(dataclasses.replace(base, name=LLAMA_NGRAM3, command=[
            *base.command, "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
            "--spec-ngram-simple-size-m", "8"]))
    elif not args.skip_llama_server:
        print(f"llama-server: skipped ({binary} is not an executable; see BUILD.md beside it)")
    return out


def complete(http: httpx.Client, text: str, max_tokens: int) -> dict[str, Any]:
    response = http.post("/v1/completions", json={"model": "default", "prompt": text,
                                                  "max_tokens": max_tokens, "temperature": 0})
    response.raise_for_status()
    return response.json()


def run_workload(http: httpx.Client, system: str, workload: str, batch: int, requests: int,
                 max_tokens: int, base: int) -> Run:
    """`requests` requests of the workload, `batch` at a time; request ids from `base` on, so
    every run sends prompts its server has not answered before."""
    texts = [prompt(workload, base + i) for i in range(requests)]
    info0 = server_info(http, system)
    start = time.perf_counter()
    with ThreadPoolExecutor(batch) as pool:
        bodies = list(pool.map(lambda t: complete(http, t, max_tokens), texts))
    seconds = time.perf_counter() - start
    run = Run(system, workload, batch, seconds,
              sum(b["usage"]["completion_tokens"] for b in bodies))
    info1 = server_info(http, system)
    if info0 and info1:
        for field, key in (("drafted", "spec_drafted_tokens"), ("accepted", "spec_accepted_tokens"),
                           ("verified", "spec_verifications"), ("steps", "steps"),
                           ("trees", "spec_tree_verifications"),
                           ("branch", "spec_branch_accepted_tokens")):
            setattr(run, field, info1.get(key, 0) - info0.get(key, 0))
    for body in bodies:  # llama-server's own counters, where it reports them
        timings = body.get("timings") or {}
        run.drafted += int(timings.get("draft_n", 0))
        run.accepted += int(timings.get("draft_n_accepted", 0))
    return run


def server_info(http: httpx.Client, system: str) -> dict[str, Any]:
    if not system.startswith("radixrt"):
        return {}
    return http.get("/server_info").json()


def serve_part(args: argparse.Namespace) -> list[Run]:
    runs: list[Run] = []
    for system in systems(args):
        with running(system) as url, httpx.Client(base_url=url,
                                                  timeout=REQUEST_TIMEOUT_S) as http:
            complete(http, "Hello", 4)  # warm-up
            base = 1000
            for batch, requests in ((1, args.requests), (8, 8)):
                for workload in WORKLOADS:
                    base += 100
                    run = run_workload(http, system.name, workload, batch, requests,
                                       args.max_tokens, base)
                    runs.append(run)
                    print(f"{system.name:13s} {workload:9s} batch {batch}: {run.tokens:5d} tokens "
                          f"{run.seconds:6.2f} s {run.tokens_per_s:6.1f} tok/s"
                          + (f"  accepted {run.accepted}/{run.drafted}" if run.drafted else ""),
                          flush=True)
    return runs


def paired_part(args: argparse.Namespace) -> dict[tuple[str, int], list[float]]:
    """Radixrt on and off in turn (both servers up, one working at a time; the order flips
    every round), the same fresh prompts for both in a round: the on/off ratio of each round,
    so a verdict on the default does not rest on one run of a noisy machine."""
    rt = [s for s in systems(argparse.Namespace(**{**vars(args), "skip_llama_server": True}))
          if s.name in (RT_OFF, RT_ON)]
    ratios: dict[tuple[str, int], list[float]] = {pair: [] for pair in PAIRED}
    with contextlib.ExitStack() as stack:
        http = {}
        for system in rt:
            url = stack.enter_context(running(system))
            http[system.name] = stack.enter_context(httpx.Client(base_url=url,
                                                                 timeout=REQUEST_TIMEOUT_S))
            complete(http[system.name], "Hello", 4)  # warm-up
        base = 5000
        for round_ in range(args.pairs):
            for workload, batch in PAIRED:
                base += 100
                order = (RT_OFF, RT_ON) if round_ % 2 == 0 else (RT_ON, RT_OFF)
                requests = 8 if batch == 8 else args.requests
                rate = {name: run_workload(http[name], name, workload, batch, requests,
                                           args.max_tokens, base).tokens_per_s
                        for name in order}
                ratio = rate[RT_ON] / rate[RT_OFF]
                ratios[(workload, batch)].append(ratio)
                print(f"pair {round_ + 1} {workload:6s} batch {batch}: off {rate[RT_OFF]:6.1f} "
                      f"tok/s, on {rate[RT_ON]:6.1f} tok/s, on/off {ratio:.2f}x", flush=True)
    return ratios


def curve_part(args: argparse.Namespace) -> dict[str, dict[int, float]]:
    """tokens/s ratio on/off of the in-process Engine at each batch size, drafting always."""
    import radixrt
    from radixrt.runtime.models.loader import load_model

    loaded = load_model("default", dtype="float32", device="cpu")
    ratios: dict[str, dict[int, float]] = {}
    for workload in ("json", "prose"):
        ratios[workload] = {}
        for batch in args.curve_batches:
            rates = []
            for spec in (None, "radix"):
                engine = radixrt.Engine(model=loaded, max_total_tokens=args.max_total_tokens,
                                        speculative_algorithm=spec,
                                        speculative_max_batch_size=1024)
                params = radixrt.SamplingParams(max_tokens=args.max_tokens, temperature=0)
                engine.generate(prompt(workload, 0), radixrt.SamplingParams(max_tokens=4))
                texts = [prompt(workload, 500 + i) for i in range(batch)]
                start = time.perf_counter()
                outs = engine.generate(texts, params)
                seconds = time.perf_counter() - start
                rates.append(sum(o.completion_tokens for o in outs) / seconds)
                engine.close()
            ratios[workload][batch] = rates[1] / rates[0]
            print(f"curve {workload:6s} batch {batch:3d}: off {rates[0]:6.1f} tok/s, "
                  f"on {rates[1]:6.1f} tok/s, on/off {rates[1] / rates[0]:.2f}x", flush=True)
    return ratios


def report_pairs(pairs: dict[tuple[str, int], list[float]]) -> None:
    print("\n| paired rounds | batch | on/off each round | median | min |")
    print("|---|---:|---|---:|---:|")
    for (workload, batch), ratios in pairs.items():
        print(f"| {workload} | {batch} | " + ", ".join(f"{r:.2f}" for r in ratios)
              + f" | {statistics.median(ratios):.2f}x | {min(ratios):.2f}x |")


def report(runs: list[Run], curve: dict[str, dict[int, float]], args: argparse.Namespace,
           argv: list[str] | None) -> None:
    by = {(r.system, r.workload, r.batch): r for r in runs}
    present = list(dict.fromkeys(r.system for r in runs))
    print("\ncommand: python benchmarks/speculative.py " + " ".join(argv or sys.argv[1:]))
    print(f"max_tokens {args.max_tokens}, batch 1: {args.requests} requests one after another; "
          "batch 8: 8 at once; greedy; outputs end where the model ends them")
    for batch in (1, 8) if runs else ():
        print(f"\n| batch {batch} | " + " | ".join(f"{s} tok/s" for s in present)
              + f" | {RT_ON} / {RT_OFF} | {RT_ON} / best llama | accepted / drafted "
              f"({RT_ON}) | tokens / step ({RT_ON}) | trees: verified, accepted on a branch |")
        print("|---" * (len(present) + 6) + "|")
        for w in WORKLOADS:
            rates = {s: by[(s, w, batch)].tokens_per_s for s in present if (s, w, batch) in by}
            on = by.get((RT_ON, w, batch))
            llamas = [v for s, v in rates.items() if s.startswith("llama")]
            best = max(llamas, default=0.0)
            ratio = rates.get(RT_ON, 0) / rates[RT_OFF] if rates.get(RT_OFF) else 0.0
            vs = f"{rates.get(RT_ON, 0) / best:.2f}x" if best else "-"
            acc = f"{on.accepted}/{on.drafted}" if on and on.drafted else "-"
            per_step = f"{on.tokens / on.steps:.2f}" if on and on.steps else "-"
            trees = f"{on.trees}, {on.branch}" if on and on.drafted else "-"
            print(f"| {w} | " + " | ".join(f"{rates.get(s, 0):.1f}" for s in present)
                  + f" | {ratio:.2f}x | {vs} | {acc} | {per_step} | {trees} |")
    groups = [f"{w}\nbatch {b}" for b in (1, 8) for w in WORKLOADS]
    series = {s: [by[(s, w, b)].tokens_per_s if (s, w, b) in by else 0.0
                  for b in (1, 8) for w in WORKLOADS] for s in present}
    path = None if not runs else bar_panels(plot_path("speculative", args.plot_dir),
                      "Speculative decoding: output tokens/s (greedy, 2 CPU cores)", groups,
                      [("output tokens/s", series)],
                      "radixrt-spec drafts from the radix tree and the request's own tokens; "
                      "llama-ngram: llama-server --spec-type ngram-simple (defaults), "
                      "llama-ngram3: 3-token lookup, 8-token drafts")
    if curve:
        line_panels(plot_path("speculative_batch", args.plot_dir),
                    "Drafting at every batch size: tokens/s on / off (Engine, greedy)",
                    [LinePanel("requests decoding at once", "tokens/s with drafts / without",
                               [Curve(w, list(c), list(c.values()),
                                      [f"{v:.2f}x" for v in c.values()])
                                for w, c in curve.items()], log_x=True)])
        print("\n| batch | " + " | ".join(f"{w} on/off" for w in curve) + " |")
        print("|---" * (len(curve) + 1) + "|")
        for batch in args.curve_batches:
            print(f"| {batch} | " + " | ".join(f"{c[batch]:.2f}x" for c in curve.values()) + " |")
    if runs and path is None:
        print("plot skipped")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 requests at batch 1, 48 tokens")
    p.add_argument("--requests", type=int, default=None, help="batch-1 requests per workload "
                   "(default 4; --quick: 2)")
    p.add_argument("--max-tokens", type=int, default=None, help="default 96 (--quick: 48)")
    p.add_argument("--max-total-tokens", type=int, default=16384, help="radixrt's KV pool")
    p.add_argument("--llama-server", default=None, help=f"the binary (default {LLAMA_SERVER})")
    p.add_argument("--skip-llama-server", action="store_true")
    p.add_argument("--skip-serving", action="store_true", help="part 2 only")
    p.add_argument("--skip-curve", action="store_true", help="part 1 only")
    p.add_argument("--curve-batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--pairs", type=int, default=None, help="paired rounds (prose at batch 1 "
                   "and 8, json at 8), on and off in turn (default 6; --quick: 0)")
    add_plot_dir(p)
    args = p.parse_args(argv)
    args.requests = args.requests or (2 if args.quick else 4)
    args.max_tokens = args.max_tokens or (48 if args.quick else 96)
    args.pairs = args.pairs if args.pairs is not None else (0 if args.quick else 6)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    runs = [] if args.skip_serving else serve_part(args)
    pairs = {} if args.skip_serving or not args.pairs else paired_part(args)
    curve = {} if args.skip_curve else curve_part(args)
    report(runs, curve, args, argv)
    if pairs:
        report_pairs(pairs)


if __name__ == "__main__":
    main()
