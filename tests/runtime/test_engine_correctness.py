"""The engine on the real default model: outputs equal HF transformers, and stay the same whatever
the cache, page size, chunking, batching, policy or preemption does."""

from __future__ import annotations

import pytest
import torch

from radixrt import SamplingParams

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
]
SHARED = (
    "You are a helpful assistant. Answer briefly and precisely. Here are some facts: the sky is "
    "blue, grass is green, water boils at 100 degrees Celsius at sea level. Question: "
)
SHARED_PROMPTS = [SHARED + q for q in ("What color is the sky?", "When does water boil?")]
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


@pytest.fixture(params=[False, True], ids=["inline", "overlap"])
def overlap(request: pytest.FixtureRequest) -> bool:
    """Every test here runs on an Engine that steps its worker inline and on one that overlaps
    planning with a worker thread, as the server does: the outputs must be the same."""
    return request.param


def hf_greedy(hf_model, tokenizer, prompt: str, max_new: int) -> list[int]:
    """Greedy decoding on HF transformers that runs past EOS, as ignore_eos does (EOS is not
    masked, it just does not stop): HF generate's own stopping cannot be turned off cleanly."""
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    out: list[int] = []
    past = None
    step_ids = ids
    with torch.no_grad():
        for _ in range(max_new):
            res = hf_model(step_ids, past_key_values=past, use_cache=True)
            past = res.past_key_values
            token = int(res.logits[0, -1].argmax())
            out.append(token)
            step_ids = torch.tensor([[token]])
    return out


def test_hf_greedy_reference_equals_hf_generate(hf_model, tokenizer, reference):
    prompt = PROMPTS[0]
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        gen = hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=GREEDY.max_tokens, pad_token_id=0)
    gen_ids = gen[0, ids.shape[1] :].tolist()
    assert reference[prompt][: len(gen_ids)] == gen_ids


@pytest.fixture(scope="module")
def reference(hf_model, tokenizer) -> dict[str, list[int]]:
    prompts = PROMPTS + SHARED_PROMPTS
    return {p: hf_greedy(hf_model, tokenizer, p, GREEDY.max_tokens) for p in prompts}


def test_greedy_equals_hf_generate(make_engine, reference):
    engine = make_engine()
    outs = engine.generate(PROMPTS, GREEDY)
    for prompt, out in zip(PROMPTS, outs):
        assert out.token_ids == reference[prompt], prompt
        assert out.finish_reason == "length"
        assert out.completion_tokens == GREEDY.max_tokens


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("disable_radix_cache", [False, True])
def test_cache_and_page_size_do_not_change_outputs(make_engine, reference, page_size,
                                                   disable_radix_cache):
    engine = make_engine(page_size=page_size, disable_radix_cache=disable_radix_cache)
    prompts = PROMPTS + SHARED_PROMPTS
    # alone, then all together in one mixed batch (the second round also hits the cache)
    for prompt in prompts[:2]:
        assert engine.generate(prompt, GREEDY)[0].token_ids == reference[prompt]
    for prompt, out in zip(prompts, engine.generate(prompts, GREEDY)):
        assert out.token_ids == reference[prompt], prompt
    cached = engine.stats()["cached_tokens"]
    assert (cached == 0) if disable_radix_cache else (cached > 0)


def record_plans(engine) -> list:
    """Every step plan the engine hands its worker, in order."""
    plans = []
    execute = engine.worker.execute

    def spy(plan):
        plans.append(plan)
        return execute(plan)

    engine.worker.execute = spy
    return plans


def test_chunked_prefill_at_small_budget(make_engine, reference):
    budget = 16
    engine = make_engine(max_num_batched_tokens=budget, page_size=16, speculative_algorithm=None)
    plans = record_plans(engine)
    # alone on an empty cache: a prompt of P tokens is prefilled in ceil(P / budget) steps of
    # `budget` tokens (the last one shorter), then one decode step per further token (no
    # speculative drafts: test_engine_speculative.py chunks with them)
    prompt = SHARED_PROMPTS[0]
    out = engine.generate(prompt, GREEDY)[0]
    assert out.token_ids == reference[prompt]
    n = out.prompt_tokens
    assert n > 2 * budget
    chunks = [(run.start, run.num_new) for plan in plans for run in plan.runs]
    full, rest = divmod(n, budget)
    want = [(i * budget, budget) for i in range(full)] + ([(full * budget, rest)] if rest else [])
    assert chunks[: len(want)] == want
    assert chunks[len(want):] == [(n + i, 1) for i in range(GREEDY.max_tokens - 1)]
    stats = engine.stats()
    assert stats["steps"] == -(-n // budget) + GREEDY.max_tokens - 1
    assert stats["computed_tokens"] == n + GREEDY.max_tokens - 1
    # all together (the second shared prompt partly a cache hit): no forward pass over the
    # budget, and the same tokens as the unchunked engine and HF
    plans.clear()
    prompts = SHARED_PROMPTS + PROMPTS
    outs = engine.generate(prompts, GREEDY)
    sizes = [sum(run.num_new for run in plan.runs) for plan in plans]
    assert max(sizes) == budget and all(size <= budget for size in sizes)
    unchunked = make_engine(page_size=16).generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in unchunked]
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == reference[prompt], prompt


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_outputs_survive_forced_preemption(make_engine, reference, preemption, page_size):
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    # every request fits alone, but not all four at once: the pool forces preemption
    engine = make_engine(max_total_tokens=96, page_size=page_size, preemption=preemption,
                         schedule_policy="fcfs")
    prompts = PROMPTS
    outs = engine.generate(prompts, params)
    stats = engine.stats()
    assert stats["preemptions"] > 0
    if preemption == "swap":
        assert stats["swaps"] > 0
    for prompt, out in zip(prompts, outs):
        assert out.token_ids[:12] == reference[prompt], prompt
        assert len(out.token_ids) == 24
    alone = make_engine().generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in alone]


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "dfs-weight"])
def test_policies_give_the_same_outputs(make_engine, reference, policy):
    engine = make_engine(schedule_policy=policy, max_num_batched_tokens=64)
    prompts = SHARED_PROMPTS + PROMPTS + SHARED_PROMPTS[::-1]
    for prompt, out in zip(prompts, engine.generate(prompts, GREEDY)):
        assert out.token_ids == reference[prompt], prompt


def test_request_that_can_never_fit_ends_with_error(make_engine):
    engine = make_engine(max_total_tokens=32)
    out = engine.generate("Hello there", SamplingParams(max_tokens=64))[0]
    assert out.finish_reason.startswith("error:") and "max_total_tokens" in out.finish_reason
    ok = engine.generate("Hello there", SamplingParams(max_tokens=4, temperature=0))[0]
    assert ok.finish_reason in ("length", "stop")
