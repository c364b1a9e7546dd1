"""Pooling inputs (no model): the params of each task, rerank prompts that put the query first
(so the radix tree shares it), what logits mean, and the bound on a request's tokens."""

from __future__ import annotations

import pytest
from toy_tokenizers import byte_level_bpe

from radixrt.runtime.pooling_params import PoolingInfo, sigmoid
from radixrt.runtime.tokenizer.pooling_inputs import (
    MAX_POOLING_TOKENS,
    check_total,
    class_probs,
    embed_params,
    rerank_ids,
    rerank_score,
    score_params,
)

CORPUS = ["the query asks which animal sat on the mat", "a cat sat on a mat", "yes no"] * 20
TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>"
            "{% if enable_thinking is false %}<think></think>{% endif %}{% endif %}")
EMBEDDER = PoolingInfo(mode="mean", normalize=False, hidden_size=8)
CROSS = PoolingInfo(hidden_size=8, num_labels=1, labels=("LABEL_0",), generates=False,
                    task="rerank")
LM_RERANK = PoolingInfo(hidden_size=8, task="rerank", rerank_tokens=(5, 6))


@pytest.fixture(scope="module")
def tok():  # noqa: ANN201 - a transformers tokenizer
    t = byte_level_bpe(CORPUS, 400)
    t.chat_template = TEMPLATE
    return t


def test_params_of_each_task() -> None:
    p = embed_params(EMBEDDER, dimensions=4)
    assert p.max_tokens == 0 and p.pooling.mode == "mean" and not p.pooling.normalize
    assert embed_params(EMBEDDER, normalize=True).pooling.normalize
    assert score_params(CROSS).pooling.label_tokens == ()
    assert score_params(LM_RERANK).pooling.label_tokens == (5, 6)
    with pytest.raises(ValueError, match="no classification head and does not rerank"):
        score_params(EMBEDDER)


def test_rerank_prompts_put_the_query_first(tok) -> None:  # noqa: ANN001
    docs = ["a cat sat on a mat", "yes", "no no no"]
    pairs = rerank_ids(tok, CROSS, "which animal sat", docs)
    assert pairs == [tok("which animal sat", d)["input_ids"] for d in docs]
    lm = rerank_ids(tok, LM_RERANK, "which animal sat", docs, instruction="Find it")
    texts = [tok.decode(ids) for ids in lm]
    assert all(t.startswith("<|system|>Judge whether the Document") for t in texts)
    assert all("<Instruct>: Find it\n<Query>: which animal sat\n<Document>: " in t
               for t in texts)
    assert all(t.endswith("<|assistant|><think></think>") for t in texts)  # thinking off
    head = "<Document>: "
    shared = texts[0][: texts[0].index(head) + len(head)]
    assert all(t.startswith(shared) for t in texts)
    with pytest.raises(ValueError, match="does not rerank"):
        rerank_ids(tok, EMBEDDER, "q", docs)


def test_scores_from_logits() -> None:
    assert rerank_score(CROSS, [0.4]) == pytest.approx(sigmoid(0.4))
    assert rerank_score(LM_RERANK, [1.0, 3.0]) == pytest.approx(sigmoid(2.0))  # [no, yes]
    assert class_probs([2.0]) == [pytest.approx(sigmoid(2.0))]
    assert sum(class_probs([0.1, 0.2, 0.3])) == pytest.approx(1.0)


def test_a_request_is_bounded_in_tokens() -> None:
    check_total([[1] * 10] * 3)
    with pytest.raises(ValueError, match=f"at most {MAX_POOLING_TOKENS} per request"):
        check_total([[1] * (MAX_POOLING_TOKENS // 2 + 1)] * 2, "documents")
