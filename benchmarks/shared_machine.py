"""The server beside other work: the LLM-judge program of `make demo` (examples/llm_judge.py) run
again and again on one `rx.Runtime`, on a quiet machine and with busy neighbouring processes
(each a CPU-bound loop that takes a core), in one run.

With N cores and a neighbour taking one, the server has N - 1 cores' worth of time: a program
should take at most about N / (N - 1) times as long. What breaks that is threads that spin while
they wait (an OpenMP barrier whose partner thread the neighbour has pushed off its core, a
second process's spinning pool): then a program can take many times as long, and unevenly.
This script reports each condition's median and worst program time, and the ratio to the quiet
median against the proportional bound, and draws docs/plots/shared_machine.png.

    python benchmarks/shared_machine.py                  # 12 programs per condition
    python benchmarks/shared_machine.py --programs 30 --neighbours 0 1 2
    python benchmarks/shared_machine.py --quick          # a smoke test
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import llm_judge  # noqa: E402
from plots import add_plot_dir, bar_panels, plot_path  # noqa: E402

import radixrt as rx  # noqa: E402

NEIGHBOUR = "while True: pass"  # a CPU-bound loop: one core's worth of work


@dataclass(frozen=True)
class Condition:
    neighbours: int
    times: list[float]  # seconds per program

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--programs", type=int, default=12, help="programs per condition")
    p.add_argument("--neighbours", type=int, nargs="+", default=[0, 1],
                   help="busy neighbouring processes of each condition")
    p.add_argument("--quick", action="store_true", help="3 programs per condition")
    add_plot_dir(p)
    args = p.parse_args(argv)
    if args.quick:
        args.programs = 3
    return args


def run_condition(rt: rx.Runtime, neighbours: int, programs: int) -> Condition:
    burners = [subprocess.Popen([sys.executable, "-c", NEIGHBOUR]) for _ in range(neighbours)]
    try:
        time.sleep(0.5 if neighbours else 0)  # let them take their cores
        times = []
        for i in range(programs):
            start = time.perf_counter()
            llm_judge.judge.run(article=f"{llm_judge.ARTICLE} (round {neighbours}.{i})",
                                backend=rt)
            times.append(time.perf_counter() - start)
        return Condition(neighbours, times)
    finally:
        for b in burners:
            b.kill()
            b.wait()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    rows = []
    with rx.Runtime(max_total_tokens=16384) as rt:
        llm_judge.judge.run(article="warm-up", backend=rt)
        for n in args.neighbours:
            rows.append(run_condition(rt, n, args.programs))
            c = rows[-1]
            print(f"{n} busy neighbour(s): median {c.median:.2f} s, worst {max(c.times):.2f} s",
                  flush=True)
    quiet = next((c for c in rows if c.neighbours == 0), rows[0])
    print("\n| busy neighbours | median s | worst s | median / quiet | proportional bound |")
    print("|---:|---:|---:|---:|---:|")
    for c in rows:
        bound = cores / max(cores - c.neighbours, 1)
        print(f"| {c.neighbours} | {c.median:.2f} | {max(c.times):.2f} "
              f"| {c.median / quiet.median:.2f}x | {bound:.2f}x |")
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    print(f"\nexamples/llm_judge.py on rx.Runtime (the default server), {args.programs} programs "
          f"per condition; a neighbour is `python -c '{NEIGHBOUR}'`")
    print(f"date: {date}; cores {cores}")
    print(f"command: {shlex.join([os.path.basename(sys.executable), *sys.argv])}")
    groups = [f"{c.neighbours} neighbour(s)" for c in rows]
    bar_panels(plot_path("shared_machine", args.plot_dir), "LLM judge beside busy neighbours",
               groups, [("seconds per program", {"median": [c.median for c in rows],
                                                 "worst": [max(c.times) for c in rows]})],
               f"{cores} cores; each neighbour a CPU-bound loop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
