"""Pooling a request's final hidden states into one vector, chunk by chunk (chunked prefill
hands the rows over in pieces), and what comes back: an embedding (cut to `dimensions`, then
normalized) or a head's logits (pooling_params.py says what each task returns)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from radixrt.runtime.models.decoder import CausalLM
from radixrt.runtime.pooling_params import Pooling

NORM_EPS = 1e-12  # torch.nn.functional.normalize's


@dataclass
class PoolState:
    """What a request has pooled of its prompt so far."""

    spec: Pooling
    total: Tensor | None = None  # "mean": the sum of the rows so far [hidden] float32
    count: int = 0  # rows summed
    first: Tensor | None = None  # "cls": position 0's row [hidden]

    def add(self, rows: Tensor, start: int) -> None:
        """rows [n, hidden]: the final hidden states of prompt positions start .. start+n-1."""
        if self.spec.mode == "mean":
            part = rows.float().sum(dim=0)
            self.total = part if self.total is None else self.total + part
            self.count += rows.shape[0]
        elif self.spec.mode == "cls" and start == 0:
            self.first = rows[0].float().clone()  # not a view: the step's hidden states go

    def pooled(self, last_row: Tensor) -> Tensor:
        """The pooled vector [hidden] float32, once the prompt's last row (last_row) is known."""
        if self.spec.mode == "mean":
            if self.total is None or not self.count:
                raise RuntimeError("mean pooling saw no rows: its prompt was not computed whole")
            return self.total / self.count
        if self.spec.mode == "cls":
            if self.first is None:
                raise RuntimeError("CLS pooling never saw position 0 computed")
            return self.first
        return last_row.float()


def pool_runs(model: CausalLM, hidden: Tensor,
              runs: Sequence[tuple[PoolState | None, int, int, bool]]) -> list[Tensor | None]:
    """A step's runs in batch order, each (its pool or None, start, rows, whether it ends the
    prompt): each pooling run's rows go into its pool; one that ends its prompt gets its
    output (pooled_output), the others None. hidden: [num_tokens, hidden]."""
    outs: list[Tensor | None] = []
    offset = 0
    for pool, start, count, ends in runs:
        out = None
        if pool is not None:  # a pooling request never forks nor drafts (SamplingParams)
            rows = hidden[offset : offset + count]  # [count, hidden]
            pool.add(rows, start)
            if ends:
                out = pooled_output(model, pool.pooled(rows[-1]), pool.spec)
        outs.append(out)
        offset += count
    return outs


def pooled_output(model: CausalLM, vector: Tensor, spec: Pooling) -> Tensor:
    """vector [hidden] -> what the request gets back [k] float32."""
    if spec.task == "embed":
        out = vector if spec.dimensions is None else vector[: spec.dimensions]
        if spec.normalize:
            out = out / out.norm().clamp_min(NORM_EPS)
        return out
    if model.score is not None:  # the checkpoint's classification head
        return model.classify(vector[None].to(model.score.dtype))[0]
    if not spec.label_tokens:
        raise RuntimeError("a classify request on an LM head without label_tokens")
    logits = model.compute_logits(vector[None].to(next(model.parameters()).dtype))[0]
    return logits[list(spec.label_tokens)]
