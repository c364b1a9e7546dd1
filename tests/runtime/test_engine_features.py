"""Engine features on the real default model: prefix sharing, n > 1 with copy-on-write, aborts,
stop strings, logprobs, streaming, chat prompts, seeds and input errors."""

from __future__ import annotations

import asyncio

import pytest
import torch

from radixrt import SamplingParams

SYSTEM = (
    "You are a careful assistant who answers questions about geography, history and science in "
    "one short sentence, without any preamble, and never makes things up. "
)


def test_shared_prefix_is_computed_once(make_engine, tokenizer):
    engine = make_engine()
    params = SamplingParams(max_tokens=4, temperature=0)
    first = engine.generate(SYSTEM + "Where is Paris?", params)[0]
    second = engine.generate(SYSTEM + "Where is Rome?", params)[0]
    shared = len(tokenizer.encode(SYSTEM.rstrip()))
    assert first.cached_tokens == 0
    assert second.cached_tokens >= shared - 2
    assert second.cached_tokens < second.prompt_tokens
    # a repeated prompt is a hit on all but its last token
    again = engine.generate(SYSTEM + "Where is Rome?", params)[0]
    assert again.cached_tokens == again.prompt_tokens - 1
    assert again.token_ids == second.token_ids


def test_next_turn_of_a_conversation_hits_the_cache(make_engine):
    engine = make_engine()
    params = SamplingParams(max_tokens=8, temperature=0)
    turn1 = [{"role": "user", "content": "Name a fruit."}]
    out1 = engine.generate(turn1, params)[0]
    turn2 = turn1 + [
        {"role": "assistant", "content": out1.text},
        {"role": "user", "content": "And a vegetable?"},
    ]
    out2 = engine.generate(turn2, params)[0]
    assert out2.cached_tokens >= out1.prompt_tokens


def hf_token_logprobs(hf_model, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
    """HF's log-probability of each generated token given everything before it."""
    full = torch.tensor([prompt_ids + token_ids])
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(full).logits[0].float(), -1)
    n = len(prompt_ids)
    return [ref[n - 1 + i, t].item() for i, t in enumerate(token_ids)]


@pytest.mark.parametrize("page_size", [1, 16])
def test_n_samples_share_prompt_pages_and_copy_on_write(make_engine, hf_model, page_size):
    engine = make_engine(page_size=page_size)
    prompt = SYSTEM * 2 + "Write a list of random words:"
    # sampled children diverge from their first token, so each writes K/V of its own into the
    # slots after the prompt: sharing the prompt's partial last page without copying it first
    # would let one child's K/V overwrite another's
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=1, ignore_eos=True,
                            logprobs=True, n=3)
    rid = engine.submit(prompt, params)
    forked: list[tuple[int, int]] = []  # (locked, private) KV while the 3 children run
    while (out := engine.take_output(rid)) is None:
        engine.step()
        st = engine.stats()
        if st["running"] == 3:
            forked.append((st["kv_locked"], st["kv_private"]))
    prompt_ids = list(out.prompt_token_ids)
    prompt_len = len(prompt_ids)
    if page_size > 1:
        assert prompt_len % page_size, "the prompt must end mid-page"
        assert prompt_len % page_size + params.max_tokens <= page_size  # decodes in that page
    # the prompt's whole pages are stored once (in the tree, locked by all 3 children);
    # privately each child holds only its copied partial page and its decode pages
    full = prompt_len // page_size * page_size
    for locked, private in forked:
        assert locked == full and locked + private < 3 * prompt_len
    forked_seen = bool(forked)
    assert forked_seen
    assert len(out.samples) == 3 and out.cached_tokens == 0
    assert len({s.token_ids[0] for s in out.samples}) == 3  # they part at once
    for s in out.samples:  # each child's logprobs are HF's on its own sequence
        assert len(s.token_ids) == params.max_tokens
        want = hf_token_logprobs(hf_model, prompt_ids, s.token_ids)
        got = [lp.logprob for lp in s.logprobs]
        assert got == pytest.approx(want, abs=1e-3), s.index


def test_n_samples_with_seed_are_reproducible_and_differ(make_engine):
    engine = make_engine()
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=7, n=3)
    a = engine.generate("Write a word:", params)[0]
    b = engine.generate(["Tell me a story.", "Write a word:"], params)[1]
    assert [s.token_ids for s in a.samples] == [s.token_ids for s in b.samples]
    assert len({tuple(s.token_ids) for s in a.samples}) > 1


def test_seed_gives_same_output_in_any_batch(make_engine):
    engine = make_engine()
    params = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, seed=123)
    alone = engine.generate("My favourite animal is", params)[0]
    mixed = engine.generate(["Hello", "My favourite animal is", "Why?"], params)[1]
    assert alone.token_ids == mixed.token_ids


def _drain(engine, steps: int) -> None:
    for _ in range(steps):
        engine.step()


def test_abort_at_every_stage_frees_everything(make_engine):
    engine = make_engine(max_num_batched_tokens=16, max_running_requests=2)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    long_prompt = SYSTEM * 2
    decoding = engine.submit("Count: one, two,", params)
    prefilling = engine.submit(long_prompt, params)
    waiting = engine.submit("Never admitted", params)
    _drain(engine, 3)
    req = engine.scheduler.requests
    assert req[decoding].output_ids, "first request should be decoding"
    assert 0 < req[prefilling].kv_len < len(req[prefilling].prompt_ids), "mid-prefill"
    assert req[waiting].phase.value == "waiting"
    for rid in (waiting, prefilling, decoding):
        engine.abort(rid)
        engine.check_integrity()
        assert engine.take_output(rid).finish_reason == "abort"
    _drain(engine, 2)
    st = engine.stats()
    assert st["kv_private"] == 0 and st["kv_locked"] == 0
    assert engine.generate("Still works?", SamplingParams(max_tokens=3))[0].completion_tokens == 3


def test_stop_strings_are_trimmed(make_engine):
    engine = make_engine()
    free = engine.generate("List: 1. apple 2.", SamplingParams(max_tokens=20, temperature=0))[0]
    assert len(free.text) > 4
    stop = free.text[2:4]
    out = engine.generate(
        "List: 1. apple 2.", SamplingParams(max_tokens=20, temperature=0, stop=[stop])
    )[0]
    assert out.finish_reason == "stop"
    assert stop not in out.text
    assert free.text.startswith(out.text)


def test_output_logprobs_match_hf(make_engine, hf_model, tokenizer):
    engine = make_engine()
    prompt = "The quick brown fox"
    out = engine.generate(prompt, SamplingParams(max_tokens=6, temperature=0, logprobs=True,
                                                 top_logprobs=3))[0]
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    full = torch.cat([ids[0], torch.tensor(out.token_ids)])[None]
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(full).logits[0].float(), -1)
    n = ids.shape[1]
    for i, lp in enumerate(out.logprobs):
        expected = ref[n - 1 + i, out.token_ids[i]].item()
        assert abs(lp.logprob - expected) < 1e-3
        assert len(lp.top) == 3 and lp.top[0][0] == out.token_ids[i]


def test_prompt_logprobs_match_hf_and_bypass_the_cache(make_engine, hf_model, tokenizer):
    engine = make_engine()
    prompt = SYSTEM + "Answer:"
    engine.generate(prompt, SamplingParams(max_tokens=2))  # now the prompt is cached
    ids = tokenizer.encode(prompt)
    start = 5
    out = engine.generate(prompt, SamplingParams(max_tokens=1, prompt_logprobs_start=start))[0]
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), -1)
    assert [p.token_id for p in out.prompt_logprobs] == ids[start:]
    for k, p in enumerate(out.prompt_logprobs):
        pos = start + k
        assert abs(p.logprob - ref[pos - 1, ids[pos]].item()) < 1e-3
    assert out.cached_tokens <= start - 1


def test_prefill_only_scores_the_prompt_and_caches_it(make_engine, hf_model, tokenizer):
    """max_tokens=0: the prompt's logprobs (as HF computes them) and its radix-tree entry, no
    token sampled, finish "length"; n samples all end so; the next request hits the cache."""
    engine = make_engine()  # check_integrity after every step, as every test engine
    prompt = SYSTEM + "Question: what is 2 + 2?"
    ids = tokenizer.encode(prompt)
    out = engine.generate(prompt, SamplingParams(max_tokens=0, prompt_logprobs_start=1, n=2))[0]
    assert [(s.token_ids, s.text, s.finish_reason) for s in out.samples] == [([], "", "length")] * 2
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), -1)
    assert [p.token_id for p in out.prompt_logprobs] == ids[1:]
    for pos, p in enumerate(out.prompt_logprobs, start=1):
        assert abs(p.logprob - ref[pos - 1, ids[pos]].item()) < 1e-3
    warm = engine.generate(prompt, SamplingParams(max_tokens=0))[0]
    assert warm.finish_reason == "length" and warm.token_ids == []
    again = engine.generate(prompt + " Answer:", SamplingParams(max_tokens=1, temperature=0))[0]
    assert again.cached_tokens >= len(ids) - 1  # the prefill-only request left it in the tree
    stats = engine.stats()
    assert stats["kv_free"] + stats["kv_evictable"] == stats["kv_total"]


def test_streaming_equals_blocking(make_engine):
    engine = make_engine()
    params = SamplingParams(max_tokens=16, temperature=0)
    prompts = ["Tell me about the moon.", "Write a haiku about rain."]
    expected = [o.text for o in engine.generate(prompts, params)]

    async def collect(prompt: str) -> tuple[str, str | None]:
        text, reason = "", None
        async for chunk in engine.generate_stream(prompt, params):
            text += chunk.text
            reason = chunk.finish_reason or reason
        return text, reason

    async def both():
        return await asyncio.gather(*(collect(p) for p in prompts))

    results = asyncio.run(both())
    assert [t for t, _ in results] == expected
    assert all(r in ("stop", "length") for _, r in results)


def test_chat_messages_use_the_template(make_engine, tokenizer):
    engine = make_engine()
    messages = [{"role": "user", "content": "Say hi."}]
    out = engine.generate(messages, SamplingParams(max_tokens=8, temperature=0))[0]
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(expected, list):
        expected = expected["input_ids"]
    assert out.prompt_token_ids == list(expected)
    assert out.completion_tokens > 0


def test_input_errors_name_the_problem(make_engine):
    engine = make_engine(context_length=64)
    with pytest.raises(ValueError, match="context length is 64"):
        engine.generate("word " * 100, SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="max_tokens"):
        engine.generate("hello", SamplingParams(max_tokens=100))
    with pytest.raises(ValueError, match="empty"):
        engine.generate("", SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate([10**9], SamplingParams(max_tokens=2))
    assert engine.generate("hello", SamplingParams(max_tokens=2))[0].completion_tokens == 2


def test_submitted_outputs_are_taken_once_and_then_forgotten(make_engine):
    """After submit() and step(), take_output / take_finished hand each finished output over
    once, equal to generate()'s; the Engine then holds nothing for it (it used to keep every
    request's output tracker forever)."""
    engine = make_engine()
    params = SamplingParams(max_tokens=6, temperature=0)
    prompts = ["The capital of France is", "1, 2, 3,", "Once upon a time"]
    expected = [o.text for o in engine.generate(prompts, params)]
    rids = [engine.submit(p, params) for p in prompts]
    assert engine.take_output(rids[0]) is None  # not finished yet
    assert engine.stats()["outputs_held"] == 3
    while engine.stats()["running"] or engine.stats()["waiting"]:
        engine.step()
    first = engine.take_output(rids[0])
    rest = engine.take_finished()
    assert [first.text] + [o.text for o in sorted(rest, key=lambda o: o.rid)] == expected
    assert engine.take_finished() == [] and engine.stats()["outputs_held"] == 0
    with pytest.raises(KeyError, match="unknown to this Engine, or its output was taken"):
        engine.take_output(rids[0])
