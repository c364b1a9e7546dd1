"""JSONSchemaBench's real-world schemas on radixrt's grammar engines and, driven directly on the
same schemas and tokenizer, llguidance and XGrammar: one run, no model.

A stratified sample (the same count from each of the benchmark's ten folders, spread over each
folder's files in name order; 40 each by default: 400 schemas) over the default model's
vocabulary (radixrt's `load_tokenizer("default")`), on four engines:

- outlines, llguidance: radixrt's two, each schema compiled as a request's `json_schema` is
  (`GrammarCompiler(backend=...)`; `--grammar-backend auto`, the default, runs JSON schemas on
  llguidance);
- llguidance-direct: the llguidance package itself (`llguidance.hf.from_tokenizer`,
  `LLMatcher.grammar_from_json_schema` with compact JSON, `LLMatcher`), without radixrt's
  reading of the schema (it closes objects that list properties and say nothing of others);
- xgrammar: XGrammar itself (`TokenizerInfo.from_huggingface`, `GrammarCompiler.
  compile_json_schema` with compact JSON: `any_whitespace=False`, `separators=(",", ":")`, its
  default strict mode, which closes objects and arrays the same way).

Per folder and engine: compiled / refused (the first words of the reason: the keyword) / past
--timeout, compile time p50 / p95; then, per compiled schema, 4 random walks through the masks
(a token drawn from the allowed ones each step, half the time from those that close a string,
object or array; EOS with probability 1/2 where the output may end): whether each finished
walk's document is valid under `jsonschema`, the mask's time per token p50 / p99 (the thread's
CPU time, and wall time); then mutations: each valid walk's document mutated (a key dropped
or added, a type changed, an enum / const / bound / length broken, the text cut short, ...;
the mutants `jsonschema` finds invalid, 8 per document, written compactly as radixrt writes
JSON) and fed through the grammar token by token (each token must be in the mask, then EOS):
the invalid documents the grammar accepts. The valid document itself, written the same way, is
fed too (a control: it must be accepted, or the mutants' rejection would prove nothing).

Each engine runs in its own process, restarted after a compile past --timeout (a thread could
not be stopped; the server refuses such a schema at its --grammar-compile-timeout, 30 s by
default), after walks past --walk-timeout, or past 8 GiB of memory.

    python benchmarks/json_schema_bench.py [--per-folder 40] [--engines ...] [--timeout 30]
        [--data /tmp/jsb/data] [--json results.json] [--quick]

Without --data it reads /tmp/jsb/data, or extracts ../shared/jsonschemabench's tarball into a
temporary folder.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import time
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from json_schema_docs import (  # noqa: E402
    accepts,
    closer_tokens,
    compact,
    doc_tokens,
    find_data,
    invalid_documents,
    sample,
    validator_of,
    walk,
    writable,
)
from json_schema_engines import Refused, make, unavailable  # noqa: E402
from json_schema_report import EXAMPLE_CHARS, Results, plot, report, summary  # noqa: E402
from plots import add_plot_dir  # noqa: E402

ENGINES = ("llguidance", "llguidance-direct", "xgrammar", "outlines")  # run in this order
WALKS = 4  # random walks per compiled schema
WALK_TOKENS = 96  # steps per walk at most
MUTANTS = 8  # invalid mutated documents fed per valid walk
MEMORY_LIMIT = 8 << 30  # an engine process past it is stopped (the schema: past the limit)


def serve(engine: str, timeout: float, conn: Any) -> None:
    """Compile schemas, walk their masks and feed them mutants, one schema at a time: the
    compile's reply first, then the walks' (the parent times them apart)."""
    import torch

    from radixrt.runtime.constrained.grammar_engine import mask_words
    from radixrt.runtime.constrained.token_table import TokenTable
    from radixrt.runtime.models.loader import load_tokenizer

    torch.set_num_threads(1)  # one core each: the engines' masks are single-threaded
    tok = load_tokenizer("default")
    table = TokenTable(tok, len(tok), [tok.eos_token_id])
    backend = make(engine, tok, table, timeout)
    words = torch.zeros(mask_words(table.vocab_size), dtype=torch.int32)
    closers = closer_tokens(table.token_bytes)
    conn.send("ready")
    while True:
        job = conn.recv()
        if job is None:
            backend.close()
            return
        schema_text, seed = job
        start = time.perf_counter()
        try:
            compiled = backend.compile(schema_text)
        except Refused as exc:
            conn.send({"status": "refused", "reason": str(exc)})
            continue
        conn.send({"status": "compiled", "compile_ms": (time.perf_counter() - start) * 1e3})
        try:
            conn.send(walks(backend, compiled, schema_text, seed, table, words, closers))
        except Exception as exc:  # noqa: BLE001 -- shown in the report, the run goes on
            conn.send({"walk_error": f"{type(exc).__name__}: {exc}"})


def walks(backend: Any, compiled: Any, schema_text: str, seed: int, table: Any,
          words: Any, closers: Any) -> dict[str, Any]:
    rng = random.Random(seed)
    eos = table.eos_token_id
    valid = validator_of(schema_text)
    mask_us: list[float] = []
    mask_cpu_us: list[float] = []
    out: dict[str, Any] = {"finished": 0, "valid": 0, "unjudged": 0, "invalid_walks": [],
                           "controls": 0, "controls_accepted": 0, "mutants": 0,
                           "accepted": [], "kinds": Counter(), "untokenizable": 0}
    docs = []
    for _ in range(WALKS):
        tokens = walk(backend.matcher(compiled), words, eos, rng, WALK_TOKENS, closers, mask_us,
                      mask_cpu_us)
        if tokens is None:
            continue
        out["finished"] += 1
        text = b"".join(table.token_bytes[t] or b"" for t in tokens).decode("utf-8", "replace")
        try:
            doc = json.loads(text)
        except ValueError:
            out["invalid_walks"].append(text[:EXAMPLE_CHARS])
            continue
        verdict = valid(doc)
        if verdict is None:
            out["unjudged"] += 1
        elif verdict:
            out["valid"] += 1
            docs.append(doc)
        else:
            out["invalid_walks"].append(text[:EXAMPLE_CHARS])
    for doc in filter(writable, docs):  # not one with a number past the largest float
        tokens = doc_tokens(compact(doc), table.encode, table.token_bytes)
        if tokens is not None:
            out["controls"] += 1
            out["controls_accepted"] += accepts(backend.matcher(compiled), tokens, words, eos)
        for kind, text in invalid_documents(doc, valid, MUTANTS, rng):
            tokens = doc_tokens(text, table.encode, table.token_bytes)
            if tokens is None:
                out["untokenizable"] += 1
                continue
            out["mutants"] += 1
            out["kinds"][kind] += 1
            if accepts(backend.matcher(compiled), tokens, words, eos):
                out["accepted"].append((kind, text[:EXAMPLE_CHARS].decode("utf-8", "replace")))
    out["mask_us"] = mask_us
    out["mask_cpu_us"] = mask_cpu_us
    out["kinds"] = dict(out["kinds"])
    return out


class EngineProcess:
    def __init__(self, engine: str, timeout: float) -> None:
        self.engine = engine
        self.timeout = timeout
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        # daemonic: radixrt's outlines-core engine then builds its index in this process (a
        # daemonic one cannot start children), which the parent stops at the limit
        self.proc = ctx.Process(target=serve, args=(self.engine, self.timeout, child),
                                daemon=True)
        self.proc.start()
        if self._wait(600.0):
            raise RuntimeError(f"the {self.engine} process did not start")
        assert self.conn.recv() == "ready"

    def _wait(self, seconds: float) -> str:
        """Wait for a reply: "" when it is there, else why the process was stopped ("timeout"
        past `seconds`, "crashed": it died or passed the memory limit)."""
        import psutil

        deadline = time.monotonic() + seconds
        while not self.conn.poll(min(0.5, max(deadline - time.monotonic(), 0))):
            try:
                rss = psutil.Process(self.proc.pid).memory_info().rss
            except psutil.NoSuchProcess:
                rss = 0
            why = ("crashed" if rss > MEMORY_LIMIT or not self.proc.is_alive() else
                   "timeout" if time.monotonic() >= deadline else "")
            if why:
                self.proc.kill()
                self.proc.join()
                return why
        return ""

    def run(self, schema_text: str, seed: int, walk_timeout: float) -> dict[str, Any]:
        self.conn.send((schema_text, seed))
        reply = self._reply(self.timeout)
        if reply is None or reply["status"] != "compiled":
            return reply or {"status": self.stopped}
        walked = self._reply(walk_timeout)
        return {**reply, **(walked or {"walks_stopped": self.stopped})}

    def _reply(self, seconds: float) -> dict[str, Any] | None:
        """The next reply, or None (self.stopped says why; a fresh process is started)."""
        self.stopped = self._wait(seconds)
        if not self.stopped:
            try:
                return self.conn.recv()
            except EOFError:  # it died (poll saw the pipe close)
                self.proc.join()
                self.stopped = "crashed"
        self._start()
        return None

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(timeout=10)


# --- the run ----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default=None,
                   help="JSONSchemaBench's data folder (default: /tmp/jsb/data, else "
                        "../shared/jsonschemabench's tarball extracted into a temporary folder)")
    p.add_argument("--per-folder", type=int, default=None, help="default 40 (--quick: 2)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds a compile may take; default 30, the server's "
                        "--grammar-compile-timeout (--quick: 10)")
    p.add_argument("--walk-timeout", type=float, default=120.0,
                   help="seconds a compiled schema's walks and mutants may take")
    p.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    p.add_argument("--json", default=None,
                   help="also write every schema's result here (after each engine)")
    p.add_argument("--from-json", default=None,
                   help="no run: print the tables and draw the plot from what --json wrote")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    add_plot_dir(p)
    args = p.parse_args(argv)
    if args.per_folder is None:
        args.per_folder = 2 if args.quick else 40
    if args.timeout is None:
        args.timeout = 10.0 if args.quick else 30.0
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        results = {e: [tuple(row) for row in rows] for e, rows in saved["results"].items()}
        report(results, len(next(iter(results.values()))), saved["args"]["timeout"])
        plot(results, args.plot_dir)
        return
    data = find_data(args.data)
    if data is None:
        sys.exit(f"no JSONSchemaBench data at {args.data or '/tmp/jsb/data'}, and no "
                 "../shared/jsonschemabench/jsonschemabench-data.tar.xz to extract")
    schemas = sample(data, args.per_folder)
    print(f"{len(schemas)} schemas from {data}, {args.per_folder} per folder; compile limit "
          f"{args.timeout:.0f} s", flush=True)
    results: Results = {}
    for engine in args.engines:
        why = unavailable(engine)
        if why is not None:
            print(f"{engine}: skipped ({why})", flush=True)
            continue
        start = time.monotonic()
        proc = EngineProcess(engine, args.timeout)
        rows = []
        for i, (folder, name, text) in enumerate(schemas):
            rows.append((folder, name, proc.run(text, args.seed + i, args.walk_timeout)))
            if (i + 1) % 40 == 0 or i + 1 == len(schemas):
                s = summary([r for _, _, r in rows])
                print(f"  {engine}: {i + 1}/{len(schemas)} schemas, {s['compiled']} compiled, "
                      f"{s['timeout']} past the limit, {time.monotonic() - start:.0f} s",
                      flush=True)
        proc.close()
        results[engine] = rows
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "results": results}, f)
    report(results, len(schemas), args.timeout)
    plot(results, args.plot_dir)


if __name__ == "__main__":
    main()
