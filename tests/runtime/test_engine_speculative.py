"""Speculative decoding from the radix tree on the real default model: the outputs with it on are
the outputs with it off (greedy tokens identical, logprobs within 1e-4; seeded samples identical),
with page sizes 1 and 16, overlap, grammars, stop strings, n > 1 and preemption, while drafts are
really made and accepted where the output copies its prompt or an earlier answer."""

from __future__ import annotations

import pytest

from radixrt import SamplingParams

RECORD = ('{"name": "Ada Lovelace", "born": 1815, "field": "mathematics", '
          '"known_for": ["notes on the Analytical Engine", "the first algorithm"], '
          '"city": "London"}')
COPY = f"Repeat this JSON record exactly:\n{RECORD}\nRepeated:\n"
PROSE = "Write two sentences about the sea."
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "born": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "born", "city"], "additionalProperties": False}


def both(make_engine, prompts, params, **options):
    """The outputs with speculation off and on (same options), and the on engine's stats."""
    off = make_engine(speculative_algorithm=None, **options).generate(prompts, params)
    engine = make_engine(speculative_algorithm="radix", **options)
    on = engine.generate(prompts, params)
    return off, on, engine.stats()


def samples(outputs):
    return [(s.token_ids, s.finish_reason) for out in outputs for s in out.samples]


def assert_logprobs_close(off, on) -> None:
    for a, b in zip(off, on, strict=True):
        for x, y in zip(a.samples, b.samples, strict=True):
            assert [t.token_id for t in x.logprobs] == [t.token_id for t in y.logprobs]
            worst = max((abs(p.logprob - q.logprob) for p, q in zip(x.logprobs, y.logprobs)),
                        default=0.0)
            assert worst < 1e-4


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlap"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_greedy_outputs_are_identical_and_drafts_are_accepted(make_engine, page_size: int,
                                                              overlap: bool):
    params = SamplingParams(max_tokens=48, temperature=0, logprobs=True, top_logprobs=2)
    off, on, stats = both(make_engine, [COPY, PROSE], params, page_size=page_size,
                          overlap=overlap)
    assert samples(on) == samples(off)
    assert_logprobs_close(off, on)
    assert stats["spec_accepted_tokens"] >= 12  # the copy runs ahead several tokens a step
    assert stats["spec_drafted_tokens"] >= stats["spec_accepted_tokens"]
    assert sum(stats["spec_accepted_lengths"].values()) == stats["spec_verifications"]


PLANETS = "List the planets of the solar system in order, comma separated."


def asked_twice(make_engine, max_tokens: int, num_draft_tokens: int) -> tuple[int, int]:
    """The same prompt twice: the second answer equals the first; (steps, accepted drafts) of
    the second request."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    engine = make_engine(speculative_algorithm="radix",
                         speculative_num_draft_tokens=num_draft_tokens)
    first = engine.generate(PLANETS, params)[0].samples[0]
    before = engine.stats()
    again = engine.generate(PLANETS, params)[0].samples[0]
    after = engine.stats()
    assert again.token_ids == first.token_ids
    return (after["steps"] - before["steps"],
            after["spec_accepted_tokens"] - before["spec_accepted_tokens"])


def test_an_answer_given_before_is_drafted_from_the_tree(make_engine):
    """The answer is in neither prompt: the second request drafts it from the first's output,
    cached in the radix tree, and keeps nearly all of it."""
    steps, accepted = asked_twice(make_engine, 32, 16)
    assert accepted >= 24
    assert steps <= 8  # 32 tokens in a handful of steps


def test_a_prompts_last_chunk_drafts(make_engine):
    """A prompt whose continuation is in the tree drafts it in its prefill's own pass: asked
    again, an 8-token answer comes back in one step (7 drafts kept, then the sampled token)."""
    assert asked_twice(make_engine, 8, 7) == (1, 7)


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlap"])
def test_a_chunked_prompt_drafts_from_its_own_tokens(make_engine, overlap: bool):
    """A prompt prefilled in 16-token chunks drafts on its last chunk from its own tokens (the
    record it is asked to repeat follows a newline, as the answer does): the outputs are the
    outputs without speculation, and the copy is accepted."""
    params = SamplingParams(max_tokens=24, temperature=0, logprobs=True)
    off, on, stats = both(make_engine, [COPY], params, max_num_batched_tokens=16,
                          overlap=overlap)
    assert samples(on) == samples(off)
    assert_logprobs_close(off, on)
    assert stats["spec_accepted_tokens"] >= 12


@pytest.mark.parametrize("constraint", ["json_schema", "regex"])
def test_grammars_keep_their_outputs(make_engine, constraint: str):
    params = SamplingParams(max_tokens=64, temperature=0,
                            **({"json_schema": SCHEMA} if constraint == "json_schema"
                               else {"regex": r'\{"name": "[A-Za-z ]+", "born": [0-9]+, '
                                              r'"field": "[a-z]+"'}))
    off, on, stats = both(make_engine, [COPY], params)
    assert samples(on) == samples(off)
    assert stats["spec_verifications"] > 0


@pytest.mark.parametrize("overlap", [True], ids=["overlap"])
def test_seeded_samples_are_identical(make_engine, overlap: bool):
    params = [SamplingParams(max_tokens=32, temperature=0.8, top_p=0.95, seed=seed)
              for seed in range(6)]
    off, on, stats = both(make_engine, [COPY] * 6, params, speculative_max_batch_size=8)
    assert samples(on) == samples(off)
    assert stats["spec_accepted_tokens"] > 0


def test_n_samples_stop_strings_and_max_tokens(make_engine):
    params = [SamplingParams(max_tokens=40, temperature=0.7, seed=3, n=3),
              SamplingParams(max_tokens=60, temperature=0, stop=['"city"']),
              SamplingParams(max_tokens=7, temperature=0)]
    off, on, _ = both(make_engine, [COPY] * 3, params)
    assert samples(on) == samples(off)
    assert [s.text for o in on for s in o.samples] == [s.text for o in off for s in o.samples]
    assert len(on[2].samples[0].token_ids) == 7


@pytest.mark.parametrize("preemption, overlap", [("recompute", True), ("swap", False)])
def test_preemption_keeps_the_outputs(make_engine, preemption: str, overlap: bool):
    """A pool too small for all of them at once: requests are preempted while others draft."""
    prompts = [COPY, "Say hello.", RECORD + "\nThe name above is", PROSE]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    off, on, stats = both(make_engine, prompts, params, max_total_tokens=192, page_size=16,
                          preemption=preemption, overlap=overlap)
    assert samples(on) == samples(off)
    assert stats["preemptions"] > 0 and stats["spec_accepted_tokens"] > 0


def test_unseeded_samples_follow_the_models_distribution(make_engine):
    """Temperature 1, top_k 3, no seed: the second output token is drawn after a one-token
    draft of the request's own text that verification keeps or rejects; the pairs (first,
    second) still follow the model's distribution (chi-square over the 9 pairs, p > 0.001)."""
    prompt = "red green blue red green blue red green blue red green"
    params = SamplingParams(max_tokens=3, temperature=1.0, top_k=3, n=128, ignore_eos=True)
    exact = make_engine()

    def top3(text_ids):  # the processed distribution: the model's top 3, renormalised
        out = exact.generate(list(text_ids),
                             SamplingParams(max_tokens=1, temperature=0, top_logprobs=3))
        top = out[0].samples[0].logprobs[0].top if out[0].samples[0].logprobs else []
        return top

    engine = make_engine(speculative_algorithm="radix", speculative_max_batch_size=4096,
                         max_total_tokens=8192, max_num_batched_tokens=4096)
    outs = engine.generate([prompt] * 8, params)
    pairs = [tuple(s.token_ids[:2]) for o in outs for s in o.samples]
    stats = engine.stats()
    assert stats["spec_accepted_lengths"].get(0, 0) > 0, stats["spec_accepted_lengths"]
    assert stats["spec_accepted_tokens"] > 0  # drafts both kept and rejected
    prompt_ids = outs[0].prompt_token_ids
    first = _normalised(top3(prompt_ids))
    expected = {}
    for a, pa in first.items():
        for b, pb in _normalised(top3(prompt_ids + [a])).items():
            expected[(a, b)] = pa * pb * len(pairs)
    assert set(pairs) <= set(expected)
    chi2 = sum((pairs.count(cell) - e) ** 2 / e for cell, e in expected.items())
    assert chi2 < 27.9, (chi2, expected)  # 8 degrees of freedom: p = 0.0005


def _normalised(top) -> dict[int, float]:
    import math

    weights = {token: math.exp(lp) for token, lp in top}
    total = sum(weights.values())
    return {token: w / total for token, w in weights.items()}


SHARED_TAIL = ("\nWrite the name above again, exactly as it is written, on a line of its own, with "
               "nothing before it and nothing after it: no greeting, no explanation, no quotes, "
               "no full stop. The name, written again:")


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlap"])
def test_a_draft_tree_takes_the_branch_of_an_earlier_answer(make_engine, overlap: bool):
    """Two prompts end in the same long tail, so the answers after it are two continuations of
    one n-gram whose matches tie; the newer is the draft's main line. The first prompt asked
    again drafts a tree whose branch is its own earlier answer: verification takes the branch,
    and the outputs are those without speculation."""
    first, other = "Name: Ada Lovelace" + SHARED_TAIL, "Name: Grace Hopper" + SHARED_TAIL
    params = SamplingParams(max_tokens=8, temperature=0)
    outs = {}
    for algorithm in (None, "radix"):
        engine = make_engine(speculative_algorithm=algorithm, overlap=overlap)
        outs[algorithm] = [engine.generate([p], params)[0].text for p in (first, other, first)]
    assert outs["radix"] == outs[None]
    assert outs[None][0] != outs[None][1]  # two answers: the tree has a branch to take
    stats = engine.stats()
    assert stats["spec_tree_verifications"] > 0 and stats["spec_branch_accepted_tokens"] > 0
