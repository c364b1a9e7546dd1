"""Unit tests of the Worker (radixrt/runtime/worker/worker.py), its factory (setup.py) and the step
executors (step_executor.py), on a tiny random-weight Llama checkpoint (no default model).

Plans are built by hand from radixrt.runtime.messages. Every result is checked against a reference
computed apart from the worker: one plain forward of the whole sequence through the same model into
a fresh KV cache (`reference`), itself pinned to Hugging Face on the same weights.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from radixrt.runtime.config import EngineConfig
from radixrt.runtime.forward.forward_batch import ForwardBatch
from radixrt.runtime.forward.kv_cache import KVCache
from radixrt.runtime.messages import (
    CpuCompute,
    Run,
    RunResult,
    SlotCopy,
    StepPlan,
    StepResult,
    Swap,
    TokenLogprob,
    WorkerReady,
    WorkerRequest,
)
from radixrt.runtime.models.loader import LoadedModel, load_model
from radixrt.runtime.pooling_params import PoolingInfo
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.worker.cpu_waiting import openmp_wait
from radixrt.runtime.worker.setup import (
    CPU_MAX_POOL_TOKENS,
    build_worker,
    pool_pages,
    resolve_device,
)
from radixrt.runtime.worker.step_executor import InlineExecutor, ThreadExecutor
from radixrt.runtime.worker.worker import Worker

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB = 96
MAX_POSITIONS = 320  # not a default anywhere, so context_length's default is visibly this one
EOS_IDS = [3, 5]
NUM_SLOTS = 256
TOP = 5  # top logprobs asked for, compared with the reference as well
ATOL = 1e-4

_STEP = itertools.count()


# --- the tiny checkpoint and the reference -------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """(folder with config.json + safetensors, the HF model on the same weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=112,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        eos_token_id=EOS_IDS,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # non-trivial weights: logits far from uniform
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.15)
    folder = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(folder)
    return folder, model


@pytest.fixture(scope="module")
def loaded(checkpoint: tuple[Path, Any]) -> LoadedModel:
    return load_model(str(checkpoint[0]), dtype="float32", device="cpu")


@pytest.fixture
def worker(loaded: LoadedModel) -> Worker:
    return Worker(loaded, NUM_SLOTS, seed=0)


def reference(loaded: LoadedModel, ids: list[int]) -> Tensor:
    """[len(ids), vocab] log-softmax of one plain forward of `ids` into a fresh KV cache."""
    kv = KVCache.from_config(loaded.config, len(ids), torch.float32, "cpu")
    batch = ForwardBatch.build([ids], [0], [list(range(len(ids)))])
    with torch.inference_mode():
        logits = loaded.model.compute_logits(loaded.model(batch, kv))
    return torch.log_softmax(logits.float(), dim=-1)


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class Slots:
    """Hands out pool slots in a shuffled order, so slot tables are never 0, 1, 2, ..."""

    def __init__(self, seed: int = 0, num_slots: int = NUM_SLOTS) -> None:
        order = torch.randperm(num_slots, generator=torch.Generator().manual_seed(seed))
        self.free = order.tolist()

    def take(self, n: int) -> list[int]:
        out, self.free = self.free[:n], self.free[n:]
        return out


def params(**changes: Any) -> SamplingParams:
    base = {"temperature": 0.0, "max_tokens": 64, "top_logprobs": TOP}
    return SamplingParams(**{**base, **changes})


def request(rid: int, prompt: list[int], **extra: Any) -> WorkerRequest:
    fields = {"output_ids": [], "params": params()} | extra
    return WorkerRequest(rid=rid, prompt_ids=prompt, max_tokens=fields["params"].max_tokens,
                         **fields)


def execute(worker: Worker, **parts: Any) -> StepResult:
    step_id = next(_STEP)
    result = worker.execute(StepPlan(step_id=step_id, **parts))
    assert result.step_id == step_id
    return result


def by_rid(result: StepResult) -> dict[int, RunResult]:
    out = {r.rid: r for r in result.results}
    assert len(out) == len(result.results), "one result per rid"
    return out


def assert_token(tok: TokenLogprob | None, ref_row: Tensor, greedy: bool = True) -> None:
    """The sampled token's logprob (and top logprobs) are those of the reference row."""
    assert tok is not None
    if greedy:
        assert tok.token_id == int(ref_row.argmax())
    assert tok.logprob == pytest.approx(float(ref_row[tok.token_id]), abs=ATOL)
    if tok.top:
        ids = [t for t, _ in tok.top]
        got = torch.tensor([v for _, v in tok.top])
        torch.testing.assert_close(got, ref_row[ids], atol=ATOL, rtol=0)
        torch.testing.assert_close(got, ref_row.topk(len(ids)).values, atol=ATOL, rtol=0)


def prefill(worker: Worker, slots: Slots, rid: int, prompt: list[int], **extra: Any) -> RunResult:
    """Admit and prefill a request in one run; returns its result (the first sampled token)."""
    run = Run(rid=rid, start=0, num_new=len(prompt), new_slots=slots.take(len(prompt)), sample=True)
    result = execute(worker, new_requests=[request(rid, prompt, **extra)], runs=[run])
    return by_rid(result)[rid]


def decode(worker: Worker, slots: Slots, positions: dict[int, int]) -> dict[int, RunResult]:
    """One decode step of each rid at its position (the token the worker sampled last)."""
    runs = [Run(rid=rid, start=pos, num_new=1, new_slots=slots.take(1), sample=True)
            for rid, pos in positions.items()]
    result = execute(worker, runs=runs)
    assert result.num_tokens == len(runs)
    return by_rid(result)


def greedy_continuation(worker: Worker, slots: Slots, rid: int, prompt: list[int],
                        steps: int) -> list[RunResult]:
    results = [prefill(worker, slots, rid, prompt)]
    for i in range(steps):
        results.append(decode(worker, slots, {rid: len(prompt) + i})[rid])
    return results


def check_same_tokens(loaded: LoadedModel, prompt: list[int], got: list[RunResult],
                      expected: list[RunResult]) -> None:
    """The same tokens and logprobs as `expected`, each the reference's argmax."""
    assert [r.token.token_id for r in got] == [r.token.token_id for r in expected]
    for mine, theirs in zip(got, expected, strict=True):
        assert mine.token.logprob == pytest.approx(theirs.token.logprob, abs=ATOL)
    check_greedy_sequence(loaded, prompt, got)


def check_greedy_sequence(loaded: LoadedModel, prompt: list[int], results: list[RunResult]) -> None:
    """Each sampled token is the reference argmax after prompt + the tokens before it."""
    seq = prompt + [r.token.token_id for r in results if r.token is not None]
    ref = reference(loaded, seq)
    assert len(seq) == len(prompt) + len(results)
    for i, res in enumerate(results):
        assert_token(res.token, ref[len(prompt) - 1 + i])


# --- the reference itself ------------------------------------------------------------------------
def test_reference_matches_hugging_face(loaded: LoadedModel, checkpoint: tuple[Path, Any]) -> None:
    ids = tokens(50, seed=1)
    with torch.no_grad():
        hf = torch.log_softmax(checkpoint[1](torch.tensor([ids])).logits[0].float(), dim=-1)
    torch.testing.assert_close(reference(loaded, ids), hf, atol=ATOL, rtol=0)
    uniform = -math.log(VOCAB)
    assert float(hf.max(-1).values.mean()) > uniform + 2  # far from uniform: argmax means something


# --- prefill, chunks, decode ---------------------------------------------------------------------
def test_prefill_then_decode_from_the_slot_table(worker: Worker, loaded: LoadedModel) -> None:
    prompt = tokens(40, seed=2)
    slots = Slots(seed=2)
    first = execute(worker, new_requests=[request(7, prompt)],
                    runs=[Run(rid=7, start=0, num_new=40, new_slots=slots.take(40), sample=True)])
    assert first.num_tokens == 40 and [r.rid for r in first.results] == [7]
    results = [first.results[0]]
    for i in range(6):  # decode entries carry one slot and no token: the worker appended it
        results.append(decode(worker, slots, {7: 40 + i})[7])
    assert results[0].prompt_logprobs == [] and results[0].forced == []
    check_greedy_sequence(loaded, prompt, results)


@pytest.mark.parametrize("cut", [1, 17, 39])
def test_chunked_prefill_equals_one_run(worker: Worker, loaded: LoadedModel, cut: int) -> None:
    prompt = tokens(40, seed=3)
    whole = Worker(loaded, NUM_SLOTS)
    expected = greedy_continuation(whole, Slots(seed=30), 1, prompt, steps=3)

    slots = Slots(seed=31)
    head = execute(worker, new_requests=[request(1, prompt)],
                   runs=[Run(rid=1, start=0, num_new=cut, new_slots=slots.take(cut), sample=False)])
    assert head.results == [] and head.num_tokens == cut  # no sample, no logits
    tail = execute(worker, runs=[Run(rid=1, start=cut, num_new=40 - cut,
                                     new_slots=slots.take(40 - cut), sample=True)])
    assert tail.num_tokens == 40 - cut
    got = [tail.results[0]] + [decode(worker, slots, {1: 40 + i})[1] for i in range(3)]

    check_same_tokens(loaded, prompt, got, expected)


def test_run_must_start_where_the_slot_table_ends(worker: Worker) -> None:
    slots = Slots(seed=4)
    prompt = tokens(10, seed=4)
    prefill(worker, slots, 3, prompt)
    with pytest.raises(RuntimeError, match="slot table has 10 positions, the plan starts at 9"):
        execute(worker, runs=[Run(rid=3, start=9, num_new=1, new_slots=slots.take(1), sample=True)])


# --- prefix slots (radix cache hit) ------------------------------------------------------------
def test_prefix_slots_compute_only_the_rest(worker: Worker, loaded: LoadedModel) -> None:
    slots = Slots(seed=5)
    shared = tokens(20, seed=50)
    owner_slots = slots.take(30)
    execute(worker, new_requests=[request(1, shared + tokens(10, seed=51))],
            runs=[Run(rid=1, start=0, num_new=30, new_slots=owner_slots, sample=True)])

    prompt = shared + tokens(12, seed=52)
    result = execute(
        worker,
        new_requests=[request(2, prompt, prefix_slots=owner_slots[:20])],
        runs=[Run(rid=2, start=20, num_new=12, new_slots=slots.take(12), sample=True,
                  prompt_logprob_from=22)],
    )
    assert result.num_tokens == 12  # the cached 20 positions are not recomputed
    res = by_rid(result)[2]
    ref = reference(loaded, prompt)
    assert_token(res.token, ref[-1])
    # prompt logprobs of tokens 22..31: rows 21..30, all inside the computed part
    assert [t.token_id for t in res.prompt_logprobs] == prompt[22:]
    for pos, tok in enumerate(res.prompt_logprobs, start=22):
        assert_token(tok, ref[pos - 1], greedy=False)
    # the request continues from its table: prefix slots + its own
    check_greedy_sequence(loaded, prompt, [res, decode(worker, slots, {2: 32})[2]])


def test_prefix_slots_are_read_not_recomputed(worker: Worker, loaded: LoadedModel) -> None:
    """The prefix's K/V is taken from the given slots: with other K/V there, other logits."""
    slots = Slots(seed=6)
    shared = tokens(16, seed=60)
    owner_slots = slots.take(16)
    execute(worker, new_requests=[request(1, shared)],
            runs=[Run(rid=1, start=0, num_new=16, new_slots=owner_slots, sample=False)])
    other_slots = slots.take(16)
    execute(worker, new_requests=[request(9, tokens(16, seed=61))],
            runs=[Run(rid=9, start=0, num_new=16, new_slots=other_slots, sample=False)])
    prompt = shared + tokens(4, seed=62)
    right = execute(worker, new_requests=[request(2, prompt, prefix_slots=owner_slots)],
                    runs=[Run(rid=2, start=16, num_new=4, new_slots=slots.take(4), sample=True)])
    wrong = execute(worker, new_requests=[request(3, prompt, prefix_slots=other_slots)],
                    runs=[Run(rid=3, start=16, num_new=4, new_slots=slots.take(4), sample=True)])
    ref = reference(loaded, prompt)[-1]
    assert_token(by_rid(right)[2].token, ref)
    tok = by_rid(wrong)[3].token
    assert tok is not None and tok.logprob != pytest.approx(float(ref[tok.token_id]), abs=1e-3)


# --- copy-on-write and re-point ----------------------------------------------------------------
def _garbage(worker: Worker, slots: list[int], seed: int) -> None:
    kv = worker.kv_cache
    shape = (2, kv.num_layers, len(slots), kv.num_kv_heads, kv.head_dim)
    data = 5.0 * torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    kv.write_slots(torch.tensor(slots), data)


def test_copy_on_write_gives_the_request_its_own_copy(worker: Worker, loaded: LoadedModel) -> None:
    slots = Slots(seed=7)
    shared = tokens(16, seed=70)
    owner_slots = slots.take(16)
    execute(worker, new_requests=[request(1, shared + tokens(4, seed=71))],
            runs=[Run(rid=1, start=0, num_new=20, new_slots=owner_slots + slots.take(4),
                      sample=True)])

    # request 2 shares 16 positions; its last 4 (a partial page) are copied before it writes on
    prompt = shared + tokens(8, seed=72)
    src, dst = owner_slots[12:16], slots.take(4)
    before = worker.kv_cache.read_slots(torch.tensor(src))
    result = execute(
        worker,
        new_requests=[request(2, prompt, prefix_slots=owner_slots)],
        copies=[SlotCopy(rid=2, start=12, src=src, dst=dst)],
        runs=[Run(rid=2, start=16, num_new=8, new_slots=slots.take(8), sample=True)],
    )
    assert torch.equal(worker.kv_cache.read_slots(torch.tensor(dst)), before)
    assert torch.equal(worker.kv_cache.read_slots(torch.tensor(src)), before)  # source untouched
    first = by_rid(result)[2]

    _garbage(worker, src, seed=73)  # the owner's slots change (e.g. reused after it ended)
    nxt = decode(worker, slots, {2: 24})[2]
    check_greedy_sequence(loaded, prompt, [first, nxt])


def test_repoint_only_changes_the_slot_table(worker: Worker, loaded: LoadedModel) -> None:
    slots = Slots(seed=8)
    shared = tokens(16, seed=80)
    owner_slots = slots.take(16)
    execute(worker, new_requests=[request(1, shared)],
            runs=[Run(rid=1, start=0, num_new=16, new_slots=owner_slots, sample=False)])
    junk = slots.take(4)
    _garbage(worker, junk, seed=81)

    # admitted onto junk for positions 12..15, then re-pointed at the owner's (shared) slots
    prompt = shared + tokens(6, seed=82)
    before = worker.kv_cache.buffer.clone()
    result = execute(
        worker,
        new_requests=[request(2, prompt, prefix_slots=owner_slots[:12] + junk)],
        copies=[SlotCopy(rid=2, start=12, src=owner_slots[12:], dst=owner_slots[12:])],
    )
    assert result.results == [] and result.num_tokens == 0
    assert torch.equal(worker.kv_cache.buffer, before)  # nothing copied, nothing written
    res = by_rid(execute(worker, runs=[Run(rid=2, start=16, num_new=6, new_slots=slots.take(6),
                                           sample=True)]))[2]
    check_greedy_sequence(loaded, prompt, [res])


# --- swap and free -----------------------------------------------------------------------------
def test_swap_out_and_in_elsewhere_restores_kv(worker: Worker, loaded: LoadedModel) -> None:
    prompt = tokens(24, seed=9)
    expected = greedy_continuation(Worker(loaded, NUM_SLOTS), Slots(seed=90), 1, prompt, steps=3)

    slots = Slots(seed=91)
    table = slots.take(25)
    first = execute(worker, new_requests=[request(1, prompt)],
                    runs=[Run(rid=1, start=0, num_new=24, new_slots=table[:24], sample=True)])
    second = execute(worker, runs=[Run(rid=1, start=24, num_new=1, new_slots=table[24:],
                                       sample=True)])
    got = [by_rid(first)[1], by_rid(second)[1]]

    # one plan swaps 1 out and lets another request write into the slots it gave up
    execute(worker, swap_out=[Swap(rid=1, slots=table)], new_requests=[request(2, tokens(25, 92))],
            runs=[Run(rid=2, start=0, num_new=25, new_slots=table, sample=True)])
    with pytest.raises(RuntimeError, match="slot table has 0 positions"):  # its table is gone
        execute(worker, runs=[Run(rid=1, start=25, num_new=1, new_slots=slots.take(1),
                                  sample=True)])

    elsewhere = slots.take(25)
    assert not set(elsewhere) & set(table)
    result = execute(worker, swap_in=[Swap(rid=1, slots=elsewhere)],
                     runs=[Run(rid=1, start=25, num_new=1, new_slots=slots.take(1), sample=True)])
    got.append(by_rid(result)[1])
    got.append(decode(worker, slots, {1: 26})[1])

    check_same_tokens(loaded, prompt, got, expected)


def test_free_forgets_the_request_and_its_swapped_kv(worker: Worker) -> None:
    slots = Slots(seed=10)
    prompt = tokens(12, seed=10)
    prefill(worker, slots, 4242, prompt)
    execute(worker, free=[4242, 999])  # 999 was never admitted: nothing to forget
    with pytest.raises(KeyError, match="4242"):
        execute(worker, runs=[Run(rid=4242, start=12, num_new=1, new_slots=slots.take(1),
                                  sample=True)])

    table = slots.take(12)
    execute(worker, new_requests=[request(5, prompt)],
            runs=[Run(rid=5, start=0, num_new=12, new_slots=table, sample=False)])
    execute(worker, swap_out=[Swap(rid=5, slots=table)], free=[5])  # swapped, then aborted
    with pytest.raises(KeyError, match="5"):
        execute(worker, swap_in=[Swap(rid=5, slots=slots.take(12))])


def test_an_aborted_swapped_out_request_leaves_no_host_kv(worker: Worker,
                                                          loaded: LoadedModel) -> None:
    """Under swap preemption a request's KV waits in host memory until it is swapped back in.
    Aborted while it waits (freed), its host copy goes with it, or host memory leaks with every
    such abort; a request swapped out beside it keeps its copy and decodes on as if it had never
    left the pool."""
    slots = Slots(seed=13)
    prompts = {rid: tokens(10, seed=130 + rid) for rid in (6, 7)}
    tables = {rid: slots.take(10) for rid in prompts}
    first = by_rid(execute(worker, new_requests=[request(rid, p) for rid, p in prompts.items()],
                           runs=[Run(rid=rid, start=0, num_new=10, new_slots=tables[rid],
                                     sample=True) for rid in prompts]))
    execute(worker, swap_out=[Swap(rid=rid, slots=tables[rid]) for rid in prompts])
    assert sorted(worker.swapped) == [6, 7]
    execute(worker, free=[6])  # aborted while swapped out
    assert sorted(worker.swapped) == [7]  # no host KV of 6 is left
    result = execute(worker, swap_in=[Swap(rid=7, slots=slots.take(10))],
                     runs=[Run(rid=7, start=10, num_new=1, new_slots=slots.take(1), sample=True)])
    check_greedy_sequence(loaded, prompts[7], [first[7], by_rid(result)[7]])
    assert worker.swapped == {}


def test_free_and_readmit_in_one_plan_starts_clean(worker: Worker, loaded: LoadedModel) -> None:
    """Preemption by recompute: the request comes back with its outputs and is recomputed from
    position 0; a seeded request then samples what it would have sampled anyway."""
    prompt = tokens(15, seed=11)
    seeded = params(temperature=1.0, seed=11)
    ref_worker = Worker(loaded, NUM_SLOTS)
    ref_slots = Slots(seed=111)
    expected = [prefill(ref_worker, ref_slots, 1, prompt, params=seeded)]
    expected += [decode(ref_worker, ref_slots, {1: 15 + i})[1] for i in range(3)]
    outputs = [r.token.token_id for r in expected]

    slots = Slots(seed=112)
    prefill(worker, slots, 1, prompt, params=seeded)
    decode(worker, slots, {1: 15})
    again = execute(
        worker,
        free=[1],
        new_requests=[request(1, prompt, output_ids=outputs[:2], params=seeded)],
        runs=[Run(rid=1, start=0, num_new=17, new_slots=slots.take(17), sample=True)],
    )
    assert again.num_tokens == 17
    res = by_rid(again)[1]
    assert res.token.token_id == outputs[2]
    assert_token(res.token, reference(loaded, prompt + outputs[:2])[-1], greedy=False)
    assert decode(worker, slots, {1: 17})[1].token.token_id == outputs[3]


def test_a_run_ending_before_the_known_tokens_scores_the_next_one(
    worker: Worker, loaded: LoadedModel
) -> None:
    """Under overlap, jump-forward's tokens reach the worker before the plans know of them: a
    sampling run that ends before the last known token scores the next known token, samples and
    appends nothing. Outputs of a re-admitted request put the worker in the same state."""
    prompt, outputs = tokens(14, seed=20), [7, 8, 9]
    slots = Slots(seed=20)
    first = execute(worker, new_requests=[request(1, prompt, output_ids=outputs)],
                    runs=[Run(rid=1, start=0, num_new=15, new_slots=slots.take(15), sample=True)])
    ref = reference(loaded, prompt + outputs)
    known = by_rid(first)[1].token
    assert known is not None and known.token_id == outputs[1]
    assert_token(known, ref[14], greedy=False)
    rest = execute(worker, runs=[Run(rid=1, start=15, num_new=2, new_slots=slots.take(2),
                                     sample=True)])
    assert_token(by_rid(rest)[1].token, ref[16])  # after all known tokens: sampled (greedy)


# --- speculative decoding: a draft tree -------------------------------------------------------
@pytest.mark.parametrize("prompt_draft", [False, True])
def test_a_draft_tree_follows_the_branch_its_samples_take(
        worker: Worker, loaded: LoadedModel, prompt_draft: bool) -> None:
    """A tree of drafted tokens: every node is computed after exactly its own path (the branches
    are batch entries whose prefix is their ancestors' slots), the walk accepts the branch the
    greedy samples take, the logprobs are the reference's, and the accepted branch's KV ends up
    where a chain's would be: the next decode reads it and matches the reference. On a prompt's
    last chunk too (the chunk, then the tree, in one extend)."""
    prompt = tokens(30, seed=31)
    slots = Slots(seed=31)
    greedy = prompt[:]
    for _ in range(6):
        greedy.append(int(reference(loaded, greedy)[-1].argmax()))
    if prompt_draft:  # the samples after the prompt's last token: s0 s1 s2 s3
        known, s = len(prompt), greedy[30:34]
    else:  # after the prefill's own sample g0
        known, s = len(prompt) + 1, greedy[31:35]
    #   root -> 0: not s0 -> 1: s1              (the main line, rejected at once)
    #        -> 2: s0 -> 3: s1 -> 4: not s2
    #                          -> 5: s2          (a branch off a branch: accepted, then s3)
    draft = [(s[0] + 1) % VOCAB, s[1], s[0], s[1], (s[2] + 1) % VOCAB, s[2]]
    parents = [-1, 0, -1, 2, 3, 3]
    if prompt_draft:
        run = Run(rid=4, start=0, num_new=known + 6, new_slots=slots.take(known + 6),
                  sample=True, draft=draft, draft_parents=parents)
        result = by_rid(execute(worker, new_requests=[request(4, prompt)], runs=[run]))[4]
    else:
        prefill(worker, slots, 4, prompt)
        run = Run(rid=4, start=known - 1, num_new=1 + 6, new_slots=slots.take(7), sample=True,
                  draft=draft, draft_parents=parents)
        result = by_rid(execute(worker, runs=[run]))[4]
    assert result.token is not None
    assert [t.token_id for t in result.accepted] + [result.token.token_id] == s
    ref = reference(loaded, greedy)
    for i, tok in enumerate([*result.accepted, result.token]):
        assert_token(tok, ref[known - 1 + i])
    nxt = decode(worker, slots, {4: known + 3})[4]  # reads the accepted branch's moved KV
    assert_token(nxt.token, ref[known + 3])


# --- n > 1 and seeded sampling -----------------------------------------------------------------
def test_fork_children_sample_with_their_seed_offsets(worker: Worker, loaded: LoadedModel) -> None:
    prompt = tokens(20, seed=12)
    one = {"temperature": 1.0, "seed": 1234, "top_logprobs": 0}
    children = [-11, -12, -13, -14]
    slots = Slots(seed=12)
    result = execute(
        worker,
        new_requests=[request(10, prompt, params=params(**one, n=4))],
        runs=[Run(rid=10, start=0, num_new=20, new_slots=slots.take(20), sample=True,
                  prompt_logprob_from=1, fork_into=children)],
    )
    assert [r.rid for r in result.results] == [*children, 10]
    parent = by_rid(result)[10]
    assert parent.token is None
    ref = reference(loaded, prompt)
    assert [t.token_id for t in parent.prompt_logprobs] == prompt[1:]
    for pos, tok in enumerate(parent.prompt_logprobs, start=1):
        assert_token(tok, ref[pos - 1], greedy=False)
    firsts = [by_rid(result)[c].token for c in children]
    for tok in firsts:
        assert_token(tok, ref[-1], greedy=False)
    assert len({t.token_id for t in firsts}) > 1  # the children's draws differ

    # child i samples as sample i of the prompt would alone (e.g. re-admitted after preemption)
    alone = Worker(loaded, NUM_SLOTS)
    alone_slots = Slots(seed=120)
    for i, tok in enumerate(firsts):
        res = prefill(alone, alone_slots, 100 + i, prompt, params=params(**one), seed_offset=i)
        assert res.token.token_id == tok.token_id
    seconds = decode(alone, alone_slots, {100 + i: 20 for i in range(4)})

    # the children decode on from the parent's K/V, each on its own table
    nxt = decode(worker, slots, {c: 20 for c in children})
    for i, child in enumerate(children):
        assert nxt[child].token.token_id == seconds[100 + i].token.token_id
        ref_child = reference(loaded, prompt + [firsts[i].token_id])[-1]
        assert_token(nxt[child].token, ref_child, greedy=False)
    with pytest.raises(KeyError, match="10"):  # the parent is gone: its children replace it
        execute(worker, runs=[Run(rid=10, start=20, num_new=1, new_slots=slots.take(1),
                                  sample=True)])


def _seeded_run(loaded: LoadedModel, prompt: list[int], seed: int, steps: int) -> list[int]:
    worker, slots = Worker(loaded, NUM_SLOTS), Slots(seed=seed)
    out = [prefill(worker, slots, 1, prompt, params=params(temperature=1.0, seed=seed))]
    out += [decode(worker, slots, {1: len(prompt) + i})[1] for i in range(steps)]
    return [r.token.token_id for r in out]


def test_seeded_sampling_does_not_depend_on_the_batch(loaded: LoadedModel) -> None:
    prompt = tokens(18, seed=13)
    alone = _seeded_run(loaded, prompt, seed=77, steps=4)
    assert _seeded_run(loaded, prompt, seed=78, steps=4) != alone  # the seed matters

    worker, slots = Worker(loaded, NUM_SLOTS, seed=5), Slots(seed=130)
    a, b = tokens(10, seed=131), tokens(30, seed=132)
    first = execute(
        worker,
        new_requests=[request(1, a, params=params(temperature=1.0)),
                      request(2, prompt, params=params(temperature=1.0, seed=77)),
                      request(3, b, params=params(temperature=0.7, seed=1))],
        runs=[Run(rid=1, start=0, num_new=10, new_slots=slots.take(10), sample=True),
              Run(rid=2, start=0, num_new=18, new_slots=slots.take(18), sample=True),
              Run(rid=3, start=0, num_new=15, new_slots=slots.take(15), sample=False)],
    )
    got = [by_rid(first)[2]]
    second = execute(
        worker,
        runs=[Run(rid=3, start=15, num_new=15, new_slots=slots.take(15), sample=True),
              Run(rid=1, start=10, num_new=1, new_slots=slots.take(1), sample=True),
              Run(rid=2, start=18, num_new=1, new_slots=slots.take(1), sample=True)],
    )
    got.append(by_rid(second)[2])
    for i in range(2, 5):
        got.append(decode(worker, slots, {3: 30 + i - 2, 2: 18 + i - 1, 1: 10 + i - 1})[2])
    assert [r.token.token_id for r in got] == alone
    ref = reference(loaded, prompt + alone)
    for i, res in enumerate(got):
        assert_token(res.token, ref[17 + i], greedy=False)


def test_sampling_sees_the_requests_own_output_history(worker: Worker, loaded: LoadedModel) -> None:
    """min_tokens counts the outputs the worker holds: EOS (boosted here by a logit bias) is
    masked for exactly the first two tokens, and logprobs stay those of the raw model."""
    prompt = tokens(12, seed=21)
    eos = EOS_IDS[0]
    slots = Slots(seed=21)
    p = params(min_tokens=2, logit_bias={eos: 100.0})
    got = [prefill(worker, slots, 1, prompt, params=p)]
    got += [decode(worker, slots, {1: 12 + i})[1] for i in range(2)]
    out = [r.token.token_id for r in got]
    assert out[2] == eos and eos not in out[:2] and EOS_IDS[1] not in out[:2]
    ref = reference(loaded, prompt + out)
    for i, res in enumerate(got[:2]):
        masked = ref[11 + i].index_fill(0, torch.tensor(EOS_IDS), float("-inf"))
        assert res.token.token_id == int(masked.argmax())
    for i, res in enumerate(got):
        assert_token(res.token, ref[11 + i], greedy=False)


# --- prompt logprobs ---------------------------------------------------------------------------
@pytest.mark.parametrize("start", [1, 5])
def test_prompt_logprobs_over_two_chunks(worker: Worker, loaded: LoadedModel, start: int) -> None:
    prompt, other = tokens(30, seed=14), tokens(9, seed=140)
    slots = Slots(seed=14)
    head = execute(worker, new_requests=[request(1, prompt), request(2, other)],
                   runs=[Run(rid=2, start=0, num_new=9, new_slots=slots.take(9), sample=True),
                         Run(rid=1, start=0, num_new=18, new_slots=slots.take(18), sample=False,
                             prompt_logprob_from=start)])
    part1 = by_rid(head)[1]
    assert part1.token is None
    tail = execute(worker, new_requests=[request(3, other)],
                   runs=[Run(rid=2, start=9, num_new=1, new_slots=slots.take(1), sample=True),
                         Run(rid=3, start=0, num_new=9, new_slots=slots.take(9), sample=True,
                             prompt_logprob_from=4),
                         Run(rid=1, start=18, num_new=12, new_slots=slots.take(12), sample=True,
                             prompt_logprob_from=start)])
    part2 = by_rid(tail)[1]

    ref = reference(loaded, prompt)
    lps = part1.prompt_logprobs + part2.prompt_logprobs
    assert [t.token_id for t in part1.prompt_logprobs] == prompt[start:19]
    assert [t.token_id for t in lps] == prompt[start:]
    for pos, tok in enumerate(lps, start=start):
        assert_token(tok, ref[pos - 1], greedy=False)
        assert len(tok.top) == TOP
    assert_token(part2.token, ref[-1])

    ref_other = reference(loaded, other)  # a neighbour's rows are its own
    res3 = by_rid(tail)[3]
    assert [t.token_id for t in res3.prompt_logprobs] == other[4:]
    for pos, tok in enumerate(res3.prompt_logprobs, start=4):
        assert_token(tok, ref_other[pos - 1], greedy=False)
    assert_token(res3.token, ref_other[-1])
    assert by_rid(tail)[2].prompt_logprobs == []


# --- the factory -------------------------------------------------------------------------------
def test_build_worker_loads_the_model_and_sizes_the_pool(
    checkpoint: tuple[Path, Any], loaded: LoadedModel
) -> None:
    config = EngineConfig(model=str(checkpoint[0]), device="cpu", dtype="float32", page_size=4,
                          max_total_tokens=50, seed=3)
    worker, ready = build_worker(config)
    assert ready == WorkerReady(num_pages=12, page_size=4, context_length=MAX_POSITIONS,
                                vocab_size=VOCAB, eos_token_ids=EOS_IDS, device="cpu",
                                dtype="float32",
                                kv_bytes_per_token=worker.kv_cache.bytes_per_token(),
                                weight_formats=worker.model.weight_formats(),
                                cpu=CpuCompute(torch.get_num_threads(), True, openmp_wait()),
                                pooling=PoolingInfo(hidden_size=worker.config.hidden_size))
    assert sum(ready.weight_formats.values()) == sum(  # the tiny safetensors model: all float32
        p.numel() * 4 for p in worker.model.parameters()) == ready.weight_formats["float32"]
    assert worker.kv_cache.num_slots == 48
    prompt = tokens(20, seed=15)
    res = prefill(worker, Slots(seed=15, num_slots=48), 1, prompt)  # the checkpoint's weights
    assert_token(res.token, reference(loaded, prompt)[-1])

    _, ready = build_worker(config.with_(context_length=100, dtype="bfloat16", page_size=8))
    assert (ready.context_length, ready.dtype, ready.num_pages) == (100, "bfloat16", 6)


def test_build_worker_keeps_a_loaded_models_device_and_dtype(checkpoint: tuple[Path, Any]) -> None:
    bf16 = load_model(str(checkpoint[0]), dtype="bfloat16", device="cpu")
    # nothing is loaded: neither this model path nor this device would work
    config = EngineConfig(model="/nonexistent/model", device="cuda:7", dtype="float32",
                          max_total_tokens=64, page_size=2)
    worker, ready = build_worker(config, loaded=bf16)
    assert (ready.device, ready.dtype, ready.num_pages) == ("cpu", "bfloat16", 32)
    assert worker.model is bf16.model
    assert worker.kv_cache.buffer.dtype == torch.bfloat16
    assert worker.kv_cache.buffer.device == torch.device("cpu")
    res = prefill(worker, Slots(seed=16, num_slots=64), 1, tokens(8, seed=16))
    assert res.token is not None and 0 <= res.token.token_id < VOCAB


def test_pool_pages() -> None:
    cpu = torch.device("cpu")
    huge = 1 << 60  # bytes per token: no memory holds even one
    # an explicit max_total_tokens wins over memory, rounded down to whole pages
    assert pool_pages(EngineConfig(max_total_tokens=4099, page_size=8), huge, cpu) == 512
    assert pool_pages(EngineConfig(max_total_tokens=23, page_size=8), huge, cpu) == 2
    assert pool_pages(EngineConfig(max_total_tokens=16, page_size=8), 1, cpu) == 2
    # from memory: capped on the CPU, and never under 2 pages
    assert pool_pages(EngineConfig(page_size=4), 1, cpu) == CPU_MAX_POOL_TOKENS // 4
    assert pool_pages(EngineConfig(page_size=4), huge, cpu) == 2


def test_resolve_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    auto = resolve_device("auto")
    assert auto == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count:
        assert resolve_device(f"cuda:{count - 1}") == torch.device("cuda", count - 1)
    with pytest.raises(ValueError, match=f"device='cuda:{count}'"):  # one past the last there
        resolve_device(f"cuda:{count}")


# --- executors ---------------------------------------------------------------------------------
def _plans(prompt: list[int], steps: int, first_step: int) -> list[StepPlan]:
    """Prefill then decode steps of request 1, submittable all at once: runs carry no tokens."""
    slots = Slots(seed=first_step)
    plans = [StepPlan(step_id=first_step, new_requests=[request(1, prompt)],
                      runs=[Run(rid=1, start=0, num_new=len(prompt),
                                new_slots=slots.take(len(prompt)), sample=True)])]
    for i in range(steps):
        run = Run(rid=1, start=len(prompt) + i, num_new=1, new_slots=slots.take(1), sample=True)
        plans.append(StepPlan(step_id=first_step + 1 + i, runs=[run]))
    return plans


def _bad_plan(step_id: int) -> StepPlan:
    return StepPlan(step_id=step_id, runs=[Run(rid=1, start=3, num_new=1, new_slots=[200],
                                               sample=True)])


@pytest.mark.parametrize("executor", [InlineExecutor, ThreadExecutor])
def test_executor_returns_results_in_submission_order(loaded: LoadedModel, executor: Any) -> None:
    prompt = tokens(16, seed=17)
    ex = executor(Worker(loaded, NUM_SLOTS))
    for plan in _plans(prompt, steps=5, first_step=40):
        ex.submit(plan)  # nothing taken yet: under overlap plans queue up
    results = [ex.take() for _ in range(6)]
    ex.close()
    assert [r.step_id for r in results] == list(range(40, 46))
    check_greedy_sequence(loaded, prompt, [r.results[0] for r in results])


def test_thread_executor_reraises_the_worker_exception_from_take(loaded: LoadedModel) -> None:
    def workers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("radixrt-worker")}

    before = workers()
    ex = ThreadExecutor(Worker(loaded, NUM_SLOTS))
    prefill_plan, decode_plan = _plans(tokens(16, seed=18), steps=1, first_step=50)
    ex.submit(prefill_plan)
    ex.submit(_bad_plan(99))  # submit does not raise: the plan runs on the worker thread
    ex.submit(decode_plan)
    assert ex.take().step_id == 50
    with pytest.raises(RuntimeError, match="slot table has 16 positions, the plan starts at 3"):
        ex.take()
    ex.close()  # waits for the plan still queued; the thread ends
    assert ex.take().step_id == 51  # the decode plan ran after the failed one
    assert workers() == before
    with pytest.raises(RuntimeError):
        ex.submit(_bad_plan(98))


def test_inline_executor_raises_the_worker_exception(loaded: LoadedModel) -> None:
    ex = InlineExecutor(Worker(loaded, NUM_SLOTS))
    prefill_plan, decode_plan = _plans(tokens(16, seed=19), steps=1, first_step=60)
    ex.submit(prefill_plan)
    with pytest.raises(RuntimeError, match="slot table has 16 positions, the plan starts at 3"):
        ex.submit(_bad_plan(99))  # inline, the plan runs (and fails) inside submit
    ex.submit(decode_plan)
    ex.close()
    assert [ex.take().step_id, ex.take().step_id] == [60, 61]
    with pytest.raises(IndexError):  # the failed plan left no result behind
        ex.take()


def test_thread_executor_close_waits_for_the_plans_submitted(loaded: LoadedModel) -> None:
    prompt = tokens(16, seed=22)
    ex = ThreadExecutor(Worker(loaded, NUM_SLOTS))
    for plan in _plans(prompt, steps=20, first_step=70):
        ex.submit(plan)
    ex.close()  # at once: most plans are still queued on the worker thread
    results = [ex.take() for _ in range(21)]
    assert [r.step_id for r in results] == list(range(70, 91))
    check_greedy_sequence(loaded, prompt, [r.results[0] for r in results])
