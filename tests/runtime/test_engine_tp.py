"""Engine(tp_size=2) and Engine(tp_size=3) on the default model against tp_size=1: the same
greedy tokens (tie-aware), prompt and output logprobs within 1e-4, through a radix-cache hit,
page size 16, chunked prefill at a small budget, forced preemption (recompute and swap), n = 2
with a seed and a regex-constrained request, with the KV invariants checked after every step.

The default model has 9 query heads and 3 KV heads: tp 3 splits them (3 and 1 per rank), tp 2
pads them with zero heads (6 and 2 per rank), so both kinds of shard plan run end to end. Each
tensor-parallel Engine is this process (rank 0) plus real follower processes over gloo."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from radixrt import Engine, SamplingParams
from radixrt.runtime.messages import TokenLogprob
from radixrt.runtime.pooling_params import Pooling

pytestmark = pytest.mark.slow  # starts follower processes

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,",
           "The three primary colors are"]
SHARED = ("You are a helpful assistant. Answer briefly and precisely. Facts: the sky is blue, "
          "grass is green, water boils at 100 degrees Celsius at sea level. Question: ")
# (name, options): every variant runs every scenario, at tp 1 (the reference) and tp 2 / 3
VARIANTS = {
    # page size 16, prefill chunked 24 tokens at a time, preemption by recompute
    "pages16-chunked-recompute": dict(page_size=16, max_num_batched_tokens=24,
                                      max_total_tokens=96, preemption="recompute"),
    # page size 1, a pool too small for the four long requests together, preemption by swap
    "pages1-swap": dict(page_size=1, max_total_tokens=96, preemption="swap",
                        schedule_policy="fcfs"),
}
GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=True,
                        top_logprobs=2, prompt_logprobs_start=0)
LONG = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=True,
                      top_logprobs=2)
TOLERANCE = 1e-4


def build(tp: int, variant: str, loaded: Any = None) -> Engine:
    """At tp 1 on the session's shared weights (`loaded`); a TP engine loads its shards."""
    return Engine(loaded, tp_size=tp, check_integrity=True, **VARIANTS[variant])


@pytest.fixture(scope="module", params=[(tp, v) for tp in (2, 3) for v in VARIANTS],
                ids=lambda p: f"tp{p[0]}-{p[1]}")
def engines(request: pytest.FixtureRequest,
            loaded_model: Any) -> Iterator[tuple[Engine, Engine]]:
    """(tp 1 reference, tensor-parallel engine) with the same options; at teardown both must
    be idle with every KV slot free or cached."""
    tp, variant = request.param
    pair = (build(1, variant, loaded_model), build(tp, variant))
    yield pair
    for engine in pair:
        engine.check_integrity()
        stats = engine.stats()
        assert stats["running"] == stats["waiting"] == stats["swapped"] == 0
        assert stats["kv_private"] == stats["kv_locked"] == 0
        assert stats["outputs_held"] == 0
        engine.close()


def assert_same_logprobs(ref: list[TokenLogprob], got: list[TokenLogprob], what: str) -> None:
    """Same tokens and logprobs within TOLERANCE; after a position where the reference's two
    best tokens are within TOLERANCE of each other (a tie the rounding may break either way)
    the sequences may part, and nothing after it is compared."""
    assert len(got) == len(ref), what
    for i, (r, g) in enumerate(zip(ref, got)):
        tie = len(r.top) >= 2 and abs(r.top[0][1] - r.top[1][1]) < TOLERANCE
        if r.token_id != g.token_id:
            assert tie, f"{what}: token {i} is {g.token_id}, expected {r.token_id}"
            return
        assert abs(r.logprob - g.logprob) < TOLERANCE, (what, i, r.logprob, g.logprob)
        if tie:
            return


def assert_same_outputs(ref: list[Any], got: list[Any]) -> None:
    assert len(ref) == len(got)
    for r, g in zip(ref, got):
        assert len(r.samples) == len(g.samples)
        for rs, gs in zip(r.samples, g.samples):
            if rs.logprobs:
                assert_same_logprobs(rs.logprobs, gs.logprobs, rs.text)
            else:
                assert gs.token_ids == rs.token_ids, rs.text
        prompt_ref = [lp for lp in r.prompt_logprobs if lp is not None]
        prompt_got = [lp for lp in g.prompt_logprobs if lp is not None]
        assert [lp.token_id for lp in prompt_got] == [lp.token_id for lp in prompt_ref]
        for a, b in zip(prompt_ref, prompt_got):
            assert abs(a.logprob - b.logprob) < TOLERANCE


def both(engines: tuple[Engine, Engine], prompts: list[str],
         params: SamplingParams) -> tuple[list[Any], list[Any]]:
    return tuple(engine.generate(prompts, params) for engine in engines)  # type: ignore[return-value]


def test_the_layout_is_reported(engines):
    ref, tp = engines
    assert ref.tp_layout is None
    layout = tp.tp_layout
    assert layout is not None and layout.tp_size == tp.config.tp_size
    assert layout.kv_heads == ("split" if layout.tp_size == 3 else "padded")
    assert layout.heads_per_rank * layout.tp_size == 9 + layout.padded_heads


def test_greedy_tokens_and_prompt_logprobs(engines):
    assert_same_outputs(*both(engines, PROMPTS, GREEDY))


def test_a_radix_cache_hit(engines):
    prompts = [SHARED + "What color is the sky?", SHARED + "When does water boil?"]
    params = GREEDY.with_(prompt_logprobs_start=None)  # prompt logprobs would recompute it
    first = both(engines, prompts[:1], params)
    second = both(engines, prompts[1:], params)
    assert second[1][0].cached_tokens > 0
    assert second[1][0].cached_tokens == second[0][0].cached_tokens
    assert_same_outputs(*first)
    assert_same_outputs(*second)


def test_forced_preemption(engines):
    ref, tp = both(engines, PROMPTS, LONG)
    stats = engines[1].stats()
    assert stats["preemptions"] > 0
    if engines[1].config.preemption == "swap":
        assert stats["swaps"] > 0
    assert_same_outputs(ref, tp)


def test_pooling_requests(engines):
    """Embeddings (last token, every rank's full hidden state) and an LM head's label-token
    logits (the rerank form: the vocabulary gathered over the ranks) equal tp 1's, a cached
    prefix included."""
    ref, tp = engines
    prompts = [SHARED + "What color is the sky?", SHARED + "When does water boil?"]
    for engine in engines:
        engine.generate(prompts[:1], GREEDY.with_(max_tokens=1, prompt_logprobs_start=None))
    want, got = ref.embed(prompts), tp.embed(prompts)
    for w, g in zip(want, got, strict=True):
        assert max(abs(a - b) for a, b in zip(w, g, strict=True)) < TOLERANCE
    labels = SamplingParams(max_tokens=0, pooling=Pooling("classify", label_tokens=(5, 700)))
    want, got = (e.generate(prompts, labels) for e in engines)
    for w, g in zip(want, got, strict=True):
        assert g.pooled == pytest.approx(w.pooled, abs=TOLERANCE) and len(g.pooled) == 2


def test_n2_with_a_seed_and_a_regex(engines):
    sampled = SamplingParams(max_tokens=8, temperature=0.8, seed=7, n=2, logprobs=True)
    assert_same_outputs(*both(engines, PROMPTS[:2], sampled))
    regex = SamplingParams(max_tokens=12, temperature=0, regex=r"[0-9]{3}-[a-z]{2,4}",
                           logprobs=True)
    ref, tp = both(engines, ["My code is "], regex)
    assert ref[0].text == tp[0].text
    assert_same_outputs(ref, tp)


def test_a_lost_follower_fails_the_engine_with_a_message():
    """A tensor-parallel Engine whose follower process is killed raises at its next step (it
    neither hangs nor answers from half a model), and close() still returns."""
    engine = Engine(tp_size=2, max_total_tokens=256)
    try:
        assert engine.generate(PROMPTS[:1], GREEDY)[0].token_ids
        assert engine._ranks is not None
        proc = engine._ranks.procs[0]
        proc.kill()
        proc.join(timeout=10)
        with pytest.raises(RuntimeError):
            engine.generate(PROMPTS[:1], GREEDY)
    finally:
        engine.close()


def test_refusals_say_what_to_use():
    with pytest.raises(ValueError, match=r"tp_size=4 .*use one of \[1, 3\]"):
        Engine(tp_size=4)
    with pytest.raises(ValueError, match="multiple of nnodes"):
        Engine(tp_size=3, nnodes=2, dist_init_addr="127.0.0.1:29500")


def test_speculative_decoding_on_two_ranks(loaded_model):
    """Every rank verifies the drafts from the same logits and keeps the same ones: the outputs
    are tp 1's without speculation, and drafts were accepted."""
    record = '{"name": "Ada Lovelace", "born": 1815, "city": "London"}'
    prompts = [f"Repeat this JSON record exactly:\n{record}\nRepeated:\n", PROMPTS[0]]
    ref = Engine(loaded_model, check_integrity=True, max_total_tokens=512,
                 speculative_algorithm=None)
    tp = Engine(tp_size=2, check_integrity=True, max_total_tokens=512,
                speculative_algorithm="radix")
    tail = ("\nWrite the name above again, exactly as it is written, on a line of its own, with "
            "nothing before it and nothing after it: no greeting, no explanation, no quotes, no "
            "full stop. The name, written again:")  # answers after it: a draft tree's branches
    again = ["Name: Ada Lovelace" + tail, "Name: Grace Hopper" + tail, "Name: Ada Lovelace" + tail]
    try:
        assert_same_outputs(ref.generate(prompts, LONG), tp.generate(prompts, LONG))
        assert tp.stats()["spec_accepted_tokens"] > 0
        for text in again:  # one after another: the answers go into the tree in turn
            assert_same_outputs(ref.generate([text], LONG), tp.generate([text], LONG))
        assert tp.stats()["spec_branch_accepted_tokens"] > 0
    finally:
        ref.close()
        tp.close()


def test_kv_tiers_on_two_ranks(loaded_model, tmp_path):
    """Each rank demotes, loads back and writes to disk its own shard of every page (the same
    moves from the one plan): the outputs are tp 1's without tiers; a second TP engine on the
    same directory restores what both ranks' files agree on."""
    words = SHARED.split()
    prompts = [f"Note {i}: " + " ".join(words[i:] + words[:i]) for i in range(4)]  # distinct
    params = GREEDY.with_(prompt_logprobs_start=None)
    ref = Engine(loaded_model, check_integrity=True, max_total_tokens=128)
    tiers = dict(check_integrity=True, max_total_tokens=128, host_cache_tokens=64,
                 disk_cache_dir=str(tmp_path), disk_cache_tokens=1024)
    tp = Engine(tp_size=2, **tiers)
    try:
        want = [ref.generate([p], params)[0] for p in prompts * 2]
        got = [tp.generate([p], params)[0] for p in prompts * 2]
        assert_same_outputs(want, got)
        stats = tp.stats()["kv_tiers"]
        assert stats["moved_tokens"].get("host->disk", 0) > 0
        assert stats["host"]["hit_tokens"] + stats["disk"]["hit_tokens"] > 0
    finally:
        tp.close()
    assert sorted(os.listdir(tmp_path)) == ["namespaces.msgpack", "rank0.kv", "rank1.kv"]
    warm = Engine(tp_size=2, **tiers)
    try:
        assert warm.stats()["kv_tiers"]["restored_tokens"] > 0
        again = [warm.generate([p], params)[0] for p in prompts]
        assert_same_outputs(want[:4], again)
        assert warm.stats()["kv_tiers"]["disk"]["hit_tokens"] > 0
    finally:
        warm.close()
        ref.close()
