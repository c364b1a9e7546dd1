"""Pooling inputs (no model): the params of each task, rerank prompts that put the query first
(so the radix tree shares it), what logits mean, and the bound on a request's tokens."""

from __future__ import annotations

import pytest
from toy_tokenizers import byte_level_bpe

from radixrt.runtime.models.pooling_config import RERANK_SYSTEM
from radixrt.runtime.pooling_params import PoolingInfo, sigmoid
from radixrt.runtime.tokenizer.pooling_inputs import (
    MAX_POOLING_TOKENS,
    PoolingAborted,
    check_total,
    class_probs,
    embed_params,
    pooled_result,
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


def test_a_template_without_a_system_role_gets_the_instruction_in_the_user_turn(tok) -> None:  # noqa: ANN001
    """Gemma's templates raise on a system message: the system text heads the user's."""
    tok.chat_template = ("{% for m in messages %}{% if m.role == 'system' %}"
                         "{{ raise_exception('System role not supported') }}{% endif %}"
                         "<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>")
    try:
        text = tok.decode(rerank_ids(tok, LM_RERANK, "q", ["d"])[0])
    finally:
        tok.chat_template = TEMPLATE
    assert text.startswith("<|user|>" + RERANK_SYSTEM + "\n\n<Instruct>: ")


class CountingTokenizer:
    """A tokenizer that counts the texts it was asked to encode."""

    def __init__(self, inner) -> None:  # noqa: ANN001
        self.inner, self.calls = inner, 0

    def encode(self, text: str, **kwargs) -> list[int]:  # noqa: ANN003
        self.calls += 1
        return self.inner.encode(text, **kwargs)

    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
        self.calls += 1
        return self.inner(*args, **kwargs)


def test_a_rerank_is_bounded_before_its_pairs_are_built(tok) -> None:  # noqa: ANN001
    counting = CountingTokenizer(tok)
    query = "which animal sat on the mat " * 120  # ~600 tokens, for 2048 documents
    with pytest.raises(ValueError, match="repeated for 2048 documents"):
        rerank_ids(counting, CROSS, query, ["d"] * 2048)
    assert counting.calls == 1  # the query alone
    with pytest.raises(ValueError, match="documents has 2049 entries"):
        rerank_ids(counting, CROSS, "q", ["d"] * 2049)
    with pytest.raises(ValueError, match="documents is empty"):
        rerank_ids(counting, CROSS, "q", [])


def test_a_request_without_its_result_says_why() -> None:
    assert pooled_result([1.0, 2.0], "length", 0) == [1.0, 2.0]
    with pytest.raises(PoolingAborted, match="input 3 was aborted"):
        pooled_result([], "abort", 3)
    with pytest.raises(ValueError, match=r"input 1 ended without a result \(error: too big\)"):
        pooled_result([], "error: too big", 1)
    with pytest.raises(ValueError, match="input 0 ended without a result"):
        pooled_result([], "length", 0)


def test_scores_from_logits() -> None:
    assert rerank_score(CROSS, [0.4]) == pytest.approx(sigmoid(0.4))
    assert rerank_score(LM_RERANK, [1.0, 3.0]) == pytest.approx(sigmoid(2.0))  # [no, yes]
    assert class_probs([2.0]) == [pytest.approx(sigmoid(2.0))]
    assert sum(class_probs([0.1, 0.2, 0.3])) == pytest.approx(1.0)


def test_a_request_is_bounded_in_tokens() -> None:
    check_total([[1] * 10] * 3)
    with pytest.raises(ValueError, match=f"at most {MAX_POOLING_TOKENS} per request"):
        check_total([[1] * (MAX_POOLING_TOKENS // 2 + 1)] * 2, "documents")
