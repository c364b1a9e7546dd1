"""How the model's CPU threads wait: briefly spinning, then asleep.

The worker's products, the CPU kernels and torch's own ops run on torch's OpenMP threads, which
meet at a barrier after every parallel loop (a few hundred a decode step). By default a waiting
OpenMP thread spins for about 300,000 rounds (milliseconds) before it sleeps. On a machine of
its own that is the fastest wait; beside a busy neighbouring process it is the slowest: the
spinning thread holds the core that its partner, pushed off by the neighbour, needs to reach
the barrier, and a step stalls for whole scheduler slices (measured: the LLM-judge program of
`make demo` 3.4x slower with one busy neighbour on 2 cores, against 2x for its share of them).

So the processes that run the model (the worker, tensor-parallel ranks) start with a short spin
(WAIT_SPINS rounds, tens of microseconds: a barrier of a decode step is over within them) and
sleep after it: with one busy neighbour the program takes at most about its share of the cores
longer (benchmarks/shared_machine.py), and on a quiet machine the step is as fast as before
(docs/benchmarks.md). A user who sets OMP_WAIT_POLICY or GOMP_SPINCOUNT keeps theirs. The
in-process Engine runs the model in the caller's process, whose OpenMP runtime has read its
environment already: set GOMP_SPINCOUNT there before Python starts, if it shares the machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# rounds a waiting OpenMP thread spins before it sleeps (libgomp's GOMP_SPINCOUNT)
WAIT_SPINS = 1000
# a user's own setting of the wait, kept as it is
USER_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def model_process_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables to start a model-running process with (beside the parent's)."""
    if any(name in environ for name in USER_WAIT_VARIABLES):
        return {}
    return {"GOMP_SPINCOUNT": str(WAIT_SPINS)}


def openmp_wait(environ: Mapping[str, str] = os.environ) -> str:
    """How this process's OpenMP threads wait, as its environment set it (for /server_info and
    the start-up log)."""
    found = [f"{name}={environ[name]}" for name in USER_WAIT_VARIABLES if name in environ]
    return ", ".join(found) or "libgomp's default (spin about 300,000 rounds, then sleep)"
