"""Sampler: processing order, penalties against per-row formulas, seeding, statistics, logprobs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.worker.sampler import Sampler, SamplingRow, prompt_logprobs

VOCAB = 97
EOS = 2


def make_sampler(vocab: int = VOCAB, base_seed: int = 0) -> Sampler:
    return Sampler(vocab, [EOS], "cpu", base_seed=base_seed)


def rand_logits(bs: int, vocab: int = VOCAB, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(bs, vocab, generator=g) * scale  # [bs, vocab]


def row(output_ids: Sequence[int] = (), prompt_ids: Sequence[int] = (), **kw: Any) -> SamplingRow:
    return SamplingRow(SamplingParams(**kw), prompt_ids=prompt_ids, output_ids=output_ids)


def test_row_output_index_defaults_to_output_length() -> None:
    assert SamplingRow(SamplingParams(), output_ids=[1, 2, 3]).output_index == 3
    assert SamplingRow(SamplingParams(), output_ids=[1], output_index=7).output_index == 7


def test_greedy_is_argmax() -> None:
    logits = rand_logits(6)
    out = make_sampler().sample(logits, [row(temperature=0.0) for _ in range(6)])
    assert out.token_ids == logits.argmax(-1).tolist()


def test_the_cpu_kernel_sampler_draws_and_scores_as_torch_does() -> None:
    """native=True (the worker's, where the CPU kernels run): greedy tokens and every row's
    logprob from the kernel's argmax and log-sum-exp, the same as torch's; mixed batches."""
    logits = rand_logits(5, vocab=49152, seed=3)
    logits[1, 7] = logits[1, 9] = logits[1].max() + 1  # a tie: the first
    batches = [[row(temperature=0.0, logprobs=True, top_logprobs=3) for _ in range(5)],
               [row(temperature=0.0), row(seed=4), row(temperature=0.0, top_k=2),
                row(logprobs=True, seed=5), row(temperature=0.0, logprobs=True)]]
    for rows in batches:
        ref = Sampler(49152, [EOS], "cpu").sample(logits, rows)
        got = Sampler(49152, [EOS], "cpu", native=True).sample(logits, rows)
        assert got.token_ids == ref.token_ids
        assert got.logprobs == pytest.approx(ref.logprobs, abs=1e-5)
        assert [[t for t, _ in top] for top in got.top_logprobs] == \
            [[t for t, _ in top] for top in ref.top_logprobs]
    assert got.token_ids[0] == int(logits[0].argmax())  # the last batch's greedy first row


@pytest.mark.parametrize("kw", [{"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}])
def test_truncation_to_one_token_equals_greedy(kw: dict[str, float]) -> None:
    logits = rand_logits(8, seed=1)
    sampler = make_sampler()
    for _ in range(5):
        out = sampler.sample(logits, [row(temperature=1.5, **kw) for _ in range(8)])
        assert out.token_ids == logits.argmax(-1).tolist()


def test_top_k_and_top_p_restrict_support() -> None:
    logits = rand_logits(1, seed=2)
    order = logits[0].argsort(descending=True).tolist()
    sampler = make_sampler()
    seen_k = {sampler.sample(logits, [row(top_k=3)]).token_ids[0] for _ in range(300)}
    assert seen_k <= set(order[:3]) and len(seen_k) >= 2
    probs = logits[0].softmax(-1)[order]
    n_keep = int((probs.cumsum(0) - probs < 0.6).sum())  # smallest set with mass >= 0.6
    seen_p = {sampler.sample(logits, [row(top_p=0.6)]).token_ids[0] for _ in range(300)}
    assert seen_p <= set(order[:n_keep])
    floor = 0.2 * probs[0]
    allowed = {t for t, p in zip(order, probs.tolist(), strict=True) if p >= floor}
    seen_m = {sampler.sample(logits, [row(min_p=0.2)]).token_ids[0] for _ in range(300)}
    assert seen_m <= allowed


def test_logit_bias_forces_token() -> None:
    logits = rand_logits(3, seed=3)
    rows = [row(logit_bias={11: 100.0}), row(temperature=0.0, logit_bias={50: 100.0}),
            row(temperature=0.0)]
    out = make_sampler().sample(logits, rows)
    assert out.token_ids == [11, 50, int(logits[2].argmax())]
    # logprobs describe the raw model distribution, not the biased one
    assert out.logprobs[0] == pytest.approx(float(logits[0].log_softmax(-1)[11]), abs=1e-5)


def reference_penalised(logits: torch.Tensor, r: SamplingRow) -> torch.Tensor:
    """Direct per-row computation of bias -> repetition -> frequency/presence (no vectorising)."""
    x = logits.clone()
    p = r.params
    for t, b in (p.logit_bias or {}).items():
        x[t] += b
    for t in set(r.prompt_ids) | set(r.output_ids):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(r.output_ids):
        c = list(r.output_ids).count(t)
        x[t] -= p.frequency_penalty * c + p.presence_penalty
    return x


def test_penalties_match_per_row_formulas() -> None:
    logits = rand_logits(5, seed=4)
    rows = [
        row([5, 5, 7], [1, 2, 3], temperature=0.0, repetition_penalty=1.3),
        row([5, 5, 7, 9], [1, 9], temperature=0.0, frequency_penalty=0.7),
        row([5, 5, 7], [8], temperature=0.0, presence_penalty=-1.1),
        row([4, 4, 4, 6], [3, 4], temperature=0.0, repetition_penalty=0.8, frequency_penalty=0.3,
            presence_penalty=0.5, logit_bias={4: 2.0, 10: -3.0}),
        row([1, 2, 3], [4, 5], temperature=0.0),  # no features: untouched
    ]
    sampler = make_sampler()
    processed = sampler._process(logits, rows)
    for i, r in enumerate(rows):
        torch.testing.assert_close(processed[i], reference_penalised(logits[i], r))
    assert torch.equal(processed[4], logits[4])
    out = sampler.sample(logits, rows)
    assert out.token_ids == [int(reference_penalised(logits[i], r).argmax())
                             for i, r in enumerate(rows)]


def test_penalty_makes_repeated_token_lose() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 7] = 1.0
    logits[0, 8] = 0.9
    out = make_sampler().sample(logits, [row([7], temperature=0.0, presence_penalty=0.5)])
    assert out.token_ids == [8]


def test_no_penalty_rows_skip_history_work() -> None:
    logits = rand_logits(2, seed=5)
    processed = make_sampler()._process(logits, [row([1, 2]), row([3], temperature=0.0)])
    assert processed is logits  # nothing to do: not even a copy


def test_min_tokens_masks_eos_and_stop_ids() -> None:
    logits = torch.zeros(4, VOCAB)
    logits[:, EOS] = 50.0
    logits[:, 9] = 40.0
    logits[:, 5] = 30.0
    rows = [
        row([1], temperature=0.0, min_tokens=3),  # masked: eos -> next best 9
        row([1], temperature=0.0, min_tokens=3, stop_token_ids=[9]),  # both masked -> 5
        row([1, 1, 1], temperature=0.0, min_tokens=3),  # reached: eos allowed
        row([1], temperature=0.0, min_tokens=3, ignore_eos=True),  # eos is no stop: not masked
    ]
    assert make_sampler().sample(logits, rows).token_ids == [9, 5, EOS, EOS]


def test_seeded_rows_reproducible_across_batches() -> None:
    logits = rand_logits(1, seed=6, scale=1.0)  # flat-ish: many plausible tokens
    target = SamplingRow(SamplingParams(seed=1234), output_ids=[3, 4], seed_offset=1)
    alone = make_sampler(base_seed=0).sample(logits, [target]).token_ids[0]
    others = rand_logits(4, seed=7)
    batch = torch.cat([others[:2], logits, others[2:]])  # target at position 2
    rows = [row(), row(temperature=0.0), target, row(seed=99), row(top_k=5)]
    for base_seed in (1, 2, 3):
        out = make_sampler(base_seed=base_seed).sample(batch, rows)
        assert out.token_ids[2] == alone
    # also independent of how many steps the sampler has run before
    sampler = make_sampler()
    for _ in range(3):
        sampler.sample(batch, rows)
    assert sampler.sample(logits, [target]).token_ids[0] == alone


def test_seed_offset_and_output_index_change_the_draw() -> None:
    logits = torch.zeros(1, 1000)  # uniform: any two draws collide with probability 1/1000
    sampler = make_sampler(vocab=1000)

    def draw(seed: int, offset: int, index: int) -> int:
        r = SamplingRow(SamplingParams(seed=seed), output_index=index, seed_offset=offset)
        return sampler.sample(logits, [r]).token_ids[0]

    base = draw(1, 0, 0)
    assert draw(1, 0, 0) == base
    assert len({base, draw(1, 1, 0), draw(1, 0, 1), draw(2, 0, 0)}) >= 3


def test_unseeded_sampling_matches_softmax() -> None:
    vocab, n = 50, 20000
    logits = rand_logits(1, vocab=vocab, seed=8, scale=1.0)
    temperature = 0.8
    expected = (logits[0] / temperature).softmax(-1) * n  # [vocab]
    sampler = make_sampler(vocab=vocab, base_seed=123)
    rows = [row(temperature=temperature) for _ in range(500)]
    counts = torch.zeros(vocab)
    for _ in range(n // len(rows)):
        out = sampler.sample(logits.expand(len(rows), vocab), rows)
        counts += torch.bincount(torch.tensor(out.token_ids), minlength=vocab)
    big = expected >= 5  # pool the rare tokens into one cell
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    wanted = torch.cat([expected[big], expected[~big].sum()[None]])
    chi2 = float(((observed - wanted) ** 2 / wanted.clamp(min=1e-9)).sum())
    dof = int(big.sum())
    assert chi2 < dof + 6 * math.sqrt(2 * dof), (chi2, dof)  # mean dof, sd sqrt(2 dof)


def test_logprobs_are_raw_log_softmax() -> None:
    logits = rand_logits(4, seed=9)
    rows = [row(logprobs=True, temperature=0.5, top_k=3, repetition_penalty=1.5),
            row(temperature=0.0), row(logprobs=True, top_p=0.5), row()]
    out = make_sampler().sample(logits, rows)
    logp = logits.log_softmax(-1)
    for i, t in enumerate(out.token_ids):
        assert out.logprobs[i] == pytest.approx(float(logp[i, t]), abs=1e-5)


def test_top_logprobs_sorted_and_sized() -> None:
    logits = rand_logits(3, seed=10)
    rows = [row(top_logprobs=5), row(top_logprobs=0, logprobs=True), row(top_logprobs=20)]
    out = make_sampler().sample(logits, rows)
    assert [len(t) for t in out.top_logprobs] == [5, 0, 20]
    logp = logits.log_softmax(-1)
    for i in (0, 2):
        values = [v for _, v in out.top_logprobs[i]]
        assert values == sorted(values, reverse=True)
        ids = [t for t, _ in out.top_logprobs[i]]
        assert ids == logp[i].topk(len(ids)).indices.tolist()
        for t, v in out.top_logprobs[i]:
            assert v == pytest.approx(float(logp[i, t]), abs=1e-5)


def test_rows_without_features_unaffected_by_neighbours() -> None:
    logits = rand_logits(3, seed=11)
    plain = [SamplingRow(SamplingParams(seed=5)), SamplingRow(SamplingParams(temperature=0.0))]
    reference = make_sampler().sample(logits[[0, 2]], plain).token_ids
    busy = row([1, 2, 3], [4], repetition_penalty=2.0, frequency_penalty=1.0, logit_bias={0: 5.0},
               min_tokens=5, top_k=3, top_p=0.3, min_p=0.1, temperature=0.3)
    for _ in range(3):
        out = make_sampler().sample(logits, [plain[0], busy, plain[1]])
        assert [out.token_ids[0], out.token_ids[2]] == reference
    processed = make_sampler()._process(logits, [plain[0], busy, plain[1]])
    assert torch.equal(processed[0], logits[0]) and torch.equal(processed[2], logits[2])


def test_shape_mismatch_and_empty_batch() -> None:
    sampler = make_sampler()
    with pytest.raises(ValueError, match="does not match"):
        sampler.sample(torch.zeros(2, VOCAB), [row()])
    out = sampler.sample(torch.zeros(0, VOCAB), [])
    assert out.token_ids == [] and out.logprobs == [] and out.top_logprobs == []


def test_prompt_logprobs() -> None:
    logits = rand_logits(6, seed=12)
    targets = [3, 1, 4, 1, 5, 9]
    chosen, top = prompt_logprobs(logits, targets, top_k=3)
    logp = logits.log_softmax(-1)
    assert chosen == pytest.approx([float(logp[i, t]) for i, t in enumerate(targets)], abs=1e-5)
    assert all(len(t) == 3 for t in top)
    assert [t for t, _ in top[0]] == logp[0].topk(3).indices.tolist()
    chosen0, top0 = prompt_logprobs(logits, torch.tensor(targets), top_k=0)
    assert chosen0 == pytest.approx(chosen) and top0 == [[]] * 6
