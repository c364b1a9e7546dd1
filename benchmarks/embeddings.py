"""Embeddings: radixrt.Engine.embed against sentence-transformers' encode on the same model and
the same texts, in one run, on this CPU.

The model is the default model's weights as a float32 safetensors checkpoint (transformers reads
the GGUF file; the folder is written once per run into a temporary folder) with
sentence-transformers' files beside it: last-token pooling, then Normalize -- what an
instruction-following decoder embedder (e5-mistral, gte-Qwen, Qwen3-Embedding) uses. Both
systems load that folder: radixrt reads the pooling from the same files.

Workloads (texts made here from a seeded RNG over a word list; --inputs of each):

  shared instruction  one ~200-token instruction + one query + a document, the documents
                      differing: 1 query x --inputs documents behind the same instruction
                      (every input begins with the same 218 tokens)
  documents alone     the same documents (30-60 tokens each), nothing shared

Systems:

  radixrt              Engine.embed(texts): prefill-only requests through the scheduler, up to
                       --max-num-batched-tokens prompt tokens a step; the radix cache computes
                       the shared instruction once (the first input's), the others read it
  radixrt (no cache)   the same with disable_radix_cache=True: every token computed
  sentence-transformers SentenceTransformer(folder, device="cpu").encode(texts,
                       batch_size=--st-batch-size): padded batches (sorted by length)

Method: each system is warmed up on a few inputs of each workload first; radixrt's cache is
flushed before every timed call (the instruction is computed once within the call, not read
from an earlier one). Each timed call embeds the workload's whole list, wall clock; --runs runs
with the systems interleaved (drift shared), medians reported: inputs/s and prompt tokens/s
(tokens by the checkpoint's tokenizer, the same for all), radixrt / sentence-transformers per
workload (also by the calls' CPU seconds, all threads: less moved by a busy neighbour), and
radixrt's cached / prompt tokens of the call (engine.stats()). Correctness in the
same run: the cosine similarity of each radixrt embedding with sentence-transformers' of the
same text (the minimum is printed; it should be > 0.9999). Both systems run in this process on
the same torch threads (--threads; default torch's, the CPU count), float32, denormals flushed.
The goal: >= 3x sentence-transformers' inputs/s where the instruction is shared.

    python benchmarks/embeddings.py               # 64 inputs a workload, 3 runs: ~5 min
    python benchmarks/embeddings.py --inputs 256  # the issue's size: ~4x as long
    python benchmarks/embeddings.py --quick       # a tiny random-weight Qwen2, 16 inputs, 1 run

On a machine another process keeps busy, give both systems one thread (--threads 1): torch's
threads wait on each other at every op when one of them has no core (radixrt's many small
per-request attention ops most: 80x slower calls were seen with 2 threads beside a busy
neighbour on 2 cores).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shlex
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from plots import add_plot_dir, bar_panels, plot_path  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

import radixrt  # noqa: E402
from radixrt.runtime.models.loader import default_model_path, load_model  # noqa: E402

DEFAULT_JSON = os.path.join(HERE, "results", "embeddings.json")
RADIXRT, NO_CACHE, ST = "radixrt", "radixrt (no cache)", "sentence-transformers"
SYSTEMS = (RADIXRT, NO_CACHE, ST)
SHARED, ALONE = "shared instruction", "documents alone"
WORKLOADS = (SHARED, ALONE)
GOAL = 3.0  # radixrt / sentence-transformers where the instruction is shared
COSINE_FLOOR = 0.9999
WARMUP_INPUTS = 8

INSTRUCTION = (
    "Instruct: You are the retrieval stage of a question answering system for a public library. "
    "Given the reader's question below, decide how well the passage that follows would help a "
    "librarian answer it. Represent the passage so that a later search finds it whenever a "
    "question it answers comes in: keep what it says about people, places, objects, materials, "
    "dates, quantities and causes, and what happened to whom; keep the relations between them "
    "(what was made from what, what followed what, what was larger or older); leave out its "
    "style, its tone, its length and the order of its sentences, and do not reward passages "
    "that merely repeat the words of the question without answering it. Passages may be "
    "fragments of catalogue records, notes from the reading room, pages of old almanacs or "
    "letters from readers, and they may be badly spelled or cut off in the middle of a "
    "sentence; judge what they say, not how they say it. Answer with the representation "
    "only.")
QUERY = "which materials kept small farmhouses warm through the long winters of the north?"
WORD_TEXT = (
    "river stone winter wool timber harbour village market bridge lantern kettle orchard "
    "farmer weaver miller baker sailor teacher clerk doctor widow child neighbour traveller "
    "copper iron clay straw peat coal oak pine birch linen leather salt grain barley honey "
    "snow frost rain wind fog flood harvest spring summer autumn north south east west "
    "built carried sold burned repaired painted counted buried found lost borrowed wrote "
    "read remembered crossed opened closed warm cold heavy narrow ancient quiet bright dark "
    "small large old new early late the a of in on by with from under over near after before "
    "because while and but their its his her this that every some many few two three ten "
    "hundred house roof wall chimney hearth stove window door cellar barn mill church school "
    "road ship cart letter almanac record ledger map chart hymn recipe price tax rent debt"
)
WORDS = WORD_TEXT.split()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--inputs", type=int, default=64,
                   help="texts per workload (the issue's: 256; the time grows with it)")
    p.add_argument("--min-doc", type=int, default=30, help="document length, tokens")
    p.add_argument("--max-doc", type=int, default=60)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--st-batch-size", type=int, default=32,
                   help="sentence-transformers' encode(batch_size=)")
    p.add_argument("--max-num-batched-tokens", type=int, default=1024,
                   help="radixrt's prompt tokens per step")
    p.add_argument("--max-total-tokens", type=int, default=16384, help="radixrt's KV pool")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads of both systems (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None,
                   help=f"write the results here (default {os.path.relpath(DEFAULT_JSON)}; "
                   "none with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke test: a tiny random-weight Qwen2, 16 inputs, 1 run")
    add_plot_dir(p)
    args = p.parse_args(argv)
    if args.quick:
        args.inputs, args.runs = 16, 1
    elif args.json is None:
        args.json = DEFAULT_JSON
    return args


# --- the model and the texts -------------------------------------------------------------------
def write_sentence_transformers(folder: str, hidden_size: int) -> None:
    """sentence-transformers' files: the transformer, last-token pooling, Normalize (as
    tests/pooling_models.py writes them for its tiny embedders)."""
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize"}]
    with open(os.path.join(folder, "modules.json"), "w") as f:
        json.dump(modules, f)
    os.makedirs(os.path.join(folder, "1_Pooling"))
    with open(os.path.join(folder, "1_Pooling", "config.json"), "w") as f:
        json.dump({"embedding_dimension": hidden_size, "pooling_mode": "lasttoken"}, f)
    os.makedirs(os.path.join(folder, "2_Normalize"))


def build(root: str, tiny: bool) -> str:
    """The checkpoint folder with sentence-transformers' files. tiny: tests/pooling_models.py's
    random-weight Qwen2 embedder (the smoke test's) instead of the default model."""
    tokenizer = load_model("default").tokenizer
    folder = os.path.join(root, "model")
    if tiny:
        sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the models the tests make
        from pathlib import Path

        from pooling_models import build_pooling_model

        build_pooling_model("qwen2-embed", Path(folder), tokenizer)
        return folder
    from transformers import AutoModelForCausalLM

    source, fname = default_model_path()
    read = AutoModelForCausalLM.from_pretrained(source, gguf_file=fname, dtype=torch.float32)
    hf = type(read)(read.config).eval()  # the same weights, no longer marked as GGUF's
    hf.load_state_dict(read.state_dict())
    hf.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_sentence_transformers(folder, read.config.hidden_size)
    return folder


def documents(args: argparse.Namespace, count_tokens: Any) -> list[str]:
    """--inputs documents of --min-doc..--max-doc tokens: seeded sentences over WORDS."""
    rng = random.Random(args.seed)
    docs = []
    for _ in range(args.inputs):
        target, words = rng.randint(args.min_doc, args.max_doc), []
        text = ""
        while count_tokens(text) < target:
            word = rng.choice(WORDS)
            words.append(word.capitalize() if not words or words[-1].endswith(".") else word)
            if rng.random() < 0.12:
                words[-1] += rng.choice(".,;")
            text = " ".join(words)
        docs.append(text)
    return docs


def workloads(args: argparse.Namespace, count_tokens: Any) -> dict[str, list[str]]:
    docs = documents(args, count_tokens)
    prefix = f"{INSTRUCTION}\nQuery: {QUERY}\nDocument: "
    return {SHARED: [prefix + d for d in docs], ALONE: docs}


# --- the systems -------------------------------------------------------------------------------
class Systems:
    """The two radixrt Engines (one set of weights) and the SentenceTransformer."""

    def __init__(self, folder: str, args: argparse.Namespace) -> None:
        from sentence_transformers import SentenceTransformer

        model = load_model(folder)
        options = dict(max_total_tokens=args.max_total_tokens,
                       max_num_batched_tokens=args.max_num_batched_tokens)
        self.engines = {RADIXRT: radixrt.Engine(model, **options),
                        NO_CACHE: radixrt.Engine(model, disable_radix_cache=True, **options)}
        self.st = SentenceTransformer(folder, device="cpu")
        self.batch_size = args.st_batch_size

    def embed(self, system: str, texts: list[str]) -> tuple[float, list[list[float]], dict]:
        """(wall seconds, embeddings, the call's CPU seconds (all threads) and for radixrt its
        stats: prompt, cached and computed tokens, steps)."""
        if system == ST:
            start, cpu = time.perf_counter(), time.process_time()
            out = self.st.encode(texts, batch_size=self.batch_size, show_progress_bar=False)
            return (time.perf_counter() - start, out.tolist(),
                    {"cpu_s": time.process_time() - cpu})
        engine = self.engines[system]
        engine.flush_cache()  # the instruction is computed within the call, not read from before
        before = engine.stats()
        start, cpu = time.perf_counter(), time.process_time()
        out = engine.embed(texts)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        after = engine.stats()
        return seconds, out, {"cpu_s": cpu, **{
            k: after[k] - before[k]
            for k in ("prompt_tokens", "cached_tokens", "computed_tokens", "steps")}}

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()


def min_cosine(a: list[list[float]], b: list[list[float]]) -> float:
    x, y = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    return torch.nn.functional.cosine_similarity(x, y, dim=-1).min().item()


def measure(systems: Systems, works: dict[str, list[str]], args: argparse.Namespace,
            tokens: dict[str, int]) -> dict[str, dict[str, dict[str, Any]]]:
    for texts in works.values():  # warm-up: every system, every workload
        for system in SYSTEMS:
            systems.embed(system, texts[:WARMUP_INPUTS])
    samples: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    stats: dict[tuple[str, str], dict] = {}
    vectors: dict[tuple[str, str], list[list[float]]] = {}
    for run in range(args.runs):
        for work, texts in works.items():
            for system in SYSTEMS:  # interleaved: drift shared
                seconds, vectors[work, system], stats[work, system] = systems.embed(system,
                                                                                    texts)
                samples.setdefault((work, system), []).append(seconds)
                cpu.setdefault((work, system), []).append(stats[work, system].pop("cpu_s"))
                print(f"run {run + 1}/{args.runs} {work:18} {system:22} {seconds:7.2f} s",
                      flush=True)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for work, texts in works.items():
        for system in SYSTEMS:
            seconds = statistics.median(samples[work, system])
            r: dict[str, Any] = {"seconds": seconds, "runs_s": samples[work, system],
                                 "cpu_s": statistics.median(cpu[work, system]),
                                 "inputs_per_s": len(texts) / seconds,
                                 "tokens_per_s": tokens[work] / seconds, **stats[work, system]}
            if system != ST:
                r["min_cosine"] = min_cosine(vectors[work, system], vectors[work, ST])
            results.setdefault(work, {})[system] = r
    return results


# --- the report --------------------------------------------------------------------------------
def table(results: dict[str, dict[str, dict[str, Any]]], works: dict[str, list[str]],
          tokens: dict[str, int]) -> str:
    rows = ["| workload | system | inputs/s | tokens/s | s (median) | CPU s | "
            "cached / prompt tokens | vs sentence-transformers | min cosine vs ST |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for work, by_system in results.items():
        st = by_system[ST]["inputs_per_s"]
        for system, r in by_system.items():
            cached = (f"{r['cached_tokens']} / {r['prompt_tokens']}" if "prompt_tokens" in r
                      else f"- / {tokens[work]}")
            cosine = f"{r['min_cosine']:.6f}" if "min_cosine" in r else "-"
            rows.append(f"| {work} ({len(works[work])}) | {system} | {r['inputs_per_s']:.1f} | "
                        f"{r['tokens_per_s']:.0f} | {r['seconds']:.2f} | {r['cpu_s']:.2f} | "
                        f"{cached} | {r['inputs_per_s'] / st:.2f}x | {cosine} |")
    return "\n".join(rows)


def draw(results: dict[str, dict[str, dict[str, Any]]], args: argparse.Namespace) -> str | None:
    works = list(results)
    inputs = {s: [results[w][s]["inputs_per_s"] for w in works] for s in SYSTEMS}
    ratios = {s: [results[w][s]["inputs_per_s"] / results[w][ST]["inputs_per_s"] for w in works]
              for s in (RADIXRT, NO_CACHE)}
    return bar_panels(
        plot_path("embeddings", args.plot_dir),
        "Embeddings: radixrt against sentence-transformers, same model and texts (CPU)",
        works, [("inputs/s (higher is better)", inputs),
                ("x sentence-transformers' inputs/s", ratios)],
        caption=f"{args.inputs} inputs per workload; the shared prefix {args.shared} tokens, the "
                f"documents {args.min_doc}-{args.max_doc} tokens; sentence-transformers "
                f"batch {args.st_batch_size}, radixrt {args.max_num_batched_tokens} tokens a "
                f"step; torch threads {torch.get_num_threads()}, float32; benchmarks/embeddings.py")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_flush_denormal(True)  # for both systems alike (denormals slow torch's CPU ops)
    if args.threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    began, load_before = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="radixrt-embeddings-bench-") as root:
        folder = build(root, args.quick)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(folder)

        def count_tokens(text: str) -> int:
            return len(tok(text)["input_ids"])

        works = workloads(args, count_tokens)
        tokens = {w: sum(count_tokens(t) for t in texts) for w, texts in works.items()}
        shared = len(tok(f"{INSTRUCTION}\nQuery: {QUERY}\nDocument:")["input_ids"])
        args.shared = shared
        systems = Systems(folder, args)
        try:
            results = measure(systems, works, args, tokens)
        finally:
            systems.close()
    seconds = time.perf_counter() - began
    model = "a tiny random-weight Qwen2 (--quick)" if args.quick else (
        "the default model (SmolLM2-135M-Instruct) as float32 safetensors")
    print(f"\nEmbeddings, {model}, last-token pooling + Normalize; {args.inputs} inputs per "
          f"workload: the shared prefix (instruction + query) {shared} tokens, documents "
          f"{args.min_doc}-{args.max_doc} tokens; medians of {args.runs} runs")
    print(table(results, works, tokens))
    for work in WORKLOADS:
        ratio = results[work][RADIXRT]["inputs_per_s"] / results[work][ST]["inputs_per_s"]
        by_cpu = results[work][ST]["cpu_s"] / results[work][RADIXRT]["cpu_s"]
        goal = f"; goal >= {GOAL:g}x" if work == SHARED else ""
        print(f"{work}: radixrt / sentence-transformers = {ratio:.2f}x (by CPU time "
              f"{by_cpu:.2f}x{goal})")
    for work in WORKLOADS:
        for system in SYSTEMS:
            runs = results[work][system]["runs_s"]
            if max(runs) > 1.3 * min(runs):
                print(f"note: {work} / {system}: runs {min(runs):.2f}-{max(runs):.2f} s; the "
                      "CPU was shared with other work (on a busy machine use --threads 1)")
    cosine = min(r["min_cosine"] for by in results.values() for r in by.values()
                 if "min_cosine" in r)
    results_min = {"min_cosine": cosine}
    print(f"min cosine similarity radixrt vs sentence-transformers: {cosine:.6f} "
          f"({'ok' if cosine > COSINE_FLOOR else 'BELOW'} {COSINE_FLOOR})")
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    print(f"\nfloat32 on CPU, torch threads {torch.get_num_threads()} (both systems), "
          f"sentence-transformers batch_size {args.st_batch_size}, radixrt "
          f"--max-num-batched-tokens {args.max_num_batched_tokens}; load average "
          f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"date: {date}; CPU count {os.cpu_count()}")
    print(f"command: {shlex.join([os.path.basename(sys.executable), *sys.argv])}  "
          f"(took {seconds:.0f}s in all)")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "threads": torch.get_num_threads(),
                       "shared_prefix_tokens": shared, "prompt_tokens": tokens,
                       **results_min, "results": results}, f, indent=1)
    if draw(results, args) is None:
        print("plot skipped (no matplotlib)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
