"""radixrt's two grammar engines on JSONSchemaBench's real-world schemas, side by side, no model.

A stratified sample (the same count from each of the benchmark's ten folders, spread over each
folder's files in name order), each schema compiled as a user's request is
(`GrammarCompiler(backend=...)` over the default model's vocabulary), on outlines-core and on
llguidance. Per engine and folder: compiled / refused (the first words of the reason) / past
the time limit, compile time p50 / p95; then, per compiled schema, random walks through the
masks (a token drawn from the allowed ones each step, EOS with probability 1/2 where the
grammar may end): mask time per token p50 / p99, and whether every finished walk's text is
valid under `jsonschema` (a grammar that lets an invalid document through shows here).

Each engine runs in its own process, restarted after a compile or walk past --timeout (an
outlines-core index can take minutes; a thread could not be stopped).

    tar -xJf ../shared/jsonschemabench/jsonschemabench-data.tar.xz -C /tmp/jsb
    python benchmarks/grammar_engines.py --data /tmp/jsb/data [--per-folder 10] [--quick]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import time
from collections import Counter, defaultdict
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plots import add_plot_dir, bar_panels, plot_path  # noqa: E402

ENGINES = ("outlines", "llguidance")
WALKS = 4  # random walks per compiled schema
WALK_TOKENS = 96  # steps per walk at most


# --- the engine process -----------------------------------------------------------------------
def serve(engine: str, conn: Any) -> None:
    """Compile schemas and walk their masks on one engine, one request at a time."""
    import jsonschema
    import torch

    from radixrt.runtime.constrained.compiler import GrammarCompiler
    from radixrt.runtime.constrained.grammar_engine import expand_bitmask, mask_words
    from radixrt.runtime.constrained.token_table import TokenTable
    from radixrt.runtime.models.loader import load_tokenizer

    tok = load_tokenizer("default")
    table = TokenTable(tok, len(tok), [tok.eos_token_id])
    compiler = GrammarCompiler(table, backend=engine, capacity=1)
    compiler.engine(("json_schema", "{}"))  # made once (llguidance: its tokenizer, ~0.1 s)
    conn.send("ready")
    while True:
        job = conn.recv()
        if job is None:
            compiler.close()
            return
        schema_text, seed = job
        start = time.perf_counter()
        try:
            grammar = compiler.get(("json_schema", schema_text))
        except ValueError as exc:
            conn.send({"status": "refused", "reason": str(exc)})
            continue
        compile_ms = (time.perf_counter() - start) * 1e3
        rng = random.Random(seed)
        mask_us: list[float] = []
        finished = valid = 0
        schema = json.loads(schema_text)
        words = torch.zeros(mask_words(table.vocab_size), dtype=torch.int32)
        for _ in range(WALKS):
            state = grammar.new_state()
            out: list[int] = []
            for _ in range(WALK_TOKENS):
                if state.accepts_end() and rng.random() < 0.5:
                    state.advance(table.eos_token_id)
                    break
                words.zero_()
                t0 = time.perf_counter()
                state.write_mask(words)
                mask_us.append((time.perf_counter() - t0) * 1e6)
                allowed = expand_bitmask(words[None], table.vocab_size)[0].nonzero().flatten()
                if not len(allowed):
                    break
                token = int(allowed[rng.randrange(len(allowed))])
                state.advance(token)
                out.append(token)
            if state.ended:
                finished += 1
                text = b"".join(table.token_bytes[t] or b"" for t in out).decode("utf-8",
                                                                                    "replace")
                try:
                    jsonschema.validate(json.loads(text), schema)
                    valid += 1
                except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
                    pass
        conn.send({"status": "compiled", "compile_ms": compile_ms, "mask_us": mask_us,
                   "finished": finished, "valid": valid})


class EngineProcess:
    def __init__(self, engine: str) -> None:
        self.engine = engine
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(self.engine, child), daemon=True)
        self.proc.start()
        assert self.conn.recv() == "ready"

    def run(self, schema_text: str, seed: int, timeout: float) -> dict[str, Any]:
        self.conn.send((schema_text, seed))
        if self.conn.poll(timeout):
            return self.conn.recv()
        self.proc.kill()
        self.proc.join()
        self._start()
        return {"status": "timeout"}

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(timeout=10)


# --- the sample -------------------------------------------------------------------------------
def sample(data: str, per_folder: int) -> list[tuple[str, str, str]]:
    """(folder, file, schema text): per_folder files spread over each folder in name order."""
    out = []
    for folder in sorted(os.listdir(data)):
        files = sorted(f for f in os.listdir(os.path.join(data, folder)) if f.endswith(".json"))
        step = max(len(files) // per_folder, 1)
        for name in files[::step][:per_folder]:
            with open(os.path.join(data, folder, name)) as f:
                value = json.load(f)
            schema = value.get("json_schema", value) if isinstance(value, dict) else value
            out.append((folder, name, json.dumps(schema)))
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def reason_of(text: str) -> str:
    """The first words of a refusal's reason (after what the message says of the schema)."""
    for marker in (" cannot be compiled: ", " cannot enforce: ", " is invalid: "):
        if marker in text:
            text = text.split(marker, 1)[1]
            break
    return " ".join(text.split()[:6])[:60]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default="/tmp/jsb/data",
                   help="JSONSchemaBench's data folder (extract ../shared/jsonschemabench)")
    p.add_argument("--per-folder", type=int, default=None, help="default 10 (--quick: 2)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds per schema (compile + walks); default 30 (--quick: 10)")
    p.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    add_plot_dir(p)
    args = p.parse_args(argv)
    if args.per_folder is None:
        args.per_folder = 2 if args.quick else 10
    if args.timeout is None:
        args.timeout = 10.0 if args.quick else 30.0
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not os.path.isdir(args.data):
        sys.exit(f"no JSONSchemaBench data at {args.data}: extract "
                 "../shared/jsonschemabench/jsonschemabench-data.tar.xz there first")
    schemas = sample(args.data, args.per_folder)
    print(f"{len(schemas)} schemas, {args.per_folder} per folder; timeout {args.timeout:.0f} s")
    results: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for engine in args.engines:
        proc = EngineProcess(engine)
        rows = []
        for i, (folder, _name, text) in enumerate(schemas):
            rows.append((folder, proc.run(text, args.seed + i, args.timeout)))
        proc.close()
        results[engine] = rows
    report(results, len(schemas))
    plot(results, args.plot_dir)


def summary(rows: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    compiled = [r for _, r in rows if r["status"] == "compiled"]
    masks = [us for r in compiled for us in r["mask_us"]]
    return {
        "compiled": len(compiled),
        "refused": sum(r["status"] == "refused" for _, r in rows),
        "timeout": sum(r["status"] == "timeout" for _, r in rows),
        "compile_p50": pct([r["compile_ms"] for r in compiled], 0.5),
        "compile_p95": pct([r["compile_ms"] for r in compiled], 0.95),
        "mask_p50": pct(masks, 0.5), "mask_p99": pct(masks, 0.99),
        "finished": sum(r["finished"] for r in compiled),
        "valid": sum(r["valid"] for r in compiled),
    }


def report(results: dict[str, list[tuple[str, dict[str, Any]]]], total: int) -> None:
    print(f"\n{'engine':<11} {'compiled':>9} {'refused':>8} {'timeout':>8} {'compile p50':>12} "
          f"{'p95 ms':>8} {'mask p50':>9} {'p99 µs':>8} {'walks valid':>12}")
    sums = {}
    for engine, rows in results.items():
        s = sums[engine] = summary(rows)
        print(f"{engine:<11} {s['compiled']:>4}/{total:<4} {s['refused']:>8} {s['timeout']:>8} "
              f"{s['compile_p50']:>12.1f} {s['compile_p95']:>8.1f} {s['mask_p50']:>9.0f} "
              f"{s['mask_p99']:>8.0f} {s['valid']:>6}/{s['finished']:<5}")
    if len(sums) == len(ENGINES):
        a, b = sums["outlines"], sums["llguidance"]
        print(f"\nllguidance vs outlines-core: coverage {b['compiled']}/{a['compiled']}, "
              f"compile p50 {a['compile_p50'] / b['compile_p50']:.0f}x faster, mask p50 "
              f"{a['mask_p50'] / b['mask_p50']:.1f}x faster")
    print(f"\nper folder (compiled, {' / '.join(results)}):")
    folders = sorted({f for rows in results.values() for f, _ in rows})
    for folder in folders:
        counts = [sum(r["status"] == "compiled" for f, r in results[e] if f == folder)
                  for e in results]
        n = sum(f == folder for f, _ in next(iter(results.values())))
        print(f"  {folder:<16} {' / '.join(f'{c:>3}' for c in counts)} of {n}")
    for engine, rows in results.items():
        reasons = Counter(reason_of(r["reason"]) for _, r in rows if r["status"] == "refused")
        print(f"\n{engine} refusals:")
        for reason, count in reasons.most_common(8):
            print(f"  {count:>3}  {reason}")


def plot(results: dict[str, list[tuple[str, dict[str, Any]]]], plot_dir: str | None) -> None:
    folders = sorted({f for rows in results.values() for f, _ in rows})
    per: dict[str, list[float]] = defaultdict(list)
    for engine in results:
        for folder in folders:
            rows = [r for f, r in results[engine] if f == folder]
            per[engine].append(100.0 * sum(r["status"] == "compiled" for r in rows) / len(rows))
    sums = {e: summary(rows) for e, rows in results.items()}
    bar_panels(plot_path("grammar_engines", plot_dir),
               "radixrt's grammar engines on JSONSchemaBench (no model)",
               [f[:10] for f in folders],
               [("schemas compiled, % (higher is better)", dict(per))],
               " · ".join(f"{e}: compile p50 {s['compile_p50']:.1f} ms, mask p50 "
                          f"{s['mask_p50']:.0f} µs / p99 {s['mask_p99']:.0f} µs"
                          for e, s in sums.items()))


if __name__ == "__main__":
    main()
