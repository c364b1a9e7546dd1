"""Pooling requests' inputs and results, for every way in (the Engine, /v1/embeddings,
/v1/rerank, /classify, the DSL): the SamplingParams of each task, the token ids of a rerank
pair, and what a head's logits mean.

Reranking writes each (query, document) pair so that the query comes first: every document's
prompt starts with the same tokens, which the radix tree computes once.

- a cross-encoder (a classifier of one label): the tokenizer's text pair, as
  sentence-transformers' CrossEncoder tokenizes it; score = sigmoid(logit);
- a language model served with `--task rerank` (Qwen3-Reranker's form, models/pooling_config.py
  `rerank_prompt`); score = P(yes) / (P(yes) + P(no)) at the last token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from radixrt.runtime.models.pooling_config import rerank_prompt
from radixrt.runtime.pooling_params import Pooling, PoolingInfo, sigmoid, softmax
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.tokenizer.prompts import Prompt, is_single_prompt

MAX_POOLING_INPUTS = 2048  # texts per embeddings / classify request (OpenAI's bound)
MAX_RERANK_DOCUMENTS = 2048
MAX_POOLING_TOKENS = 1 << 20  # tokens of all the inputs of one request together


class PoolingAborted(Exception):
    """A pooling request was aborted (POST /abort, a client gone) before its result."""


def embed_params(info: PoolingInfo, dimensions: int | None = None,
                 normalize: bool | None = None) -> SamplingParams:
    """An embedding request: the model's pooling, normalized as its checkpoint says unless
    `normalize` is given."""
    spec = Pooling("embed", info.mode, info.normalize if normalize is None else normalize,
                   dimensions)
    return SamplingParams(max_tokens=0, pooling=spec)


def score_params(info: PoolingInfo) -> SamplingParams:
    """A classification / reward / rerank request: the head's logits at the last token (an LM
    reranker's: its yes/no tokens)."""
    if not info.num_labels and not info.rerank_tokens:
        raise ValueError("this model has no classification head and does not rerank: serve a "
                         "*ForSequenceClassification checkpoint, or start a language model "
                         "with --task rerank")
    return SamplingParams(max_tokens=0, pooling=Pooling("classify",
                                                         label_tokens=info.rerank_tokens))


def rerank_ids(tokenizer: Any, info: PoolingInfo, query: str, documents: Sequence[str],
               instruction: str | None = None) -> list[list[int]]:
    """The prompt of each (query, document) pair, the query first. Bounded before any pair is
    built: the documents' count, and the query's tokens times their count."""
    if not info.rerank_tokens and info.num_labels != 1:
        raise ValueError("this model does not rerank: serve a cross-encoder (a classifier of "
                         "one label), or start a language model with --task rerank")
    if tokenizer is None:
        raise ValueError("reranking needs the model's tokenizer")
    check_count(len(documents), MAX_RERANK_DOCUMENTS, "documents")
    query_tokens = len(tokenizer.encode(query, add_special_tokens=False))
    if query_tokens * len(documents) > MAX_POOLING_TOKENS:
        raise ValueError(f"the query's {query_tokens} tokens repeated for {len(documents)} "
                         f"documents make more than {MAX_POOLING_TOKENS} tokens: shorten the "
                         "query or send fewer documents per request")
    if not info.rerank_tokens:
        out = [list(tokenizer(query, doc)["input_ids"]) for doc in documents]
    else:
        out = [list(tokenizer.encode(rerank_prompt(tokenizer, query, doc, instruction),
                                     add_special_tokens=False)) for doc in documents]
    check_total(out, "query and documents")
    return out


def rerank_score(info: PoolingInfo, logits: Sequence[float]) -> float:
    """A pair's relevance in [0, 1] from its logits (score_params)."""
    if info.rerank_tokens:  # [no, yes]
        return softmax(logits)[1]
    return sigmoid(logits[0])


def class_probs(logits: Sequence[float]) -> list[float]:
    """A classifier's probabilities over its labels (one label: its sigmoid)."""
    return [sigmoid(logits[0])] if len(logits) == 1 else softmax(logits)


def encode_inputs(encode: Callable[[Prompt], list[int]], inputs: Prompt | Sequence[Prompt],
                  what: str = "inputs") -> list[list[int]]:
    """One input (text or token ids) or a list of them, as token ids, bounded: the count
    before anything is encoded, the tokens of them all after."""
    batch = [inputs] if is_single_prompt(inputs) else list(inputs)  # type: ignore[list-item]
    check_count(len(batch), MAX_POOLING_INPUTS, what)
    ids = [encode(p) for p in batch]
    check_total(ids)
    return ids


def check_count(count: int, limit: int, what: str) -> None:
    if not count:
        raise ValueError(f"{what} is empty: give at least one")
    if count > limit:
        raise ValueError(f"{what} has {count} entries: at most {limit} per request; split them")


def pooled_result(pooled: Sequence[float], finish_reason: str | None, index: int) -> list[float]:
    """The vector or logits of input `index`'s finished request: PoolingAborted when it was
    aborted, ValueError when it ended otherwise without one (refused: the pool too small...)."""
    if finish_reason == "length" and pooled:
        return list(pooled)
    if finish_reason == "abort":
        raise PoolingAborted(f"input {index} was aborted before its result")
    raise ValueError(f"input {index} ended without a result ({finish_reason})")


def check_total(inputs: Sequence[Sequence[int]], what: str = "inputs") -> None:
    """Refuse a request whose inputs together run past MAX_POOLING_TOKENS."""
    total = sum(len(ids) for ids in inputs)
    if total > MAX_POOLING_TOKENS:
        raise ValueError(f"the {what} have {total} tokens together: at most "
                         f"{MAX_POOLING_TOKENS} per request; split them over several requests")
