"""Pooling rows chunk by chunk equals pooling them at once; an embedding is cut, then
normalized; a classify request reads the head it names (no model: a stand-in with a real
classification head and a real LM head projection)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from radixrt.runtime.models.pooler import PoolState, pooled_output
from radixrt.runtime.pooling_params import Pooling

HIDDEN = 12


def chunked(rows: torch.Tensor, spec: Pooling, sizes: list[int]) -> torch.Tensor:
    state, start = PoolState(spec), 0
    for size in sizes:
        state.add(rows[start : start + size], start)
        start += size
    return state.pooled(rows[-1])


@pytest.mark.parametrize("sizes", [[10], [1, 9], [3, 3, 4], [1] * 10])
def test_chunks_pool_as_the_whole_prompt(sizes: list[int]) -> None:
    rows = torch.randn(10, HIDDEN, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(chunked(rows, Pooling("embed", mode="mean"), sizes), rows.mean(0),
                          atol=1e-6)
    assert torch.equal(chunked(rows, Pooling("embed", mode="cls"), sizes), rows[0])
    assert torch.equal(chunked(rows, Pooling("embed"), sizes), rows[-1])


def test_a_pool_that_missed_its_rows_says_so() -> None:
    rows = torch.randn(4, HIDDEN)
    mean = PoolState(Pooling("embed", mode="mean"))
    with pytest.raises(RuntimeError, match="not computed whole"):
        mean.pooled(rows[-1])
    cls = PoolState(Pooling("embed", mode="cls"))
    cls.add(rows[2:], 2)  # position 0 came from a cache: never seen
    with pytest.raises(RuntimeError, match="never saw position 0"):
        cls.pooled(rows[-1])


class StandIn(nn.Module):
    """What pooled_output reads of a CausalLM: `score` and classify(), or compute_logits()."""

    def __init__(self, labels: int) -> None:
        super().__init__()
        self.score = nn.Parameter(torch.randn(labels, HIDDEN)) if labels else None
        self.head = nn.Parameter(torch.randn(50, HIDDEN))

    def classify(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.score.t()

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.head.t()


def test_outputs_of_each_task() -> None:
    vector = torch.randn(HIDDEN)
    out = pooled_output(StandIn(0), vector, Pooling("embed", normalize=True, dimensions=5))
    assert torch.allclose(out, vector[:5] / vector[:5].norm())  # cut, then normalized
    assert out.norm().item() == pytest.approx(1.0)
    assert torch.equal(pooled_output(StandIn(0), vector, Pooling("embed")), vector)
    model = StandIn(3)
    assert torch.allclose(pooled_output(model, vector, Pooling("classify")),
                          model.score @ vector)
    lm = StandIn(0)
    out = pooled_output(lm, vector, Pooling("classify", label_tokens=(7, 3)))
    assert torch.allclose(out, (lm.head @ vector)[[7, 3]])
    with pytest.raises(RuntimeError, match="without label_tokens"):
        pooled_output(lm, vector, Pooling("classify"))
