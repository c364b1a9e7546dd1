"""The rows of a step's hidden states the worker reads: those that need logits (sampling,
prompt logprobs) and the samples drawn from them."""

from __future__ import annotations

from dataclasses import dataclass

from radixrt.runtime.messages import Run
from radixrt.runtime.worker.grammar_rows import MaskRow
from radixrt.runtime.worker.sampler import SamplingRow


@dataclass
class LogitRows:
    """Which rows of the step's hidden states need logits, and why."""

    rows: list[int]
    sample: list[tuple[int, Run]]  # (index into rows, run) for runs that sample
    prompt: list[tuple[int, int, Run]]  # (first index into rows, count, run) for prompt logprobs


@dataclass
class Draws:
    """The step's sampled rows: logits row, sampling row, owner rid and grammar of each (grammars
    empty where no row has one), the rows whose token jump-forward already appended, and where
    each run with a draft has its 1 + len(draft) rows."""

    row_index: list[int]
    rows: list[SamplingRow]
    owners: list[int]
    grammars: list[MaskRow | None]
    known: dict[int, tuple[int, int]]  # rid -> (logits row, the token already known)
    drafted: dict[int, int]  # rid -> index of its first row in `rows`
