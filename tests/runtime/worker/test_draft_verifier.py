"""Verification's rule (worker/draft_verifier.py): the drafts kept are those the samples match, in
order, up to a stop token or a place where jump-forward takes over; and for temperature > 0 that
rule is speculative sampling's rejection rule for a one-token draft: a draft d is kept with
probability p(d), and a rejected position's token is distributed as p without d."""

from __future__ import annotations

import pytest
import torch

from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.worker.draft_verifier import accepted_count
from radixrt.runtime.worker.sampler import Sampler, SamplingRow


@pytest.mark.parametrize("draft, sampled, stops, want", [
    ([5, 6, 7], [5, 6, 7, 8], (), 3),  # all kept, then the token after them
    ([5, 6, 7], [5, 9, 7, 8], (), 1),  # the first mismatch ends it
    ([5, 6, 7], [4, 6, 7, 8], (), 0),
    ([5, 0, 7], [5, 0, 7, 8], (0,), 1),  # a stop token is the last token emitted
    ([], [3], (), 0),
])
def test_kept_drafts(draft: list[int], sampled: list[int], stops: tuple, want: int) -> None:
    assert accepted_count(draft, sampled, stops) == want


def test_jump_forward_takes_over_where_the_grammar_forces() -> None:
    asked: list[int] = []

    def goes_on(token: int) -> bool:
        asked.append(token)
        return token != 6  # after 6 the grammar forces tokens

    assert accepted_count([5, 6, 7], [5, 6, 7, 8], (), goes_on) == 1
    assert asked == [5, 6]


def test_the_sample_count_must_fit_the_draft() -> None:
    with pytest.raises(ValueError, match="samples for a draft"):
        accepted_count([1, 2], [1, 2], ())


def test_keeping_a_sample_equal_to_the_draft_is_the_rejection_rule() -> None:
    """Over many unseeded draws of one processed distribution p: the draft is kept with
    frequency p(d), and the tokens of rejected draws follow p without d, renormalised."""
    vocab, draws, d = 6, 40_000, 2
    logits = torch.tensor([[1.0, 0.5, 2.0, -1.0, 0.0, 1.5]])
    sampler = Sampler(vocab, [0], "cpu", base_seed=7)
    params = SamplingParams(temperature=0.8, max_tokens=4)
    p = torch.softmax(logits[0] / 0.8, dim=-1)
    out = sampler.sample(logits.expand(draws, vocab).contiguous(),
                         [SamplingRow(params) for _ in range(draws)])
    tokens = torch.tensor(out.token_ids)
    kept = [accepted_count([d], [int(t), 0], ()) for t in tokens]
    rate = sum(kept) / draws
    assert abs(rate - float(p[d])) < 4 * (float(p[d]) * (1 - float(p[d])) / draws) ** 0.5
    rejected = tokens[torch.tensor(kept) == 0]
    freq = torch.bincount(rejected, minlength=vocab).double() / len(rejected)
    residual = p.double().clone()
    residual[d] = 0
    residual /= residual.sum()
    expected = residual * len(rejected)
    chi2 = float((((freq * len(rejected)) - expected) ** 2 / expected.clamp(min=1e-9))[
        residual > 0].sum())
    assert freq[d] == 0 and chi2 < 20.5  # 5 degrees of freedom: p < 0.001
