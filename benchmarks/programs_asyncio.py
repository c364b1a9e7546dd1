"""`programs.py --asyncio`: the few-shot workload with threads vs asyncio, in one run on one
runtime.

The same few-shot programs (an MMLU-style shared prefix, then a `select` of A-D) run at 64 and
at 512 concurrent programs, each way: `run_batch(num_threads=N)` (a thread per program in
flight, and one per state) and `await arun_batch(max_concurrency=N)` (greenlets on one event
loop), each from a cold cache. Measured: programs/s, the threads the process had at its peak,
and whether the picks agree. The plot goes to docs/plots/programs_asyncio.png.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from plots import bar_panels, plot_path
from programs_workloads import Workload, build_workloads
from programs_workloads import warm_up_program as warm_up

import radixrt as rx

CONCURRENCY = (64, 512)


class PeakThreads:
    """The most threads this process had while it was sampled (every 20 ms, on a thread of
    its own, which is not counted)."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakThreads:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, threading.active_count() - 1)


def timed(fn: Callable[[], list[rx.ProgramState]]) -> tuple[float, int, list[Any]]:
    with PeakThreads() as threads:
        start = time.perf_counter()
        states = fn()
        seconds = time.perf_counter() - start
    return seconds, threads.peak, [st["answer"] for st in states]


def run_asyncio_study(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with rx.Runtime(max_total_tokens=args.max_total_tokens, log_level="warning") as rt:
        warm_up.run(backend=rt)
        for n in CONCURRENCY:
            work: Workload = build_workloads(["few-shot"], n, args.sizes, args.seed)[0]
            rt.flush_cache()  # each way starts cold: the other's prompts are not cached
            threads = timed(functools.partial(work.program.run_batch, work.inputs, backend=rt,
                                              num_threads=n))
            rt.flush_cache()
            loop = timed(lambda w=work, k=n: asyncio.run(  # type: ignore[misc]
                w.program.arun_batch(w.inputs, backend=rt, max_concurrency=k)))
            rows.append({"programs": n, "threads": threads, "asyncio": loop})
            print(f"{n} programs: threads {n / threads[0]:.2f}/s (peak {threads[1]} threads), "
                  f"asyncio {n / loop[0]:.2f}/s (peak {loop[1]} threads)", flush=True)
    print_asyncio(rows, args)
    plot_asyncio(rows, args)
    return rows


def print_asyncio(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print("\n| concurrent programs | threads: programs/s | peak threads | asyncio: programs/s "
          "| peak threads | asyncio / threads | same picks |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        n, (ts, tp, ta), (ls, lp, la) = row["programs"], row["threads"], row["asyncio"]
        same = sum(a == b for a, b in zip(ta, la))
        print(f"| {n} | {n / ts:.2f} | {tp} | {n / ls:.2f} | {lp} | {ts / ls:.2f}x "
              f"| {same}/{n} |")
    print(f"\nfew-shot ({args.sizes.shots} shots), one rx.Runtime, CPU count {os.cpu_count()}")
    print(f"command: {shlex.join([os.path.basename(sys.executable), *sys.argv])}")


def plot_asyncio(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    groups = [f"{row['programs']} programs" for row in rows]
    rate = {way: [row["programs"] / row[way][0] for row in rows] for way in ("threads", "asyncio")}
    peak = {way: [float(row[way][1]) for row in rows] for way in ("threads", "asyncio")}
    bar_panels(plot_path("programs_asyncio", args.plot_dir),
               "few-shot programs: run_batch (threads) vs arun_batch (asyncio)", groups,
               [("programs/s (higher is better)", rate),
                ("peak threads in the process (lower is better)", peak)],
               "the same programs on one rx.Runtime, N programs in flight at once")
