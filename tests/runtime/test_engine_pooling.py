"""Pooling in the Engine: embeddings, classification, reward scores and reranking against
sentence-transformers and transformers on the same tiny random weights (two families each:
Qwen2 / Llama embedders, Qwen2 / Llama classifiers, a Llama cross-encoder, a Qwen3 yes/no
reranker), alone and batched, under the radix cache (a shared prefix computed once) and with
chunked prefill (the prompt in pieces); requests the model cannot answer are refused with a
message and the engine goes on serving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pooling_models import build_pooling_models
from tiny_models import TINY

from radixrt import Engine, SamplingParams
from radixrt.runtime.models import load_model
from radixrt.runtime.models.pooling_config import DEFAULT_RERANK_INSTRUCTION, RERANK_SYSTEM
from radixrt.runtime.pooling_params import Pooling
from radixrt.runtime.tokenizer.pooling_inputs import embed_params

pytestmark = pytest.mark.model

COSINE = 1e-4  # embeddings: 1 - cosine similarity against sentence-transformers
SCORE = 1e-3  # scores and probabilities, absolute
TEXTS = ["The cat sat on the mat.",
         "Radix trees share prefixes; embeddings map each text to one vector.",
         "A short one.",
         "Retrieval first embeds the documents, then the query, then compares them all."]
QUERY = "Which animal sat on the mat?"
INSTRUCTION = ("Instruct: represent this passage so that a later search finds it when a question "
               "it answers comes; keep what it says about who, what, where and when, and leave "
               "out its style. Passage: ")  # past the in-batch minimum (32 tokens)
LONG_QUERY = ("It was a quiet afternoon, the house was warm, and everyone in it had a favourite "
              "place to rest by the window or the fire. " + QUERY)  # past the in-batch minimum
DOCS = ["The cat sat on the mat all afternoon.", "Stock prices fell on Tuesday.",
        "A dog slept by the door.", "Mats are woven from reeds in some places."]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> dict[str, Path]:
    return build_pooling_models(tmp_path_factory.mktemp("pooling"), tokenizer)


def engine(folder: Path, **options: Any) -> Engine:
    options = {"check_integrity": True, "max_total_tokens": 4096, **options}
    return Engine(load_model(str(folder)), **options)


def st_embeddings(folder: Path, texts: list[str]) -> torch.Tensor:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode(
        texts, convert_to_tensor=True).float()


def assert_close_vectors(got: list[list[float]], ref: torch.Tensor) -> None:
    g = torch.tensor(got)
    assert g.shape == ref.shape
    cos = torch.nn.functional.cosine_similarity(g, ref, dim=-1)
    assert (1 - cos).max().item() < COSINE, cos
    assert torch.allclose(g.norm(dim=-1), ref.norm(dim=-1), rtol=1e-4), (g.norm(dim=-1),
                                                                          ref.norm(dim=-1))


@pytest.mark.parametrize("name", ["qwen2-embed", "llama-mean", "qwen3-cls"])
def test_embeddings_equal_sentence_transformers(models: dict[str, Path], name: str) -> None:
    """Last-token (normalized), mean (not normalized) and CLS (normalized) pooling as the
    checkpoint's sentence-transformers files say: alone, batched, in 16-token prefill chunks."""
    ref = st_embeddings(models[name], TEXTS)
    for options in ({}, {"max_num_batched_tokens": 16}):
        e = engine(models[name], **options)
        try:
            assert e.pooling.mode == {"qwen2-embed": "last", "llama-mean": "mean",
                                      "qwen3-cls": "cls"}[name]
            assert_close_vectors([e.embed(TEXTS[0])[0]], ref[:1])
            assert_close_vectors(e.embed(TEXTS), ref)
            # again: last-token pooling reads the cached prompt (all but its last token);
            # mean pooling computes every row again
            assert_close_vectors(e.embed(TEXTS), ref)
            e.check_integrity()
        finally:
            e.close()


def test_embeddings_share_a_prefix_and_cut_dimensions(models: dict[str, Path],
                                                      tokenizer: Any) -> None:
    """Documents behind one instruction: the instruction is computed once (the radix tree),
    the vectors equal sentence-transformers'; Matryoshka `dimensions` cuts, then normalizes;
    normalize=False gives the raw pooled state; token ids are taken as they are."""
    instruction = INSTRUCTION
    texts = [instruction + t for t in TEXTS]
    ref = st_embeddings(models["qwen2-embed"], texts)
    e = engine(models["qwen2-embed"])
    try:
        before = e.stats()
        got = e.embed(texts)
        stats = e.stats()
        assert_close_vectors(got, ref)
        shared = len(tokenizer.encode(instruction.rstrip()))
        cached = stats["cached_tokens"] - before["cached_tokens"]
        assert cached >= (len(texts) - 1) * (shared - 2), (cached, shared)
        cut = torch.tensor(e.embed(texts, dimensions=16))
        expect = torch.nn.functional.normalize(ref[:, :16], dim=-1)
        assert torch.allclose(cut, expect, atol=1e-5)
        raw = torch.tensor(e.embed(texts, normalize=False))
        assert torch.allclose(torch.nn.functional.normalize(raw, dim=-1), ref, atol=1e-5)
        assert (raw.norm(dim=-1) - 1).abs().max() > 0.01  # not unit length
        ids = tokenizer.encode(texts[1])
        assert_close_vectors(e.embed([ids]), ref[1:2])
        with pytest.raises(ValueError, match="dimensions=65 is more than the model's 64"):
            e.embed(texts[0], dimensions=65)
        e.check_integrity()
    finally:
        e.close()


@pytest.mark.parametrize("name", ["qwen2-classify", "llama-reward", "qwen3-reward"])
def test_classifier_and_reward_heads_equal_transformers(models: dict[str, Path],
                                                        name: str, tokenizer: Any) -> None:
    """A *ForSequenceClassification checkpoint: its head at the last token; probabilities over
    three labels (softmax), or over one (sigmoid) and a reward model's raw score; it does not
    generate (a clear refusal)."""
    from transformers import AutoModelForSequenceClassification

    ref_model = AutoModelForSequenceClassification.from_pretrained(str(models[name])).eval()
    refs = []
    for text in TEXTS:
        with torch.no_grad():
            logits = ref_model(torch.tensor([tokenizer.encode(text)])).logits[0].float()
        refs.append(logits)
    for options in ({}, {"max_num_batched_tokens": 16}):
        e = engine(models[name], **options)
        try:
            assert e.pooling.task == ("classify" if name == "qwen2-classify" else "reward")
            assert e.pooling.generates is False
            got = e.classify(TEXTS)
            for g, r in zip(got, refs, strict=True):
                want = r.softmax(-1) if r.numel() > 1 else r.sigmoid()
                assert torch.allclose(torch.tensor(g), want, atol=SCORE), (g, r)
            alone = e.classify(TEXTS[2])[0]  # alone, on its cached prompt
            assert alone == pytest.approx(got[2], abs=1e-5)
            if len(refs[0]) == 1:
                assert e.reward(TEXTS) == pytest.approx([r.item() for r in refs], abs=SCORE)
            else:
                with pytest.raises(ValueError, match="reward reads a head of one label"):
                    e.reward(TEXTS)
            with pytest.raises(ValueError, match="no LM head"):
                e.generate("Hello", SamplingParams(max_tokens=4))
            e.check_integrity()
        finally:
            e.close()


def test_cross_encoder_rerank_equals_sentence_transformers(models: dict[str, Path]) -> None:
    """A classifier of one label reranks as a cross-encoder: the (query, document) text pair,
    the sigmoid of its logit, as sentence-transformers' CrossEncoder.predict gives it."""
    from sentence_transformers import CrossEncoder

    ref = CrossEncoder(str(models["llama-reward"]), device="cpu").predict(
        [(LONG_QUERY, d) for d in DOCS])
    e = engine(models["llama-reward"], task="rerank")
    try:
        got = e.rerank(LONG_QUERY, DOCS)
        assert got == pytest.approx([float(x) for x in ref], abs=SCORE)
        assert e.stats()["cached_tokens"] > 0  # the query's tokens: computed once
        e.check_integrity()
    finally:
        e.close()


def test_yes_no_reranker_equals_transformers(models: dict[str, Path], tokenizer: Any) -> None:
    """A language model served with task="rerank" (Qwen3-Reranker's form): P(yes) against
    P(no) after the chat-formatted pair, equal to transformers' logits of the same prompt;
    every document behind the same query reads the query's KV from the radix tree."""
    from transformers import AutoModelForCausalLM

    ref_model = AutoModelForCausalLM.from_pretrained(str(models["qwen3-rerank"])).eval()
    no, yes = (tokenizer.encode(w, add_special_tokens=False)[0] for w in ("no", "yes"))
    refs = []
    for doc in DOCS:
        messages = [{"role": "system", "content": RERANK_SYSTEM},
                    {"role": "user", "content": f"<Instruct>: {DEFAULT_RERANK_INSTRUCTION}\n"
                                                f"<Query>: {QUERY}\n<Document>: {doc}"}]
        text = tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=True, enable_thinking=False)
        ids = tokenizer.encode(text, add_special_tokens=False)
        with torch.no_grad():
            logits = ref_model(torch.tensor([ids])).logits[0, -1].float()
        refs.append(torch.softmax(logits[[no, yes]], -1)[1].item())
    for options in ({}, {"max_num_batched_tokens": 16}):
        e = engine(models["qwen3-rerank"], task="rerank", **options)
        try:
            assert e.pooling.rerank_tokens == (no, yes)
            assert e.rerank(QUERY, DOCS) == pytest.approx(refs, abs=SCORE)
            stats = e.stats()
            assert stats["cached_tokens"] >= (len(DOCS) - 1) * 40, stats["cached_tokens"]
            # the same model still generates, in the same engine
            out = e.generate("Hello", SamplingParams(max_tokens=3, temperature=0,
                                                     ignore_eos=True))[0]
            assert len(out.token_ids) == 3
            e.check_integrity()
        finally:
            e.close()


def test_mean_pooling_inputs_behind_one_prefix_share_a_step(models: dict[str, Path]) -> None:
    """Mean pooling computes every prompt whole, so nothing waits for a shared prefix another
    request computes (the tree could not give it those rows): one step for all of them."""
    e = engine(models["llama-mean"])
    try:
        before = e.stats()["steps"]
        e.embed([INSTRUCTION + t for t in TEXTS])
        assert e.stats()["steps"] - before == 1
    finally:
        e.close()


def test_an_input_that_cannot_run_names_itself(models: dict[str, Path]) -> None:
    """An input the pool can never hold ends the call with a ValueError naming it; the bounds
    on the inputs hold in the Engine as over HTTP; the engine goes on serving."""
    e = engine(models["qwen2-embed"], max_total_tokens=64)
    try:
        with pytest.raises(ValueError, match="input 1 ended without a result"):
            e.embed(["short", "long " * 150])
        with pytest.raises(ValueError, match="inputs is empty"):
            e.embed([])
        with pytest.raises(ValueError, match="at most 2048 per request"):
            e.embed(["x"] * 2049)
        assert len(e.embed("short")[0]) == TINY["hidden_size"]
        e.check_integrity()
    finally:
        e.close()


def test_pooling_and_generation_share_steps(models: dict[str, Path]) -> None:
    """Embeddings and a generation submitted together run in the same forward passes (fewer
    steps than one after the other); each equals what it gives alone."""
    e = engine(models["qwen2-embed"], max_num_batched_tokens=32)
    try:
        params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)

        def steps() -> int:
            return int(e.stats()["steps"])

        before = steps()
        alone_text = e.generate(TEXTS[1], params)[0].token_ids
        gen_steps = steps() - before
        alone_vecs = e.embed(TEXTS)
        pool_steps = steps() - before - gen_steps
        e.flush_cache()
        before = steps()
        rids = [e.submit(TEXTS[1], params)] + [e.submit(t, embed_params(e.pooling))
                                               for t in TEXTS]
        outs: dict[int, Any] = {}
        while len(outs) < len(rids):
            e.step()
            for rid in rids:
                out = None if rid in outs else e.take_output(rid)
                if out is not None:
                    outs[rid] = out
        assert steps() - before < gen_steps + pool_steps, (steps() - before, gen_steps,
                                                           pool_steps)
        assert outs[rids[0]].token_ids == alone_text
        assert_close_vectors([outs[r].pooled for r in rids[1:]], torch.tensor(alone_vecs))
        e.check_integrity()
    finally:
        e.close()


def test_requests_the_model_cannot_answer_are_refused(models: dict[str, Path]) -> None:
    """Each refusal names the fix; the engine serves the next request."""
    e = engine(models["qwen2-embed"])
    try:
        with pytest.raises(ValueError, match="no classification head"):
            e.classify("text")
        with pytest.raises(ValueError, match="does not rerank"):
            e.rerank(QUERY, DOCS)
        with pytest.raises(ValueError, match="max_tokens"):
            SamplingParams(max_tokens=3, pooling=Pooling("embed"))
        with pytest.raises(ValueError, match="pooling mode"):
            Pooling("embed", mode="max")
        with pytest.raises(ValueError, match="task='classify' needs a classification head"):
            Engine(load_model(str(models["qwen2-embed"])), task="classify")
        assert len(e.embed(TEXTS[0])[0]) == TINY["hidden_size"]
        e.check_integrity()
    finally:
        e.close()
